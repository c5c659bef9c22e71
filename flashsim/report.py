"""The main job: the IO analysis of standard attention vs FlashAttention-1 vs FlashAttention-2.

:func:`run_report` takes the paper's GPT-2-medium attention (N = 1024, d = 64, 16 heads,
batch 64, fp16; FlashAttention paper, section 4.1 and Figure 2) on the A100 and H100 presets and
writes, into one folder:

* ``io_table.csv``: per GPU, algorithm and pass, the HBM bytes read/written, the FLOPs, the
  roofline time and whether that time is memory- or compute-bound;
* ``dram_table.csv``: per GPU (A100, H100, H200), algorithm, forward + backward: the bytes the
  kernels request (LSU level, the walker) beside the bytes that reach DRAM through the GPU's L2
  (the trace-driven model :mod:`flashsim.l2`);
* ``m_sweep.csv`` / ``m_sweep.png``: forward HBM traffic against the on-chip memory M (hence
  the block size Bc = ⌈M/4d⌉), the paper's Figure 2 middle;
* ``n_sweep.csv`` / ``n_sweep.png``: HBM traffic against the sequence length N, with the fitted
  exponent of N per algorithm (2 for all three at fixed M: standard moves Θ(N²) for S and P,
  the flash algorithms Θ(N²d²/M) for the K, V reloads).

It also prints the table, and says why FlashAttention-2 fits M badly and moves more than
FlashAttention-1 under the paper's rule, from the sweep's own numbers (:func:`m_sweep_notes`).
The M table lists every GPU: at a given M the bytes are the same, the roofline times differ.
The files are written all or nothing, and a folder that holds an
earlier report is refused unless ``force`` (:mod:`flashsim.output`).  :func:`simulate_summary`
is the JSON-ready summary of one simulation that ``flashsim simulate --json`` prints;
:func:`format_table` is the plain-text table printer shared with the CLI.
"""

from __future__ import annotations

import math
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from .algorithms import get_algorithm
from .api import SimResult
from .bounds import bounds as compute_bounds
from .config import Hardware, Workload, cdiv, get_gpu
from .flops import flops as count_flops
from .l2 import simulate_dram
from .output import staged
from .plot import plot_two_panels
from .roofline import roofline
from .sweep import fit_exponent, run_one, workload_record, write_csv
from .sweep import sweep as sweep_records

