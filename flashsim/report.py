"""The main job: the IO analysis of standard attention vs FlashAttention-1 vs FlashAttention-2.

:func:`run_report` takes the paper's GPT-2-medium attention (N = 1024, d = 64, 16 heads,
batch 64, fp16; FlashAttention paper, section 4.1 and Figure 2) on the A100 and H100 presets and
writes, into one folder:

* ``io_table.csv``: per GPU, algorithm and pass, the HBM bytes read/written, the FLOPs, the
  roofline time and whether that time is memory- or compute-bound;
* ``m_sweep.csv`` / ``m_sweep.png``: forward HBM traffic against the on-chip memory M (hence
  the block size Bc = ⌈M/4d⌉), the paper's Figure 2 middle;
* ``n_sweep.csv`` / ``n_sweep.png``: HBM traffic against the sequence length N, with the fitted
  exponent of N per algorithm (2 for all three at fixed M: standard moves Θ(N²) for S and P,
  the flash algorithms Θ(N²d²/M) for the K, V reloads).

It also prints the table.  :func:`simulate_summary` is the JSON-ready summary of one simulation
that ``flashsim simulate --json`` prints; :func:`format_table` is the plain-text table printer
shared with the CLI.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .api import SimResult
from .config import Hardware, Workload, cdiv

#: The paper's GPT-2-medium attention: seq. length 1024, head dim 64, 16 heads, batch 64, fp16.
DEFAULT_WORKLOAD = Workload(batch=64, heads=16, seq_len_q=1024, head_dim=64, dtype="fp16")
#: GPU presets of the report (``a100`` is the 40 GB SXM4 part, as in the paper's Figure 2).
DEFAULT_GPUS = ("a100", "h100")
DEFAULT_ALGOS = ("standard", "flash1", "flash2")
DEFAULT_PASSES = ("fwd", "bwd")


def optional_module(name: str):
    """``flashsim.<name>`` if it is installed, else None (the CLI works with what exists)."""
    try:
        return importlib.import_module(f"flashsim.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"flashsim.{name}":
            raise
        return None


def _plain(x):
    """Numbers and containers in JSON-ready form (numpy scalars become Python ones; inf/nan stay
    floats, which ``json.dumps`` writes as Infinity/NaN)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return x.item()
    return x


def simulate_summary(res: SimResult, gpu: Hardware, sram_elems: int | None) -> dict:
    """Everything ``flashsim simulate --json`` prints for one simulation.

    Bytes and sectors are the walker's (exact, per 32-byte sector); ``closed_form_agrees``
    says the algorithm's closed form gives the same element count for every tensor and
    direction.  ``bounds`` (at M = ``sram_elems``), ``flops`` and ``roofline`` come from their
    modules and are None where a module is not installed.
    """
    w = res.workload
    io = res.io
    out = {
        "algorithm": res.algorithm,
        "pass": res.pass_,
        "options": dict(res.options),
        "workload": {
            "batch": w.batch, "heads": w.heads, "kv_heads": w.hkv, "seq_len_q": w.nq, "seq_len_k": w.nk,
            "head_dim": w.d, "dtype": w.dtype, "causal": w.causal,
        },
        "gpu": gpu.name,
        "sram_elems": sram_elems,
        "sram_bytes": None if sram_elems is None else sram_elems * w.elem_bytes,
        "block_m": None if res.tiling is None else res.tiling.block_m,
        "block_n": None if res.tiling is None else res.tiling.block_n,
    }
    if res.algorithm == "smallcache":  # one s x s tile; recorded as block_m = block_n = s, as sweeps do
        from .algorithms import get_algorithm

        extra = {k: res.options[k] for k in ("tile", "sram_elems") if k in res.options}
        out["block_m"] = out["block_n"] = get_algorithm("smallcache").tile_side(w, res.tiling, **extra)
    out.update(io.to_dict())
    out["sectors"] = io.sectors
    out["hbm_read_sectors"], out["hbm_write_sectors"] = io.read_sectors, io.write_sectors
    out["per_launch"] = {
        name: {"hbm_read_bytes": c.read_bytes, "hbm_write_bytes": c.write_bytes, "hbm_bytes": c.bytes,
               "sectors": c.sectors}
        for name, c in io.per_launch.items()
    }
    out["closed_form_agrees"] = res.agrees
    out["flops"] = None
    fl = optional_module("flops")
    if fl is not None:
        out["flops"] = fl.flops(w, res.pass_, res.algorithm, tiling=res.tiling, **res.options)
    out["bounds"] = None
    bd = optional_module("bounds")
    if bd is not None and sram_elems is not None:
        out["bounds"] = bd.bounds(w, sram_elems)
    out["roofline"] = None
    rf = optional_module("roofline")
    if rf is not None:
        out["roofline"] = rf.roofline(res, gpu)
    return _plain(out)


