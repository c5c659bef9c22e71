"""fwd_fp16_v1: FlashAttention-2 forward for fp16 on the tensor cores (mma.sync m16n8k16).

What changed against the reference kernel (``kernels/flash2.py``, element-strided loops in
float32 over shared-memory tiles): every matrix product runs on the tensor cores through the
linked ``mma`` helper of :mod:`kernels.perf.tc`, and S, P and the O accumulator never leave
registers.

Organisation (the FlashAttention-2 paper's Algorithm 1 with its warp partitioning):

* a block of ``NW`` warps owns Br = 16·NW query rows (warp w: rows 16w .. 16w+15) of one
  (batch, head); K_j, V_j tiles of Bc keys stream through shared memory, double-buffered with
  ``cp.async`` (tile j+1 is in flight while tile j is used);
* each warp keeps its Q rows as A fragments in registers (loaded once with ``ldmatrix``), and
  for every key block computes S = Q K_jᵀ (16 x Bc, f32 in registers), the online-softmax update
  of m_i, ℓ_i (per lane: rows g and g+8 of the warp's 16; a quad of 4 lanes shares each row),
  packs P̃ to f16 in the A layout and accumulates O += P̃ V_j (16 x d, f32 in registers);
* exponentials are ``ex2.approx`` of log2-scaled scores: P̃ = 2^(S·τ·log2e − m·τ·log2e), one FMA
  and one MUFU per score;
* ℓ_i is kept per lane (partial over the lane's columns) and summed over the quad once at the
  end, as flash-attention does; the row max is reduced over the quad every block (it decides α).

Masking: keys past Nk and, with ``causal`` (bottom-right aligned, as the reference), keys
j > i + Nk − Nq are set to −inf before the max; only blocks that straddle an edge pay for the
test.  A row that sees no key keeps m = −inf, ℓ = 0 and gets O = 0, L = −inf.

Limits: fp16 only; head dim d a multiple of 8 (16-byte rows for cp.async) up to 256; the
launcher falls back to the reference kernel otherwise (see :mod:`kernels.perf.api`).

Measured: see the table in ``kernels/perf/NOTES.md`` (filled from the benchmark's CSV).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int64, types, uint32

from . import tc

LOG2E = 1.4426950408889634
NEG_INF = float32(-math.inf)


def smem_bytes(dp: int, br: int, bc: int) -> int:
    stride = dp + 8
    return 2 * stride * (br + 4 * bc)


def _source(DP: int, BC: int, NW: int, CAUSAL: bool):
    BR = 16 * NW
    NT = 32 * NW
    S = DP + 8  # shared row stride in f16: 16 bytes of padding keeps ldmatrix rows in distinct banks
    KT = DP // 16  # k-steps of Q·Kᵀ
    NS = BC // 8  # n-tiles of S
    KV = BC // 16  # k-steps of P·V
    NO = DP // 8  # n-tiles of O
    NQA, NACC, NS4, NPA = 4 * KT, 4 * NO, 4 * NS, 4 * KV  # fragment array lengths (compile-time)
    QOFF = 0
    KOFF = BR * S  # K buffers 0 and 1
    VOFF = KOFF + 2 * BC * S  # V buffers 0 and 1

    def fwd(q, k, v, o, lse, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        nh = q.shape[1]
        b = bh // nh
        h = bh % nh
        hk = h // (nh // k.shape[1])
        nq = q.shape[2]
        nk = k.shape[2]
        d = q.shape[3]
        ch = d // 8  # 16-byte chunks per row
        r0 = i * BR
        shift = nk - nq
        qbase = ((b * nh + h) * nq) * d
        kbase = ((b * k.shape[1] + hk) * nk) * d
        # Zero the padding columns d..DP of every tile once; cp.async never writes them.
        for e in range(tid, (BR + 4 * BC) * (DP - d), NT):
            r = e // (DP - d)
            sm[r * S + d + e % (DP - d)] = 0.0
        # Visible key blocks: all of them, or with causal those up to the block's last row's
        # last visible column.
        tc_ = (nk + BC - 1) // BC
        last_col = min(r0 + BR, nq) - 1 + shift
        nblk = tc_
        if CAUSAL:
            nblk = min(tc_, max(0, (last_col + BC) // BC))
        # Q_i and (K_0, V_0) in flight together.
        for e in range(tid, BR * ch, NT):
            r = e // ch
            c = (e % ch) * 8
            ok = r0 + r < nq
            tc.cp_async16(sm, QOFF + r * S + c, q, qbase + (r0 + r if ok else 0) * d + c, 8 if ok else 0)
        if nblk > 0:
            for e in range(tid, BC * ch, NT):
                r = e // ch
                c = (e % ch) * 8
                ok = r < nk
                goff = kbase + (r if ok else 0) * d + c
                tc.cp_async16(sm, KOFF + r * S + c, k, goff, 8 if ok else 0)
                tc.cp_async16(sm, VOFF + r * S + c, v, goff, 8 if ok else 0)
        tc.cp_async_commit()
        tc.cp_async_wait(0)
        cuda.syncthreads()  # Q_i, K_0, V_0 and the zeroed padding are in shared memory
        qa = cuda.local.array(NQA, uint32)
        for kk in range(KT):
            tc.ldsm_x4(qa, 4 * kk, sm, QOFF, S, 16 * warp, 16 * kk)
        acc = cuda.local.array(NACC, float32)
        for e in range(4 * NO):
            acc[e] = 0.0
        s = cuda.local.array(NS4, float32)
        pa = cuda.local.array(NPA, uint32)
        kb = cuda.local.array(4, uint32)
        m_0 = NEG_INF  # running max of row g (raw scores)
        m_1 = NEG_INF  # row g + 8
        l_0 = float32(0.0)  # this lane's part of ℓ for row g
        l_1 = float32(0.0)
        row_0 = r0 + 16 * warp + g
        row_1 = row_0 + 8
        for j in range(nblk):
            buf = j % 2
            c0 = j * BC
            # Prefetch K_{j+1}, V_{j+1} into the other buffer: its last readers finished at the
            # syncthreads that closed iteration j - 1.
            if j + 1 < nblk:
                nb_ = (j + 1) % 2
                for e in range(tid, BC * ch, NT):
                    r = e // ch
                    c = (e % ch) * 8
                    ok = c0 + BC + r < nk
                    goff = kbase + ((c0 + BC + r) if ok else 0) * d + c
                    tc.cp_async16(sm, KOFF + (nb_ * BC + r) * S + c, k, goff, 8 if ok else 0)
                    tc.cp_async16(sm, VOFF + (nb_ * BC + r) * S + c, v, goff, 8 if ok else 0)
                tc.cp_async_commit()
                tc.cp_async_wait(1)
            else:
                tc.cp_async_wait(0)
            cuda.syncthreads()  # K_j, V_j have landed for every warp
            kofs = KOFF + buf * BC * S
            vofs = VOFF + buf * BC * S
            # S = Q_i K_jᵀ for the warp's 16 rows: NS tiles of 16 x 8, KT k-steps each.
            for e in range(4 * NS):
                s[e] = 0.0
            for kk in range(KT):
                for n2 in range(NS // 2):
                    tc.ldsm_x4(kb, 0, sm, kofs, S, 16 * n2, 16 * kk)
                    tc.mma(s, 8 * n2, qa, 4 * kk, kb[0], kb[2])
                    tc.mma(s, 8 * n2 + 4, qa, 4 * kk, kb[1], kb[3])
            # Mask what row g / g+8 may not see: keys >= Nk, and causal keys > row + Nk - Nq.
            if c0 + BC > nk or (CAUSAL and c0 + BC - 1 > r0 + 16 * warp + shift):
                for nt in range(NS):
                    for e in range(4):
                        col = c0 + 8 * nt + 2 * t + (e % 2)
                        row = row_0 if e < 2 else row_1
                        if col >= nk or (CAUSAL and col > row + shift):
                            s[4 * nt + e] = NEG_INF
            # Online softmax.  m_new = max(m, rowmax S); α = 2^((m − m_new)·τlog2e);
            # P̃ = 2^((S − m_new)·τlog2e); ℓ = α ℓ + rowsum P̃; acc = α acc + P̃ V_j.
            mx_0 = m_0
            mx_1 = m_1
            for nt in range(NS):
                mx_0 = max(mx_0, max(s[4 * nt], s[4 * nt + 1]))
                mx_1 = max(mx_1, max(s[4 * nt + 2], s[4 * nt + 3]))
            mx_0, mx_1 = tc.quad_max2(mx_0, mx_1)
            mu_0 = mx_0 if mx_0 != NEG_INF else float32(0.0)  # no visible key yet: subtract 0
            mu_1 = mx_1 if mx_1 != NEG_INF else float32(0.0)
            alpha_0 = tc.ex2((m_0 - mu_0) * sl2)
            alpha_1 = tc.ex2((m_1 - mu_1) * sl2)
            m_0 = mx_0
            m_1 = mx_1
            ms_0 = mu_0 * sl2
            ms_1 = mu_1 * sl2
            ps_0 = float32(0.0)
            ps_1 = float32(0.0)
            for nt in range(NS):
                p0 = tc.ex2(s[4 * nt] * sl2 - ms_0)
                p1 = tc.ex2(s[4 * nt + 1] * sl2 - ms_0)
                p2 = tc.ex2(s[4 * nt + 2] * sl2 - ms_1)
                p3 = tc.ex2(s[4 * nt + 3] * sl2 - ms_1)
                ps_0 += p0 + p1
                ps_1 += p2 + p3
                # C layout of tile nt -> A layout of k-step nt // 2 (registers 0,1 or 2,3).
                pa[4 * (nt // 2) + 2 * (nt % 2)] = tc.pack_f16x2(p0, p1)
                pa[4 * (nt // 2) + 2 * (nt % 2) + 1] = tc.pack_f16x2(p2, p3)
            l_0 = l_0 * alpha_0 + ps_0
            l_1 = l_1 * alpha_1 + ps_1
            for nt in range(NO):
                acc[4 * nt] *= alpha_0
                acc[4 * nt + 1] *= alpha_0
                acc[4 * nt + 2] *= alpha_1
                acc[4 * nt + 3] *= alpha_1
            # acc += P̃ V_j: KV k-steps over keys, NO tiles of 8 head-dim columns.
            for kk in range(KV):
                for n2 in range(NO // 2):
                    tc.ldsm_x4_trans(kb, 0, sm, vofs, S, 16 * kk, 16 * n2)
                    tc.mma(acc, 8 * n2, pa, 4 * kk, kb[0], kb[1])
                    tc.mma(acc, 8 * n2 + 4, pa, 4 * kk, kb[2], kb[3])
            cuda.syncthreads()  # every warp is done with buffer j % 2 before it is refilled
        # Epilogue: ℓ over the quad, O = acc / ℓ, L = m·τ + ln ℓ.
        l_0, l_1 = tc.quad_sum2(l_0, l_1)
        inv_0 = float32(1.0) / l_0 if l_0 > 0 else float32(0.0)
        inv_1 = float32(1.0) / l_1 if l_1 > 0 else float32(0.0)
        for nt in range(NO):
            col = 8 * nt + 2 * t
            if col < d:
                if row_0 < nq:
                    o[b, h, row_0, col] = acc[4 * nt] * inv_0
                    o[b, h, row_0, col + 1] = acc[4 * nt + 1] * inv_0
                if row_1 < nq:
                    o[b, h, row_1, col] = acc[4 * nt + 2] * inv_1
                    o[b, h, row_1, col + 1] = acc[4 * nt + 3] * inv_1
        if t == 0:
            if row_0 < nq:
                lse[b, h, row_0] = m_0 * scale + math.log(l_0) if l_0 != 0 else NEG_INF
            if row_1 < nq:
                lse[b, h, row_1] = m_1 * scale + math.log(l_1) if l_1 != 0 else NEG_INF

    return fwd, NT, BR


@cache
def kernel(dp: int, bc: int, nw: int, causal: bool):
    fn, nt, br = _source(dp, bc, nw, causal)
    return cuda.jit(fn), nt, br


def signature():
    from numba import types

    a4 = types.Array(types.float16, 4, "C")
    return types.void(a4, a4, a4, a4, types.Array(float32, 3, "C"), float32, float32)


def default_config(d: int) -> tuple[int, int]:
    """(Bc, warps) for head dim d."""
    return (64, 4) if d <= 64 else (32, 4)


def supports(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float16 and d % 8 == 0 and 8 <= d <= 256


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, block_n=None, warps=None, stream=None):
    """O (and L) for fp16 (B, H, N, d) inputs; the launcher of the kernel above."""
    from .._arrays import check_attention_shapes, to_device
    from ..flash1 import _raise_smem_limit
    from ._launch import positive_scale

    inp = to_device(q=q, k=k, v=v, stream=stream, causal=causal, scale=scale, return_lse=return_lse)
    a = inp.arrays
    nb, nh, nhk, nq, nk, d = check_attention_shapes(a["q"], a["k"], a["v"])
    if not supports(inp.dtype, d):
        raise ValueError(f"dtype={inp.dtype}, head_dim={d}: fwd_fp16_v1 takes float16 with head_dim % 8 == 0")
    bc0, nw0 = default_config(d)
    bc = bc0 if block_n is None else int(block_n)
    nw = nw0 if warps is None else int(warps)
    if bc % 16 or bc <= 0:
        raise ValueError(f"block_n={bc}: must be a positive multiple of 16")
    dp = -(-d // 16) * 16
    kern, nt, br = kernel(dp, bc, nw, bool(causal))
    sc = positive_scale(inp, a, 1.0 / math.sqrt(d) if scale is None else float(scale))
    o = inp.empty((nb, nh, nq, d), np.float16)
    lse = inp.empty((nb, nh, nq), np.float32)
    smem = smem_bytes(dp, br, bc)
    args = (a["q"], a["k"], a["v"], o, lse, float32(sc * LOG2E), float32(sc))
    _raise_smem_limit(kern, args, smem)
    kern[(-(-nq // br), nb * nh), nt, inp.stream, smem](*args)
    if return_lse:
        return inp.out(o), inp.out(lse)
    return inp.out(o)


__all__ = ["forward", "kernel", "signature", "supports", "default_config", "smem_bytes", "int64"]
