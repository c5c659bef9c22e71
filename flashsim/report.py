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
from .config import Hardware, Workload

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
    out.update(io.to_dict())
    out["sectors"] = io.sectors
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


def io_records(workload: Workload = DEFAULT_WORKLOAD, gpus: Sequence[str] = DEFAULT_GPUS,
               algos: Sequence[str] = DEFAULT_ALGOS, passes: Sequence[str] = DEFAULT_PASSES) -> list[dict]:
    """One record per (GPU, algorithm, pass): HBM traffic, FLOPs and roofline time.

    Tiled algorithms run with M = the GPU's shared memory per thread block (in elements of the
    workload's dtype) and the paper's block-size rule Bc = ⌈M/4d⌉, Br = min(Bc, d).
    """
    from .api import simulate
    from .config import get_gpu

    fl, rf = optional_module("flops"), optional_module("roofline")
    recs = []
    for g in gpus:
        gpu = get_gpu(g)
        m = gpu.sram_elems(workload.elem_bytes)
        for algo in algos:
            for p in passes:
                res = simulate(workload, algo, p, sram_elems=m)
                io = res.io
                rec = {
                    "gpu": gpu.name, "algorithm": algo, "pass": p, "sram_elems": m,
                    "block_m": res.tiling.block_m if res.tiling else None,
                    "block_n": res.tiling.block_n if res.tiling else None,
                    "hbm_read_bytes": io.read_bytes, "hbm_write_bytes": io.write_bytes, "hbm_bytes": io.bytes,
                    "sectors": io.sectors, "closed_form_agrees": res.agrees,
                    "matmul_flops": None, "nonmatmul_flops": None, "roofline_s": None, "bound": None,
                }
                if fl is not None:
                    f = fl.flops(workload, p, algo, tiling=res.tiling)
                    rec["matmul_flops"], rec["nonmatmul_flops"] = int(f["matmul"]), int(f["nonmatmul"])
                if rf is not None:
                    r = rf.roofline(res, gpu)
                    rec["roofline_s"], rec["bound"] = float(r["time_s"]), str(r["bound"])
                recs.append(rec)
    return recs


def io_table(recs: Sequence[dict]) -> str:
    rows = []
    for r in recs:
        flops = None if r["matmul_flops"] is None else r["matmul_flops"] + r["nonmatmul_flops"]
        rows.append([
            r["gpu"], r["algorithm"], r["pass"],
            "-" if r["block_m"] is None else f"{r['block_m']}x{r['block_n']}",
            r["hbm_read_bytes"] / 1e9, r["hbm_write_bytes"] / 1e9, r["hbm_bytes"] / 1e9,
            None if flops is None else flops / 1e9,
            None if r["roofline_s"] is None else r["roofline_s"] * 1e3,
            r["bound"] or "-",
        ])
    return format_table(["gpu", "algorithm", "pass", "Br x Bc", "read GB", "write GB", "total GB", "GFLOP",
                         "roofline ms", "bound"], rows)


def _write_csv(recs: Sequence[dict], path: Path) -> None:
    import csv

    keys: list[str] = []
    for r in recs:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        for r in recs:
            wr.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})


def run_report(out: str | Path = "flashsim-report", workload: Workload = DEFAULT_WORKLOAD,
               gpus: Sequence[str] = DEFAULT_GPUS, algos: Sequence[str] = DEFAULT_ALGOS,
               echo: Callable[[str], None] | None = print) -> dict:
    """Run the report, write its files into ``out`` and return ``{"records": ..., "files": ...}``.

    ``echo`` receives the text the CLI prints (None: print nothing).
    """
    say = echo or (lambda s: None)
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    w = workload
    say(f"flashsim report: {w.batch} x {w.heads} heads, N = {w.nq}, d = {w.d}, {w.dtype}"
        f"{', causal' if w.causal else ''}; GPUs {', '.join(gpus)}; M = shared memory per thread block")
    recs = io_records(w, gpus, algos, DEFAULT_PASSES)
    say("")
    say(io_table(recs))
    files["io_table"] = out / "io_table.csv"
    _write_csv(recs, files["io_table"])
    say("")
    say(f"wrote {len(files)} files to {out}/ in {time.perf_counter() - t0:.1f} s:")
    for p in files.values():
        say(f"  {p}")
    return {"records": {"io": recs}, "files": files}
