# %% [markdown]
# # 02 · Block size, SRAM and the roofline
#
# The FlashAttention paper's Figure 2 (middle) varies the block size of the forward pass on an
# A100 for N = 1024, d = 64, 16 heads, batch 64: larger blocks mean fewer HBM accesses, and the
# runtime falls with them until something other than memory traffic limits it. Here the same
# workload is simulated (`flashsim.simulate`) and timed with the roofline model of
# `flashsim.roofline` on the A100 and H100 presets: time = max(FLOPs / peak rate, HBM bytes /
# bandwidth), an optimistic bound with datasheet peaks and perfect overlap.

# %%
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import numpy as np

from flashsim import Tiling, Workload, get_gpu, simulate
from flashsim.plot import COLORS  # one colour per algorithm, as in flashsim report
from flashsim.roofline import roofline

plt.rcParams.update({"figure.dpi": 80, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})
w = Workload(batch=64, heads=16, seq_len_q=1024, head_dim=64, dtype="fp16")
gpus = {"A100": get_gpu("a100"), "H100": get_gpu("h100")}
for name, g in gpus.items():
    print(f"{name}: {g.name}, {g.max_shared_bytes_per_block // 1024} KiB shared memory per block, "
          f"{g.hbm_bytes_per_s / 1e12:.2f} TB/s, {g.matmul_flops['fp16'] / 1e12:.0f} TFLOP/s fp16")

# %% [markdown]
# ## HBM traffic and roofline time against the block size
#
# FlashAttention-1 (Algorithm 1) with key block Bc and the paper's Br = min(Bc, d); this is the
# tiling the paper's rule Bc = ⌈M/4d⌉ picks for M = 4·d·Bc elements, so a block size needs
# 4·d·Bc·2 bytes of shared memory (Bc = 64 needs 32 KiB). FlashAttention-2 with query block Br
# and Bc = 64 (its traffic does not depend on Bc without masking: K and V are read once per query
# block). Shaded: FlashAttention-1 block sizes whose 4·d·Bc elements exceed the A100's (light) or H100's (dark)
# shared memory per thread block.

# %%
blocks = [16, 32, 64, 128, 256, 512, 1024]
runs = {
    "flash1": [simulate(w, "flash1", "fwd", Tiling(min(b, w.d), b)) for b in blocks],
    "flash2": [simulate(w, "flash2", "fwd", Tiling(b, 64)) for b in blocks],
}
assert all(r.agrees for rs in runs.values() for r in rs)
gb = {a: np.array([r.io.bytes / 1e9 for r in rs]) for a, rs in runs.items()}
ms = {(a, g): np.array([roofline(r, gpu)["time_s"] * 1e3 for r in rs]) for a, rs in runs.items()
      for g, gpu in gpus.items()}
