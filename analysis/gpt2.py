"""The GPT-2 end-to-end record (``benchmarks/gpt2_train.py``) read and summarised for notebook 07.

Two CSV files, written together on one GPU: ``gpt2_train_h100.csv`` (one row per run: the model,
the sequence length N, the batch, the attention, the step time's median and quartiles, tokens/s,
the peak memory, or ``status`` "out of memory"; ``model`` "attention-only" rows time attention
alone, forward and backward, at the paper's GPT-2-medium shape) and ``gpt2_train_h100_losses.csv``
(every step's loss per run).  Everything the notebook says is computed here from them.

The FlashAttention paper's own figures for the same comparison (Dao et al., 2022, section 4.1:
GPT-2 trained 3x faster than the HuggingFace implementation; Figure 2 and the text: attention
alone, forward and backward, 7.6x faster on GPT-2 medium, on an A100) are kept as constants, for
the notebook to set ours beside them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

#: The paper's GPT-2 speed-ups over the HuggingFace baseline (Dao et al., 2022, section 4.1, A100).
PAPER_TRAINING_SPEEDUP = 3.0
PAPER_ATTENTION_SPEEDUP = 7.6
#: The attentions of the record, in the order the notebook draws them.
ATTENTIONS = ("naive", "sdpa", "ours")
#: Two losses "agree" while they differ by less than this (4 decimals).
AGREE_TOL = 5e-5

_FLOAT = ("step_ms_median", "step_ms_q1", "step_ms_q3", "tokens_per_s", "peak_mem_gib", "loss_first", "loss_last",
          "wall_s")


def read_runs(path: str | Path) -> list[dict]:
    """The runs, typed: ``seq_len``, ``batch`` and ``steps`` ints, the timings floats (None where
    the run recorded none: the attention-only rows' memory, a run out of memory)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in ("seq_len", "batch", "steps"):
                r[k] = int(r[k])
            for k in _FLOAT:
                r[k] = float(r[k]) if r.get(k) not in (None, "") else None
            rows.append(r)
    if not rows:
        raise ValueError(f"path={str(path)!r}: no runs in the file")
    return rows


def read_losses(path: str | Path) -> dict[tuple[str, int, str], np.ndarray]:
    """Every step's loss: (model, N, attention) -> losses in step order."""
    per: dict[tuple[str, int, str], dict[int, float]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            per.setdefault((r["model"], int(r["seq_len"]), r["attention"]), {})[int(r["step"])] = float(r["loss"])
    out = {}
    for key, steps in per.items():
        if sorted(steps) != list(range(len(steps))):
            raise ValueError(f"losses of {key}: steps {sorted(steps)[:3]}... are not 0, 1, 2, ...")
        out[key] = np.array([steps[i] for i in range(len(steps))])
    return out


def configs(runs: list[dict]) -> list[tuple[str, int]]:
    """The training configurations (model, N), in the file's order (attention-only rows left out)."""
    return list(dict.fromkeys((r["model"], r["seq_len"]) for r in runs if r["model"] != "attention-only"))


def run_of(runs: list[dict], model: str, n: int, attention: str) -> dict | None:
    return next((r for r in runs if (r["model"], r["seq_len"], r["attention"]) == (model, n, attention)), None)


def ok(run: dict | None) -> bool:
    return run is not None and run["status"] == "ok" and run["step_ms_median"] is not None


def drift(losses: dict, model: str, n: int) -> dict:
    """How far the loss curves of one configuration drift apart: for ours and naive, each against
    SDPA, the mean and max |loss − SDPA's loss| over the steps, and the first step where they
    differ by more than :data:`AGREE_TOL` (the curves agree to 4 decimals before it).  None for
    an attention without a loss curve (out of memory)."""
    ref = losses.get((model, n, "sdpa"))
    if ref is None:
        raise ValueError(f"model={model!r}, n={n}: no SDPA loss curve to compare with")
    out: dict = {"model": model, "n": n, "steps": len(ref)}
    for a in ("ours", "naive"):
        cur = losses.get((model, n, a))
        if cur is None:
            out[a] = None
            continue
        k = min(len(cur), len(ref))
        diff = np.abs(cur[:k] - ref[:k])
        apart = np.nonzero(diff > AGREE_TOL)[0]
        out[a] = {"mean": float(diff.mean()), "max": float(diff.max()),
                  "agree_until": int(apart[0]) if apart.size else k, "diff": diff}
    return out


def speedups(runs: list[dict]) -> dict[tuple[str, int], dict]:
    """Per configuration (training ones and ``("attention-only", N)``): ours' speed-up over naive
    and over SDPA, step time against step time (peer's median / ours'); None where a run did
    not finish."""
    out = {}
    keys = configs(runs) + list(dict.fromkeys((r["model"], r["seq_len"]) for r in runs
                                              if r["model"] == "attention-only"))
    for model, n in keys:
        ours = run_of(runs, model, n, "ours")
        row = {}
        for peer in ("naive", "sdpa"):
            p = run_of(runs, model, n, peer)
            row[peer] = p["step_ms_median"] / ours["step_ms_median"] if ok(p) and ok(ours) else None
        out[(model, n)] = row
    return out


__all__ = ["PAPER_TRAINING_SPEEDUP", "PAPER_ATTENTION_SPEEDUP", "ATTENTIONS", "AGREE_TOL", "read_runs",
           "read_losses", "configs", "run_of", "ok", "drift", "speedups"]
