"""The ``flashsim`` command line: simulate, sweep, bounds and report.

Every bad input ends in one line ``flashsim: error: <message>`` on standard error and exit
status 2, never a traceback: the API raises ``ValueError`` naming the offending field, and
argparse's own complaints are turned into the same one-line form.  ``main(argv)`` returns the
exit status instead of exiting, so tests can call it in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

PROG = "flashsim"

#: Workload fields and the flags that set them, to point error messages at the flag.
_FIELD_FLAGS = {
    "batch": "--batch", "heads": "--heads", "kv_heads": "--kv-heads", "seq_len_q": "--seq-len",
    "seq_len_k": "--seq-len-k", "head_dim": "--head-dim", "dtype": "--dtype", "sram_bytes": "--sram-bytes",
    "sram_elems": "--sram-bytes", "block_m": "--block-m", "block_n": "--block-n", "gpu": "--gpu",
    "algo": "--algo", "pass_": "--pass",
}


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this for unknown flags, bad choices, ...
        raise UsageError(f"{message} (see '{self.prog} --help')")


# --------------------------------------------------------------------------------------------
# Shared options


def _add_workload(p: argparse.ArgumentParser, seq_len: bool = True) -> None:
    g = p.add_argument_group("workload (defaults: the paper's GPT-2-medium attention)")
    g.add_argument("--batch", "-b", type=int, default=64, metavar="B", help="batch size (default 64)")
    g.add_argument("--heads", type=int, default=16, metavar="H", help="query heads (default 16)")
    g.add_argument("--kv-heads", type=int, default=None, metavar="Hkv",
                   help="key/value heads, must divide H (grouped-query attention; default H)")
    if seq_len:
        g.add_argument("--seq-len", "-N", type=int, default=1024, metavar="N",
                       help="query sequence length Nq (default 1024)")
    g.add_argument("--seq-len-k", type=int, default=None, metavar="Nk", help="key sequence length (default Nq)")
    g.add_argument("--head-dim", "-d", type=int, default=64, metavar="d", help="head dimension (default 64)")
    g.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp16", help="storage precision (default fp16)")
    g.add_argument("--causal", action="store_true", help="causal mask, aligned bottom-right (j <= i + Nk - Nq)")


def _add_gpu(p: argparse.ArgumentParser) -> None:
    from .config import GPU_ALIASES, GPUS

    p.add_argument("--gpu", default="h100", metavar="GPU",
                   help=f"GPU preset: {', '.join(sorted(GPUS) + sorted(GPU_ALIASES))} (default h100)")


def _workload(a: argparse.Namespace, seq_len: int | None = None):
    from .config import Workload

    return Workload(batch=a.batch, heads=a.heads, kv_heads=a.kv_heads,
                    seq_len_q=a.seq_len if seq_len is None else seq_len, seq_len_k=a.seq_len_k,
                    head_dim=a.head_dim, dtype=a.dtype, causal=a.causal)


def _sram_elems(a: argparse.Namespace, w, gpu) -> int:
    """M in elements: --sram-bytes, or the GPU's shared memory per thread block."""
    if a.sram_bytes is None:
        return gpu.sram_elems(w.elem_bytes)
    if a.sram_bytes <= 0:
        raise ValueError(f"sram_bytes={a.sram_bytes}: must be a positive integer")
    m = a.sram_bytes // w.elem_bytes
    if m <= 0:
        raise ValueError(f"sram_bytes={a.sram_bytes}: holds no {w.dtype} element")
    return m


# --------------------------------------------------------------------------------------------
# Algorithm options, read from each algorithm module's OPTIONS dict


#: Algorithm options not exposed as flags: M comes from --sram-bytes (or the GPU) for every
#: algorithm, through simulate's own ``sram_elems``.
_RESERVED_OPTIONS = ("sram_elems",)


def _algorithm_options() -> dict[str, tuple[object, str, list[str]]]:
    """option name -> (default, help, algorithms taking it), over the installed algorithms."""
    from .algorithms import ALGORITHMS, get_algorithm

    opts: dict[str, tuple[object, str, list[str]]] = {}
    for name in ALGORITHMS:
        try:
            mod = get_algorithm(name)
        except ImportError:
            continue
        for opt, (default, text) in getattr(mod, "OPTIONS", {}).items():
            if opt in _RESERVED_OPTIONS:
                continue
            if opt in opts:
                opts[opt][2].append(name)
            else:
                opts[opt] = (default, text, [name])
    return opts


