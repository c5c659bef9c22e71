"""Every kernel once at a small, ragged size: the program compute-sanitizer runs.

    compute-sanitizer --tool memcheck  python -m kernels.sanitize
    compute-sanitizer --tool racecheck python -m kernels.sanitize [--only VARIANT|decode|bf16|wide]
    compute-sanitizer --tool racecheck python -m kernels.sanitize --only bwd_fp16_v3 --d 224 256 \
        --config '{"qbuf": 2, "bulkq": false}'

Sizes are ragged (N = 97 queries, 130 keys, d = 40) so that partial tiles, masked rows and
the bounds checks all run; causal and grouped-query variants included; fp32 and fp16, and bf16
through torch CUDA tensors (the FlashAttention-2 kernels: reference and fast); the fp16 (and
bf16) backward of head dims above 64 (bwd_fp16_v3, which takes multiples of 16) at d = 64.
Bad arguments, and a machine where Numba sees no GPU, end in one ``flashsim: error:`` line,
exit status 2, before any kernel runs (under Numba's CUDA simulator it runs there).
"""

from __future__ import annotations

import numpy as np
from numba import cuda


def only(name: str, d: int = 64, config: dict | None = None) -> None:
    """One fast variant (``kernels.perf.variant(name)``, head dim ``d``; fp32 for an *_fp32_*
    variant, else fp16) at the ragged size, causal and not, with grouped-query heads: a forward
    variant's forward, a backward variant's saved forward and backward; ``config`` overrides the
    variant's default block (the forward's or the backward's, whichever the variant is)."""
    config = config or {}
    from kernels import perf

    mod = perf.variant(name)
    dt = np.float32 if "fp32" in name else np.float16
    rng = np.random.default_rng(7)
    for causal in (False, True):
        q = rng.standard_normal((1, 4, 97, d)).astype(dt)
        k, v = (rng.standard_normal((1, 2, 130, d)).astype(dt) for _ in range(2))
        do = rng.standard_normal(q.shape).astype(dt)
        if hasattr(mod, "forward"):
            mod.forward(q, k, v, causal=causal, return_lse=True, **config)
        else:
            o, lse = mod.saved_forward(q, k, v, causal=causal)
            mod.backward(q, k, v, o, lse, do, causal=causal, **config)
        cuda.synchronize()
        print(f"ran {name}: d={d} causal={causal} {config or ''}", flush=True)


def decode() -> None:
    """The decode kernels (kernels/decode.py, kernels/perf/decode.py) at ragged sizes: variable
    lengths (one below a key block), GQA 4:1, Nq = 1 and 3, d = 40, contiguous and paged (P = 16)
    caches, one split and two with a window (the combine); fp32 (Nq = 1) and fp16 (Nq = 1, 3),
    bf16 through torch; the tensor-core variant (v3) at d = 64."""
    import kernels

    rng = np.random.default_rng(7)
    lengths = np.array([130, 5, 97], dtype=np.int32)
    for dt, nq in ((np.float32, 1), (np.float16, 1), (np.float16, 3)):
        q = rng.standard_normal((3, 8, nq, 40)).astype(dt)
        k = rng.standard_normal((3, 2, 140, 40)).astype(dt)
        v = rng.standard_normal((3, 2, 140, 40)).astype(dt)
        kp = rng.standard_normal((30, 16, 2, 40)).astype(dt)
        vp = rng.standard_normal((30, 16, 2, 40)).astype(dt)
        table = rng.permutation(30)[:27].reshape(3, 9).astype(np.int32)
        for impl in ("reference", "fast"):
            for splits, window in ((1, None), (2, (50, -1))):
                kernels.decode_attention(q, k, v, cache_seqlens=lengths, num_splits=splits, window=window,
                                         impl=impl)
                kernels.decode_attention(q, kp, vp, cache_seqlens=lengths, block_table=table,
                                         num_splits=splits, window=window, impl=impl)
        if dt == np.float16:  # v3, the tensor-core variant: d = 64, 4 or 6 query rows per kv head
            from kernels.perf import decode as fast

            q6, k6, v6, kp6, vp6 = (np.concatenate([x, x[..., :24]], axis=-1) for x in (q, k, v, kp, vp))
            hq = 8 if nq == 1 else 4
            for splits, window in ((1, None), (2, (50, -1))):
                fast.forward_tc(q6[:, :hq], k6, v6, cache_seqlens=lengths, num_splits=splits, window=window)
                fast.forward_tc(q6[:, :hq], kp6, vp6, cache_seqlens=lengths, block_table=table,
                                num_splits=splits, window=window)
        cuda.synchronize()
        print(f"ran decode: {np.dtype(dt).name}, Nq={nq}", flush=True)
    try:
        import torch
    except ImportError:
        return
    q = torch.randn(3, 8, 1, 40, device="cuda").to(torch.bfloat16)
    k = torch.randn(3, 2, 140, 40, device="cuda").to(torch.bfloat16)
    v = torch.randn(3, 2, 140, 40, device="cuda").to(torch.bfloat16)
    for impl in ("reference", "fast"):
        kernels.decode_attention(q, k, v, cache_seqlens=lengths, num_splits=3, impl=impl)
    torch.cuda.synchronize()
    print("ran decode: bfloat16", flush=True)


