"""Under a read stream, are a launch's dirty lines evicted, or written back and kept, and sooner
than clean lines (issue 14)?

l2_readwrite.py found that a launch that stores W MiB and then reads R MiB of another buffer
writes part of W to DRAM from R = 28-32 MiB (0.22 of W at R = 32, 0.74 at 40), where flashsim.l2,
its capacity set by the grid's re-reads (42.6 MiB on the H200), writes none below 48 MiB.  Here
one launch (a persistent grid, 4 blocks of 256 threads an SM, every phase grid-stride and
coalesced) does three phases:

* ``dirty W R``: stores W MiB, reads R MiB of another buffer, then loads the W MiB again;
* ``clean W R``: loads W MiB, reads R MiB, then loads the W MiB again;

the last phase reading each line through another thread than the one that wrote or first read it
(half the grid's width further on), so that nothing is forwarded in registers.  DRAM reads beyond
R (and beyond the first W in ``clean``) are the lines of W the L2 gave up; DRAM writes in
``dirty`` are the dirty lines written back, evicted or kept.  R = 0 is the control (reading back,
in the same launch, what the grid has just written misses part of it even at 8 MiB: the
calibration's ``write_read`` case).  On the GPU machine, from the repository root::

    python3 scripts/device/l2_evict_probe.py --out "$OUT"

writes ``$OUT/l2_evict.csv`` (probe, W, R, DRAM bytes read and written, LSU bytes, time) with the
raw export and the metadata, and prints the table with the lines lost and written back as
shares of W.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import measure, row, save  # noqa: E402
from numba import cuda, float32, int32  # noqa: E402

MIB = 1 << 20
THREADS = 256
BLOCKS_PER_SM = 4
READS_MIB = (0, 16, 24, 28, 32, 36, 40, 48, 64)


def probes() -> list[dict]:
    return [{"probe": p, "write_mib": w, "read_mib": r} for p in ("dirty", "clean") for w in (2, 8)
            for r in READS_MIB]


@cuda.jit
def three_phases(src, nr, dst, nw, dirty, out):
    g = cuda.grid(1)
    t = cuda.gridsize(1)
    acc = float32(0)
    if dirty:
        for k in range(g, nw, t):
            dst[k] = float32(1)
    else:
        for k in range(g, nw, t):
            acc += dst[k]
    for k in range(g, nr, t):
        acc += src[k]
    shift = t // 64 * 32  # half the grid's width, whole 128-byte lines
    for k in range(g, nw, t):
        j = k + shift
        if j >= nw:
            j -= nw
        acc += dst[j]
    if acc == float32(-1):  # never true: keeps the loads
        out[0] = acc


def worker() -> int:
    import numpy as np

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    grid = BLOCKS_PER_SM * sms
    width = grid * THREADS
    src = cuda.to_device(np.zeros(64 * MIB // 4, dtype=np.float32))
    dst = cuda.to_device(np.zeros(8 * MIB // 4, dtype=np.float32))
    sink = cuda.device_array(1, dtype=np.float32)
    three_phases[grid, THREADS](src, width, dst, width, int32(1), sink)  # compile outside
    cuda.synchronize()
    for p in probes():
        nr = p["read_mib"] * MIB // 4 // width * width
        nw = p["write_mib"] * MIB // 4 // width * width
        cuda.profile_start()
        three_phases[grid, THREADS](src, nr, dst, nw, int32(p["probe"] == "dirty"), sink)
        cuda.synchronize()
        cuda.profile_stop()
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_evict", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    rows = [row(p, ln, smi) for p, ln in pairs]
    return save(out, "l2_evict", rows, lambda r: (
        f"{r['probe']:<6} W {r['write_mib']:2d} R {r['read_mib']:3d} MiB  "
        f"DRAM read {r['dram_read_bytes'] / MIB:8.2f} write {r['dram_write_bytes'] / MIB:7.2f} MiB  "
        f"LSU ld {r['lsu_ld_bytes'] / MIB:7.2f} st "
        f"{r['lsu_st_bytes'] / MIB:6.2f} MiB  {r['time_ns'] / 1e3:7.1f} us"),
        smi, command=cmd, blocks_per_sm=BLOCKS_PER_SM, threads=THREADS)


if __name__ == "__main__":
    raise SystemExit(main())
