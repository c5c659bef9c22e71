"""usage: python scripts/device/host_overhead.py LABEL [--profile]  (on a GPU, with torch)

Host time per call of kernels.flash_attention (fwd) and its backward on tiny torch inputs:
the GPU work is a few microseconds, so the wall time per call is the host overhead."""
import cProfile
import io
import pstats
import sys
import time

import torch

import kernels

q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
def fwd():
    return kernels.flash_attention(q, k, v, causal=True, return_lse=True)
o, lse = fwd()
do = torch.randn_like(o)
def bwd():
    return kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True)
bwd()
torch.cuda.synchronize()
for name, fn in (("fwd", fwd), ("bwd", bwd)):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(300):
        fn()
    torch.cuda.synchronize()
    print(f"{sys.argv[1]} {name}: {1e6 * (time.perf_counter() - t) / 300:.1f} us per call")
if len(sys.argv) > 2 and sys.argv[2] == "--profile":
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fwd()
        bwd()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40)
    print(s.getvalue())