# --------------------------------------------------------------------------------------------
# Plain-text tables


def fmt_num(x, digits: int = 3) -> str:
    """Integers with thousands separators, floats with ``digits`` significant figures."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x) or x == 0:
            return str(x) if x else "0"
        if abs(x) >= 1e6 or abs(x) < 1e-3:
            return f"{x:.{digits}g}"
        decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
        return f"{x:,.{decimals}f}"
    return str(x)


def format_table(headers: Sequence[str], rows: Iterable[Sequence], right: Sequence[bool] | None = None) -> str:
    """An aligned plain-text table; cells are formatted with :func:`fmt_num`.  ``right`` says
    which columns to right-align (default: those whose cells are all numbers)."""
    cells = [[c if isinstance(c, str) else fmt_num(c) for c in r] for r in rows]
    raw = [list(r) for r in rows] if not isinstance(rows, list) else rows
    if right is None:
        right = [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in raw if r[i] is not None)
                 and any(r[i] is not None for r in raw) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(vals):
        return "  ".join(v.rjust(wd) if rt else v.ljust(wd) for v, wd, rt in zip(vals, widths, right)).rstrip()

    sep = "  ".join("-" * wd for wd in widths)
    return "\n".join([line(list(headers)), sep] + [line(r) for r in cells])


# --------------------------------------------------------------------------------------------
# The report


def _base(w: Workload) -> dict:
    return {"batch": w.batch, "heads": w.heads, "kv_heads": w.hkv, "seq_len_q": w.nq, "seq_len_k": w.nk,
            "head_dim": w.d, "dtype": w.dtype, "causal": w.causal}


def io_records(workload: Workload = DEFAULT_WORKLOAD, gpus: Sequence[str] = DEFAULT_GPUS,
               algos: Sequence[str] = DEFAULT_ALGOS, passes: Sequence[str] = DEFAULT_PASSES) -> list[dict]:
    """One :func:`flashsim.sweep.run_one` record per (GPU, algorithm, pass), walked (exact sectors,
    checked against the closed form).

    Tiled algorithms run with M = the GPU's shared memory per thread block (in elements of the
    workload's dtype) and the paper's block-size rule Bc = ⌈M/4d⌉, Br = min(Bc, d).
    """
    from .sweep import run_one

    return [run_one(_base(workload), a, p, gpu=g, walk=True) for g in gpus for a in algos for p in passes]


def io_table(recs: Sequence[dict]) -> str:
    """The report's main table: GB read/written, GFLOP, roofline time and what bounds it."""
    rows = []
    for r in recs:
        rows.append([
            r["gpu"], r["algo"], r["pass"],
            "-" if r["block_m"] is None else f"{r['block_m']}x{r['block_n']}",
            f"{r['hbm_read_bytes'] / 1e9:.3f}", f"{r['hbm_write_bytes'] / 1e9:.3f}", f"{r['hbm_bytes'] / 1e9:.3f}",
            f"{r['flops'] / 1e9:,.0f}", f"{r['time_s'] * 1e3:.3f}", r["bound"],
        ])
    return format_table(["gpu", "algorithm", "pass", "Br x Bc", "read GB", "write GB", "total GB", "GFLOP",
                         "roofline ms", "bound"], rows, right=[False, False, False, True] + [True] * 5 + [False])


def _sweep(w: Workload, param: str, values, gpus, algos, passes) -> list[dict]:
    from .sweep import sweep

    recs = []
    for g in gpus:
        # closed forms only: instant at every size, and the tests hold them equal to the walker
        recs += sweep(_base(w), param, values, algos=algos, passes=passes, gpu=g, walk=False, on_error="raise")
    return recs


