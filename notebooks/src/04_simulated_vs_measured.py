# %% [markdown]
# # 04 · Simulated against measured traffic
#
# The simulator counts tile transfers between HBM and SRAM. A GPU reports traffic at three
# levels (Nsight Compute metrics, `analysis/ncu.py`):
#
# * **LSU** — bytes the SMs request from global memory, in 32-byte sectors: what the IO model
#   counts, whether L2 or DRAM serves them. Prediction: the walker's sectors × 32. Agreement
#   here says the kernels issue exactly the walker's schedule of tile transfers — that the
#   kernels implement the modelled algorithm — not that the model predicts HBM traffic.
# * **L2** — sectors the SMs ask of the L2. Prediction: the LSU level, *if* the L1 serves none
#   of the requests; where a kernel re-reads a tile soon enough for its L1 to hold it (small
#   tiles, several warps loading the same rows) the L2 sees less, and nothing here models the L1.
# * **DRAM** — bytes that reach HBM after the L2: the level the paper's "HBM accesses" are.
#   Prediction: the trace-driven L2 model of
#   `flashsim.l2` on the GPU's preset, every launch starting with an empty L2 as ncu measures
#   (`--cache-control all`); the next section says what it is and what it is not.
#
# First the measurement chain itself, on kernels whose traffic is known exactly; then the
# measurements of the attention kernels (`analysis/data/h200/h200.csv`, recorded with
# `python -m analysis.measure --set h200` on an H200, as its `h200.meta.json` says, printed
# below) and of the same 54 configurations on an H100 (`analysis/data/h100/h100.csv`,
# `analysis/data/README.md`). Each panel's title names its GPU: the calibration kernels were
# measured on an H100, the attention kernels' main record on an H200, the d sweep on an H100. Each record's comparison is the committed output of
# `flashsim compare DATA --out analysis/data/GPU/compare --force` (`compare_launches.csv`, read
# with `analysis.notebook_data.load_compare`): the L2 model takes about 40 s a record, too long
# to rerun in every notebook build.

# %%
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import numpy as np

from analysis.calibrate import EXPECTED
from analysis.calibrate import N as CAL_N
from analysis.compare import DRAM_ERR_FLOOR, DRAM_SET_SAMPLE, LSU_TOLERANCE, per_config, summarize, theorem2_fits
from analysis.configs import workload_of
from analysis.ncu import parse_raw_csv, split_by_marker
from analysis.notebook_data import find, load_compare, load_meta
from flashsim.bounds import bounds
from flashsim.config import DTYPE_BYTES, get_gpu
from flashsim.plot import COLORS  # one colour per algorithm, as in flashsim report

plt.rcParams.update({"figure.dpi": 120, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})

# %% [markdown]
# ## Calibration: kernels with exactly known traffic
#
# `analysis/calibrate.py` runs two kernels on 4 Mi float32 values (16 MiB): `copy` reads and
# writes every value once, coalesced; `gather8` has thread t read element 8t, so each 32-byte
# sector it fetches carries 4 useful bytes. The recorded export
# (`tests/data/ncu_raw_calibrate.csv`, an H100 80GB HBM3 under ncu 2025.3.1) is read with the
# same parser as the attention measurements.

