"""Run one backward (or, with a forward variant or ``--fwd``, one forward) twice (a warm-up, then
the call to profile) for Nsight Compute:

    ncu --clock-control none -k regex:^bwd -s 1 -c 1 python3 scripts/device/profile_one.py bwd_fp32_v2 128 4096 64
    ncu --clock-control none -k regex:flash_bwd_dq_dk_dv -s 1 -c 1 \\
        python3 scripts/device/profile_one.py sdpa_flash 64 16384 16 --causal
    ncu --clock-control none -k regex:^fwd -s 1 -c 1 python3 scripts/device/profile_one.py fwd_fp16_v5 88 4096 64

(variant, d, N, batch*heads; ``sdpa_flash``: PyTorch's SDPA flash backend, through autograd for
the backward; fp32
inputs for *_fp32_*, else fp16, or bf16 with ``--bf16``)."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from kernels.perf import VARIANTS, variant  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("variant", choices=["sdpa_flash", *sorted(VARIANTS)], help="a kernels.perf variant, or sdpa_flash")
ap.add_argument("d", type=int)
ap.add_argument("n", type=int)
ap.add_argument("bh", type=int, help="batch*heads (heads = min(16, bh))")
ap.add_argument("--causal", action="store_true")
ap.add_argument("--bf16", action="store_true")
ap.add_argument("--fwd", action="store_true", help="sdpa_flash: the forward alone")
a = ap.parse_args()
if a.fwd and a.variant != "sdpa_flash":
    ap.error(f"--fwd is for sdpa_flash; {a.variant} runs its own pass")
fwd = a.fwd or a.variant.startswith("fwd")
dt = torch.float32 if "fp32" in a.variant else torch.bfloat16 if a.bf16 else torch.float16
b, h = max(1, a.bh // 16), min(16, a.bh)
q, k, v, do = (torch.randn(b, h, a.n, a.d, device="cuda", dtype=dt) for _ in range(4))
if a.variant == "sdpa_flash" and fwd:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
elif a.variant == "sdpa_flash":
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal).backward(do)
elif fwd:
    for _ in range(2):
        variant(a.variant).forward(q, k, v, causal=a.causal)
else:
    mod = variant(a.variant)
    o, lse = mod.saved_forward(q, k, v, causal=a.causal)
    for _ in range(2):
        mod.backward(q, k, v, o, lse, do, causal=a.causal)
torch.cuda.synchronize()
