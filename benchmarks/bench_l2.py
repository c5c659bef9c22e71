"""How fast the L2 model (flashsim.l2) replays a launch, and what set sampling costs in accuracy.

    python benchmarks/bench_l2.py [--seq-len 16384] [--head-dim 64] [--gpu h100] [--sample 16] [--out PATH]

Times :func:`flashsim.l2.dram_traffic` on one core for the FlashAttention-2 forward launch at
N = ``--seq-len``, d = ``--head-dim``, B·H = 16, fp16, the kernel's blocks (64 x 32 at d <= 64:
about 17 GB of L2 requests at N = 16,384) and for standard attention's forward at N = 4,096
(three launches, 4.3 GB of requests): exactly (every set) and with set sampling (one set in
``--sample``), and the sampled counts' error against the exact ones.  Each timing is the best
of ``--repeats`` runs after one warm-up run (which compiles the numba code).  Prints a table;
writes it as CSV only when ``--out`` is given.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flashsim.cmdline import ToolParser

# the flashsim of this checkout, whatever flashsim the environment has installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashsim.api import build_schedule
from flashsim.config import Tiling, Workload, get_gpu
from flashsim.l2 import dram_traffic
from flashsim.sweep import write_csv


def timed(sched, gpu, sample: int, repeats: int):
    best, r = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = dram_traffic(sched, gpu, cold_launches=True, sample=sample)
        best = min(best, time.perf_counter() - t0)
    return best, r


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the table as CSV here (default: print only)")
    a = ap.parse_args(argv)
    gpu = get_gpu(a.gpu)
    small = Workload(batch=1, heads=2, seq_len_q=256, head_dim=64)
    dram_traffic(build_schedule(small, "flash2", "fwd", Tiling(64, 32)), gpu, sample=a.sample)  # compile
    cases = [
        (f"flash2 fwd N={a.seq_len} d={a.head_dim} B·H=16 64x32",
         build_schedule(Workload(batch=1, heads=16, seq_len_q=a.seq_len, head_dim=a.head_dim), "flash2", "fwd",
                        Tiling(64, 32))),
        ("standard fwd N=4096 d=64 B·H=16 gemm 32",
         build_schedule(Workload(batch=1, heads=16, seq_len_q=4096, head_dim=64), "standard", "fwd",
                        gemm_block=32)),
    ]
    rows = []
    for what, sched in cases:
        t_exact, exact = timed(sched, gpu, 1, a.repeats)
        t_samp, samp = timed(sched, gpu, a.sample, a.repeats)
        req = sum(x.requested_read_bytes + x.requested_write_bytes for x in exact.launches)
        for x, y in zip(exact.launches, samp.launches):
            rows.append({"case": what, "gpu": gpu.name, "launch": x.name, "requested_GB": round(req / 1e9, 3),
                         "exact_s": round(t_exact, 3), f"sampled_1/{a.sample}_s": round(t_samp, 3),
                         "dram_read_MB": round(x.read_bytes / 1e6, 3), "dram_write_MB": round(x.write_bytes / 1e6, 3),
                         "read_err_sampled": (y.read_bytes - x.read_bytes) / max(x.read_bytes, 1),
                         "write_err_sampled_vs_1MB": (y.write_bytes - x.write_bytes) / max(x.write_bytes, 10**6)})
    head = (f"{'case':<40} {'launch':<20} {'req GB':>7} {'exact s':>8} {'1/' + str(a.sample) + ' s':>7} "
            f"{'read MB':>9} {'write MB':>9} {'rd err':>8} {'wr err':>8}")
    print(f"GPU preset {gpu.name}: effective L2 {gpu.l2_effective_bytes / 2**20:.1f} MiB, {gpu.l2_ways} ways")
    print(head)
    for r in rows:
        print(f"{r['case']:<40} {r['launch']:<20} {r['requested_GB']:>7.2f} {r['exact_s']:>8.2f} "
              f"{r[f'sampled_1/{a.sample}_s']:>7.2f} {r['dram_read_MB']:>9.2f} {r['dram_write_MB']:>9.2f} "
              f"{100 * r['read_err_sampled']:>7.3f}% {100 * r['write_err_sampled_vs_1MB']:>7.3f}%")
    if a.out:
        write_csv(rows, a.out)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
