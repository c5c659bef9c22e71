"""usage: python scripts/device/host_breakdown.py LABEL  (on a GPU, with torch)

Host time of each step of one fp16 forward call (``kernels.flash_attention`` on tiny torch inputs,
so the GPU work is a few microseconds and the wall time is the host's), best of 3 x 2,000 calls,
then a cProfile of 300 calls sorted by own time.  Beside each Numba step it times the cheaper route
a launcher could take: a CUDA-array-interface dict built from the tensor's own fields without a
stream entry (Numba makes an external-stream object for every interface that names a stream) and
a launch of the compiled kernel without the dispatcher's argument typing."""
import cProfile
import io
import math
import pstats
import sys
import time

import numpy as np
import torch
from numba import cuda, float32

import kernels
from kernels import _arrays
from kernels.perf import best
from kernels.perf._launch import LOG2E

q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
kernels.flash_attention(q, k, v, return_lse=True)
torch.cuda.synchronize()
mod = best("fwd", "float16", 64)
cfg = mod.default_config(64)
kern, nt, br = mod.kernel(d=64, causal=False, **cfg)
st = _arrays.launch_stream(None, q)
a = _arrays.to_device(q=q, k=k, v=v).arrays
o = cuda.as_cuda_array(torch.empty_like(q), sync=False)
lse = cuda.as_cuda_array(torch.empty(1, 1, 128, device="cuda"), sync=False)
sc = 1 / math.sqrt(64)
args = (a["q"], a["k"], a["v"], o, lse, float32(sc * LOG2E), float32(sc))
smem = mod.smem_bytes(64, br, cfg["bc"])
grid = (-(-128 // br), 1)
compiled = next(iter(kern.overloads.values()))


def desc(t):
    return {"shape": tuple(t.shape), "strides": None, "typestr": "<f2", "data": (t.data_ptr(), False),
            "version": 3}


def t(label, fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best_ = []
    for _ in range(3):
        s = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best_.append(1e6 * (time.perf_counter() - s) / n)
    print(f"{sys.argv[1]:6s} {label:58s} {min(best_):8.1f} us", flush=True)


t("q.__cuda_array_interface__", lambda: q.__cuda_array_interface__)
t("cuda.as_cuda_array(q, sync=False)", lambda: cuda.as_cuda_array(q, sync=False))
t("desc(q) from data_ptr/shape (no stream)", lambda: desc(q))
t("cuda.from_cuda_array_interface(desc(q), sync=False)",
  lambda: cuda.from_cuda_array_interface(desc(q), owner=q, sync=False))
t("torch.empty (1,1,128,64) fp16", lambda: torch.empty((1, 1, 128, 64), dtype=torch.float16, device="cuda"))
t("torch.cuda.current_stream(dev).cuda_stream", lambda: torch.cuda.current_stream(q.device).cuda_stream)
t("_arrays.launch_stream(None, q)", lambda: _arrays.launch_stream(None, q))
t("_arrays.to_device(q=, k=, v=)", lambda: _arrays.to_device(q=q, k=k, v=v))
t("mod.kernel(d=64, ...) (cached lookup)", lambda: mod.kernel(d=64, causal=False, **cfg))
t("kern[grid, nt, st, smem](*args)  (dispatcher)", lambda: kern[grid, nt, st, smem](*args))
t("compiled.launch(args, grid, nt, st, smem)", lambda: compiled.launch(args, grid, (nt, 1, 1), st, smem))
try:
    from kernels._direct import launch as direct_launch

    t("kernels._direct.launch(kern, grid, nt, st, smem, *args)", lambda: direct_launch(kern, grid, nt, st, smem, *args))
except ImportError:  # a tree without it
    pass
t("mod.forward(q, k, v)", lambda: mod.forward(q, k, v))
t("kernels.flash_attention(q, k, v)", lambda: kernels.flash_attention(q, k, v))
t("kernels.flash_attention(q, k, v, return_lse=True)", lambda: kernels.flash_attention(q, k, v, return_lse=True))
o2, l2 = kernels.flash_attention(q, k, v, return_lse=True)
do = torch.randn_like(q)
t("kernels.flash_attention_backward (d=64)", lambda: kernels.flash_attention_backward(q, k, v, o2, l2, do), 500)
t("torch SDPA flash (peer)", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
print("numpy", np.__version__, "torch", torch.__version__)
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    kernels.flash_attention(q, k, v, return_lse=True)
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
print(s.getvalue())
