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
from .api import build_schedule, simulate
from .bounds import bounds_table
from .config import GPU_ALIASES, GPUS, Tiling, Workload, get_gpu
from .l2 import dram_traffic, format_dram
from .output import OutputExists, check_overwrite, staged
from .plot import plot_gpu_bars, plot_sweep
from .report import fmt_exponent, fmt_num, format_table, run_report, simulate_summary
from .sweep import field_of, fit_exponent, sweep, workload_record, write_csv
from .traffic import ZERO

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
    "sample": "--sample", "level": "--level", "config": "--config", "sms": "--sms",
}

#: The defaults of --seq-len, --head-dim and --gpu, named once: sweep sets these flags' defaults to
#: None, to tell a flag given from its default (it refuses the flags its --param replaces).
DEFAULT_SEQ_LEN, DEFAULT_HEAD_DIM, DEFAULT_GPU = 1024, 64, "h100"


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
        g.add_argument("--seq-len", "-N", "--nq", type=int, default=DEFAULT_SEQ_LEN, metavar="N",
                       help="query sequence length Nq (default 1024; decode: query rows per sequence)")
    g.add_argument("--seq-len-k", type=int, default=None, metavar="Nk", help="key sequence length (default Nq)")
    g.add_argument("--head-dim", "-d", type=int, default=DEFAULT_HEAD_DIM, metavar="d",
                   help="head dimension (default 64)")
    g.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp16", help="storage precision (default fp16)")
    g.add_argument("--causal", action="store_true", help="causal mask, aligned bottom-right (j <= i + Nk - Nq)")


def _gpu_names() -> str:
    """The GPU presets with the other names each answers to, as --help and the errors list them."""
    also = {k: sorted(a for a, v in GPU_ALIASES.items() if v == k) for k in sorted(GPUS)}
    return ", ".join(k + (f" (or {', '.join(al)})" if al else "") for k, al in also.items())


def _add_gpu(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default=DEFAULT_GPU, metavar="GPU",
                   help=f"GPU preset: {_gpu_names()} (default h100)")


def _get_gpu(name: str, what: str = "gpu"):
    """The preset named ``name``; ValueError naming ``what`` and listing the names --help lists."""
    try:
        return get_gpu(name)
    except ValueError:
        raise ValueError(f"{what}={name!r}: unknown GPU preset; choose one of {_gpu_names()}") from None


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
    if a.sram_bytes % w.elem_bytes:
        raise ValueError(f"sram_bytes={a.sram_bytes}: not a whole number of {w.dtype} elements; give a multiple "
                         f"of {w.elem_bytes} bytes (M is counted in elements)")
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
    if isinstance(given.get("config"), str):
        given["config"] = _config_text(given["config"])
    return given


