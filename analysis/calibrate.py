"""Calibration kernels whose global-memory traffic is known exactly, to check the metrics.

    ncu --profile-from-start off ... python -m analysis.calibrate

* ``copy``: n float32 values read and written once, coalesced: LSU load and store bytes are both
  exactly 4n, in 4n/32 sectors.
* ``gather8``: thread t reads element 8t (n/8 threads): 4 useful bytes per 32-byte sector, so
  the LSU moves 8x the useful bytes (n/8 sectors) and stores 4n/8 bytes coalesced.

Each call is profiled on its own and followed by the marker kernel, like the worker's.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .worker import flashsim_marker

N = 1 << 22  # 4 Mi float32 = 16 MiB


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@cuda.jit
def gather8(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[8 * i]


EXPECTED = {
    "copy": {"lsu_ld_bytes": 4 * N, "lsu_st_bytes": 4 * N},
    "gather8": {"lsu_ld_bytes": 32 * (N // 8), "lsu_st_bytes": 4 * (N // 8)},
}


def main() -> int:
    src = cuda.to_device(np.arange(N, dtype=np.float32))
    dst = cuda.device_array(N, dtype=np.float32)
    dst8 = cuda.device_array(N // 8, dtype=np.float32)
    mark = cuda.to_device(np.zeros(1, dtype=np.int32))
    copy[N // 256, 256](src, dst)  # compile outside the profiled region
    gather8[N // 8 // 256, 256](src, dst8)
    cuda.synchronize()
    for i, (kern, out) in enumerate(((copy, dst), (gather8, dst8))):
        cuda.profile_start()
        kern[out.size // 256, 256](src, out)
        cuda.synchronize()
        flashsim_marker[1, 1](mark, i)
        cuda.synchronize()
        cuda.profile_stop()
    assert np.array_equal(dst8.copy_to_host(), np.arange(0, N, 8, dtype=np.float32))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
