"""L2 probe: what happens to a launch's dirty lines while it also reads, under Nsight Compute.

The H200 torch record's short launches whose stores fit in the L2 many times over still write to
DRAM: nvjet's P·V GEMM at N = 1,024 stores O (2.1 MB) while it streams P (33.5 MB) and writes
1.07 MB of it to DRAM in 13 µs, PyTorch's copy kernels store 16.8 MB beside 16.8 MB of reads
and write 0.8-1.0 MB; flashsim.l2 predicts 0 for all of them (its calibration stores, or reads,
never both in one launch: analysis/data/l2calib).  These probes store W MiB and read R MiB of
another buffer in one launch, coalesced, by a persistent grid (4 blocks of 256 threads an SM):

* ``interleaved R W``: a grid-width of the read buffer each step, and a grid-width of the
  written one every R/W steps (a GEMM's output tiles spread through its operand stream);
* ``read_write R W``: the reads, then the stores;
* ``write_read R W``: the stores, then the reads (the stored lines under a later stream).

On the GPU machine, from the repository root::

    python3 scripts/device/l2_readwrite.py --out "$OUT"

runs itself under ``ncu --cache-control all`` (each probe one launch, from a clean L2) and
writes ``$OUT/l2_readwrite.csv`` (probe, R, W, DRAM bytes read and written, LSU bytes, time),
``.ncu-raw.csv`` and ``.meta.json``, each under a temporary name first, and prints the table.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import MEASURED, measure, write_csv, write_json  # noqa: E402
from numba import cuda, float32  # noqa: E402

from flashsim.provenance import git_state  # noqa: E402

MIB = 1 << 20
THREADS = 256
BLOCKS_PER_SM = 4
MODES = {"interleaved": 0, "read_write": 1, "write_read": 2}


def probes() -> list[dict]:
    out = [{"probe": "interleaved", "read_mib": r, "write_mib": 2} for r in (8, 16, 24, 28, 32, 36, 40, 48, 64)]
    out += [{"probe": "interleaved", "read_mib": r, "write_mib": 8} for r in (8, 16, 24, 32, 40)]
    out += [{"probe": "interleaved", "read_mib": r, "write_mib": 16} for r in (16, 32)]
    for probe in ("read_write", "write_read"):
        out += [{"probe": probe, "read_mib": r, "write_mib": 2} for r in (16, 32, 40, 64)]
        out += [{"probe": probe, "read_mib": r, "write_mib": 8} for r in (16, 32)]
    out += [{"probe": "interleaved", "read_mib": 0, "write_mib": w} for w in (2, 16)]  # stores alone
    return out


@cuda.jit
def read_write(src, nr, dst, nw, mode, out):
    """``nr`` floats of ``src`` read and ``nw`` of ``dst`` stored, grid-stride (both multiples of
    the grid's width); ``mode`` as :data:`MODES`."""
    g = cuda.grid(1)
    t = cuda.gridsize(1)
    acc = float32(0)
    if mode == 0:
        steps = nr // t
        ratio = max(1, nr // max(nw, 1))
        if steps == 0:
            for k in range(g, nw, t):
                dst[k] = float32(1)
        for i in range(steps):
            acc += src[i * t + g]
            if nw > 0 and i % ratio == 0 and (i // ratio) * t < nw:
                dst[(i // ratio) * t + g] = float32(1)
    elif mode == 1:
        for k in range(g, nr, t):
            acc += src[k]
        for k in range(g, nw, t):
            dst[k] = float32(1)
    else:
        for k in range(g, nw, t):
            dst[k] = float32(1)
        for k in range(g, nr, t):
            acc += src[k]
    if acc == float32(-1):  # never true: keeps the loads
        out[0] = acc


def worker() -> int:
    import numpy as np

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    grid = BLOCKS_PER_SM * sms
    src = cuda.to_device(np.zeros(64 * MIB // 4, dtype=np.float32))
    dst = cuda.to_device(np.zeros(16 * MIB // 4, dtype=np.float32))
    sink = cuda.device_array(1, dtype=np.float32)
    read_write[grid, THREADS](src, grid * THREADS, dst, grid * THREADS, 0, sink)  # compile outside
    cuda.synchronize()
    width = grid * THREADS
    for p in probes():
        nr = p["read_mib"] * MIB // 4 // width * width
        nw = p["write_mib"] * MIB // 4 // width * width
        cuda.profile_start()
        read_write[grid, THREADS](src, nr, dst, nw, MODES[p["probe"]], sink)
        cuda.synchronize()
        cuda.profile_stop()
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_readwrite", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    rows = [{**p, **{k: ln[k] for k in MEASURED}, "gpu": smi} for p, ln in pairs]
    write_csv(out / "l2_readwrite.csv", rows)
    for r in rows:
        print(f"{r['probe']:<12} R {r['read_mib']:3d} W {r['write_mib']:3d} MiB  DRAM read "
              f"{r['dram_read_bytes'] / MIB:8.2f} write {r['dram_write_bytes'] / MIB:7.2f} MiB  "
              f"LSU st {r['lsu_st_bytes'] / MIB:7.2f} MiB  {r['time_ns'] / 1e3:8.1f} us")
    write_json(out / "l2_readwrite.meta.json", {
        "gpu": smi, "command": cmd, "blocks_per_sm": BLOCKS_PER_SM, "threads": THREADS, **git_state(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
