"""kernels.perf.autotune without a GPU: candidates and their pruning, the model's ranking, keys and
N buckets, the cache file (round trip, atomic write, corrupt or foreign files), the kernel-version
hash, kernels.flash_attention's use of a cached config, the tuning loop with a fake timer, and
bad input (CLI and API)."""

import dataclasses
import json
import os

import numpy as np
import pytest

import kernels
from flashsim.config import get_gpu
from kernels import reference
from kernels.perf import autotune as at
from kernels.perf import variant


@pytest.fixture(autouse=True)
def tune_cache(tmp_path, monkeypatch):
    """Every test reads and writes its own cache file, and starts with nothing loaded."""
    path = tmp_path / "tune.json"
    monkeypatch.setenv("FLASHSIM_TUNE_CACHE", str(path))
    at.reset()
    yield path
    at.reset()


def _shape(pass_="fwd", d=64, n=4096, causal=False, dtype="fp16"):
    return at.keys([dtype], [d], [n], [causal], [pass_])[0]


# --------------------------------------------------------------------------------- candidates


@pytest.mark.parametrize("name", at.TUNABLE)
@pytest.mark.parametrize("d", [64, 128])
def test_candidates_are_the_kernels_knobs_and_hold_the_default(name, d):
    v = variant(name)
    kept, dropped = at.candidates(name, d)
    # every knob but v5's and v7's lpt and splits, which the tuner leaves to fit_to_grid's rules
    default = {k: val for k, val in v.default_config(d).items() if k not in at.RULED}
    assert kept and all(set(c) == set(default) for c in kept)
    assert default in kept  # the shipped shape fits the H100
    assert len(kept) + len(dropped) == len(at.knob_grid(name, d))
    for _, why in dropped:
        assert why.split(":")[0] in ("shared memory", "registers", "layout", "occupancy")


def test_candidates_obey_the_shared_memory_limit():
    small = dataclasses.replace(get_gpu("h100"), max_shared_bytes_per_block=48 * 1024)
    kept, dropped = at.candidates("bwd_fp16_v3", 128, small)
    assert all(ln["smem"] <= 48 * 1024 for c in kept for ln in at.launches("bwd_fp16_v3", 128, c))
    reasons = dict((json.dumps(c, sort_keys=True), why) for c, why in dropped)
    dflt = variant("bwd_fp16_v3").default_config(128)
    assert reasons[json.dumps(dflt, sort_keys=True)].startswith("shared memory")  # 177 KB
    big, _ = at.candidates("bwd_fp16_v3", 128)
    assert len(kept) < len(big)


def test_register_bound_drops_what_must_spill():
    # fwd d = 128 with Q in registers and Bc = 64: 128 accumulators + 64 Q + 64 S + 8 > 255
    _, dropped = at.candidates("fwd_fp16_v4", 128)
    bad = dict(bc=64, nw=4, mt=2, qreg=True)
    assert any(c == bad and why.startswith("registers") for c, why in dropped)


# -------------------------------------------------------------------------------------- model


def test_model_ranking_is_deterministic_and_complete():
    shape = _shape("bwd", 128, 4096, True)
    kept, _ = at.candidates("bwd_fp16_v3", 128)
    a = at.rank("bwd_fp16_v3", shape, kept)
    b = at.rank("bwd_fp16_v3", shape, list(reversed(kept)))
    assert a == b and len(a) == len(kept)
    assert [t for t, _ in a] == sorted(t for t, _ in a) and all(t > 0 for t, _ in a)


