"""analysis.gpt2 on the committed GPT-2 end-to-end record (CPU only: it reads CSV files)."""

import numpy as np
import pytest

from analysis.gpt2 import AGREE_TOL, configs, drift, read_losses, read_runs, run_of, speedups
from analysis.notebook_data import data_path


@pytest.fixture(scope="module")
def record():
    return read_runs(data_path("gpt2")), read_losses(data_path("gpt2_losses"))


def test_runs_and_losses_agree(record):
    runs, losses = record
    assert configs(runs) == [("small", 1024), ("small", 4096), ("medium", 1024), ("medium", 4096)]
    for r in runs:
        if r["model"] == "attention-only":
            continue
        key = (r["model"], r["seq_len"], r["attention"])
        if r["status"] == "ok":
            # every step's loss is recorded, and the first and last agree with the run's row
            assert len(losses[key]) == r["steps"]
            assert losses[key][0] == pytest.approx(r["loss_first"]) and losses[key][-1] == pytest.approx(r["loss_last"])
            assert r["step_ms_q1"] <= r["step_ms_median"] <= r["step_ms_q3"]
        else:
            assert key not in losses and r["step_ms_median"] is None
    assert run_of(runs, "medium", 4096, "naive")["status"] == "out of memory"


def test_drift_is_computed_against_sdpa(record):
    _, losses = record
    d = drift(losses, "small", 1024)
    diff = np.abs(losses[("small", 1024, "ours")] - losses[("small", 1024, "sdpa")])
    assert d["ours"]["mean"] == pytest.approx(diff.mean()) and d["ours"]["max"] == pytest.approx(diff.max())
    k = d["ours"]["agree_until"]
    assert (diff[:k] <= AGREE_TOL).all() and diff[k] > AGREE_TOL
    assert drift(losses, "medium", 4096)["naive"] is None  # naive ran out of memory there
    with pytest.raises(ValueError, match="no SDPA loss curve"):
        drift(losses, "large", 1024)


def test_speedups_are_step_time_ratios(record):
    runs, _ = record
    s = speedups(runs)
    ours = run_of(runs, "attention-only", 1024, "ours")["step_ms_median"]
    assert s[("attention-only", 1024)]["naive"] == pytest.approx(
        run_of(runs, "attention-only", 1024, "naive")["step_ms_median"] / ours)
    assert s[("medium", 4096)]["naive"] is None and s[("medium", 4096)]["sdpa"] > 0
