"""Reads and stores interleaved in one grid-stride stream: how much of the stored data reaches
DRAM while the launch runs (issue 14)?

The fast backward's ``dq_to_f16`` (read the fp32 dQ accumulator, store fp16 dQ) writes 5.1-5.3
MB on the H200 at B·H = 16, N = 4,096, d = 128 (33.6 MB read, 16.8 MB stored), where flashsim.l2
predicts 2.8; the readwrite and evict probes (l2_readwrite.py, l2_evict_probe.py) stored first
and read after.  Here each thread of a grid-stride loop (1,056 blocks of 256) reads ``ratio``
consecutive floats of one buffer and stores one float of another, so that the stores are spread
evenly through the reads, as an element-wise kernel spreads them:

* ``rw W ratio``: W MiB stored, ratio x W MiB read, ratio 1, 2 and 4, W = 4, 8, 16 and 32 MiB;
* ``w W``: the stores alone (ratio 0), the control.

Each case one launch under ``ncu --cache-control all`` with analysis.ncu's METRICS (the
calibration's 7), the list twice (the second time reversed) after one uncounted fill.  On the
GPU machine, from the repository root::

    python3 scripts/device/l2_interleave_probe.py --out "$OUT"

writes ``$OUT/l2_interleave.csv`` (case, W, ratio, DRAM bytes read and written, LSU bytes, time)
with the raw export and the metadata, and prints the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import fill, measure, repeated, row, save  # noqa: E402
from numba import cuda, float32, int32  # noqa: E402

MIB = 1 << 20
REPEATS = 2


def cases() -> list[dict]:
    out = [{"probe": "rw", "shape": (w * MIB // 4,), "write_mib": w, "ratio": r} for w in (4, 8, 16, 32)
           for r in (1, 2, 4)]
    return out + [{"probe": "w", "shape": (w * MIB // 4,), "write_mib": w, "ratio": 0} for w in (16, 32)]


def probes() -> list[dict]:
    return repeated(cases, REPEATS, (64 * MIB // 4,))


@cuda.jit
def interleave(src, dst, ratio):
    # element k of dst = the sum of src[ratio·k .. ratio·k + ratio): a warp reads ratio x 128
    # consecutive bytes and stores 128
    for k in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        acc = float32(1)
        for j in range(ratio):
            acc += src[ratio * k + j]
        dst[k] = acc


def worker() -> int:
    import numpy as np

    fill[4, 256](cuda.device_array(1024, dtype=np.float32))  # compile outside the profiled region
    interleave[4, 256](cuda.device_array(4096, dtype=np.float32), cuda.device_array(1024, dtype=np.float32),
                       int32(2))
    src = cuda.device_array(128 * MIB // 4, dtype=np.float32)
    fill[1056, 256](src)
    cuda.synchronize()
    for p in probes():
        dst = cuda.device_array(p["shape"], dtype=np.float32)
        fill[1056, 256](dst)  # resident pages, then cold under ncu
        cuda.synchronize()
        cuda.profile_start()
        if p["probe"] == "rw":
            interleave[1056, 256](src, dst, int32(p["ratio"]))
        else:
            fill[1056, 256](dst)
        cuda.synchronize()
        cuda.profile_stop()
        del dst
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_interleave", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    rows = [row({"probe": p["probe"], "write_mib": p.get("write_mib", ""), "ratio": p.get("ratio", ""),
                 "rep": p.get("rep", "")}, ln, smi) for p, ln in pairs]
    return save(out, "l2_interleave", rows, lambda r: (
        f"{r['probe']:<6} W {str(r['write_mib']):>3} MiB ratio {str(r['ratio']):>2} #{r['rep']}  "
        f"stored {r['lsu_st_bytes'] / MIB:7.2f} MiB  read {r['lsu_ld_bytes'] / MIB:7.2f}  "
        f"DRAM read {r['dram_read_bytes'] / MIB:7.2f}  write {r['dram_write_bytes'] / MIB:7.2f} MiB  "
        f"{r['time_ns'] / 1e3:8.1f} us"), smi, command=cmd)


if __name__ == "__main__":
    raise SystemExit(main())
