"""The ``fast`` measurement set on the CPU: its configurations, the worker's calls (run under the
CUDA simulator: one launch per schedule launch), the extra ncu metrics, and ``compare`` end to
end on a record made from the walker's own numbers (what an exact measurement would be)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from _fast_trace import trace
from test_reliability_records import fake_gpu  # noqa: F401  (the fixture: a fake ncu and nvidia-smi)

from analysis import fast_set
from analysis.compare import predict_lsu, read_measured, run, schedule_of
from analysis.configs import SET_METRICS, SETS, config_id
from analysis.measure import CONFIG_FIELDS, METRIC_FIELDS
from analysis.ncu import EXTRA_METRICS, METRICS, parse_raw_csv
from flashsim.algorithms import fast


def test_the_fast_set():
    cfgs = SETS["fast"]()
    launches = sum(len(schedule_of(c).launches) for c in cfgs)
    print(len(cfgs), "configurations,", launches, "launches")
    assert (len(cfgs), launches) == (25, 55)  # the docstring's numbers
    assert len({config_id(c) for c in cfgs}) == len(cfgs)
    # every variant BEST can pick, both passes and dtypes, d 64 and 128, causal, GQA, N 1,024..16,384
    assert {c["kernel"] for c in cfgs} == set(fast.VARIANTS)
    assert {c["head_dim"] for c in cfgs} >= {64, 128} and {c["dtype"] for c in cfgs} == {"fp16", "fp32"}
    assert {c["causal"] for c in cfgs} == {True, False} and any(c["kv_heads"] < c["heads"] for c in cfgs)
    assert min(c["seq_len_q"] for c in cfgs if c["seq_len_q"] % 128 == 0) == 1024
    assert max(c["seq_len_q"] for c in cfgs) == 16384
    for c in cfgs:  # the kernel named is the one impl="auto" runs there, at its default tiles
        assert c["kernel"] == fast.best(c["pass"], c["dtype"], c["head_dim"])
        t = fast.tiles(c["kernel"], c["head_dim"])
        assert (c["block_m"], c["block_n"]) == (lambda x: (x.block_m, x.block_n))(t.get("fwd", t.get("dkdv")))


def test_extra_metrics_are_asked_only_where_ncu_knows_them():
    listing = "Device GH100\nMetric Name  Metric Type  Metric Unit  Metric Description\n" + "\n".join(
        f"{m.rsplit('.', 1)[0]}  Counter  byte  x" for m in list(EXTRA_METRICS)[:2])
    assert fast_set.metrics(listing) == METRICS + tuple(list(EXTRA_METRICS)[:2])
    assert fast_set.metrics("") == METRICS
    assert set(SET_METRICS) == {"fast", "fast_smoke"}


def test_reader_takes_the_extra_metrics_where_present():
    names = ["ID", "Kernel Name", *METRICS, *EXTRA_METRICS]
    units = ["", "", "byte", "byte", "sector", "sector", "byte", "byte", "ns", "byte", "byte", "byte"]
    vals = ["0", "k", "64", "32", "2", "1", "0", "0", "1000", "4096", "0", "0"]
    text = "\n".join(",".join(f'"{x}"' for x in row) for row in (names, units, vals))
    rec = parse_raw_csv(text)[0]
    assert (rec["lsu_red_bytes"], rec["lsu_atom_bytes"], rec["lsu_ldgsts_access_bytes"]) == (4096, 0, 0)
    assert "lsu_red_bytes" not in parse_raw_csv("\n".join(
        ",".join(f'"{x}"' for x in row[:9]) for row in (names, units, vals)))[0]
    units[names.index("l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum")] = "Kbyte"
    with pytest.raises(ValueError, match="unit 'Kbyte'"):
        parse_raw_csv("\n".join(",".join(f'"{x}"' for x in row) for row in (names, units, vals)))


@pytest.mark.parametrize("kernel,d", [("bwd_fp32_v2", 32)])
def test_worker_call_makes_the_schedules_launches(kernel, d, monkeypatch):
    from analysis import worker
    from analysis.worker import make_call

    # host copies of the worker's inputs: under the simulator a device array's shape[-1] fails
    # kernels.flash_attention's dtype test (the GPU's device arrays pass it)
    inputs = worker._inputs
    monkeypatch.setattr(worker, "_inputs", lambda cfg, rng: tuple(x.copy_to_host() for x in inputs(cfg, rng)))
    cfg = dict(fast_set._cfg(kernel, 20, d, causal=True, heads=2, kv_heads=1))
    call = make_call(cfg, np.random.default_rng(0))
    with trace() as got:
        call()
    print([g[0] for g in got], [ln.name for ln in schedule_of(cfg).launches])
    assert len(got) == len(schedule_of(cfg).launches)


def test_compare_end_to_end_on_an_exact_record(tmp_path):
    """A record whose every launch measures what the walker counts: compare accepts every launch
    list the fast variants make (1, 3 or 4 launches), finds them all exact, reductions apart."""
    rows = []
    for c in fast_set.fast_smoke_set():
        for k, p in enumerate(predict_lsu(c)):
            row = {"config_id": config_id(c), "launch_index": k, **{f: c.get(f) for f in CONFIG_FIELDS}}
            row.update(lsu_ld_bytes=p["sim_lsu_ld_bytes"], lsu_st_bytes=p["sim_lsu_st_bytes"], l2_read_sectors=0,
                       l2_write_sectors=0, dram_read_bytes=0, dram_write_bytes=0, time_ns=1000.0,
                       lsu_red_bytes=p["sim_lsu_red_bytes"], lsu_atom_bytes=0, lsu_ldgsts_access_bytes=0)
            rows.append(row)
    assert set(METRIC_FIELDS) <= set(rows[0])
    data = tmp_path / "fast_smoke.csv"
    with open(data, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "fast_smoke.meta.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3"}))
    assert len(read_measured(data)[0]) == len(rows) == 15
    assert run(data, tmp_path / "cmp", plots=False) == 0
    s = json.loads((tmp_path / "cmp" / "compare_summary.json").read_text())["summary"]
    assert s["lsu_within_tolerance"] == s["launches"] == s["lsu_ld_exact"] == s["lsu_red_exact"] == 15
    # the destination count differs from the global one where the shared rows are padded: every
    # launch with cp.async tiles but bwd_fp32_v2's (rows of whole sectors)
    assert s["lsu_ld_dest_launches"] == 15 and s["lsu_ld_dest_exact"] == 15 - 6
    red = [r for r in csv.DictReader(open(tmp_path / "cmp" / "compare_launches.csv")) if float(r["sim_lsu_red_bytes"])]
    assert len(red) == 3  # the main launches of bwd_fp16_v3, bwd_fp32_v1 and bwd_fp32_v2


def test_fig2_record_of_fwd_fp16_v4_stores_exact_loads_nine_eighths():
    """The H100 record of fwd_fp16_v4 at 10 block shapes (analysis/data/h100/fig2, B 64, H 16,
    N 1,024, d 64): stores (O, and L in requests of 8 rows) equal the schedule's sectors to the
    byte; loads are exactly 9/8 of them on every shape: the ratio of the kernel's shared-memory
    row (64 + 8 halves, 144 bytes) to the 128 bytes it copies into it, not a re-load (the code
    loads each tile once: test_fast_schedule's cross-check).  scripts/device/ldgsts_probe.sh
    measures whether the LSU counts cp.async by its shared destination."""
    from pathlib import Path

    from flashsim import Workload, simulate

    path = Path(__file__).resolve().parents[1] / "analysis" / "data" / "h100" / "fig2" / "fig2_fast_h100.csv"
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 10
    w = Workload(batch=64, heads=16, seq_len_q=1024, head_dim=64)
    for r in rows:
        cfg = dict(nw=int(r["warps"]), mt=int(r["m_tiles"]), bc=int(r["bc"]))
        io = simulate(w, "fast", "fwd", kernel="fwd_fp16_v4", config=cfg).io
        print(cfg, int(r["lsu_ld_bytes"]), 32 * io.read_sectors, int(r["lsu_st_bytes"]), 32 * io.write_sectors)
        assert int(r["lsu_st_bytes"]) == 32 * io.write_sectors
        assert 8 * int(r["lsu_ld_bytes"]) == 9 * 32 * io.read_sectors
        # the same count, tile by tile, from the cp.async instructions' shared destinations
        dest = fast_set.predict_ldgsts_destination({"kernel": "fwd_fp16_v4", "head_dim": 64}, io, cfg)
        assert dest == [int(r["lsu_ld_bytes"])]


def test_destination_ratios():
    """What the fast set will measure if the LSU counts cp.async by its shared destination: the
    padded rows' sectors over the copied rows' (README, "The fast kernels")."""
    from fractions import Fraction as F

    def ratios(kernel, d):
        return {t: fast_set.destination_ratio(*p) for pats in fast_set.ldgsts_patterns(kernel, d).values()
                for t, p in pats.items()}

    assert set(ratios("fwd_fp16_v4", 64).values()) == {F(9, 8)}  # 4 rows of 144 B a warp: 18 sectors for 16
    assert set(ratios("bwd_fp16_v3", 128).values()) == {F(17, 16)}  # 2 rows of 272 B: 17 for 16
    assert ratios("fwd_fp32_v1", 64) == {"Q": F(17, 16), "K": F(17, 16), "V": 1}  # V rows unpadded
    assert ratios("fwd_fp32_v1", 128)["Q"] == F(33, 32)  # rows of 528 B: every other one 17 sectors
    assert set(ratios("bwd_fp32_v2", 64).values()) == set(ratios("bwd_fp32_v2", 128).values()) == {1}
    assert fast_set.destination_ratio(4, 128, 128, 32) == 1  # unpadded rows: the global count


def test_measure_fast_smoke_end_to_end_with_a_fake_ncu(fake_gpu, tmp_path, capsys):  # noqa: F811
    """`flashsim measure --set fast_smoke` through the fake ncu of test_reliability_records (which
    lists no metric, so only analysis.ncu.METRICS are asked): a whole record, one row a launch."""
    from analysis.cli import main

    out = tmp_path / "rec"
    assert main(["measure", "--set", "fast_smoke", "--out", str(out)]) == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open(out / "fast_smoke.csv")))
    assert len(rows) == len(fast_set.fast_smoke_set()) and rows[0]["kernel"] == "fwd_fp16_v4"
    call = [ln for ln in fake_gpu.read_text().splitlines() if "--log-file" in ln][0]
    assert call.split("--metrics ")[1].split()[0] == ",".join(METRICS)
    assert json.loads((out / "fast_smoke.meta.json").read_text())["metrics"] == list(METRICS)