#: The paper's GPT-2-medium attention: seq. length 1024, head dim 64, 16 heads, batch 64, fp16.
DEFAULT_WORKLOAD = Workload(batch=64, heads=16, seq_len_q=1024, head_dim=64, dtype="fp16")
#: GPU presets of the report (``a100`` is the 40 GB SXM4 part, as in the paper's Figure 2).
DEFAULT_GPUS = ("a100", "h100")
DEFAULT_ALGOS = ("standard", "flash1", "flash2")
DEFAULT_PASSES = ("fwd", "bwd")
#: GPU presets of the DRAM-level table (the L2 model of each: flashsim.l2) and its set sampling
#: (one L2 set in 16 simulated, the counts scaled; benchmarks/bench_l2.py measures its error).
DRAM_GPUS = ("a100", "h100", "h200")
DRAM_SAMPLE = 16


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
    direction; ``block_m``/``block_n`` are the algorithm module's ``blocks`` for the run (for
    ``smallcache`` both its tile side).  ``bounds`` (at M = ``sram_elems``; None without it),
    ``flops`` and ``roofline`` come from their modules.
    """
    w = res.workload
    io = res.io
    block_m, block_n = get_algorithm(res.algorithm).blocks(w, res.tiling, **res.options)
    out = {
        "algorithm": res.algorithm,
        "pass": res.pass_,
        "options": dict(res.options),
        "workload": workload_record(w),
        "gpu": gpu.name,
        "sram_elems": sram_elems,
        "sram_bytes": None if sram_elems is None else sram_elems * w.elem_bytes,
        "block_m": block_m,
        "block_n": block_n,
    }
    out.update(io.to_dict())
    out["sectors"] = io.sectors
    out["hbm_read_sectors"], out["hbm_write_sectors"] = io.read_sectors, io.write_sectors
    out["per_launch"] = {
        name: {"hbm_read_bytes": c.read_bytes, "hbm_write_bytes": c.write_bytes, "hbm_bytes": c.bytes,
               "sectors": c.sectors, "reduction_bytes": c.by_class()["reduction"].bytes}
        for name, c in io.per_launch.items()
    }
    out["closed_form_agrees"] = res.agrees
    out["flops"] = count_flops(w, res.pass_, res.algorithm, tiling=res.tiling, **res.options)
    extra = getattr(get_algorithm(res.algorithm), "summary", None)  # decode: its own bounds
    # the attention bounds assume every visible pair of the workload; a window (flash2's option) is not in them
    windowed = res.options.get("window") is not None
    out["bounds"] = (None if sram_elems is None or extra is not None or windowed
                     else compute_bounds(w, sram_elems))
    if extra is not None:
        out.update(extra(w, res.tiling, gpu, **res.options))
    out["roofline"] = roofline(res, gpu)
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


def io_records(workload: Workload = DEFAULT_WORKLOAD, gpus: Sequence[str] = DEFAULT_GPUS,
               algos: Sequence[str] = DEFAULT_ALGOS, passes: Sequence[str] = DEFAULT_PASSES) -> list[dict]:
    """One :func:`flashsim.sweep.run_one` record per (GPU, algorithm, pass), walked (exact sectors,
    checked against the closed form).

    Tiled algorithms run with M = the GPU's shared memory per thread block (in elements of the
    workload's dtype) and the paper's block-size rule Bc = ⌈M/4d⌉, Br = min(Bc, d).
    """
    base = workload_record(workload)
    return [run_one(base, a, p, gpu=g, walk=True) for g in gpus for a in algos for p in passes]


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


def dram_records(workload: Workload = DEFAULT_WORKLOAD, gpus: Sequence[str] = DRAM_GPUS,
                 algos: Sequence[str] = DEFAULT_ALGOS, pass_: str = "fwd+bwd", sample: int = DRAM_SAMPLE) -> list[dict]:
    """LSU level (the walker) beside the DRAM level (the L2 model, the L2 carried from launch to
    launch and the dirty lines left at the end written back) for one pass of each algorithm, with
    M = each GPU's shared memory per thread block (the paper's rule)."""
    recs = []
    base = workload_record(workload)
    for g in gpus:
        gpu = get_gpu(g)
        for a in algos:
            r = run_one(base, a, pass_, gpu=g, walk=True)
            eff, rd, wr = _dram_bytes(workload, a, pass_, g, r["sram_elems"], sample)
            recs.append({"gpu": gpu.name, "algo": a, "pass": pass_, "block_m": r["block_m"], "block_n": r["block_n"],
                         "lsu_read_bytes": r["hbm_read_bytes"], "lsu_write_bytes": r["hbm_write_bytes"],
                         "lsu_bytes": r["hbm_bytes"], "l2_bytes": gpu.l2_bytes,
                         "l2_effective_bytes": eff, "dram_read_bytes": rd,
                         "dram_write_bytes": wr, "dram_bytes": rd + wr,
                         "dram_sample": sample})
    return recs


@lru_cache(maxsize=64)
def _dram_bytes(workload: Workload, algo: str, pass_: str, gpu: str, sram_elems: int, sample: int) -> tuple:
    """(effective L2 bytes, DRAM read bytes, DRAM write bytes) of one run of the L2 model: a pure
    function of its arguments, kept for the process, so that a second report (or ``report`` run
    twice, as the tests do) does not simulate the same 48 launches again."""
    d = simulate_dram(workload, algo, pass_, get_gpu(gpu), None, sram_elems, sample=sample)
    return d.l2_effective_bytes, d.read_bytes, d.write_bytes


def dram_table(recs: Sequence[dict]) -> str:
    """LSU and DRAM levels side by side."""
    rows = [[r["gpu"], r["algo"], r["pass"], "-" if r["block_m"] is None else f"{r['block_m']}x{r['block_n']}",
             f"{r['lsu_bytes'] / 1e9:.3f}", f"{r['dram_read_bytes'] / 1e9:.3f}", f"{r['dram_write_bytes'] / 1e9:.3f}",
             f"{r['dram_bytes'] / 1e9:.3f}", f"{r['dram_bytes'] / r['lsu_bytes']:.2f}"] for r in recs]
    return format_table(["gpu", "algorithm", "pass", "Br x Bc", "LSU GB", "DRAM read GB", "DRAM write GB",
                         "DRAM GB", "DRAM/LSU"], rows, right=[False, False, False] + [True] * 6)


def _sweep(w: Workload, param: str, values, gpus, algos, passes) -> list[dict]:
    recs = []
    for g in gpus:
        # closed forms only: instant at every size, and the tests hold them equal to the walker
        recs += sweep_records(workload_record(w), param, values, algos=algos, passes=passes, gpu=g, walk=False,
                              on_error="raise")
    return recs


def exponents(recs: Sequence[dict], x: str, y: str = "hbm_bytes") -> list[dict]:
    """The fitted exponent b of y ∝ x^b per (GPU, algorithm, pass)."""
    out = []
    keys = dict.fromkeys((r["gpu"], r["algo"], r["pass"]) for r in recs)
    for g, a, p in keys:
        slope, _, r2 = fit_exponent(list(recs), x, y, where={"gpu": g, "algo": a, "pass": p})
        out.append({"gpu": g, "algo": a, "pass": p, "x": x, "y": y, "exponent": slope, "r2": r2})
    return out


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=110, initial_indent=indent, subsequent_indent=indent + "  ")


def fmt_exponent(b: float) -> str:
    """A fitted exponent with sign, 3 decimals, and no "-0.000" for a slope of -1e-15."""
    return f"{round(b, 3) + 0.0:+.3f}"


def _exponent_table(fits: Sequence[dict]) -> str:
    return format_table(["gpu", "algorithm", "pass", "exponent", "r²"],
                        [[f["gpu"], f["algo"], f["pass"], fmt_exponent(f["exponent"]), f"{f['r2']:.4f}"]
                         for f in fits], right=[False, False, False, True, True])


def m_sweep_notes(m_recs: Sequence[dict], w: Workload) -> list[str]:
    """Why flash2's fitted exponent in M is far from −1, computed from the sweep: the paper's rule
    Br = min(⌈M/4d⌉, d) stops growing at d, and flash2 reads K and V once per query block, so
    its bytes fall as M^-1 up to M = 4d² and are flat after; one line through both parts fits
    badly.  An empty list if the sweep shows no such cap."""
    g0 = m_recs[0]["gpu"]
    f2 = sorted((r for r in m_recs if r["gpu"] == g0 and r["algo"] == "flash2"), key=lambda r: r["sram_elems"])
    capped = [r for r in f2 if r["block_m"] == w.d]
    if len(f2) < 3 or not capped or len(capped) == len(f2):
        return []
    m_cap = capped[0]["sram_elems"]
    below = [r for r in f2 if r["sram_elems"] <= m_cap]
    above = capped
    b_below = fit_exponent(below, "M", "hbm_bytes")[0] if len(below) >= 2 else float("nan")
    b_above = fit_exponent(above, "M", "hbm_bytes")[0] if len(above) >= 2 else float("nan")
    b_all, _, r2_all = fit_exponent(f2, "M", "hbm_bytes")
    tr = cdiv(w.nq, w.d)
    return [
        f"why flash2 is not M^-1: the paper's rule gives Br = min(⌈M/4d⌉, d), which reaches d = {w.d} at "
        f"M = 4d² = {m_cap:,} (Bc = {capped[0]['block_n']}); flash2 reads K and V once per query block, Tr = "
        f"⌈N/Br⌉ times, so its bytes fall as M^{fmt_exponent(b_below)} up to there and stay flat after "
        f"(Tr = {tr}; M^{fmt_exponent(b_above)}): one line through both parts gives {fmt_exponent(b_all)} "
        f"with r² {r2_all:.2f}.  flash1's Br is capped too, but it re-streams Q and O once per key "
        f"block, Tc = ⌈N/Bc⌉, which keeps shrinking with M.",
    ]


#: The M sweep: Bc = ⌈M/4d⌉ from 16 to 512 rows at d = 64 (the paper's Figure 2 middle varies the
#: block size of FlashAttention's forward on A100 at N = 1024, d = 64).
M_SWEEP_BLOCKS = (16, 32, 64, 128, 256, 512)
N_SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)


#: The report's files, by the key :func:`run_report` returns them under.
REPORT_FILES = {"io_table": "io_table.csv", "dram_table": "dram_table.csv", "decode_table": "decode_table.csv",
                "m_sweep": "m_sweep.csv",
                "n_sweep": "n_sweep.csv", "m_sweep_png": "m_sweep.png", "n_sweep_png": "n_sweep.png"}


#: The report's decoding section: one decode step (Nq = 1) of a Llama-3-8B-like attention layer
#: (32 query heads, 8 kv heads, d = 128, bf16), Bc = 128 key rows per block, a paged cache of
#: DECODE_PAGE-row pages, on the DECODE_GPU preset, for each batch size and cache length.
DECODE_SHAPE = dict(heads=32, kv_heads=8, seq_len_q=1, head_dim=128, dtype="bf16")
DECODE_BATCHES = (1, 16)
DECODE_NK = (4096, 65536, 1048576)
DECODE_BLOCK_N = 128
DECODE_PAGE = 16
DECODE_GPU = "h100"


def decode_records(batches: Sequence[int] = DECODE_BATCHES, nks: Sequence[int] = DECODE_NK,
                   gpu: str = DECODE_GPU) -> list[dict]:
    """Bytes per generated token of one decode step (flashsim.decode_splits): the compulsory
    traffic and what the proposed split count and the paged cache add, per (batch, Nk)."""
    from .api import simulate
    from .config import Tiling
    from .decode_splits import decode_bounds, propose

    g = get_gpu(gpu)
    t = Tiling(1, DECODE_BLOCK_N)
    recs = []
    for b in batches:
        for nk in nks:
            w = Workload(batch=b, seq_len_k=nk, **DECODE_SHAPE)
            pr = propose(w, g, t, page_size=DECODE_PAGE)
            opts = {"num_splits": pr.num_splits, "page_size": DECODE_PAGE}
            bd = decode_bounds(w, t, sectors=False, **opts)
            r = simulate(w, "decode", "fwd", tiling=t, **opts)
            tokens = b * w.nq
            recs.append({"gpu": g.name, "batch": b, "seq_len_k": nk, "heads": w.heads, "kv_heads": w.hkv,
                         "head_dim": w.d, "dtype": w.dtype, "block_n": DECODE_BLOCK_N, "page_size": DECODE_PAGE,
                         "num_splits": pr.num_splits, "fa2_num_splits": pr.fa2_choice,
                         "programs": b * w.hkv * pr.num_splits, "num_sms": g.num_sms,
                         **{f"{k}_bytes": v for k, v in bd.items()},
                         "bytes_per_token": bd["schedule"] / tokens,
                         "compulsory_bytes_per_token": bd["compulsory"] / tokens,
                         "hbm_time_s": bd["schedule"] / g.hbm_bytes_per_s,
                         "walker_bytes": r.io.bytes, "agrees": r.agrees and r.io.bytes == bd["schedule"]})
    return recs


def decode_table(recs: Sequence[dict]) -> str:
    rows = [[r["batch"], f"{r['seq_len_k']:,}", f"{r['num_splits']} ({r['fa2_num_splits']})",
             f"{r['compulsory_bytes_per_token'] / 1e6:.2f}", f"{100 * r['split_bytes'] / r['compulsory_bytes']:.2f}",
             f"{100 * r['paging_bytes'] / r['compulsory_bytes']:.3f}", f"{r['bytes_per_token'] / 1e6:.2f}",
             f"{(r['schedule_bytes'] + r['no_gqa_packing_bytes']) / r['schedule_bytes']:.1f}x",
             f"{r['hbm_time_s'] * 1e6:.1f}"] for r in recs]
    return format_table(["batch", "Nk", "S (FA2)", "compulsory MB/token", "split +%", "paging +%",
                         "MB/token", "no GQA packing", "HBM us"], rows,
                        right=[True] * 9)


def run_report(out: str | Path = "flashsim-report", workload: Workload = DEFAULT_WORKLOAD,
               gpus: Sequence[str] = DEFAULT_GPUS, algos: Sequence[str] = DEFAULT_ALGOS,
               echo: Callable[[str], None] | None = print, plots: bool = True, force: bool = False) -> dict:
    """Run the report, write its files into ``out`` and return what it computed:
    ``{"io": records, "dram": records, "decode": records, "m_sweep": records, "n_sweep": records, "m_exponents": fits,
    "n_exponents": fits, "files": {name: Path}}``.

    ``out`` may be absent or an empty folder; one that holds a file of an earlier report is
    refused (``ValueError``, before any work) unless ``force``.  The files appear together at
    the end, or not at all.  ``echo`` receives the text the CLI prints (None: print nothing).
    """
    say = echo or (lambda s: None)
    t0 = time.perf_counter()
    w = workload
    files: dict[str, Path] = {}
    names = [n for k, n in REPORT_FILES.items() if plots or not k.endswith("_png")]
    with staged(out, names, force, "a previous report") as stage:
        out = Path(out)

        def target(key: str) -> Path:
            files[key] = out / REPORT_FILES[key]
            return stage / REPORT_FILES[key]

        say(f"flashsim report: attention with batch {w.batch}, {w.heads} heads, N = {w.nq}, d = {w.d}, {w.dtype}"
            f"{', causal' if w.causal else ''} (the paper's GPT-2 medium)")
        say("M = the GPU's shared memory per thread block; Bc = ⌈M/4d⌉, Br = min(Bc, d) (the paper's rule); "
            "roofline = max(FLOPs at peak, bytes at HBM bandwidth)")
        say("")

        io = io_records(w, gpus, algos, DEFAULT_PASSES)
        say(io_table(io))
        bad = [f"{r['gpu']} {r['algo']} {r['pass']}" for r in io if not r["agrees"]]
        say(f"walker and closed form agree on every run: {'yes' if not bad else 'NO: ' + ', '.join(bad)}")
        write_csv(io, target("io_table"))
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
            if "flash1" in t and "flash2" in t and t["flash2"]["hbm_bytes"] > t["flash1"]["hbm_bytes"]:
                f1, f2 = t["flash1"], t["flash2"]
                tc, tr = cdiv(w.nk, f1["block_n"]), cdiv(w.nq, f2["block_m"])
                say(_wrap(f"so flash2 moves {f2['hbm_bytes'] / f1['hbm_bytes']:.2f}x flash1's forward bytes: the "
                          f"paper's rule caps its query block at Br = d = {f2['block_m']}, and reading K and V "
                          f"Tr = {tr} times ({2 * tr} N·d) costs more than flash1's Q read and O read and write "
                          f"Tc = {tc} times (about {3 * tc} N·d)", "  "))

        # DRAM level: what reaches HBM after the L2, beside what the kernels request
        dram = dram_records(w, DRAM_GPUS, algos)
        write_csv(dram, target("dram_table"))
        say("")
        say(_wrap("LSU level (what the schedule requests, the walker) beside the DRAM level (what reaches HBM "
                  "through the GPU's L2, the trace-driven model flashsim.l2, one L2 set in "
                  f"{DRAM_SAMPLE} simulated), forward + backward:"))
        say(dram_table(dram))

        # M sweep: forward traffic against on-chip memory
        m_values = [4 * w.d * b for b in M_SWEEP_BLOCKS]
        m_recs = _sweep(w, "M", m_values, gpus, algos, ("fwd",))
        m_fits = exponents(m_recs, "M")
        write_csv(m_recs, target("m_sweep"))
        say("")
        say(f"M sweep (forward, M = {m_values[0]:,} .. {m_values[-1]:,} elements, Bc = {M_SWEEP_BLOCKS[0]} .. "
            f"{M_SWEEP_BLOCKS[-1]}): HBM bytes ∝ M^exponent")
        say(_exponent_table(m_fits))  # every GPU: at a given M the bytes are the same, the roofline time is not
        for line in m_sweep_notes(m_recs, w):
            say(_wrap(line))

        # N sweep: traffic against sequence length
        n_recs = _sweep(w, "N", N_SWEEP, gpus, algos, DEFAULT_PASSES)
        n_fits = exponents(n_recs, "N")
        write_csv(n_recs, target("n_sweep"))
        say("")
        say(f"N sweep (N = {N_SWEEP[0]:,} .. {N_SWEEP[-1]:,}, M of each GPU): HBM bytes ∝ N^exponent")
        say(_exponent_table(n_fits))

        # Decoding: bytes per generated token against the cache length
        dec = decode_records()
        write_csv(dec, target("decode_table"))
        say("")
        say(_wrap(f"Decoding (flashsim.decode_splits): one step, Nq = 1, of 32 query heads on 8 kv heads, d = 128, "
                  f"bf16, Bc = {DECODE_BLOCK_N}, pages of {DECODE_PAGE} rows, on the {dec[0]['gpu']} preset; S = the "
                  "proposed num_splits (flash-attention's heuristic in brackets); compulsory = Q, each cached K/V "
                  "byte, O and L once; split and paging: what the Op/Lp round trip and Q re-reads, and the "
                  "block-table reads, add; no GQA packing: the bytes if each query head's program read K/V itself; "
                  "HBM us: the bytes at the preset's bandwidth"))
        say(decode_table(dec))
        bad = [f"B {r['batch']} Nk {r['seq_len_k']}" for r in dec if not r["agrees"]]
        say("walker, closed form and compulsory + overheads agree on every row: "
            + ("yes" if not bad else "NO: " + ", ".join(bad)))

        if plots:
            plot_two_panels(m_recs, "sram_elems", target("m_sweep_png"),
                            f"forward, N = {w.nq}, d = {w.d}, {w.dtype}, B·H = {w.bh}: effect of the SRAM size M",
                            "M (elements)", m_recs[0]["gpu"],
                            bytes_label="HBM traffic (GB), any GPU")
            g0 = n_recs[0]["gpu"]
            m0 = next(r["sram_elems"] for r in n_recs if r["gpu"] == g0 and r["sram_elems"])
            plot_two_panels(n_recs, "seq_len_q", target("n_sweep_png"),
                            f"d = {w.d}, {w.dtype}, B·H = {w.bh}: effect of the sequence length N",
                            "N (tokens)", g0, bytes_label=f"HBM traffic (GB) at M = {m0:,} ({g0})")
    say("")
    say(f"wrote {len(files)} files to {out}/ in {time.perf_counter() - t0:.1f} s:")
    for p in files.values():
        say(f"  {p}")
    return {"io": io, "dram": dram, "decode": dec, "m_sweep": m_recs, "n_sweep": n_recs, "m_exponents": m_fits,
            "n_exponents": n_fits, "files": files}
