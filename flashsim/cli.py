"""The ``flashsim`` command line: its machinery and the simulator's commands (simulate, sweep,
bounds, report).

**Layers.**  Layers only look down (``flashsim`` <- ``kernels`` <- ``analysis``), and this module,
being part of ``flashsim``, imports nothing above it.  A command is a function that adds its
subparser (:data:`COMMANDS`); the commands that need the GPU side, ``measure`` and ``compare``,
are written in their own layer, :mod:`analysis.cli`, which appends them to these and whose
``main`` is the whole program: the ``flashsim`` console script and ``python -m flashsim`` run it.
We register from above rather than move the whole command line into a top layer so that each
command lives beside the code it drives, the simulator's commands work with the simulator alone
(``flashsim.cli.main``), and a new GPU-side command is added in the GPU side without the
simulator knowing of it.  We do not discover commands through installed metadata (entry
points): a source checkout that was never ``pip install``-ed would lose commands silently.

**Errors.**  Every bad input ends in one line ``flashsim: error: <message>`` on standard error
and exit status 2, never a traceback: the API raises ``ValueError`` naming the offending field,
and argparse's own complaints are turned into the same one-line form.  ``main(argv)`` returns
the exit status instead of exiting, so tests can call it in-process.

**Files.**  Commands that write files refuse to replace an earlier result without ``--force``
and write all of their files or none (:mod:`flashsim.output`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence

from .algorithms import ALGORITHMS, ALL_ALGORITHMS, get_algorithm
from .api import simulate
from .bounds import bounds_table
from .config import GPU_ALIASES, GPUS, Tiling, Workload, get_gpu
from .l2 import format_dram, simulate_dram
from .output import OutputExists, check_overwrite, staged
from .plot import plot_gpu_bars, plot_sweep
from .report import fmt_exponent, fmt_num, format_table, run_report, simulate_summary
from .sweep import field_of, fit_exponent, sweep, workload_record, write_csv

PROG = "flashsim"

#: Fields an error message may name, and the flags that set them (the message gets the flag added).
_FIELD_FLAGS = {
    "batch": "--batch", "heads": "--heads", "kv_heads": "--kv-heads", "seq_len_q": "--seq-len",
    "seq_len_k": "--seq-len-k", "head_dim": "--head-dim", "dtype": "--dtype", "sram_bytes": "--sram-bytes",
    "sram_elems": "--sram-bytes", "block_m": "--block-m", "block_n": "--block-n", "gpu": "--gpu",
    "algo": "--algo", "pass_": "--pass", "out": "--out",
    "devices": "--devices", "parallel": "--parallel", "topology": "--topology",
    "num_splits": "--num-splits", "page_size": "--page-size", "window": "--window", "lengths": "--lengths",
    "cu_seqlens": "--cu-seqlens", "block_table": "--block-table", "kernel": "--kernel",
}


class UsageError(Exception):
    """A command that cannot run as asked (bad input, a missing tool, a result it may not
    overwrite): printed as one line ``flashsim: error: ...``, exit status 2."""


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
        g.add_argument("--seq-len", "-N", "--nq", type=int, default=1024, metavar="N",
                       help="query sequence length Nq (default 1024; decode: query rows per sequence)")
    g.add_argument("--seq-len-k", type=int, default=None, metavar="Nk", help="key sequence length (default Nq)")
    g.add_argument("--head-dim", "-d", type=int, default=64, metavar="d", help="head dimension (default 64)")
    g.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp16", help="storage precision (default fp16)")
    g.add_argument("--causal", action="store_true", help="causal mask, aligned bottom-right (j <= i + Nk - Nq)")


def _add_gpu(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default="h100", metavar="GPU",
                   help=f"GPU preset: {', '.join(sorted(GPUS) + sorted(GPU_ALIASES))} (default h100)")


def add_force(p: argparse.ArgumentParser, what: str) -> None:
    """``--force``: replace an earlier result's files (refused without it)."""
    p.add_argument("--force", action="store_true", help=f"overwrite {what} in the output folder (refused without it)")


