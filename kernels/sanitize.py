"""Every kernel once at a small, ragged size: the program compute-sanitizer runs.

    compute-sanitizer --tool memcheck  python -m kernels.sanitize
    compute-sanitizer --tool racecheck python -m kernels.sanitize

Sizes are ragged (N = 97 queries, 130 keys, d = 40) so that partial tiles, masked rows and
the bounds checks all run; causal and grouped-query variants included; fp32 and fp16.
"""

from __future__ import annotations

import numpy as np
from numba import cuda


def main() -> int:
    import kernels

    rng = np.random.default_rng(7)
    for dt in (np.float32, np.float16):
        for causal in (False, True):
            q = rng.standard_normal((1, 4, 97, 40)).astype(dt)
            k = rng.standard_normal((1, 2, 130, 40)).astype(dt)
            v = rng.standard_normal((1, 2, 130, 40)).astype(dt)
            do = rng.standard_normal(q.shape).astype(dt)
            # The readable FlashAttention-2 kernels, then the fast numbered variants where one
            # applies (kernels/perf: fp16 forward and backward, fp32 forward).
            for impl in ("reference", "auto"):
                o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl=impl)
                kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, impl=impl)
            kernels.flash1_attention(q, k, v, causal=causal, sram_bytes=16 * 1024)
            o2 = kernels.standard_attention(q, k, v, causal=causal)
            kernels.standard_attention_backward(q, k, v, o2, do, causal=causal)
            cuda.synchronize()
            print(f"ran all kernels: {np.dtype(dt).name}, causal={causal}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
