"""The float64 reference for attention forward and backward, and how to judge a result against it.

Shared by the kernel tests, the benchmarks and the notebooks.  Arrays are (B, H, N, d); K and V
may have fewer heads (grouped-query attention: Hkv divides H, query head h uses kv head
h // (H // Hkv)).

Masking conventions (the same as the kernels and the simulator, see ``flashsim.config``):

* causal is aligned bottom-right: query row i sees key column j iff j <= i + (Nk - Nq);
* a block mask (``flashsim.config.BlockMask``) removes whole (Br x Bc) blocks;
* a row that sees no key at all gets O = 0 and L = -inf (flash-attention's convention), and
  contributes nothing to any gradient.

The backward is derived analytically (FlashAttention paper, Appendix B.2): with P = softmax(S),
dV = Pᵀ dO, dP = dO Vᵀ, D_i = Σ_j dO_ij O_ij = Σ_j P_ij dP_ij, dS = P ∘ (dP - D), dQ = τ dS K,
dK = τ dSᵀ Q, where τ is the softmax scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashsim.config import BlockMask


def default_scale(head_dim: int) -> float:
    return 1.0 / float(np.sqrt(head_dim))


def attention_mask(nq: int, nk: int, causal: bool = False, block_mask: BlockMask | None = None) -> np.ndarray:
    """Boolean (Nq, Nk) array, True where query i may attend key j."""
    allowed = np.ones((nq, nk), dtype=bool)
    if causal:
        i = np.arange(nq)[:, None]
        j = np.arange(nk)[None, :]
        allowed &= j <= i + (nk - nq)
    if block_mask is not None:
        bm = block_mask.array
        rows = np.arange(nq) // block_mask.block_m
        cols = np.arange(nk) // block_mask.block_n
        if bm.shape != (rows[-1] + 1, cols[-1] + 1):
            raise ValueError(f"block_mask.shape={bm.shape}: does not cover {nq}x{nk} with its blocks")
        allowed &= bm[rows][:, cols]
    return allowed


def _expand_kv(x: np.ndarray, heads: int) -> np.ndarray:
    hkv = x.shape[1]
    if heads % hkv:
        raise ValueError(f"kv heads={hkv}: must divide query heads={heads}")
    return np.repeat(x, heads // hkv, axis=1)


def _check(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q.ndim={q.ndim}, k.ndim={k.ndim}, v.ndim={v.ndim}: arrays must be (B, H, N, d)")
    if k.shape != v.shape:
        raise ValueError(f"k.shape={k.shape}, v.shape={v.shape}: must be equal")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q.shape={q.shape}, k.shape={k.shape}: batch and head_dim must match")


def attention_forward(q, k, v, *, causal: bool = False, scale: float | None = None,
                      block_mask: BlockMask | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Float64 attention: returns O (B, H, Nq, d) and the logsumexp L (B, H, Nq) of the scaled scores."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    _check(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    s = scale * (q @ np.swapaxes(k, -1, -2))
    allowed = attention_mask(q.shape[2], k.shape[2], causal, block_mask)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # l is 0 (no key seen), positive, or NaN
        o = np.where(l != 0, (p @ v) / np.where(l != 0, l, 1.0), 0.0)
        lse = np.where(l[..., 0] != 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return o, lse


def attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None,
                       block_mask: BlockMask | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 gradients (dQ, dK, dV) of Σ O ∘ dO; dK, dV have the kv heads' shape."""
    return attention_backward_and_scales(q, k, v, do, causal=causal, scale=scale, block_mask=block_mask)[0]