def _workload(a: argparse.Namespace, seq_len: int | None = None) -> Workload:
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
    """option name -> (default, help, algorithms taking it), over every algorithm."""
    opts: dict[str, tuple[object, str, list[str]]] = {}
    for name in ALL_ALGORITHMS:
        for opt, (default, text) in get_algorithm(name).OPTIONS.items():
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
    given = {k[4:]: v for k, v in vars(a).items() if k.startswith("opt_")}
    takes = get_algorithm(algo).OPTIONS
    for opt in given:
        if opt not in takes:
            has = ", ".join("--" + o.replace("_", "-") for o in takes) or "none"
            raise ValueError(f"--{opt.replace('_', '-')}: algorithm {algo!r} takes no such option (its options: {has})")
    return given


# --------------------------------------------------------------------------------------------
# simulate


def _given_tiling(a: argparse.Namespace, algo: str) -> Tiling | None:
    """The tiling of --block-m/--block-n, or None; checks they are given together and not with M."""
    blocks = a.block_m is not None or a.block_n is not None
    if blocks and a.sram_bytes is not None:
        raise ValueError("--block-m/--block-n and --sram-bytes: give the block sizes or M, not both")
    if blocks and (a.block_m is None or a.block_n is None):
        raise ValueError("block_m/block_n: give both --block-m and --block-n")
    if blocks and not get_algorithm(algo).NEEDS_TILING:
        raise ValueError(f"--block-m/--block-n: algorithm {algo!r} is not tiled and takes no block sizes")
    return Tiling(a.block_m, a.block_n) if blocks else None


def _with_sram_bytes(e: ValueError, a: argparse.Namespace, w, m: int) -> ValueError:
    """An API complaint about M in elements, restated with the --sram-bytes the user gave."""
    msg = str(e)
    if msg.startswith("sram_elems=") and ": " in msg:
        given = "GPU default" if a.sram_bytes is None else "--sram-bytes"
        nbytes = m * w.elem_bytes if a.sram_bytes is None else a.sram_bytes
        return ValueError(f"sram_bytes={nbytes} ({given}; M = {m} {w.dtype} elements): {msg.split(': ', 1)[1]}")
    return e


def _cmd_simulate(a: argparse.Namespace) -> int:
    if a.algo is None:  # --kernel VARIANT names one of the fast kernels' schedules
        a.algo = "fast" if hasattr(a, "opt_kernel") else "flash2"
    if a.devices is not None or a.parallel is not None or a.topology is not None:
        return _cmd_context_parallel(a)
    w = _workload(a)
    gpu = get_gpu(a.gpu)
    given = _given_tiling(a, a.algo)
    m = _sram_elems(a, w, gpu)
    opts = _chosen_options(a, a.algo)
    try:
        # the algorithm's M rule: block sizes given are used as they are, else it sizes its tiles from M
        tiling, opts = get_algorithm(a.algo).plan(w, None if given else m, given, **opts)
        res = simulate(w, a.algo, a.pass_, tiling=tiling, **opts)
    except ValueError as e:
        raise _with_sram_bytes(e, a, w, m) from None
    summ = simulate_summary(res, gpu, m)
    summ["tiling_given"] = given is not None
    dram = None
    if a.level == "dram":
        if a.sample < 1:
            raise ValueError(f"sample={a.sample}: must be a positive integer (--sample)")
        dram = simulate_dram(w, a.algo, a.pass_, gpu, tiling, None, cold_launches=a.cold_launches,
                             sample=a.sample, **opts)
        summ["dram"] = dram.to_dict()
    if a.json:
        print(json.dumps(summ, indent=2))
    else:
        print(_simulate_text(summ))
        if dram is not None:
            print()
            print(format_dram(dram))
    return 0


def _cmd_context_parallel(a: argparse.Namespace) -> int:
    """simulate --devices P --parallel {ring,ulysses}: flashsim.parallel on the workload."""
    from .parallel import context_parallel, format_text

    if a.devices is None:
        raise ValueError("devices=None: --parallel and --topology need --devices P")
    if a.algo != "flash2" or a.level != "lsu":
        raise ValueError(f"algo={a.algo!r}, level={a.level!r}: --devices runs flash2 in each step, at the LSU level")
    w, gpu = _workload(a), get_gpu(a.gpu)
    given = _given_tiling(a, "flash2")
    r = context_parallel(w, a.devices, a.parallel or "ring", a.pass_, gpu, tiling=given,
                         sram_elems=None if given else _sram_elems(a, w, gpu), topology=a.topology)
    print(json.dumps(r.to_dict(), indent=2) if a.json else format_text(r))
    return 0


