# %% [markdown]
# # 06 · Performance: our kernels beside torch's attention
#
# The IO model of notebooks 01–04 says how many bytes a kernel moves; this notebook says how
# fast the kernels run. `python -m kernels.bench` timed, on one GPU in one run, our fastest
# Numba kernels (variants named `ours_*`, from `kernels/perf`) beside torch's **naive**
# attention (softmax(QKᵀ/√d)V with S and P in HBM) and the fused backends of
# `torch.nn.functional.scaled_dot_product_attention`: **sdpa_flash** (FlashAttention-2),
# **sdpa_cudnn** and **sdpa_mem_eff** (the memory-efficient kernel, the one that takes fp32).
# Every variant is first checked against float64; one that fails, or runs out of memory, has
# an `error` in the file and no timing. Then it is timed with CUDA events: the median of
# repeated calls, each after a write that flushes the L2.
#
# Throughput counts the two matrix products of the forward, 4·B·H·N²·d FLOPs (halved for a
# causal mask), and 2.5× that for the backward, the convention of flash-attention's benchmarks.
# The data: `kernels/data/bench_h100.csv` with its provenance in `bench_h100.meta.json`
# (`analysis.perf` reads it).

# %%
import re
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from analysis.notebook_data import find, load_meta, preset_of
from analysis.perf import PEERS, cases, ratio_range, ratios, read_bench, series, split_failed, variants
from flashsim.config import get_gpu
from flashsim.plot import COLORS

plt.rcParams.update({"figure.dpi": 80, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})

bench_csv = find("bench")
assert bench_csv is not None, "no timings: run python -m kernels.bench --out kernels/data/bench_h100.csv on a GPU"
rows = read_bench(bench_csv)
meta = load_meta("bench")
cuda = re.search(r"cuda_(\d+\.\d+)", meta.get("cuda") or "")
# A record merged from several runs (kernels.bench_table --merge) lists each run's date and commit.
runs = meta.get("parts") or [meta]
print(f"{meta.get('gpu')}, driver {meta.get('driver')}, CUDA {cuda.group(1) if cuda else meta.get('cuda')}, "
      f"torch {meta.get('torch')}, numba-cuda {meta.get('numba_cuda')}, TF32 {meta.get('tf32')}; "
      + "; ".join(f"{r.get('part', 'run')}: {str(r.get('date'))[:10]}, commit {str(r.get('git_commit'))[:10]}"
                  for r in runs))
timed, failed = split_failed(rows)
print(f"{len(rows)} rows: {len(timed)} timed, {len(failed)} failed")
batches = {}
for r in rows:
    batches.setdefault(r["n"], set()).add(r["batch"])
print("batch B at each N: " + "; ".join(f"N = {n}: B = {', '.join(map(str, sorted(b)))}" for n, b in sorted(batches.items()))
      + "; heads: " + ", ".join(map(str, sorted({r["heads"] for r in rows}))))
for r in failed:
    print(f"  FAILED {r['variant']:18s} {r['config']:28s} {r['error']}")

# %% [markdown]
# ## Throughput against sequence length
#
# One row of panels per pass and dtype in which a kernel of ours was timed, one column per head
# dimension d; solid lines without a mask, dashed with the causal mask (whose FLOPs count half:
# naive attention computes the masked half all the same). The batch shrinks as N grows (printed
# above).

# %%
N_MIN = 4096  # the takeaways quote N >= N_MIN, where launch overheads no longer dominate
colour = {v: COLORS[v] for v in ("naive", "sdpa_flash", "sdpa_cudnn", "sdpa_mem_eff")}  # flashsim.plot's palette
ours_names = [v for v in variants(timed) if v not in PEERS]
# ours: the palette's colour for the first variant, then colours the palette does not use
colour |= {v: c for v, c in zip(ours_names, (COLORS["ours"], "tab:olive", "tab:gray", "k", "navy", "gold", "teal"))}
pass_name = {"fwd": "forward", "bwd": "backward"}
panels = cases(timed)
ds = sorted({r["d"] for r in timed})
fig, axes = plt.subplots(len(panels), len(ds), figsize=(5.2 * len(ds), 3.6 * len(panels)), sharey="row",
                         squeeze=False)
for (pss, dt), row_axes in zip(panels, axes):
    for d, ax in zip(ds, row_axes):
        drawn = set()
        for causal, ls in ((False, "-"), (True, "--")):
            for v, (ns, tf) in series(timed, pss, dt, d, causal).items():
                ax.plot(ns, tf, ls, marker="o", ms=3.5, color=colour[v], lw=2.2 if v in ours_names else 1.3)
                drawn.add(v)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_title(f"{pass_name[pss]}, {dt}, d = {d}")
    row_axes[0].set_ylabel("throughput (TFLOP/s)")
