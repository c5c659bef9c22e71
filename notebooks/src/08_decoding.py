# %% [markdown]
# # 08 · Decoding: why a decode step is memory-bound, and what splits and pages cost
#
# One decoding step reads the whole KV cache to produce one token per sequence: every K and V byte
# once, against a handful of query rows.  The FLOPs per byte are about the query rows per kv head,
# so the step runs at the speed of HBM, and the IO questions are which bytes beyond the cache a
# schedule adds (split-KV's partial results, a paged cache's block table, re-reading the cache per
# query head without GQA packing) and whether a kernel reaches the bandwidth a plain copy gets.
#
# * **Simulated** (`flashsim.algorithms.decode`, `flashsim.decode_splits`): the walker's bytes of
#   one step split into the compulsory traffic and each overhead, on the H100 preset.
# * **Timed** (`kernels/data/bench_decode_h100.csv`, `python -m kernels.bench_decode`, an H100): our
#   fast decode kernel beside a device-to-device copy of the same K/V bytes and torch SDPA's
#   backends in the same run, GB/s as the compulsory bytes over the median of 7 trials, with the
#   fastest and slowest trial; the split-count sweep and the page sizes.
# * **Measured traffic** (`analysis/data/h100/decode/`, `flashsim measure --set decode` under Nsight
#   Compute, an H100, and its committed comparison `compare/`): the reference decode kernels' LSU
#   and DRAM bytes, launch by launch, against the walker and the L2 model.
#
# The bench is read by variant name: `ours_fast` is the fast kernel as the launcher runs it, other
# `ours_*` rows are tunings or versions timed beside it, `sdpa_*` the SDPA backends, `copy` the
# ceiling.  The targets: at least 80% of the copy's bandwidth, and at least 1.0x the best
# SDPA backend at Nq = 1.

# %%
import json
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import numpy as np

from analysis import nb_claims as C
from analysis.notebook_data import data_path, load_compare, load_csv
from flashsim import Tiling, Workload, get_gpu
from flashsim.decode_splits import decode_bounds, propose
from flashsim.plot import COLORS

plt.rcParams.update({"figure.dpi": 120, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})
GPU = get_gpu("h100")
bench = load_csv("bench_decode")
meta = json.loads(data_path("bench_decode").with_suffix(".meta.json").read_text())
DEV = meta["gpu"].replace("NVIDIA ", "")
print(f"bench: {meta['gpu']}, commit {meta['git_commit']}, torch {meta['torch']}, {meta['date']}")


def colour(variant):
    if variant in COLORS:
        return COLORS[variant]
    return COLORS["ours"] if variant.startswith("ours") else "tab:gray"


# %% [markdown]
# ## Bytes per generated token against the cache length (simulated)
#
# One step of a layer with 64 query heads on 8 kv heads (GQA 8:1), d = 128, fp16, batch 1, Nq = 1,
# key blocks of Bc = 64 rows (the fast kernel's tile), on the H100 preset: the compulsory bytes (Q,
# every K and V row once, O and L), the schedule's bytes with the split count `propose` chooses
# (contiguous cache, and pages of 16 rows), and without GQA packing (one program per query head,
# so the cache is read g = 8 times).  Right: each overhead in % of the compulsory bytes.

# %%
NKS = [4096, 16384, 65536, 262144, 1048576]
HQ, HKV, D, BC = 64, 8, 128, 64


def step(nk, batch=1, page=None, splits=None):
    w = Workload(batch=batch, heads=HQ, kv_heads=HKV, seq_len_q=1, seq_len_k=nk, head_dim=D, dtype="fp16")
    s = splits or propose(w, GPU, Tiling(1, BC), page_size=page).num_splits
    b = decode_bounds(w, Tiling(1, BC), num_splits=s, page_size=page)
    assert b["schedule"] == b["compulsory"] + b["block_rounding"] + b["split"] + b["paging"] + b["lengths"]
    return s, b


