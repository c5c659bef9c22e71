"""Sweeps, records, CSV round trips, exponent fits (Theorem 2's exponents) and plots."""

import importlib
import math

import pytest

from flashsim.config import GPUS
from flashsim.sweep import fit_exponent, fit_exponents, read_csv, sweep, write_csv


def have(algo: str) -> bool:
    try:
        importlib.import_module(f"flashsim.algorithms.{algo}")
    except ImportError:
        return False
    return True


THEOREM2_ALGOS = [a for a in ("flash2", "flash1") if have(a)]

# Theorem 2's regime: M ≥ d² so that Br = ⌈M/4d⌉ ≤ d (the paper's rule caps Br at d, so for
# flash2 M must also stay ≤ 4d²), and N ≫ M/d so that the N²d²/M term dominates the Nd terms.
BASE = dict(batch=1, heads=1, N=4096, d=64, dtype="fp16", sram_elems=8192)
M_VALUES = [4096, 6144, 8192, 12288, 16384]  # d² .. 4d² for d = 64
N_VALUES = [2048, 4096, 8192, 16384]
D_VALUES = [64, 80, 96, 112, 128]  # with M = 16384: d² ≤ M ≤ 4d² throughout


def theorem2_records(algo):
    return (sweep(BASE, "M", M_VALUES, algos=(algo,), walk=False)
            + sweep(BASE, "N", N_VALUES, algos=(algo,), walk=False)
            + sweep(dict(BASE, sram_elems=16384), "d", D_VALUES, algos=(algo,), walk=False))


@pytest.mark.parametrize("algo", THEOREM2_ALGOS)
def test_theorem2_exponents(algo):
    recs = theorem2_records(algo)
    by_param = {p: [r for r in recs if r["param"] == p] for p in ("M", "N", "d")}
    slope_m, _, r2 = fit_exponent(by_param["M"], "M")
    slope_n, _, _ = fit_exponent(by_param["N"], "N")
    slope_d, _, _ = fit_exponent(by_param["d"], "d")
    print(f"{algo}: M^{slope_m:.3f} N^{slope_n:.3f} d^{slope_d:.3f}")
    assert abs(slope_m + 1) < 0.1 and abs(slope_n - 2) < 0.1 and abs(slope_d - 2) < 0.1
    assert r2 > 0.99
    for joint in (True, False):
        fit = fit_exponents(recs + theorem2_records("standard") if have("standard") else recs,
                            xs=("M", "N", "d"), joint=joint, algo=algo, pass_="fwd")
        e, se = fit["exponents"], fit["stderr"]
        assert abs(e["M"] + 1) < 0.1 and abs(e["N"] - 2) < 0.1 and abs(e["d"] - 2) < 0.1, fit
        assert all(0 <= se[x] < 0.05 for x in ("M", "N", "d")), fit


def test_standard_is_quadratic_in_n():
    if not have("standard"):
        pytest.skip("standard not written yet")
    recs = sweep(dict(BASE, d=64), "N", [1024, 2048, 4096, 8192, 16384], algos=("standard",), walk=False)
    slope, _, _ = fit_exponent(recs, "N")
    assert abs(slope - 2) < 0.1


def test_fit_exact_power_law():
    recs = [{"x": x, "y": 3.0 * x ** -1.5, "k": x % 2} for x in (1, 2, 4, 8, 16)]
    slope, icpt, r2 = fit_exponent(recs, "x", y="y")
    assert slope == pytest.approx(-1.5) and icpt == pytest.approx(math.log(3.0)) and r2 == pytest.approx(1.0)
    assert fit_exponent(recs + [{"x": 3, "y": 1e9}], "x", y="y", where=lambda r: r["y"] < 1e6)[0] == pytest.approx(-1.5)
    with pytest.raises(ValueError, match="distinct"):
        fit_exponent(recs, "x", y="y", where={"x": 4})