def _config_text(text: str):
    """--config: a JSON object (returned as a dict) or ``key=value,...`` (returned as given, for the
    algorithm to read); a key given twice is refused in either form."""
    def pairs(items):
        seen = {}
        for k, v in items:
            if k in seen:
                raise ValueError(f"config={text!r}: key {k!r} given twice")
            seen[k] = v
        return seen

    if text.lstrip().startswith("{"):
        try:
            cfg = json.loads(text, object_pairs_hook=pairs)
        except json.JSONDecodeError as e:
            raise ValueError(f"config={text!r}: not a JSON object ({e.msg} at character {e.pos}); write "
                             "'{\"bc\": 32}' or bc=32") from None
        return cfg
    pairs((part.split("=", 1)[0].strip(), None) for part in text.split(",") if part.strip())
    return text


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
    if a.level != "dram":  # the L2 model's options mean nothing at the LSU level
        for flag, given in (("--cold-launches", a.cold_launches), ("--sample", a.sample is not None)):
            if given:
                raise ValueError(f"{flag}: only with --level dram (the L2 model); the LSU level has no L2")
    w = _workload(a)
    gpu = _get_gpu(a.gpu)
    given = _given_tiling(a, a.algo)
    m = _sram_elems(a, w, gpu)
    opts = _chosen_options(a, a.algo)
    kernels = _pass_kernels(w, a.algo, a.pass_, opts)
    if kernels is not None and len(kernels) == 1 and opts.get("kernel") is None:
        opts["kernel"] = kernels[a.pass_]  # the pass's own kernel: its block shape shown, its config checked
    try:
        # the algorithm's M rule (standard attention's: M >= 2d): block sizes given are used as they are,
        # else it sizes its tiles from M
        tiling, opts = get_algorithm(a.algo).plan(w, None if given else m, given, **opts)
        res = simulate(w, a.algo, a.pass_, tiling=tiling, **opts)
    except ValueError as e:
        if kernels is not None and len(kernels) > 1 and str(e).startswith("config="):
            raise ValueError(f"{e} (--pass {a.pass_} runs {' and '.join(kernels.values())} with the same "
                             "--config)") from None
        raise _with_sram_bytes(e, a, w, m) from None
    summ = simulate_summary(res, gpu, m)
    summ["tiling_given"] = given is not None
    if kernels is not None:
        summ["kernels"] = _kernel_blocks(w, a.algo, kernels, opts)
        if len(kernels) > 1:  # one block shape per pass's kernel, in "kernels"; none for both
            summ["block_m"] = summ["block_n"] = None
    summ.update(_class_totals(res.io))
    for name, c in res.io.per_launch.items():
        t = _class_totals(c)
        summ["per_launch"][name].update({k: t[k] for k in ("bulk_read_bytes", "bulk_write_bytes",
                                                            "all_classes_bytes")})
    dram = None
    if a.level == "dram":
        sample = 1 if a.sample is None else a.sample
        if sample < 1:
            raise ValueError(f"sample={sample}: must be a positive integer (--sample)")
        sched = build_schedule(w, a.algo, a.pass_, tiling, None, **opts)
        _check_sample(sample, sched, gpu)
        dram = dram_traffic(sched, gpu, cold_launches=a.cold_launches, sample=sample)
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
    # what flashsim.parallel does not take: refused rather than left out of the count
    ignored = [("--cold-launches", a.cold_launches), ("--sample", a.sample is not None)]
    ignored += [("--" + k[4:].replace("_", "-"), True) for k in vars(a) if k.startswith("opt_")]
    for flag, given in ignored:
        if given:
            raise ValueError(f"{flag}: not taken with --devices (each device runs flash2 with its default "
                             "options, at the LSU level)")
    if a.algo != "flash2":
        raise ValueError(f"algo={a.algo!r}: --devices runs flash2 in each step; leave --algo out")
    if a.level != "lsu":
        raise ValueError(f"level={a.level!r}: --devices counts at the LSU level only; leave --level out")
    w, gpu = _workload(a), _get_gpu(a.gpu)
    given = _given_tiling(a, "flash2")
    r = context_parallel(w, a.devices, a.parallel or "ring", a.pass_, gpu, tiling=given,
                         sram_elems=None if given else _sram_elems(a, w, gpu), topology=a.topology)
    print(json.dumps(r.to_dict(), indent=2) if a.json else format_text(r))
    return 0


def _pass_kernels(w: Workload, algo: str, pass_: str, opts: dict) -> dict[str, str] | None:
    """pass -> the kernel that runs it, for an algorithm that picks a kernel per pass (its module
    has ``variant_for`` and a ``kernel`` option: fast); None for the others.  A --kernel given
    must be the pass's (ValueError naming kernel otherwise)."""
    mod = get_algorithm(algo)
    pick = getattr(mod, "variant_for", None)
    if pick is None or "kernel" not in mod.OPTIONS:
        return None
    return {p: pick(w, p, opts.get("kernel")) for p in pass_.split("+")}


def _kernel_blocks(w: Workload, algo: str, kernels: dict[str, str], opts: dict) -> dict:
    """pass -> {"kernel", "block_m", "block_n"}: each pass's kernel and the block shape the
    algorithm module's ``blocks`` gives for it."""
    mod = get_algorithm(algo)
    out = {}
    for p, k in kernels.items():
        bm, bn = mod.blocks(w, None, **{**opts, "kernel": k})
        out[p] = {"kernel": k, "block_m": bm, "block_n": bn}
    return out


#: The traffic classes beside the loads ("read") and stores ("write") of the totals, by their
#: breakdown keys (flashsim.traffic): TMA loads, TMA stores (bulk reductions among them) and
#: atomics / red.
_OTHER_CLASSES = ("bulk_read", "bulk_write", "reduction")