contig = [step(n) for n in NKS]
paged = [step(n, page=16) for n in NKS]
comp = np.array([b["compulsory"] for _, b in contig]) / 1e6
sched = np.array([b["schedule"] for _, b in contig]) / 1e6
sched_p = np.array([b["schedule"] + b["paging_sectors"] for _, b in paged]) / 1e6
nogqa = np.array([b["compulsory"] + b["no_gqa_packing"] for _, b in contig]) / 1e6
split_pct = np.array([100 * b["split"] / b["compulsory"] for _, b in contig])
bt_pct = np.array([100 * b["paging"] / b["compulsory"] for _, b in paged])
sec_pct = np.array([100 * b["paging_sectors"] / b["compulsory"] for _, b in paged])
gqa_factor = nogqa / comp
S_of = [s for s, _ in contig]

fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
a1.loglog(NKS, comp, "k-", label="compulsory (Q, K/V once, O, L)")
a1.loglog(NKS, sched, "o-", color=COLORS["decode"], label="schedule, contiguous, proposed splits")
a1.loglog(NKS, sched_p, "s--", color=COLORS["flash2"], label="schedule, pages of 16 rows")
a1.loglog(NKS, nogqa, "^:", color=COLORS["standard"], label="no GQA packing (per query head)")
a1.set_xscale("log", base=2)
a1.set_xlabel("cache length Nk (keys per sequence)")
a1.set_ylabel("HBM MB per generated token")
a1.set_title("one decode step, Hq 64 / Hkv 8, d 128, fp16\n(simulated, H100 preset)")
a1.legend()
a2.semilogx(NKS, split_pct, "o-", color=COLORS["decode"], label="split-KV (Q re-read, Op/Lp round trip)")
a2.semilogx(NKS, bt_pct, "s--", color=COLORS["flash2"], label="paging: block-table reads (P = 16)")
a2.semilogx(NKS, sec_pct, "d:", color=COLORS["flash1"], label="paging: extra K/V sectors (P = 16)")
a2.set_xscale("log", base=2)
a2.set_yscale("symlog", linthresh=1e-3)
a2.set_xlabel("cache length Nk (keys per sequence)")
a2.set_ylabel("overhead (% of the compulsory bytes)")
a2.set_title("what the schedule adds (simulated, H100 preset)")
a2.legend()
plt.show()

assert np.all(sched >= comp) and np.all(nogqa > sched_p)
assert np.all(np.diff(split_pct) < 0) and split_pct[-1] < 0.1 and np.all(sec_pct == 0)
assert np.all((gqa_factor > 0.99 * HQ / HKV) & (gqa_factor <= HQ / HKV))
print("splits proposed:", dict(zip(NKS, S_of)), "split %:", split_pct.round(4), "BT %:", bt_pct.round(4))

# %% [markdown]
# **Takeaway:** a decode step's bytes are the cache: {{comp[0]|.1f}} MB per token at Nk = 4,096 and
# {{comp[-1]|,.0f}} MB at Nk = 1,048,576, linear in Nk.  Split-KV (the proposed split counts,
# {{min(S_of)}} to {{max(S_of)}}) adds {{split_pct[0]|.3f}}% at Nk = 4,096 and {{split_pct[-1]|.4f}}% at
# 1,048,576 (its Q re-reads and Op/Lp round trip depend on S, not on Nk); pages of 16 rows add
# {{bt_pct[0]|.2f}}% in block-table reads (4 bytes per page per kv head against 16 rows of
# 2·d·2 bytes) and no K/V sector (with 8 kv heads each row is its own 256-byte aligned transfer
# in either layout).  Without GQA packing the step reads {{gqa_factor[0]|.2f}}-{{gqa_factor[-1]|.2f}}× the
# bytes: the cache once per query head, g = 8 times (Q and O, read and written once either way,
# keep it just under 8).

# %% [markdown]
# ## Achieved bandwidth against the copy ceiling (H100)
#
# The bench's main group: Nq = 1, Nk = 4,096 … 1,048,576 with B = max(1, 262,144/Nk) (K and V at
# least 1 GiB), GQA 8:1 (left) and 1:1 (right); each variant's GB/s (median, bars from the fastest
# to the slowest trial) and the copy's in the same configuration.  A variant that failed (out of
# memory, or no SDPA kernel for the shape) is not drawn.