def wide() -> None:
    """The fp16 forward's wide-head blocks (fwd_fp16_v4 at d = 160: 8 warps, Br = 256, Q in shared
    memory; d = 256: Br = 128, Q in registers) at the ragged size, causal and not, GQA: fp16
    numpy inputs, then bf16 torch tensors (the launches that skip Numba's dispatcher,
    ``kernels._direct``, from the second call of each on)."""
    import kernels

    rng = np.random.default_rng(7)
    for d in (160, 256):
        q = rng.standard_normal((1, 4, 97, d)).astype(np.float16)
        k, v = (rng.standard_normal((1, 2, 130, d)).astype(np.float16) for _ in range(2))
        for causal in (False, True):
            kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl="fast")
        cuda.synchronize()
        print(f"ran wide: fp16 d={d}", flush=True)
    try:
        import torch
    except ImportError:
        return
    for d in (160, 256):
        q = torch.randn(1, 4, 97, d, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(1, 2, 130, d, device="cuda").to(torch.bfloat16) for _ in range(2))
        for causal in (False, True):
            for _ in range(2):
                kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl="fast")
        torch.cuda.synchronize()
        print(f"ran wide: bf16 d={d}", flush=True)


def main(argv=None) -> int:
    import kernels
    from flashsim.cmdline import ToolParser

    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="one fast variant of kernels/perf, e.g. bwd_fp16_v3 or fwd_fp32_v2; "
                    "or 'decode': the decode kernels; or 'bf16': the FlashAttention-2 kernels in bf16; "
                    "or 'wide': the fp16 forward above d = 128")
    ap.add_argument("--d", type=int, nargs="+", default=[64],
                    help="with a variant in --only: its head dims, each run in turn (default 64)")
    ap.add_argument("--config", default=None, metavar="JSON",
                    help='with a variant in --only: a JSON object overriding its default block, e.g. \'{"qbuf": 1}\'')
    args = ap.parse_args(argv)

    def fail(message: str):
        ap.exit(2, f"flashsim: error: {' '.join(message.split())}\n")

    config = None
    if args.config is not None:
        import json

        try:
            config = json.loads(args.config)
        except json.JSONDecodeError as e:
            fail(f"--config: {e}")
        if not isinstance(config, dict) or not args.only:
            fail("--config must be a JSON object and needs --only VARIANT")
    if args.only and args.only not in ("decode", "bf16", "wide"):
        from kernels.perf import VARIANTS

        if args.only not in VARIANTS:  # refused by name, before the GPU is looked for (its module after)
            fail(f"--only {args.only!r}: one of decode, bf16, wide or a variant ({', '.join(sorted(VARIANTS))})")
    from .gpucheck import require_gpu

    try:
        require_gpu("kernels.sanitize (the program compute-sanitizer runs)", simulator_ok=True)
    except ValueError as e:
        fail(str(e))
    if args.only == "decode":
        decode()
        return 0
    if args.only == "bf16":
        bf16()
        return 0
    if args.only == "wide":
        wide()
        return 0
    if args.only:
        try:
            for d in args.d:
                only(args.only, d, config)
        except (ValueError, TypeError) as e:  # a head dim or a config the variant does not take
            fail(str(e))
        return 0
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
            if dt == np.float16:
                # The fp16 backward above d = 64 (bwd_fp16_v3 takes d % 16 == 0): its own call at
                # d = 64, the same ragged N, so that its atomics and shared-memory phases are checked.
                from kernels.perf import bwd_fp16_v3

                q6, k6, v6, do6 = (x[..., :32].repeat(2, axis=-1) for x in (q, k, v, do))
                o6, lse6 = kernels.flash_attention(q6, k6, v6, causal=causal, return_lse=True)
                bwd_fp16_v3.backward(q6, k6, v6, o6, lse6, do6, causal=causal)
            kernels.flash1_attention(q, k, v, causal=causal, sram_bytes=16 * 1024)
            o2 = kernels.standard_attention(q, k, v, causal=causal)
            kernels.standard_attention_backward(q, k, v, o2, do, causal=causal)
            cuda.synchronize()
            print(f"ran all kernels: {np.dtype(dt).name}, causal={causal}", flush=True)
    bf16()
    return 0


def bf16() -> None:
    """The FlashAttention-2 kernels in bf16 (torch CUDA tensors, passed as their int16 bits): the
    reference ones and the fast ones (fwd_fp16_v4, bwd_fp16_v1 at d = 40; bwd_fp16_v3 at d = 64)
    at the ragged size, causal and not, grouped-query heads."""
    try:
        import torch
    except ImportError:
        return
    import kernels
    from kernels.perf import bwd_fp16_v3

    g = torch.Generator(device="cpu").manual_seed(7)
    for causal in (False, True):
        q, do = (torch.randn(1, 4, 97, 40, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, 2, 130, 40, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
        for impl in ("reference", "auto"):
            o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl=impl)
            kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, impl=impl)
        q6, k6, v6, do6 = (x[..., :32].repeat(1, 1, 1, 2).contiguous() for x in (q, k, v, do))
        o6, lse6 = kernels.flash_attention(q6, k6, v6, causal=causal, return_lse=True)
        bwd_fp16_v3.backward(q6, k6, v6, o6, lse6, do6, causal=causal)
        torch.cuda.synchronize()
        print(f"ran all kernels: bfloat16, causal={causal}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
