"""The numbers behind the notebooks' takeaways, computed from committed data in one place.

Each notebook calls these functions, quotes what they return and asserts it; the tests
(``tests/test_notebook_claims.py``) call them on the same committed files, so a takeaway that the
data stops supporting fails in CI without executing the notebook.  Nothing here draws.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def _grid_blocks(grid: str) -> int:
    """Thread blocks of a launch from ncu's "(x, y, z)"."""
    return math.prod(int(x) for x in str(grid).strip("()").split(",") if x.strip())


def attention_flops(cfg: dict) -> float:
    """Matmul FLOPs of an attention forward, 4·B·H·Nq·Nk·d (halved if causal)."""
    f = 4.0 * cfg["batch"] * cfg["heads"] * cfg["seq_len_q"] * (cfg.get("seq_len_k") or cfg["seq_len_q"]) \
        * cfg["head_dim"]
    return f / 2 if cfg.get("causal") else f


def block_of(cfg: dict) -> int:
    """The block size a Figure 2 (middle) sweep varies: FlashAttention-1's key block Bc (from M by
    the paper's rule, Bc = ⌈M/4d⌉ in elements), FlashAttention-2's query block Br."""
    if cfg["kernel"] == "flash1":
        eb = 2 if cfg["dtype"] == "fp16" else 4
        return -(-(cfg["sram_bytes"] // eb) // (4 * cfg["head_dim"]))
    return int(cfg["block_m"])


_CONFIG_KEYS = ("config_id", "kernel", "pass", "batch", "heads", "seq_len_q", "seq_len_k", "head_dim", "dtype",
                "causal", "block_m", "block_n", "sram_bytes", "gemm_block")


def measured_configs(rows: list[dict], timing: list[dict] | None = None) -> list[dict]:
    """Launches of one configuration of a measured record added up (LSU, DRAM bytes, ncu time, the
    largest launch's grid), with the CUDA-event times of ``timing`` (median, min, max over the
    repeats) where given.  Rows as :func:`analysis.notebook_data.load_csv` reads them."""
    agg: dict[str, dict] = {}
    for r in rows:
        if r["config_id"] not in agg:
            agg[r["config_id"]] = {k: r.get(k) for k in _CONFIG_KEYS} | {
                "lsu_bytes": 0, "dram_bytes": 0, "dram_read_bytes": 0, "dram_write_bytes": 0, "time_ns": 0.0,
                "grid_blocks": 0}
        a = agg[r["config_id"]]
        a["lsu_bytes"] += r["lsu_ld_bytes"] + r["lsu_st_bytes"]
        a["dram_read_bytes"] += r["dram_read_bytes"]
        a["dram_write_bytes"] += r["dram_write_bytes"]
        a["dram_bytes"] += r["dram_read_bytes"] + r["dram_write_bytes"]
        a["time_ns"] += r["time_ns"]
        a["grid_blocks"] = max(a["grid_blocks"], _grid_blocks(r["grid"]))
    by_id: dict[str, list[float]] = defaultdict(list)
    for t in timing or []:
        by_id[t["config_id"]].append(float(t["ms"]))
    out = []
    for a in agg.values():
        a["ncu_ms"] = a["time_ns"] / 1e6
        ms = by_id.get(a["config_id"])
        if ms:
            a.update(ms_median=float(np.median(ms)), ms_min=min(ms), ms_max=max(ms), repeats=len(ms))
        a["block"] = block_of(a)
        a["flops"] = attention_flops(a)
        out.append(a)
    return out


def figure2_claims(points: list[dict], peak_bytes_per_s: float, events: bool = False) -> dict[str, dict]:
    """Per kernel, over its block sweep (smallest to largest block): how much LSU bytes, DRAM
    bytes and time fall, the rank correlation of time with DRAM bytes, and the largest share of
    the GPU's DRAM bandwidth drawn (DRAM bytes over the time).  The time is the kernels' own
    under ncu (``gpu__time_duration``, every launch of the configuration), or with ``events``
    the CUDA-event median of the whole call where recorded.  ``memory_bound`` is that share at
    50 % or more."""
    out = {}
    for kernel in sorted({p["kernel"] for p in points}):
        pts = sorted((p for p in points if p["kernel"] == kernel), key=lambda p: p["block"])
        if len(pts) < 2:
            continue
        t = np.array([p.get("ms_median", p["ncu_ms"]) if events else p["ncu_ms"] for p in pts])
        dram = np.array([p["dram_bytes"] for p in pts], dtype=float)
        lsu = np.array([p["lsu_bytes"] for p in pts], dtype=float)
        bw = dram / (t / 1e3)
        rank = lambda x: np.argsort(np.argsort(x))  # noqa: E731
        rho = float(np.corrcoef(rank(t), rank(dram))[0, 1]) if len(pts) > 2 else float("nan")
        out[kernel] = {
            "blocks": [p["block"] for p in pts], "grid_blocks": min(p["grid_blocks"] for p in pts),
            "lsu_drop": lsu[0] / lsu[-1], "dram_drop": dram[0] / dram[-1], "time_drop": t[0] / t[-1],
            "time_min_block": pts[int(np.argmin(t))]["block"], "rank_corr_time_dram": rho,
            "bw_share_max": float(bw.max() / peak_bytes_per_s),
            "memory_bound": bool(bw.max() >= 0.5 * peak_bytes_per_s),
            "tflops_max": float(max(p["flops"] / (tt / 1e3) for p, tt in zip(pts, t)) / 1e12),
        }
    return out




def fmt_ratio(x: float, rel_spread: float) -> str:
    """A ratio to the decimals its relative spread allows: the last digit printed is no finer
    than the spread (x·rel_spread), at most 2 decimals, at least 0 ("5.6", "0.64", "12")."""
    if not math.isfinite(x):
        return "–"
    unc = abs(x) * max(rel_spread, 1e-12)
    decimals = min(2, max(0, -math.floor(math.log10(unc)))) if unc > 0 else 2
    return f"{x:.{decimals}f}"


def ratio_spreads(rows: list[dict], peers: tuple[str, ...]) -> dict[tuple, dict[str, float]]:
    """For each timed row of ours (key: its configuration tuple and variant), the relative spread
    of its ratio to each peer timed on the same configuration: √((σ_ours/ms_ours)² + (σ_peer/ms_peer)²)
    from the recorded ``ms_std``."""
    from .perf import config_of, is_ours, split_failed

    timed, _ = split_failed(rows)
    rel = {(config_of(r), r["variant"]): (r.get("ms_std") or 0.0) / r["ms"] for r in timed}
    out = {}
    for r in timed:
        if is_ours(r["variant"]):
            mine = rel[(config_of(r), r["variant"])]
            out[(config_of(r), r["variant"])] = {p: math.hypot(mine, rel[(config_of(r), p)]) for p in peers
                                                 if (config_of(r), p) in rel}
    return out


def gpt2_summary(rows: list[dict]) -> dict[tuple, dict]:
    """Per (variant, causal, mode) of the GPT-2-medium attention timing: the median over every
    timed call, each run's median, their smallest and largest, and the status of failed runs."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (r["variant"], bool(r["causal"]), r.get("mode") or "fwd_bwd")
        g = groups.setdefault(key, {"calls": [], "runs": defaultdict(list), "failed": []})
        if r.get("status") == "ok":
            g["calls"].append(float(r["ms"]))
            g["runs"][r["run"]].append(float(r["ms"]))
        else:
            g["failed"].append(r.get("status"))
    out = {}
    for key, g in groups.items():
        run_med = [float(np.median(v)) for v in g["runs"].values()]
        out[key] = {"ms": float(np.median(g["calls"])) if g["calls"] else math.nan, "run_medians": run_med,
                    "lo": min(run_med) if run_med else math.nan, "hi": max(run_med) if run_med else math.nan,
                    "runs": len(run_med), "failed": g["failed"]}
    return out


__all__ = ["attention_flops", "block_of", "measured_configs", "figure2_claims", "fmt_ratio", "ratio_spreads",
           "gpt2_summary"]