def _class_totals(io) -> dict:
    """``<class>_elements``, ``_bytes`` and ``_sectors`` of each of :data:`_OTHER_CLASSES`, which
    the API's totals (the ``hbm_*`` keys: loads and stores) leave out, and ``all_classes_*``:
    every class together, :meth:`~flashsim.traffic.IOCount.by_class` summed (sectors None where
    one is None)."""
    per = {cls: ZERO for cls in _OTHER_CLASSES}
    for (_, key), t in io.breakdown.items():
        if key in per:
            per[key] = per[key] + t
    per["all_classes"] = sum(io.by_class().values(), ZERO)
    return {f"{name}_{unit}": (None if getattr(t, unit) is None else int(getattr(t, unit)))
            for name, t in per.items() for unit in ("elements", "bytes", "sectors")}


#: --sample: the fewest L2 lines of the schedule's tensors per sampled share, and the fewest sets
#: simulated.  Against exact runs (flash2 and standard, B·H = 1 .. 1024, N = 256 .. 1024, H100
#: preset) the DRAM bytes at the limit are within about 1% (reads) and 3% (writes); far past it
#: they are noise (N = 256, B·H = 1, S = 100,000: L2 reads 2.13 MB against 0.29 MB).
SAMPLE_MIN_LINES, SAMPLE_MIN_SETS = 256, 16


