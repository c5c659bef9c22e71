"""Ring attention over ``torch.distributed``: context parallelism with our kernels in each step.

One process per device; each holds a shard of the sequence (every head, batch and the head dim
whole).  K, V shards travel round the ring rank -> rank + 1 by point-to-point sends
(``torch.distributed.batch_isend_irecv``), and each step runs one attention call on the local
queries against the K, V shard it holds, the next shard's transfer posted *before* that call so
that the two overlap (with NCCL the transfer runs on NCCL's stream, the kernels on torch's current
stream, and ``wait()`` orders the next step after the transfer; with gloo on the CPU the same code
runs, the transfer on gloo's threads).  The schedule is the one :mod:`flashsim.parallel` counts:

* **sharding**: full attention in P contiguous shards; causal attention zig-zag: the sequence cut
  into 2P chunks, rank r holding chunks r and 2P − 1 − r (:func:`shard`, :func:`unshard`), so
  every step after the first does the same work on every rank;
* **forward**: step s holds the K, V of rank src = (r − s) mod P: step 0 the rank's own (causal
  for causal attention), then, with zig-zag, all local queries against the first chunk of K, V
  when src < r and the second query chunk against all of K, V when src > r (no mask in either).
  Each step returns O_s and its logsumexp L_s; they are merged by logsumexp into accumulators
  (fp32, float64 for float64 inputs): L' = logaddexp(L, L_s),
  O' = e^{L − L'} O + e^{L_s − L'} O_s;
* **backward**: Q, O, dO, L and the dQ accumulator stay home; K, V travel as in the forward, and
  with them the dK, dV accumulators (fp32) of the shard they belong to: step s adds its block's
  dK_s, dV_s to the accumulator that arrived from rank r − 1 and sends it on while step s + 1
  computes; after the last step the accumulators go home.  Each step is one attention backward
  call with the final O and L (its D = rowsum(dO∘O) pre-pass included).

The attention of one step is a backend (``attn=``):

* :class:`KernelAttention` (default): :func:`kernels.flash_attention` with ``return_lse=True`` and
  :func:`kernels.flash_attention_backward`, on torch's current stream for CUDA tensors (the
  results allocated by torch there), or, for CPU tensors, on numpy copies under Numba's CUDA
  simulator (``NUMBA_ENABLE_CUDASIM=1``);
* :class:`ReferenceAttention`: the float64 reference in torch (any device), for exactness checks of
  the ring logic itself where the simulator would be too slow.

Extra traffic the real run has that the simulator's fused merges do not: torch's elementwise merge
(several kernels), the K, V halves of a zig-zag step made contiguous before the call, and the
packing of K and V into one send buffer.  Precision: fp16 and fp32 inputs (the kernels'); the
accumulators are fp32, the result is cast back to the input dtype.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

# --------------------------------------------------------------------------------------------
# Sharding


def _check_split(n: int, world: int, causal: bool) -> int:
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world={world!r}: must be a positive int")
    parts = 2 * world if causal else world
    if n % parts:
        raise ValueError(f"seq_len={n}: must be a multiple of {parts} ({'2 x ' if causal else ''}world={world}"
                         f"{' zig-zag chunks' if causal else ' shards'})")
    return n // parts


def shard(x: Tensor, rank: int, world: int, causal: bool, dim: int = 2) -> Tensor:
    """Rank ``rank``'s shard of the sequence axis ``dim`` of ``x`` (contiguous): chunk ``rank`` of
    ``world`` for full attention; chunks ``rank`` and ``2·world − 1 − rank`` of ``2·world`` (zig-zag)
    for causal attention."""
    c = _check_split(x.shape[dim], world, causal)
    if not causal:
        return x.narrow(dim, rank * c, c).contiguous()
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim).contiguous()


def unshard(parts: list[Tensor], causal: bool, dim: int = 2) -> Tensor:
    """The full sequence from every rank's shard, in rank order (the inverse of :func:`shard`)."""
    world = len(parts)
    if not causal:
        return torch.cat(parts, dim)
    c = parts[0].shape[dim] // 2
    first = [p.narrow(dim, 0, c) for p in parts]
    second = [p.narrow(dim, c, c) for p in reversed(parts)]
    assert len(first) + len(second) == 2 * world
    return torch.cat(first + second, dim)


