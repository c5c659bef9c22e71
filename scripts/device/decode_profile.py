"""usage: python scripts/device/decode_profile.py [FUNC]   (under ncu, on a GPU with torch)

One call of a fast decode function (``kernels.perf.decode.FUNC``, default ``forward``) at
Nq = 1, B = 4, Hq = 64, Hkv = 8 (GQA 8:1), Nk = 65,536, d = 128, fp16, after a warm-up call,
between torch's profiler start and stop, for

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section Occupancy --section LaunchStats --section WarpStateStats \\
        python scripts/device/decode_profile.py [FUNC]

which says how much of the HBM bandwidth the kernel draws, how many warps it keeps resident
and what they wait on: the cause of a shortfall against the copy's bandwidth."""
import sys

import numpy as np
import torch

from kernels.perf import decode as fast

fn = getattr(fast, sys.argv[1] if len(sys.argv) > 1 else "forward")
b, hq, hkv, nk, d = 4, 64, 8, 65536, 128
q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16)
k = torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
lens = np.full(b, nk, dtype=np.int32)
fn(q, k, v, cache_seqlens=lens)
torch.cuda.synchronize()
torch.cuda.profiler.start()
fn(q, k, v, cache_seqlens=lens)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
