"""The launcher shared by the numbered forward variants: inputs, block shape, shared memory, grid."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

LOG2E = 1.4426950408889634


def launch_forward(name, kernel, smem_bytes, default_config, supports, q, k, v, *, causal=False, scale=None,
                   return_lse=False, config=None):
    """Run variant ``name``'s forward kernel on (B, H, N, d) inputs; O (and L) in the query's kind.

    ``kernel(d=..., causal=..., **cfg)`` returns (compiled kernel, threads, Br) for the block shape
    ``cfg`` (:func:`default_config` of d, updated by ``config``); the kernel's arguments are
    (q, k, v, o, lse, τ·log2 e, τ) and its dynamic shared memory is ``smem_bytes(dp, Br, Bc)``.
    """
    from .._arrays import check_attention_shapes, to_device
    from ..flash1 import _raise_smem_limit

    inp = to_device(q=q, k=k, v=v)
    a = inp.arrays
    nb, nh, nhk, nq, nk, d = check_attention_shapes(a["q"], a["k"], a["v"])
    if not supports(inp.dtype, d):
        raise ValueError(f"dtype={inp.dtype}, head_dim={d}: not supported by {name.rsplit('.', 1)[-1]}")
    if nb * nh > 65535:
        raise ValueError(f"batch*heads={nb * nh}: at most 65535")
    cfg = default_config(d)
    unknown = set(config or {}) - set(cfg)
    if unknown:
        raise ValueError(f"config keys {sorted(unknown)}: this variant takes {sorted(cfg)}")
    cfg.update(config or {})
    if cfg["bc"] <= 0 or cfg["bc"] % 16:
        raise ValueError(f"bc={cfg['bc']}: must be a positive multiple of 16")
    dp = -(-d // 16) * 16
    kern, nt, br = kernel(d=d, causal=bool(causal), **cfg)
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(sc):
        raise ValueError(f"scale={scale!r}: must be finite")
    o = cuda.device_array((nb, nh, nq, d), dtype=inp.dtype)
    lse = cuda.device_array((nb, nh, nq), dtype=np.float32)
    smem = smem_bytes(dp, br, cfg["bc"])
    args = (a["q"], a["k"], a["v"], o, lse, float32(sc * LOG2E), float32(sc))
    _raise_smem_limit(kern, args, smem)
    kern[(-(-nq // br), nb * nh), nt, 0, smem](*args)
    if return_lse:
        return inp.out(o), inp.out(lse)
    return inp.out(o)