def step_blocks(rank: int, step: int, world: int, n: int, causal: bool) -> tuple[str, slice, slice, bool]:
    """(kind, query rows, key rows, causal) of ``rank``'s step ``step`` with ``n`` local rows; the
    kinds are flashsim.parallel's ("full", "diag", "lower", "upper")."""
    if not causal:
        return "full", slice(0, n), slice(0, n), False
    if step == 0:
        return "diag", slice(0, n), slice(0, n), True
    c = n // 2
    src = (rank - step) % world
    if src < rank:
        return "lower", slice(0, n), slice(0, c), False
    return "upper", slice(c, n), slice(0, n), False


# --------------------------------------------------------------------------------------------
# One step's attention


class KernelAttention:
    """Our FlashAttention-2 kernels (``kernels.flash_attention`` and its backward) as a step.

    ``impl``, ``block_m`` and ``block_n`` are passed through (``impl="auto"``: the fast kernels
    where they apply).  CUDA tensors run in place on torch's current stream; CPU tensors run as
    numpy under the CUDA simulator."""

    def __init__(self, impl: str = "auto", block_m: int | None = None, block_n: int | None = None):
        self.impl, self.block_m, self.block_n = impl, block_m, block_n

    def _call(self, fn, tensors, **kw):
        kw.update(impl=self.impl, block_m=self.block_m, block_n=self.block_n)
        if tensors[0].device.type == "cuda":
            with torch.cuda.device(tensors[0].device):
                return fn(*(t.contiguous() for t in tensors), **kw)
        out = fn(*(t.detach().contiguous().numpy() for t in tensors), **kw)
        return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in out)

    def forward(self, q, k, v, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
        from . import flash_attention

        return self._call(flash_attention, (q, k, v), causal=causal, scale=scale, return_lse=True)

    def backward(self, q, k, v, o, lse, do, causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        from . import flash_attention_backward

        return self._call(flash_attention_backward, (q, k, v, o, lse, do), causal=causal, scale=scale)


class ReferenceAttention:
    """Float64 attention in torch (bottom-right causal, grouped-query), forward with the
    logsumexp and the analytic backward; results in float64."""

    @staticmethod
    def _scores(q, k, causal, scale):
        g = q.shape[1] // k.shape[1]
        k = k.double().repeat_interleave(g, dim=1)
        s = scale * q.double() @ k.transpose(-1, -2)
        if causal:
            nq, nk = s.shape[-2:]
            i = torch.arange(nq, device=s.device)[:, None]
            j = torch.arange(nk, device=s.device)[None, :]
            s = s.masked_fill(j > i + (nk - nq), -math.inf)
        return s

    def forward(self, q, k, v, causal: bool, scale: float):
        s = self._scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None])
        g = q.shape[1] // v.shape[1]
        return p @ v.double().repeat_interleave(g, dim=1), lse

    def backward(self, q, k, v, o, lse, do, causal: bool, scale: float):
        g = q.shape[1] // k.shape[1]
        s = self._scores(q, k, causal, scale)
        p = torch.exp(s - lse.double()[..., None])
        do = do.double()
        vv = v.double().repeat_interleave(g, dim=1)
        dv = p.transpose(-1, -2) @ do
        dp = do @ vv.transpose(-1, -2)
        d = (do * o.double()).sum(-1, keepdim=True)
        ds = p * (dp - d)
        dq = scale * ds @ k.double().repeat_interleave(g, dim=1)
        dk = scale * ds.transpose(-1, -2) @ q.double()
        b, h, n, dim = dk.shape
        return dq, dk.view(b, h // g, g, n, dim).sum(2), dv.view(b, h // g, g, n, dim).sum(2)


# --------------------------------------------------------------------------------------------
# The ring


def _ring(group):
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def peer(r):
        r %= world
        return r if group is None else dist.get_global_rank(group, r)

    return rank, world, peer(rank + 1), peer(rank - 1)


def _post(sends: list[tuple[Tensor, int]], nxt: int, prv: int, group) -> tuple[list, list[Tensor]]:
    """Send each (tensor, tag) to ``nxt`` and receive its like from ``prv``; returns (requests,
    receive buffers)."""
    if not sends:
        return [], []
    ops, bufs = [], []
    for t, tag in sends:
        ops.append(dist.P2POp(dist.isend, t, nxt, group, tag))
    for t, tag in sends:
        b = torch.empty_like(t)
        bufs.append(b)
        ops.append(dist.P2POp(dist.irecv, b, prv, group, tag))
    return dist.batch_isend_irecv(ops), bufs


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(q, k, v, causal, scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: must be a 4-D torch.Tensor (B, H, n, d)")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}: shards of "
                         "one self-attention (same rows, batch and head dim; K and V alike)")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"kv heads={k.shape[1]}: must divide heads={q.shape[1]}")
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal={causal!r}: must be a bool")
    if causal and q.shape[2] % 2:
        raise ValueError(f"seq_len={q.shape[2]}: a zig-zag shard holds two chunks; must be even")
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    from ._arrays import check_scale

    return check_scale(scale)


