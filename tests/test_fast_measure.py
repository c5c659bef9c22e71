"""The ``fast`` measurement set on the CPU: its configurations, the worker's calls (run under the
CUDA simulator: one launch per schedule launch), the extra ncu metrics, and ``compare`` end to
end on a record made from the walker's own numbers (what an exact measurement would be)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from _fast_trace import trace
from test_reliability_records import fake_gpu  # noqa: F401  (the fixture: a fake ncu and nvidia-smi)

from analysis import fast_set
from analysis.compare import predict_lsu, read_measured, run, schedule_of
from analysis.configs import FAST_FIELDS, SET_METRICS, SETS, config_id
from analysis.measure import CONFIG_FIELDS, METRIC_FIELDS
from analysis.ncu import EXTRA_METRICS, METRICS, parse_raw_csv
from flashsim.algorithms import fast


def test_the_fast_set():
    cfgs = SETS["fast"]()
    launches = sum(len(schedule_of(c).launches) for c in cfgs)
    print(len(cfgs), "configurations,", launches, "launches")
    assert (len(cfgs), launches) == (29, 66)  # the docstring's numbers
    assert len({config_id(c) for c in cfgs}) == len(cfgs)
    # every variant BEST can pick, both passes and dtypes (bf16 both ways), d 64 and 128, causal,
    # GQA, N 1,024..16,384
    # v5: in BEST until v7; fwd_fp32_v1, bwd_fp32_v1: BEST's at d = 80 and 96 until the fp32 v2
    # kernels took every d % 8 == 0 up to 128, padded on chip (7fda245, and the backward after), now
    # only at d % 8 == 4 (their records stay)
    assert {c["kernel"] for c in cfgs} == set(fast.VARIANTS) - {"fwd_fp16_v5", "fwd_fp32_v1", "bwd_fp32_v1"}
    assert {c["head_dim"] for c in cfgs} >= {64, 128} and {c["dtype"] for c in cfgs} == {"fp16", "fp32", "bf16"}
    assert {c["pass"] for c in cfgs if c["dtype"] == "bf16"} == {"fwd", "bwd"}
    assert {c["causal"] for c in cfgs} == {True, False} and any(c["kv_heads"] < c["heads"] for c in cfgs)
    assert min(c["seq_len_q"] for c in cfgs if c["seq_len_q"] % 128 == 0) == 1024
    assert max(c["seq_len_q"] for c in cfgs) == 16384
    narrowed = []
    for c in cfgs:  # the kernel named is the one impl="auto" runs there, at the tiles it runs on 132 SMs
        # (bwd_fp16_v1 at d = 40: BEST's until it took bwd_fp16_v3 at d = 32 and 40; v1 now runs the
        # deterministic backward there, and its record stays)
        deterministic = (c["kernel"], c["head_dim"]) == ("bwd_fp16_v1", 40)
        assert c["kernel"] == ("bwd_fp16_v1" if deterministic else fast.best(c["pass"], c["dtype"], c["head_dim"]))
        cfg = fast.fit_to_grid(c["kernel"], fast.default_config(c["kernel"], c["head_dim"]), {}, c["seq_len_q"],
                               c["batch"] * c["heads"], 132, d=c["head_dim"])
        t = fast.tiles(c["kernel"], c["head_dim"], cfg)
        assert (c["block_m"], c["block_n"]) == (lambda x: (x.block_m, x.block_n))(t.get("fwd", t.get("dkdv")))
        if cfg != fast.default_config(c["kernel"], c["head_dim"]):
            narrowed.append((c["kernel"], c["seq_len_q"], c["head_dim"], c["block_m"]))
    # B·H = 16 at N <= 1,056: a 128-row grid of at most 132 blocks, run with 64-row blocks; v7 (v5's
    # block there) at d = 128, N = 1,024: 256 blocks, at most four an SM, run with Bc = 64
    assert narrowed == [("fwd_fp16_v7", 1024, 128, 64), ("fwd_fp16_v4", 1024, 40, 64),
                        ("fwd_fp16_v7", 1000, 64, 64)]


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


def test_bf16_configurations_run_the_variant_on_bf16_tensors(monkeypatch):
    """The worker's inputs of a bf16 configuration are float32 (numpy has no bfloat16): make_call
    hands the variant torch bfloat16 tensors of the same values (the kernels take bf16 as torch
    tensors), made before the measured call; the variant's own calls are stubbed here (the GPU
    runs them: the fast_smoke set has a bf16 forward and backward)."""
    import torch

    import kernels.perf

    calls = []

    class Variant:
        def forward(self, *xs, causal):
            calls.append(("fwd", [x.dtype for x in xs]))

        def saved_forward(self, *xs, causal):
            calls.append(("saved", [x.dtype for x in xs]))
            return "O", "L"

        def backward(self, q, k, v, o, lse, do, causal):
            calls.append(("bwd", [x.dtype for x in (q, k, v, do)] + [o, lse]))

    monkeypatch.setattr(kernels.perf, "variant", lambda name: Variant())
    x = np.linspace(-2, 2, 2 * 2 * 4 * 16, dtype=np.float32).reshape(2, 2, 4, 16)
    for kernel in ("fwd_fp16_v4", "bwd_fp16_v1"):
        call = fast_set.make_call(fast_set._cfg(kernel, 4, 16, batch=2, heads=2, dtype="bf16"), x, x, x, x)
        n = len(calls)
        call()
        assert len(calls) == n + 1  # the measured call: the variant once
    bf = torch.bfloat16
    assert calls == [("fwd", [bf] * 3), ("saved", [bf] * 3), ("bwd", [bf] * 4 + ["O", "L"])]
    assert torch.equal(fast_set._bf16(x), torch.from_numpy(x).to(bf))


def test_compare_end_to_end_on_an_exact_record(tmp_path):
    """A record whose every launch measures what the LSU counts (the walker's sectors, cp.async
    tiles by their shared destinations): compare accepts every launch list the fast variants make
    (1, 3 or 4 launches), finds them all exact, reductions apart."""
    rows = []
    for c in fast_set.fast_smoke_set():
        for k, p in enumerate(predict_lsu(c)):
            row = {"config_id": config_id(c), "launch_index": k,
                   **{f: c.get(f) for f in (*CONFIG_FIELDS, *FAST_FIELDS)}}
            row.update(lsu_ld_bytes=p["sim_lsu_ld_ldgsts_bytes"], lsu_st_bytes=p["sim_lsu_st_bytes"], l2_read_sectors=0,
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
    assert len(read_measured(data)[0]) == len(rows) == 21
    assert run(data, tmp_path / "cmp", plots=False) == 0
    s = json.loads((tmp_path / "cmp" / "compare_summary.json").read_text())["summary"]
    assert s["lsu_within_tolerance"] == s["launches"] == s["lsu_ld_exact"] == s["lsu_red_exact"] == 21
    # the LSU's count differs from the walker's global one where a cp.async group's shared
    # destination touches more sectors than its source: every launch with cp.async tiles (10) but
    # bwd_fp32_v2's (rows of 288 bytes at d = 64: whole sectors, aligned) and fwd_fp16_v5's (unpadded
    # 128-byte swizzled rows: a group's 8 chunks are one row's 128 bytes, permuted)
    assert s["lsu_ld_walker_launches"] == 21 and s["lsu_ld_walker_exact"] == 21 - 10
    red = [r for r in csv.DictReader(open(tmp_path / "cmp" / "compare_launches.csv")) if float(r["sim_lsu_red_bytes"])]
    # the main launches of bwd_fp32_v1 and bwd_fp32_v2; bwd_fp16_v3 at d = 128 reduces dQ by the TMA
    # unit's bulk reductions (its default since e4caee9: class "bulk", which passes no LSU)
    assert [r["kernel"] for r in red] == ["bwd_fp32_v1", "bwd_fp32_v2"]


def test_fig2_record_of_fwd_fp16_v4_stores_exact_loads_nine_eighths():
    """The H100 record of fwd_fp16_v4 at 10 block shapes (analysis/data/h100/fig2, B 64, H 16,
    N 1,024, d 64): stores (O, and L in requests of 8 rows) equal the schedule's sectors to the
    byte; loads are exactly 9/8 of them on every shape, not a re-load (the code loads each tile
    once: test_fast_schedule's cross-check) but the LSU's count of cp.async into rows of 144
    bytes (half of them 16 bytes off a sector): fast_set.predict_lsu_loads equals every one."""
    from pathlib import Path

    from flashsim import Workload
    from flashsim.traffic import walk

    path = Path(__file__).resolve().parents[1] / "analysis" / "data" / "h100" / "fig2" / "fig2_fast_h100.csv"
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 10
    w = Workload(batch=64, heads=16, seq_len_q=1024, head_dim=64)
    for r in rows:
        cfg = dict(nw=int(r["warps"]), mt=int(r["m_tiles"]), bc=int(r["bc"]))
        sched = fast.schedule(w, None, "fwd", kernel="fwd_fp16_v4", config=cfg)
        io = walk(sched)
        lsu = fast_set.predict_lsu_loads({"kernel": "fwd_fp16_v4", "head_dim": 64}, sched, io, cfg)
        print(cfg, int(r["lsu_ld_bytes"]), 32 * io.read_sectors, lsu, int(r["lsu_st_bytes"]), 32 * io.write_sectors)
        assert int(r["lsu_st_bytes"]) == 32 * io.write_sectors
        assert 8 * int(r["lsu_ld_bytes"]) == 9 * 32 * io.read_sectors
        assert lsu == [int(r["lsu_ld_bytes"])]


def test_ldgsts_sectors_the_probe_and_the_kernels_rows():
    """The LSU's count of a cp.async tile (groups of 8 lanes, each the sectors of its shared
    destination): the probe's patterns (scripts/device/ldgsts_probe.cu: 8 chunks a row into
    plain rows, and into rows padded to 144 bytes: 9/8), the fp16 kernels' rows of d + 8 halves
    (9/8 at d = 64 AND at d = 128, where a warp-wide destination count would give 17/16),
    src-size 0 rows (no request), and rows that 8-lane groups straddle (fwd_fp32_v1 at d = 80)."""
    from fractions import Fraction as F

    def ratio(rows, row_bytes, stride, threads):
        return F(fast_set.ldgsts_sectors(rows, row_bytes, stride, threads), rows * row_bytes // 32)

    assert ratio(256, 128, 128, 256) == 1  # the probe's cp_cg: plain rows, the global count
    assert ratio(256, 128, 144, 256) == F(9, 8)  # pad_cg: 75,497,472 of 67,108,864 bytes
    assert ratio(128, 128, 144, 128) == F(9, 8)  # fwd_fp16_v4, d = 64
    assert ratio(64, 256, 272, 128) == F(9, 8)  # bwd_fp16_v3, d = 128 (rows of 272 B)
    assert ratio(64, 512, 544, 128) == 1  # bwd_fp32_v2, d = 128: rows 17 sectors apart
    # fwd_fp32_v2 at d = 64: K rows 288 B (aligned), V rows 272 B: V's cost 1/8 more
    pats = fast_set.ldgsts_patterns("fwd_fp32_v2", 64)["fwd_fp32_v2"]
    assert ratio(*pats["K"]) == 1 and ratio(*pats["V"]) == F(9, 8) and "Q" not in pats
    assert fast_set.ldgsts_patterns("fwd_fp32_v2", 64, "qsplit=false")["fwd_fp32_v2"]["Q"] == (128, 256, 288, 128)
    # fwd_fp32_v1 at d = 80: rows of 320 B (20 chunks) 336 B apart; a group of 8 lanes can span
    # the end of one row and the start of the next: counted by the sectors of both destinations
    q = fast_set.ldgsts_patterns("fwd_fp32_v1", 80)["fwd_fp32_v1"]["Q"]
    assert q[1:3] == (320, 336)
    # chunks 0-7: 4 sectors; 8-15: 4; 16-23: 2 + 3 (rows 0 and 1); 24-31: 5; 32-39: 5 (20 global sectors)
    assert fast_set.ldgsts_sectors(2, 320, 336, 32) == 23
    # rows past the end (src-size 0) make no request; a lone row costs its own groups
    assert fast_set.ldgsts_sectors(128, 128, 144, 128, valid=0) == 0
    assert fast_set.ldgsts_sectors(128, 128, 144, 128, valid=2) == 4 + 5


def test_the_h100_records_of_the_fast_set_agree_to_the_byte():
    """The committed H100 records of the fast set (analysis/data/h100/fast, db138fb; the 10
    fwd_fp16_v5 launches of the set at 7537521; the fp16/bf16 forwards of the set, 11 launches, at
    e1259f6; v5's 10 with Bc = 48 at d = 128, at 5ad5db9; bwd_fp16_v3's 8 configurations, 32 launches,
    with the 128 x 128 block at d = 64, at 70dc356; bwd_fp16_v3 at d = 80, odd n-tiles and partial
    copy passes, and bwd_fp16_v1 at d = 40, rows of 80 bytes, at f27bd21; fwd_fp16_v5 at d = 96,
    tiles of three 32-column atoms, at d6b06a6, and fwd_fp16_v4 at d = 40, at fc109a0),
    compared: on all 126 launches the loads equal the LSU's count (cp.async tiles by their shared
    destinations; the preprocess's 16-column strips) to the byte, and stores and reductions the
    walker's; the walker's own load count (the global bytes copied) equals the measured loads on
    88 (fwd 0/12, bwd 28/38, bf16 1/4, v5 10/10, v5b 10/11, v5c 10/10, v3d 24/32, v3odd 3/4, v1d40
    1/3, v5d96 1/1, v4d40 0/1: v5's swizzled rows are unpadded, v4's, v3's and v1's are padded).
    The compare outputs committed beside them say the same."""
    from _fast_records import ROOT as root
    from _fast_records import compared

    from analysis.compare import summarize

    want = {"fwd": (12, 0), "bwd": (38, 28), "bf16": (4, 1), "v5": (10, 10), "v5b": (11, 10), "v5c": (10, 10),
            "v3d": (32, 24), "v3odd": (4, 3), "v1d40": (3, 1), "v5d96": (1, 1), "v4d40": (1, 0)}
    for rec, (n, walker) in want.items():
        s = summarize(list(compared(rec)))
        print(rec, {k: v for k, v in s.items() if k.startswith("lsu")})
        assert s["launches"] == n and s["lsu_ld_exact"] == s["lsu_st_exact"] == s["lsu_red_exact"] == n
        assert s["lsu_within_tolerance"] == n and s["lsu_ld_walker_exact"] == walker
        committed = json.loads((root / f"compare_{rec}" / "compare_summary.json").read_text())["summary"]
        assert (committed["lsu_ld_exact"], committed["lsu_ld_walker_exact"]) == (n, walker)


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
    # --only and --skip (measure_fast.sh keeps the bf16 configurations in a record of their own)
    out2 = tmp_path / "rec2"
    assert main(["measure", "--set", "fast_smoke", "--only=-fwd-", "--skip=-bf16-", "--out", str(out2)]) == 0
    got = [(r["kernel"], r["dtype"]) for r in csv.DictReader(open(out2 / "fast_smoke.csv"))]
    assert got == [(c["kernel"], c["dtype"]) for c in fast_set.fast_smoke_set()
                   if c["pass"] == "fwd" and c["dtype"] != "bf16"]
    assert main(["measure", "--set", "fast_smoke", "--only=-bf16-", "--skip=bf16", "--out", str(out2)]) == 2
    assert "--only '-bf16-' and --skip 'bf16': leave no configuration" in capsys.readouterr().err


def test_a_record_keeps_its_own_block_shape_when_the_default_moves():
    """fwd_fp16_v4's d = 128 default went from Bc = 32 to 16 after the H100 fast records were
    taken with 32: compare walks the record's tiles, never today's default in their place."""
    row = {"kernel": "fwd_fp16_v4", "head_dim": 128, "block_m": 128, "block_n": 32}
    assert fast_set.sim_options(row) == {"kernel": "fwd_fp16_v4", "config": {"bc": 32}}
    assert fast_set.sim_options(dict(row, block_n=16)) == {"kernel": "fwd_fp16_v4"}
    assert fast_set.sim_options({"kernel": "bwd_fp16_v3", "head_dim": 128, "block_m": 64, "block_n": 128,
                                 "bulkq": True}) == {"kernel": "bwd_fp16_v3"}
    with pytest.raises(ValueError, match="block_m=96, block_n=32"):
        fast_set.sim_options(dict(row, block_m=96))


@pytest.mark.parametrize("row, knob", [
    ({"kernel": "bwd_fp16_v3", "head_dim": 128, "block_m": 64, "block_n": 128, "bulkq": True}, "longest_first"),
    ({"kernel": "fwd_fp16_v7", "head_dim": 64, "block_m": 128, "block_n": 64}, "lpt")], ids=lambda x: str(x)[:20])
def test_a_causal_record_keeps_its_block_order(row, knob):
    """Records made before bwd_fp16_v3's ``longest_first`` (key blocks) or fwd_fp16_v7's ``lpt``
    (query blocks longest first across heads) have no such column: the L2 model issues their causal
    blocks in grid order.  The fast set now records the knob on its causal configurations, and a
    record that names it keeps the default order."""
    name, row = row["kernel"], dict(row, causal=True)
    assert fast_set.sim_options(row) == {"kernel": name, "config": {knob: False}}
    assert fast_set.sim_options(dict(row, **{knob: True})) == {"kernel": name}
    assert fast_set.sim_options(dict(row, causal=False)) == {"kernel": name}
    sets = [c for c in fast_set.fast_set() if c["kernel"] == name]
    assert any(c["causal"] for c in sets)
    assert all(c.get(knob) is (True if c["causal"] else None) for c in sets)


def test_a_bwd_fp16_v3_record_keeps_its_dq_reductions():
    """Records made before dQ by bulk reductions became bwd_fp16_v3's default at d = 96-128
    (e4caee9; above d = 128 at f49547c) have no ``bulkq`` column and reduced dQ by red.v2: compare
    walks them so (class "reduction"); the fast set now records the knob."""
    row = {"kernel": "bwd_fp16_v3", "head_dim": 128, "block_m": 64, "block_n": 128}
    assert fast_set.sim_options(row) == {"kernel": "bwd_fp16_v3", "config": {"bulkq": False}}
    assert fast_set.sim_options(dict(row, bulkq=True)) == {"kernel": "bwd_fp16_v3"}
    assert fast_set.sim_options(dict(row, head_dim=64, block_m=128)) == {"kernel": "bwd_fp16_v3",
                                                                       "config": {"bulkq": False}}
    assert fast_set.sim_options(dict(row, head_dim=80, block_m=128)) == {"kernel": "bwd_fp16_v3"}
    sets = {c["head_dim"]: c["bulkq"] for c in fast_set.fast_set() if c["kernel"] == "bwd_fp16_v3"}
    assert sets == {64: True, 80: False, 128: True}


def test_fwd_fp32_v2_stores_before_and_after_ostage_agree_to_the_byte():
    """fwd_fp32_v2's O store changed at 88f4ef8 (``ostage``: through shared memory, whole sectors,
    where each lane had put one float in a sector): the H200 record taken before (analysis/data/
    h200/fast/fast_fwd, 9ca4628, no ``ostage`` column) is compared with the scalar stores, the one
    taken after (fast_ostage, with the column) with the new ones, each to the byte, and the old
    stores move 8x the O bytes' sectors."""
    from analysis.compare import compare, read_measured, replay_dirty, summarize

    root = Path(__file__).resolve().parents[1] / "analysis" / "data" / "h200" / "fast"
    stores = {}
    for rec in ("fast_fwd", "fast_ostage"):
        rows, meta = read_measured(root / rec / "fast.csv")
        rows = [r for r in rows if r["kernel"] == "fwd_fp32_v2"]
        got = list(compare(rows, "h200", replay_dirty(meta)))
        s = summarize(got)
        print(rec, [(r["config_id"], r["lsu_st_bytes"], r["sim_lsu_st_bytes"]) for r in got])
        assert s["launches"] == 2 and s["lsu_ld_exact"] == s["lsu_st_exact"] == 2
        stores[rec] = {r["config_id"]: r["lsu_st_bytes"] for r in got}
    for cid, new in stores["fast_ostage"].items():
        d = 64 if "-d64-" in cid else 128
        o_bytes = 16 * 4096 * d * 4  # B·H = 16, N = 4,096, fp32
        l_bytes = 16 * 4096 * 4
        assert new == o_bytes + l_bytes and stores["fast_fwd"][cid] == 8 * o_bytes + l_bytes


def test_bwd_fp32_v2_with_two_k_steps_an_iteration_to_the_byte():
    """The H200 record of bwd_fp32_v2 after its loops took two k-steps an iteration (fast_unr,
    ecb5be4; the global accesses are the ones before): loads, stores and dQ's reductions equal the
    walker's on its 12 launches, as the committed comparison says."""
    from analysis.compare import compare, read_measured, replay_dirty, summarize

    root = Path(__file__).resolve().parents[1] / "analysis" / "data" / "h200" / "fast"
    rows, meta = read_measured(root / "fast_unr" / "fast.csv")
    s = summarize(list(compare(rows, "h200", replay_dirty(meta))))
    print({k: v for k, v in s.items() if k.startswith("lsu")})
    assert s["launches"] == 12 and s["lsu_ld_exact"] == s["lsu_st_exact"] == s["lsu_red_exact"] == 12
    committed = json.loads((root / "compare_unr" / "compare_summary.json").read_text())["summary"]
    assert (committed["lsu_ld_exact"], committed["lsu_st_exact"], committed["lsu_red_exact"]) == (12, 12, 12)
