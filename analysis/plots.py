"""Plots of measured traffic over the simulated curves and the bounds (matplotlib, Agg), in the
palette of :data:`flashsim.plot.COLORS` (one colour per algorithm)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from flashsim.api import simulate  # noqa: E402
from flashsim.bounds import bounds  # noqa: E402
from flashsim.config import DTYPE_BYTES, Tiling  # noqa: E402
from flashsim.plot import COLORS, HANDLE_LENGTH, THEOREM2_LABEL  # noqa: E402

from .configs import sim_options, workload_of  # noqa: E402


def _sim_bytes(cfg: dict, algo: str, tiling: Tiling | None) -> int:
    r = simulate(workload_of(cfg), algo, cfg["pass"], tiling, **sim_options(cfg))
    return r.io.sectors * 32


def plot_m_sweep(configs: list[dict], path: Path) -> Path | None:
    """FlashAttention-1: measured LSU bytes against the SRAM budget M, with the simulated curve,
    Theorem 2's N²d²/M and the lower bound."""
    pts = [c for c in configs if c["kernel"] == "flash1" and c["pass"] == "fwd" and not c["causal"]
           and c["dtype"] == "fp16" and c["seq_len_q"] == 2048 and c["head_dim"] == 64]
    if len(pts) < 2:
        return None
    pts.sort(key=lambda c: c["sram_bytes"])
    base = pts[0]
    eb = DTYPE_BYTES[base["dtype"]]
    ms = np.unique(np.geomspace(4 * 1024, 256 * 1024, 40).astype(int) // 64 * 64)
    sim, thm, low = [], [], []
    for m in ms:
        t = Tiling.from_sram(int(m) // eb, base["head_dim"])
        sim.append(_sim_bytes(base, "flash1", t))
        b = bounds(workload_of(base), int(m) // eb)
        thm.append(b["flash"] * eb)
        low.append(b["lower_bound"] * eb)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.loglog(ms / 1024, np.array(sim) / 1e9, "-", color=COLORS["flash1"], label="simulated (walker, sectors)")
    ax.loglog(ms / 1024, np.array(thm) / 1e9, ":", color="tab:gray", label=THEOREM2_LABEL)
    ax.loglog(ms / 1024, np.array(low) / 1e9, "-.", color="k", lw=1, label="Proposition 3 lower bound")
    ax.loglog([c["sram_bytes"] / 1024 for c in pts], [c["lsu_bytes"] / 1e9 for c in pts], "o",
              color=COLORS["flash1"], mec="k", label="measured (ncu, LSU)")
    ax.set_xlabel("SRAM budget M per thread block (KiB)")
    ax.set_ylabel("global-memory traffic (GB)")
    ax.set_title(f"FlashAttention-1 forward, N={base['seq_len_q']}, d={base['head_dim']}, "
                 f"B·H={base['batch'] * base['heads']}, fp16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_n_sweep(configs: list[dict], path: Path) -> Path | None:
    """Measured LSU bytes against N for FlashAttention-2 and standard attention, with simulated curves."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    drawn = False
    # the palette's colour per algorithm; d = 64 solid with filled markers, d = 128 dashed with open ones
    for kernel, d, ls, face in (("flash2", 64, "-", None), ("flash2", 128, "--", "none"), ("standard", 64, "-", None)):
        pts = [c for c in configs if c["kernel"] == kernel and c["pass"] == "fwd" and not c["causal"]
               and c["dtype"] == "fp16" and c["head_dim"] == d]
        tile = ""
        if kernel == "flash2":  # the N sweep is the tiling measured at the most N (others vary the tiling)
            by_tile: dict[tuple, list[dict]] = {}
            for c in pts:
                by_tile.setdefault((c["block_m"], c["block_n"]), []).append(c)
            if by_tile:
                t, pts = max(by_tile.items(), key=lambda kv: len({c["seq_len_q"] for c in kv[1]}))
                tile = f", {t[0]}x{t[1]}"
        if len({c["seq_len_q"] for c in pts}) < 2:
            continue
        pts.sort(key=lambda c: c["seq_len_q"])
        ns = [c["seq_len_q"] for c in pts]
        ax.loglog(ns, [c["lsu_bytes"] / 1e9 for c in pts], "o", color=COLORS[kernel], mfc=face,
                  label=f"{kernel} d={d}{tile} measured")
        ax.loglog(ns, [c["sim_lsu_bytes"] / 1e9 for c in pts], ls, color=COLORS[kernel],
                  label=f"{kernel} d={d}{tile} simulated")
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("global-memory traffic (GB)")
    ax.set_title("Forward pass, B·H = 16, fp16: measured (ncu LSU) vs simulated")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, handlelength=HANDLE_LENGTH)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_scatter(configs: list[dict], path: Path) -> Path:
    """Measured against simulated, every configuration, at the LSU and DRAM levels."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, lvl, title in ((axes[0], "lsu", "LSU (requested from global memory)"),
                           (axes[1], "dram", "DRAM (after the L2; simple model)")):
        for kernel in ("flash2", "flash1", "standard", "decode"):
            pts = [c for c in configs if c["kernel"] == kernel]
            if pts:
                ax.loglog([c[f"sim_{lvl}_bytes"] / 1e9 for c in pts], [c[f"{lvl}_bytes"] / 1e9 for c in pts],
                          "o", color=COLORS[kernel], label=kernel, alpha=0.8)
        lo = min(min(c[f"sim_{lvl}_bytes"], c[f"{lvl}_bytes"]) for c in configs if c[f"{lvl}_bytes"] > 0) / 1e9
        hi = max(max(c[f"sim_{lvl}_bytes"], c[f"{lvl}_bytes"]) for c in configs) / 1e9
        ax.loglog([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = simulated")
        ax.set_xlabel("simulated (GB)")
        ax.set_ylabel("measured (GB)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_all(configs: list[dict], out: Path) -> list[Path]:
    out = Path(out)
    made = [plot_m_sweep(configs, out / "theorem2_m_sweep.png"), plot_n_sweep(configs, out / "n_sweep.png"),
            plot_scatter(configs, out / "measured_vs_simulated.png")]
    return [p for p in made if p is not None]
