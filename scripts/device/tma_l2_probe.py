"""One workload of the TMA L2-counter probe, run twice (a warm-up, then the call to profile), for
``scripts/device/tma_l2_probe.sh``: does L2's per-source sector count see every byte that the TMA
unit reads?  ``fwd_fp16_v7`` (K and V by TMA, no clusters, no multicast: every block reads its own
K and V tiles, a known count) beside ``fwd_fp16_v5`` (the same blocks with K and V by cp.async),
cuDNN's forward and one fp16 GEMM (cuBLAS's TMA kernels), fp16, d = 64.

    python3 scripts/device/tma_l2_probe.py v7 4096 16     # workload, N, B·H (heads = min(16, B·H))
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("work", choices=["v7", "v5", "cudnn", "gemm"])
ap.add_argument("n", type=int)
ap.add_argument("bh", type=int)
ap.add_argument("--d", type=int, default=64)
a = ap.parse_args()
for name in ("n", "bh", "d"):
    if getattr(a, name) < 1:
        ap.error(f"{name}={getattr(a, name)}: must be a positive integer")
b, h = max(1, a.bh // 16), min(16, a.bh)
q, k, v = (torch.randn(b, h, a.n, a.d, device="cuda", dtype=torch.float16) for _ in range(3))
for _ in range(2):
    if a.work in ("v7", "v5"):
        from kernels.perf import variant

        variant(f"fwd_fp16_{a.work}").forward(q, k, v)
    elif a.work == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
    else:
        torch.matmul(q, k.transpose(-1, -2))
torch.cuda.synchronize()