def test_model_parts():
    shape = _shape("fwd", 64, 16384, False)
    p = at.predict("fwd_fp16_v4", shape, variant("fwd_fp16_v4").default_config(64))
    ln = p["launches"][0]
    assert ln["grid"] == 16 * 16384 // 128 and ln["blocks_per_sm"] >= 1
    assert ln["waves"] == -(-ln["grid"] // (132 * ln["blocks_per_sm"]))
    assert 0 < ln["tail"] <= 1 and p["time_s"] >= p["roofline_s"] > 0
    assert p["l2_fits"] and p["hbm_bytes"] < p["schedule_bytes"]  # K, V re-reads hit in L2
    # fewer m-tiles a warp: B fragments reused by fewer rows, more shared-memory reads
    one = at.predict("fwd_fp16_v4", shape, dict(bc=64, nw=4, mt=1, qreg=True))
    assert one["smem_s"] > p["smem_s"]


# --------------------------------------------------------------------------------------- keys


def test_n_bucket():
    assert [at.n_bucket(n) for n in (1, 512, 513, 1000, 4096, 4097, 70000)] == [512, 512, 1024, 1024, 4096, 8192,
                                                                                65536]
    assert at.n_bucket(100, 3000) == at.n_bucket(3000, 100) == 4096


def test_cache_key_fields():
    base = dict(gpu="NVIDIA H100 80GB HBM3", name="fwd_fp16_v4", pass_="fwd", dtype="fp16", d=64, causal=False,
                nq=3000, nk=3000)
    k = at.cache_key(**base)
    assert k == at.cache_key(**dict(base, nq=4096, nk=4096))  # same bucket
    assert k.startswith("NVIDIA H100 80GB HBM3|fwd_fp16_v4|" + at.kernel_version("fwd_fp16_v4") + "|fwd|fp16|d64|")
    for change in (dict(causal=True), dict(dtype="bf16"), dict(d=128), dict(nq=8192, nk=8192), dict(gqa=True),
                   dict(gpu="NVIDIA H200"), dict(name="fwd_fp16_v3")):
        assert at.cache_key(**dict(base, **change)) != k, change


def test_kernel_version_follows_the_sources(tmp_path, monkeypatch):
    files = []
    for p in at.source_files("bwd_fp16_v3"):
        files.append(tmp_path / p.name)
        files[-1].write_bytes(p.read_bytes())
    assert {p.name for p in files} >= {"bwd_fp16.py", "_tiles.py", "tc.py", "tc_gpu.py", "_launch.py"}
    before = at.hash_files(files)
    assert before == at.hash_files(files)
    files[0].write_bytes(files[0].read_bytes() + b"\n# changed\n")
    assert at.hash_files(files) != before
    # kernel_version hashes source_files: a changed source file gives another version
    at.kernel_version.cache_clear()
    monkeypatch.setattr(at, "source_files", lambda name: files)
    try:
        assert at.kernel_version("bwd_fp16_v3") == at.hash_files(files) + "-bwd_fp16_v3"
    finally:
        at.kernel_version.cache_clear()


# -------------------------------------------------------------------------------------- cache


def test_cache_round_trip_and_merge(tune_cache):
    a = {"k1": {"config": {"bc": 32}, "ms": 1.0}}
    b = {"k2": {"config": {"bc": 64}, "ms": 2.0}, "k1": {"config": {"bc": 16}, "ms": 0.5}}
    at.write_cache(a, tune_cache)
    assert at.read_cache(tune_cache) == a
    at.write_cache(b, tune_cache)
    assert at.read_cache(tune_cache) == b  # merged, the new entry of k1 wins
    assert json.loads(tune_cache.read_text())["format"] == at.FORMAT
    assert at.read_cache(tune_cache.with_name("none.json")) == {}


def test_cache_write_goes_through_a_temporary_name(tune_cache, monkeypatch):
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append((str(src), str(dst), os.path.exists(src)))
        real(src, dst)

    monkeypatch.setattr(at.os, "replace", spy)
    at.write_cache({"k": {"config": {}}}, tune_cache)
    (src, dst, existed), = seen
    assert dst == str(tune_cache) and src != dst and existed
    assert os.path.dirname(src) == os.path.dirname(dst)
    assert sorted(p.name for p in tune_cache.parent.iterdir()) == ["tune.json"]  # no temporary left


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"format": "other", "entries": {}}',
                                  '{"format": "flashsim-tune-1", "entries": 3}'])
