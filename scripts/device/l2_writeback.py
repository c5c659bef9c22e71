"""L2 write-back and re-read probes under Nsight Compute (what flashsim.l2 does not yet model).

On the GPU machine, from the repository root::

    python3 scripts/device/l2_writeback.py --out "$OUT"

runs itself under ``ncu --cache-control all`` (each probe one launch, cold, as the attention
record was measured) and writes ``$OUT/l2_writeback.csv`` (probe, parameters, DRAM bytes read and
written, time) and ``$OUT/l2_writeback.ncu-raw.csv``, and prints the table.  The probes:

* ``fill W``: one coalesced pass of float32 stores over W MiB.  A write-back L2 that keeps dirty
  lines until they are evicted shows max(0, W - capacity) of DRAM writes; more means dirty lines
  are written back before anything evicts them.
* ``fill_wait W T``: the same 8 MiB of stores, then the kernel stays alive T ms (one extra block
  sleeping): DRAM writes growing with T mean the L2 cleans dirty lines with time.
* ``rewrite W P``: each element stored P times, 1 ms apart (FlashAttention-1's O, rewritten Tc
  times while it sits in L2): DRAM writes against P.
* ``read R``: one pass of loads over R MiB (the control: R of DRAM reads).
* ``reread R``: every thread loads the whole R MiB buffer twice, in the same order (re-use
  distance R): DRAM reads / R between 1 and 2 give the capacity one kernel sees and, past it,
  whether replacement thrashes (LRU: 2) or keeps part of the buffer.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import MEASURED, measure, write_csv, write_json  # noqa: E402
from numba import cuda, float32, uint32  # noqa: E402

MIB = 1 << 20
FILL_MIB = (1, 2, 4, 8, 16, 20, 24, 28, 32, 40, 48, 64)
WAIT_MS = (0, 1, 4, 16, 64)
REWRITE_PASSES = (1, 2, 4, 8, 16)
READ_MIB = (8, 32)
REREAD_MIB = (8, 16, 20, 24, 28, 32, 40, 48, 64, 96)


def probes() -> list[dict]:
    out = [{"probe": "fill", "mib": w} for w in FILL_MIB]
    out += [{"probe": "fill_wait", "mib": 8, "ms": t} for t in WAIT_MS]
    out += [{"probe": "rewrite", "mib": 8, "passes": p} for p in REWRITE_PASSES]
    out += [{"probe": "read", "mib": r} for r in READ_MIB]
    out += [{"probe": "reread", "mib": r} for r in REREAD_MIB]
    return out


@cuda.jit
def fill(buf, n, passes, sleep_ms):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(passes):
        for k in range(i, n, stride):
            buf[k] = float32(p + 1)
        if p + 1 < passes:
            for _ in range(sleep_ms):
                for _ in range(1000):
                    cuda.nanosleep(uint32(1000))

@cuda.jit
def fill_wait(buf, n, sleep_ms):
    # the last block only sleeps; the others store
    if cuda.blockIdx.x == cuda.gridDim.x - 1:
        if cuda.threadIdx.x == 0:
            for _ in range(sleep_ms):
                for _ in range(1000):
                    cuda.nanosleep(uint32(1000))
        return
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    stride = (cuda.gridDim.x - 1) * cuda.blockDim.x
    for k in range(i, n, stride):
        buf[k] = float32(1)

@cuda.jit
def read(buf, n, passes, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = float32(0)
    for _ in range(passes):
        for k in range(i, n, stride):
            acc += buf[k]
    if acc == float32(-1):  # never true: keeps the loads
        out[0] = acc


def worker() -> int:
    import numpy as np

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    grid, threads = 4 * sms, 256
    big = cuda.to_device(np.zeros(max(REREAD_MIB + FILL_MIB) * MIB // 4, dtype=np.float32))
    sink = cuda.device_array(1, dtype=np.float32)
    warm = min(1024, big.size)
    fill[grid, threads](big, warm, 1, 0)  # compile outside the profiled region
    fill_wait[grid + 1, threads](big, warm, 0)
    read[grid, threads](big, warm, 1, sink)
    cuda.synchronize()
    for p in probes():
        n = p["mib"] * MIB // 4
        cuda.profile_start()
        if p["probe"] == "fill":
            fill[grid, threads](big, n, 1, 0)
        elif p["probe"] == "fill_wait":
            fill_wait[grid + 1, threads](big, n, p["ms"])
        elif p["probe"] == "rewrite":
            fill[grid, threads](big, n, p["passes"], 1)
        elif p["probe"] == "read":
            read[grid, threads](big, n, 1, sink)
        else:
            read[grid, threads](big, n, 2, sink)
        cuda.synchronize()
        cuda.profile_stop()
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_writeback", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    rows = [{"probe": p["probe"], "mib": p["mib"], "ms": p.get("ms", ""), "passes": p.get("passes", ""),
             **{k: ln[k] for k in MEASURED}, "gpu": smi} for p, ln in pairs]
    write_csv(out / "l2_writeback.csv", rows)
    for r in rows:
        print(f"{r['probe']:<10} {r['mib']:>4} MiB ms={r['ms']!s:<3} passes={r['passes']!s:<3} "
              f"DRAM read {r['dram_read_bytes'] / MIB:9.2f} MiB  write {r['dram_write_bytes'] / MIB:9.2f} MiB  "
              f"{r['time_ns'] / 1e6:9.3f} ms")
    write_json(out / "l2_writeback.meta.json", {"gpu": smi, "command": cmd})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
