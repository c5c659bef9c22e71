"""The notebooks' takeaways held against the committed data and the simulator, without executing
the notebooks (tests/test_notebooks.py does that, with the same assertions inside each notebook).

Each test states one takeaway as a check over *every* curve or point the takeaway speaks of, so
that new data or a changed simulator that contradicts a figure's text fails here.  Measurements
not yet committed (the H100 records of ``scripts/device/nb_measure.sh``) are checked when they
are present; the functions that turn them into takeaways are checked on synthetic records.
"""

import math

import numpy as np
import pytest

from analysis.compare import per_config
from analysis.nb_claims import figure2_claims, fmt_ratio, gpt2_summary, measured_configs, ratio_spreads
from analysis.notebook_data import load_compare, load_csv, load_json
from flashsim import Workload, closed_form_elements, get_gpu


def _head(n, d, **kw):
    return Workload(batch=1, heads=1, seq_len_q=n, head_dim=d, dtype="fp16", **kw)


def _count(w, algo, m=None, **options):
    return sum(closed_form_elements(w, algo, "fwd", sram_elems=None if algo == "standard" else m, **options).values())


def _gemm_block_for(m, d):  # as notebook 01: b² + 2bd <= M
    return max(1, math.isqrt(d * d + m) - d)


# --- 01 ------------------------------------------------------------------------------------


def test_01_smallcache_fewest_below_d2_against_every_curve():
    n, d = 4096, 128
    for m in (512, 1024, 2048, 4096, 8192):
        w = _head(n, d)
        sc = _count(w, "smallcache", m)
        others = {"flash1": _count(w, "flash1", m), "flash2": _count(w, "flash2", m),
                  "standard": _count(w, "standard", gemm_block=_gemm_block_for(m, d))}
        assert all(sc < v for v in others.values()), (m, sc, others)
    # the GEMM tile drawn fits M, and the fixed 128 x 128 tile would not at small M
    assert all(b * b + 2 * b * d <= m for m in (512, 2048, 16384) for b in [_gemm_block_for(m, d)])
    assert 128 * 128 + 2 * 128 * d > 2048


def test_01_flash2_flat_in_d_while_br_is_capped():
    m = get_gpu("a100").sram_elems(2)
    f2 = {d: _count(_head(4096, d), "flash2", m) for d in (16, 32, 64, 128, 256)}
    flat = [f2[d] for d in (16, 32, 64, 128)]
    assert max(flat) / min(flat) < 1.05 and f2[256] > 2 * max(flat)
    f1 = {d: _count(_head(4096, d), "flash1", m) for d in (64, 128, 256)}
    assert math.log(f1[256] / f1[64]) / math.log(4) > 1.8  # FlashAttention-1 pays d²


def test_01_flash1_q_o_reads_tc_and_o_writes_tc_plus_one():
    m = get_gpu("a100").sram_elems(2)
    parts = closed_form_elements(_head(4096, 64), "flash1", "fwd", sram_elems=m)
    nd, tc = 4096 * 64, 13
    assert parts[("Q", "read")] == parts[("O", "read")] == tc * nd and parts[("O", "write")] == (tc + 1) * nd


def test_01_flash_below_both_standard_counts_at_every_n():
    m = get_gpu("a100").sram_elems(2)
    for n in (256, 1024, 4096, 16384):
        alg0 = 4 * n * 64 + 4 * n * n
        std = _count(_head(n, 64), "standard")
        assert std > alg0  # the simulated standard re-reads Q, K, V per 128-wide tile
        for a in ("flash1", "flash2"):
            assert _count(_head(n, 64), a, m) < alg0


# --- 02 ------------------------------------------------------------------------------------


def test_02_h200_sweep_is_not_figure2():
    recs = load_compare("h200_compare")
    if recs is None:
        pytest.skip("no H200 comparison committed")
    pts = [c for c in per_config(recs) if c["kernel"] == "flash1" and c["pass"] == "fwd" and not c["causal"]
           and c["dtype"] == "fp16" and c["seq_len_q"] == 2048 and c["head_dim"] == 64]
    lsu = [c["lsu_bytes"] for c in pts]
    dram = [c["dram_bytes"] for c in pts]
    assert max(lsu) / min(lsu) > 10 and max(dram) / min(dram) < 1.2
    assert all(r["grid"] == "(16, 1, 1)" for r in recs if r["config_id"] in {c["config_id"] for c in pts})