def test_records_walk_and_closed_form_agree(tmp_path):
    algos = tuple(a for a in ("standard", "flash1", "flash2", "smallcache") if have(a))
    walked = sweep(dict(BASE, N=256), "M", [1024, 4096], algos=algos, gpu="h100")
    closed = sweep(dict(BASE, N=256), "M", [1024, 4096], algos=algos, gpu="h100", walk=False)
    assert len(walked) == len(closed) == 2 * len(algos)
    for a, b in zip(walked, closed):
        assert a["agrees"] is True and b["agrees"] is None
        assert a["hbm_bytes"] == b["hbm_bytes"] == a["hbm_read_bytes"] + a["hbm_write_bytes"]
        assert a["hbm_sectors"] * 32 >= a["hbm_bytes"]
        assert a["bound_lower"] <= a["hbm_elements"]
        assert a["bound"] in ("memory", "compute") and a["time_s"] > 0
        assert a["regime"] == ("large-cache" if a["sram_elems"] >= 64 * 64 else "small-cache")
    path = tmp_path / "sweep.csv"
    write_csv(walked, path)
    assert read_csv(path) == walked


def test_gpu_param_sets_m_and_other_params():
    recs = sweep(dict(BASE, N=512), "gpu", ["a100", "h100"], algos=("flash2",), walk=False)
    assert [r["sram_elems"] for r in recs] == [GPUS["a100-40gb"].sram_elems(2), GPUS["h100"].sram_elems(2)]
    assert recs[0]["gpu"] == "A100-SXM4-40GB" and recs[1]["time_s"] < recs[0]["time_s"]
    r = sweep(dict(BASE, N=512, block_m=32, block_n=16), "block_n", [16, 64], algos=("flash2",), walk=False)
    assert [(x["block_m"], x["block_n"]) for x in r] == [(32, 16), (32, 64)]
    r = sweep(dict(BASE, N=512), "seq_len_k", [100, 300], algos=("flash2",), walk=False)
    assert [(x["seq_len_q"], x["seq_len_k"]) for x in r] == [(512, 100), (512, 300)]
    with pytest.raises(ValueError, match="param"):
        sweep(BASE, "colour", [1])


def test_unsupported_runs_are_skipped(recwarn):
    recs = sweep(dict(BASE, N=128, causal=True), "M", [4096], algos=("flash2", "smallcache"), walk=False)
    assert [r["algo"] for r in recs] == ["flash2"]
    assert any("smallcache" in str(w.message) for w in recwarn)
    with pytest.raises(ValueError, match="causal"):
        sweep(dict(BASE, N=128, causal=True), "M", [4096], algos=("smallcache",), on_error="raise")


def test_progress_bar(capsys, monkeypatch):
    """tqdm's bar on a terminal's stderr; nothing at all when stderr is not a terminal."""
    import io
    import sys

    sweep(dict(BASE, N=128), "M", [1024, 2048], algos=("flash2",), progress=True, walk=False)
    assert capsys.readouterr().err == ""

    class Tty(io.StringIO):
        def isatty(self):
            return True

    fake = Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    recs = sweep(dict(BASE, N=128), "M", [1024, 2048], algos=("flash2",), progress=True, walk=False)
    assert len(recs) == 2
    out = fake.getvalue()
    print(repr(out))
    assert "/2" in out and "run" in out


def test_plots(tmp_path):
    from flashsim.api import simulate
    from flashsim.config import Workload
    from flashsim.plot import COLORS, THEOREM2_LABEL, plot_breakdown, plot_sweep

    recs = sweep(dict(BASE, N=512), "M", [1024, 2048, 4096, 8192], algos=("flash2", "smallcache"), walk=False)
    p = tmp_path / "sweep.png"
    fig = plot_sweep(recs, "M", path=p, title="HBM traffic against M")
    assert p.stat().st_size > 1000
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "M" in ax.get_xlabel() and "bytes" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"flash2", "smallcache", "lower bound", THEOREM2_LABEL} <= set(labels)
    assert "up to constants" in THEOREM2_LABEL and "not a bound" in THEOREM2_LABEL
    # one colour per algorithm, the shared palette's
    for line in ax.get_lines():
        if line.get_label() in ("flash2", "smallcache"):
            assert line.get_color() == COLORS[line.get_label()]
    fig = plot_sweep(recs, "M", y="time_s" if "time_s" in recs[0] else "flops")
    assert "lower bound" not in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    res = simulate(Workload(batch=1, heads=2, seq_len_q=256, head_dim=32), "flash2", "fwd", sram_elems=2048)
    q = tmp_path / "breakdown.png"
    plot_breakdown(res, q)
    assert q.stat().st_size > 1000
