"""The timings of ``python -m kernels.bench`` (``kernels/data/bench_*.csv``), read for notebook 06.

One CSV row per (variant, configuration): our kernels (variants named ``ours_*``) beside torch's
naive attention (``naive``) and its SDPA backends (``sdpa_flash``, ``sdpa_cudnn``,
``sdpa_mem_eff``).  A row whose ``error`` is set (a failed check against float64, out of
memory, an exception) has no timing: :func:`split_failed` sets such rows apart so that they are
listed, not plotted.  Ratios are recomputed here from the times, so they cover every peer the
file holds, not only the ``x_*`` columns the benchmark writes.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

#: torch's attention in the benchmark, in the order the notebook shows them
PEERS = ("naive", "sdpa_flash", "sdpa_cudnn", "sdpa_mem_eff")
#: the columns that name a configuration (a row is one variant timed on one configuration)
CONFIG_KEYS = ("pass", "dtype", "d", "causal", "n", "batch", "heads")
_INT = ("batch", "heads", "n", "d")
_ORDER = {"fwd": 0, "bwd": 1, "fp16": 0, "bf16": 1, "fp32": 2}


def _float(s: str | None) -> float:
    return float(s) if s not in (None, "") else math.nan


def read_bench(path: str | Path) -> list[dict]:
    """The rows of a benchmark CSV, typed: ints for the sizes, a bool ``causal``, floats for
    ``ms``, ``ms_std``, ``tflops``, ``rel_err`` and the ``x_*`` ratios (NaN where empty), and
    ``error`` and ``na`` (why the variant does not take the configuration, in records with
    rounds) a string or None."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            r = dict(raw)
            for k in _INT:
                r[k] = int(r[k])
            r["causal"] = str(r["causal"]).strip().lower() in ("true", "1")
            for k in raw:
                if k in ("ms", "ms_std", "tflops", "rel_err") or k.startswith("x_"):
                    r[k] = _float(raw[k])
            r["error"] = (raw.get("error") or "").strip() or None
            r["na"] = (raw.get("na") or "").strip() or None
            rows.append(r)
    return rows


def not_applicable(row: dict) -> bool:
    """The variant does not take the configuration (SDPA's flash backend in fp32, say): never timed,
    and not a failure."""
    return row.get("na") is not None and row["error"] is None


def failed(row: dict) -> bool:
    return not not_applicable(row) and (row["error"] is not None or not math.isfinite(row.get("ms", math.nan)))


def split_failed(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(timed rows, failed rows); rows that are n/a (:func:`not_applicable`) are in neither."""
    timed = [r for r in rows if not failed(r) and not not_applicable(r)]
    return timed, [r for r in rows if failed(r)]


def is_ours(variant: str) -> bool:
    return variant.startswith("ours_")


def config_of(row: dict) -> tuple:
    return tuple(row[k] for k in CONFIG_KEYS)


def cases(rows: list[dict]) -> list[tuple[str, str]]:
    """The (pass, dtype) pairs in which one of our kernels was timed, forward first, fp16 first."""
    found = {(r["pass"], r["dtype"]) for r in rows if is_ours(r["variant"]) and not failed(r)}
    return sorted(found, key=lambda c: (_ORDER.get(c[0], 9), _ORDER.get(c[1], 9), c))


def variants(rows: list[dict]) -> list[str]:
    """The variants in the rows: torch's peers in PEERS' order, then ours by name."""
    names = {r["variant"] for r in rows}
    return [p for p in PEERS if p in names] + sorted(n for n in names if n not in PEERS)


def series(rows: list[dict], pass_: str, dtype: str, d: int, causal: bool) -> dict[str, tuple[list, list]]:
    """variant -> (N values, TFLOP/s) of the timed rows of one (pass, dtype, d, causal), by N."""
    out: dict[str, tuple[list, list]] = {}
    for v in variants(rows):
        pts = sorted((r["n"], r["tflops"]) for r in rows if r["variant"] == v and not failed(r)
                     and (r["pass"], r["dtype"], r["d"], r["causal"]) == (pass_, dtype, d, causal))
        if pts:
            out[v] = ([n for n, _ in pts], [t for _, t in pts])
    return out


def ratios(rows: list[dict], fastest_only: bool = False) -> list[dict]:
    """One record per timed row of ours: its configuration, variant, ms and TFLOP/s, and
    ``x_<peer>`` = the peer's time / ours (above 1: ours is faster) for every peer of PEERS,
    NaN where the peer was not timed on that configuration (e.g. SDPA's flash backend in fp32).
    fastest_only: keep only our fastest variant per configuration."""
    timed, _ = split_failed(rows)
    peer_ms = {(config_of(r), r["variant"]): r["ms"] for r in timed if not is_ours(r["variant"])}
    out = []
    for r in timed:
        if not is_ours(r["variant"]):
            continue
        rec = {k: r[k] for k in CONFIG_KEYS} | {"variant": r["variant"], "ms": r["ms"], "tflops": r["tflops"]}
        for p in PEERS:
            rec[f"x_{p}"] = peer_ms.get((config_of(r), p), math.nan) / r["ms"]
        out.append(rec)
    if fastest_only:
        best: dict[tuple, dict] = {}
        for rec in out:
            key = config_of(rec)
            if key not in best or rec["ms"] < best[key]["ms"]:
                best[key] = rec
        out = [rec for rec in out if best[config_of(rec)] is rec]
    return sorted(out, key=lambda r: (_ORDER.get(r["pass"], 9), _ORDER.get(r["dtype"], 9), r["d"], r["causal"],
                                      r["n"], r["variant"]))


def ratio_range(records: list[dict], peer: str, n_min: int = 0, **where) -> tuple[float, float, int]:
    """(smallest, largest, count) of ``x_<peer>`` over the records with N >= n_min that match
    ``where`` (column=value; ``pass_`` for ``pass``), NaN ratios skipped; (nan, nan, 0) if none."""
    where = {k.rstrip("_"): v for k, v in where.items()}
    xs = [r[f"x_{peer}"] for r in records
          if r["n"] >= n_min and all(r[k] == v for k, v in where.items()) and math.isfinite(r[f"x_{peer}"])]
    return (min(xs), max(xs), len(xs)) if xs else (math.nan, math.nan, 0)


def by_head_dim(rows: list[dict], variant: str, peer: str = "sdpa_flash", n: int = 4096, causal: bool = False,
                pass_: str = "fwd", dtype: str = "fp16") -> dict[int, tuple[float, float, float]]:
    """d -> (median, q1, q3) of ``variant``'s same-run ratio to ``peer`` (``x_<peer>`` and its
    quartiles) over the rows of one N, mask, pass and dtype: a head-dim sweep's curve."""
    out = {}
    for r in rows:
        if (r["variant"] == variant and r["n"] == n and r["causal"] == causal and r["pass"] == pass_
                and r["dtype"] == dtype and math.isfinite(r.get(f"x_{peer}", math.nan))):
            out[r["d"]] = (r[f"x_{peer}"], r.get(f"x_{peer}_q1", math.nan), r.get(f"x_{peer}_q3", math.nan))
    return dict(sorted(out.items()))


__all__ = ["PEERS", "CONFIG_KEYS", "read_bench", "failed", "split_failed", "is_ours", "config_of", "cases",
           "variants", "series", "ratios", "ratio_range", "by_head_dim"]