# %%
main = C.decode_bench(bench, "main")
mc = C.decode_main_claims(main)
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
for ax, hq in zip(axes, (64, 8)):
    cs = [c for c in main if c["config"]["heads"] == hq]
    nks = np.array([c["config"]["nk"] for c in cs])
    cp = np.array([c.get("copy", {}).get("gbps", np.nan) for c in cs])
    ax.plot(nks, cp, "-", lw=2, label="device-to-device copy", color=COLORS["copy"])
    ax.plot(nks, 0.8 * cp, ":", color=COLORS["copy"], lw=1, label="80% of the copy (target)")
    names = sorted({n for c in cs for n in c["variants"]}, key=lambda n: (not n.startswith("ours"), n))
    tunings = iter("v^sdp<>")
    for name in names:
        v = [c["variants"].get(name, {"error": "absent"}) for c in cs]
        ok = np.array([x["error"] is None for x in v])
        if not ok.any() or name == "sdpa_math":
            continue
        g = np.array([x["gbps"] for x in v if x["error"] is None])
        lo = np.array([x["gbps_lo"] for x in v if x["error"] is None])
        hi = np.array([x["gbps_hi"] for x in v if x["error"] is None])
        main_line = name == C.DECODE_OURS or name.startswith("sdpa_")
        ax.errorbar(nks[ok], g, yerr=[g - lo, hi - g], fmt="o-" if main_line else next(tunings) + "--", capsize=3,
                    color=colour(name), alpha=1.0 if main_line else 0.45, lw=1.5 if main_line else 1, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache length Nk (batch max(1, 262,144/Nk))")
    ax.set_title(f"decode, Hq {hq} / Hkv 8, Nq 1, fp16, d 128\n({DEV})")
    ax.legend(ncol=2)
axes[0].set_ylabel("GB/s (compulsory bytes / time)")
plt.show()

def reasons(errors):
    """The kinds of failure, short: the text before the first parenthesis."""
    return ", ".join(sorted({e.split("(")[0].strip() for e in errors}))


failed = "; ".join(f"Hq {c['config']['heads']} at Nk = {c['config']['nk']:,} (every variant but the copy failed: "
                   f"{reasons(v['error'] for v in c['variants'].values() if v['error'])})"
                   for c in mc["untimed"]) or "none"
best_names = mc["sdpa_best_names"]
sdpa_best_text = (f"{best_names[0]} in every configuration" if len(best_names) == 1
                  else f"{', '.join(best_names)}, by configuration")
math_x = max(v["x_copy"] for c in main for n, v in c["variants"].items() if n == "sdpa_math" and v["error"] is None)
assert mc["meet_copy"] == sum(1 for c in main if c["variants"].get(C.DECODE_OURS, {}).get("x_copy", 0) >= 0.8)
assert mc["x_copy_max"] < 0.8 or mc["meet_copy"] > 0
print({k: v for k, v in mc.items() if k != "untimed"}, "untimed:", failed)

# %% [markdown]
# **Takeaway:** our fast kernel (`ours_fast`) reaches {{mc['x_copy_min']|.2f}}-{{mc['x_copy_max']|.2f}}× the
# copy's bandwidth (median {{mc['x_copy_median']|.2f}}×) over the {{mc['timed']}} configurations timed, so it
# meets the 80% target in {{mc['meet_copy']}} of them, and {{mc['x_sdpa_min']|.2f}}-{{mc['x_sdpa_max']|.2f}}×
# the best SDPA backend (≥ 1.0× in {{mc['meet_sdpa']}}); the best of all our timed variants per configuration
# reaches {{mc['best_ours_x_copy_min']|.2f}}-{{mc['best_ours_x_copy_max']|.2f}}×.  SDPA's best backend
# ({{sdpa_best_text}}) runs at {{mc['sdpa_best_x_copy_min']|.2f}}-{{mc['sdpa_best_x_copy_max']|.2f}}×
# the copy, so the ceiling is reachable; the math backend (not drawn) at most {{math_x|.3f}}×.  Not timed:
# {{failed}}.

# %% [markdown]
# ## How many splits?  The sweep against the model and flash-attention's heuristic (H100)
#
# The splits group: `ours_fast` with num_splits = 1, 2, 4, … 64 at Nk = 65,536, B = 4, GQA 8:1 (32
# programs per split on 132 SMs), median ms with the trials' range; marked: the timed best, the
# launcher's default (`kernels.perf.decode.default_splits`), the simulator's proposal
# (`flashsim.decode_splits.propose` on the H100 preset with the kernel's tile as Bc) and
# flash-attention's `num_splits_heuristic` as `propose` reproduces it.

# %%
sweeps = C.decode_split_sweeps(bench)
timed_sweeps = [s for s in sweeps if s["ms"]]
sw = timed_sweeps[0]
fig, ax = plt.subplots(figsize=(6.8, 4.2))
ms, lo, hi = np.array(sw["ms"]), np.array(sw["lo"]), np.array(sw["hi"])
ax.errorbar(sw["splits"], ms, yerr=[ms - lo, hi - ms], fmt="o-", capsize=3, color=COLORS["ours"],
            label=f"{C.DECODE_OURS} (median, trials' range)")
ax.axvline(sw["model"], color=COLORS["decode"], ls="--", label=f"simulator's proposal S = {sw['model']}")
ax.axvline(sw["fa2"], color=COLORS["sdpa_flash"], ls=":", label=f"flash-attention's heuristic S = {sw['fa2']}")
ax.axvline(sw["default"], color="tab:gray", ls="-.", label=f"launcher's default S = {sw['default']}")
ax.plot([sw["best"]], [sw["best_ms"]], "*", ms=14, color="k", label=f"timed best S = {sw['best']}")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
cf = sw["config"]
ax.set_xlabel("num_splits S")
ax.set_ylabel("time per decode step (ms)")
ax.set_title(f"split sweep, B {cf['batch']}, Hq {cf['heads']} / Hkv {cf['kv_heads']}, Nk {cf['nk']:,} ({DEV})")
ax.legend()
plt.show()

assert sw["model"] == sw["model_check"]  # the bench's column is what propose returns today
slow1 = sw["ms"][0] / sw["best_ms"]
halving = [sw["ms"][i] / sw["ms"][i + 1] for i in range(len(sw["splits"]) - 1) if sw["splits"][i + 1] <= 8]
assert sw["splits"][:4] == [1, 2, 4, 8] and min(halving) > 1.7
untimed_sweeps = "; ".join(f"the sweep at Nk = {s['config']['nk']:,} ({len(s['failed'])} split counts: "
                           f"{reasons(e for _, e in s['failed'])})" for s in sweeps if not s["ms"]) or "none"
programs = cf["batch"] * cf["kv_heads"]
model_timed = ("a timed point" if sw["model"] in sw["splits"] else
               f"not a timed point: the nearest timed count, S = {sw['model_nearest']}, is "
               f"{sw['model_nearest_x_best']:.3f}× the best")
print({k: v for k, v in sw.items() if k not in ("config", "failed")}, "untimed sweeps:", untimed_sweeps)

# %% [markdown]
# **Takeaway:** the timed best is S = {{sw['best']}} ({{sw['best_ms']|.3f}} ms); one split takes {{slow1|.1f}}× as
# long ({{programs}} thread blocks on {{GPU.num_sms}} SMs).  The simulator proposes S = {{sw['model']}},
# {{model_timed}}.  Flash-attention's
# heuristic takes S = {{sw['fa2']}} (the smallest S within 85% of the best wave efficiency), which runs
# {{sw['fa2_nearest_x_best']|.2f}}× the best with this kernel: up to S = 8 each doubling of S divides
# the time by {{min(halving)|.2f}}-{{max(halving)|.2f}}, so a thread block of this kernel, one or two per SM,
# is far from the SM's share of the bandwidth, which a wave-efficiency model does not see.  The
# launcher's default (S = {{sw['default']}}) is nearest S = {{sw['default_nearest']}}, {{sw['default_nearest_x_best']|.2f}}×
# the best.  Not timed: {{untimed_sweeps}}.

# %% [markdown]
# ## What a page size costs: measured time and simulated bytes
#
# The pages group: Nk = 65,536, B = 4, GQA 8:1, the launcher's split count, pages of 16 … 256 rows
# shuffled in the pool, beside the contiguous cache (left, H100), and the simulator's extra bytes of
# the same step over the contiguous one (right): block-table reads and extra K/V sectors.

# %%
pg = C.decode_pages(bench)
pcfg = pg["config"]
sizes = [p for p in pg["pages"] if p]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11.5, 4))
for name, v in pg["variants"].items():
    i0 = pg["pages"].index(0)
    m = np.array([x for p, x in zip(pg["pages"], v["ms"]) if p])
    lo_ = np.array([x for p, x in zip(pg["pages"], v["lo"]) if p])
    hi_ = np.array([x for p, x in zip(pg["pages"], v["hi"]) if p])
    c = colour(name) if name == C.DECODE_OURS else "tab:purple"
    a1.errorbar(sizes, m, yerr=[m - lo_, hi_ - m], fmt="o-", capsize=3, color=c, label=f"{name}, paged")
    a1.axhline(v["ms"][i0], color=c, ls="--", lw=1, label=f"{name}, contiguous")
