"""The command line's options: every traffic class in simulate's totals, each pass's own fast kernel,
options a path would ignore refused (--devices, the L2 model's), --sample's limit, M too small
for standard attention, sweep's conflicting options, the sweep API's unknown keys, and the
minor one-line errors (exit 2)."""

import json

import pytest

from analysis.cli import main
from flashsim import Workload, get_gpu, simulate
from flashsim.config import GPU_ALIASES, GPUS

TINY = ["--batch", "1", "--heads", "2", "--seq-len", "256"]


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc, out, err, *words):
    assert rc == 2 and out == "", (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashsim: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _classes(io):
    out = {}
    for (_, dr), t in io.breakdown.items():
        out[dr] = out.get(dr, 0) + t.bytes
    return out


# --------------------------------------------------------------------------------------------
# 1. bulk (TMA) and reduction traffic in simulate's totals and per-launch table


def test_simulate_counts_bulk_copies_in_the_totals(capsys):
    rc, out, err = run(["simulate", "--algo", "torch_naive", *TINY, "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    w = Workload(batch=1, heads=2, seq_len_q=256, head_dim=64)
    r = simulate(w, "torch_naive", "fwd")
    by = _classes(r.io)
    assert s["hbm_bytes"] == r.io.bytes == by["read"] + by["write"]  # the hbm_* keys keep their meaning
    assert s["bulk_read_bytes"] == by["bulk_read"] > 0 and s["bulk_write_bytes"] == by["bulk_write"] > 0
    assert s["reduction_bytes"] == 0
    assert s["all_classes_bytes"] == sum(by.values()) == s["roofline"]["hbm_bytes"] == 1_638_400
    assert s["all_classes_elements"] == sum(t.elements for t in r.io.breakdown.values())
    assert sum(c["all_classes_bytes"] for c in s["per_launch"].values()) == s["all_classes_bytes"]
    qk = s["per_launch"]["gemm_qk"]
    assert qk["hbm_bytes"] == 0 and qk["bulk_read_bytes"] > 0 and qk["bulk_write_bytes"] > 0
    rc, out, err = run(["simulate", "--algo", "torch_naive", *TINY], capsys)
    assert rc == 0, err
    rows = {tuple(ln.split()[:2]): ln.split() for ln in out.splitlines() if ln.startswith("total ")}
    assert rows[("total", "all")][3] == "1.638" and rows[("total", "read+write")][3] == "0.655"
    assert ("total", "bulk_read") in rows and ("total", "bulk_write") in rows
    head = next(ln for ln in out.splitlines() if ln.startswith("launch "))
    assert "bulk read MB" in head and "bulk write MB" in head and "all MB" in head
    gemm = next(ln for ln in out.splitlines() if ln.startswith("gemm_qk "))
    assert gemm.split()[-1] == "0.524"  # its bulk loads and stores, no LSU traffic


def test_simulate_counts_fwd_fp16_v7s_bulk_k_and_v(capsys):
    rc, out, err = run(["simulate", "--algo", "fast", "--batch", "1", "--heads", "1", "--seq-len", "256",
                        "--head-dim", "128", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["hbm_read_bytes"] == 256 * 128 * 2  # Q only: the LSU loads
    kv = s["breakdown"]["K"]["bulk_read"]["bytes"] + s["breakdown"]["V"]["bulk_read"]["bytes"]
    assert s["bulk_read_bytes"] == kv == 2 * 4 * 256 * 128 * 2  # K and V once per 64-row query block
    assert s["all_classes_bytes"] == s["hbm_bytes"] + kv


def test_simulate_reduction_column_and_plain_output_unchanged(capsys):
    # fp32 backward: dQ by atomics (reductions)
    rc, out, err = run(["simulate", "--algo", "fast", "--pass", "bwd", "--dtype", "fp32", *TINY, "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["reduction_bytes"] > 0 and s["all_classes_bytes"] == s["hbm_bytes"] + s["reduction_bytes"]
    rc, out, err = run(["simulate", "--algo", "fast", "--pass", "bwd", "--dtype", "fp32", *TINY], capsys)
    assert "total   reduction" in out and "reduction MB" in out and "all MB" in out
    # loads and stores only: the table as before, no class rows
    rc, out, err = run(["simulate", "--algo", "flash2", *TINY], capsys)
    assert rc == 0 and "total   all" not in out and "read+write" not in out and "bulk" not in out


# --------------------------------------------------------------------------------------------
# 2. --pass bwd (and fwd+bwd) of the fast kernels: each pass's own kernel


def test_fast_backward_checks_the_config_against_the_backward_kernel(capsys):
    argv = ["simulate", "--algo", "fast", "--pass", "bwd", "--batch", "1", "--heads", "1", "--seq-len", "256",
            "--head-dim", "128", "--config", "bq=64,bk=128"]
    rc, out, err = run([*argv, "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["kernels"] == {"bwd": {"kernel": "bwd_fp16_v3", "block_m": 64, "block_n": 128}}
    assert (s["block_m"], s["block_n"]) == (64, 128) and s["options"]["kernel"] == "bwd_fp16_v3"
    w = Workload(batch=1, heads=1, seq_len_q=256, head_dim=128)
    assert s["hbm_bytes"] == simulate(w, "fast", "bwd", config="bq=64,bk=128").io.bytes
    rc, out, err = run(argv, capsys)
    assert rc == 0 and "kernel bwd_fp16_v3: Br = 64, Bc = 128" in out.splitlines()[1]
    rc, out, err = run(argv[:-2] + ["--config", "bc=32"], capsys)
    one_error(rc, out, err, "bwd_fp16_v3", "--config")


def test_fast_forward_and_backward_show_both_kernels(capsys):
    argv = ["simulate", "--algo", "fast", "--pass", "fwd+bwd", "--batch", "1", "--heads", "1", "--seq-len", "256",
            "--head-dim", "128"]
    rc, out, err = run([*argv, "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["kernels"]["fwd"]["kernel"] == "fwd_fp16_v7" and s["kernels"]["bwd"]["kernel"] == "bwd_fp16_v3"
    assert (s["kernels"]["fwd"]["block_m"], s["kernels"]["fwd"]["block_n"]) == (64, 48)
    assert (s["kernels"]["bwd"]["block_m"], s["kernels"]["bwd"]["block_n"]) == (64, 128)
    assert s["block_m"] is None and s["block_n"] is None and "kernel" not in s["options"]
    rc, out, err = run(argv, capsys)
    assert "fwd kernel fwd_fp16_v7" in out and "bwd kernel bwd_fp16_v3" in out
    rc, out, err = run([*argv, "--config", "bq=64"], capsys)
    one_error(rc, out, err, "fwd_fp16_v7 and bwd_fp16_v3", "--config")
    rc, out, err = run([*argv, "--kernel", "bwd_fp16_v3"], capsys)
    one_error(rc, out, err, "kernel='bwd_fp16_v3'", "--kernel")


# --------------------------------------------------------------------------------------------
# 3, 4. options a path ignores: refused


@pytest.mark.parametrize("extra, flag", [
    (["--window", "10,0"], "--window"),
    (["--dropout", "0.1"], "--dropout"),
    (["--num-splits", "2"], "--num-splits"),
    (["--cold-launches"], "--cold-launches"),
    (["--sample", "0"], "--sample"),
    (["--sample", "4"], "--sample"),
    (["--kernel", "fwd_fp16_v7"], "--kernel"),
    (["--level", "dram"], "--level"),
])
def test_devices_refuses_what_it_would_ignore(extra, flag, capsys):
    rc, out, err = run(["simulate", "--batch", "1", "--heads", "4", "--seq-len", "256", "--devices", "2", *extra],
                       capsys)
    line = one_error(rc, out, err, flag)
    assert "(--algo)" not in line


@pytest.mark.parametrize("extra, flag", [(["--cold-launches"], "--cold-launches"), (["--sample", "4"], "--sample")])
def test_l2_options_need_the_dram_level(extra, flag, capsys):
    rc, out, err = run(["simulate", *TINY, *extra], capsys)
    one_error(rc, out, err, flag, "--level dram")


def test_sample_has_a_stated_limit(capsys):
    """About one L2 set in S is simulated and the counts scaled: S at most min(lines / 256, sets / 16)
    (B = 1, H = 4, N = 256, d = 64: Q, K, V, O and L span 4,128 lines of 128 bytes: 16)."""
    argv = ["simulate", "--batch", "1", "--heads", "4", "--seq-len", "256", "--level", "dram", "--json"]
    rc, out, err = run([*argv, "--sample", "100000"], capsys)
    one_error(rc, out, err, "sample=100000", "at most 16", "--sample")
    rc, out, err = run([*argv, "--sample", "17"], capsys)
    one_error(rc, out, err, "at most 16")
    rc, out, err = run([*argv, "--sample", "16"], capsys)
    assert rc == 0, err
    sampled = json.loads(out)["dram"]
    rc, out, err = run(argv, capsys)
    exact = json.loads(out)["dram"]
    assert abs(sampled["dram_read_bytes"] - exact["dram_read_bytes"]) <= 0.05 * exact["dram_read_bytes"]
    # a large workload allows more: the limit is the L2's sets / 16 there
    gpu = get_gpu("h100")
    sets = gpu.l2_effective_bytes // (gpu.l2_line_bytes * gpu.l2_ways)
    rc, out, err = run(["simulate", "--seq-len", "4096", "--level", "dram", "--sample", str(sets // 16 + 1)],
                       capsys)
    one_error(rc, out, err, f"at most {sets // 16}")


# --------------------------------------------------------------------------------------------
# 5. standard attention at an M its GEMM tiles cannot fit: n/a, as flash1/flash2


def test_bounds_shows_standard_na_below_its_least_m(capsys):
    argv = ["bounds", "--batch", "1", "--heads", "1", "--seq-len", "256", "--sram-bytes", "200"]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["standard", "-"])
    assert "n/a: sram_elems=100: standard attention needs M >= 2*d = 128 elements" in line
    assert "0.898" not in out
    rc, out, err = run([*argv, "--json"], capsys)
    algos = {r["algo"]: r for r in json.loads(out)["algorithms"]}
    assert algos["standard"]["simulated"] is None and algos["smallcache"]["simulated"] is not None
    rc, out, err = run(["bounds", "--batch", "1", "--heads", "1", "--seq-len", "256", "--sram-bytes", "256",
                        "--json"], capsys)  # M = 128 = 2d: it runs
    algos = {r["algo"]: r for r in json.loads(out)["algorithms"]}
    assert algos["standard"]["simulated"] is not None and algos["standard"]["ratio_lower"] >= 1


def test_sweep_and_simulate_skip_standard_below_its_least_m(tmp_path, capsys):
    from flashsim.sweep import read_csv

    rc, out, err = run(["sweep", "--param", "M", "--values", "100", "2048", "--batch", "1", "--heads", "1",
                        "--seq-len", "256", "--closed-form", "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    assert "skipped standard fwd at M=100: sram_elems=100: standard attention needs M >= 2*d" in err
    recs = read_csv(tmp_path / "sweep.csv")
    assert {(r["algo"], r["sram_elems"]) for r in recs} == {("standard", 2048), ("flash1", 2048), ("flash2", 2048)}
    rc, out, err = run(["simulate", "--algo", "standard", *TINY, "--sram-bytes", "200"], capsys)
    one_error(rc, out, err, "sram_bytes=200", "M >= 2*d = 128")


def test_api_refuses_standard_below_its_least_m():
    from flashsim.bounds import bounds_table, check_sram
    from flashsim.sweep import run_one

    w = Workload(batch=1, heads=1, seq_len_q=256, head_dim=64)
    with pytest.raises(ValueError, match="sram_elems=127"):
        check_sram(w, "standard", 127)
    check_sram(w, "standard", 128)
    check_sram(w, "flash2", 1)  # its own M rule refuses it, not this
    row = bounds_table(w, 100, ["standard"])[0]
    assert row["simulated"] is None and "sram_elems=100" in row["error"]
    with pytest.raises(ValueError, match="sram_elems=100"):
        run_one({"batch": 1, "heads": 1, "N": 256, "d": 64, "M": 100}, "standard", "fwd")


# --------------------------------------------------------------------------------------------
# 6. sweep: an option the swept parameter replaces is refused


@pytest.mark.parametrize("argv, flag", [
    (["--param", "gpu", "--values", "h100", "a100", "--sram-bytes", "4096"], "--sram-bytes"),
    (["--param", "gpu", "--values", "h100", "--block-m", "64", "--block-n", "64"], "--block-m"),
    (["--param", "gpu", "--values", "h100", "--gpu", "a100"], "--gpu"),
    (["--param", "M", "--values", "2048", "--sram-bytes", "4096"], "--sram-bytes"),
    (["--param", "M", "--values", "2048", "--block-m", "64", "--block-n", "64"], "--block-m"),
    (["--param", "N", "--values", "128", "--seq-len", "512"], "--seq-len"),
    (["--param", "d", "--values", "32", "--head-dim", "32"], "--head-dim"),
    (["--param", "block_m", "--values", "16", "--block-m", "32", "--block-n", "16"], "--block-m"),
    (["--param", "block_n", "--values", "16", "--block-n", "32"], "--block-n"),
])
def test_sweep_refuses_an_option_its_param_replaces(argv, flag, tmp_path, capsys):
    rc, out, err = run(["sweep", *argv, "--closed-form", "--out", str(tmp_path / "s")], capsys)
    one_error(rc, out, err, flag, "leave " + flag + " out")
    assert not (tmp_path / "s").exists()


def test_sweep_defaults_still_apply(tmp_path, capsys):
    from flashsim.sweep import read_csv

    rc, out, err = run(["sweep", "--param", "M", "--values", "4096", "--algos", "flash2", "--closed-form",
                        "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    r = read_csv(tmp_path / "sweep.csv")[0]
    assert (r["seq_len_q"], r["head_dim"], r["gpu"]) == (1024, 64, get_gpu("h100").name)


# --------------------------------------------------------------------------------------------
# 7. the sweep API: unknown keys and wrong kinds are ValueErrors naming the field


BASE = {"batch": 1, "heads": 2, "N": 64, "head_dim": 32, "M": 4096}


@pytest.mark.parametrize("call, words", [
    (lambda s, r: s({**BASE, "causl": True}, "N", [64]), ["causl", "unknown"]),
    (lambda s, r: s({**BASE, "causl": True}, "N", [64], on_error="raise"), ["causl"]),
    (lambda s, r: r({**BASE, "blok_m": 16}, "flash2", "fwd"), ["blok_m", "unknown"]),
    (lambda s, r: s(BASE, "gpu", [5]), ["values[0]=5", "gpu"]),
    (lambda s, r: s([1, 2], "N", [64]), ["base=list"]),
    (lambda s, r: r([1, 2], "flash2", "fwd"), ["cfg=list"]),
    (lambda s, r: r({**BASE, "gpu": 5}, "flash2", "fwd"), ["gpu", "=5"]),
    (lambda s, r: r(BASE, "flash2", "fwd", gpu=5), ["gpu=5"]),
    (lambda s, r: s(BASE, "N", [64], gpu=5), ["gpu=5"]),
    (lambda s, r: s(BASE, "N", [64], algos="flash2"), ["algos='flash2'"]),
    (lambda s, r: s(BASE, "N", [64], algos=["flash3"]), ["algos=", "'flash3'"]),
    (lambda s, r: s(BASE, "N", [64], passes=["sideways"]), ["passes=", "'sideways'"]),
    (lambda s, r: s(BASE, "N", 64), ["values=64"]),
])
def test_sweep_api_refuses_with_the_field(call, words):
    from flashsim.sweep import run_one, sweep

    with pytest.raises(ValueError) as e:
        call(sweep, run_one)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_sweep_api_aliases_and_known_fields_still_work():
    from flashsim.sweep import run_one, sweep

    recs = sweep({**BASE, "causal": True}, "N", [64], algos=("flash2",))
    assert len(recs) == 1 and recs[0]["causal"] is True
    rec = run_one({**BASE, "Br": 16, "Bc": 16}, "flash2", "fwd", gpu="h100")
    assert (rec["block_m"], rec["block_n"]) == (16, 16)
    assert len(sweep(BASE, "gpu", ["h100", get_gpu("a100")], algos=("flash2",))) == 2
    assert len(sweep(BASE, "N", [64], algos=(a for a in ("flash1", "flash2")), passes=iter(["fwd"]))) == 2


# --------------------------------------------------------------------------------------------
# 8. minor: --config, --sram-bytes, --gpu


def test_config_duplicates_refused_and_json_accepted(capsys):
    base = ["simulate", "--algo", "fast", *TINY]
    for cfg in ("bc=64,bc=32", '{"bc": 64, "bc": 32}'):
        rc, out, err = run([*base, "--config", cfg], capsys)
        one_error(rc, out, err, "'bc' given twice", "--config")
    rc, out, err = run([*base, "--config", "{bc: 32}"], capsys)
    one_error(rc, out, err, "not a JSON object", "--config")
    rc, out, err = run([*base, "--config", '{"bc": 32, "qreg": true}', "--json"], capsys)
    assert rc == 0, err
    as_json = json.loads(out)
    rc, out, err = run([*base, "--config", "bc=32,qreg=true", "--json"], capsys)
    as_pairs = json.loads(out)
    assert as_json["breakdown"] == as_pairs["breakdown"] and as_json["block_n"] == as_pairs["block_n"] == 32


def test_sram_bytes_must_be_whole_elements(capsys):
    rc, out, err = run(["simulate", *TINY, "--sram-bytes", "513"], capsys)
    one_error(rc, out, err, "sram_bytes=513", "multiple of 2", "--sram-bytes")
    rc, out, err = run(["bounds", *TINY, "--sram-bytes", "4098", "--dtype", "fp32"], capsys)
    one_error(rc, out, err, "sram_bytes=4098", "multiple of 4")
    rc, out, err = run(["simulate", *TINY, "--sram-bytes", "512", "--json"], capsys)
    assert rc == 0 and json.loads(out)["sram_elems"] == 256


def test_gpu_error_lists_the_names_help_lists(capsys):
    rc, out, err = run(["simulate", "--gpu", "v100"], capsys)
    line = one_error(rc, out, err, "gpu='v100'", "--gpu")
    rc, out, _ = run(["simulate", "--help"], capsys)
    helptext = " ".join(out.split())
    listed = helptext.split("GPU preset: ")[1].split(" (default h100)")[0]
    assert listed in line
    for name in [*GPUS, *GPU_ALIASES]:
        assert name in listed and name in line
        rc, _, err = run(["bounds", *TINY, "--gpu", name, "--json"], capsys)
        assert rc == 0, err


def test_unknown_option_points_to_the_commands_own_help(capsys):
    from flashsim.cli import main

    assert main(["simulate", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["flashsim: error: unrecognized arguments: --bogus (see 'flashsim simulate --help')"], err