def _synthetic_record(kernel_blocks, bw_share, peak):
    rows, timing = [], []
    for kernel, blocks in kernel_blocks.items():
        for i, b in enumerate(blocks):
            dram = 1e10 / b
            ms = dram / (bw_share * peak) * 1e3 * (1 if i == 0 else 0.9 ** i)
            cid = f"{kernel}-{b}"
            cfg = {"config_id": cid, "kernel": kernel, "pass": "fwd", "batch": 64, "heads": 16, "seq_len_q": 1024,
                   "seq_len_k": 1024, "head_dim": 64, "dtype": "fp16", "causal": False,
                   "sram_bytes": b * 4 * 64 * 2 if kernel == "flash1" else None,
                   "block_m": None if kernel == "flash1" else b, "block_n": None if kernel == "flash1" else b}
            rows.append(cfg | {"lsu_ld_bytes": int(2 * dram), "lsu_st_bytes": 0, "dram_read_bytes": int(dram),
                               "dram_write_bytes": 0, "time_ns": ms * 1e6, "grid": "(1024, 1, 1)"})
            timing += [{"config_id": cid, "ms": ms * f} for f in (0.99, 1.0, 1.01)]
    return rows, timing


def test_02_figure2_claims_follow_the_data():
    peak = get_gpu("h100").hbm_bytes_per_s
    rows, timing = _synthetic_record({"flash1": [16, 32, 64], "flash2": [8, 16, 32]}, 0.8, peak)
    pts = measured_configs(rows, timing)
    assert {p["block"] for p in pts if p["kernel"] == "flash1"} == {16, 32, 64}
    c = figure2_claims(pts, peak)
    assert c["flash1"]["memory_bound"] and c["flash1"]["dram_drop"] == pytest.approx(4)
    assert c["flash1"]["time_drop"] > 1 and c["flash1"]["rank_corr_time_dram"] == pytest.approx(1)
    slow = figure2_claims(measured_configs(*_synthetic_record({"flash1": [16, 32]}, 0.05, peak)), peak)
    assert not slow["flash1"]["memory_bound"]


def test_02_figure2_record_when_committed():
    rows = load_csv("fig2_h100")
    if rows is None:
        pytest.skip("the H100 Figure 2 record is not yet committed")
    c = figure2_claims(measured_configs(rows, load_csv("fig2_h100_timing")), get_gpu("h100").hbm_bytes_per_s)
    assert set(c) == {"flash1", "flash2"}
    assert all(v["grid_blocks"] >= 132 for v in c.values())  # the configuration fills the GPU


def test_02_figure2_on_the_fast_kernel():
    """Notebook 02's last takeaway against every row of the fast kernel's record: the requested
    bytes fall as 1/Br, the kernel time falls with them up to the fastest block, DRAM stays flat
    (within 1%) except where registers spill."""
    rows = load_csv("fig2_fast_h100")
    assert rows is not None, "analysis/data/h100/fig2/fig2_fast_h100.csv is committed"
    ok = [r for r in rows if not r.get("error")]
    o_bytes = 64 * 16 * 1024 * 64 * 2
    clean = [r for r in ok if float(r["dram_write_bytes"]) <= 2 * o_bytes]
    assert len(ok) - len(clean) == 1  # Br x Bc = 128 x 128 spills
    best = {}
    for r in clean:
        if int(r["br"]) not in best or float(r["time_ns"]) < float(best[int(r["br"])]["time_ns"]):
            best[int(r["br"])] = r
    brs = sorted(best)
    lsu = [float(best[b]["lsu_ld_bytes"]) + float(best[b]["lsu_st_bytes"]) for b in brs]
    t = [float(best[b]["time_ns"]) for b in brs]
    dram = [float(r["dram_read_bytes"]) + float(r["dram_write_bytes"]) for r in clean]
    print(brs, [f"{x / 1e9:.2f}" for x in lsu], [f"{x / 1e6:.2f}" for x in t])
    assert all(a > b for a, b in zip(lsu, lsu[1:]))  # requested bytes fall at every step
    knee = t.index(min(t))
    assert brs[knee] == 128 and all(a > b for a, b in zip(t[:knee], t[1:knee + 1]))
    assert t[0] / min(t) > 3 and max(dram) / min(dram) < 1.01


# --- 04 ------------------------------------------------------------------------------------