a1.set_xscale("log", base=2)
a1.set_xlabel("page size P (rows)")
a1.set_ylabel("time per decode step (ms)")
a1.set_title(f"paged KV, B {pcfg['batch']}, Nk {pcfg['nk']:,}, S {pg['num_splits']} ({DEV})")
a1.legend()
wp = Workload(batch=pcfg["batch"], heads=pcfg["heads"], kv_heads=pcfg["kv_heads"], seq_len_q=pcfg["nq"],
              seq_len_k=pcfg["nk"], head_dim=pcfg["d"], dtype=pcfg["dtype"])
pb = {p: decode_bounds(wp, Tiling(1, int(pg["tile_keys"])), num_splits=int(pg["num_splits"]), page_size=p) for p in sizes}
extra_pct = np.array([100 * (pb[p]["paging"] + pb[p]["paging_sectors"]) / pb[p]["compulsory"] for p in sizes])
a2.semilogx(sizes, extra_pct, "s-", color=COLORS["decode"], label="block-table reads + extra K/V sectors")
a2.set_ylim(0, None)
a2.set_xscale("log", base=2)
a2.set_xlabel("page size P (rows)")
a2.set_ylabel("extra bytes (% of the compulsory)")
a2.set_title("the same step, simulated (H100 preset)")
a2.legend()
plt.show()

