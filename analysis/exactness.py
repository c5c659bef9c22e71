"""A numpy emulation of the online-softmax recurrence in low precision, to see where it rounds.

FlashAttention never forms a row of P at once: for each key block j (Bc columns) it updates

    m_new = max(m, rowmax(S_j))                       S_j = τ Q K_jᵀ
    P̃_j  = exp(S_j − m_new)
    ℓ_new = e^(m − m_new) ℓ + rowsum(P̃_j)
    acc   = e^(m − m_new) acc + P̃_j V_j

and divides by ℓ at the end (FlashAttention-2: ``acc`` lives on chip, in float32).
FlashAttention-1 (the paper's Algorithm 1, line 12) keeps O *normalised* in HBM instead and
re-reads and re-writes it once per key block,

    O ← (ℓ e^(m − m_new) O + P̃_j V_j) / ℓ_new

so O is rounded to its storage precision Tc = ⌈N/Bc⌉ times, each rounding adding a relative
error of about u (2⁻¹¹ for fp16) to the part of O already accumulated.

:func:`tiled_attention` emulates both on one or more heads, with the rounding points of a
kernel: inputs and P̃ (the operand of the P̃V product) in the storage precision ``store``;
products accumulated in float32 (tensor cores) and rounded to the on-chip precision ``acc``;
m, ℓ and the accumulator in ``acc``; O rounded to ``store`` (or ``o_store``) after every key
block when ``o_in_hbm`` (FlashAttention-1), else once at the end.  With
``store = acc = float64`` it is exact attention up to float64 rounding (the tests check it
against kernels/reference.py).
"""

from __future__ import annotations

import numpy as np


def _r(x, dtype):
    """Round to ``dtype`` (and keep it there)."""
    return np.asarray(x).astype(dtype)


def _wide(acc):
    """Where products accumulate: float32 (tensor cores), float64 if the on-chip precision is."""
    return np.float64 if np.dtype(acc) == np.float64 else np.float32


def tiled_attention(q, k, v, block_n: int, *, store=np.float16, acc=np.float32, o_in_hbm: bool = False,
                    o_store=None, scale: float | None = None) -> np.ndarray:
    """Attention of (..., N, d) arrays by the online-softmax recurrence over key blocks of ``block_n``.

    No masking.  ``o_store`` is O's precision in HBM (default ``store``; float32 models the
    FlashAttention-1 kernel's ``o_fp32`` option, which matters only with ``o_in_hbm``).
    Returns O in ``store`` precision, as the kernels hand it back (compare it in float64).
    """
    o_store = store if o_store is None else o_store
    if not isinstance(block_n, (int, np.integer)) or isinstance(block_n, bool) or block_n <= 0:
        raise ValueError(f"block_n={block_n!r}: must be a positive integer")
    q, k, v = (_r(x, store) for x in (q, k, v))
    if q.shape[-1] != k.shape[-1] or k.shape != v.shape:
        raise ValueError(f"q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}: need (..., N, d) with equal d")
    n_k = k.shape[-2]
    tau = _r(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale, acc)
    rows = q.shape[:-1] + (1,)
    m = np.full(rows, -np.inf, dtype=acc)
    l = np.zeros(rows, dtype=acc)
    o = np.zeros(q.shape, dtype=o_store if o_in_hbm else acc)  # normalised O (HBM) or the accumulator
    wide = _wide(acc)
    qw, vw = q.astype(wide), v.astype(wide)  # exact: widening loses nothing
    # Kᵀ made contiguous once: a block of its columns is then a plain strided matrix for BLAS
    # (a slice of a transposed view sends numpy's batched matmul down a loop ~50x slower)
    ktw = np.ascontiguousarray(np.swapaxes(k, -1, -2).astype(wide))
    for c0 in range(0, n_k, block_n):
        s = _r(_r(np.matmul(qw, ktw[..., c0:c0 + block_n]), acc) * tau, acc)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        p = _r(np.exp(s - m_new), acc)
        alpha = _r(np.exp(m - m_new), acc)  # exp(-inf) = 0 on the first block
        l_new = _r(alpha * l + p.sum(axis=-1, keepdims=True, dtype=acc), acc)
        pv = _r(np.matmul(_r(p, store).astype(wide), vw[..., c0:c0 + block_n, :]), acc)
        if o_in_hbm:
            o = _r((l * alpha * o.astype(acc) + pv) / l_new, o_store)
        else:
            o = _r(alpha * o + pv, acc)
        m, l = m_new, l_new
    # the result is handed back in the input precision, as the kernels do
    return _r(o, store) if o_in_hbm else _r(o / l, store)


__all__ = ["tiled_attention"]
