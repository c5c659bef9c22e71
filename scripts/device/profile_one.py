"""Run one fast backward once (after a warm-up) for Nsight Compute to profile:
    ncu --clock-control none -k regex:bwd -s 1 -c 1 python3 scripts/device/profile_one.py bwd_fp32_v2 128 4096 64
(variant, d, N, batch*heads; fp32 inputs for *_fp32_*, else fp16)."""
import sys

import torch

from kernels.perf import variant

name, d, n, bh = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mod = variant(name)
dt = torch.float32 if "fp32" in name else torch.float16
b, h = max(1, bh // 16), min(16, bh)
q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dt) for _ in range(4))
o, lse = mod.saved_forward(q, k, v)
for _ in range(2):
    mod.backward(q, k, v, o, lse, do)
torch.cuda.synchronize()