ours_pg = pg["variants"][C.DECODE_OURS]
bc_pg = int(pg["tile_keys"])
assert extra_pct.max() < 0.1 and np.all(np.diff(extra_pct) <= 0)
assert len({x for p, x in zip(sizes, extra_pct) if p >= bc_pg}) == 1  # one table entry per key block from P = Bc
assert all(pb[p]["paging_sectors"] == 0 for p in sizes)
assert ours_pg["slowdown_min"] > 1 + 10 * extra_pct.max() / 100
others_pg = ", ".join(f"{n} {v['slowdown_min']:.2f}-{v['slowdown_max']:.2f}×" for n, v in pg["variants"].items()
                      if n != C.DECODE_OURS) or "none"
print({p: round(x, 5) for p, x in zip(sizes, extra_pct)}, ours_pg["slowdown_min"], ours_pg["slowdown_max"], others_pg)

# %% [markdown]
# **Takeaway:** paging costs our fast kernel {{ours_pg['slowdown_min']|.2f}}-{{ours_pg['slowdown_max']|.2f}}× the
# contiguous cache's time whatever the page size (16 to 256 rows), while the simulator counts
# {{extra_pct[0]|.3f}}% extra bytes at P = 16 and {{extra_pct[-1]|.4f}}% from P = Bc = {{bc_pg}} on (block-table
# reads, one entry per page a key block touches, so one per block from P = Bc; no extra sector).  The slowdown is not in the bytes, which paging moves by less than 0.05%: it lies in
# how the fast kernel gathers paged rows through the table, which a byte count does not see (and
# which this bench does not break down).  Other variants timed beside
# it, paged over contiguous: {{others_pg}}.