def exponents(recs: Sequence[dict], x: str, y: str = "hbm_bytes") -> list[dict]:
    """The fitted exponent b of y ∝ x^b per (GPU, algorithm, pass)."""
    from .sweep import fit_exponent

    out = []
    keys = dict.fromkeys((r["gpu"], r["algo"], r["pass"]) for r in recs)
    for g, a, p in keys:
        slope, _, r2 = fit_exponent(list(recs), x, y, where={"gpu": g, "algo": a, "pass": p})
        out.append({"gpu": g, "algo": a, "pass": p, "x": x, "y": y, "exponent": slope, "r2": r2})
    return out


def fmt_exponent(b: float) -> str:
    """A fitted exponent with sign, 3 decimals, and no "-0.000" for a slope of -1e-15."""
    return f"{round(b, 3) + 0.0:+.3f}"


def _exponent_table(fits: Sequence[dict]) -> str:
    return format_table(["gpu", "algorithm", "pass", "exponent", "r²"],
                        [[f["gpu"], f["algo"], f["pass"], fmt_exponent(f["exponent"]), f"{f['r2']:.4f}"]
                         for f in fits], right=[False, False, False, True, True])


_COLORS = {"standard": "tab:red", "flash1": "tab:blue", "flash2": "tab:green", "smallcache": "tab:purple"}
_PASS_STYLE = {"fwd": "-", "bwd": "--", "fwd+bwd": ":"}


