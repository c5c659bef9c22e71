"""usage: python scripts/device/host_ab.py LABEL  (on a GPU, with torch; run it in two trees to compare)

Host time per call of the fp16 forward and backward on tiny torch inputs (the GPU work is a few
microseconds), with one suspect switched off at a time: the low-occupancy warning Numba builds on
every launch of a small grid, the per-call stream lookup (replaced by Numba's default stream), and
Python's garbage collector."""
import gc
import sys
import time

import torch
from numba import config, cuda

import kernels

q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
o, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True)
do = torch.randn_like(o)


def fwd():
    return kernels.flash_attention(q, k, v, causal=True, return_lse=True)


def bwd():
    return kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True)


def per_call(fn, n=400):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best.append(1e6 * (time.perf_counter() - t) / n)
    return min(best)


def report(case):
    print(f"{sys.argv[1]:4s} {case:28s} fwd {per_call(fwd):7.1f} us  bwd {per_call(bwd):7.1f} us", flush=True)


report("as is")
config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
report("no occupancy warning")
try:
    from kernels import _arrays

    real = _arrays.launch_stream
    _arrays.launch_stream = lambda stream, first: cuda.default_stream() if stream is None else real(stream, first)
    report("  + default stream")
    _arrays.launch_stream = real
except (ImportError, AttributeError):
    pass
gc.disable()
report("  + gc off")
gc.enable()