def attention_backward_and_scales(q, k, v, do, *, causal, scale, block_mask):
    """(dQ, dK, dV) and the sizes ‖·‖ the gradients have before they cancel: dQ and dK computed
    with dS = P∘(dP − D) replaced by P∘(|dP| + |D|), dV with |dO| (per query head, before the
    kv group's sum).  The judge needs the latter where an exact gradient vanishes."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    _check(q, k, v)
    heads, hkv = q.shape[1], k.shape[1]
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    o, lse = attention_forward(q, k, v, causal=causal, scale=scale, block_mask=block_mask)
    ke, ve = _expand_kv(k, heads), _expand_kv(v, heads)
    s = scale * (q @ np.swapaxes(ke, -1, -2))
    allowed = attention_mask(q.shape[2], k.shape[2], causal, block_mask)
    lse_safe = np.where(np.isfinite(lse), lse, 0.0)[..., None]
    p = np.where(allowed & np.isfinite(lse)[..., None], np.exp(s - lse_safe), 0.0)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(ve, -1, -2)
    d_row = (do * o).sum(axis=-1, keepdims=True)
    ds = p * (dp - d_row)
    dq = scale * (ds @ ke)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    terms = p * (np.abs(dp) + np.abs(d_row))
    mags = (scale * (terms @ np.abs(ke)), scale * (np.swapaxes(terms, -1, -2) @ np.abs(q)),
            np.swapaxes(p, -1, -2) @ np.abs(do))
    g = heads // hkv
    b = q.shape[0]
    dk = dk.reshape(b, hkv, g, *dk.shape[2:]).sum(axis=2)
    dv = dv.reshape(b, hkv, g, *dv.shape[2:]).sum(axis=2)
    return (dq, dk, dv), tuple(float(np.linalg.norm(x.ravel())) for x in mags)


# ---------------------------------------------------------------------------------------------
# Judging a result


def rel_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN if out has a NaN; 0/0 counts as 0)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    num = float(np.linalg.norm((out - ref).ravel()))
    den = float(np.linalg.norm(ref.ravel()))
    if np.isnan(num):
        return float("nan")
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def _round(x, dtype):
    return np.asarray(x, dtype=np.float32).astype(dtype).astype(np.float32)


def plain_attention_lowp(q, k, v, *, dtype=np.float16, causal: bool = False, scale: float | None = None,
                         block_mask: BlockMask | None = None) -> np.ndarray:
    """Attention as plain low-precision code computes it: the naive three steps with every
    intermediate stored in ``dtype`` ("bf16" for bfloat16; matrix products accumulate in float32, as cuBLAS and
    numpy-on-GPU-style libraries do, then round), softmax in ``dtype``.  This is the baseline
    that a flash kernel's low-precision error is judged against."""
    q, k, v = (_round_to(x, dtype) for x in (q, k, v))
    _check(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    s = _round_to(q @ np.swapaxes(k, -1, -2), dtype)
    s = _round_to(s * np.float32(scale), dtype)
    allowed = attention_mask(q.shape[2], k.shape[2], causal, block_mask)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = _round_to(np.exp(s - m), dtype)
    l = _round_to(p.sum(axis=-1, keepdims=True), dtype)
    p = _round_to(p / np.where(l > 0, l, 1.0), dtype)
    return _round_to(p @ v, dtype)


def plain_attention_backward_lowp(q, k, v, do, *, dtype=np.float16, causal: bool = False,
                                  scale: float | None = None, block_mask: BlockMask | None = None):
    """The gradients (dQ, dK, dV) as autograd computes them through :func:`plain_attention_lowp`:
    the forward's S, P and O stored in ``dtype``, then dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D)
    with D = rowsum(dO ∘ O), dQ = τ dS K, dK = τ dSᵀ Q, every product accumulated in float32
    and rounded to ``dtype``.  The baseline a low-precision backward kernel is judged against."""
    q, k, v, do = (_round_to(x, dtype) for x in (q, k, v, do))
    _check(q, k, v)
    heads, hkv = q.shape[1], k.shape[1]
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    ke, ve = _expand_kv(k, heads), _expand_kv(v, heads)
    o = plain_attention_lowp(q, k, v, dtype=dtype, causal=causal, scale=scale, block_mask=block_mask)
    s = _round_to(_round_to(q @ np.swapaxes(ke, -1, -2), dtype) * np.float32(scale), dtype)
    allowed = attention_mask(q.shape[2], k.shape[2], causal, block_mask)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = _round_to(np.exp(s - m), dtype)
    l = _round_to(p.sum(axis=-1, keepdims=True), dtype)
    p = _round_to(p / np.where(l > 0, l, 1.0), dtype)
    dv = _round_to(np.swapaxes(p, -1, -2) @ do, dtype)
    dp = _round_to(do @ np.swapaxes(ve, -1, -2), dtype)
    d_row = _round_to((do * o).sum(axis=-1, keepdims=True), dtype)
    ds = _round_to(p * _round_to(dp - d_row, dtype), dtype)
    dq = _round_to(_round_to(ds @ ke, dtype) * np.float32(scale), dtype)
    dk = _round_to(_round_to(np.swapaxes(ds, -1, -2) @ q, dtype) * np.float32(scale), dtype)
    b, g = q.shape[0], heads // hkv
    dk = _round_to(dk.reshape(b, hkv, g, *dk.shape[2:]).sum(axis=2), dtype)
    dv = _round_to(dv.reshape(b, hkv, g, *dv.shape[2:]).sum(axis=2), dtype)
    return dq, dk, dv


@dataclass(frozen=True)
class Judgement:
    """The verdict on a low-precision result: its error, the plain code's error, and the ratio."""

    error: float  # ‖out − ref‖/‖ref‖
    baseline_error: float  # the same for plain low-precision attention
    max_abs_error: float
    mean_abs_error: float
    ratio: float  # error / baseline_error
    tolerance_ratio: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error)) and self.ratio <= self.tolerance_ratio

    def __str__(self) -> str:
        return (f"rel err {self.error:.3e} vs plain low-precision {self.baseline_error:.3e} "
                f"(ratio {self.ratio:.2f}, allowed {self.tolerance_ratio:g}); "
                f"max abs {self.max_abs_error:.3e}, mean abs {self.mean_abs_error:.3e}")