def _simulate_text(s: dict) -> str:
    w = s["workload"]
    lines = []
    opts = "".join(f" {k}={v}" for k, v in s["options"].items())
    lines.append(f"{s['algorithm']} {s['pass']}{opts}: batch {w['batch']}, heads {w['heads']} (kv {w['kv_heads']}), "
                 f"Nq {w['seq_len_q']}, Nk {w['seq_len_k']}, d {w['head_dim']}, {w['dtype']}"
                 f"{', causal' if w['causal'] else ''}")
    tile = get_algorithm(s["algorithm"]).TILING_TEXT.format(block_m=s["block_m"], block_n=s["block_n"])
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
    told = [t for t in s["breakdown"] if t in TENSORS]
    if told:
        lines.append(textwrap.fill("tensors: " + "; ".join(f"{t} = {TENSORS[t]}" for t in told), width=100,
                                   subsequent_indent="  "))
    if len(s["per_launch"]) > 1:
        lines.append("")
        red = any(c.get("reduction_bytes") for c in s["per_launch"].values())  # atomics: a column of their own
        lines.append(format_table(["launch", "read MB", "write MB", "total MB"] + (["reduction MB"] if red else []),
                                  [[n, f"{c['hbm_read_bytes'] / 1e6:,.3f}", f"{c['hbm_write_bytes'] / 1e6:,.3f}",
                                    f"{c['hbm_bytes'] / 1e6:,.3f}"]
                                   + ([f"{c['reduction_bytes'] / 1e6:,.3f}"] if red else [])
                                   for n, c in s["per_launch"].items()],
                                  right=[False, True, True, True] + ([True] if red else [])))
        if red:
            lines.append("(reductions: atomics / red into a tensor, counted apart from the loads and stores of the "
                         "totals)")
    lines.append("")
    lines.append(f"closed form agrees with the walker: {fmt_num(s['closed_form_agrees'])}")
    if s["flops"] is not None:
        f = s["flops"]
        lines.append(f"FLOPs: matmul {fmt_num(f['matmul'])}, non-matmul {fmt_num(f['nonmatmul'])}")
    if s["bounds"] is not None:
        lines.append("forward IO bounds at this M, in elements: " + _bounds_line(s["bounds"]))
    if s.get("decode_bounds") is not None:
        b = s["decode_bounds"]
        lines.append("decoding, in bytes: " + ", ".join(f"{k} {fmt_num(v)}" for k, v in b.items()))
        pr = s["proposed_splits"]
        lines.append(f"proposed num_splits on {s['gpu']}: {pr['num_splits']} (flash-attention's heuristic: "
                     f"{pr['fa2_choice']}; {pr['programs_per_split']} programs per split, {pr['slots']} SM slots)")
    if s["roofline"] is not None:
        r = s["roofline"]
        lines.append(f"roofline on {s['gpu']}: {r['time_s'] * 1e3:.4g} ms ({r['bound']}-bound)")
    return "\n".join(lines)


#: What each tensor of a traffic breakdown is (shapes per head; ``simulate`` prints the lines of
#: those its breakdown has).  N x d: Nq or Nk rows of d columns; N x N: Nq x Nk.
TENSORS = {
    "Q": "queries, N x d", "K": "keys, N x d", "V": "values, N x d", "O": "output, N x d",
    "S": "scores QKᵀ (scaled), N x N", "P": "probabilities softmax(S), N x N",
    "Pd": "P after dropout, Z∘P/(1-p), N x N (written by an unfused dropout kernel, read by the P·V and "
          "Pᵀ·dO products)",
    "Z": "dropout keep-mask, N x N, 1 byte (bool) per entry",
    "m": "row maxima, N, fp32", "l": "row sums ℓ, N, fp32", "L": "logsumexp m + log ℓ, N, fp32",
    "D": "rowsum(dO∘O), N, fp32",
    "dO": "gradient of O, N x d", "dQ": "gradient of Q", "dK": "gradient of K", "dV": "gradient of V",
    "dS": "gradient of S, N x N", "dP": "gradient of P, N x N",
    "BT": "decode's block table, int32, one entry per page of a paged KV cache",
    "Lens": "decode's cache lengths L_b, int32, one per sequence (read by every main-launch program)",
    "Op": "partial outputs of the key splits (decode, split-KV forward), fp32, S x N x d",
    "Lp": "partial logsumexps of the key splits, fp32, S x N",
    "dQacc": "the fast fp16 backward's float32 dQ accumulator (zeroed, reduced into, converted to dQ), N x d",
}