# %% [markdown]
# ## The reference decode kernels measured against the simulator (H100, Nsight Compute)
#
# `flashsim measure --set decode`: 11 configurations, 21 launches (the main launch, and with S > 1 the
# combine), fp16, d = 128, GQA 8:1, Nk 4,096 … 1,048,576, splits 1 … 64, pages 16 … 256; `flashsim
# compare` puts each launch beside the decode schedule with the record's options (left: LSU loads
# and stores, measured minus the walker, whose schedule counts every block's read of its sequence's
# length; right: DRAM reads against the L2 model, every launch from a cold L2 as ncu measures).

# %%
recs = load_compare("decode_h100_compare")
cc = C.decode_compare_claims(recs)
x = np.arange(len(recs))
is_comb = np.array([r["sim_launch"] == "decode_combine" for r in recs])
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
ld = np.array([r["lsu_ld_bytes"] - r["sim_lsu_ld_bytes"] for r in recs])
st = np.array([r["lsu_st_bytes"] - r["sim_lsu_st_bytes"] for r in recs])
a1.bar(x - 0.2, ld / 1e3, 0.4, color=COLORS["decode"], label="loads: measured − walker")
a1.bar(x + 0.2, st / 1e3, 0.4, color=COLORS["flash1"], label="stores: measured − walker")
a1.set_xlabel("launch (record order)")
a1.set_ylabel("bytes (kB)")
a1.set_title(f"LSU level, 21 launches\n({DEV}, ncu)")
a1.legend()
err = np.array([100 * (r["dram_read_bytes"] / r["sim_dram_read_bytes"] - 1) for r in recs])
a2.bar(x[~is_comb], err[~is_comb], color=COLORS["decode"], label="main launch")
a2.bar(x[is_comb], err[is_comb], color="tab:gray", label="combine launch")
a2.set_xlabel("launch (record order)")
a2.set_ylabel("DRAM reads: measured / model − 1 (%)")
a2.set_title(f"DRAM level against the flashsim.l2 H100 model\n({DEV}, ncu)")
a2.legend()
plt.show()

assert cc["st_exact"] == cc["launches"] == 21
if cc["ld_exact"] == cc["launches"]:
    ld_note = (f"and so do the loads, on all {cc['launches']} (each main block's one load of its sequence's length "
               "is the schedule's `Lens` read)")
else:
    # a record of the kernel that read its length in every warp (4 sectors a block, the walker 1)
    assert cc["ld_exact"] == cc["combine_ld_exact"] == cc["combine"] and cc["main_ld_excess_per_block"] == [96]
    ld_note = (f"loads on {cc['ld_exact']}, the combine launches; this record's main launches load 96 bytes per "
               f"thread block more than the walker (at most {100 * cc['ld_excess_rel_max']:.3f}% of a launch's "
               "loads): they were measured with the kernel that read its length `lens[b]` in every warp (4 "
               "sectors a block), which now reads it once (thread 0: 1 sector, the schedule's `Lens` read)")
assert cc["main_read_err_max"] < 0.005 and cc["sim_write_max"] == 0
print(cc)

# %% [markdown]
# **Takeaway:** at the LSU level the reference kernels issue the schedule's bytes: stores equal
# the walker's on {{cc['st_exact']}} of {{cc['launches']}} launches, {{ld_note}}.  At the DRAM level the main launches
# read within {{100 * cc['main_read_err_max']|.2f}}% of the L2 model (median {{100 * cc['main_read_err_median']|.3f}}%):
# the cache streams through the L2 once.  The combine launches read {{100 * cc['combine_read_err_min']|.1f}}-{{100 * cc['combine_read_err_max']|.1f}}%
# more than the model, at most {{cc['combine_read_excess_max'] / 1e3|.1f}} kB.  Writes: the model leaves every
# store dirty in the L2 at the launch's end (0 bytes written before ncu's flush); the launches wrote up
# to {{cc['write_max'] / 1e6|.2f}} MB, while the H100's background write rate (`analysis.compare`'s {{cc['background_rate'] / 1e6|.1f}} MB/s)
# times the launches' durations accounts for at most {{cc['timed_write_max'] / 1e6|.2f}} MB: the DRAM
# writes of a decode step are not modelled.