def plot_two_panels(recs: Sequence[dict], x: str, path: Path, title: str, xlabel: str, gpu_for_bytes: str) -> None:
    """Left: HBM GB against ``x`` per algorithm and pass, with the forward lower bound; right: the
    roofline time per GPU (marker per GPU)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = ["o", "s", "^", "D"]
    gpus = list(dict.fromkeys(r["gpu"] for r in recs))
    series: dict[tuple, list[dict]] = {}
    for r in recs:
        series.setdefault((r["gpu"], r["algo"], r["pass"]), []).append(r)
    for (g, a, p), rs in series.items():
        rs = sorted(rs, key=lambda r: r[x])
        xs = [r[x] for r in rs]
        style = dict(color=_COLORS.get(a), ls=_PASS_STYLE.get(p, "-"))
        if g == gpu_for_bytes:
            ax1.plot(xs, [r["hbm_bytes"] / 1e9 for r in rs], marker="o", ms=3, label=f"{a} {p}", **style)
        ax2.plot(xs, [r["time_s"] * 1e3 for r in rs], marker=markers[gpus.index(g) % 4], ms=3,
                 label=f"{a} {p}, {g}", **style)
    lb = sorted((r for r in series.get((gpu_for_bytes, recs[0]["algo"], recs[0]["pass"]), [])
                 if r.get("bound_lower_bytes")), key=lambda r: r[x])
    if lb:
        ax1.plot([r[x] for r in lb], [r["bound_lower_bytes"] / 1e9 for r in lb], color="k", ls="-.", lw=1,
                 label="lower bound (fwd)")
    ax1.set_ylabel(f"HBM traffic (GB){'' if len(gpus) == 1 else f', M of {gpu_for_bytes}'}")
    ax2.set_ylabel("roofline time (ms)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
    ax1.legend(fontsize=7, loc="best")
    ax2.legend(fontsize=6, ncol=2, loc="best")
    fig.suptitle(title, fontsize=10)
    # fixed margins: tight_layout would draw the figure once more just to measure it
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.9, wspace=0.22)
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: The M sweep: Bc = ⌈M/4d⌉ from 16 to 512 rows at d = 64 (the paper's Figure 2 middle varies the
#: block size of FlashAttention's forward on A100 at N = 1024, d = 64).
M_SWEEP_BLOCKS = (16, 32, 64, 128, 256, 512)
N_SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)


def run_report(out: str | Path = "flashsim-report", workload: Workload = DEFAULT_WORKLOAD,
               gpus: Sequence[str] = DEFAULT_GPUS, algos: Sequence[str] = DEFAULT_ALGOS,
               echo: Callable[[str], None] | None = print, plots: bool = True) -> dict:
    """Run the report, write its files into ``out`` and return what it computed:
    ``{"io": records, "m_sweep": records, "n_sweep": records, "m_exponents": fits,
    "n_exponents": fits, "files": {name: Path}}``.

    ``echo`` receives the text the CLI prints (None: print nothing).
    """
    from .sweep import write_csv

    say = echo or (lambda s: None)
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    w = workload
    files: dict[str, Path] = {}
    say(f"flashsim report: attention with batch {w.batch}, {w.heads} heads, N = {w.nq}, d = {w.d}, {w.dtype}"
        f"{', causal' if w.causal else ''} (the paper's GPT-2 medium)")
    say("M = the GPU's shared memory per thread block; Bc = ⌈M/4d⌉, Br = min(Bc, d) (the paper's rule); "
        "roofline = max(FLOPs at peak, bytes at HBM bandwidth)")
    say("")

    io = io_records(w, gpus, algos, DEFAULT_PASSES)
    say(io_table(io))
    bad = [f"{r['gpu']} {r['algo']} {r['pass']}" for r in io if not r["agrees"]]
    say(f"walker and closed form agree on every run: {'yes' if not bad else 'NO: ' + ', '.join(bad)}")
    files["io_table"] = out / "io_table.csv"
    write_csv(io, files["io_table"])
    for g in dict.fromkeys(r["gpu"] for r in io):
        t = {r["algo"]: r for r in io if r["gpu"] == g and r["pass"] == "fwd"}
        notes = []
        if "flash1" in t:
            notes.append(f"flash1 re-streams Q, O, m, l once per key block, Tc = ⌈Nk/Bc⌉ = "
                         f"{cdiv(w.nk, t['flash1']['block_n'])}")
        if "flash2" in t:
            notes.append(f"flash2 re-reads K, V once per query block, Tr = ⌈Nq/Br⌉ = "
                         f"{cdiv(w.nq, t['flash2']['block_m'])} (Br = min(Bc, d))")
        if notes:
            say(f"{g}: " + "; ".join(notes))

    # M sweep: forward traffic against on-chip memory
    m_values = [4 * w.d * b for b in M_SWEEP_BLOCKS]
    m_recs = _sweep(w, "M", m_values, gpus, algos, ("fwd",))
    m_fits = exponents(m_recs, "M")
    files["m_sweep"] = out / "m_sweep.csv"
    write_csv(m_recs, files["m_sweep"])
    say("")
    say(f"M sweep (forward, M = {m_values[0]:,} .. {m_values[-1]:,} elements, Bc = {M_SWEEP_BLOCKS[0]} .. "
        f"{M_SWEEP_BLOCKS[-1]}): HBM bytes ∝ M^exponent")
    first = [f for f in m_fits if f["gpu"] == m_fits[0]["gpu"]]  # bytes do not depend on the GPU here
    say(_exponent_table(first))

    # N sweep: traffic against sequence length
    n_recs = _sweep(w, "N", N_SWEEP, gpus, algos, DEFAULT_PASSES)
    n_fits = exponents(n_recs, "N")
    files["n_sweep"] = out / "n_sweep.csv"
    write_csv(n_recs, files["n_sweep"])
    say("")
    say(f"N sweep (N = {N_SWEEP[0]:,} .. {N_SWEEP[-1]:,}, M of each GPU): HBM bytes ∝ N^exponent")
    say(_exponent_table(n_fits))

    if plots:
        files["m_sweep_png"] = out / "m_sweep.png"
        plot_two_panels(m_recs, "sram_elems", files["m_sweep_png"],
                        f"forward, N = {w.nq}, d = {w.d}, {w.dtype}, B·H = {w.bh}: effect of the SRAM size M",
                        "M (elements)", m_recs[0]["gpu"])
        files["n_sweep_png"] = out / "n_sweep.png"
        plot_two_panels(n_recs, "seq_len_q", files["n_sweep_png"],
                        f"d = {w.d}, {w.dtype}, B·H = {w.bh}: effect of the sequence length N",
                        "N (tokens)", n_recs[0]["gpu"])
    say("")
    say(f"wrote {len(files)} files to {out}/ in {time.perf_counter() - t0:.1f} s:")
    for p in files.values():
        say(f"  {p}")
    return {"io": io, "m_sweep": m_recs, "n_sweep": n_recs, "m_exponents": m_fits, "n_exponents": n_fits,
            "files": files}
