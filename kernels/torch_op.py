"""FlashAttention-2 as a PyTorch operator: ``torch.ops.flashsim.attention``, with autograd.

    import torch
    from kernels.torch_op import attention

    class SelfAttention(torch.nn.Module):
        def forward(self, q, k, v):            # (B, H, N, d), (B, Hkv, N, d) CUDA tensors
            return attention(q, k, v, causal=True)

The forward and the backward are registered with ``torch.library.custom_op`` (operators
``flashsim::attention_fwd`` and ``flashsim::attention_bwd``), the backward through
``register_autograd`` and both with a fake (meta) implementation, so the operator runs inside an
``nn.Module``, under autograd, and under ``torch.compile(fullgraph=True)`` as one opaque node
(no graph break).  It calls :func:`kernels.flash_attention` and
:func:`kernels.flash_attention_backward` (``impl="auto"``: the fast kernels where they apply),
which run on torch's current stream and allocate their results from torch's caching allocator.

What it takes: q (B, H, Nq, d), k and v (B, Hkv, Nk, d) with Hkv dividing H (grouped-query
attention), all float16, all bfloat16 or all float32, on one CUDA device.  Contiguous tensors
are used in place; a non-contiguous one (a transposed view, say) is made contiguous first, which
is one copy of that tensor.  ``causal`` is aligned bottom-right (query i sees key j iff j <= i + Nk - Nq), as
flash-attention >= 2.1; PyTorch's ``is_causal=True`` aligns top-left, and the two agree when
Nq = Nk.  ``scale`` defaults to 1/sqrt(d).  bfloat16 tensors reach the kernels as their int16
bits, without a copy (Numba has no bfloat16 arrays; ``kernels/_bf16.py``).

CPU tensors run the same kernels under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` set
before numba is imported), which is how the test suite checks the operator without a GPU; without
the simulator a CPU tensor is refused with a ``ValueError``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from . import flash_attention as _flash_attention
from . import flash_attention_backward as _flash_attention_backward
from ._arrays import check_scale

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _simulator() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _check(names: tuple[str, ...], tensors: tuple[Tensor, ...]) -> None:
    """The operator's own input rules (the kernels check shapes; these are torch-side facts)."""
    q = tensors[0]
    for name, t in zip(names, tensors):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: type {type(t).__name__} is not a torch.Tensor")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}.dtype={t.dtype}: must be torch.float16, torch.bfloat16 or torch.float32")
        if t.device != q.device:
            raise ValueError(f"{name}.device={t.device}: must be q.device={q.device}")
    if q.device.type == "cpu" and not _simulator():
        raise ValueError(f"q.device={q.device}: CPU tensors run only under Numba's CUDA simulator "
                         "(NUMBA_ENABLE_CUDASIM=1); use CUDA tensors")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q.device={q.device}: must be a CUDA device (or the CPU under the CUDA simulator)")


def _host(t: Tensor):
    """A CPU tensor as the launchers take it: numpy, or the tensor itself for bfloat16 (numpy has
    none; the launchers take CPU bf16 tensors and give CPU tensors back)."""
    t = t.detach().contiguous()
    return t if t.dtype == torch.bfloat16 else t.numpy()


def _tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def _run(fn, tensors: tuple[Tensor, ...], **kw):
    """Call a kernel launcher on CUDA tensors in place, or on numpy views of CPU tensors."""
    if tensors[0].device.type == "cuda":
        with torch.cuda.device(tensors[0].device):
            return fn(*(t.detach().contiguous() for t in tensors), **kw)
    out = fn(*(_host(t) for t in tensors), **kw)
    return tuple(_tensor(x) for x in out) if isinstance(out, tuple) else _tensor(out)


@torch.library.custom_op("flashsim::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """O and the row logsumexp L (float32, (B, H, Nq)) of FlashAttention-2's forward."""
    _check(("q", "k", "v"), (q, k, v))
    o, lse = _run(_flash_attention, (q, k, v), causal=causal, scale=scale, return_lse=True)
    return o, lse


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashsim::attention_bwd", mutates_args=())
def attention_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool,
                  scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV of FlashAttention-2's backward (dK, dV have the kv heads' shape)."""
    _check(("q", "k", "v", "o", "do"), (q, k, v, o, do))
    return _run(_flash_attention_backward, (q, k, v, o, lse, do), causal=causal, scale=scale)


@attention_bwd.register_fake
def _attention_bwd_fake(q, k, v, o, lse, do, causal, scale):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_bwd(q, k, v, o, lse, do.contiguous(), ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(scale · Q Kᵀ + mask) V by FlashAttention-2, differentiable (see the module docstring)."""
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal={causal!r}: must be a bool")
    for name, t in (("q", q), ("k", k), ("v", v)):  # before the operator's schema sees them
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: type {type(t).__name__} is not a torch.Tensor")
        if t.dim() != 4 or 0 in t.shape:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: must be (batch, heads, seq_len, head_dim), none 0")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    o, _ = attention_fwd(q, k, v, bool(causal), check_scale(scale))
    return o


__all__ = ["attention", "attention_fwd", "attention_bwd"]