def test_corrupt_or_foreign_cache_is_ignored_with_a_warning(tune_cache, text):
    tune_cache.write_text(text)
    with pytest.warns(UserWarning, match="flashsim tune cache"):
        assert at.read_cache(tune_cache) == {}
    at.write_cache({"k": {"config": {"bc": 16}}}, tune_cache)  # replaces it
    assert at.read_cache(tune_cache) == {"k": {"config": {"bc": 16}}}


# ------------------------------------------------------------------- flash_attention uses it


def _qkv(n=32, d=16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, n, d)).astype(np.float16) for _ in range(3)]


def _spy(monkeypatch, v, method, run=True):
    """Record the keyword arguments of ``v.<method>`` calls (and make them, with ``run``)."""
    calls = []
    real = getattr(v, method)

    def wrapper(*a, **kw):
        calls.append(kw)
        return real(*a, **kw) if run else "ran"

    monkeypatch.setattr(v, method, wrapper)
    return calls


def test_flash_attention_passes_the_cached_config_of_its_key(tune_cache, monkeypatch):
    q, k, v = _qkv()
    calls = _spy(monkeypatch, variant("fwd_fp16_v4"), "forward", run=False)
    kernels.flash_attention(q, k, v, causal=True)  # no cache file: the default, no config passed
    assert set(calls[-1]) == {"causal", "scale", "return_lse", "stream"}
    cfg = dict(bc=16, nw=1, mt=1, qreg=False)
    key = at.cache_key(at.gpu_name(), "fwd_fp16_v4", "fwd", "fp16", 16, True, 32, 32)
    at.write_cache({key: {"config": cfg}}, tune_cache)
    kernels.flash_attention(q, k, v, causal=True)  # the file was read once, when it was absent
    assert "bc" not in calls[-1]
    at.reset()
    kernels.flash_attention(q, k, v, causal=np.True_)
    assert {x: calls[-1][x] for x in cfg} == cfg
    kernels.flash_attention(q, k, v, causal=False)  # another key: the default again
    assert "bc" not in calls[-1]


def test_a_cached_entry_leaves_the_ruled_knobs_to_the_launcher(tune_cache, monkeypatch):
    """An entry that holds lpt or splits (as v5's and v7's entries did before they were ruled)
    passes its block shape only: fit_to_grid decides those from B·H, which the key does not hold."""
    q, k, v = (np.zeros((1, 2, 32, 64), np.float16) for _ in range(3))
    calls = _spy(monkeypatch, variant("fwd_fp16_v7"), "forward", run=False)
    cfg = dict(bc=64, nw=4, mt=1, qreg=False, lpt=True, splits=1)
    key = at.cache_key(at.gpu_name(), "fwd_fp16_v7", "fwd", "fp16", 64, True, 32, 32)
    at.write_cache({key: {"config": cfg}}, tune_cache)
    at.reset()
    kernels.flash_attention(q, k, v, causal=True)
    print(calls[-1])
    assert {x: calls[-1][x] for x in ("bc", "nw")} == {"bc": 64, "nw": 4}
    assert "lpt" not in calls[-1] and "splits" not in calls[-1]


def test_the_cached_config_runs_under_the_simulator(tune_cache, monkeypatch):
    q, k, v = _qkv()
    calls = _spy(monkeypatch, variant("fwd_fp16_v4"), "forward")
    cfg = dict(bc=16, nw=1, mt=1, qreg=False)
    key = at.cache_key(at.gpu_name(), "fwd_fp16_v4", "fwd", "fp16", 16, True, 32, 32)
    at.write_cache({key: {"config": cfg}}, tune_cache)
    o = kernels.flash_attention(q, k, v, causal=True)
    assert {x: calls[-1][x] for x in cfg} == cfg
    want, _ = reference.attention_forward(q, k, v, causal=True)
    assert reference.rel_error(o, want) < 1e-2


def test_flash_attention_backward_looks_up_its_own_key(tune_cache, monkeypatch):
    bwd = variant("bwd_fp16_v3")
    seen = []
    monkeypatch.setattr(bwd, "backward", lambda *a, **kw: seen.append(kw) or "ran")
    q, k, v = _qkv(n=600, d=64)
    cfg = dict(bq=32, bk=64, nw=4, ma=1, mb=1, mc=1, minb=2)
    key = at.cache_key(at.gpu_name(), "bwd_fp16_v3", "bwd", "fp16", 64, False, 1024, 1024)
    at.write_cache({key: {"config": cfg}}, tune_cache)
    lse = np.zeros((1, 2, 600), np.float32)
    assert kernels.flash_attention_backward(q, k, v, q, lse, q) == "ran"
    assert {x: seen[-1][x] for x in cfg} == cfg
    # an entry whose keys are not the variant's is not passed on
    at.write_cache({key: {"config": {"bogus": 1}}}, tune_cache)
    at.reset()
    kernels.flash_attention_backward(q, k, v, q, lse, q)
    assert "bogus" not in seen[-1] and "bq" not in seen[-1]


def test_corrupt_cache_never_breaks_an_attention_call(tune_cache, monkeypatch):
    tune_cache.write_text("\x00garbage")
    calls = _spy(monkeypatch, variant("fwd_fp16_v4"), "forward", run=False)
    q, k, v = _qkv(n=16)
    with pytest.warns(UserWarning, match="flashsim tune cache"):
        assert kernels.flash_attention(q, k, v) == "ran"
    assert "bc" not in calls[-1]


# ----------------------------------------------------------------------------- the tuning loop


def _ranked():
    cfgs = [dict(bc=b, nw=4, mt=2, qreg=True) for b in (16, 32, 64, 128)] + [dict(bc=64, nw=8, mt=1, qreg=True)]
    return [(1e-3 * (i + 1), c) for i, c in enumerate(cfgs)]


def test_tuning_loop_picks_the_fastest_that_passes():
    ranked = _ranked()
    default = dict(bc=64, nw=8, mt=1, qreg=True)  # ranked 5th: timed beside the top 3 for the speedup
    times = {16: 1.00, 32: 0.90, 64: 0.50, 128: 0.3}

    def measure(cfg):
        if cfg["bc"] == 64 and cfg["nw"] == 4:
            raise AssertionError("failed the check against float64")
        return times[cfg["bc"]] + (1.0 if cfg["nw"] == 8 else 0.0), 1e-3

    res = at.tune_key(ranked, default, measure, top=3)
    assert [r["config"]["bc"] for r in res["timed"]] == [16, 32, 64, 64]
    assert [r["model_rank"] for r in res["timed"]] == [1, 2, 3, 5]
    assert "error" in res["timed"][2] and "ms" not in res["timed"][2]  # dropped, never the best
    assert res["best"]["config"] == dict(bc=32, nw=4, mt=2, qreg=True)
    assert res["default"]["config"] == default and res["default"]["ms"] == 1.5
    assert res["ratio"] == pytest.approx(1.0 / 0.9) and not res["within"]


def test_within_five_percent_statistic():
    ranked = _ranked()
    default = ranked[0][1]
    close = at.tune_key(ranked, default, lambda c: (1.0 if c["bc"] == 16 else 0.96, 0.0), top=4)
    far = at.tune_key(ranked, default, lambda c: (1.0 if c["bc"] == 16 else 0.9, 0.0), top=4)

    def fail_first(c):
        if c["bc"] == 16:
            raise RuntimeError("launch failed")
        return 1.0, 0.0

    failed = at.tune_key(ranked, default, fail_first, top=2)

    def fail_all(c):
        raise RuntimeError("no")

    none = at.tune_key(ranked, default, fail_all, top=2)
    assert close["within"] and len(close["timed"]) == 4  # the default is the first: nothing added
    assert not far["within"] and not failed["within"] and failed["ratio"] == float("inf")
    assert none["best"] is None
    assert at.summary([close, far, failed, none]) == (1, 3)
    assert at.summary_line([close, far]) == "model's first choice within 5% of the timed best on 1 of 2 keys"


# -------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv", [["--dtypes", "fp32"], ["--ds", "12"], ["--ds", "0"], ["--ns", "0"],
                                  ["--top", "0"], ["--repeat", "0"], ["--budget", "-1"], ["--passes", "both"],
                                  ["--plan", "--gpu", "tpu"]])
def test_cli_bad_input_is_one_error_line(argv, capsys):
    assert at.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashsim: error:") and err.count("\n") == 1


def test_cli_plan_needs_no_gpu(capsys):
    assert at.main(["--plan", "--dtypes", "bf16", "--ds", "128", "--ns", "2048", "--causal", "yes", "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fwd-bf16-d128-causal-n2048 fwd_fp16_v7:") and "default ranked" in out[0]
    assert out[3].startswith("bwd-bf16-d128-causal-n2048 bwd_fp16_v3:") and len(out) == 6


@pytest.mark.parametrize("call, field", [
    (lambda: at.n_bucket(0), "nq"),
    (lambda: at.n_bucket(5, -1), "nk"),
    (lambda: at.cache_key("g", "fwd_fp16_v4", "fwd", "fp8", 64, False, 1, 1), "dtype"),
    (lambda: at.cache_key("g", "fwd_fp32_v1", "fwd", "fp16", 64, False, 1, 1), "variant"),
    (lambda: at.cache_key("g", "fwd_fp16_v4", "both", "fp16", 64, False, 1, 1), "pass_"),
    (lambda: at.cache_key("", "fwd_fp16_v4", "fwd", "fp16", 64, False, 1, 1), "gpu"),
    (lambda: at.tune_key(_ranked(), _ranked()[0][1], lambda c: (1.0, 0.0), top=0), "top"),
    (lambda: at.knob_grid("nope", 64), "variant"),
])
def test_api_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


# ------------------------------------------------------------------ the whole run, faked GPU


def _fake_torch():
    from types import SimpleNamespace as NS

    return NS(__version__="fake", float32="float32", empty=lambda *a, **kw: None,
              backends=NS(cuda=NS(matmul=NS(allow_tf32=True))),
              cuda=NS(is_available=lambda: True, empty_cache=lambda: None))


@pytest.mark.filterwarnings("ignore:GPU 'cudasim'")
def test_cli_run_writes_the_table_the_record_and_the_cache(tmp_path, tune_cache, monkeypatch, capsys):
    """main() end to end with torch and the GPU measurement faked: a config's time is its model
    time, times 1.5 for the model's first choice of the backward (so there the model misses)."""
    monkeypatch.setitem(__import__("sys").modules, "torch", _fake_torch())

    def fake_measure(torch, v, shape, flush, repeat, rng):
        def measure(cfg):
            ms = at.predict(v.name, shape, cfg)["time_s"] * 1e3
            if cfg.get("bq") == 16:
                raise AssertionError("failed the check against float64: rel err 1e+00")
            first = at.rank(v.name, shape, at.candidates(v.name, shape["d"])[0])[0][1]
            return ms * (1.5 if shape["pass"] == "bwd" and cfg == first else 1.0), 1e-3
        return measure

    monkeypatch.setattr(at, "_gpu_measure", fake_measure)
    out = tmp_path / "run"
    argv = ["--dtypes", "fp16", "--ds", "64", "--ns", "1024", "4096", "--causal", "no", "--top", "2", "--out", str(out)]
    assert at.main(argv) == 0
    text = capsys.readouterr().out
    assert "model's first choice within 5% of the timed best on 2 of 4 keys" in text
    rows = list(__import__("csv").DictReader(open(out / "autotune.csv")))
    assert {r["variant"] for r in rows} == {"fwd_fp16_v7", "bwd_fp16_v3"}
    assert all(r["error"] for r in rows if json.loads(r["config"]).get("bq") == 16)
    meta = json.loads((out / "autotune.meta.json").read_text())
    assert meta["summary"].endswith("2 of 4 keys") and len(meta["keys"]) == 4
    assert {"git_commit", "git_dirty", "gpu", "date", "numba"} <= set(meta)
    cached = at.read_cache(tune_cache)
    assert cached == at.read_cache(out / "tune.json") and len(cached) == 4
    assert all(e["config"].get("bq") != 16 for e in cached.values())
    # kernels.flash_attention now finds the forward's entry for N = 4096 (same GPU name, version)
    at.reset()
    key = at.cache_key(at.gpu_name(), "fwd_fp16_v7", "fwd", "fp16", 64, False, 3000, 3000)
    assert at.lookup("fwd", "fwd_fp16_v7", "fp16", 64, False, 3000, 3000) == cached[key]["config"]
    # a second run into the same folder is refused before any timing, unless --force
    before = (out / "autotune.csv").read_text()
    assert at.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashsim: error: out=") and "--force" in err and len(err.strip().splitlines()) == 1
    assert (out / "autotune.csv").read_text() == before
    assert at.main(argv + ["--force"]) == 0


@pytest.mark.filterwarnings("ignore:GPU 'cudasim'")
def test_cli_budget_stops_starting_keys_and_merge_joins_runs(tmp_path, tune_cache, monkeypatch, capsys):
    import time

    monkeypatch.setitem(__import__("sys").modules, "torch", _fake_torch())
    monkeypatch.setattr(at, "_gpu_measure", lambda torch, v, shape, *a: lambda cfg: time.sleep(0.02) or (1.0, 0.0))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    argv = ["--dtypes", "bf16", "--ds", "128", "--ns", "1024", "--passes", "fwd", "--budget", "0.01", "--cache", str(a)]
    assert at.main(argv) == 0
    text = capsys.readouterr().out
    assert "budget of 0 s spent: 1 keys not run: fwd-bf16-d128-causal-n1024" in text
    assert len(at.read_cache(a)) == 1
    assert at.main(argv[:-2] + ["--causal", "yes", "--cache", str(b)]) == 0
    assert at.main(["--merge", str(a), str(b)]) == 0
    assert len(at.read_cache(tune_cache)) == 2
    assert at.main(["--merge", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("flashsim: error: merge:")


def test_cli_without_torch_or_gpu_is_one_error_line(monkeypatch, capsys):
    from types import SimpleNamespace as NS

    argv = ["--dtypes", "fp16", "--ds", "64", "--ns", "1024"]
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch raises ImportError
    assert at.main(argv) == 2
    assert capsys.readouterr().err == "flashsim: error: torch is not installed: the timing needs it\n"
    monkeypatch.setitem(__import__("sys").modules, "torch", NS(cuda=NS(is_available=lambda: False)))
    assert at.main(argv) == 2
    assert capsys.readouterr().err == "flashsim: error: no CUDA GPU visible\n"


def test_no_gpu_name_means_the_defaults(tune_cache, monkeypatch):
    at.write_cache({"k": {"config": {"bc": 16}}}, tune_cache)

    def broken():
        raise RuntimeError("no CUDA driver")

    monkeypatch.setattr(at, "gpu_name", broken)
    with pytest.warns(UserWarning, match="no GPU name"):
        assert at.lookup("fwd", "fwd_fp16_v4", "fp16", 64, False, 10, 10) is None
    assert at.lookup("fwd", "fwd_fp16_v4", "fp16", 64, False, 10, 10) is None  # warned once