def judge_low_precision(out, q, k, v, *, dtype=np.float16, causal: bool = False, scale: float | None = None,
                        block_mask: BlockMask | None = None, tolerance_ratio: float = 2.0,
                        ref: np.ndarray | None = None) -> Judgement:
    """Judge a low-precision attention output the way flash-attention's tests do.

    Low-precision outputs never match a float64 reference exactly; the question is whether the
    kernel is *as good as plain attention in the same precision*.  The verdict compares
    ‖out − ref‖/‖ref‖ with the same error of :func:`plain_attention_lowp` on the same (rounded)
    inputs, and passes when the ratio is at most ``tolerance_ratio`` (2 by default).
    """
    qr, kr, vr = (_round_to(x, dtype) for x in (q, k, v))
    if ref is None:
        ref, _ = attention_forward(qr, kr, vr, causal=causal, scale=scale, block_mask=block_mask)
    base = plain_attention_lowp(qr, kr, vr, dtype=dtype, causal=causal, scale=scale, block_mask=block_mask)
    err = rel_error(out, ref)
    berr = rel_error(base, ref)
    diff = np.abs(np.asarray(out, dtype=np.float64) - ref)
    ratio = err / berr if berr > 0 else (0.0 if err == 0 else float("inf"))
    return Judgement(err, berr, float(np.nanmax(diff)) if diff.size else 0.0,
                     float(np.nanmean(diff)) if diff.size else 0.0, ratio, tolerance_ratio)