def test_04_dram_error_per_algorithm_and_l2_level():
    recs = load_compare("h200_compare")
    if recs is None:
        pytest.skip("no H200 comparison committed")
    configs = per_config(recs)
    f1 = [c["dram_bytes"] / c["sim_dram_bytes"] - 1 for c in configs if c["kernel"] == "flash1"]
    assert len(f1) == 12 and min(f1) > 0  # every FlashAttention-1 configuration under-predicted
    l2 = {}
    for r in recs:
        l2[r["config_id"]] = l2.get(r["config_id"], 0) + 32 * (r["l2_read_sectors"] + r["l2_write_sectors"])
    worst = min(configs, key=lambda c: l2[c["config_id"]] / c["sim_lsu_bytes"])
    assert worst["kernel"] == "flash2" and l2[worst["config_id"]] / worst["sim_lsu_bytes"] - 1 < -0.3
    assert all(abs(r["lsu_err"]) < 0.01 for r in recs)


# --- 05 ------------------------------------------------------------------------------------


def test_05_fp32_error_grows_about_sqrt_n():
    data = load_json("exactness")
    if data is None:
        pytest.skip("no exactness record committed")
    f32 = sorted((r for r in data["records"] if "error" not in r and r["dtype"] == "float32"
                  and r["kernel"] == "flash2" and r["pass"] == "fwd" and not r["causal"] and r["d"] == 64
                  and r["heads"] == r["kv_heads"]), key=lambda r: r["n"])
    slope = np.polyfit(np.log([r["n"] for r in f32]), np.log([r["rel_err"] for r in f32]), 1)[0]
    assert len(f32) >= 3 and 0.3 < slope < 0.7


def test_05_spread_record_when_committed():
    rows = load_csv("exactness_spread")
    if rows is None:
        pytest.skip("the H100 exactness spread is not yet committed")
    runs = [r for r in rows if r["dist"] != "memory"]
    assert len({r["seed"] for r in runs}) >= 3 and len({r["dist"] for r in runs}) >= 3
    assert all(r["finite"] for r in runs)
    mem = sorted((r for r in rows if r["dist"] == "memory"), key=lambda r: r["n"])
    slope = np.polyfit(np.log([r["n"] for r in mem]), np.log([r["device_bytes_allocated_by_call"] for r in mem]), 1)[0]
    assert 0.9 < slope < 1.1


# --- 06 ------------------------------------------------------------------------------------


def test_06_ratio_precision_follows_the_spread():
    assert fmt_ratio(5.59, 0.02) == "5.6" and fmt_ratio(0.64, 0.02) == "0.64"
    assert fmt_ratio(18.64, 0.05) == "18.6" and fmt_ratio(18.64, 0.2) == "19"
    assert fmt_ratio(1.2345, 1e-4) == "1.23" and fmt_ratio(float("nan"), 0.1) == "–"
    rows = [{"pass": "fwd", "dtype": "fp16", "d": 64, "causal": False, "n": 1024, "batch": 1, "heads": 1,
             "variant": v, "ms": ms, "ms_std": sd, "error": None}
            for v, ms, sd in (("naive", 2.0, 0.2), ("ours_x", 1.0, 0.0))]
    (spread,) = ratio_spreads(rows, ("naive",)).values()
    assert spread["naive"] == pytest.approx(0.1)


def test_06_gpt2_summary_keeps_failed_runs():
    rows = [{"variant": "naive", "causal": True, "mode": "fwd_bwd", "run": run, "ms": 10.0 + run, "status": "ok"}
            for run in range(3)] + [{"variant": "naive", "causal": True, "mode": "fwd_bwd", "run": 3,
                                     "status": "out of memory"}]
    s = gpt2_summary(rows)[("naive", True, "fwd_bwd")]
    assert s["runs"] == 3 and s["lo"] == 10 and s["hi"] == 12 and s["failed"] == ["out of memory"]


def test_06_three_x_tf32_is_rated_against_the_tf32_peak():
    from analysis.notebook_data import find
    from analysis.perf import ratios, read_bench

    path = find("bench")
    if path is None:
        pytest.skip("no benchmark committed")
    best = ratios(read_bench(path), fastest_only=True)
    top = max((r for r in best if r["pass"] == "bwd" and r["dtype"] == "fp32"), key=lambda r: r["tflops"])
    h100 = get_gpu("h100")
    # the fastest fp32 backward is the 3xTF32 variant, above 50 % of the FFMA peak but a few % of TF32's
    assert top["variant"] == "ours_bwd_fp32_v2"
    assert top["tflops"] * 1e12 < 0.2 * h100.matmul_flops["tf32"]