for ax in axes.flat:
    ax.set_ylim(bottom=0)  # after every line is drawn: the rows share their y axis
handles = [Line2D([], [], color=colour[v], lw=2.2 if v in ours_names else 1.3, label=v) for v in variants(timed)]
handles += [Line2D([], [], color="k", ls=ls, label=lab) for ls, lab in (("-", "no mask"), ("--", "causal mask"))]
fig.suptitle(f"{meta.get('gpu')}, python -m kernels.bench")
fig.tight_layout()
fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
plt.show()

# The takeaway: per case, our fastest kernel against naive and against SDPA's FlashAttention-2
# backend (or, where that backend does not run, as in fp32, against the memory-efficient one).
best = ratios(rows, fastest_only=True)
gpu = get_gpu(preset_of(meta["gpu"]))
parts = []
for pss, dt in panels:
    sel = {"pass_": pss, "dtype": dt}
    names = sorted({r["variant"] for r in best if r["pass"] == pss and r["dtype"] == dt})
    n_lo = N_MIN if ratio_range(best, "naive", N_MIN, **sel)[2] else 0
    text = f"{dt} {pass_name[pss]} ({', '.join(names)})"
    lo, hi, k = ratio_range(best, "naive", n_lo, causal=False, **sel)
    clo, chi, ck = ratio_range(best, "naive", n_lo, causal=True, **sel)
    if k:
        text += f" is {lo:.2f}–{hi:.2f}× naive"
    if ck:
        text += f"{'' if k else ' is'} ({clo:.2f}–{chi:.2f}× with the causal mask)"
    k = k or ck
    peer = next((p for p in ("sdpa_flash", "sdpa_mem_eff") if ratio_range(best, p, n_lo, **sel)[2]), None)
    if peer:
        lo, hi, _ = ratio_range(best, peer, n_lo, **sel)
        text += f"{' and' if k else ' is'} {lo:.2f}–{hi:.2f}× {peer}"
    top = max(r["tflops"] for r in best if r["pass"] == pss and r["dtype"] == dt)
    peak = gpu.matmul_flops[dt] / 1e12
    text += (f" at N ≥ {n_lo:,}, peaking at {top:.0f} TFLOP/s, {100 * top / peak:.0f} % of the dense {dt} peak of "
             f"flashsim's {gpu.name} preset ({peak:.0f} TFLOP/s)")
    parts.append(text)
untimed = sorted({(r["pass"], r["dtype"]) for r in rows} - set(panels), key=lambda c: (c[0] != "fwd", c))
perf_takeaway = "; ".join(parts) + "."
if untimed:
    perf_takeaway += " No kernel of ours was timed in " + ", ".join(f"{dt} {pass_name[p]}" for p, dt in untimed) + "."
perf_takeaway += f" {len(failed)} of {len(rows)} rows failed (listed above, not drawn)."
print(perf_takeaway)

# %% [markdown]
# **Takeaway:** {{perf_takeaway}}

# %% [markdown]
# ## Ratios, configuration by configuration
#
# Each kernel of ours on each configuration: its time and throughput, and the time of each of
# torch's variants divided by ours (above 1: ours is faster; "–" where that variant was not
# timed, as SDPA's flash and cuDNN backends in fp32).

# %%
recs = ratios(rows)
head = f"{'pass':4s} {'dtype':5s} {'d':>4s} {'mask':6s} {'N':>6s} {'variant':18s} {'ms':>8s} {'TFLOP/s':>8s}"
print(head + "".join(f" {'× ' + p:>14s}" for p in PEERS))
for r in recs:
    xs = "".join(f" {r['x_' + p]:14.2f}" if r["x_" + p] == r["x_" + p] else f" {'–':>14s}" for p in PEERS)
    print(f"{r['pass']:4s} {r['dtype']:5s} {r['d']:4d} {'causal' if r['causal'] else 'none':6s} {r['n']:6d} "
          f"{r['variant']:18s} {r['ms']:8.3f} {r['tflops']:8.1f}{xs}")
faster = [r for r in recs if r["x_naive"] > 1]
with_naive = [r for r in recs if r["x_naive"] == r["x_naive"]]
beat_flash = [r for r in recs if r["x_sdpa_flash"] > 1]
with_flash = [r for r in recs if r["x_sdpa_flash"] == r["x_sdpa_flash"]]

# %% [markdown]
# Of the {{len(recs)}} timings of ours, {{len(faster)}} of the {{len(with_naive)}} beside naive
# attention are faster than it, and {{len(beat_flash)}} of the {{len(with_flash)}} beside SDPA's
# FlashAttention-2 backend are faster than that.