def judge_low_precision_backward(grads, q, k, v, do, *, dtype=np.float16, causal: bool = False,
                                 scale: float | None = None, block_mask: BlockMask | None = None,
                                 tolerance_ratio: float = 2.0) -> dict[str, Judgement]:
    """:func:`judge_low_precision` for gradients: each of dQ, dK, dV against the float64 gradient
    of the rounded inputs, compared with the error of :func:`plain_attention_backward_lowp`."""
    qr, kr, vr, dor = (_round_to(x, dtype) for x in (q, k, v, do))
    refs, mags = attention_backward_and_scales(qr, kr, vr, dor, causal=causal, scale=scale, block_mask=block_mask)
    bases = plain_attention_backward_lowp(qr, kr, vr, dor, dtype=dtype, causal=causal, scale=scale,
                                          block_mask=block_mask)
    unit = 2.0 ** -9 if isinstance(dtype, str) and dtype == "bf16" else float(np.finfo(dtype).eps) / 2
    out = {}
    for name, g, r, base, mag in zip(("dQ", "dK", "dV"), grads, refs, bases, mags):
        err, berr = rel_error(g, r), rel_error(base, r)
        rn = float(np.linalg.norm(r.ravel()))
        if rn <= 1e-9 * mag:
            # The exact gradient vanishes by cancellation (dS = P∘(dP − D) = 0, e.g. every row sees
            # one key): a relative error has no denominator.  Measure both errors against the size
            # of the cancelling terms instead, and the plain code's error as at least the unit
            # roundoff (it can be exactly 0 where both products round alike).
            err = float(np.linalg.norm((np.asarray(g, np.float64) - r).ravel())) / mag
            berr = max(float(np.linalg.norm((np.asarray(base, np.float64) - r).ravel())) / mag, unit)
        diff = np.abs(np.asarray(g, dtype=np.float64) - r)
        ratio = err / berr if berr > 0 else (0.0 if err == 0 else float("inf"))
        out[name] = Judgement(err, berr, float(np.nanmax(diff)) if diff.size else 0.0,
                              float(np.nanmean(diff)) if diff.size else 0.0, ratio, tolerance_ratio)
    return out


# ---------------------------------------------------------------------------------------------
# Decoding against a KV cache (kernels/decode.py): variable lengths, paged caches, windows


def round_bf16(x) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest even; NaN stays NaN), returned as float32."""
    from ._bf16 import bf16_bits_to_f32, round_bf16_bits

    return bf16_bits_to_f32(round_bf16_bits(x))


def _round_to(x, dtype):
    """float32 of ``x`` rounded to ``dtype`` (a numpy dtype, or "bf16")."""
    if isinstance(dtype, str) and dtype == "bf16":
        return round_bf16(x)
    return _round(x, dtype)


def decode_mask(length: int, nq: int, *, causal: bool = True, window=None) -> np.ndarray:
    """Boolean (Nq, length): query row i (at position length - Nq + i) may attend key j."""
    pos = length - nq + np.arange(nq)[:, None]
    j = np.arange(length)[None, :]
    allowed = np.ones((nq, length), dtype=bool)
    if causal:
        allowed &= j <= pos
    if window is not None:
        left, right = int(window[0]), int(window[1])
        if left >= 0:
            allowed &= j >= pos - left
        if right >= 0:
            allowed &= j <= pos + right
    return allowed


def gather_cache(cache, b: int, length: int, block_table=None) -> np.ndarray:
    """The first ``length`` rows of sequence b's K (or V) as (Hkv, length, d): from a contiguous
    cache (B, Hkv, Nk_max, d), or from a paged one (num_pages, P, Hkv, d) through the block table."""
    cache = np.asarray(cache)
    if block_table is None:
        return cache[b, :, :length]
    psz = cache.shape[1]
    rows = np.arange(length)
    pages = np.asarray(block_table)[b, rows // psz]
    return np.swapaxes(cache[pages, rows % psz], 0, 1)  # (length, Hkv, d) -> (Hkv, length, d)


def _masked_attention64(q, k, v, allowed, scale):
    """Float64 (O, L) of q (H, Nq, d) against k, v (Hkv, N, d) under a boolean (Nq, N) mask."""
    k, v = _expand_kv(k[None], q.shape[0])[0], _expand_kv(v[None], q.shape[0])[0]
    s = scale * (q @ np.swapaxes(k, -1, -2))
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(l != 0, (p @ v) / np.where(l != 0, l, 1.0), 0.0)
        lse = np.where(l[..., 0] != 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return o, lse


def decode_forward(q, k_cache, v_cache, cache_seqlens=None, *, block_table=None, window=None, causal: bool = True,
                   scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Float64 decoding: O (B, Hq, Nq, d) and L (B, Hq, Nq) of each sequence's Nq query rows
    against the first L_b rows of its cache (contiguous, or paged through ``block_table``), with
    the masks of :func:`decode_mask`.  ``cache_seqlens`` None: every sequence fills the cache."""
    q = np.asarray(q, dtype=np.float64)
    kc, vc = np.asarray(k_cache, dtype=np.float64), np.asarray(v_cache, dtype=np.float64)
    b, hq, nq, d = q.shape
    if cache_seqlens is None:
        full = kc.shape[2] if block_table is None else np.asarray(block_table).shape[1] * kc.shape[1]
        cache_seqlens = [full] * b
    scale = default_scale(d) if scale is None else float(scale)
    o = np.zeros(q.shape)
    lse = np.zeros((b, hq, nq))
    for bb, length in enumerate(int(x) for x in np.asarray(cache_seqlens).ravel()):
        k = gather_cache(kc, bb, length, block_table)
        v = gather_cache(vc, bb, length, block_table)
        o[bb], lse[bb] = _masked_attention64(q[bb], k, v, decode_mask(length, nq, causal=causal, window=window),
                                             scale)
    return o, lse


