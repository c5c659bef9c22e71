"""The tools beside ``flashsim`` (kernels.*, analysis.* run with ``python -m``) keep the project's
rules: bad input is one line ``flashsim: error: ...`` and exit status 2, never a traceback; a tool
that needs a GPU and finds none says so and writes nothing; an existing output is refused without
``--force`` and left as it was; outputs are written to a temporary name and renamed.

The no-GPU cases run the tool in a subprocess with Numba's CUDA simulator off and no device visible
(``CUDA_VISIBLE_DEVICES=""``), so they hold on a GPU machine too.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
H200 = ROOT / "analysis/data/h200/h200.csv"
DECODE = ROOT / "kernels/data/bench_decode_h100.csv"
ONE = "flash2-fwd-b1h16-n512-d64-fp16-br64bc32"  # one launch
TWO = "flash2-bwd-b1h16-n512-d64-fp16-br32bc32"  # several launches


def _no_gpu(module: str, *args: str) -> tuple[int, str, str]:
    """``python -m module args`` where no GPU can be seen (and the simulator is off)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    p = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def _one_line(err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _keep(path: Path, text: str = "an earlier record\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _only_these(folder: Path, names: set[str]) -> None:
    """The folder holds exactly ``names`` (no temporary file left behind)."""
    assert {p.name for p in folder.iterdir()} == names


# --------------------------------------------------------------------------------------------
# kernels.gpucheck


def test_gpucheck_without_gpu_writes_nothing(tmp_path):
    out = tmp_path / "x.json"
    rc, stdout, err = _no_gpu("kernels.gpucheck", "--quick", "--out", str(out))
    assert rc == 2 and "FAIL" not in stdout and "ERROR" not in stdout
    _one_line(err, "no CUDA GPU")
    assert not out.exists()
    _keep(out)
    rc, _, err = _no_gpu("kernels.gpucheck", "--quick", "--out", str(out))
    assert rc == 2
    _one_line(err, "exists", "--force")
    rc, _, err = _no_gpu("kernels.gpucheck", "--quick", "--out", str(out), "--force")
    assert rc == 2
    _one_line(err, "no CUDA GPU")
    assert out.read_text() == "an earlier record\n"
    _only_these(tmp_path, {"x.json"})


def test_gpucheck_refuses_the_simulator(tmp_path, capsys):
    """Under Numba's CUDA simulator (as the tests run) it records nothing: its record is a GPU's."""
    from kernels import gpucheck

    assert gpucheck.main(["--quick", "--out", str(tmp_path / "x.json")]) == 2
    _one_line(capsys.readouterr().err, "simulator")
    assert not (tmp_path / "x.json").exists()


def test_gpucheck_replaces_its_record_only_with_force(tmp_path, monkeypatch, capsys):
    from kernels import gpucheck

    monkeypatch.setattr(gpucheck, "require_gpu", lambda why, simulator_ok=False: None)
    monkeypatch.setattr(gpucheck, "plan", lambda quick: ([], [], [], []))
    monkeypatch.setattr(gpucheck, "provenance", lambda: {"gpu": "test"})
    out = _keep(tmp_path / "rec.json")
    assert gpucheck.main(["--skip-long", "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, "exists")
    assert out.read_text() == "an earlier record\n"
    assert gpucheck.main(["--skip-long", "--out", str(out), "--force"]) == 0
    rec = json.loads(out.read_text())
    assert rec["total"] == 0 and rec["provenance"] == {"gpu": "test"}
    _only_these(tmp_path, {"rec.json"})
    assert gpucheck.main(["--out", str(tmp_path)]) == 2  # a folder is no file name
    _one_line(capsys.readouterr().err, "file name")


# --------------------------------------------------------------------------------------------
# kernels.bench_ab, kernels.bench_table


def _runs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for tree in ("old", "new"):
        with open(folder / f"{tree}_1.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["config", "variant", "dtype", "x_sdpa_flash"])
            w.writeheader()
            w.writerow({"config": "fwd-fp16-d64-full-n4096", "variant": "ours_fwd_fp16_v4", "dtype": "fp16",
                        "x_sdpa_flash": "0.9"})
        (folder / f"{tree}_1.meta.json").write_text(json.dumps({"git_commit": tree}))
    return folder


def test_bench_ab_pack_refuses_no_runs_and_an_existing_out(tmp_path, capsys):
    from kernels import bench_ab

    empty = tmp_path / "empty"
    empty.mkdir()
    out = _keep(tmp_path / "packed.csv")
    assert bench_ab.main(["--pack", str(empty), str(tmp_path / "new.csv")]) == 2
    _one_line(capsys.readouterr().err, "no runs")
    assert not (tmp_path / "new.csv").exists()
    runs = _runs(tmp_path / "runs")
    for folder in (empty, runs):  # an existing OUT is refused whatever the folder holds
        assert bench_ab.main(["--pack", str(folder), str(out)]) == 2
        _one_line(capsys.readouterr().err, "exists", "--force")
        assert out.read_text() == "an earlier record\n"
    assert bench_ab.main(["--pack", str(empty), str(out), "--force"]) == 2  # no runs: refused even with --force
    _one_line(capsys.readouterr().err, "no runs")
    assert out.read_text() == "an earlier record\n"
    assert bench_ab.main(["--pack", str(runs), str(out), "--force"]) == 0
    assert "packed 2 runs" in capsys.readouterr().out
    assert [r["tree"] for r in csv.DictReader(open(out))] == ["old", "new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "packed.csv", "packed.meta.json", "runs"]
    # the packed record's provenance is refused as an existing output too
    (tmp_path / "other.csv").unlink(missing_ok=True)
    shutil.copy(tmp_path / "packed.meta.json", tmp_path / "other.meta.json")
    assert bench_ab.main(["--pack", str(runs), str(tmp_path / "other.csv")]) == 2
    _one_line(capsys.readouterr().err, "other.meta.json", "exists")
    assert not (tmp_path / "other.csv").exists()


def test_bench_ab_reading_no_runs_is_an_error(tmp_path, capsys):
    from kernels import bench_ab

    (tmp_path / "empty").mkdir()
    assert bench_ab.main([str(tmp_path / "empty")]) == 2
    _one_line(capsys.readouterr().err, "no run")
    bad = _keep(tmp_path / "bad.csv", "a,b\n1,2\n")  # not a packed CSV
    assert bench_ab.main([str(bad)]) == 2
    _one_line(capsys.readouterr().err, "bad.csv", "column")
    assert bench_ab.main([str(tmp_path / "empty"), "--force"]) == 2  # --force writes nothing here
    _one_line(capsys.readouterr().err, "--force")


def test_bench_table_empty_csv_says_so(tmp_path, capsys):
    from kernels import bench_table

    empty = _keep(tmp_path / "e.csv", "")
    assert bench_table.main([str(empty)]) == 2
    line = _one_line(capsys.readouterr().err, "e.csv", "empty")
    assert "closed file" not in line
    assert bench_table.main([str(ROOT / "kernels/data/bench_h100.csv"), "--readme", str(tmp_path / "no.md")]) == 2
    _one_line(capsys.readouterr().err, "no.md")


# --------------------------------------------------------------------------------------------
# analysis.decode_table


@pytest.mark.parametrize("make, words", [
    (lambda t: t / "absent.csv", ["absent.csv", "No such file"]),
    (lambda t: _keep(t / "e.csv", ""), ["e.csv", "empty"]),
    (lambda t: _keep(t / "h.csv", DECODE.read_text().splitlines()[0] + "\n"), ["h.csv", "no rows"]),
    (lambda t: _keep(t / "g.csv", "variant,ms\nours_fast,1.0\n"), ["g.csv", "column 'group' missing"]),
    (lambda t: t, ["Is a directory"]),
])
def test_decode_table_bad_csv_is_one_line(make, words, tmp_path, capsys):
    from analysis import decode_table

    assert decode_table.main([str(make(tmp_path))]) == 2
    _one_line(capsys.readouterr().err, *words)


def test_decode_table_readme_refusals_and_rewrite(tmp_path, capsys):
    from analysis import decode_table

    plain = _keep(tmp_path / "plain.md", "no markers here\n")
    assert decode_table.main([str(DECODE), "--readme", str(plain)]) == 2
    _one_line(capsys.readouterr().err, "plain.md", "markers")
    assert plain.read_text() == "no markers here\n"
    assert decode_table.main([str(DECODE), "--readme", str(tmp_path / "absent.md")]) == 2
    _one_line(capsys.readouterr().err, "absent.md", "No such file")
    assert not (tmp_path / "absent.md").exists()
    readme = _keep(tmp_path / "R.md", f"head\n{decode_table.START}\nold table\n{decode_table.END}\ntail\n")
    assert decode_table.main([str(DECODE), "--readme", str(readme)]) == 0
    assert readme.read_text() == (f"head\n{decode_table.START}\n{decode_table.render_file(DECODE)}"
                                  f"{decode_table.END}\ntail\n")
    _only_these(tmp_path, {"plain.md", "R.md"})


# --------------------------------------------------------------------------------------------
# analysis.worker (the program ncu profiles: an internal entry point)


def test_worker_help_and_missing_arguments():
    rc, out, err = _no_gpu("analysis.worker", "--help")
    assert rc == 0 and "CONFIGS.json" in out and "flashsim measure" in out and err == ""
    rc, out, err = _no_gpu("analysis.worker")
    assert rc == 2 and out == ""
    _one_line(err, "CONFIGS.json")


def test_worker_bad_configs_and_no_gpu(tmp_path):
    man = tmp_path / "manifest.json"
    rc, _, err = _no_gpu("analysis.worker", str(tmp_path / "absent.json"), str(man))
    assert rc == 2
    _one_line(err, "absent.json")
    cfg = _keep(tmp_path / "c.json", json.dumps([{"kernel": "flash2"}]))
    rc, _, err = _no_gpu("analysis.worker", str(cfg), str(man))
    assert rc == 2
    _one_line(err, "no CUDA GPU")
    assert not man.exists()


# --------------------------------------------------------------------------------------------
# kernels.sanitize, kernels.perf.tune, analysis.nb_measure without a GPU


def test_sanitize_without_gpu_is_one_line():
    rc, out, err = _no_gpu("kernels.sanitize", "--only", "decode")
    assert rc == 2 and "ran " not in out
    _one_line(err, "no CUDA GPU")


def test_sanitize_unknown_variant_is_one_line(capsys):
    from kernels.sanitize import main

    with pytest.raises(SystemExit) as e:
        main(["--only", "fwd_fp16_v99"])
    assert e.value.code == 2
    _one_line(capsys.readouterr().err, "fwd_fp16_v99")


def test_tune_without_gpu_writes_nothing(tmp_path):
    out = tmp_path / "t"
    rc, _, err = _no_gpu("kernels.perf.tune", "fwd_fp16_v4", "--out", str(out))
    assert rc == 2
    _one_line(err, "no CUDA GPU")
    assert not out.exists()


def test_tune_refuses_an_earlier_run_and_bad_arguments(tmp_path, capsys):
    from kernels.perf import tune

    csv_path = _keep(tmp_path / "tune_fwd_fp16_v4.csv")
    for argv, words in ((["fwd_fp16_v4", "--out", str(tmp_path)], ["tune_fwd_fp16_v4.csv", "--force"]),
                        (["fwd_fp16_v99"], ["fwd_fp16_v99"]),
                        (["fwd_fp16_v4", "--configs", "{bc: 64}"], ["--configs", "JSON"]),
                        (["fwd_fp16_v4", "--bh", "0"], ["--bh"]),
                        (["fwd_fp16_v4", "--peers", "sdpa_magic"], ["sdpa_magic"])):
        assert tune.main(argv) == 2
        _one_line(capsys.readouterr().err, *words)
    assert csv_path.read_text() == "an earlier record\n"
    _only_these(tmp_path, {"tune_fwd_fp16_v4.csv"})


def test_nb_measure_without_gpu_writes_nothing(tmp_path):
    out = tmp_path / "n"
    rc, _, err = _no_gpu("analysis.nb_measure", "--out", str(out), "fig2")
    assert rc == 2
    _one_line(err, "no CUDA GPU")
    assert not out.exists()


def test_nb_measure_refuses_an_earlier_step_s_files(tmp_path, monkeypatch, capsys):
    import kernels.bench
    import kernels.gpucheck
    from analysis import measure, nb_measure

    monkeypatch.setattr(kernels.gpucheck, "require_gpu", lambda why, simulator_ok=False: None)
    monkeypatch.setattr(kernels.bench, "cuda_torch", lambda why: None)
    monkeypatch.setattr(measure, "check_environment", lambda: None)
    monkeypatch.setattr(nb_measure, "gpu_short", lambda: "h200")
    ran = []
    monkeypatch.setitem(nb_measure.STEPS, "gpt2", lambda root, gpu: ran.append(gpu))
    monkeypatch.setitem(nb_measure.STEPS, "dsweep", lambda root, gpu, force=False: ran.append(force))
    earlier = _keep(tmp_path / "kernels/data/gpt2_medium_attention_h200.meta.json")
    assert nb_measure.main(["gpt2", "--out", str(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, "gpt2_medium_attention_h200.meta.json", "--force")
    assert earlier.read_text() == "an earlier record\n" and ran == []
    assert nb_measure.main(["gpt2", "--out", str(tmp_path), "--force"]) == 0 and ran == ["h200"]
    _keep(tmp_path / "analysis/data/h200/dsweep/dsweep_h200.ncu-raw.csv")
    assert nb_measure.main(["dsweep", "--out", str(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, "dsweep_h200.ncu-raw.csv")
    assert nb_measure.main(["dsweep", "--out", str(tmp_path), "--force"]) == 0 and ran[-1] is True


def test_nb_measure_refuses_the_simulator(tmp_path, capsys):
    from analysis import nb_measure

    assert nb_measure.main(["exact", "--out", str(tmp_path / "n")]) == 2
    _one_line(capsys.readouterr().err, "simulator")
    assert not (tmp_path / "n").exists()


# --------------------------------------------------------------------------------------------
# flashsim compare: its reader (analysis.compare.read_measured) and its options


def _measured(tmp_path: Path, edits=(), configs=(ONE,), name="m.csv", meta=True) -> Path:
    """The committed H200 rows of ``configs`` in a file of their own; ``edits``: (row, column,
    value) to set first (row 0 is the first data row, at line 2)."""
    with open(H200, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        rows = [row for row in r if row[0] in configs]
    for i, col, value in edits:
        rows[i][header.index(col)] = value
    path = tmp_path / name
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    if meta:
        shutil.copy(H200.with_name("h200.meta.json"), path.with_name(path.stem + ".meta.json"))
    return path


def _compare(argv, capsys):
    from analysis.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("edits, configs, words", [
    ([(0, "causal", "TRUE ")], (ONE,), ["line 2", "causal='TRUE '", "not a boolean"]),
    ([(0, "causal", "maybe")], (ONE,), ["line 2", "causal='maybe'", "not a boolean"]),
    ([(0, "causal", "")], (ONE,), ["line 2", "causal=''"]),
    ([(0, "dram_read_bytes", "-5")], (ONE,), ["line 2", "dram_read_bytes=-5", "negative"]),
    ([(0, "l2_write_sectors", "-1")], (ONE,), ["line 2", "l2_write_sectors=-1", "negative"]),
    ([(0, "launch_index", "7")], (ONE,), ["line 2", "launch_index=7", "out of range", ONE, "1 launch"]),
    ([(1, "launch_index", "0")], (TWO,), ["line 3", "launch_index=0", "repeats line 2"]),
    ([(2, "launch_index", "5")], (TWO,), ["line 4", "launch_index=5", "out of range", "3 launches"]),
    ([(1, "causal", "True")], (TWO,), ["line 3", "causal=True", "differs from line 2"]),
    ([(0, "seq_len_q", "-512")], (ONE,), ["line 2", "seq_len_q=-512"]),
    ([(0, "seq_len_q", "0")], (ONE,), ["line 2", "seq_len_q=0"]),
    ([(0, "time_ns", "-3.0")], (ONE,), ["line 2", "time_ns"]),
])
def test_compare_reader_is_strict(edits, configs, words, tmp_path, capsys):
    path = _measured(tmp_path, edits, configs)
    out_dir = tmp_path / "cmp"
    earlier = _keep(out_dir / "compare_summary.json")
    rc, out, err = _compare(["compare", str(path), "--out", str(out_dir), "--force", "--no-plots"], capsys)
    assert rc == 2 and out == ""
    line = _one_line(err, f"data={str(path)!r}", *words)
    assert "(--seq-len)" not in line  # the file's column, not a flag the user never typed
    assert earlier.read_text() == "an earlier record\n"
    _only_these(out_dir, {"compare_summary.json"})


def test_compare_reader_booleans_it_takes(tmp_path):
    from analysis.compare import read_measured

    for spelling, value in (("True", True), ("true", True), ("1", True), (" False ", False), ("false", False),
                            ("0", False)):
        rows, _ = read_measured(_measured(tmp_path, [(0, "causal", spelling)]))
        assert rows[0]["causal"] is value, spelling


def test_compare_folder_provenance_and_force(tmp_path, capsys):
    folder = tmp_path / "d.csv"
    folder.mkdir()
    rc, out, err = _compare(["compare", str(folder)], capsys)
    assert rc == 2
    _one_line(err, "is a folder")
    path = _measured(tmp_path)
    rc, out, err = _compare(["compare", str(path), "--force", "--no-plots"], capsys)
    assert rc == 2 and out == ""
    _one_line(err, "--force", "--out")
    bare = _measured(tmp_path, name="bare.csv", meta=False)
    rc, out, err = _compare(["compare", str(bare), "--no-plots"], capsys)
    assert rc == 2
    _one_line(err, "no provenance", "--gpu")
    rc, out, err = _compare(["compare", str(bare), "--gpu", "h200", "--no-plots"], capsys)
    assert rc == 0, err
    assert "provenance: none" in out and "measured on None" not in out


def test_calibrate_l2_without_out_is_one_line(capsys):
    from analysis import calibrate

    with pytest.raises(SystemExit) as e:
        calibrate.main(["l2"])
    assert e.value.code == 2
    _one_line(capsys.readouterr().err, "--out")


# --------------------------------------------------------------------------------------------
# argparse's own complaints (flashsim.cmdline.ToolParser, every tool's parser)


@pytest.mark.parametrize("module, args", [
    ("kernels.bench", ["--bogus"]), ("kernels.perf.tune", []), ("analysis.worker", []),
    ("analysis.calibrate", ["l2"]), ("kernels.perf.autotune", ["--bogus"]),
])
def test_argparse_errors_are_one_line_naming_the_tools_help(module, args):
    rc, _, err = _no_gpu(module, *args)
    assert rc == 2
    _one_line(err, f"(see 'python -m {module}")


def test_tool_parser_in_process(capsys):
    from flashsim.cmdline import ToolParser

    ap = ToolParser(description="x")
    assert ap.prog == f"python -m {__name__}"  # the module that builds it, not pytest
    ap.add_argument("--n", type=int, required=True)
    sub = ToolParser(prog="python -m tool").add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("one")
    for parser, argv in ((ap, ["--n", "x"]), (ap, []), (one, ["--bogus"])):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2
        _one_line(capsys.readouterr().err, "--help')")
    assert one.prog == "python -m tool one"
