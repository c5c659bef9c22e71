"""usage: python scripts/device/host_pieces.py LABEL  (on a GPU, with torch; run it in two trees to compare)

Host time of the pieces of one kernels.flash_attention call on tiny torch inputs: torch's current
stream, a Numba external stream, a no-op launch on each kind of stream, as_cuda_array, to_device
and the whole forward call."""
import sys
import time

import torch
from numba import cuda

import kernels
from kernels import _arrays

q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))

@cuda.jit
def noop(a):
    pass

d = cuda.as_cuda_array(q)
ext = cuda.external_stream(int(torch.cuda.current_stream().cuda_stream))
dft = cuda.default_stream()
noop[1, 32](d)
torch.cuda.synchronize()

def t(label, fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    s = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    print(f"{sys.argv[1]:4s} {label:44s} {1e6 * (time.perf_counter() - s) / n:8.1f} us")

t("torch.cuda.current_stream()", lambda: torch.cuda.current_stream(q.device))
t("cuda.external_stream(handle)", lambda: cuda.external_stream(int(torch.cuda.current_stream().cuda_stream)))
t("noop launch, stream 0", lambda: noop[1, 32, 0](d))
t("noop launch, default_stream()", lambda: noop[1, 32, dft](d))
t("noop launch, external stream", lambda: noop[1, 32, ext](d))
t("as_cuda_array(q)", lambda: cuda.as_cuda_array(q))
t("as_cuda_array(q, sync=False)", lambda: cuda.as_cuda_array(q, sync=False))
try:  # the option checks arrived with the stream fix; older trees take the arrays alone
    _arrays.to_device(q=q, k=k, v=v, causal=True)
    t("to_device(q, k, v, causal=True)", lambda: _arrays.to_device(q=q, k=k, v=v, causal=True))
except TypeError:
    t("to_device(q, k, v)", lambda: _arrays.to_device(q=q, k=k, v=v))
t("flash_attention fwd", lambda: kernels.flash_attention(q, k, v, causal=True), n=300)
