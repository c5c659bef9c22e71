"""Plots of sweeps and traffic breakdowns (matplotlib, Agg backend: files only, no display)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .sweep import BOUND_KEYS, group_by  # noqa: E402

#: axis labels with units for the usual record fields
LABELS = {
    "sram_elems": "SRAM size M (elements)",
    "seq_len_q": "sequence length N (tokens)",
    "seq_len_k": "key length Nk (tokens)",
    "head_dim": "head dimension d",
    "block_m": "block rows Br",
    "block_n": "block columns Bc",
    "batch": "batch B",
    "heads": "heads H",
    "hbm_bytes": "HBM traffic (bytes)",
    "hbm_read_bytes": "HBM reads (bytes)",
    "hbm_write_bytes": "HBM writes (bytes)",
    "hbm_elements": "HBM traffic (elements)",
    "hbm_sectors": "HBM traffic (32-byte sectors)",
    "flops": "FLOPs",
    "matmul_flops": "matmul FLOPs",
    "time_s": "roofline time (s)",
    "arithmetic_intensity": "arithmetic intensity (FLOP/byte)",
}
_ALIAS = {"M": "sram_elems", "N": "seq_len_q", "d": "head_dim", "Br": "block_m", "Bc": "block_n"}
_BOUND_STYLE = {"bound_lower": ("k", "--", "lower bound"), "bound_flash": ("tab:gray", ":", "Theorem 2 (flash)"),
                "bound_saha_ye": ("tab:purple", "-.", "Saha & Ye"), "bound_standard": ("tab:brown", ":", "Algorithm 0")}


def _label(f: str) -> str:
    return LABELS.get(f, f)


def plot_sweep(records: list[dict], x: str, y: str = "hbm_bytes", by: str = "algo", path=None, bounds: bool = True,
               title: str | None = None, bound_keys=("bound_lower", "bound_flash")):
    """Log-log plot of ``y`` against ``x``, one line per value of ``by`` (per pass too if several).

    With ``bounds=True`` and bound fields in the records, the bounds in ``bound_keys`` (default:
    the lower bound and Theorem 2's FlashAttention count) are drawn as dashed lines, in bytes
    when ``y`` is a byte count and in elements when it is ``hbm_elements`` (other ``y`` get no
    bound lines); they come from the first series, as the bounds do not depend on the
    algorithm.  Saves to ``path`` when given; returns the figure.
    """
    xf = _ALIAS.get(x, x)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    passes = {r.get("pass") for r in records}
    series = group_by(records, (lambda r: (r.get(by), r.get("pass"))) if len(passes) > 1 else by)
    for key, rs in series.items():
        rs = sorted((r for r in rs if r.get(xf) and r.get(y)), key=lambda r: r[xf])
        if not rs:
            continue
        label = f"{key[0]} {key[1]}" if isinstance(key, tuple) else str(key)
        ax.plot([r[xf] for r in rs], [r[y] for r in rs], marker="o", ms=3, label=label)
    if bounds and records and (y.endswith("bytes") or y == "hbm_elements"):
        in_bytes = y.endswith("bytes")
        first = next(iter(series.values()))
        pts = {}
        for r in first:
            if r.get(xf):
                pts.setdefault(r[xf], r)
        xs = sorted(pts)
        for bk in bound_keys:
            if bk not in BOUND_KEYS.values():
                raise ValueError(f"bound_keys: {bk!r} is not one of {list(BOUND_KEYS.values())}")
            f = bk + "_bytes" if in_bytes else bk
            ys = [pts[v].get(f) for v in xs]
            if xs and all(v is not None and v > 0 for v in ys):
                color, ls, lab = _BOUND_STYLE[bk]
                ax.plot(xs, ys, color=color, ls=ls, lw=1.2, label=lab)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(_label(xf))
    ax.set_ylabel(_label(y))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=150)
        plt.close(fig)
    return fig


def plot_breakdown(sim_result, path=None, title: str | None = None, unit: str = "bytes"):
    """Stacked bars of a simulation's traffic per tensor: reads and writes, in ``unit``
    ("bytes", "elements" or "sectors").  Saves to ``path`` when given; returns the figure."""
    io = sim_result.io
    if unit not in ("bytes", "elements", "sectors"):
        raise ValueError(f"unit={unit!r}: must be 'bytes', 'elements' or 'sectors'")
    tensors = sorted({t for t, _ in io.breakdown})
    vals = {dr: np.array([getattr(io.breakdown[(t, dr)], unit) or 0 if (t, dr) in io.breakdown else 0
                          for t in tensors], dtype=float) for dr in ("read", "write")}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = np.arange(len(tensors))
    ax.bar(xs, vals["read"], label="read", color="tab:blue")
    ax.bar(xs, vals["write"], bottom=vals["read"], label="write", color="tab:orange")
    ax.set_xticks(xs, tensors)
    ax.set_xlabel("tensor")
    ax.set_ylabel(f"HBM traffic ({unit})")
    w = sim_result.workload
    ax.set_title(title or f"{sim_result.algorithm} {sim_result.pass_}: B={w.batch} H={w.heads} "
                          f"Nq={w.nq} Nk={w.nk} d={w.d} {w.dtype}")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=150)
        plt.close(fig)
    return fig


__all__ = ["plot_sweep", "plot_breakdown", "LABELS"]
