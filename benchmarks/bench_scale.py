"""How the simulator scales with N: time and peak memory of ``simulate`` (walker + closed form,
sector counts included) at N = 2^10 ... 2^20, for every algorithm and pass, dense and causal.

    python benchmarks/bench_scale.py [--max-log2n 20] [--out benchmarks/bench_scale.csv] [--force]

Two SRAM sizes per algorithm: ``min``, the smallest the algorithm accepts (the worst case for the
walker: flash1 and flash2 with M = 4d, i.e. 1 x 1 blocks, standard with 1 x 1 GEMM tiles,
smallcache with M = 5, i.e. 1 x 1 tiles; 10^12 block pairs at N = 2^20), and ``h100``, an H100's
227 KiB of shared memory per thread block (fp16), with standard's default 128 x 128 GEMM tiles.
d = 64, batch 1, 2 heads, fp16.  The target (issue 16): under 2 s and 1 GB at any N <= 2^20, on
one core.  Peak memory is what :mod:`tracemalloc` sees (numpy's arrays included), per run;
the process's maximum resident size is printed at the end.

Prints a table and writes it as CSV (to a temporary name, then renamed; an existing file is kept
unless ``--force``).  Exits non-zero when a run's walker and closed form disagree.
"""

from __future__ import annotations

import csv
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from flashsim.cmdline import ToolParser

# the flashsim of this checkout, whatever flashsim the environment has installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashsim.api import simulate  # noqa: E402
from flashsim.config import Workload  # noqa: E402

RUNS = [("flash1", "fwd"), ("flash1", "bwd"), ("flash2", "fwd"), ("flash2", "bwd"), ("standard", "fwd"),
        ("standard", "bwd"), ("smallcache", "fwd")]
D = 64
H100_M = 227 * 1024 // 2


def kwargs(algo: str, m: str) -> dict:
    if m == "min":
        return {"standard": {"gemm_block": 1}, "smallcache": {"sram_elems": 5}}.get(algo, {"sram_elems": 4 * D})
    return {} if algo == "standard" else {"sram_elems": H100_M}


def run(algo: str, pass_: str, n: int, causal: bool, m: str) -> dict:
    w = Workload(batch=1, heads=2, seq_len_q=n, head_dim=D, causal=causal)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        r = simulate(w, algo, pass_, **kwargs(algo, m))
        secs = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"algo": algo, "pass": pass_, "causal": causal, "M": m, "N": n, "seconds": round(secs, 4),
            "peak_mib": round(peak / 2**20, 1), "hbm_bytes": r.io.bytes, "sectors": r.io.sectors,
            "agrees": r.agrees}


def write_csv_atomic(rows: list[dict], path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise SystemExit(f"bench_scale: error: {path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-log2n", type=int, default=10)
    ap.add_argument("--max-log2n", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "bench_scale.csv")
    ap.add_argument("--force", action="store_true", help="overwrite an existing --out")
    a = ap.parse_args(argv)
    if a.out.exists() and not a.force:
        ap.error(f"{a.out} exists; pass --force to overwrite it")
    rows = []
    for m in ("min", "h100"):
        for algo, pass_ in RUNS:
            for causal in (False, True):
                if algo == "smallcache" and causal:
                    continue
                for k in range(a.min_log2n, a.max_log2n + 1):
                    rows.append(run(algo, pass_, 2**k, causal, m))
    print(f"{'M':5} {'algorithm':10} {'pass':4} {'causal':6} " + " ".join(f"{'2^' + str(k):>13}" for k in
                                                                         range(a.min_log2n, a.max_log2n + 1)))
    print(f"{'':28}" + "  (seconds / peak MiB per N)")
    keys = sorted({(r["M"], r["algo"], r["pass"], r["causal"]) for r in rows},
                  key=lambda x: (x[0] != "min", [r for r, _ in RUNS].index(x[1]), x[2], x[3]))
    for key in keys:
        cells = [r for r in rows if (r["M"], r["algo"], r["pass"], r["causal"]) == key]
        print(f"{key[0]:5} {key[1]:10} {key[2]:4} {key[3]!s:6} "
              + " ".join(f"{c['seconds']:6.2f}/{c['peak_mib']:6.1f}" for c in cells))
    worst_t = max(rows, key=lambda r: r["seconds"])
    worst_m = max(rows, key=lambda r: r["peak_mib"])
    print(f"slowest: {worst_t['algo']} {worst_t['pass']} causal={worst_t['causal']} M={worst_t['M']} "
          f"N={worst_t['N']}: {worst_t['seconds']:.2f} s; largest: {worst_m['algo']} {worst_m['pass']} "
          f"N={worst_m['N']}: {worst_m['peak_mib']:.0f} MiB traced; process max RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    write_csv_atomic(rows, a.out, a.force)
    print(f"wrote {a.out}")
    bad = [r for r in rows if not r["agrees"]]
    if bad:
        print(f"bench_scale: error: walker != closed form in {len(bad)} runs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