# --- 08 ------------------------------------------------------------------------------------
# Read generically: the bench may be re-run (the fast kernel is being sped up), so these hold the
# takeaways' logic and the claims that do not depend on the kernel's speed; the notebook's own
# assertions hold the rest when it runs.


def _bench_decode():
    rows = load_csv("bench_decode")
    if rows is None:
        pytest.skip("no decode bench committed")
    return rows


def test_08_simulated_overheads():
    from flashsim import Tiling
    from flashsim.decode_splits import decode_bounds, propose

    g, split_pct = 8, []
    for nk in (4096, 65536, 1048576):
        w = Workload(batch=1, heads=64, kv_heads=8, seq_len_q=1, seq_len_k=nk, head_dim=128, dtype="fp16")
        s = propose(w, "h100", Tiling(1, 64), page_size=16).num_splits
        b = decode_bounds(w, Tiling(1, 64), num_splits=s, page_size=16)
        split_pct.append(100 * b["split"] / b["compulsory"])
        assert b["paging_sectors"] == 0 and b["paging"] / b["compulsory"] < 0.001
        c = decode_bounds(w, Tiling(1, 64), num_splits=s)  # contiguous, as the notebook's GQA curve
        assert 0.99 * g < (c["compulsory"] + c["no_gqa_packing"]) / c["compulsory"] <= g
    assert split_pct[0] > split_pct[1] > split_pct[2] and split_pct[2] < 0.1


def test_08_bandwidth_claims_are_the_csv_s():
    from analysis.nb_claims import DECODE_OURS, decode_bench, decode_main_claims

    rows = _bench_decode()
    main = decode_bench(rows, "main")
    mc = decode_main_claims(main)
    for c in main:
        ours = c["variants"].get(DECODE_OURS)
        if ours is None or ours["error"]:
            continue
        csv_row = next(r for r in rows if r["group"] == "main" and r["variant"] == DECODE_OURS
                       and (r["heads"], r["nk"], r["batch"]) == tuple(c["config"][k] for k in ("heads", "nk", "batch")))
        # the ratios recomputed from the times are the bench's own columns
        assert ours["x_copy"] == pytest.approx(csv_row["x_copy"], rel=1e-9)
        assert ours["x_sdpa_best"] == pytest.approx(csv_row["x_sdpa_best"], rel=1e-9)
        assert ours["gbps_lo"] <= ours["gbps"] <= ours["gbps_hi"]
    xs = [c["variants"][DECODE_OURS]["x_copy"] for c in main if c["variants"].get(DECODE_OURS, {}).get("error") is None]
    assert mc["meet_copy"] == sum(x >= 0.8 for x in xs) and mc["x_copy_min"] == min(xs)
    assert mc["timed"] + len(mc["untimed"]) == mc["configs"]
    # the ceiling is reachable: SDPA's best backend is within 5% of the copy or above it everywhere
    assert mc["sdpa_best_x_copy_min"] > 0.95


def test_08_split_sweep_marks():
    from analysis.nb_claims import decode_split_sweeps

    sweeps = decode_split_sweeps(_bench_decode())
    timed = [s for s in sweeps if s["ms"]]
    assert timed
    for s in timed:
        assert s["model"] == s["model_check"]  # the CSV's model column is what propose returns today
        assert s["ms"][s["splits"].index(s["best"])] == min(s["ms"])
        assert s["fa2"] <= s["model"]  # flash-attention's 85% rule stops at a smaller S than our model


def test_08_pages_and_compare():
    from analysis.nb_claims import DECODE_OURS, decode_compare_claims, decode_pages

    pg = decode_pages(_bench_decode())
    assert 0 in pg["pages"] and len(pg["pages"]) >= 3
    assert pg["variants"][DECODE_OURS]["slowdown_min"] <= pg["variants"][DECODE_OURS]["slowdown_max"]
    recs = load_compare("decode_h100_compare")
    if recs is None:
        pytest.skip("no decode comparison committed")
    cc = decode_compare_claims(recs)
    assert cc["launches"] == cc["st_exact"] == 21 and cc["combine"] == cc["combine_ld_exact"] == 10
    # loads: to the byte, or (a record of the kernel that read its length in every warp: 4 sectors
    # a main block where the walker's Lens read is 1) 96 bytes a main block over the walker
    assert cc["ld_exact"] == 21 or (cc["ld_exact"] == 10 and cc["main_ld_excess_per_block"] == [96])
    assert cc["main_read_err_max"] < 0.005 and cc["sim_write_max"] == 0
    assert cc["write_max"] > cc["timed_write_max"]  # the writes are not all the background rate's