# %%
cal = split_by_marker(parse_raw_csv(find("calibration").read_text()))
cal = {name: grp[0] for name, grp in zip(("copy", "gather8"), cal)}
levels = {
    "LSU": lambda r, rw: r["lsu_ld_bytes"] if rw == "read" else r["lsu_st_bytes"],
    "L2": lambda r, rw: 32 * (r["l2_read_sectors"] if rw == "read" else r["l2_write_sectors"]),
    "DRAM": lambda r, rw: r["dram_read_bytes"] if rw == "read" else r["dram_write_bytes"],
}
useful = {"copy": {"read": 4 * CAL_N, "write": 4 * CAL_N}, "gather8": {"read": 4 * CAL_N // 8, "write": 4 * CAL_N // 8}}
expected = {k: {"read": v["lsu_ld_bytes"], "write": v["lsu_st_bytes"]} for k, v in EXPECTED.items()}

fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for ax, (name, rec) in zip(axes, cal.items()):
    x = np.arange(2)
    bars = [("useful bytes", [useful[name][rw] for rw in ("read", "write")]),
            ("expected LSU (sectors × 32)", [expected[name][rw] for rw in ("read", "write")])]
    bars += [(f"measured {lv}", [f(rec, rw) for rw in ("read", "write")]) for lv, f in levels.items()]
    for k, (label, vals) in enumerate(bars):
        ax.bar(x + (k - 2) * 0.16, np.array(vals) / 2**20, 0.16, label=label)
    ax.set_xticks(x, ["read", "write"])
    ax.set_xlabel("direction")
    ax.set_title(f"H100 80GB HBM3: {name} ({rec['time_ns'] / 1e3:.1f} µs)")
axes[0].set_ylabel("bytes (MiB)")
axes[1].legend(fontsize=8, loc="upper right")
fig.tight_layout()
plt.show()

lsu_exact = all(levels["LSU"](cal[k], rw) == expected[k][rw] for k in cal for rw in ("read", "write"))
l2_exact = all(levels["L2"](cal[k], rw) == expected[k][rw] for k in cal for rw in ("read", "write"))
copy_dram_w = cal["copy"]["dram_write_bytes"] / 2**20
copy_dram_r_excess = cal["copy"]["dram_read_bytes"] - 4 * CAL_N
assert lsu_exact and l2_exact  # what the takeaway says
for name, rec in cal.items():
    print(name, {lv: [f(rec, rw) for rw in ("read", "write")] for lv, f in levels.items()})

# %% [markdown]
# **Takeaway:** the LSU and L2 levels equal the expected sector bytes exactly for both kernels
# (gather8 moves 8× its useful bytes: whole sectors), DRAM reads exceed the 16 MiB by only
# {{copy_dram_r_excess|,}} bytes, but only {{copy_dram_w|.1f}} MiB of copy's 16 MiB of writes
# have reached DRAM when the kernel ends — the write-back L2 holds the rest, which is why the
# DRAM-level prediction needs an L2 model and the LSU level is the one to hold the simulator to.

# %% [markdown]
# ## The DRAM level's L2 model: what it is and what it is not
#
# `flashsim.l2.dram_traffic` replays a schedule's thread blocks through one set-associative
# cache. Blocks are issued in grid order, `num_sms × blocks_per_sm` resident at once (blocks per
# SM from the thread, block and shared-memory limits; registers not modelled), advancing
# round-robin one step (what a block loads or stores between two barriers) at a time; each
# tile is expanded row by row into 128-byte lines with their 32-byte sector masks. The cache:
#
# * **capacity** `l2_effective_bytes`: the capacity for which it reproduces the measured
#   re-reads of a window by the whole grid (all hits up to 32 MiB, then a gradual ramp), not
#   the nominal L2;
# * **replacement** NRU with a random share: the victim is drawn among the ways not re-read
#   since they came in, and a share `l2_random_share` of victims among all ways (random choice
#   gives the measured ramp, the marks keep re-read lines while data streams by);
# * **reads**: a missing sector is fetched with the rest of its 64-byte granule
#   (`l2_fetch_bytes`, measured with strided reads);
# * **writes**: write-allocate without fetch; at most `l2_dirty_bytes` of lines are held dirty
#   (the limit counts lines, however few of their sectors are dirty: stores to half and quarter
#   lines leave half and a quarter of the bytes, `l2calib/h200_l2_dirty_lines`), beyond it the
#   lines dirtied first are written back (a launch writing W bytes sends max(0, W − limit) to
#   DRAM, as measured); a line stored in parts (standard attention's fp16 S: two blocks' 64-byte
#   rows a line) keeps its parts together, taking 1.093 lines of the limit, for a share of the
#   lines that falls with the bytes stored between one part and the next (all at once, none
#   after 1 MiB, `l2calib/h200_l2_halfline` and `h200_l2_quarter`), else the older parts are
#   written back at the next passing of the limit; an evicted dirty line writes its dirty
#   sectors back. In a comparison
#   the dirty lines left at a launch's end are flushed by ncu outside the measurement, so they
#   are not the launch's writes; a record measured with more metrics than the calibration's 7
#   (the fast set's 10) starts each launch with the 2.06 MiB of other data that ncu's extra
#   replay pass leaves dirty (`l2calib/h200_l2_dirty`), written back first; one measured with
#   `analysis.measure`'s 17 (the torch and parts records) with 2.00 MiB (`l2calib/h200_l2_dirty_m17`).
#
# Every parameter comes from the calibration microbenchmarks (`python -m analysis.calibrate l2`,
# records in `analysis/data/l2calib/`, named by each preset's `l2_source`), none is fitted to
# the attention records below. What it is not: it has **no timing**, so the H100's background
# DRAM writes while any kernel runs (about 19 MB/s, whatever it stored) are not predicted —
# `compare` reports them apart as `sim_dram_write_timed_bytes`, a diagnosis from the launch's
# measured duration; the L2's **two partitions are not modelled** (an SM's hits reach both
# halves, with no near copy of far lines, and written lines lie in their address's half as read
# ones do: `python -m analysis.l2_partition`), nor **what one SM's re-read loses** (its second
# pass over 32 to 48 MiB misses a third to half of the lines where the whole grid's misses few:
# timed line by line, one SM reading in order keeps the newest 28-29 MiB and loses the lines
# read before them — 0.08, 0.28, 0.40 and 0.56 of 32, 40, 48 and 64 MiB after one pass, the same
# lines on four SMs, near and far nearly alike — where the model's cache loses 0, 0, 0.11 and 0.34:
# `python -m analysis.l2_partition --reread analysis/data/l2calib/h200_l2_reread/reread_1.csv.gz`),
# nor why a launch that writes and then reads back W MiB reads about half of it from DRAM (one
# SM reading lines the grid has just written misses none of them in the next launch, a quarter
# of them in the same one); no
# read-modify-write of partly written sectors, no per-SM placement of blocks. Comparisons simulate one set in {{DRAM_SET_SAMPLE}} and scale the counts.

# %%
model_params = {}
for preset in ("h100", "h200"):
    g = get_gpu(preset)
    model_params[preset] = g
    print(f"{preset}: L2 {g.l2_bytes / 2**20:.0f} MiB, modelled capacity {g.l2_effective_bytes / 2**20:.1f} MiB, "
          f"dirty limit {g.l2_dirty_bytes / 2**20:.1f} MiB, {g.l2_ways} ways, {g.l2_line_bytes}-B lines of "
          f"{g.l2_sector_bytes}-B sectors, {g.l2_fetch_bytes}-B fetches, {g.l2_replacement} with random share "
          f"{g.l2_random_share}; source: {g.l2_source}")
assert all(g.l2_replacement == "nru" and g.l2_fetch_bytes == 64 and g.l2_dirty_bytes for g in model_params.values())
assert all(g.l2_source for g in model_params.values())  # every parameter has its calibration record

# %% [markdown]
# ## The attention kernels: every configuration at three levels
#
# One point per measured configuration (a backward pass adds its launches), drawn as the
# residual — measured/simulated − 1 — against the simulated bytes, so that a systematic error
# of one algorithm shows as a band off zero rather than hiding on a log-log diagonal. If
# `analysis/data/h200/h200.csv` is absent the cells below print that the data is not yet
# recorded and draw nothing.

# %%
records = load_compare("h200_compare")
have_data = records is not None
t_levels = t_fit = "No comparison yet (`analysis/data/h200/compare/compare_launches.csv` is absent): nothing is drawn above."
if have_data:
    meta = load_meta("h200")
    gpu_name = meta.get("gpu", "GPU")
    configs = per_config(records)
    summary = summarize(records)
    # the L2 level per configuration: measured sectors summed over the configuration's launches
    l2 = {}
    for r in records:
        l2[r["config_id"]] = l2.get(r["config_id"], 0) + 32 * (r["l2_read_sectors"] + r["l2_write_sectors"])
    for c in configs:
        c["l2_bytes"] = l2[c["config_id"]]
        c["l2_err"] = c["l2_bytes"] / c["sim_lsu_bytes"] - 1
    print(f"measured on {meta.get('gpu')} (driver {meta.get('driver')}, {meta.get('ncu')}), {meta.get('date')}, "
          f"commit {str(meta.get('git_commit'))[:10]}, cache control {meta.get('cache_control')}")
    print(f"{len(configs)} configurations, {summary['launches']} launches")

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (lv, sim_key, key) in zip(axes, (("LSU", "sim_lsu_bytes", "lsu_bytes"), ("L2", "sim_lsu_bytes", "l2_bytes"),
                                             ("DRAM", "sim_dram_bytes", "dram_bytes"))):
        for kernel in ("flash2", "flash1", "standard"):
            pts = [c for c in configs if c["kernel"] == kernel and c[sim_key] > 0]
            ax.semilogx([c[sim_key] / 1e9 for c in pts], [100 * (c[key] / c[sim_key] - 1) for c in pts], "o",
                        color=COLORS[kernel], alpha=0.8, label=kernel)
        ax.axhline(0, color="k", ls="--", lw=0.8, label="measured = simulated")
        ax.set_xlabel(f"simulated {'DRAM (L2 model)' if lv == 'DRAM' else 'LSU'} bytes (GB)")
        ax.set_ylabel(f"{lv}: measured / simulated − 1 (%)")
        ax.set_title(f"{gpu_name}: {lv} level, {len(configs)} configurations", fontsize=9)
        ax.legend(loc="lower right" if lv == "L2" else "best")
    fig.tight_layout()
    plt.show()
    # signed errors per algorithm: a median over all configurations would hide a one-sided algorithm
    by_algo = {}
    for kernel in ("flash1", "flash2", "standard"):
        cs = [c for c in configs if c["kernel"] == kernel]
        d_err = np.array([c["dram_bytes"] / c["sim_dram_bytes"] - 1 for c in cs])
        l2_err = np.array([c["l2_err"] for c in cs])
        by_algo[kernel] = {"n": len(cs), "dram_min": d_err.min(), "dram_med": float(np.median(d_err)),
                           "dram_max": d_err.max(), "dram_under": int((d_err > 0).sum()), "l2_min": l2_err.min(),
                           "l2_med": float(np.median(l2_err))}
        print(f"{kernel:9s} n={len(cs):2d}  DRAM measured/simulated − 1: min {100 * d_err.min():+.1f} %, median "
              f"{100 * np.median(d_err):+.1f} %, max {100 * d_err.max():+.1f} % ({(d_err > 0).sum()} under-predicted); "
              f"L2: min {100 * l2_err.min():+.1f} %, median {100 * np.median(l2_err):+.1f} %")
    f1a = by_algo["flash1"]
    l2_worst = min(configs, key=lambda c: c["l2_err"])
    # what the takeaway says, against every configuration
    assert summary["lsu_within_tolerance"] == summary["launches"]
    assert f1a["dram_under"] == f1a["n"]  # every FlashAttention-1 configuration under-predicted
    assert l2_worst["kernel"] == "flash2" and l2_worst["l2_err"] < -0.3
    t_levels = (
        f"on the {gpu_name}, all {summary['launches']} launches' LSU bytes equal the walker's within "
        f"{100 * LSU_TOLERANCE:.0f} % (largest error {100 * summary['lsu_max_abs_err']:.2f} %): the kernels issue "
        f"exactly the walker's schedule of tile transfers. That says nothing yet of HBM. At the DRAM level the L2 "
        f"model of the {gpu_name} preset under-predicts all {f1a['n']} FlashAttention-1 configurations, by "
        f"{100 * f1a['dram_min']:.1f}–{100 * f1a['dram_max']:.0f} % (median {100 * f1a['dram_med']:.0f} %), while "
        f"FlashAttention-2 lies within {100 * by_algo['flash2']['dram_min']:+.1f} … "
        f"{100 * by_algo['flash2']['dram_max']:+.1f} % and standard attention within "
        f"{100 * by_algo['standard']['dram_min']:+.1f} … {100 * by_algo['standard']['dram_max']:+.1f} %. The L2 level "
        f"is not the LSU level: the L1 serves part of the re-reads, most for small-tile FlashAttention-2 "
        f"({l2_worst['config_id']}: {100 * l2_worst['l2_err']:+.0f} %; median over FlashAttention-2 "
        f"{100 * by_algo['flash2']['l2_med']:+.0f} %, standard attention {100 * by_algo['standard']['l2_med']:+.0f} %)."
    )
print(t_levels)

# %% [markdown]
# **Takeaway:** {{t_levels}}

# %% [markdown]
# ## Per launch, at both levels, on both GPUs
#
# Every measured launch's error, reads and writes apart: at the LSU level measured/simulated − 1,
# at the DRAM level (measured − simulated)/max(simulated, 1 MB) (`analysis.compare`: a launch of a
# few kilobytes would otherwise show an infinite error for nothing). The acceptance for
# the DRAM level is |error| median ≤ 2 %, 95th percentile ≤ 8 %, maximum ≤ 15 % on each record
# (dotted lines). Writes are also shown with the background write rate × the launch's measured
# duration added (the model has no timing; a diagnosis, not a prediction).

# %%
both = {"H200": records, "H100": load_compare("h100_compare")}
both = {k: v for k, v in both.items() if v is not None}
stats, worst = {}, {}
if both:
    fig, axes = plt.subplots(len(both), 2, figsize=(13, 4.6 * len(both)), squeeze=False)
    for row, (gname, recs) in zip(axes, both.items()):
        order = sorted(range(len(recs)), key=lambda i: (recs[i]["kernel"], recs[i]["pass"], recs[i]["config_id"],
                                                        recs[i]["launch_index"]))
        recs = [recs[i] for i in order]
        x = np.arange(len(recs))
        for ax, lv, keys in ((row[0], "LSU", (("lsu_ld_err", "reads", "o"), ("lsu_st_err", "writes", "x"))),
                             (row[1], "DRAM", (("dram_read_err", "reads", "o"), ("dram_write_err", "writes", "x"),
                                               ("dram_write_timed_err", "writes + background rate", "+")))):
            for key, what, mk in keys:
                for kernel in ("flash2", "flash1", "standard"):
                    sel = [i for i, r in enumerate(recs) if r["kernel"] == kernel]
                    ax.plot(x[sel], [100 * recs[i][key] for i in sel], mk, color=COLORS[kernel], ms=4,
                            alpha=0.35 if "background" in what else 0.85,
                            label=f"{kernel} {what}" if lv == "DRAM" or what == "reads" else None)
            if lv == "DRAM":
                ax.set_yscale("symlog", linthresh=15)
                for lim in (2, 8, 15):
                    ax.axhline(lim, color="k", ls=":", lw=0.6)
                    ax.axhline(-lim, color="k", ls=":", lw=0.6)
                ax.legend(fontsize=8, ncol=3, loc="upper left", bbox_to_anchor=(0, -0.18))
            else:
                ax.legend(fontsize=8)
            ax.set_xlabel("launch (by kernel, pass, configuration)")
            ax.set_ylabel(f"{lv} error (%)")
            ax.set_title(f"NVIDIA {gname}: {lv} level, {len(recs)} launches", fontsize=9)
        s_ = summarize(recs)
        stats[gname] = s_
        w = max(recs, key=lambda r: max(abs(r["dram_read_err"]), abs(r["dram_write_err"])))
        worst[gname] = w
        print(f"{gname}: LSU {s_['lsu_within_tolerance']}/{s_['launches']} within 1 %; DRAM reads median "
              f"{100 * s_['dram_read_median_abs_err']:.1f} %, p95 {100 * s_['dram_read_p95_abs_err']:.1f} %, max "
              f"{100 * s_['dram_read_max_abs_err']:.1f} %; writes median {100 * s_['dram_write_median_abs_err']:.1f} %, "
              f"p95 {100 * s_['dram_write_p95_abs_err']:.0f} %, max {100 * s_['dram_write_max_abs_err']:.0f} %; "
              f"writes + background p95 {100 * s_['dram_write_timed_p95_abs_err']:.0f} %")
    fig.tight_layout()
    plt.show()


def _outside(recs, key, lim=0.15):
    return [r for r in recs if abs(r[key]) > lim]


def _describe(gname):
    s_, recs = stats[gname], both[gname]
    out_w = _outside(recs, "dram_write_err")
    diff = np.median([(r["dram_write_bytes"] - r["sim_dram_write_bytes"]) / 1e6 for r in out_w])
    w = worst[gname]
    return (f"On the {gname}, DRAM reads are off by a median {100 * s_['dram_read_median_abs_err']:.1f} % "
            f"(95th percentile {100 * s_['dram_read_p95_abs_err']:.1f} %, worst {100 * s_['dram_read_max_abs_err']:.0f} %, "
            f"launches beyond 15 %: {len(_outside(recs, 'dram_read_err'))}) and writes by "
            f"{100 * s_['dram_write_median_abs_err']:.1f} % (95th percentile {100 * s_['dram_write_p95_abs_err']:.0f} %); "
            f"the {len(out_w)} launches whose writes are beyond 15 % miss by a median {diff:.1f} MB, and with the "
            f"background rate added {len(_outside(recs, 'dram_write_timed_err'))} remain beyond; the worst, "
            f"{w['config_id']} launch {w['launch_index']}, wrote {w['dram_write_bytes'] / 1e6:.1f} MB in "
            f"{w['time_ns'] / 1e6:.0f} ms against {w['sim_dram_write_bytes'] / 1e6:.1f} MB predicted "
            f"({w['sim_dram_write_timed_bytes'] / 1e6:.1f} MB with the background rate)")


t_launch = "No comparison yet: nothing is drawn above."
if stats:
    # what the takeaway says: the LSU level is exact on both, the reads meet the median and the
    # 95th percentile, the writes' median does not reach their tail, which the background rate
    # (the model has no timing) accounts for in part
    for gname, s_ in stats.items():
        recs = both[gname]
        assert s_["lsu_within_tolerance"] == s_["launches"], gname
        assert s_["dram_read_median_abs_err"] <= 0.02 and s_["dram_read_p95_abs_err"] <= 0.08, gname
        assert s_["dram_write_p95_abs_err"] > 0.15, gname
        out_w = _outside(recs, "dram_write_err")
        assert np.median([(r["dram_write_bytes"] - r["sim_dram_write_bytes"]) / 1e6 for r in out_w]) < 2, gname
        assert len(_outside(recs, "dram_write_timed_err")) < len(out_w), gname
    t_launch = (
        "every launch is within 1 % at the LSU level on both GPUs. " + ". ".join(_describe(g) for g in stats)
        + ". The reads meet the acceptance's median (≤ 2 %) and 95th percentile (≤ 8 %) on both records; the "
        "writes do not: the launches beyond miss by a megabyte or two each, written while they run, which a "
        "model without timing cannot see (the background rate accounts for part of it), and "
        "analysis/data/README.md explains the H100's FlashAttention-1 forward at N = 4,096, whose record does "
        "not reproduce."
    )
print(t_launch)

# %% [markdown]
# **Takeaway:** {{t_launch}}

# %% [markdown]
# ## Theorem 2, fitted
#
# A least-squares fit of log(bytes) = c + a·log N + b·log d + e·log M over the
# FlashAttention-1 forward configurations (fp16, no mask) — Theorem 2 says a = 2, b = 2, e = −1
# where the N²d²/M term dominates — for the measured LSU bytes and for the simulator's on the
# same configurations (`analysis.compare.theorem2_fits`). The H200 record varies M (8–192 KiB
# at N = 2048) and N (512–4096) but d only at one point (128); the d sweep of
# `scripts/device/nb_measure.sh` (`analysis/data/h100/dsweep/`, d = 32 … 256 at N = 2048 and
# M = 32 and 64 KiB, on an H100) adds the head dimensions, so that b rests on six values of d.
# LSU bytes do not depend on the GPU (the LSU level is exact on both), which is what lets the
# two records be fitted together. The measured and the simulated fits agree by construction —
# the LSU bytes equal the walker's — so the fit tests Theorem 2's exponents on the schedule
# our kernels run, not a prediction of HBM traffic. The figure puts the measured bytes against Theorem 2's
# expression with its explicit constant, 2Nd + 12N²d²/M + 16N²d/M elements per head
# (`flashsim.bounds`), at 2 bytes per element. The kernel keeps O in float32 for fp16 inputs, so
# the O read and write (two thirds of the 12N²d²/M term) cost 4 bytes per element, which alone
# puts the measured bytes about (2 + 2·4)/(3·2) ≈ 1.7× above the line where that term dominates
# (more where the float32 ℓ, m and O's initialisation weigh in); the fitted exponents do not
# depend on this constant.

# %%
from analysis.configs import sim_options, tiling_of
from analysis.nb_claims import measured_configs
from analysis.notebook_data import load_csv
from flashsim import Tiling, simulate

dsweep = load_csv("dsweep_h100")
dpts = []
if dsweep is not None:
    dmeta = load_meta("dsweep_h100")
    for c in measured_configs(dsweep):
        c["sim_lsu_bytes"] = simulate(workload_of(c), c["kernel"], c["pass"], tiling_of(c), **sim_options(c)).io.sectors * 32
        c["lsu_err"] = c["lsu_bytes"] / c["sim_lsu_bytes"] - 1
        dpts.append(c)
    print(f"d sweep measured on {dmeta.get('gpu')} ({dmeta.get('date')}, commit {str(dmeta.get('git_commit'))[:10]}): "
          f"{len(dpts)} configurations, largest LSU error {100 * max(abs(c['lsu_err']) for c in dpts):.3f} %")
if have_data:
    fit_set = configs + [c for c in dpts if c["kernel"] == "flash1"]
    fits = theorem2_fits(fit_set)
    d_values = sorted({c["head_dim"] for c in fit_set if c["kernel"] == "flash1" and c["dtype"] == "fp16"
                       and not c["causal"]})
    for name, fit in fits.items():
        ex = ", ".join(f"{x} {fit['exponents'][x]:+.3f} ± {fit['stderr'][x]:.3f}" for x in fit["exponents"])
        print(f"{name:30s} {ex}  (R² {fit['r2']:.4f}, n = {fit['n']})")
    f1 = [c for c in fit_set if c["kernel"] == "flash1" and c["pass"] == "fwd" and not c["causal"] and c["dtype"] == "fp16"]
    if "flash1_fwd_measured" in fits and f1:
        thm = np.array([bounds(workload_of(c), c["sram_bytes"] // DTYPE_BYTES[c["dtype"]])["flash"]
                        * DTYPE_BYTES[c["dtype"]] for c in f1])
        lsu = np.array([c["lsu_bytes"] for c in f1])
        fm, fs = fits["flash1_fwd_measured"], fits["flash1_fwd_simulated"]
        ex = fm["exponents"]
        xs = {k: np.array([c["sram_bytes"] if k == "M" else c[k] for c in f1], dtype=float) for k in ex}
        pred = np.exp(np.log(lsu).mean() - sum(ex[k] * np.log(xs[k]).mean() for k in ex)) * \
            np.prod([xs[k] ** ex[k] for k in ex], axis=0)
        on_h100 = np.array([c in dpts for c in f1])
        fig, (ax, axr) = plt.subplots(1, 2, figsize=(11, 4.2))
        for sel, mk, where in ((~on_h100, "o", gpu_name), (on_h100, "s", "NVIDIA H100 (d sweep)")):
            if sel.any():
                sc = ax.scatter(thm[sel] / 1e9, lsu[sel] / 1e9, c=np.log2([f1[i]["head_dim"] for i in np.where(sel)[0]]),
                                cmap="viridis", marker=mk, vmin=5, vmax=8, label=f"measured LSU, {where}")
                axr.scatter(np.array([c["head_dim"] for c in f1])[sel], 100 * (lsu[sel] / pred[sel] - 1), marker=mk,
                            color=COLORS["flash1"], label=where)
        ax.loglog([thm.min() / 1e9, thm.max() / 1e9], [thm.min() / 1e9, thm.max() / 1e9], "k--", lw=0.8,
                  label="measured = Theorem 2 expression")
        ax.set_xlabel("our Theorem 2 expression, 2Nd + 12N²d²/M + 16N²d/M (GB)")
        ax.set_ylabel("measured LSU bytes (GB)")
        ax.set_title("FlashAttention-1 forward, fp16 (marker: GPU)", fontsize=9)
        fig.colorbar(sc, ax=ax, label="log₂ d")
        ax.legend(loc="upper left")
        axr.axhline(0, color="k", ls="--", lw=0.8)
        axr.set_xscale("log", base=2)
        axr.set_xlabel("head dimension d")
        axr.set_ylabel("measured / fitted power law − 1 (%)")
        axr.set_title("residuals of the fit (marker: GPU)", fontsize=9)
        axr.legend()
        fig.tight_layout()
        plt.show()
        ratio = lsu / thm
        off_d = []
        if dpts:
            worst_d = max(dpts, key=lambda c: abs(c["lsu_err"]))
            off_d = [c for c in dpts if c["lsu_err"] != 0]
            assert worst_d["lsu_err"] < 0.01
        assert abs(ex["M"] + 1) < 0.15 and abs(ex["seq_len_q"] - 2) < 0.15  # the takeaway's "near Theorem 2"
        t_fit = (
            f"the measured exponents are N^{fm['exponents']['seq_len_q']:.2f}, d^{fm['exponents']['head_dim']:.2f}, "
            f"M^{fm['exponents']['M']:.2f} (simulated: {fs['exponents']['seq_len_q']:.2f}, "
            f"{fs['exponents']['head_dim']:.2f}, {fs['exponents']['M']:.2f}; R² {fm['r2']:.4f}, n = {fm['n']}) "
            f"against Theorem 2's 2, 2, −1, and the measured bytes are {ratio.min():.2f}–{ratio.max():.2f}× "
            f"our Theorem 2 expression with its explicit constant. The d exponent rests on "
            f"{len(d_values)} head dimensions ({', '.join(map(str, d_values))})"
            + ("" if len(d_values) > 2 else ": the d sweep (analysis/data/h100/dsweep/) is not yet measured, so "
               "it is no test of the d² yet")
            + "; measured and simulated fits agree by construction (the LSU bytes are the walker's"
            + (f"; in the d sweep to within {100 * worst_d['lsu_err']:.2f} %: {len(off_d)} configurations ("
               + "; ".join(f"d = {c['head_dim']}, M = {c['sram_bytes'] // 1024} KiB, blocks of "
                           f"{Tiling.from_sram(c['sram_bytes'] // 2, c['head_dim']).block_n} rows" for c in off_d)
               + ") request slightly more sectors than the walker counts, a difference this notebook does not "
               "explain" if off_d else "")
            + ")."
        )
        if len(d_values) > 2:
            assert abs(ex["head_dim"] - 2) < 0.15  # d² on six head dimensions
print(t_fit)

# %% [markdown]
# **Takeaway:** {{t_fit}}
