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


# --- decoding (notebook 08) -------------------------------------------------------------------

#: The decode bench's configuration fields (kernels/bench_decode.py's CSV).
DECODE_KEYS = ("group", "dtype", "batch", "heads", "kv_heads", "nq", "nk", "d", "page_size", "causal")
#: The variant that is "ours" in the takeaways: the fast kernel as the launcher runs it (the other
#: ``ours_*`` variants are tunings and versions timed beside it).
DECODE_OURS = "ours_fast"


def _timed(r: dict) -> bool:
    return not r.get("error") and r.get("ms") is not None and math.isfinite(float(r["ms"]))


def decode_bench(rows: list[dict], group: str = "main") -> list[dict]:
    """The decode bench's configurations of ``group`` (rows as ``load_csv`` reads them), in file
    order, each with every variant's median ms, its fastest and slowest trial, GB/s (the median
    and the range from the trials: the compulsory bytes over each time), the ratio of its GB/s to
    the copy's in the same configuration (``x_copy``), and for ours the ratio to the fastest SDPA
    backend (its ms over ours; ``x_sdpa_best``).  A variant that failed keeps its error text."""
    cfgs: dict[tuple, dict] = {}
    for r in rows:
        if r["group"] != group:
            continue
        # the splits group times one split count per configuration; elsewhere SDPA has none
        key = tuple(r[k] for k in DECODE_KEYS) + ((r.get("num_splits"),) if group == "splits" else ())
        if r["variant"] == "copy":
            # a copy row belongs to the configuration (in the splits group, to the sweep point) after it
            cfgs.setdefault(("copy",) + tuple(r[k] for k in DECODE_KEYS), {})["last"] = r
            continue
        c = cfgs.setdefault(key, {"config": {k: r[k] for k in DECODE_KEYS}, "num_splits": r.get("num_splits"),
                                  "tile_keys": r.get("tile_keys"), "default_splits": r.get("default_splits"),
                                  "model_splits": r.get("model_splits"), "variants": {}})
        copy = cfgs.get(("copy",) + tuple(r[k] for k in DECODE_KEYS), {}).get("last")
        if copy is not None and "copy" not in c:
            c["copy"] = {"ms": float(copy["ms"]), "gbps": float(copy["gbps"])}
        if _timed(r):
            ms, gbps = float(r["ms"]), float(r["gbps"])
            c["variants"][r["variant"]] = {"ms": ms, "ms_min": float(r["ms_min"]), "ms_max": float(r["ms_max"]),
                                           "gbps": gbps, "gbps_lo": gbps * ms / float(r["ms_max"]),
                                           "gbps_hi": gbps * ms / float(r["ms_min"]), "error": None}
        else:
            c["variants"][r["variant"]] = {"ms": math.nan, "gbps": math.nan, "error": str(r.get("error") or "")}
    out = [c for k, c in cfgs.items() if k[0] != "copy"]
    for c in out:
        cp = c.get("copy", {}).get("gbps", math.nan)
        sdpa = {n: v["ms"] for n, v in c["variants"].items() if n.startswith("sdpa_") and v["error"] is None}
        c["sdpa_best"] = min(sdpa, key=sdpa.get) if sdpa else None
        for v in c["variants"].values():
            v["x_copy"] = v["gbps"] / cp if v["error"] is None else math.nan
            v["x_sdpa_best"] = (sdpa[c["sdpa_best"]] / v["ms"] if c["sdpa_best"] and v["error"] is None
                                else math.nan)
    return out