def ring_forward(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None,
                 attn=None, group=None) -> tuple[Tensor, Tensor]:
    """This rank's O (q's dtype) and logsumexp L (fp32; float64 for float64 inputs) of ring
    attention.  ``q``, ``k``, ``v``: this rank's shards (B, H, n, d), (B, Hkv, n, d), from
    :func:`shard`.  Every rank of ``group`` (default: the world) calls it together."""
    scale = _check(q, k, v, causal, scale)
    attn = KernelAttention() if attn is None else attn
    rank, world, nxt, prv = _ring(group)
    n = q.shape[2]
    acc = _acc_dtype(q.dtype)
    kv = torch.stack([k, v])
    out = lse = None
    for s in range(world):
        reqs, bufs = _post([(kv, 0)] if s < world - 1 else [], nxt, prv, group)
        _, qs, ks, blk_causal = step_blocks(rank, s, world, n, causal)
        o_s, l_s = attn.forward(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], blk_causal, scale)
        if out is None:
            out, lse = o_s.to(acc), l_s.to(acc)
        else:
            o_s, l_s = o_s.to(acc), l_s.to(acc)
            old = lse[:, :, qs]
            new = torch.logaddexp(old, l_s)
            out[:, :, qs] = out[:, :, qs] * torch.exp(old - new)[..., None] + o_s * torch.exp(l_s - new)[..., None]
            lse[:, :, qs] = new
        for r in reqs:
            r.wait()
        if bufs:
            kv = bufs[0]
    return out.to(q.dtype), lse


def ring_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, *, causal: bool = False,
                  scale: float | None = None, attn=None, group=None) -> tuple[Tensor, Tensor, Tensor]:
    """This rank's dQ, dK, dV (the input dtype) of ring attention, from its shards and the
    forward's O and L (:func:`ring_forward`)."""
    scale = _check(q, k, v, causal, scale)
    attn = KernelAttention() if attn is None else attn
    rank, world, nxt, prv = _ring(group)
    n = q.shape[2]
    acc = _acc_dtype(q.dtype)
    kv = torch.stack([k, v])
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dkv_prev = None  # the dK, dV accumulator this rank finished in the step before
    for s in range(world):
        sends = ([(kv, 0)] if s < world - 1 else []) + ([(dkv_prev, 1)] if s >= 1 else [])
        reqs, bufs = _post(sends, nxt, prv, group)
        _, qs, ks, blk_causal = step_blocks(rank, s, world, n, causal)
        dq_s, dk_s, dv_s = attn.backward(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], o[:, :, qs],
                                         lse[:, :, qs].float() if lse.dtype != torch.float64 else lse[:, :, qs],
                                         do[:, :, qs], blk_causal, scale)
        dq[:, :, qs] += dq_s.to(acc)
        for r in reqs:
            r.wait()
        if s == 0:
            dkv = torch.zeros((2, *k.shape), dtype=acc, device=k.device)
        else:
            dkv = bufs[-1]  # the accumulator of this step's K, V shard, from rank - 1
        dkv[0][:, :, ks] += dk_s.to(acc)
        dkv[1][:, :, ks] += dv_s.to(acc)
        if s < world - 1:
            kv = bufs[0]
        dkv_prev = dkv
    if world > 1:  # the accumulators go home
        reqs, bufs = _post([(dkv_prev, 1)], nxt, prv, group)
        for r in reqs:
            r.wait()
        dkv_prev = bufs[0]
    return dq.to(q.dtype), dkv_prev[0].to(k.dtype), dkv_prev[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, attn, group):
        o, lse = ring_forward(q, k, v, causal=causal, scale=scale, attn=attn, group=group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.attn, ctx.group = causal, scale, attn, group
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, do.contiguous(), causal=ctx.causal, scale=ctx.scale,
                                   attn=ctx.attn, group=ctx.group)
        return dq, dk, dv, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None,
                   attn=None, group=None) -> Tensor:
    """Ring attention of this rank's shards (from :func:`shard`), differentiable: O's shard, and
    under autograd the shards of dQ, dK, dV from :func:`ring_backward`."""
    return _RingAttention.apply(q, k, v, causal, scale, attn, group)


__all__ = ["KernelAttention", "ReferenceAttention", "ring_attention", "ring_backward", "ring_forward", "shard",
           "step_blocks", "unshard"]
