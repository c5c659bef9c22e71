"""Records are never damaged (issue 16).

Every command that writes files (``measure``, ``sweep``, ``report``, ``compare --out``) writes them
all or none and refuses to replace an earlier result without ``--force``; a failed measurement
leaves the earlier record byte-identical.  ``measure`` is driven here by a fake ``ncu`` and
``nvidia-smi`` on PATH (small Python scripts), so the whole path runs on a machine without a GPU.
"""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import flashsim.cli
import flashsim.report
from analysis.cli import build_parser, main
from analysis.configs import SETS
from analysis.measure import DEFAULT_OUT, record_files
from flashsim.output import STAGING_PREFIX, OutputExists, atomic_write, staged
from flashsim.provenance import REPO, git_state

ROOT = Path(__file__).resolve().parents[1]

FAKE_NCU = r'''
import json
import os
import sys

args = sys.argv[1:]
if args == ["--version"]:
    print("Version 0.0 (fake ncu)")
    sys.exit(0)
with open(os.environ["FAKE_NCU_CALLS"], "a") as f:
    f.write(" ".join(args) + "\n")
log = args[args.index("--log-file") + 1]
if os.environ["FAKE_NCU"] == "fail":  # what a crash looks like: a stub of an export, exit 1
    with open(log, "w") as f:
        f.write("==PROF== Connected to process 1\n==ERROR== The application returned an error code (1).\n")
    sys.exit(1)
cfg_path, man_path = args[-2], args[-1]  # ... python -m analysis.worker CONFIGS MANIFEST
configs = json.load(open(cfg_path))
metrics = ["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
           "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
           "dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"]
units = ["byte", "byte", "sector", "sector", "byte", "byte", "ns"]
lines = ['"ID","Kernel Name","Grid Size","Block Size",' + ",".join(f'"{m}"' for m in metrics),
         '"","","","",' + ",".join(f'"{u}"' for u in units)]
n = 0
for i, _ in enumerate(configs):
    for kernel in ("fake_attention", "flashsim_marker"):
        lines.append(f'"{n}","{kernel}","(1, 1, 1)","(32, 1, 1)",' + ",".join(['"64"'] * 6 + ['"1000.0"']))
        n += 1
with open(log, "w") as f:
    f.write("\n".join(lines) + "\n")
json.dump([{"index": i, "id": f"cfg{i}", "config": c, "wall_s": 0.001} for i, c in enumerate(configs)],
          open(man_path, "w"))
'''