def decode_plain_lowp(q, k_cache, v_cache, cache_seqlens=None, *, dtype=np.float16, block_table=None, window=None,
                      causal: bool = True, scale: float | None = None) -> np.ndarray:
    """Decoding as plain low-precision code computes it (:func:`plain_attention_lowp`'s steps, each
    intermediate rounded to ``dtype``; "bf16" for bfloat16): the baseline of the 2x rule."""
    q = _round_to(q, dtype)
    kc, vc = _round_to(k_cache, dtype), _round_to(v_cache, dtype)
    b, hq, nq, d = q.shape
    if cache_seqlens is None:
        full = kc.shape[2] if block_table is None else np.asarray(block_table).shape[1] * kc.shape[1]
        cache_seqlens = [full] * b
    scale = default_scale(d) if scale is None else float(scale)
    out = np.zeros(q.shape, dtype=np.float32)
    for bb, length in enumerate(int(x) for x in np.asarray(cache_seqlens).ravel()):
        k = _expand_kv(gather_cache(kc, bb, length, block_table)[None], hq)[0]
        v = _expand_kv(gather_cache(vc, bb, length, block_table)[None], hq)[0]
        s = _round_to(_round_to(q[bb] @ np.swapaxes(k, -1, -2), dtype) * np.float32(scale), dtype)
        s = np.where(decode_mask(length, nq, causal=causal, window=window), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = _round_to(np.exp(s - m), dtype)
        l = _round_to(p.sum(axis=-1, keepdims=True), dtype)
        p = _round_to(p / np.where(l > 0, l, 1.0), dtype)
        out[bb] = _round_to(p @ v, dtype)
    return out


def judge_decode(out, q, k_cache, v_cache, cache_seqlens=None, *, dtype=np.float16, block_table=None, window=None,
                 causal: bool = True, scale: float | None = None, tolerance_ratio: float = 2.0) -> Judgement:
    """The 2x rule for a low-precision decode output (:func:`judge_low_precision`, for decoding)."""
    qr, kr, vr = (_round_to(x, dtype) for x in (q, k_cache, v_cache))
    kw = dict(block_table=block_table, window=window, causal=causal, scale=scale)
    ref, _ = decode_forward(qr, kr, vr, cache_seqlens, **kw)
    base = decode_plain_lowp(qr, kr, vr, cache_seqlens, dtype=dtype, **kw)
    err, berr = rel_error(out, ref), rel_error(base, ref)
    diff = np.abs(np.asarray(out, dtype=np.float64) - ref)
    ratio = err / berr if berr > 0 else (0.0 if err == 0 else float("inf"))
    return Judgement(err, berr, float(np.nanmax(diff)), float(np.nanmean(diff)), ratio, tolerance_ratio)
