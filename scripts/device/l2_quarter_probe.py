"""Lines stored in halves and quarters (and, in the first record, eighths): what they leave dirty
in the L2 (issue 14).

The half-line probe (l2_halfline_probe.py) measured 128 MiB stored with each line's two halves
L lines of stores apart, and flashsim.l2's merge table came from it.  Until this probe (the rule
before edb9717) a store to a line already dirty joined the line's dirty part with a share that
falls with the bytes stored since that part's first store, else the older sectors were orphaned
(written back at the next passing of the dirty limit), the share drawn at each join, so that a
line stored in quarters met it three times.  The held-out record (analysis/data/h200/parts:
standard attention with 16 x 16 GEMM tiles, whose fp16 S rows are 32-byte quarters of a line)
says that is too much: that rule wrote 44% more than measured at N = 1,024 (13.5 against 9.4
MB) and 1-4% more at N >= 2,048.
One thing varied at a time, each case one launch under ``ncu --cache-control all`` with
analysis.ncu's METRICS (the calibration's 7):

* ``fill32``: grid-stride stores of float32 over 128 MiB, each line stored whole by one
  instruction (the full-line level);
* ``lag`` with ``parts`` P = 2 or 4, lag L (lines) and ``order`` +1 or -1: float32 stores over
  128 MiB, part q of line i stored with part 0 of line i + order·q·L (wrapping), one instruction
  after the other: a line's parts 128·L bytes of traffic apart, (P - 1)·L between its first
  and last part, the highest part first (order +1) or the lowest (-1, the half-line probe's
  order: its ``lag`` case is P = 2, order -1);
* ``gemm16`` (first record only): kernels.standard's gemm_qk with 16 x 16 tiles, fp16, B·H = 16,
  N = 1,024 and 2,048, d = 64 (the held-out record's launches, measured again beside the rest);
* first record only: P = 8 (16-byte parts: half sectors, which the L2 fills from DRAM first), and
  ``lag`` P = 4 over 16 MiB (below the dirty limit: do orphaned quarters wait for the limit?).

The list runs twice, the second time in reverse order, after one fill that is not counted.
The first record was taken by this script at 343dffd (its list: FIRST_LAGS, all of order +1, and
the cases marked above); the second (this list) has both orders at each lag, to tell the order
from the lag.

On the GPU machine, from the repository root::

    python3 scripts/device/l2_quarter_probe.py --out "$OUT"

writes ``$OUT/l2_quarter.csv`` (case, shape, parts, lag, DRAM bytes read and written, stores,
dirty bytes left = stores - DRAM writes) with the raw export and the metadata, and prints the
table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import fill, measure, repeated, row, save  # noqa: E402
from numba import cuda, float32, int32  # noqa: E402

MIB = 1 << 20
#: (parts, lag in lines) of the first record's 128 MiB cases (order +1; for the record)
FIRST_LAGS = ((2, 0), (2, 1024), (4, 0), (4, 1), (4, 16), (4, 128), (4, 1024), (4, 8192), (8, 0), (8, 16), (8, 128),
              (8, 1024))
#: the lags (lines) of the second's, each for P = 2 and 4 in both orders
LAGS = (0, 16, 128, 1024, 8192)
REPEATS = 2


def cases() -> list[dict]:
    lag = {"probe": "lag", "shape": (128 * MIB // 4,)}
    return [{"probe": "fill32", "shape": (128 * MIB // 4,)}] + [
        dict(lag, parts=p, lag_lines=n, order=o) for p in (2, 4) for n in LAGS for o in (-1, 1)]


def probes() -> list[dict]:
    """The launches in the order profiled: the uncounted fill, then the cases REPEATS times."""
    return repeated(cases, REPEATS, (64 * MIB // 4,))


@cuda.jit
def split(buf, parts, lag):
    # float k of the first parts: line k // w, float k % w of the part (w = 32 / parts floats);
    # with it the same float of part q of line k // w + q·lag, q = 1 .. parts - 1 (lag < 0:
    # the lowest part of each line stored first)
    nlines = buf.size // 32
    w = 32 // parts
    for k in range(cuda.grid(1), nlines * w, cuda.gridsize(1)):
        line = k // w
        off = k % w
        for q in range(parts):
            other = (line + q * lag) % nlines
            if other < 0:
                other += nlines
            buf[other * 32 + q * w + off] = float32(1)


def worker() -> int:
    import numpy as np

    fill[4, 256](cuda.device_array(1024, dtype=np.float32))  # compile outside the profiled region
    split[4, 256](cuda.device_array(1024, dtype=np.float32), int32(4), int32(1))
    cuda.synchronize()
    for p in probes():
        buf = cuda.device_array(p["shape"], dtype=np.float32)
        fill[1056, 256](buf)  # resident pages, then cold under ncu
        cuda.synchronize()
        cuda.profile_start()
        if p["probe"] == "lag":
            split[1056, 256](buf, int32(p["parts"]), int32(p["order"] * p["lag_lines"]))
        else:
            fill[1056, 256](buf)
        cuda.synchronize()
        cuda.profile_stop()
        del buf
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_quarter", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    rows = [row({"probe": p["probe"], "shape": "x".join(map(str, p["shape"])), "parts": p.get("parts", ""),
                 "lag_lines": p.get("lag_lines", ""), "order": p.get("order", ""), "rep": p.get("rep", "")},
                ln, smi, dirty_left=True) for p, ln in pairs]
    return save(out, "l2_quarter", rows, lambda r: (
        f"{r['probe']:<7} {r['shape']:>14} parts {str(r['parts']):>2} lag {str(r['lag_lines']):>5} "
        f"order {str(r['order']):>2} "
        f"#{r['rep']}  stored {r['lsu_st_bytes'] / MIB:8.2f} MiB  DRAM read {r['dram_read_bytes'] / MIB:7.2f}  "
        f"write {r['dram_write_bytes'] / MIB:8.2f}  left dirty {r['dirty_left_bytes'] / MIB:7.2f} MiB  "
        f"{r['time_ns'] / 1e3:9.1f} us"), smi, command=cmd)


if __name__ == "__main__":
    raise SystemExit(main())
