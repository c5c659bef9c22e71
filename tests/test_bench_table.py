"""The README's performance table is generated from the committed benchmark CSV."""

import json
from pathlib import Path

import pytest

from kernels import bench_table

ROOT = Path(__file__).parents[1]
CSV = ROOT / "kernels" / "data" / "bench_h100.csv"
#: the off-grid shapes' record, kept apart from the grid's (notebook 06 reads the grid's), once measured
OFFGRID = ROOT / "kernels" / "data" / "bench_offgrid_h100.csv"

TINY = """variant,pass,dtype,d,causal,n,tflops,x_naive,x_sdpa_flash,x_sdpa_cudnn,error
naive,fwd,fp16,64,False,4096,60.0,1.0,0.2,0.125,
sdpa_flash,fwd,fp16,64,False,4096,300.0,5.0,1.0,0.625,
sdpa_cudnn,fwd,fp16,64,False,4096,480.0,8.0,1.6,1.0,
ours_fwd_fp16_v3,fwd,fp16,64,False,4096,200.0,3.333,0.667,0.417,
ours_fwd_fp16_v4,fwd,fp16,64,False,4096,210.0,3.5,0.7,0.4375,
ours_fwd_fp16_v9,fwd,fp16,64,False,4096,,,,,failed the check
naive,bwd,fp32,64,False,4096,34.4,1.0,,,
"""


