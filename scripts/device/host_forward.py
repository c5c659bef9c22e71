"""Host time of one forward (or backward) call on tiny torch inputs (the GPU work is a few
microseconds, so the loop is bound by the host): SDPA flash, our variant through its prepared
call (``kernels.perf._launch._PLANS``), the same with the full path every call (the prepared
calls dropped before each), and the public API (``kernels.flash_attention``,
``flash_attention_backward``).  On the GPU machine::

    python3 scripts/device/host_forward.py [--variant fwd_fp16_v5] [--d 64]
    python3 scripts/device/host_forward.py --variant bwd_fp16_v3

prints microseconds a call, the best of three runs of 400 calls after a warm-up."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def per_call(fn, torch, calls: int = 400, runs: int = 3) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def main(argv=None) -> int:
    from kernels.perf import VARIANTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="fwd_fp16_v5", choices=sorted(VARIANTS))
    ap.add_argument("--d", type=int, default=64)
    a = ap.parse_args(argv)
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import kernels
    from kernels.perf import _launch, variant

    m = variant(a.variant)
    dt = torch.float32 if "fp32" in a.variant else torch.float16
    q, k, v, do = (torch.randn(1, 1, 64, a.d, device="cuda", dtype=dt) for _ in range(4))
    if a.variant.startswith("bwd"):
        o, lse = m.saved_forward(q, k, v)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        flash = float("nan")  # SDPA's flash backend takes fp16 and bf16 only
        if dt != torch.float32:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                og = sdpa(qg, kg, vg)

                def peer():
                    return torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)

                flash = per_call(peer, torch)

        def ours():
            return m.backward(q, k, v, o, lse, do)

        def api():
            return kernels.flash_attention_backward(q, k, v, o, lse, do)
    else:
        flash = float("nan")
        if dt != torch.float32:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # entered once: the context costs ~40 us a call
                flash = per_call(lambda: sdpa(q, k, v), torch)

        def ours():
            return m.forward(q, k, v)

        def api():
            return kernels.flash_attention(q, k, v)

    def full():
        _launch._PLANS.clear()
        return ours()

    rows = {"sdpa_flash": flash, f"{a.variant} prepared": per_call(ours, torch),
            f"{a.variant} full path": per_call(full, torch), "kernels API": per_call(api, torch)}
    for name, us in rows.items():
        print(f"{name:<32} {us:8.1f} us a call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
