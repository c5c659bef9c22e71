"""Every plot the simulator draws: sweeps, the report's two-panel figures, a sweep over GPU
presets, traffic breakdowns (matplotlib, Agg backend: files only, no display).

matplotlib is imported on first use (:func:`_pyplot`), not with this module: it takes about half
a second, and the commands that never plot (``flashsim simulate``, ``bounds``) should not pay it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .sweep import BOUND_KEYS, field_of, group_by


def _pyplot():
    """matplotlib.pyplot on the Agg backend, imported on the first plot (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: The one palette: a colour per algorithm, the same in every figure (``flashsim report`` and
#: ``sweep``, ``analysis.plots``, the notebooks, which import it).  The simulator's algorithms
#: first; then the attention implementations the measurements time beside them: torch's naive
#: attention is standard attention (S and P in HBM) and gets its colour, SDPA's backends and
#: our kernels (``ours``) their own.
COLORS = {
    "standard": "tab:red", "flash1": "tab:blue", "flash2": "tab:green", "smallcache": "tab:purple",
    "naive": "tab:red", "sdpa": "tab:orange", "sdpa_flash": "tab:orange", "sdpa_cudnn": "tab:brown",
    "sdpa_mem_eff": "tab:pink", "ours": "tab:cyan", "decode": "tab:olive", "sdpa_math": "tab:gray",
    "copy": "k",
}
#: Line styles of the passes (forward solid, backward dashed).
PASS_STYLE = {"fwd": "-", "bwd": "--", "fwd+bwd": ":"}
#: Legend handles long enough to show a pass's dashes (matplotlib's default, 2 font sizes, is not).
HANDLE_LENGTH = 4.0
#: Theorem 2 is a Θ: its curve (Algorithm 1's count with the ceiling of Tc dropped, which
#: :mod:`flashsim.bounds` makes explicit) can fall below the lower bound where Tc = 4Nd/M < 1, so
#: its legend says it is no bound.
THEOREM2_LABEL = "Theorem 2, Θ(N²d²/M) up to constants (not a bound)"


def color_of(name: str) -> str | None:
    """The palette's colour of an algorithm or implementation; ``ours_*`` variants get ``ours``'s,
    unknown names None (matplotlib's cycle)."""
    if name in COLORS:
        return COLORS[name]
    return COLORS["ours"] if str(name).startswith("ours") else None


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
_BOUND_STYLE = {"bound_lower": ("k", "-.", "lower bound"), "bound_flash": ("tab:gray", ":", THEOREM2_LABEL),
                "bound_saha_ye": ("tab:purple", "-.", "Saha & Ye"), "bound_standard": ("tab:brown", ":", "Algorithm 0")}


def _label(f: str) -> str:
    return LABELS.get(f, f)


def plot_sweep(records: list[dict], x: str, y: str = "hbm_bytes", by: str = "algo", path=None, bounds: bool = True,
               title: str | None = None, bound_keys=("bound_lower", "bound_flash")):
    """Log-log plot of ``y`` against ``x``, one line per value of ``by`` (per pass too if several).

    With ``bounds=True`` and bound fields in the records, the bounds in ``bound_keys`` (default:
    the lower bound and Theorem 2's FlashAttention count, labelled as a Θ that is no bound) are
    drawn in black and grey, in bytes
    when ``y`` is a byte count and in elements when it is ``hbm_elements`` (other ``y`` get no
    bound lines); they come from the first series, as the bounds do not depend on the
    algorithm.  With ``by="algo"`` each algorithm has its :data:`COLORS` colour and each pass its
    :data:`PASS_STYLE`.  Saves to ``path`` when given; returns the figure.
    """
    plt = _pyplot()
    xf = field_of(x)
    fig, ax = plt.subplots(figsize=(9.6, 4.4))
    passes = {r.get("pass") for r in records}
    series = group_by(records, (lambda r: (r.get(by), r.get("pass"))) if len(passes) > 1 else by)
    for key, rs in series.items():
        rs = sorted((r for r in rs if r.get(xf) and r.get(y)), key=lambda r: r[xf])
        if not rs:
            continue
        label = f"{key[0]} {key[1]}" if isinstance(key, tuple) else str(key)
        style = {}
        if by == "algo":  # the palette's colour per algorithm, a line style per pass
            name = key[0] if isinstance(key, tuple) else key
            style = dict(color=color_of(name), ls=PASS_STYLE.get(rs[0].get("pass"), "-"))
        ax.plot([r[xf] for r in rs], [r[y] for r in rs], marker="o", ms=3, label=label, **style)
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
                ax.plot(xs, ys, color=color, ls=ls, lw=1.2, label=lab + (" (fwd)" if passes - {"fwd"} else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(_label(xf))
    ax.set_ylabel(_label(y))
    ax.grid(True, which="both", alpha=0.3)
    # beside the axes: a legend of eight lines would hide the curves it names
    ax.legend(fontsize=8, handlelength=HANDLE_LENGTH, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
    plt = _pyplot()
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


def plot_two_panels(recs: Sequence[dict], x: str, path: Path, title: str, xlabel: str, gpu_for_bytes: str,
                    bytes_label: str = "HBM traffic (GB)") -> None:
    """The report's figures.  Left: HBM GB against ``x`` per algorithm and pass (the records of
    ``gpu_for_bytes``; ``bytes_label`` on the y axis), with the forward lower bound; right: the
    roofline time per GPU (marker per GPU).  Colours per algorithm (:data:`COLORS`), line styles
    per pass (:data:`PASS_STYLE`), with legend handles long enough to tell them apart."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = ["o", "s", "^", "D"]
    gpus = list(dict.fromkeys(r["gpu"] for r in recs))
    series: dict[tuple, list[dict]] = {}
    for r in recs:
        series.setdefault((r["gpu"], r["algo"], r["pass"]), []).append(r)
    for (g, a, p), rs in series.items():
        rs = sorted(rs, key=lambda r: r[x])
        xs = [r[x] for r in rs]
        style = dict(color=color_of(a), ls=PASS_STYLE.get(p, "-"))
        if g == gpu_for_bytes:
            ax1.plot(xs, [r["hbm_bytes"] / 1e9 for r in rs], marker="o", ms=3, label=f"{a} {p}", **style)
        ax2.plot(xs, [r["time_s"] * 1e3 for r in rs], marker=markers[gpus.index(g) % 4], ms=3,
                 label=f"{a} {p}, {g}", **style)
    lb = sorted((r for r in series.get((gpu_for_bytes, recs[0]["algo"], recs[0]["pass"]), [])
                 if r.get("bound_lower_bytes")), key=lambda r: r[x])
    if lb:
        ax1.plot([r[x] for r in lb], [r["bound_lower_bytes"] / 1e9 for r in lb], color="k", ls="-.", lw=1,
                 label="lower bound (fwd)")
    ax1.set_ylabel(bytes_label)
    ax2.set_ylabel("roofline time (ms)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
    ax1.legend(fontsize=7, loc="best", handlelength=HANDLE_LENGTH)
    ax2.legend(fontsize=6, ncol=2, loc="best", handlelength=HANDLE_LENGTH)
    fig.suptitle(title, fontsize=10)
    # fixed margins: tight_layout would draw the figure once more just to measure it
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.9, wspace=0.22)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_gpu_bars(recs: Sequence[dict], path: Path) -> None:
    """A sweep over GPU presets: roofline time per preset, one bar per algorithm and pass."""
    plt = _pyplot()
    gpus = list(dict.fromkeys(r["gpu"] for r in recs))
    series = list(dict.fromkeys((r["algo"], r["pass"]) for r in recs))
    t = {(r["gpu"], r["algo"], r["pass"]): r["time_s"] * 1e3 for r in recs}
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    xs = np.arange(len(gpus))
    for k, (algo, p) in enumerate(series):
        ax.bar(xs + k * width, [t.get((g, algo, p), 0.0) for g in gpus], width, label=f"{algo} {p}",
               color=color_of(algo), hatch="//" if p == "bwd" else None, edgecolor="white")
    ax.set_xticks(xs + width * (len(series) - 1) / 2, gpus)
    ax.set_ylabel("roofline time (ms)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.12, top=0.95)
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["plot_sweep", "plot_breakdown", "plot_two_panels", "plot_gpu_bars", "LABELS", "COLORS", "PASS_STYLE",
           "HANDLE_LENGTH", "THEOREM2_LABEL", "color_of"]