def _auto(text: str):
    """Option value of an option whose default is None: int, float or string."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _add_algorithm_options(p: argparse.ArgumentParser) -> list[str]:
    opts = _algorithm_options()
    if not opts:
        return []
    g = p.add_argument_group("algorithm options (passed to the algorithm; see each one's OPTIONS)")
    added = []
    for opt, (default, text, algos) in sorted(opts.items()):
        flag = "--" + opt.replace("_", "-")
        kw: dict = {"dest": "opt_" + opt, "default": argparse.SUPPRESS,
                    "help": f"{text} [{', '.join(algos)}; default {default!r}]".replace("%", "%%")}
        if isinstance(default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, (int, float, str)):
            kw["type"], kw["metavar"] = type(default), opt.upper()
        else:
            kw["type"], kw["metavar"] = _auto, opt.upper()
        try:
            g.add_argument(flag, **kw)
        except argparse.ArgumentError:  # an option that clashes with a built-in flag is not passed through
            continue
        added.append(opt)
    return added


def _chosen_options(a: argparse.Namespace, algo: str) -> dict:
    from .algorithms import get_algorithm

    given = {k[4:]: v for k, v in vars(a).items() if k.startswith("opt_")}
    takes = getattr(get_algorithm(algo), "OPTIONS", {})
    for opt in given:
        if opt not in takes:
            has = ", ".join("--" + o.replace("_", "-") for o in takes) or "none"
            raise ValueError(f"--{opt.replace('_', '-')}: algorithm {algo!r} takes no such option (its options: {has})")
    return given


# --------------------------------------------------------------------------------------------
# simulate


def _load_algorithm(algo: str):
    from .algorithms import get_algorithm

    try:
        return get_algorithm(algo)
    except ModuleNotFoundError as e:
        raise ValueError(f"algo={algo!r}: not available in this installation ({e.name} is missing)") from None


def _tiling_args(a: argparse.Namespace, algo: str, w, gpu):
    """(tiling, sram_elems) from --block-m/--block-n or --sram-bytes."""
    from .config import Tiling

    mod = _load_algorithm(algo)
    blocks = a.block_m is not None or a.block_n is not None
    if blocks and a.sram_bytes is not None:
        raise ValueError("--block-m/--block-n and --sram-bytes: give the block sizes or M, not both")
    if blocks and (a.block_m is None or a.block_n is None):
        raise ValueError("block_m/block_n: give both --block-m and --block-n")
    if blocks and not mod.NEEDS_TILING:
        raise ValueError(f"--block-m/--block-n: algorithm {algo!r} is not tiled and takes no block sizes")
    m = _sram_elems(a, w, gpu)
    if blocks:
        return Tiling(a.block_m, a.block_n), m
    return None, m


def _with_sram_bytes(e: ValueError, a: argparse.Namespace, w, m: int) -> ValueError:
    """An API complaint about M in elements, restated with the --sram-bytes the user gave."""
    msg = str(e)
    if msg.startswith("sram_elems=") and ": " in msg:
        given = "GPU default" if a.sram_bytes is None else "--sram-bytes"
        nbytes = m * w.elem_bytes if a.sram_bytes is None else a.sram_bytes
        return ValueError(f"sram_bytes={nbytes} ({given}; M = {m} {w.dtype} elements): {msg.split(': ', 1)[1]}")
    return e


def _cmd_simulate(a: argparse.Namespace) -> int:
    from .api import simulate
    from .config import get_gpu
    from .report import simulate_summary

    w = _workload(a)
    gpu = get_gpu(a.gpu)
    tiling, m = _tiling_args(a, a.algo, w, gpu)
    opts = _chosen_options(a, a.algo)
    try:
        if a.algo == "smallcache" and tiling is None and "tile" not in opts:
            # its tile side from the exact M, shown as the option it runs with
            opts["tile"] = _load_algorithm(a.algo).tile_for_sram(m)
        res = simulate(w, a.algo, a.pass_, tiling=tiling, sram_elems=None if tiling else m, **opts)
    except ValueError as e:
        raise _with_sram_bytes(e, a, w, m) from None
    summ = simulate_summary(res, gpu, m)
    summ["tiling_given"] = tiling is not None
    if a.json:
        print(json.dumps(summ, indent=2))
    else:
        print(_simulate_text(summ))
    return 0


def _simulate_text(s: dict) -> str:
    from .report import fmt_num, format_table

    w = s["workload"]
    lines = []
    opts = "".join(f" {k}={v}" for k, v in s["options"].items())
    lines.append(f"{s['algorithm']} {s['pass']}{opts}: batch {w['batch']}, heads {w['heads']} (kv {w['kv_heads']}), "
                 f"Nq {w['seq_len_q']}, Nk {w['seq_len_k']}, d {w['head_dim']}, {w['dtype']}"
                 f"{', causal' if w['causal'] else ''}")
    if s["algorithm"] == "smallcache":
        tile = f"tile side s = {s['block_m']}"
    else:
        tile = "not tiled" if s["block_m"] is None else f"Br = {s['block_m']}, Bc = {s['block_n']}"
    m = f"M = {fmt_num(s['sram_bytes'])} bytes = {fmt_num(s['sram_elems'])} elements"
    if s["tiling_given"]:
        lines.append(f"GPU {s['gpu']}; {tile} (given); bounds at the GPU's {m}")
    else:
        lines.append(f"GPU {s['gpu']}; {m}; {tile}")
    lines.append("")
    rows = []
    for tensor, dirs in s["breakdown"].items():
        for dr, t in dirs.items():
            rows.append([tensor, dr, t["elements"], f"{t['bytes'] / 1e6:,.3f}", t["sectors"]])
    rows.append(["total", "read", s["hbm_read_elements"], f"{s['hbm_read_bytes'] / 1e6:,.3f}",
                 s["hbm_read_sectors"]])
    rows.append(["total", "write", s["hbm_write_elements"], f"{s['hbm_write_bytes'] / 1e6:,.3f}",
                 s["hbm_write_sectors"]])
    rows.append(["total", "", s["hbm_read_elements"] + s["hbm_write_elements"], f"{s['hbm_bytes'] / 1e6:,.3f}",
                 s["sectors"]])
    lines.append(format_table(["tensor", "dir", "elements", "MB", "sectors"], rows,
                              right=[False, False, True, True, True]))
    if len(s["per_launch"]) > 1:
        lines.append("")
        lines.append(format_table(["launch", "read MB", "write MB", "total MB"],
                                  [[n, f"{c['hbm_read_bytes'] / 1e6:,.3f}", f"{c['hbm_write_bytes'] / 1e6:,.3f}",
                                    f"{c['hbm_bytes'] / 1e6:,.3f}"] for n, c in s["per_launch"].items()],
                                  right=[False, True, True, True]))
    lines.append("")
    lines.append(f"closed form agrees with the walker: {fmt_num(s['closed_form_agrees'])}")
    if s["flops"] is not None:
        f = s["flops"]
        lines.append(f"FLOPs: matmul {fmt_num(f['matmul'])}, non-matmul {fmt_num(f['nonmatmul'])}")
    if s["bounds"] is not None:
        lines.append("forward IO bounds at this M, in elements: " + _bounds_line(s["bounds"]))
    if s["roofline"] is not None:
        r = s["roofline"]
        lines.append(f"roofline on {s['gpu']}: {r['time_s'] * 1e3:.4g} ms ({r['bound']}-bound)")
    return "\n".join(lines)


def _bounds_line(b: dict) -> str:
    from .report import fmt_num

    return ", ".join(f"{k} {fmt_num(v)}" for k, v in b.items())


# --------------------------------------------------------------------------------------------
# sweep

#: --param choice -> (record field plotted on x, what a value is)
_SWEEP_PARAMS = {
    "M": ("sram_elems", "on-chip memory M in elements (the paper's M; --sram-bytes is in bytes)"),
    "N": ("seq_len_q", "sequence length (sets Nq and Nk)"),
    "d": ("head_dim", "head dimension"),
    "block_m": ("block_m", "Br, query rows per tile (with --block-n or the M rule's Bc)"),
    "block_n": ("block_n", "Bc, key rows per tile"),
    "gpu": ("gpu", "GPU preset name (M and the roofline from the preset)"),
}


def _sweep_values(param: str, raw: list[str]) -> list:
    """--values: space- or comma-separated; GPU names, else positive integers."""
    from .config import get_gpu

    vals = [v for r in raw for v in r.replace(",", " ").split()]
    if not vals:
        raise ValueError("values=[]: give at least one value")
    if param == "gpu":
        for v in vals:
            try:
                get_gpu(v)
            except ValueError as e:
                raise ValueError(f"values: {e}") from None
        return vals
    out = []
    for v in vals:
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"values: {v!r} is not an integer (--param {param})") from None
        if n <= 0:
            raise ValueError(f"values: {n} must be a positive integer (--param {param})")
        out.append(n)
    return out


def _cmd_sweep(a: argparse.Namespace) -> int:
    import warnings
    from pathlib import Path

    from .config import Tiling, get_gpu
    from .report import fmt_exponent, fmt_num, format_table

    values = _sweep_values(a.param, a.values)
    w = _workload(a)  # checks the base workload before any run
    gpu = get_gpu(a.gpu)
    base = {"batch": w.batch, "heads": w.heads, "kv_heads": w.hkv, "seq_len_q": w.nq, "seq_len_k": w.nk,
            "head_dim": w.d, "dtype": w.dtype, "causal": w.causal}
    if a.param == "N" and a.seq_len_k is not None:
        raise ValueError("--seq-len-k: a sweep over N sets Nq = Nk; leave --seq-len-k out")
    blocks = a.block_m is not None or a.block_n is not None
    if blocks and a.sram_bytes is not None:
        raise ValueError("--block-m/--block-n and --sram-bytes: give the block sizes or M, not both")
    if a.sram_bytes is not None:
        base["sram_elems"] = _sram_elems(a, w, gpu)
    for name in ("block_m", "block_n"):
        if getattr(a, name) is not None:
            Tiling(**{"block_m": 1, "block_n": 1, name: getattr(a, name)})  # checks it is positive
            base[name] = getattr(a, name)
    if a.param in ("block_m", "block_n"):
        other = "block_n" if a.param == "block_m" else "block_m"
        if other not in base:  # the other block size from M by the paper's rule
            rule = Tiling.from_sram(base.get("sram_elems", gpu.sram_elems(w.elem_bytes)), w.d)
            base[other] = getattr(rule, other)
    passes = a.passes
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from .sweep import fit_exponent, sweep, write_csv

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = sweep(base, a.param, values, algos=a.algos, passes=passes,
                     gpu=None if a.param == "gpu" else a.gpu, progress=not a.quiet and sys.stderr.isatty(),
                     walk=not a.closed_form)
    if not recs:
        first = f": {caught[0].message}" if caught else ""
        raise ValueError(f"no run of the sweep succeeded ({len(caught)} skipped){first}")
    for c in caught:
        print(f"{PROG}: {c.message}", file=sys.stderr)
    x = _SWEEP_PARAMS[a.param][0]
    csv_path, png_path = out / "sweep.csv", out / "sweep.png"
    write_csv(recs, csv_path)
    rows = []
    for r in recs:
        rows.append([r[x], r["algo"], r["pass"],
                     "-" if r["block_m"] is None else f"{r['block_m']}x{r['block_n']}",
                     f"{r['hbm_read_bytes'] / 1e9:.4f}", f"{r['hbm_write_bytes'] / 1e9:.4f}",
                     f"{r['hbm_bytes'] / 1e9:.4f}",
                     "-" if not r.get("bound_lower") else f"{r['hbm_elements'] / r['bound_lower']:.2f}",
                     f"{r['time_s'] * 1e3:.4g}", r["bound"]])
    print(format_table([a.param, "algorithm", "pass", "Br x Bc", "read GB", "write GB", "total GB",
                        "/ lower bound", "roofline ms", "bound"], rows,
                       right=[a.param != "gpu", False, False] + [True] * 6 + [False]))
    if a.param != "gpu":
        print()
        print(f"fitted exponent b of HBM bytes ∝ {a.param}^b (least squares in log-log):")
        fits = []
        for algo, p in dict.fromkeys((r["algo"], r["pass"]) for r in recs):
            try:
                b, _, r2 = fit_exponent(recs, x, "hbm_bytes", where={"algo": algo, "pass": p})
                fits.append([algo, p, fmt_exponent(b), f"{r2:.4f}"])
            except ValueError as e:
                fits.append([algo, p, "-", str(e)])
        print(format_table(["algorithm", "pass", "exponent", "r²"], fits, right=[False, False, True, True]))
        from .plot import plot_sweep

        plot_sweep(recs, x, "hbm_bytes", by="algo", path=png_path,
                   title=f"HBM traffic against {a.param}: d = {w.d}, {w.dtype}, B·H = {w.bh}"
                         f"{', causal' if w.causal else ''}")
    else:
        _plot_gpu_bars(recs, png_path)
    print()
    print(f"wrote {csv_path} and {png_path} ({fmt_num(len(recs))} runs)")
    return 0


def _plot_gpu_bars(recs: list[dict], path) -> None:
    """A sweep over GPU presets: roofline time per preset, one bar per algorithm and pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    gpus = list(dict.fromkeys(r["gpu"] for r in recs))
    series = list(dict.fromkeys((r["algo"], r["pass"]) for r in recs))
    t = {(r["gpu"], r["algo"], r["pass"]): r["time_s"] * 1e3 for r in recs}
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    xs = np.arange(len(gpus))
    for k, (algo, p) in enumerate(series):
        ax.bar(xs + k * width, [t.get((g, algo, p), 0.0) for g in gpus], width, label=f"{algo} {p}")
    ax.set_xticks(xs + width * (len(series) - 1) / 2, gpus)
    ax.set_ylabel("roofline time (ms)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.12, top=0.95)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# bounds


def _cmd_bounds(a: argparse.Namespace) -> int:
    from .algorithms import ALGORITHMS
    from .bounds import bounds_table
    from .config import get_gpu
    from .report import fmt_num, format_table

    w = _workload(a)
    gpu = get_gpu(a.gpu)
    m = _sram_elems(a, w, gpu)
    algos = a.algos or list(ALGORITHMS)
    rows = bounds_table(w, m, algos, "fwd", walk=a.walk)
    b = {k: rows[0][k] for k in ("standard", "flash", "lower_bound", "saha_ye", "regime")} if rows else {}
    if a.json:
        print(json.dumps({"sram_elems": m, "sram_bytes": m * w.elem_bytes, "head_dim_squared": w.d * w.d,
                          "bounds": b, "algorithms": rows}, indent=2))
        return 0
    print(f"forward pass, batch {w.batch}, heads {w.heads} (kv {w.hkv}), Nq {w.nq}, Nk {w.nk}, d {w.d}, {w.dtype}"
          f"{', causal' if w.causal else ''}")
    rel = ">=" if m >= w.d * w.d else "<"
    print(f"M = {fmt_num(m * w.elem_bytes)} bytes = {fmt_num(m)} elements {rel} d² = {fmt_num(w.d * w.d)}: "
          f"{b.get('regime', '?')} regime")
    print()
    names = {"standard": "standard attention (Algorithm 0)", "flash": "FlashAttention (Theorem 2)",
             "lower_bound": "lower bound (Prop. 3 / Saha-Ye, with I/O floor)",
             "saha_ye": "Saha & Ye: min(N²d²/M, N²d/√M)"}
    print(format_table(["bound", "HBM elements"], [[names[k], float(b[k])] for k in names if k in b]))
    print()
    out = []
    for r in rows:
        if r["simulated"] is None:
            out.append([r["algo"], None, None, None, f"n/a: {r['error']}"])
        else:
            out.append([r["algo"], r["simulated"], r["ratio_lower"], r["ratio_flash"], ""])
    print(format_table(["algorithm", "HBM elements", "/ lower bound", "/ flash bound", "note"], out,
                       right=[False, True, True, True, False]))
    return 0


# --------------------------------------------------------------------------------------------
# report


def _cmd_report(a: argparse.Namespace) -> int:
    from .report import run_report

    run_report(a.out)
    return 0


# --------------------------------------------------------------------------------------------
# measure and compare: the front door to the analysis package.  These two commands import
# ``analysis`` (which imports the kernels) lazily, when they run: the simulator itself never
# depends on it.


def _cmd_measure(a: argparse.Namespace) -> int:
    from analysis.configs import SETS, config_id
    from analysis.measure import MissingTool, measure

    configs = SETS[a.set]()
    if a.only:
        configs = [c for c in configs if a.only in config_id(c)]
        if not configs:
            raise UsageError(f"--only {a.only!r}: matches no configuration of set {a.set!r}")
    try:
        measure(configs, Path(a.out), a.set, a.cache_control)
    except MissingTool as e:
        print(f"{PROG} measure: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_compare(a: argparse.Namespace) -> int:
    from analysis.compare import run

    if not Path(a.data).is_file():
        raise UsageError(f"DATA={a.data!r}: no such file (a measured CSV, e.g. analysis/data/h100/h100.csv)")
    try:
        return run(a.data, a.out, gpu=a.gpu, plots=not a.no_plots)
    except ValueError as e:
        raise UsageError(str(e)) from None


# --------------------------------------------------------------------------------------------
# Parser and main


def build_parser() -> argparse.ArgumentParser:
    from .algorithms import ALGORITHMS

    p = _Parser(prog=PROG, description="FlashAttention's IO complexity: exact HBM traffic of attention algorithms.",
                epilog="Run 'flashsim COMMAND --help' for a command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("simulate", help="HBM traffic of one algorithm on one workload",
                       description="Walk one algorithm's tile schedule and count every HBM transfer: "
                                   "elements, bytes and 32-byte sectors per tensor, with the closed form, "
                                   "the FLOPs, the IO bounds and the roofline time on a GPU preset.")
    s.add_argument("--algo", "-a", choices=ALGORITHMS, default="flash2", help="algorithm (default flash2)")
    s.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "fwd+bwd"), default="fwd",
                   help="forward, backward or both (default fwd)")
    _add_workload(s)
    _add_gpu(s)
    t = s.add_argument_group("on-chip memory (give M or the block sizes)")
    t.add_argument("--sram-bytes", "-M", type=int, default=None, metavar="BYTES",
                   help="M in bytes; the paper's rule picks Bc = ceil(M/4d), Br = min(Bc, d) "
                        "(default: the GPU's shared memory per thread block)")
    t.add_argument("--block-m", type=int, default=None, metavar="Br", help="query rows per tile")
    t.add_argument("--block-n", type=int, default=None, metavar="Bc", help="key/value rows per tile")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    _add_algorithm_options(s)
    s.set_defaults(func=_cmd_simulate)

    w = sub.add_parser("sweep", help="vary one parameter; CSV, plot, table and fitted exponents",
                       description="Simulate each algorithm and pass at each value of one parameter (the others "
                                   "from the workload options), write DIR/sweep.csv and DIR/sweep.png, print a "
                                   "table and the fitted exponent of HBM bytes in the parameter per algorithm.",
                       epilog="Parameters: " + "; ".join(f"{k}: {v[1]}" for k, v in _SWEEP_PARAMS.items()))
    w.add_argument("--param", "-p", required=True, choices=tuple(_SWEEP_PARAMS), help="the parameter to vary")
    w.add_argument("--values", "-v", required=True, nargs="+", metavar="V",
                   help="its values, space- or comma-separated (M in elements)")
    w.add_argument("--algos", nargs="+", choices=ALGORITHMS, default=["standard", "flash1", "flash2"],
                   metavar="ALGO", help=f"algorithms ({', '.join(ALGORITHMS)}; default standard flash1 flash2)")
    w.add_argument("--pass", dest="passes", nargs="+", choices=("fwd", "bwd", "fwd+bwd"), default=["fwd"],
                   metavar="PASS", help="passes: fwd, bwd, fwd+bwd (default fwd)")
    _add_workload(w)
    _add_gpu(w)
    t = w.add_argument_group("on-chip memory of the runs (default: the GPU's shared memory per thread block)")
    t.add_argument("--sram-bytes", "-M", type=int, default=None, metavar="BYTES", help="M in bytes")
    t.add_argument("--block-m", type=int, default=None, metavar="Br", help="query rows per tile")
    t.add_argument("--block-n", type=int, default=None, metavar="Bc", help="key/value rows per tile")
    w.add_argument("--out", "-o", required=True, metavar="DIR", help="output folder for sweep.csv and sweep.png")
    w.add_argument("--closed-form", action="store_true",
                   help="count with the closed forms only (fast; no sectors, no walker check)")
    w.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (there is none when standard error is not a terminal)")
    w.set_defaults(func=_cmd_sweep)

    b = sub.add_parser("bounds", help="IO bounds at one M beside each algorithm's forward HBM traffic",
                       description="The IO bounds of exact attention at on-chip memory M (elements): standard "
                                   "attention, FlashAttention's Theorem 2, the lower bound, Saha & Ye's "
                                   "min(N²d²/M, N²d/√M), and the regime (M vs d²), beside each algorithm's "
                                   "forward element count (closed form, or the walker with --walk).")
    _add_workload(b)
    _add_gpu(b)
    b.add_argument("--sram-bytes", "-M", type=int, default=None, metavar="BYTES",
                   help="M in bytes (default: the GPU's shared memory per thread block)")
    b.add_argument("--algos", nargs="+", choices=ALGORITHMS, default=None, metavar="ALGO",
                   help=f"algorithms to count ({', '.join(ALGORITHMS)}; default all)")
    b.add_argument("--walk", action="store_true", help="count with the walker instead of the closed forms")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=_cmd_bounds)

    r = sub.add_parser("report", help="the IO analysis of standard vs FlashAttention-1 vs -2 (the main job)",
                       description="Standard attention vs FlashAttention-1 vs FlashAttention-2 on the paper's "
                                   "GPT-2-medium attention (N 1024, d 64, 16 heads, batch 64, fp16) on the A100 "
                                   "and H100 presets: a table, M and N sweeps, CSV and PNG files.")
    r.add_argument("--out", "-o", default="flashsim-report", metavar="DIR",
                   help="output folder (default flashsim-report/)")
    r.set_defaults(func=_cmd_report)

    m = sub.add_parser("measure", help="run the measured configurations under Nsight Compute (GPU machine)",
                       description="Run a named set of kernel configurations under Nsight Compute (ncu) and write "
                                   "one row per kernel launch (LSU, L2 and DRAM traffic, time) with its provenance. "
                                   "Needs an NVIDIA GPU and ncu; elsewhere it says which is missing.")
    m.add_argument("--set", default="h100", choices=("h100", "smoke"), help="configuration set (default h100)")
    m.add_argument("--out", "-o", default="analysis/data/h100", metavar="DIR",
                   help="output folder (default analysis/data/h100)")
    m.add_argument("--cache-control", default="all", choices=("all", "none"),
                   help="ncu --cache-control: flush caches before each replay pass (all, the default) or not")
    m.add_argument("--only", default=None, metavar="TEXT", help="measure only configurations whose id contains TEXT")
    m.set_defaults(func=_cmd_measure)

    c = sub.add_parser("compare", help="measured traffic against the simulator (table, fits, plots)",
                       description="Compare a measured CSV (from 'flashsim measure') with the simulator, launch by "
                                   "launch, at the LSU level (tolerance 1%%) and the DRAM level (a simple L2 model, "
                                   "errors reported), and fit Theorem 2's exponents.  Exit status 1 if any launch's "
                                   "LSU-level error exceeds the tolerance.")
    c.add_argument("data", metavar="DATA", help="measured CSV, e.g. analysis/data/h100/h100.csv")
    c.add_argument("--out", "-o", default=None, metavar="DIR", help="write comparison CSVs, JSON and plots here")
    c.add_argument("--gpu", default=None, help="GPU preset of the measurement (default: the one the data's "
                                                "provenance names)")
    c.add_argument("--no-plots", action="store_true", help="skip the plots")
    c.set_defaults(func=_cmd_compare)
    return p


def _explain(msg: str) -> str:
    """Add the flag to an API message that names a field (``seq_len_q=0: ...``)."""
    head = msg.split("=", 1)[0].split(":", 1)[0].strip()
    flag = _FIELD_FLAGS.get(head)
    if flag and flag not in msg:
        return f"{msg} ({flag})"
    return msg


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input)."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return args.func(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (UsageError, ValueError) as e:
        msg = " ".join(str(e).split())
        print(f"{PROG}: error: {_explain(msg)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `flashsim ... | head`: the reader left, which is not an error
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except OSError as e:
        print(f"{PROG}: error: {e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