def _bounds_line(b: dict) -> str:
    return ", ".join(f"{k} {fmt_num(v)}" for k, v in b.items())


# --------------------------------------------------------------------------------------------
# sweep

#: --param choice -> what a value is (the record field it plots on x: flashsim.sweep.field_of)
_SWEEP_PARAMS = {
    "M": "on-chip memory M in elements (the paper's M; --sram-bytes is in bytes)",
    "N": "sequence length (sets Nq and Nk)",
    "d": "head dimension",
    "block_m": "Br, query rows per tile (with --block-n or the M rule's Bc)",
    "block_n": "Bc, key rows per tile",
    "gpu": "GPU preset name (M and the roofline from the preset)",
}
#: The files `flashsim sweep` writes into its folder.
SWEEP_FILES = ("sweep.csv", "sweep.png")


def _sweep_values(param: str, raw: list[str]) -> list:
    """--values: space- or comma-separated; GPU names, else positive integers."""
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
    values = _sweep_values(a.param, a.values)
    w = _workload(a)  # checks the base workload before any run
    gpu = get_gpu(a.gpu)
    base = workload_record(w)
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
    out = check_overwrite(a.out, SWEEP_FILES, a.force, "an earlier sweep")  # refused before the work

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
    x = field_of(a.param)
    with staged(out, SWEEP_FILES, a.force, "an earlier sweep") as stage:
        write_csv(recs, stage / "sweep.csv")
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
            plot_sweep(recs, x, "hbm_bytes", by="algo", path=stage / "sweep.png",
                       title=f"HBM traffic against {a.param}: d = {w.d}, {w.dtype}, B·H = {w.bh}"
                             f"{', causal' if w.causal else ''}")
        else:
            plot_gpu_bars(recs, stage / "sweep.png")
    print()
    print(f"wrote {out / 'sweep.csv'} and {out / 'sweep.png'} ({fmt_num(len(recs))} runs)")
    return 0


# --------------------------------------------------------------------------------------------
# bounds


def _cmd_bounds(a: argparse.Namespace) -> int:
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
    headers = ["algorithm", "HBM elements", "/ lower bound", "/ flash bound", "note"]
    right = [False, True, True, True, False]
    if not any(o[-1] for o in out):  # the note says why an algorithm cannot run at this M; none here
        headers, right, out = headers[:-1], right[:-1], [o[:-1] for o in out]
    print(format_table(headers, out, right=right))
    print("(each algorithm's forward HBM elements, and their ratio to the lower bound and to Theorem 2's count"
          + (", or in 'note' why it cannot run at this M)" if len(headers) == 5 else ")"))
    return 0


# --------------------------------------------------------------------------------------------
# report


def _cmd_report(a: argparse.Namespace) -> int:
    run_report(a.out, force=a.force)
    return 0


# --------------------------------------------------------------------------------------------
# Parser and main