def decode_main_claims(cfgs: list[dict], target_copy: float = 0.8, target_sdpa: float = 1.0) -> dict:
    """What the main group says of ours (``DECODE_OURS``) against the issue's targets: its ratio to
    the copy and to the best SDPA backend over the configurations where both were timed, how many
    meet each target, the best of all ``ours*`` variants per configuration, and the best SDPA
    backend's ratio to the copy."""
    timed = [c for c in cfgs if DECODE_OURS in c["variants"] and c["variants"][DECODE_OURS]["error"] is None]
    xc = np.array([c["variants"][DECODE_OURS]["x_copy"] for c in timed])
    xs = np.array([c["variants"][DECODE_OURS]["x_sdpa_best"] for c in timed])
    best = np.array([max(v["x_copy"] for n, v in c["variants"].items() if n.startswith("ours") and v["error"] is None)
                     for c in timed])
    sd = np.array([c["variants"][c["sdpa_best"]]["x_copy"] for c in timed if c["sdpa_best"]])
    untimed = [c for c in cfgs if c not in timed]
    return {"configs": len(cfgs), "timed": len(timed), "untimed": untimed,
            "x_copy_min": float(xc.min()), "x_copy_max": float(xc.max()), "x_copy_median": float(np.median(xc)),
            "meet_copy": int((xc >= target_copy).sum()), "x_sdpa_min": float(xs.min()), "x_sdpa_max": float(xs.max()),
            "meet_sdpa": int((xs >= target_sdpa).sum()), "best_ours_x_copy_min": float(best.min()),
            "best_ours_x_copy_max": float(best.max()), "sdpa_best_x_copy_min": float(sd.min()),
            "sdpa_best_x_copy_max": float(sd.max()),
            "sdpa_best_names": sorted({c["sdpa_best"] for c in timed if c["sdpa_best"]})}


def decode_split_sweeps(rows: list[dict], gpu: str = "h100") -> list[dict]:
    """The splits group: per swept configuration, ours' median ms (with its trials' range) at each
    split count timed, the timed best, the launcher's default (``default_splits``), the model's
    choice (``model_splits``: ``flashsim.decode_splits.propose`` on ``gpu`` with the kernel's tile
    as Bc) and flash-attention's heuristic (``fa2_choice`` of the same call), and where the model's
    and the heuristic's choices fall against the timed points (the time of the nearest split count
    timed, and its ratio to the best)."""
    from flashsim import Tiling, Workload
    from flashsim.decode_splits import propose

    out: dict[tuple, dict] = {}
    for c in decode_bench(rows, "splits"):
        key = tuple(c["config"].values())
        s = out.setdefault(key, {"config": c["config"], "tile_keys": c["tile_keys"], "default": c["default_splits"],
                                 "model": c["model_splits"], "splits": [], "ms": [], "lo": [], "hi": [], "failed": []})
        v = c["variants"].get(DECODE_OURS)
        if v is None:
            continue
        if v["error"] is None:
            s["splits"].append(int(c["num_splits"]))
            s["ms"].append(v["ms"])
            s["lo"].append(v["ms_min"])
            s["hi"].append(v["ms_max"])
        else:
            s["failed"].append((int(c["num_splits"]), v["error"]))
    res = []
    for s in out.values():
        cf = s["config"]
        w = Workload(batch=cf["batch"], heads=cf["heads"], kv_heads=cf["kv_heads"], seq_len_q=cf["nq"],
                     seq_len_k=cf["nk"], head_dim=cf["d"], dtype=cf["dtype"])
        pr = propose(w, gpu, Tiling(1, int(s["tile_keys"])), page_size=cf["page_size"] or None)
        s["model_check"], s["fa2"] = pr.num_splits, pr.fa2_choice
        if s["ms"]:
            i = int(np.argmin(s["ms"]))
            s["best"], s["best_ms"] = s["splits"][i], s["ms"][i]
            for name in ("model", "fa2", "default"):
                j = int(np.argmin([abs(math.log(x / s[name])) for x in s["splits"]]))
                s[f"{name}_nearest"], s[f"{name}_nearest_x_best"] = s["splits"][j], s["ms"][j] / s["best_ms"]
        res.append(s)
    return res


