"""kernels.bench_ab: new/old of the same-run ratio, held against the trees' own run-to-run spread."""

import csv
import json
from pathlib import Path

import pytest

from kernels import bench_ab

ROOT = Path(__file__).parents[1]


def _run(folder, tree, i, rows):
    p = folder / f"{tree}_{i}.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["config", "variant", "dtype", "x_sdpa_flash", "x_sdpa_mem_eff"])
        w.writeheader()
        for config, variant, dtype, x in rows:
            peer = "x_sdpa_mem_eff" if dtype == "fp32" else "x_sdpa_flash"
            w.writerow({"config": config, "variant": variant, "dtype": dtype, peer: x})
    p.with_name(f"{tree}_{i}.meta.json").write_text(json.dumps({"git_commit": tree}))


def _folder(tmp_path):
    # same: the trees agree within their spread; faster: new is 20% up, the runs within 2%;
    # fp32: the ratio to SDPA mem-eff
    old = [(0.70, 0.80, 1.00), (0.72, 0.81, 1.01), (0.71, 0.80, 1.00)]
    new = [(0.71, 0.97, 1.00), (0.70, 0.98, 1.02)]
    for tree, runs in (("old", old), ("new", new)):
        for i, (a, b, c) in enumerate(runs, 1):
            _run(tmp_path, tree, i, [("fwd-fp16-d64-full-n4096", "ours_fwd_fp16_v4", "fp16", a),
                                     ("bwd-fp16-d64-full-n4096", "ours_bwd_fp16_v1", "fp16", b),
                                     ("fwd-fp32-d64-full-n4096", "ours_fwd_fp32_v1", "fp32", c),
                                     ("fwd-fp16-d64-full-n4096", "sdpa_flash", "fp16", 1.0)])
    return tmp_path


def test_verdict_holds_new_over_old_against_both_trees_spread(tmp_path):
    rows = {r["variant"]: r for r in bench_ab.compare(bench_ab.load_runs(_folder(tmp_path)))}
    print(bench_ab.render(list(rows.values())))
    assert set(rows) == {"ours_fwd_fp16_v4", "ours_bwd_fp16_v1", "ours_fwd_fp32_v1"}  # ours only
    same, faster, fp32 = rows["ours_fwd_fp16_v4"], rows["ours_bwd_fp16_v1"], rows["ours_fwd_fp32_v1"]
    assert same["old"] == [0.70, 0.72, 0.71] and same["new"] == [0.71, 0.70]
    assert same["new_over_old"] == pytest.approx(0.705 / 0.71)
    assert same["old_spread"] == pytest.approx(0.02 / 0.71) and same["verdict"] == "within"
    assert faster["new_over_old"] == pytest.approx(0.975 / 0.80) and faster["verdict"] == "outside"
    assert fp32["peer"] == "sdpa_mem_eff" and fp32["verdict"] == "within"


def test_one_run_of_a_tree_cannot_tell():
    runs = {"old": [{("c", "ours_x"): {"dtype": "fp16", "x_sdpa_flash": "0.5"}}] * 2,
            "new": [{("c", "ours_x"): {"dtype": "fp16", "x_sdpa_flash": "0.9"}}]}
    (row,) = bench_ab.compare(runs)
    assert row["verdict"] == "?" and row["new_over_old"] == pytest.approx(1.8)


def test_pack_keeps_every_run_and_reads_back_the_same(tmp_path, capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    _folder(folder)
    out = tmp_path / "runs.csv"
    assert bench_ab.main(["--pack", str(folder), str(out)]) == 0
    assert bench_ab.compare(bench_ab.load_runs(out)) == bench_ab.compare(bench_ab.load_runs(folder))
    metas = json.loads((tmp_path / "runs.meta.json").read_text())
    assert [(m["tree"], m["run"]) for m in metas] == [("old", 1), ("new", 1), ("old", 2), ("new", 2), ("old", 3)]
    assert bench_ab.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "runs: old 3, new 2" in text and "outside it: 1" in text
    assert bench_ab.main([str(tmp_path / "missing")]) == 2


def test_first_ab_record_reads_as_its_summary():
    """The committed first A/B (old, new, old; kernels/data/ab_tiles_ad16f0d) gives its summary's
    new/old, and '?' everywhere: one new run has no spread."""
    folder = ROOT / "kernels" / "data" / "ab_tiles_ad16f0d"
    rows = bench_ab.compare(bench_ab.load_runs(folder))
    want = {}
    for ln in (folder / "summary.txt").read_text().splitlines()[1:-1]:
        f = ln.split()
        want[(f[0], f[1])] = float(f[-2])
    assert {(r["config"], r["variant"]): round(r["new_over_old"], 3) for r in rows} == want
    assert {r["verdict"] for r in rows} == {"?"}