def _check_sample(sample: int, sched, gpu) -> None:
    """--sample S simulates about one L2 set in S and scales the counts by the sets simulated:
    refused where the simulated sets would see too little of the data for the scaled counts to
    mean anything (S above min(lines / 256, sets / 16))."""
    if sample == 1:
        return
    line = gpu.l2_line_bytes
    lines = sum(-(-t.slices * t.slice_bytes // line) for t in sched.tensors.values())
    sets = gpu.l2_effective_bytes // (line * gpu.l2_ways)
    most = max(1, min(lines // SAMPLE_MIN_LINES, sets // SAMPLE_MIN_SETS))
    if sample > most:
        raise ValueError(f"sample={sample}: at most {most} for this schedule on {gpu.name} (about one L2 set in S "
                         f"is simulated and the counts scaled up, so S may be at most min(lines / "
                         f"{SAMPLE_MIN_LINES}, sets / {SAMPLE_MIN_SETS}): its tensors span {lines:,} lines of "
                         f"{line} bytes, the L2 model has {sets:,} sets)")


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:,.3f}"


def _simulate_text(s: dict) -> str:
    w = s["workload"]
    lines = []
    opts = "".join(f" {k}={v}" for k, v in s["options"].items())
    lines.append(f"{s['algorithm']} {s['pass']}{opts}: batch {w['batch']}, heads {w['heads']} (kv {w['kv_heads']}), "
                 f"Nq {w['seq_len_q']}, Nk {w['seq_len_k']}, d {w['head_dim']}, {w['dtype']}"
                 f"{', causal' if w['causal'] else ''}")
    kernels = s.get("kernels")
    if kernels:  # each pass's own kernel and its block shape
        text = get_algorithm(s["algorithm"]).TILING_TEXT
        tile = "; ".join(f"{p + ' ' if len(kernels) > 1 else ''}kernel {k['kernel']}: "
                         + text.format(block_m=k["block_m"], block_n=k["block_n"]) for p, k in kernels.items())
    else:
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
    rows.append(["total", "read", s["hbm_read_elements"], _mb(s["hbm_read_bytes"]), s["hbm_read_sectors"]])
    rows.append(["total", "write", s["hbm_write_elements"], _mb(s["hbm_write_bytes"]), s["hbm_write_sectors"]])
    # the other traffic classes (TMA copies, reductions): rows of their own and a total of every class
    others = [c for c in _OTHER_CLASSES if s.get(f"{c}_elements")]
    for c in others:
        rows.append(["total", c, s[f"{c}_elements"], _mb(s[f"{c}_bytes"]), s[f"{c}_sectors"]])
    rows.append(["total", "read+write" if others else "", s["hbm_read_elements"] + s["hbm_write_elements"],
                 _mb(s["hbm_bytes"]), s["sectors"]])
    if others:
        rows.append(["total", "all", s["all_classes_elements"], _mb(s["all_classes_bytes"]),
                     s["all_classes_sectors"]])
    lines.append(format_table(["tensor", "dir", "elements", "MB", "sectors"], rows,
                              right=[False, False, True, True, True]))
    told = [t for t in s["breakdown"] if t in TENSORS]
    if told:
        lines.append(textwrap.fill("tensors: " + "; ".join(f"{t} = {TENSORS[t]}" for t in told), width=100,
                                   subsequent_indent="  "))
    if others:
        lines.append(textwrap.fill(
            "read, write: loads and stores through the LSU (--json's hbm_* keys); "
            + "; ".join(CLASS_TEXT[c] for c in others)
            + "; all: every class (the bytes the roofline counts)", width=100, subsequent_indent="  "))
    if len(s["per_launch"]) > 1:
        lines.append("")
        cols = [c for c in _OTHER_CLASSES if any(x.get(f"{c}_bytes") for x in s["per_launch"].values())]
        head = ["launch", "read MB", "write MB", "read+write MB" if cols else "total MB"]
        head += [f"{c.replace('_', ' ')} MB" for c in cols] + (["all MB"] if cols else [])
        lines.append(format_table(head,
                                  [[n, _mb(c["hbm_read_bytes"]), _mb(c["hbm_write_bytes"]), _mb(c["hbm_bytes"])]
                                   + [_mb(c[f"{x}_bytes"]) for x in cols]
                                   + ([_mb(c["all_classes_bytes"])] if cols else [])
                                   for n, c in s["per_launch"].items()],
                                  right=[False] + [True] * (len(head) - 1)))
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


#: What each traffic class beside loads and stores is (``simulate`` prints those its run has).
CLASS_TEXT = {
    "bulk_read": "bulk_read: TMA (bulk) loads, which reach L2 without the LSU",
    "bulk_write": "bulk_write: TMA (bulk) stores and bulk reductions",
    "reduction": "reduction: atomics / red into a tensor, read-modify-writes made in L2",
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
                _get_gpu(v)
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


#: --param -> the flags whose value the swept parameter replaces (refused beside it) and why.
_SWEEP_SETS = {
    "N": (("--seq-len", "seq_len"), ("--seq-len-k", "seq_len_k")),
    "d": (("--head-dim", "head_dim"),),
    "M": (("--sram-bytes", "sram_bytes"), ("--block-m", "block_m"), ("--block-n", "block_n")),
    "block_m": (("--block-m", "block_m"),),
    "block_n": (("--block-n", "block_n"),),
    "gpu": (("--gpu", "gpu"), ("--sram-bytes", "sram_bytes"), ("--block-m", "block_m"), ("--block-n", "block_n")),
}
_SWEEP_WHY = {
    "N": "a sweep over N sets Nq = Nk to each value",
    "d": "a sweep over d sets the head dimension to each value",
    "M": "a sweep over M sets M to each value and the block sizes by the paper's rule from it",
    "block_m": "a sweep over block_m sets Br to each value",
    "block_n": "a sweep over block_n sets Bc to each value",
    "gpu": "a sweep over gpu takes M (hence the block sizes) and the roofline from each preset",
}


def _cmd_sweep(a: argparse.Namespace) -> int:
    values = _sweep_values(a.param, a.values)
    for flag, dest in _SWEEP_SETS[a.param]:  # a flag the swept parameter would replace: refused, not dropped
        if getattr(a, dest) is not None:
            raise ValueError(f"{flag}: {_SWEEP_WHY[a.param]}; leave {flag} out")
    # the defaults of the flags sweep tells from their default (add_sweep sets them None)
    a.seq_len = DEFAULT_SEQ_LEN if a.seq_len is None else a.seq_len
    a.head_dim = DEFAULT_HEAD_DIM if a.head_dim is None else a.head_dim
    a.gpu = DEFAULT_GPU if a.gpu is None else a.gpu
    w = _workload(a)  # checks the base workload before any run
    gpu = _get_gpu(a.gpu)
    base = workload_record(w)
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
    gpu = _get_gpu(a.gpu)
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
    lv.add_argument("--sample", type=int, default=None, metavar="S",
                    help="with --level dram: simulate about one L2 set in S and scale the counts (faster; "
                         "default 1, exact); S at most min(L2 lines the tensors span / 256, L2 sets / 16)")
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
    w.set_defaults(seq_len=None, head_dim=None, gpu=None)  # told from given: _cmd_sweep refuses what --param sets
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
    p.command_names = tuple(sub.choices)  # what `flashsim` without a command lists
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
        args, extra = parser.parse_known_args(argv)
        if extra:  # argparse would blame the top-level parser; name the command's own --help
            where = f"{PROG} {args.command}" if args.command else PROG
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see '{where} --help')")
        if args.command is None:
            names = ", ".join(parser.command_names)
            raise UsageError(f"give a command: {names} (see '{PROG} --help')")
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