def add_simulate(sub) -> None:
    s = sub.add_parser("simulate", help="HBM traffic of one algorithm on one workload",
                       description="Walk one algorithm's tile schedule and count every HBM transfer: "
                                   "elements, bytes and 32-byte sectors per tensor, with the closed form, "
                                   "the FLOPs, the IO bounds and the roofline time on a GPU preset.")
    s.add_argument("--algo", "-a", choices=ALL_ALGORITHMS, default=None,
                   help="algorithm (default flash2; fast when --kernel is given)")
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
    lv = s.add_argument_group("level (the walker counts what the kernels request: the LSU level)")
    lv.add_argument("--level", choices=("lsu", "dram"), default="lsu",
                    help="dram: also run the schedule's thread blocks through the GPU preset's L2 model "
                         "(flashsim.l2) and print the DRAM read and write bytes per launch (default lsu)")
    lv.add_argument("--cold-launches", action="store_true",
                    help="with --level dram: start every launch from an empty L2 and leave its dirty lines "
                         "out of its writes, as Nsight Compute measures (default: the L2 carried from launch "
                         "to launch, the dirty lines left at the end written back and counted)")
    lv.add_argument("--sample", type=int, default=1, metavar="S",
                    help="with --level dram: simulate about one L2 set in S and scale the counts (faster; "
                         "default 1, exact)")
    _add_algorithm_options(s)
    cp = s.add_argument_group("context parallelism (flashsim.parallel): the workload split over P devices")
    cp.add_argument("--devices", type=int, default=None, metavar="P", help="devices P (each runs flash2 steps)")
    cp.add_argument("--parallel", choices=("ring", "ulysses"), default=None, help="schedule (default ring)")
    cp.add_argument("--topology", choices=("switch", "ring"), default=None,
                    help="interconnect topology (default: the GPU preset's, switch)")
    s.set_defaults(func=_cmd_simulate)


def add_sweep(sub) -> None:
    w = sub.add_parser("sweep", help="vary one parameter; CSV, plot, table and fitted exponents",
                       description="Simulate each algorithm and pass at each value of one parameter (the others "
                                   "from the workload options), write DIR/sweep.csv and DIR/sweep.png, print a "
                                   "table and the fitted exponent of HBM bytes in the parameter per algorithm.",
                       epilog="Parameters: " + "; ".join(f"{k}: {v}" for k, v in _SWEEP_PARAMS.items()))
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
    add_force(w, "an earlier sweep.csv or sweep.png")
    w.add_argument("--closed-form", action="store_true",
                   help="count with the closed forms only (fast; no sectors, no walker check)")
    w.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (there is none when standard error is not a terminal)")
    w.set_defaults(func=_cmd_sweep)


def add_bounds(sub) -> None:
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


def add_report(sub) -> None:
    r = sub.add_parser("report", help="the IO analysis of standard vs FlashAttention-1 vs -2 (the main job)",
                       description="Standard attention vs FlashAttention-1 vs FlashAttention-2 on the paper's "
                                   "GPT-2-medium attention (N 1024, d 64, 16 heads, batch 64, fp16) on the A100 "
                                   "and H100 presets: a table, M and N sweeps, CSV and PNG files.")
    r.add_argument("--out", "-o", default="flashsim-report", metavar="DIR",
                   help="output folder (default flashsim-report/; it may exist if it holds no earlier report)")
    add_force(r, "an earlier report")
    r.set_defaults(func=_cmd_report)


#: The simulator's commands, in the order ``flashsim --help`` lists them.  Each adds its subparser
#: (``func`` set to what runs it); :mod:`analysis.cli` appends the GPU side's commands.
COMMANDS: tuple[Callable, ...] = (add_simulate, add_sweep, add_bounds, add_report)


def build_parser(commands: Sequence[Callable] = COMMANDS) -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="FlashAttention's IO complexity: exact HBM traffic of attention algorithms.",
                epilog="Run 'flashsim COMMAND --help' for a command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in commands:
        add(sub)
    return p


def _explain(msg: str) -> str:
    """Add the flag to an API message that names a field (``seq_len_q=0: ...``)."""
    head = msg.split("=", 1)[0].split(":", 1)[0].strip()
    flag = _FIELD_FLAGS.get(head)
    if flag and flag not in msg:
        return f"{msg} ({flag})"
    return msg


def main(argv: Sequence[str] | None = None, commands: Sequence[Callable] = COMMANDS) -> int:
    """Run the command line with ``commands`` (default: the simulator's); returns the exit status
    (0 ok, 2 bad input or a command that cannot run; a command may return 1 for a finding, as
    ``compare`` does for launches outside its tolerance)."""
    try:
        parser = build_parser(commands)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return args.func(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (UsageError, ValueError) as e:
        msg = " ".join(str(e).split())
        if isinstance(e, OutputExists):
            msg = msg.replace("force=True", "--force")
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
    except MemoryError as e:  # numpy's names the size it could not allocate
        detail = f" ({' '.join(str(e).split())})" if str(e) else ""
        print(f"{PROG}: error: out of memory: the workload is too large for this machine{detail}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130

