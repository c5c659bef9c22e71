"""Why standard attention's fp16 S = QKᵀ leaves less dirty in the L2 than its fp32 twin (issue 14).

On the H200 record (analysis/data/h200, the calibration's 7 metrics) the fp16 launches of
``gemm_qk`` and ``gemm_dp`` (kernels/standard.py: 32 x 32 tiles, grid (Nk/32, Nq/32, B·H),
256 threads, one warp storing 32 consecutive elements) leave 25.2-25.5 MiB dirty where the fp32
``gemm_qk``, the fills and the paced fills (l2_dirty_probe.py) leave 27.6-28.4: the model, which
counts lines and caps them at 28.2 MiB, over-predicts their writes by 2.6-3.0%, the launches
that keep the record's median write error above 2%.  In fp16 a tile row is 64 bytes, half a
128-byte line, and the line's other half is the next block's.  One thing varied at a time, each
case one launch under ``ncu --cache-control all`` with analysis.ncu's METRICS:

* ``fill32``, ``fill16``: grid-stride stores of float32 or float16 over 128 MiB (1,056 blocks of
  256): every line completed by one block within a few instructions;
* ``tile32``, ``tile16`` (B·H x Nq x Nk): gemm_qk's grid, block and store order, without the
  products (each thread stores its column of the block's 32 x 32 tile);
* ``tile16_sleep``: the same, each block sleeping ``SLEEP_NS`` first (gemm_qk's blocks at N =
  2,048, d = 64 are resident about 38 us each);
* ``gemm16``, ``gemm32``: kernels.standard's gemm_qk itself, B·H = 16, N = 2,048, d = 64 (the
  record's launches, measured again here beside the rest);
* ``lag L``: float32 stores over 128 MiB, the first half of line i stored with the second half of
  line i - L (wrapping), L in lines: a line's two halves stored 128·L bytes of traffic apart (by
  the same warp, one instruction after the other, at L = 0).  A limit counted in lines leaves
  28 MiB at L = 0 and about half of it once L passes the limit;
* the same below the dirty limit (``fill32``, ``tile16`` and ``lag`` over 2-16 MiB): is a line
  stored in two parts written back early, or only counted twice against the limit?

The list runs twice, the second time in reverse order, after one fill that is not counted (the
first launch a worker profiles has left 2.5 MiB less dirty than its repeats: 25.55-25.68 MiB
where the same fill leaves 27.6-28.0).  The first run (c11781e, lags in MiB, no repeat) is kept
beside the second in analysis/data/l2calib/h200_l2_halfline/.

On the GPU machine, from the repository root::

    python3 scripts/device/l2_halfline_probe.py --out "$OUT"

writes ``$OUT/l2_halfline.csv`` (case, shape, DRAM bytes read and written, stores, dirty bytes
left = stores - DRAM writes) with the raw export and the metadata, and prints the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import fill, measure, repeated, row, save  # noqa: E402
from numba import cuda, float32, int32, uint32  # noqa: E402

MIB = 1 << 20
#: a gemm_qk block's residence at N = 2,048, d = 64 on the H200 (2.36 ms for 65,536 blocks in
#: waves of 1,056)
SLEEP_NS = 30000
#: lag cases, in lines: 0 (one warp, back to back), a line to 1 MiB, 8 MiB (below the dirty
#: limit), 48, 64 and 96 MiB (beyond it; 64 MiB is half the buffer, each line's two halves that
#: far apart both ways)
LAGS = (0, 1, 16, 128, 1024, 8192, 65536, 393216, 524288, 786432)
#: each case's repeats (the second pass in reverse order)
REPEATS = 2


def cases() -> list[dict]:
    out = [{"probe": "fill32", "shape": (128 * MIB // 4,)}, {"probe": "fill16", "shape": (128 * MIB // 2,)}]
    out += [{"probe": "tile32", "shape": s} for s in ((16, 2048, 1024), (16, 2048, 2048))]
    out += [{"probe": "tile16", "shape": s} for s in ((16, 1024, 1024), (16, 2048, 2048), (16, 4096, 4096))]
    out += [{"probe": "tile16_sleep", "shape": (16, 2048, 2048)}]
    out += [{"probe": "gemm16", "shape": (16, n, n)} for n in (1024, 2048, 4096)]
    out += [{"probe": "gemm32", "shape": (16, 2048, 2048)}]
    out += [{"probe": "lag", "shape": (128 * MIB // 4,), "lag_lines": n} for n in LAGS]
    # below the dirty limit
    out += [{"probe": "fill32", "shape": (8 * MIB // 4,)}]
    out += [{"probe": "tile16", "shape": s} for s in ((16, 256, 256), (16, 512, 512))]
    out += [{"probe": "lag", "shape": (w * MIB // 4,), "lag_lines": n} for w in (8, 16) for n in (0, 1024, 8192)]
    return out


def probes() -> list[dict]:
    """The launches in the order profiled: the uncounted fill, then the cases REPEATS times."""
    return repeated(cases, REPEATS, (64 * MIB // 4,))


@cuda.jit
def tile(c, ns):
    # gemm_qk's store: block (j, i, p) owns C[p, 32i:32i+32, 32j:32j+32], thread (ty, tx) rows
    # ty, ty + 8, ... of column tx (kernels/standard.py, _abt_fn with a 32 x 8 block)
    if ns > 0:
        cuda.nanosleep(ns)
    tx = cuda.threadIdx.x
    j0 = cuda.blockIdx.x * 32
    i0 = cuda.blockIdx.y * 32
    p = cuda.blockIdx.z
    for r in range(cuda.threadIdx.y, 32, 8):
        c[p, i0 + r, j0 + tx] = float32(1)


@cuda.jit
def halves(buf, lag):
    # float k of the first halves: line k // 16, float k % 16; with it the same float of the
    # second half of line k // 16 - lag
    nlines = buf.size // 32
    for k in range(cuda.grid(1), nlines * 16, cuda.gridsize(1)):
        line = k // 16
        off = k % 16
        buf[line * 32 + off] = float32(1)
        other = line - lag
        if other < 0:
            other += nlines
        buf[other * 32 + 16 + off] = float32(1)


def worker() -> int:
    import numpy as np

    from kernels.standard import _dummy, _kernel

    gemm = _kernel("gemm_qk", False, 32)
    ctr = _dummy("counters")
    rng = np.random.default_rng(0)
    qk = {(dt, n): cuda.to_device(rng.standard_normal((16, n, 64)).astype(dt))
          for dt in (np.float16, np.float32) for n in (1024, 2048, 4096)}
    small = {dt: cuda.device_array((1, 32, 32), dtype=dt) for dt in (np.float16, np.float32)}
    for dt in (np.float16, np.float32):  # compile outside the profiled region
        fill[4, 256](cuda.device_array(1024, dtype=dt))
        tile[(1, 1, 1), (32, 8)](small[dt], uint32(0))
        gemm[(1, 1, 1), (32, 8)](qk[dt, 1024], qk[dt, 1024], small[dt], int32(1), ctr)
    halves[4, 256](cuda.device_array(1024, dtype=np.float32), int32(1))
    cuda.synchronize()
    for p in probes():
        name = p["probe"]
        dt = np.float16 if "16" in name else np.float32
        buf = cuda.device_array(p["shape"], dtype=dt)
        fill[1056, 256](buf.reshape(buf.size))  # resident pages, then cold under ncu
        cuda.synchronize()
        cuda.profile_start()
        if name.startswith("fill") or name == "first":
            fill[1056, 256](buf)
        elif name.startswith("tile"):
            b, nq, nk = p["shape"]
            tile[(nk // 32, nq // 32, b), (32, 8)](buf, uint32(SLEEP_NS if name.endswith("sleep") else 0))
        elif name.startswith("gemm"):
            b, nq, nk = p["shape"]
            gemm[(nk // 32, nq // 32, b), (32, 8)](qk[dt, nq], qk[dt, nq], buf, int32(1), ctr)
        else:
            halves[1056, 256](buf, int32(p["lag_lines"]))
        cuda.synchronize()
        cuda.profile_stop()
        del buf
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_halfline", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    rows = [row({"probe": p["probe"], "shape": "x".join(map(str, p["shape"])), "lag_lines": p.get("lag_lines", ""),
                 "rep": p.get("rep", "")}, ln, smi, dirty_left=True) for p, ln in pairs]
    return save(out, "l2_halfline", rows, lambda r: (
        f"{r['probe']:<13} {r['shape']:>14} lag {str(r['lag_lines']):>6} #{r['rep']}  "
        f"stored {r['lsu_st_bytes'] / MIB:8.2f} MiB  "
        f"DRAM read {r['dram_read_bytes'] / MIB:7.2f}  write {r['dram_write_bytes'] / MIB:8.2f}  left dirty "
        f"{r['dirty_left_bytes'] / MIB:7.2f} MiB  {r['time_ns'] / 1e3:9.1f} us"), smi, command=cmd)


if __name__ == "__main__":
    raise SystemExit(main())