def decode_pages(rows: list[dict]) -> dict:
    """The pages group: ours' (``DECODE_OURS``) and every other timed ``ours*`` variant's median ms
    per page size (0: contiguous), with the trials' range, and the slowdown paged/contiguous."""
    cfgs = decode_bench(rows, "pages")
    out = {"config": cfgs[0]["config"] | {"page_size": None}, "num_splits": cfgs[0]["num_splits"],
           "tile_keys": cfgs[0]["tile_keys"], "pages": [c["config"]["page_size"] for c in cfgs], "variants": {}}
    for name in sorted({n for c in cfgs for n in c["variants"]}):
        vs = [c["variants"].get(name) for c in cfgs]
        out["variants"][name] = {"ms": np.array([v["ms"] if v and v["error"] is None else math.nan for v in vs]),
                                 "lo": np.array([v["ms_min"] if v and v["error"] is None else math.nan for v in vs]),
                                 "hi": np.array([v["ms_max"] if v and v["error"] is None else math.nan for v in vs])}
    i0 = out["pages"].index(0)
    for v in out["variants"].values():
        paged = np.array([m for p, m in zip(out["pages"], v["ms"]) if p])
        v["slowdown_min"] = float(np.nanmin(paged) / v["ms"][i0])
        v["slowdown_max"] = float(np.nanmax(paged) / v["ms"][i0])
    return out


def decode_compare_claims(recs: list[dict]) -> dict:
    """The committed comparison of the reference decode kernels (``flashsim compare`` of the decode
    record): launches whose loads and whose stores equal the walker's, to the byte, and the main
    launches' load excess per thread block (3 sectors, 96 bytes, in a record of the kernel that
    read its length in every warp, 0 since it reads it once per block); the DRAM reads' errors (main launches, combine
    launches: relative to the model's bytes) and the measured DRAM writes, which the model (every
    dirty line still in the L2 when the launch ends) puts at 0."""
    main = [r for r in recs if r["sim_launch"] != "decode_combine"]
    comb = [r for r in recs if r["sim_launch"] == "decode_combine"]

    def rd(r):
        return r["dram_read_bytes"] / r["sim_dram_read_bytes"] - 1

    def blocks(r):  # the launch's thread blocks, from its grid "(x, y, z)"
        return int(np.prod([int(v) for v in str(r["sim_grid"]).strip("()").split(",")]))

    return {"launches": len(recs), "main": len(main), "combine": len(comb),
            "ld_exact": sum(r["lsu_ld_bytes"] == r["sim_lsu_ld_bytes"] for r in recs),
            "st_exact": sum(r["lsu_st_bytes"] == r["sim_lsu_st_bytes"] for r in recs),
            "combine_ld_exact": sum(r["lsu_ld_bytes"] == r["sim_lsu_ld_bytes"] for r in comb),
            "main_ld_excess_per_block": sorted({(r["lsu_ld_bytes"] - r["sim_lsu_ld_bytes"]) / blocks(r) for r in main}),
            "ld_excess_rel_max": max((r["lsu_ld_bytes"] - r["sim_lsu_ld_bytes"]) / r["sim_lsu_ld_bytes"] for r in recs),
            "main_read_err_max": max(abs(rd(r)) for r in main),
            "main_read_err_median": float(np.median([abs(rd(r)) for r in main])),
            "combine_read_err_min": min(rd(r) for r in comb), "combine_read_err_max": max(rd(r) for r in comb),
            "combine_read_excess_max": max(r["dram_read_bytes"] - r["sim_dram_read_bytes"] for r in comb),
            "sim_write_max": max(r["sim_dram_write_bytes"] for r in recs),
            "write_max": max(r["dram_write_bytes"] for r in recs),
            "main_write_per_ms_max": max(r["dram_write_bytes"] / (r["time_ns"] / 1e6) for r in main),
            "timed_write_max": max(r["sim_dram_write_timed_bytes"] for r in recs),
            # the background rate compare used: (timed - modelled writes) / measured duration
            "background_rate": float(np.median([(r["sim_dram_write_timed_bytes"] - r["sim_dram_write_bytes"])
                                                / (r["time_ns"] * 1e-9) for r in main]))}


__all__ += ["DECODE_KEYS", "DECODE_OURS", "decode_bench", "decode_main_claims", "decode_split_sweeps", "decode_pages",
            "decode_compare_claims"]
