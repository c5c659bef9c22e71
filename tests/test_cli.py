"""The command line: output of each command, --help everywhere, and one-line errors (exit 2)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.cli import main
from flashsim import Workload, get_gpu, simulate

SMALL = ["--batch", "2", "--heads", "4", "--seq-len", "256", "--head-dim", "32"]


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_json_matches_api(capsys):
    rc, out, err = run(["simulate", "--algo", "flash2", "--pass", "fwd", *SMALL, "--causal", "--seq-len-k", "300",
                        "--kv-heads", "2", "--dtype", "bf16", "--block-m", "32", "--block-n", "48", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    w = Workload(batch=2, heads=4, kv_heads=2, seq_len_q=256, seq_len_k=300, head_dim=32, dtype="bf16", causal=True)
    from flashsim import Tiling

    r = simulate(w, "flash2", "fwd", tiling=Tiling(32, 48))
    assert s["hbm_bytes"] == r.io.bytes == s["hbm_read_bytes"] + s["hbm_write_bytes"]
    assert s["sectors"] == r.io.sectors
    assert (s["block_m"], s["block_n"]) == (32, 48)
    assert s["closed_form_agrees"] is True
    assert s["breakdown"] == r.io.to_dict()["breakdown"]
    assert set(s["breakdown"]) == {"Q", "K", "V", "O", "L"}
    assert sum(c["hbm_bytes"] for c in s["per_launch"].values()) == s["hbm_bytes"]
    for key in ("flops", "bounds", "roofline"):
        assert key in s
    if s["bounds"] is not None:
        assert s["bounds"]["regime"] in ("large-cache", "small-cache")
    if s["flops"] is not None:
        assert s["flops"]["matmul"] > 0 and s["flops"]["nonmatmul"] > 0
    if s["roofline"] is not None:
        assert s["roofline"]["time_s"] > 0


def test_simulate_default_m_is_gpu_shared_memory(capsys):
    rc, out, _ = run(["simulate", *SMALL, "--gpu", "a100", "--json"], capsys)
    assert rc == 0
    s = json.loads(out)
    assert s["sram_bytes"] == get_gpu("a100").max_shared_bytes_per_block
    # the paper's rule with M = 164 KiB of fp16 = 83,968 elements, d = 32: Bc = ceil(M/128) = 656, Br = d
    assert (s["block_m"], s["block_n"]) == (32, 656)


def test_simulate_sram_bytes_sets_blocks(capsys):
    rc, out, _ = run(["simulate", *SMALL, "--sram-bytes", "32768", "--json"], capsys)  # M = 16384 fp16 elements
    assert rc == 0
    s = json.loads(out)
    assert (s["block_m"], s["block_n"]) == (32, 128)


def test_simulate_table(capsys):
    rc, out, err = run(["simulate", *SMALL, "--causal"], capsys)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("flash2 fwd")
    assert any(ln.split()[:2] == ["tensor", "dir"] for ln in lines)
    for t in ("Q", "K", "V", "O", "L"):
        assert any(ln.split()[:1] == [t] for ln in lines), t
    assert "closed form agrees with the walker: yes" in out


def test_algorithm_options_pass_through(capsys):
    pytest.importorskip("flashsim.algorithms.standard")
    rc, out, err = run(["simulate", "--algo", "standard", *SMALL, "--fuse", "none", "--dropout", "0.1",
                        "--gemm-block", "64", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["options"] == {"fuse": "none", "dropout": 0.1, "gemm_block": 64}
    assert "Z" in s["breakdown"]  # dropout writes its keep mask
    assert s["block_m"] is None


@pytest.mark.parametrize("argv, words", [
    (["simulate", "--seq-len", "0"], ["seq_len_q", "--seq-len"]),
    (["simulate", "--batch", "-3"], ["batch"]),
    (["simulate", "--head-dim", "0"], ["head_dim"]),
    (["simulate", "--seq-len-k", "0"], ["seq_len_k"]),
    (["simulate", "--heads", "0"], ["heads"]),
    (["simulate", "--kv-heads", "3"], ["kv_heads", "heads"]),
    (["simulate", "--kv-heads", "32"], ["kv_heads"]),
    (["simulate", "--sram-bytes", "100"], ["sram", "M >= "]),
    (["simulate", "--sram-bytes", "0"], ["sram_bytes"]),
    (["simulate", "--sram-bytes", "1", "--dtype", "fp32"], ["sram_bytes"]),
    (["simulate", "--gpu", "v100"], ["gpu", "v100"]),
    (["simulate", "--algo", "flash3"], ["--algo", "flash3"]),
    (["simulate", "--pass", "sideways"], ["--pass"]),
    (["simulate", "--dtype", "fp8"], ["--dtype"]),
    (["simulate", "--seq-len", "abc"], ["--seq-len", "abc"]),
    (["simulate", "--no-such-flag"], ["--no-such-flag"]),
    (["simulate", "--block-m", "64", "--block-n", "64", "--sram-bytes", "65536"], ["--sram-bytes", "not both"]),
    (["simulate", "--block-m", "64"], ["--block-n"]),
    (["simulate", "--block-m", "0", "--block-n", "64"], ["block_m"]),
    (["simulate", "--algo", "flash2", "--fuse", "none"], ["--fuse", "flash2"]),
    (["simulate", "--algo", "standard", "--block-m", "64", "--block-n", "64"], ["standard", "block"]),
    (["simulate", "--algo", "standard", "--fuse", "most"], ["fuse"]),
    (["simulate", "--algo", "standard", "--dropout", "1.5"], ["dropout"]),
    (["simulate", "--algo", "smallcache", "--sram-bytes", "8"], ["sram_bytes=8", "--sram-bytes", "M >= 5"]),
    (["simulate", "--algo", "smallcache", "--causal"], ["causal"]),
    (["simulate", "--algo", "smallcache", "--pass", "bwd"], ["pass", "fwd"]),
    (["simulate", "--algo", "flash1", "--sram-bytes", "200"], ["sram_bytes=200", "M >= 4*d"]),
    (["bounds", "--gpu", "v100"], ["gpu", "v100"]),
    (["bounds", "--sram-bytes", "-1"], ["sram_bytes"]),
    (["bounds", "--kv-heads", "3"], ["kv_heads", "--kv-heads"]),
    (["nonsense"], ["nonsense"]),
    (["report", "--out"], ["--out"]),
])
def test_bad_input_one_line_exit_2(argv, words, capsys):
    if "standard" in argv:
        pytest.importorskip("flashsim.algorithms.standard")
    rc, out, err = run([argv[0], *SMALL, *argv[1:]] if argv[0] in ("simulate", "bounds") else argv, capsys)
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("flashsim: error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("argv", [[], ["simulate"], ["sweep"], ["bounds"], ["report"], ["measure"], ["compare"]])
def test_help(argv, capsys):
    rc, out, _ = run([*argv, "--help"], capsys)
    assert rc == 0
    assert out.startswith("usage: flashsim")
    if argv == ["simulate"]:
        for flag in ("--algo", "--pass", "--batch", "--heads", "--kv-heads", "--seq-len", "--seq-len-k",
                     "--head-dim", "--dtype", "--causal", "--sram-bytes", "--block-m", "--block-n", "--gpu", "--json"):
            assert flag in out, flag


def test_no_command_is_one_error_line(capsys):
    rc, out, err = run([], capsys)
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: give a command: simulate, sweep, bounds"), err
    assert "--help" in lines[0]


def _console_script():
    exe = Path(sys.executable).parent / "flashsim"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from analysis.cli import main; "
                                                                   "sys.exit(main())"]


def test_console_script_bad_input_no_traceback():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    p = subprocess.run(_console_script() + ["simulate", "--seq-len", "-1"], capture_output=True, text=True,
                       timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 2
    assert p.stdout == ""
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == ["flashsim: error: seq_len_q=-1: must be a positive integer (--seq-len)"]


def test_bounds_command(capsys):
    rc, out, err = run(["bounds", *SMALL, "--sram-bytes", "4096", "--json"], capsys)  # M = 2048 elements >= d² = 1024
    assert rc == 0, err
    s = json.loads(out)
    assert s["sram_elems"] == 2048 and s["head_dim_squared"] == 32 * 32
    assert s["bounds"]["regime"] == "large-cache"
    from flashsim.bounds import bounds

    w = Workload(batch=2, heads=4, seq_len_q=256, head_dim=32)
    assert s["bounds"] == bounds(w, 2048)
    algos = {r["algo"]: r for r in s["algorithms"]}
    assert algos["flash2"]["simulated"] == simulate(w, "flash2", "fwd", sram_elems=2048).io.elements
    rc, out, err = run(["bounds", *SMALL, "--sram-bytes", "1024", "--algos", "flash2"], capsys)
    assert rc == 0, err
    assert "small-cache regime" in out  # M = 512 elements < d² = 1024
    assert "flash2" in out and "standard  " not in out


def test_sweep_writes_csv_png_and_exponents(tmp_path, capsys):
    from flashsim.sweep import read_csv

    rc, out, err = run(["sweep", "--param", "N", "--values", "128", "256,512", "--algos", "standard", "flash2",
                        "--pass", "fwd", "bwd", *SMALL[:4], "--head-dim", "32", "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    recs = read_csv(tmp_path / "sweep.csv")
    assert len(recs) == 3 * 2 * 2
    assert all(r["agrees"] for r in recs)
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fitted exponent" in out
    fits = {tuple(ln.split()[:2]): float(ln.split()[2]) for ln in out.split("fitted exponent")[1].splitlines()
            if ln.split()[:1] in (["standard"], ["flash2"])}
    assert set(fits) == {("standard", "fwd"), ("standard", "bwd"), ("flash2", "fwd"), ("flash2", "bwd")}
    for b in fits.values():
        assert 1.0 < b < 2.1  # the N·d terms pull the N² exponent below 2 at these small N
    assert str(tmp_path / "sweep.csv") in out


def test_sweep_over_gpus_and_block_sizes(tmp_path, capsys):
    rc, out, err = run(["sweep", "--param", "gpu", "--values", "a100", "h100", "--algos", "flash2", *SMALL,
                        "--out", str(tmp_path / "g")], capsys)
    assert rc == 0, err
    assert "A100" in out and "H100" in out and (tmp_path / "g" / "sweep.png").exists()
    rc, out, err = run(["sweep", "--param", "block_m", "--values", "16", "32", "64", "--block-n", "64",
                        "--algos", "flash2", *SMALL, "--closed-form", "--out", str(tmp_path / "b")], capsys)
    assert rc == 0, err
    # flash2 re-reads K and V once per query block: bytes ∝ 1/Br for the dominant term
    line = next(ln for ln in out.splitlines() if ln.startswith("flash2 "))
    assert -1.0 <= float(line.split()[2]) < -0.8


@pytest.mark.parametrize("argv, words", [
    (["--param", "N", "--values", "0"], ["values", "positive"]),
    (["--param", "N", "--values", "abc"], ["abc"]),
    (["--param", "Q", "--values", "1"], ["--param"]),
    (["--param", "gpu", "--values", "tpu"], ["tpu"]),
    (["--param", "N", "--values", "128", "--seq-len-k", "64"], ["--seq-len-k"]),
    (["--param", "N", "--values", "128", "--sram-bytes", "8192", "--block-m", "16"], ["not both"]),
    (["--param", "M", "--values", "100", "--algos", "flash2"], ["no run", "M >= "]),
    (["--param", "N", "--values", "128", "--heads", "0"], ["heads"]),
])
def test_sweep_bad_input(argv, words, tmp_path, capsys):
    rc, out, err = run(["sweep", *argv, "--out", str(tmp_path)], capsys)
    assert rc == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_sweep_missing_required(capsys):
    rc, _, err = run(["sweep", "--param", "N", "--values", "128"], capsys)
    assert rc == 2 and "--out" in err and len(err.splitlines()) == 1


def test_smallcache_tile_from_exact_m(capsys):
    pytest.importorskip("flashsim.algorithms.smallcache")
    from flashsim.algorithms.smallcache import tile_for_sram

    rc, out, err = run(["simulate", "--algo", "smallcache", *SMALL, "--sram-bytes", "3000", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["block_m"] == s["block_n"] == s["options"]["tile"] == tile_for_sram(1500)
    assert s["closed_form_agrees"] and s["bounds"]["regime"] == "large-cache"  # M = 1500 >= d² = 1024


def test_smallcache_below_4d(capsys):
    """M = 50 elements < 4d = 128: FlashAttention's tiling does not exist, the small-cache algorithm
    runs with s = 3 (3·9 + 6 = 33 <= 50 < 3·16 + 8), and bounds counts it at the same M."""
    rc, out, err = run(["simulate", "--algo", "smallcache", *SMALL, "--sram-bytes", "100", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["sram_elems"] == 50 and s["block_m"] == s["options"]["tile"] == 3 and s["closed_form_agrees"]
    w = Workload(batch=2, heads=4, seq_len_q=256, head_dim=32)
    assert s["hbm_bytes"] == simulate(w, "smallcache", sram_elems=50).io.bytes
    rc, out, err = run(["bounds", *SMALL, "--sram-bytes", "100", "--json"], capsys)
    assert rc == 0, err
    algos = {r["algo"]: r for r in json.loads(out)["algorithms"]}
    assert algos["smallcache"]["simulated"] == simulate(w, "smallcache", sram_elems=50).io.elements
    assert algos["flash2"]["simulated"] is None and "M >= 4*d" in algos["flash2"]["error"]


def test_public_api():
    import importlib

    import flashsim

    for name in flashsim.__all__:
        assert hasattr(flashsim, name), name
    assert flashsim.get_gpu("h100") is flashsim.GPUS["h100"]
    # the analysis modules stay modules: no function re-exported under a module's name
    for mod in ("bounds", "flops", "roofline", "sweep", "plot", "report", "cli"):
        m = importlib.import_module(f"flashsim.{mod}")
        assert getattr(flashsim, mod, m) is m


# --------------------------------------------------------------------------------------------
# compare: bad data is one error line and exit 2 (exit 1 means only "outside the tolerance")

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "analysis/data/h200/h200.csv"


def _measured(tmp_path, edit=None, name="m.csv", configs=("flash2-fwd-b1h16-n512-d64-fp16-br64bc32",)) -> Path:
    """A small measured CSV (the committed H200 rows of ``configs``) with its provenance beside it;
    ``edit(header, rows)`` may change them first."""
    import csv

    with open(H200, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        rows = [row for row in r if row[0] in configs]
    if edit:
        header, rows = edit(header, rows)
    path = tmp_path / name
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    if name.endswith(".csv"):
        (tmp_path / name.replace(".csv", ".meta.json")).write_bytes(H200.with_name("h200.meta.json").read_bytes())
    return path


def _set(col, value, line=0):
    def edit(header, rows):
        rows[line][header.index(col)] = value
        return header, rows
    return edit


def _drop(col):
    def edit(header, rows):
        i = header.index(col)
        return header[:i] + header[i + 1:], [r[:i] + r[i + 1:] for r in rows]
    return edit


def test_compare_small_record_within_tolerance_and_outside(tmp_path, capsys):
    rc, out, err = run(["compare", str(_measured(tmp_path)), "--no-plots"], capsys)
    assert rc == 0, err
    assert "1/1 launches within 1%" in out
    bad = _measured(tmp_path, _set("lsu_ld_bytes", "1"), name="off.csv")
    rc, out, err = run(["compare", str(bad), "--no-plots"], capsys)
    assert rc == 1 and err == ""  # a finding, not an error
    assert "0/1 launches within 1%" in out


@pytest.mark.parametrize("make, words", [
    (lambda t: _measured(t, _drop("time_ns")), ["column 'time_ns' missing"]),
    (lambda t: _measured(t, _drop("kernel")), ["column 'kernel' missing"]),
    (lambda t: _measured(t, _set("kernel", "flash3")), ["kernel='flash3'", "line 2"]),
    (lambda t: _measured(t, _set("pass", "sideways")), ["pass='sideways'"]),
    (lambda t: _measured(t, _set("dtype", "fp8")), ["dtype='fp8'"]),
    (lambda t: _measured(t, _set("batch", "abc")), ["batch='abc'", "integer"]),
    (lambda t: _measured(t, _set("time_ns", "fast")), ["time_ns='fast'"]),
    (lambda t: _measured(t, _set("block_m", "")), ["block_m"]),
    (lambda t: _measured(t, lambda h, r: (h, [r[0][:5]])), ["line 2 has 5 fields"]),
    (lambda t: _measured(t, lambda h, r: (h, [])), ["header only", "no measured launch"]),
    (lambda t: _measured(t, lambda h, r: (["nonsense"], [["a"], ["b"]])), ["column 'config_id' missing"]),
    (lambda t: _measured(t, name="m.txt"), ["not a .csv file"]),
    (lambda t: t / "absent.csv", ["no such file"]),
])
def test_compare_bad_data_one_line_exit_2(make, words, tmp_path, capsys):
    path = make(tmp_path)
    out_dir = tmp_path / "cmp"
    rc, out, err = run(["compare", str(path), "--out", str(out_dir)], capsys)
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: data="), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not out_dir.exists()  # nothing half written


def test_compare_empty_file_and_bad_provenance(tmp_path, capsys):
    empty = tmp_path / "e.csv"
    empty.write_text("")
    rc, out, err = run(["compare", str(empty)], capsys)
    assert rc == 2 and out == "" and "the file is empty" in err and len(err.splitlines()) == 1
    path = _measured(tmp_path)
    path.with_name("m.meta.json").write_text("{not json")
    rc, out, err = run(["compare", str(path), "--no-plots"], capsys)
    assert rc == 2 and out == "" and "m.meta.json is not valid JSON" in err and len(err.splitlines()) == 1


def test_compare_out_refuses_an_earlier_comparison(tmp_path, capsys):
    path = _measured(tmp_path)
    out_dir = tmp_path / "cmp"
    out_dir.mkdir()
    (out_dir / "compare_summary.json").write_text("earlier")
    rc, out, err = run(["compare", str(path), "--out", str(out_dir), "--no-plots"], capsys)
    assert rc == 2 and out == "" and "--force" in err and "compare_summary.json" in err
    assert [p.name for p in out_dir.iterdir()] == ["compare_summary.json"]
    rc, out, err = run(["compare", str(path), "--out", str(out_dir), "--no-plots", "--force"], capsys)
    assert rc == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["compare_configs.csv", "compare_launches.csv",
                                                         "compare_summary.json"]
    assert json.loads((out_dir / "compare_summary.json").read_text())["summary"]["launches"] == 1


# --------------------------------------------------------------------------------------------
# The README's promise, for every command: bad input prints one line `flashsim: error: ...`
# and exits with status 2 (a zero or negative size, an M too small for the algorithm, an unknown
# GPU or algorithm, --kv-heads that does not divide --heads, block sizes given together with
# --sram-bytes, an option the algorithm does not take, an output folder that is "" or holds an
# earlier result, data that is not a measured CSV).

_PROMISES = {
    "a zero or negative size": ["--seq-len", "0"],
    "an M too small for the algorithm": ["--sram-bytes", "100", "--algos", "flash2"],
    "an unknown GPU": ["--gpu", "v100"],
    "an unknown algorithm": ["--algos", "flash3"],
    "--kv-heads that does not divide --heads": ["--kv-heads", "3"],
    "block sizes given together with --sram-bytes": ["--block-m", "16", "--block-n", "16", "--sram-bytes", "8192"],
    "an option the algorithm does not take": ["--fuse", "none", "--algos", "flash2"],
}


def _promise_argv(command, args, tmp_path):
    args = list(args)
    if command == "simulate":  # simulate names one algorithm with --algo
        args = ["--algo" if a == "--algos" else a for a in args]
    if command == "bounds" and "--block-m" in args:
        return None  # bounds takes M only: --block-m is an unknown flag there, checked below
    argv = [command, *SMALL, *args]
    if command == "sweep":
        argv += ["--param", "N", "--values", "128", "256", "--out", str(tmp_path / "s")]
    return argv


@pytest.mark.parametrize("command", ["simulate", "sweep", "bounds"])
@pytest.mark.parametrize("promise", list(_PROMISES))
def test_readme_error_promises_hold_for_every_workload_command(command, promise, tmp_path, capsys):
    argv = _promise_argv(command, _PROMISES[promise], tmp_path)
    if argv is None:
        argv = [command, *SMALL, "--block-m", "16"]
    if command == "bounds" and promise == "an M too small for the algorithm":
        # bounds has no algorithm to refuse: it prints each one's count, "n/a" with the reason
        rc, out, err = run(argv, capsys)
        assert rc == 0 and "n/a: sram_elems=50" in out and "M >= 4*d" in out
        return
    rc, out, err = run(argv, capsys)
    assert rc == 2, (promise, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: "), err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("argv", [
    ["report", "--no-such-flag"],
    ["report", "--out"],
    ["measure", "--no-such-flag"],
    ["compare"],
    ["compare", "a.csv", "--gpu", "v100"],
    ["compare", "a.csv", "b.csv"],
])
def test_readme_error_promises_hold_for_the_other_commands(argv, capsys):
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: "), err


def test_python_m_flashsim_runs_every_command():
    p = subprocess.run([sys.executable, "-m", "flashsim", "--help"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    for command in ("simulate", "sweep", "bounds", "report", "measure", "compare"):
        assert command in p.stdout


def test_out_of_memory_is_one_line(capsys, monkeypatch):
    import flashsim.cli

    def too_big(*a, **k):
        raise MemoryError("Unable to allocate 3.06 PiB for an array with shape (156250000, 22026432)")

    monkeypatch.setattr(flashsim.cli, "simulate", too_big)
    rc, out, err = run(["simulate", *SMALL], capsys)
    assert rc == 2 and out == ""
    assert err.splitlines() == ["flashsim: error: out of memory: the workload is too large for this machine "
                                "(Unable to allocate 3.06 PiB for an array with shape (156250000, 22026432))"]


def test_simulate_dram_level(capsys):
    """--level dram runs the schedule through the preset's L2 model: a DRAM table in text, the same
    numbers as flashsim.l2 in JSON, and a clean error for an algorithm without a thread-block model."""
    from flashsim.l2 import simulate_dram

    argv = ["simulate", "--algo", "flash2", "--pass", "fwd", "--batch", "1", "--heads", "2", "--seq-len", "256",
            "--gpu", "h100", "--level", "dram"]
    rc, out, err = run(argv, capsys)
    assert rc == 0 and "DRAM level on" in out and "total: DRAM read" in out
    rc, out, err = run(argv + ["--json"], capsys)
    d = json.loads(out)["dram"]
    w = Workload(batch=1, heads=2, seq_len_q=256, head_dim=64, dtype="fp16")
    ref = simulate_dram(w, "flash2", "fwd", "h100", None, get_gpu("h100").sram_elems(2))
    assert (d["dram_read_bytes"], d["dram_write_bytes"]) == (ref.read_bytes, ref.write_bytes)
    rc, out, err = run(["simulate", "--algo", "smallcache", "--level", "dram"], capsys)
    assert rc == 2 and err.startswith("flashsim: error:") and len(err.strip().splitlines()) == 1
    rc, out, err = run(argv + ["--sample", "0"], capsys)
    assert rc == 2 and "sample" in err