def test_render_picks_our_fastest_passing_variant_and_the_runs_own_ratios(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text(TINY)
    table = bench_table.render(bench_table.load(p))
    print(table)
    lines = [ln for ln in table.splitlines() if ln.startswith("| fwd")]
    assert lines == ["| fwd | fp16 | 64 | no | 4,096 | 60 | 300 | 480 | - | 210 | `fwd_fp16_v4` | 3.50 | 0.70 | 0.44 |"]
    assert "| bwd | fp32 | 64 | no | 4,096 | 34 | - | - | - | - | - | - | - | - |" in table
    # what was not timed is said under the table, with its error
    assert table.rstrip().endswith('Not timed ("-" above): ours_fwd_fp16_v9 fwd fp16 d = 64 N = 4,096 '
                                   "(failed the check).")


def test_merge_keeps_every_row_and_each_parts_provenance(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(TINY)
    b.write_text("variant,pass,dtype,d,causal,n,tflops\nnaive,bwd,fp16,64,False,4096,120.0\n")
    a.with_name("a.meta.json").write_text(json.dumps({"gpu": "G", "git_commit": "1", "date": "d1"}))
    b.with_name("b.meta.json").write_text(json.dumps({"gpu": "G", "git_commit": "2", "date": "d2"}))
    bench_table.merge(tmp_path / "m.csv", [a, b])
    assert len(bench_table.load(tmp_path / "m.csv")) == 8
    meta = json.loads((tmp_path / "m.meta.json").read_text())
    assert meta["gpu"] == "G" and [x["git_commit"] for x in meta["parts"]] == ["1", "2"]


def test_merge_into_a_merged_record_keeps_its_parts(tmp_path):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    for f, n in ((a, "1"), (b, "2"), (c, "3")):
        f.write_text(f"config,variant,pass,dtype,d,causal,n,tflops\nc{n},naive,bwd,fp16,64,False,4096,1\n")
        f.with_name(f.stem + ".meta.json").write_text(json.dumps({"gpu": "G", "git_commit": n, "date": "d" + n}))
    m = tmp_path / "m.csv"
    bench_table.merge(m, [a, b])
    bench_table.merge(m, [m, c], force=True)  # extended in place
    meta = json.loads((tmp_path / "m.meta.json").read_text())
    print(meta)
    assert [(x["part"], x["git_commit"], x["date"]) for x in meta["parts"]] == [
        ("a.csv", "1", "d1"), ("b.csv", "2", "d2"), ("c.csv", "3", "d3")]
    assert meta["gpu"] == "G" and [x["configs"] for x in meta["parts"]] == [["c1"], ["c2"], ["c3"]]
    assert len(bench_table.load(m)) == 3
    # a part whose configurations were all re-ran later supplies nothing and leaves the list
    d = tmp_path / "d.csv"
    d.write_text("config,variant,pass,dtype,d,causal,n,tflops\nc2,naive,bwd,fp16,64,False,4096,2\n")
    bench_table.merge(m, [m, d], force=True)
    meta = json.loads((tmp_path / "m.meta.json").read_text())
    assert [(x["part"], x["configs"]) for x in meta["parts"]] == [("a.csv", ["c1"]), ("c.csv", ["c3"]),
                                                                 ("d.csv", ["c2"])]
    # a merged record whose meta.json was damaged by hand: one error naming it
    (tmp_path / "m.meta.json").write_text(json.dumps(dict(meta, parts="a.csv")))
    with pytest.raises(ValueError, match="'parts' must be a list"):
        bench_table.merge(m, [m, d], force=True)


def test_merge_takes_a_configuration_rerun_from_the_later_part(tmp_path):
    head = "config,variant,pass,dtype,d,causal,n,tflops\n"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(head + "c1,naive,bwd,fp16,80,False,4096,100\nc1,ours_v1,bwd,fp16,80,False,4096,90\n"
                 "c2,naive,bwd,fp16,40,False,4096,50\n")
    b.write_text(head + "c1,naive,bwd,fp16,80,False,4096,101\nc1,ours_v3,bwd,fp16,80,False,4096,150\n")
    bench_table.merge(tmp_path / "m.csv", [a, b])
    got = sorted((r["config"], r["variant"], r["tflops"]) for r in bench_table.load(tmp_path / "m.csv"))
    print(got)
    assert got == [("c1", "naive", "101"), ("c1", "ours_v3", "150"), ("c2", "naive", "50")]


def test_replace_block_needs_the_markers():
    with pytest.raises(ValueError, match="markers"):
        bench_table.replace_block("no markers here", "x")
    text = f"a\n{bench_table.START}\nold\n{bench_table.END}\nb"
    assert bench_table.replace_block(text, "new\n") == f"a\n{bench_table.START}\nnew\n{bench_table.END}\nb"


def test_readme_table_is_the_committed_csvs():
    readme = (ROOT / "README.md").read_text()
    block = readme.split(bench_table.START, 1)[1].split(bench_table.END, 1)[0]
    more = [OFFGRID] if OFFGRID.exists() else []
    fix = ("python -m kernels.bench_table kernels/data/bench_h100.csv "
           + "".join(f"{p.relative_to(ROOT)} " for p in more) + "--readme README.md")
    assert block == "\n" + bench_table.render_file(CSV, *more), f"README's performance table is stale: run {fix}"


def test_readme_h200_table_is_its_committed_csvs():
    """The second block, the H200 record at one commit (grid and off-grid CSVs of one folder)."""
    readme = (ROOT / "README.md").read_text()
    start, end = bench_table.markers("h200")
    block = readme.split(start, 1)[1].split(end, 1)[0]
    rec = ROOT / "kernels" / "data" / "bench_h200_0926151"
    parts = [rec / "bench_grid.csv", rec / "bench_offgrid.csv"]
    fix = ("python -m kernels.bench_table " + " ".join(str(p.relative_to(ROOT)) for p in parts)
           + " --readme README.md --block h200")
    assert block == "\n" + bench_table.render_file(*parts), f"README's H200 table is stale: run {fix}"


def test_a_block_name_is_checked_and_names_its_markers(tmp_path, capsys):
    assert bench_table.markers("h200") == ("<!-- perf-table-h200:start -->", "<!-- perf-table-h200:end -->")
    assert bench_table.markers(None) == (bench_table.START, bench_table.END)
    with pytest.raises(ValueError, match="block="):
        bench_table.markers("a b")
    readme = tmp_path / "R.md"
    readme.write_text("no blocks\n")
    assert bench_table.main([str(CSV), "--readme", str(readme), "--block", "a b"]) == 2
    assert bench_table.main([str(CSV), "--readme", str(readme), "--block", "h200"]) == 2
    err = capsys.readouterr().err
    print(err)
    assert err.count("flashsim: error:") == 2 and "perf-table-h200" in err
    assert readme.read_text() == "no blocks\n"


def test_several_records_render_as_their_rows_together(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(TINY)
    lines = TINY.splitlines()
    b.write_text("\n".join([lines[0] + ",set,note,batch,heads,kv_heads"]
                           + [ln + ",offgrid,GQA,2,32,4" for ln in lines[1:6]]) + "\n")
    a.with_name("a.meta.json").write_text(json.dumps({"gpu": "G"}))
    both = bench_table.render_file(a, b)
    print(both)
    assert both == bench_table.render(bench_table.load(a) + bench_table.load(b), {"gpu": "G"})
    assert both.startswith("TFLOP/s on an G")
    assert "| GQA | fwd | fp16 | 2 | 32:4 | 4,096 | 4,096 | 64 | no | 60 | 300 | 480 | - | 210 | `fwd_fp16_v4` " in both
    assert bench_table.main([str(a), str(b)]) == 0


def test_bad_inputs_end_in_one_error_line(tmp_path, capsys):
    """A missing file, a CSV that is not a bench record, and a merge onto an existing OUT without
    --force: one ``flashsim: error:`` line and exit 2, nothing written."""
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n1\n")
    for argv in (["/nonexistent.csv"], [str(bad)]):
        assert bench_table.main(argv) == 2
        err = capsys.readouterr().err
        print(err)
        assert err.startswith("flashsim: error:") and err.count("\n") == 1
    out = tmp_path / "m.csv"
    out.write_text("keep\n")
    assert bench_table.main(["--merge", str(out), str(bad)]) == 2
    err = capsys.readouterr().err
    print(err)
    assert "exists" in err and out.read_text() == "keep\n"
