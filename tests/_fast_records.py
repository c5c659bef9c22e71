"""The committed H100 records of the fast set (analysis/data/h100/fast), compared once per test
process: tests/test_fast_measure.py (LSU level) and tests/test_fast_blocks.py (DRAM level) read
the same comparison, which runs the L2 model over every launch (a few seconds)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "analysis" / "data" / "h100" / "fast"
RECORDS = ("fwd", "bwd", "bf16", "v5", "v5b", "v5c", "v3d", "v3odd", "v1d40", "v5d96", "v4d40")


@cache
def compared(rec: str) -> tuple[dict, ...]:
    """``analysis.compare.compare`` of record ``rec`` (one of :data:`RECORDS`) with the H100 preset,
    as ``flashsim compare`` runs it (the dirty data ncu's replay leaves, from the record's metrics)."""
    from analysis.compare import compare, read_measured, replay_dirty

    rows, meta = read_measured(ROOT / f"fast_{rec}" / "fast.csv")
    return tuple(compare(rows, "h100", replay_dirty(meta)))