bound = {(a, g): [roofline(r, gpu)["bound"] for r in rs] for a, rs in runs.items() for g, gpu in gpus.items()}
max_bc = {g: gpu.sram_elems(w.elem_bytes) // (4 * w.d) for g, gpu in gpus.items()}  # largest Bc whose 4·d·Bc fits

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for ax in (ax1, ax2):
    ax.axvspan(max_bc["A100"], max_bc["H100"], color="grey", alpha=0.12)
    ax.axvspan(max_bc["H100"], blocks[-1] * 1.2, color="grey", alpha=0.3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (rows; flash1: Bc, Br = min(Bc, d); flash2: Br, Bc = 64)")
for a, st in (("flash1", "o-"), ("flash2", "s--")):
    ax1.plot(blocks, gb[a], st, color=COLORS[a], label=a)
    for g, ls, face in (("A100", "-", None), ("H100", ":", "none")):  # the algorithm's colour, a style per GPU
        ax2.plot(blocks, ms[(a, g)], marker=st[0], ls=ls, mfc=face, color=COLORS[a], label=f"{a}, {g}")
ax1.set_yscale("log")
ax1.set_ylabel("HBM traffic (GB)")
ax1.set_title("forward, N = 1024, d = 64, 16 heads, batch 64, fp16")
ax1.legend()
ax2.set_ylabel("roofline time (ms)")
ax2.set_ylim(0, None)
ax2.set_title("max(compute, memory) on the presets")
ax2.legend()
plt.show()

i64, i512 = blocks.index(64), blocks.index(512)
f1_drop = gb["flash1"][i64] / gb["flash1"][i512]
knee = {g: next(b for b, k in zip(blocks, bound[("flash1", g)]) if k == "compute") for g in gpus}
assert all(knee[g] > max_bc[g] for g in gpus)  # the takeaway says the knees lie beyond what fits
# fraction of peak arithmetic at which Bc = 256 would already be compute-bound on the A100
r256 = roofline(runs["flash1"][blocks.index(256)], gpus["A100"])
f256 = r256["compute_s"] / r256["memory_s"]
print("flash1 GB:", {b: round(float(x), 2) for b, x in zip(blocks, gb["flash1"])})
for g in gpus:
    print(f"flash1 on {g}:", dict(zip(blocks, bound[("flash1", g)])), f"largest Bc that fits: {max_bc[g]}")
print(f"A100, Bc = 256: compute {1e3 * r256['compute_s']:.3f} ms, memory {1e3 * r256['memory_s']:.3f} ms")

# %% [markdown]
# **Takeaway:** going from Bc = 64 to 512 cuts FlashAttention-1's HBM traffic
# {{f1_drop|.1f}}× ({{gb['flash1'][i64]|.2f}} → {{gb['flash1'][i512]|.2f}} GB); at datasheet peaks
# the roofline turns compute-bound only at Bc = {{knee['A100']}} on the A100 and
# {{knee['H100']}} on the H100, beyond the largest block that fits ({{max_bc['A100']}},
# {{max_bc['H100']}}). The paper's runtime flattens from 256 on the A100: that happens in this
# model if the kernel reaches at most {{100*f256|.0f}} % of peak arithmetic rate.

# %% [markdown]
# ## The same sweep in SRAM size M, measured on a GPU
#
# `analysis/data/h200/h200.csv` holds the FlashAttention-1 kernel (kernels/flash1.py) measured
# with Nsight Compute (on the GPU that `h200.meta.json` names, printed below; the IO counts do not
# depend on the GPU, the time does) at N = 2048, d = 64, 16 heads, batch 1, fp16, with the SRAM
# budget M (shared memory per thread block, bytes) from 8 to 192 KiB and the tiling from the
# paper's rule. Below: the measured global-memory bytes (ncu's LSU level, what the IO model
# counts) against the walker's 32-byte sectors for the same tiling (with O stored in float32
# in HBM, as the kernel does for fp16 inputs), and the measured kernel time. The cell draws
# nothing and says so if the data is absent.

# %%
from analysis.compare import compare, per_config, read_measured
from analysis.configs import sim_options, workload_of
from analysis.notebook_data import find, preset_of

csv_path = find("h200")
measured_takeaway = (
    "No measured points yet: `analysis/data/h200/h200.csv` is absent, so the figure "
    "above is not drawn; re-run `python notebooks/build.py 02` once it lands."
)
if csv_path is not None:
    rows, meta = read_measured(csv_path)
    configs = per_config(compare(rows, preset_of(meta["gpu"])))
    pts = sorted((c for c in configs if c["kernel"] == "flash1" and c["pass"] == "fwd" and not c["causal"]
                  and c["dtype"] == "fp16" and c["seq_len_q"] == 2048 and c["head_dim"] == 64),
                 key=lambda c: c["sram_bytes"])
    print(f"measured on {meta.get('gpu')} ({meta.get('date')}, commit {str(meta.get('git_commit'))[:10]}): "
          f"{len(pts)} points of the M sweep")
    if len(pts) >= 2:
        wm = workload_of(pts[0])
        m_bytes = np.unique(np.geomspace(8 * 1024, 192 * 1024, 30).astype(int) // 512 * 512)
        opts = sim_options(pts[0])  # as measured: the kernel keeps O in float32 for fp16 inputs
        sim_gb = [simulate(wm, "flash1", "fwd", Tiling.from_sram(int(m) // 2, 64), **opts).io.sectors * 32 / 1e9
                  for m in m_bytes]
        mx = np.array([c["sram_bytes"] / 1024 for c in pts])
        lsu = np.array([c["lsu_bytes"] / 1e9 for c in pts])
        t_ms = np.array([c["time_ns"] / 1e6 for c in pts])
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        ax1.loglog(m_bytes / 1024, sim_gb, "-", color=COLORS["flash1"], label="simulated (walker, 32-byte sectors)")
        ax1.loglog(mx, lsu, "o", color=COLORS["flash1"], mec="k", label="measured (ncu, LSU bytes)")
        ax1.set_xlabel("SRAM budget M per thread block (KiB)")
        ax1.set_ylabel("global-memory traffic (GB)")
        ax1.set_title("FlashAttention-1 forward, N = 2048, d = 64, 16 heads, fp16")
        ax1.legend()
        ax2.semilogx(mx, t_ms, "o-", color=COLORS["flash1"], mec="k")
        ax2.set_xlabel("SRAM budget M per thread block (KiB)")
        ax2.set_ylabel("measured kernel time (ms)")
        ax2.set_ylim(0, None)
        ax2.set_title(f"{meta.get('gpu')}, under ncu")
        plt.show()
        err = max(abs(c["lsu_err"]) for c in pts)
        fastest = pts[int(np.argmin(t_ms))]["sram_bytes"] // 1024
        measured_takeaway = (
            f"On the {meta.get('gpu')}, measured LSU bytes follow the simulated curve within {100 * err:.2f} % at every one of the "
            f"{len(pts)} SRAM sizes, falling {lsu[0] / lsu[-1]:.1f}× from {mx[0]:.0f} to {mx[-1]:.0f} KiB; "
            f"the kernel time falls {t_ms[0] / t_ms.min():.1f}× and is lowest at M = {fastest} KiB."
        )
print(measured_takeaway)

# %% [markdown]
# **Takeaway:** {{measured_takeaway}}
