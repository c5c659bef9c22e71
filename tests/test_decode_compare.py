"""`flashsim compare` on the decode record: the reference decode kernels measured under Nsight
Compute on an H100 (analysis/data/h100/decode/, 11 configurations, 21 launches) against the
simulator's decode schedule.  Cheap: the LSU level is the walker alone (the L2 model, which the
DRAM level runs, is read from the committed comparison, not rerun)."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from analysis.compare import predict_lsu, read_measured, schedule_of
from analysis.configs import config_id, decode_set

REC = Path(__file__).resolve().parents[1] / "analysis" / "data" / "h100" / "decode"

#: Records measured before the reference main kernel read its sequence's length once per thread
#: block: every thread read ``lens[b]``, one 32-byte sector per warp, 4 warps, where the kernel
#: now loads it in thread 0 alone (one sector, the schedule's ``Lens`` read).  Their main
#: launches load 3 sectors a block more than the walker counts.  A record measured with the
#: current kernel (any other commit) must equal the walker to the byte.
OLD_LENGTH_LOADS = {"8d4dbc0": 3 * 32}


def _configs(rows):
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["config_id"], []).append(r)
    return {cid: sorted(ls, key=lambda r: r["launch_index"]) for cid, ls in by.items()}


def test_decode_record_lsu_equals_walker_to_the_byte():
    rows, meta = read_measured(REC / "decode.csv")
    assert meta["gpu"].startswith("NVIDIA H100") and len(rows) == 21
    per_block = OLD_LENGTH_LOADS.get(str(meta["git_commit"])[:7], 0)
    print("record measured at", meta["git_commit"], "old kernel's extra length loads per main block:", per_block)
    launches = 0
    for cid, ls in _configs(rows).items():
        preds = predict_lsu(ls[0])
        assert [p["sim_launch"] for p in preds] == (["decode_split", "decode_combine"] if ls[0]["num_splits"] > 1
                                                    else ["decode"])
        assert len(preds) == len(ls), cid
        for r, p in zip(ls, preds):
            grid = schedule_of(ls[0]).launches[r["launch_index"]].blocks.grid
            assert r["grid"] == "(" + ", ".join(map(str, grid)) + ")"
            # the old kernel's extra length loads: per main-launch block (the combine reads none)
            old = 0 if p["sim_launch"] == "decode_combine" else per_block * grid[0] * grid[1] * grid[2]
            print(cid, p["sim_launch"], r["lsu_ld_bytes"] - p["sim_lsu_ld_bytes"], old,
                  r["lsu_st_bytes"] - p["sim_lsu_st_bytes"])
            # stores: the walker's sectors exactly; loads: the walker's (its Lens reads included)
            assert r["lsu_st_bytes"] == p["sim_lsu_st_bytes"]
            assert r["lsu_ld_bytes"] == p["sim_lsu_ld_bytes"] + old
            launches += 1
    assert launches == 21


def test_decode_record_is_the_decode_set():
    rows, _ = read_measured(REC / "decode.csv")
    assert list(_configs(rows)) == [config_id(c) for c in decode_set()]


def test_committed_decode_comparison_matches_the_record():
    # the committed comparison is compare's of the committed record: loads and stores to the
    # byte on every launch, but for a record of the old kernel (OLD_LENGTH_LOADS), whose main
    # launches load 3 sectors a block more than the walker (its combine launches are exact)
    s = json.loads((REC / "compare" / "compare_summary.json").read_text())["summary"]
    _, meta = read_measured(REC / "decode.csv")
    per_block = OLD_LENGTH_LOADS.get(str(meta["git_commit"])[:7], 0)
    assert s["launches"] == 21 and s["lsu_within_tolerance"] == 21
    assert s["lsu_st_exact"] == 21 and s["lsu_st_residual_max_abs_bytes"] == 0
    if per_block:
        assert s["lsu_ld_exact"] == 10 and s["lsu_ld_residual_max_abs_bytes"] == per_block * 512  # 64 splits x 8
    else:
        assert s["lsu_ld_exact"] == 21 and s["lsu_ld_residual_max_abs_bytes"] == 0
    recs = list(csv.DictReader(open(REC / "compare" / "compare_launches.csv")))
    rows, _ = read_measured(REC / "decode.csv")
    assert [(r["config_id"], int(r["lsu_ld_bytes"])) for r in recs] == [(r["config_id"], r["lsu_ld_bytes"])
                                                                         for r in rows]
    # DRAM level: every main launch's reads within 0.5% of the L2 model's
    for r in recs:
        if r["sim_launch"] != "decode_combine":
            err = int(r["dram_read_bytes"]) / int(r["sim_dram_read_bytes"]) - 1
            print(r["config_id"], f"{100 * err:.2f}%")
            assert abs(err) < 0.005


def test_decode_rows_need_their_options(tmp_path):
    text = (REC / "decode.csv").read_text().splitlines()
    header = text[0].split(",")
    i = header.index("num_splits")
    bad = text[1].split(",")
    bad[i] = ""
    (tmp_path / "d.csv").write_text("\n".join([text[0], ",".join(bad)]) + "\n")
    with pytest.raises(ValueError, match="line 2: kernel 'decode' needs num_splits"):
        read_measured(tmp_path / "d.csv")
    shutil.copy(REC / "decode.csv", tmp_path / "ok.csv")
    assert len(read_measured(tmp_path / "ok.csv")[0]) == 21


def test_readme_decode_table_is_the_record_s():
    from analysis import decode_table

    root = REC.parents[3]
    csv_path = root / "kernels" / "data" / "bench_decode_h100.csv"
    readme = (root / "README.md").read_text()
    block = readme.split(decode_table.START, 1)[1].split(decode_table.END, 1)[0]
    fix = "python -m analysis.decode_table kernels/data/bench_decode_h100.csv --readme README.md"
    assert block == "\n" + decode_table.render_file(csv_path), f"README's decode table is stale: run {fix}"
    with pytest.raises(ValueError, match="markers"):
        decode_table.replace_block("no markers", "x")