FAKE_SMI = r'''
import sys

if sys.argv[1:] == ["-L"]:
    print("GPU 0: NVIDIA H200 (UUID: GPU-fake)")
else:
    print("NVIDIA H200, 580.0, 143771 MiB")
'''


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A fake ncu and nvidia-smi first on PATH; returns the file where ncu logs its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, src in (("ncu", FAKE_NCU), ("nvidia-smi", FAKE_SMI)):
        exe = bin_dir / name
        exe.write_text(f"#!{sys.executable}\n{src}")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "ncu-calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NCU_CALLS", str(calls))
    monkeypatch.setenv("FAKE_NCU", "ok")
    monkeypatch.delenv("FLASHSIM_GIT_COMMIT", raising=False)
    monkeypatch.delenv("FLASHSIM_GIT_DIRTY", raising=False)
    return calls


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _earlier_record(folder: Path, name: str = "smoke") -> dict:
    """A record of set ``name`` in ``folder``: the committed H100 record's bytes under its names."""
    folder.mkdir(parents=True, exist_ok=True)
    for src, dst in zip(record_files("h100"), record_files(name)):
        (folder / dst).write_bytes((ROOT / "analysis/data/h100" / src).read_bytes())
    return _snapshot(folder)


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    """The error of a command that may have echoed progress lines first (measure's "running: ...")."""
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if not ln.startswith("running: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("flashsim: error: "), err
    return lines[0]


# --------------------------------------------------------------------------------------------
# measure


def test_failed_measurement_leaves_the_earlier_record_byte_identical(fake_gpu, tmp_path, capsys, monkeypatch):
    """ncu exits 1 after writing a stub of its export (the case that truncated h100.ncu-raw.csv to
    105 bytes): exit 2, one error line, the three files of the earlier record untouched, no
    temporary left behind."""
    out = tmp_path / "record"
    before = _earlier_record(out)
    monkeypatch.setenv("FAKE_NCU", "fail")
    rc, _, err = _run(["measure", "--set", "smoke", "--out", str(out), "--force"], capsys)
    assert rc == 2
    line = _one_error_line(err)
    assert "ncu exited with status 1" in line and "unchanged" in line
    assert fake_gpu.read_text().count("--log-file") == 1  # ncu did run, and fail
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(record_files("smoke"))


def test_existing_record_is_refused_before_measuring(fake_gpu, tmp_path, capsys):
    out = tmp_path / "record"
    before = _earlier_record(out)
    rc, _, err = _run(["measure", "--set", "smoke", "--out", str(out)], capsys)
    assert rc == 2
    line = _one_error_line(err)
    assert "--force" in line and "smoke.csv" in line
    assert not fake_gpu.exists()  # refused before ncu ran
    assert _snapshot(out) == before


def test_measure_writes_a_whole_record_with_its_commit_from_any_folder(fake_gpu, tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # outside the repository: the commit comes from the package's own checkout
    out = tmp_path / "new" / "record"
    rc, _, err = _run(["measure", "--set", "smoke", "--out", str(out)], capsys)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(record_files("smoke"))
    rows = (out / "smoke.csv").read_text().splitlines()
    assert len(rows) == 1 + len(SETS["smoke"]())  # one launch per configuration, header first
    meta = json.loads((out / "smoke.meta.json").read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert meta["git_commit"] == head.stdout.strip()
        assert isinstance(meta["git_dirty"], bool)
    assert "git_dirty" in meta and meta["gpu"] == "NVIDIA H200" and meta["launches"] == len(rows) - 1
    assert str(out / "smoke.ncu-raw.csv") in meta["ncu_command"] and STAGING_PREFIX not in meta["ncu_command"]
    # the same again is refused, and leaves it as it is
    before = _snapshot(out)
    rc, _, err = _run(["measure", "--set", "smoke", "--out", str(out)], capsys)
    assert rc == 2 and "--force" in _one_error_line(err) and _snapshot(out) == before


def test_git_state_uses_the_environment_on_a_copy_without_git(monkeypatch):
    monkeypatch.setenv("FLASHSIM_GIT_COMMIT", "abc1234")
    monkeypatch.setenv("FLASHSIM_GIT_DIRTY", "1")
    assert git_state() == {"git_commit": "abc1234", "git_dirty": True}
    monkeypatch.delenv("FLASHSIM_GIT_DIRTY")
    assert git_state() == {"git_commit": "abc1234", "git_dirty": None}
    assert REPO == ROOT


def test_measure_default_out_is_not_the_committed_record():
    a = build_parser().parse_args(["measure"])
    assert a.out is None and a.set == "h200"
    assert DEFAULT_OUT.format(set="h200") == "out/measure-h200"
    assert "/out/" in (ROOT / ".gitignore").read_text().split()


def test_measure_offers_every_set_and_is_the_same_command_as_python_m_analysis_measure(capsys):
    rc, out, _ = _run(["measure", "--help"], capsys)
    assert rc == 0
    assert "{" + ",".join(sorted(SETS)) + "}" in out
    from analysis.measure import main as measure_main

    assert measure_main(["--help"]) == 0
    assert capsys.readouterr().out == out


@pytest.mark.parametrize("argv, words", [
    (["measure", "--set", "nope"], ["--set", "nope"]),
    (["measure", "--only", "no-such-config"], ["--only", "no-such-config"]),
    (["measure", "--out", ""], ["out=''"]),
    (["measure", "--cache-control", "some"], ["--cache-control"]),
])
def test_measure_bad_input_one_line(argv, words, capsys):
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == ""
    line = _one_error_line(err)
    for w in words:
        assert w in line, (w, line)


def test_measure_without_ncu_says_what_is_missing_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu, no nvidia-smi
    rc, _, err = _run(["measure", "--set", "smoke", "--out", str(tmp_path / "m")], capsys)
    assert rc == 2
    assert "ncu" in _one_error_line(err)
    assert not (tmp_path / "m").exists()


# --------------------------------------------------------------------------------------------
# sweep and report


SWEEP = ["sweep", "--param", "N", "--values", "64", "128", "--algos", "flash2", "--batch", "1", "--heads", "2",
         "--head-dim", "16", "--closed-form"]


def test_sweep_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "s"
    out.mkdir()  # an existing empty folder is fine
    rc, _, err = _run([*SWEEP, "--out", str(out)], capsys)
    assert rc == 0, err
    before = _snapshot(out)
    assert set(before) == {"sweep.csv", "sweep.png"}
    rc, _, err = _run([*SWEEP, "--values", "256", "--out", str(out)], capsys)
    assert rc == 2 and "--force" in _one_error_line(err)
    assert _snapshot(out) == before
    rc, _, err = _run([*SWEEP, "--values", "256", "512", "--out", str(out), "--force"], capsys)
    assert rc == 0, err
    assert _snapshot(out)["sweep.csv"] != before["sweep.csv"]


def test_sweep_that_fails_while_writing_leaves_the_earlier_files(tmp_path, capsys, monkeypatch):
    out = tmp_path / "s"
    assert _run([*SWEEP, "--out", str(out)], capsys)[0] == 0
    before = _snapshot(out)

    def broken(*a, **k):
        raise RuntimeError("disk full while plotting")

    monkeypatch.setattr(flashsim.cli, "plot_sweep", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        main([*SWEEP, "--values", "512", "--out", str(out), "--force"])
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["sweep.csv", "sweep.png"]


def test_a_new_folder_is_removed_again_when_the_command_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(flashsim.cli, "plot_sweep", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main([*SWEEP, "--out", str(tmp_path / "a" / "b")])
    assert not (tmp_path / "a").exists()


@pytest.mark.xdist_group("report")  # shares the process memo of the same computation
def test_report_default_folder_works_fresh_and_is_then_refused(tmp_path, capsys, monkeypatch):
    """`flashsim report` (the README's first command) in a fresh folder writes flashsim-report/;
    run again it refuses, naming --force, and leaves the report as it was."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["report"], capsys)
    assert rc == 0, err
    before = _snapshot(tmp_path / "flashsim-report")
    assert set(before) == {"io_table.csv", "dram_table.csv", "decode_table.csv", "m_sweep.csv", "n_sweep.csv",
                           "m_sweep.png", "n_sweep.png"}
    rc, out, err = _run(["report"], capsys)
    assert rc == 2 and out == ""
    line = _one_error_line(err)
    assert "flashsim-report" in line and "--force" in line and "io_table.csv" in line
    assert _snapshot(tmp_path / "flashsim-report") == before


@pytest.mark.xdist_group("report")  # shares the process memo of the same computation
def test_report_that_fails_leaves_the_earlier_report_byte_identical(tmp_path, monkeypatch):
    out = tmp_path / "r"
    out.mkdir()
    for name in ("io_table.csv", "m_sweep.csv", "n_sweep.csv", "m_sweep.png", "n_sweep.png"):
        (out / name).write_bytes(f"earlier {name}".encode())
    before = _snapshot(out)

    def broken(*a, **k):
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(flashsim.report, "plot_two_panels", broken)
    with pytest.raises(RuntimeError, match="plotting failed"):
        flashsim.report.run_report(out, echo=None, force=True)
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no temporary left


@pytest.mark.parametrize("argv", [
    ["report", "--out", ""],
    [*SWEEP, "--out", ""],
    ["compare", "analysis/data/h200/h200.csv", "--out", ""],
])
def test_empty_out_is_refused(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == ""
    assert "out=''" in _one_error_line(err)


# --------------------------------------------------------------------------------------------
# flashsim.output


def test_staged_writes_all_or_nothing(tmp_path):
    out = tmp_path / "o"
    with staged(out, ["a.txt", "b.txt"]) as stage:
        (stage / "a.txt").write_text("A")
        (stage / "b.txt").write_text("B")
        assert not (out / "a.txt").exists()  # nothing in place until every file is written
    assert _snapshot(out) == {"a.txt": b"A", "b.txt": b"B"}
    with pytest.raises(KeyError), staged(out, ["a.txt", "b.txt"], force=True) as stage:
        (stage / "a.txt").write_text("new A")
        raise KeyError("failed before b.txt")
    assert _snapshot(out) == {"a.txt": b"A", "b.txt": b"B"}
    with pytest.raises(OutputExists, match="a.txt"), staged(out, ["a.txt"]):
        pass
    # a file the caller did not announce is still not allowed to replace one
    with pytest.raises(OutputExists, match="b.txt"), staged(out, ["c.txt"]) as stage:
        (stage / "c.txt").write_text("C")
        (stage / "b.txt").write_text("new B")
    assert _snapshot(out) == {"a.txt": b"A", "b.txt": b"B"}


def test_staged_refuses_a_file_as_folder(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="not a folder"), staged(f, ["a"]):
        pass


def test_atomic_write_keeps_the_old_file_on_failure_and_ordinary_permissions(tmp_path):
    p = tmp_path / "x.csv"
    atomic_write(p, lambda fh: fh.write("old"))
    with pytest.raises(RuntimeError):
        atomic_write(p, lambda fh: (fh.write("half"), (_ for _ in ()).throw(RuntimeError("boom"))))
    assert p.read_text() == "old" and [q.name for q in tmp_path.iterdir()] == ["x.csv"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask
