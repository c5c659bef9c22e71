"""kernels.bench without a GPU: the configurations, which variants run or are n/a, the rounds
(with a fake timer) and their statistics, the CSV's columns."""

import csv
import math

import numpy as np
import pytest

from kernels import bench, bench_table

# --------------------------------------------------------------------------- configurations


def test_grid_keeps_the_committed_records_names_and_batch_sizes():
    cs = bench.configs(False, [1024, 4096, 16384], dtypes=("fp16", "bf16", "fp32"))
    names = {c["config"] for c in cs}
    with open(bench_table.Path(__file__).parents[1] / "kernels" / "data" / "bench_h100.csv", newline="") as f:
        recorded = {(r["config"], int(r["batch"])) for r in csv.DictReader(f) if int(r["n"]) in (1024, 4096, 16384)}
    assert {c for c, _ in recorded} == names
    assert {(c["config"], c["batch"]) for c in cs} == recorded
    assert all(c["set"] == "grid" and c["heads"] == c["kv_heads"] == 16 and c["nk"] == c["n"] for c in cs)


def test_grid_backward_stops_at_16384_and_options_narrow_it():
    cs = bench.configs(False, [16384, 32768], dtypes=("bf16",), ds=(64,), causals=(False,))
    assert [c["config"] for c in cs] == ["fwd-bf16-d64-full-n16384", "fwd-bf16-d64-full-n32768",
                                        "bwd-bf16-d64-full-n16384"]


def test_offgrid_list_holds_what_the_issue_names():
    shapes = bench.OFFGRID
    assert {s["d"] for s in shapes if s["note"] == "head dim"} == {40, 80, 96, 112, 160, 192, 256}
    assert any(s["heads"] == 8 * s["kv_heads"] for s in shapes)  # GQA 8:1
    assert any(s["kv_heads"] == 1 and s["heads"] > 1 for s in shapes)  # MQA
    assert {s["n"] for s in shapes if s["causal"]} == {512, 1024}
    assert any(s["n"] == 512 and s["nk"] == 4096 for s in shapes)
    assert {s["batch"] * s["heads"] for s in shapes} >= {1, 4, 256}
    cs = bench.configs(shapes="offgrid", dtypes=("fp16", "bf16", "fp32"), sample=0)
    assert len(cs) == 2 * 3 * len(shapes) and len({c["config"] for c in cs}) == len(cs)
    assert all(c["set"] == "offgrid" for c in cs)
    assert "fwd-fp16-d128-full-n512-nk4096-b4h16" in {c["config"] for c in cs}
    assert "bwd-bf16-d128-full-n4096-b2h32kv4" in {c["config"] for c in cs}


def test_sample_is_deterministic_for_a_seed_and_in_range():
    a, b, c = bench.sample_shapes(40, 7), bench.sample_shapes(40, 7), bench.sample_shapes(40, 8)
    print(a[:3])
    assert a == b and a != c
    for s in a:
        assert 32 <= s["d"] <= 256 and s["d"] % 8 == 0
        assert 512 <= s["n"] <= 8192 and s["n"] == s["nk"]
        assert s["heads"] // s["kv_heads"] in (1, 2, 4, 8) and s["heads"] % s["kv_heads"] == 0
        assert isinstance(s["causal"], bool) and s["batch"] >= 1
    assert {s["causal"] for s in a} == {False, True}
    assert len({s["heads"] // s["kv_heads"] for s in a}) > 1
    all_ = bench.configs(shapes="all", ns=[4096], dtypes=("fp16",), sample=3, seed=7)
    assert [c["set"] for c in all_].count("sample") == 2 * 3


def test_bad_shapes_and_dtypes_are_value_errors():
    with pytest.raises(ValueError, match="shapes="):
        bench.configs(shapes="some")
    with pytest.raises(ValueError, match="dtypes="):
        bench.configs(dtypes=("fp8",))


def test_flops_count_the_visible_pairs():
    assert bench.flops(2, 3, 100, 64, False, "fwd") == 4 * 2 * 3 * 100 * 100 * 64
    assert bench.flops(1, 1, 100, 8, True, "fwd") == bench.flops(1, 1, 100, 8, False, "fwd") / 2
    assert bench.flops(1, 1, 100, 8, True, "bwd") == 2.5 * bench.flops(1, 1, 100, 8, True, "fwd")
    # Nk > Nq: every row sees Nk - Nq keys more than the square's triangle
    assert bench.flops(1, 1, 100, 1, True, "fwd", nk=400) == 4 * (100 * 400 - 100 * 100 / 2)
    # Nk < Nq: only the last Nk rows see keys
    assert bench.flops(1, 1, 400, 1, True, "fwd", nk=100) == 4 * (100 * 100 / 2)


# --------------------------------------------------------------------------- which variants run


def _cfg(**kw):
    c = dict(bench._shape(4, 16, 4096, 64), set="grid", dtype="fp16", **{"pass": "fwd"})
    c.update(kw)
    c["config"] = bench.tag(c)
    return c


def test_candidates_are_the_peers_and_the_shipped_variants_of_the_pass_and_dtype():
    assert bench.candidates(_cfg()) == ["naive", "sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn", "ours_fwd_fp16_v7",
                                        "ours_fwd_fp16_v4"]
    bwd32 = bench.candidates(_cfg(**{"pass": "bwd", "dtype": "fp32"}))
    assert bwd32[4:] == ["ours_bwd_fp32_v2", "ours_bwd_fp32_v1"]
    # bf16: the fp16 kernels are asked (a bf16 kernel may be one of them taking bf16)
    assert bench.candidates(_cfg(dtype="bf16"))[4:] == ["ours_fwd_fp16_v7", "ours_fwd_fp16_v4"]
    assert bench.candidates(_cfg(), ["sdpa_flash", "best"]) == ["sdpa_flash", "ours_fwd_fp16_v7"]
    assert bench.candidates(_cfg(d=40), ["sdpa_flash", "best"]) == ["sdpa_flash", "ours_fwd_fp16_v4"]
    assert bench.candidates(_cfg(**{"pass": "bwd"}), ["best"]) == ["ours_bwd_fp16_v3"]
    assert bench.candidates(_cfg(**{"pass": "bwd"}, d=128), ["best"]) == ["ours_bwd_fp16_v3"]
    # nothing of ours for the pass among those asked for: one n/a row says so
    only = bench.candidates(_cfg(**{"pass": "bwd"}), ["naive", "ours_fwd_fp16_v4"])
    assert only == ["naive", "ours"]  # "ours" alone: no variant name the records could mistake for a kernel
    assert "among the variants run" in bench.na_reason("ours", _cfg(**{"pass": "bwd"}))


def test_na_reasons():
    fp32 = _cfg(dtype="fp32")
    assert "fp16/bf16 only" in bench.na_reason("sdpa_flash", fp32)
    assert "fp16/bf16 only" in bench.na_reason("sdpa_cudnn", fp32)
    assert bench.na_reason("sdpa_mem_eff", fp32) is None and bench.na_reason("naive", fp32) is None
    skew = _cfg(causal=True, nk=1024)
    assert "top-left" in bench.na_reason("sdpa_flash", skew) and bench.na_reason("naive", skew) is None
    assert bench.na_reason("sdpa_flash", _cfg(causal=True)) is None
    # ours: supports(dtype, d) false -> n/a with the reason
    assert bench.na_reason("ours_bwd_fp16_v3", _cfg(**{"pass": "bwd"}, d=264)) == "supports(float16, d=264) is false"
    assert bench.na_reason("ours_fwd_fp16_v4", _cfg(d=40)) is None
    # bf16: numpy cannot name it, so supports is not asked: the launcher answers (ValueError -> n/a)
    assert bench.na_reason("ours_fwd_fp16_v4", _cfg(dtype="bf16")) is None


def test_supports_question_that_cannot_be_put_is_left_to_the_launcher():
    class Picky:
        @staticmethod
        def supports(dtype, d):
            return np.dtype(dtype) == np.float16 and d <= 128

    assert bench._supports(Picky, "fp16", 64) is True
    assert bench._supports(Picky, "fp16", 256) is False
    assert bench._supports(Picky, "bf16", 64) in (None, False)  # None unless numpy has a bfloat16


# --------------------------------------------------------------------------- rounds, with a fake timer


class FakeTimer:
    """Call times per (variant, round): base[variant] x drift[round] (a machine that slows down)."""

    def __init__(self, base, drift, fail=None, jitter=None):
        self.base, self.drift, self.fail, self.order, self.calls = base, drift, fail or {}, [], {}
        self.jitter = jitter or {}  # name -> per-round factor of its own

    def __call__(self, name):
        r = self.calls.get(name, 0)
        self.calls[name] = r + 1
        self.order.append(name)
        if self.fail.get(name) == r:
            raise RuntimeError("boom")
        t = self.base[name] * self.drift[r] * self.jitter.get(name, [1.0] * len(self.drift))[r]
        return [t * 0.99, t, t * 1.01, t * 1.5, t * 0.98]  # an outlier call: the median ignores it


def test_rounds_rotate_the_order_and_time_every_variant_once_per_round():
    names = ["naive", "sdpa_flash", "ours_x"]
    timer = FakeTimer({n: 1.0 for n in names}, [1.0] * 4)
    times, errors = bench.run_rounds(names, timer, 4)
    assert errors == {}
    assert timer.order == ["naive", "sdpa_flash", "ours_x", "sdpa_flash", "ours_x", "naive",
                           "ours_x", "naive", "sdpa_flash", "naive", "sdpa_flash", "ours_x"]
    assert all(len(times[n]) == 4 and all(t is not None for t in times[n]) for n in names)
    assert bench.rotation([], 3) == []


def test_same_run_ratio_cancels_drift_and_its_spread_is_the_rounds():
    names = ["sdpa_flash", "ours_x"]
    drift = [1.0, 1.3, 0.8, 1.1, 1.0]
    times, _ = bench.run_rounds(names, FakeTimer({"sdpa_flash": 1.0, "ours_x": 2.0}, drift), 5)
    st = bench.stats(times["ours_x"])
    print(st)
    assert st["rounds"] == 5
    assert st["ms"] == pytest.approx(2.0 * np.median(drift))
    assert st["ms_q1"] == pytest.approx(2.0 * np.percentile(drift, 25))
    assert st["ms_q3"] == pytest.approx(2.0 * np.percentile(drift, 75))
    assert (st["ms_min"], st["ms_max"]) == pytest.approx((1.6, 2.6))
    assert st["ms_std"] > 0
    cols = bench.ratio_columns("sdpa_flash", times["sdpa_flash"], times["ours_x"])
    # drift hits both alike within a round: every per-round ratio is 0.5, no spread
    assert cols == pytest.approx({"x_sdpa_flash": 0.5, "x_sdpa_flash_q1": 0.5, "x_sdpa_flash_q3": 0.5})


def test_ratio_is_per_round_not_of_the_medians():
    # ours is fast in the slow rounds: per-round ratios 1, 2, 3 (median 2), not the medians' ratio
    peer = [[1.0], [2.0], [3.0]]
    ours = [[1.0], [1.0], [1.0]]
    assert bench.round_ratios(peer, ours) == [1.0, 2.0, 3.0]
    assert bench.ratio_columns("naive", peer, ours) == pytest.approx(
        {"x_naive": 2.0, "x_naive_q1": 1.5, "x_naive_q3": 2.5})
    # a round one of the two missed is left out
    assert bench.round_ratios([[1.0], None, [3.0]], [[1.0], [1.0], None]) == [1.0]


def test_a_failing_variant_is_dropped_from_later_rounds_and_reported():
    names = ["sdpa_flash", "ours_x"]
    timer = FakeTimer({"sdpa_flash": 1.0, "ours_x": 2.0}, [1.0] * 3, fail={"ours_x": 1})
    times, errors = bench.run_rounds(names, timer, 3)
    assert errors == {"ours_x": "RuntimeError('boom')"}
    assert timer.calls == {"sdpa_flash": 3, "ours_x": 2}
    rows = bench.summarize(_cfg(), times, errors, {"sdpa_flash": {"rel_err": 1e-4}, "ours_x": {"rel_err": 2e-4},
                                                   "sdpa_cudnn": {"na": "torch: no kernel"}})
    assert "ms" in rows["sdpa_flash"] and rows["sdpa_flash"]["x_sdpa_flash"] == 1.0
    assert rows["ours_x"]["error"] == "RuntimeError('boom')" and "ms" not in rows["ours_x"]
    assert rows["sdpa_cudnn"] == dict(_cfg(), variant="sdpa_cudnn", na="torch: no kernel")
    assert "n/a: torch: no kernel" in bench.line(rows["sdpa_cudnn"])


def _record(tmp_path):
    """A small record as the bench writes it: a grid and an off-grid configuration."""
    rows = []
    for cfg in (_cfg(), _cfg(set="offgrid", d=80, note="head dim"), _cfg(dtype="bf16")):
        names = ["naive", "sdpa_flash", "sdpa_cudnn", "ours_fwd_fp16_v4"]
        base = {"naive": 4.0, "sdpa_flash": 1.0, "sdpa_cudnn": 0.8, "ours_fwd_fp16_v4": 1.25}
        timer = FakeTimer(base, [1.0, 1.1, 0.9, 1.0, 1.05], jitter={"ours_fwd_fp16_v4": [1, 1.1, 0.9, 0.95, 1.05]})
        extra = {n: {"rel_err": 1e-3} for n in names}
        if cfg["set"] != "grid":
            names.remove("sdpa_cudnn")
            extra["sdpa_cudnn"] = {"na": "torch: head dim 80"}
        if cfg["dtype"] == "bf16":
            names.remove("sdpa_cudnn")
            timer.fail = {"ours_fwd_fp16_v4": 0}
            extra["ours_fwd_fp16_v4"] = {"na": "ValueError: q.dtype=|V2: must be float32 or float16"}
            names.remove("ours_fwd_fp16_v4")
        times, errors = bench.run_rounds(names, timer, 5)
        rows += list(bench.summarize(cfg, times, errors, extra).values())
    out = tmp_path / "rec.csv"
    bench.write(out, rows, {"gpu": "G", "rounds": 5})
    return out, rows


def test_csv_keeps_the_old_columns_and_adds_the_spread(tmp_path):
    out, rows = _record(tmp_path)
    with open(out, newline="") as f:
        header = next(csv.reader(f))
    # the single-run record written before the rounds existed: its columns must all still be there
    single = bench_table.Path(__file__).parents[1] / "kernels" / "data" / "bench_h100_single_run.csv"
    with open(single, newline="") as f:
        old = set(next(csv.reader(f))) - {"inputs", "error"}  # inputs: set by the GPU side; no row failed here
    assert old <= set(header), old - set(header)
    assert {"ms_q1", "ms_q3", "ms_min", "ms_max", "rounds", "x_sdpa_flash_q1", "x_sdpa_flash_q3", "x_naive_q1",
            "na", "set", "kv_heads", "nk", "note"} <= set(header)
    loaded = bench_table.load(out)
    ours = [r for r in loaded if r["variant"] == "ours_fwd_fp16_v4" and r["dtype"] == "fp16"][0]
    assert float(ours["x_sdpa_flash"]) == pytest.approx(0.8) and float(ours["x_naive"]) == pytest.approx(3.2)
    assert float(ours["ms"]) == pytest.approx(1.25) and ours["rounds"] == "5"
    assert not list(tmp_path.glob("*.tmp"))  # written to a temporary name, then renamed


def test_table_of_a_new_record_shows_spread_offgrid_and_na(tmp_path):
    out, _ = _record(tmp_path)
    table = bench_table.render_file(out)
    print(table)
    assert "± half the interquartile range" in table and "over 5 rounds" in table
    grid = [ln for ln in table.splitlines() if ln.startswith("| fwd | fp16 | 64 |")]
    # per-round ratios of ours to flash 0.80, 0.73, 0.89, 0.84, 0.76: median 0.80, quartiles 0.76, 0.84
    assert grid == ["| fwd | fp16 | 64 | no | 4,096 | 69 | 275 | 344 | - | 220 | `fwd_fp16_v4` | 3.20 ± 0.16 "
                    "| 0.80 ± 0.04 | 0.64 ± 0.03 |"]
    assert "| fwd | bf16 | 64 | no | 4,096 | 69 | 275 | - | - | n/a | - | - | - | - |" in table
    assert "Off the grid" in table
    assert [ln for ln in table.splitlines() if ln.startswith("| head dim")] == [
        "| head dim | fwd | fp16 | 4 | 16:16 | 4,096 | 4,096 | 80 | no | 86 | 344 | n/a | - | 275 | `fwd_fp16_v4` "
        "| 3.20 ± 0.16 | 0.80 ± 0.04 | - |"]
    assert "n/a (the variant does not take the configuration): ours_fwd_fp16_v4 on 1 configuration (ValueError" in table
    assert "sdpa_cudnn on 1 configuration (torch: head dim 80)" in table


def test_pm_prints_median_and_half_iqr():
    assert bench.pm({"x": 0.77, "x_q1": 0.74, "x_q3": 0.8}, "x").strip() == "0.77±0.03"
    assert bench.pm({}, "x").strip() == "-"
    assert bench.pm({"x": math.nan}, "x").strip() == "-"


def test_cli_refuses_to_overwrite_and_bad_options_without_a_gpu(tmp_path, capsys):
    out = tmp_path / "b.csv"
    out.write_text("keep")
    assert bench.main(["--out", str(out)]) == 2
    assert out.read_text() == "keep"
    assert bench.main(["--dtypes", "fp16,int8"]) == 2
    assert bench.main(["--rounds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("flashsim: error: ") for e in err)
