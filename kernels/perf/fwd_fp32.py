"""The fp32 forward, one version: ``fwd_fp32_v1``, FlashAttention-2 in exact fp32 on the CUDA cores,
register-tiled like an SGEMM (shipped).

What it is.  The fp32 counterpart of fwd_fp16 (v3): same module API, arguments and conventions
(grid (Tr, B·H), causal aligned bottom-right with the longest query blocks launched first,
grouped-query attention, keys >= Nk masked, a row that sees no key gets O = 0 and L = -inf),
but every product is an FFMA: no tensor cores and no TF32, so O matches the float64 reference
to ~1e-7 relative.  The target is torch's naive fp32 attention with TF32 off (two cuBLAS
SGEMMs and a softmax, ~23-27 TFLOP/s on an H100/H200 at d = 64) at N >= 4096.

Design.  A block of NW warps owns Br = 16·NW·(RM/4) query rows (4·RM rows per warp) and walks
the key blocks of Bc keys.  Inside a warp the lanes form a 4 x 8 grid, ty = lane // 8, tx =
lane % 8, and a thread owns

* the S entries of rows r_m = 4·RM·warp + ty + 4m (m < RM) and keys tx + 8n (n < Bc/8);
* the O entries of the same rows and columns 4·tx + 32·u + (0..3) (u < ceil(d/32)).

So a warp owns whole rows of S: the row max and sum are reductions over the 8 lanes of a lane
group (three xor shuffles, ``tc.oct_max``; the sum is kept per lane and reduced once at the
end), and P̃ goes through shared memory only within the warp.  Q, K, V and P̃ sit in shared
memory untransposed, row-major, loaded by 16-byte cp.async (Q once, K and V per block; rows
past N zero-filled); the products read them with 16-byte ``ld.shared.v4`` (``tc.lds128_f32_a``):

* S = Q Kᵀ, per 4 dims: RM loads of Q (the thread's rows) + Bc/8 loads of K (its keys) feed
  4·RM·Bc/8 FFMA (4 x 8 x 4 = 128 per 12 loads at RM = 4, Bc = 64);
* O += P̃ V, per 4 keys: RM loads of P̃ + 4·ceil(d/32) loads of V feed 16·RM·ceil(d/32) FFMA
  (again 128 per 12 at d = 64).

Bank conflicts: Q and K rows are d16 + 4 floats apart (d16 = d rounded up to 16; a row stride
of an odd number of 16-byte units), so the 8 different keys (rows) a warp's LDS.128 of K
touches fall in 8 distinct groups of 4 banks and the 4 different query rows of a Q load in 4;
a V load reads 128 contiguous bytes per lane group; P̃ rows are Bc + 8 floats apart, so the
scalar P̃ stores (one row per lane group, 8 consecutive keys) and the P̃ loads are conflict-free
too.  Lanes of the other lane groups read the same addresses (broadcast), so each LDS.128 is
one shared-memory wavefront.

Pipeline: one K buffer and one V buffer, refilled a phase ahead: after the barrier that
starts block j the V_j copy is issued and runs under S_j and the softmax; after the barrier
that ends S_j (all warps are done with K_j) the K_{j+1} copy is issued and runs under P̃_j V_j.
Two barriers per block and half the shared memory of double buffering (d = 64, Br = Bc = 64:
68 KB, three blocks of 4 warps per SM).  The softmax is fwd_fp16_v3's, in log2 units with
``ex2.approx.ftz``, except that the exponent is (s − m)·τ log2 e (one FADD and one FMUL) rather
than one FFMA s·τlog2e − m·τlog2e: the latter loses ~ulp(m·τ log2 e) in every exponent, 4e-4
relative at logits of 1e4, the former stays exact at any logit size.

The copier (``f32_copier``) and the two FFMA products (``ffma_abt``, ``ffma_ab``) are
:mod:`kernels.perf._tiles`'s, shared with bwd_fp32_v1.

Every per-thread array (S 4·RM·Bc/8... accumulators, fragments) is indexed by compile-time
constants in constant-trip loops, d is a compile-time constant, and shared memory is
addressed by 32-bit window addresses: a thread's base address is computed once and every
load adds an immediate.

Measured (H200): d = 64 35.7-38.0 TFLOP/s, 1.30-1.31x naive (predicted 35-42); d = 128 35,
0.93-0.96x.  The prediction, the measurements and the tuning: ``kernels/perf/NOTES.md`` ("fp32").
"""

from __future__ import annotations

import math
from functools import cache
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32, types

from ..flash2 import padded_head_dim
from . import tc
from ._tiles import NEG_INF, f32_copier, ffma_ab, ffma_abt, query_block


def _strides(d16: int, bc: int) -> tuple[int, int, int]:
    """Row strides in floats of Q/K (d16 + 4: an odd number of 16-byte units), V (d rounded up to
    32: the O columns a lane group covers) and P̃ (Bc + 8: lane groups 8 floats apart)."""
    return d16 + 4, -(-d16 // 32) * 32, bc + 8


def smem_bytes(dp: int, br: int, bc: int) -> int:
    """Dynamic shared memory of one block; ``dp`` is d rounded up to 16."""
    qks, vs, ps = _strides(dp, bc)
    return 4 * (br * qks + bc * qks + bc * vs + br * ps)


def _source(D: int, BC: int, NW: int, RM: int, CAUSAL: bool, UNROLL: int = 2):
    D16 = padded_head_dim(D)
    QKS, VS, PS = _strides(D16, BC)
    TN = BC // 8  # keys of S per thread
    NV = VS // 32  # 4-column groups of O per thread
    BR = 4 * RM * NW
    NT = 32 * NW
    RW = 4 * RM  # rows per warp
    KC = D // 4  # 4-dim steps of S = Q Kᵀ
    PC = BC // 4  # 4-key steps of O += P̃ V
    NO = RM * NV * 4  # O accumulators per thread
    NS, NQF, NKF, NVF = RM * TN, 4 * RM, 4 * TN, 4 * NV  # local array sizes (literals for Numba)
    QOFF = 0
    KOFF = BR * QKS
    VOFF = KOFF + BC * QKS
    POFF = VOFF + BC * VS
    assert BC % 16 == 0 and D % 4 == 0 and RM >= 1 and 1 <= NW <= tc.MAX_WARPS and UNROLL in (1, 2, 4)

    start = query_block(BR, BC, CAUSAL)
    copy_q = f32_copier(BR, NT, D, QKS)
    copy_k = f32_copier(BC, NT, D, QKS)
    copy_v = f32_copier(BC, NT, D, VS)
    # S = Q Kᵀ: the thread's rows 4m apart, keys 8n apart; O += P̃ V: its rows, columns 32u + (0..3).
    qk = ffma_abt(RM, TN, 4 * QKS, 8 * QKS, KC, UNROLL)
    pv = ffma_ab(RM, NV, 4 * PS, VS, PC, UNROLL)

    def fwd(q, k, v, o, lse, sl2, scale):
        sm = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        ty = lane >> 3
        tx = lane & 7
        i, b, h, hk, nq, nk, shift, r0, nblk = start(q, k)
        qbase = ((b * q.shape[1] + h) * nq) * D
        kbase = ((b * k.shape[1] + hk) * nk) * D
        sbase = tc.smem_u32_f32(sm)
        rl = warp * RW + ty  # the thread's first row in the block; its rows are rl + 4m
        qa = sbase + 4 * (QOFF + rl * QKS)  # Q[rl, 0]
        ka = sbase + 4 * (KOFF + tx * QKS)  # K[tx, 0]
        va = sbase + 4 * (VOFF + 4 * tx)  # V[0, 4tx]
        pa = sbase + 4 * (POFF + rl * PS)  # P̃[rl, 0]
        pw = pa + 4 * tx  # P̃[rl, tx]
        # Q_i and K_0 (rows past N zero-filled), one cp.async group.
        copy_q(sm, sbase + 4 * QOFF, q, qbase + r0 * D, nq - r0, tid)
        if nblk > 0:
            copy_k(sm, sbase + 4 * KOFF, k, kbase, nk, tid)
        tc.cp_async_commit()
        acc = cuda.local.array(NO, float32)
        for x in range(NO):
            acc[x] = 0.0
        s = cuda.local.array(NS, float32)
        qf = cuda.local.array(NQF, float32)
        kf = cuda.local.array(NKF, float32)
        vf = cuda.local.array(NVF, float32)
        mrow = cuda.local.array(RM, float32)  # running max (raw scores) of the thread's rows
        lrow = cuda.local.array(RM, float32)  # this lane's part of ℓ of the same rows
        for m in range(RM):
            mrow[m] = NEG_INF
            lrow[m] = 0.0
        for j in range(nblk):
            c0 = j * BC
            tc.cp_async_wait(0)  # this thread's copies of K_j (and Q_i) have landed
            cuda.syncthreads()  # everyone's have, and every warp is done with V_{j-1}
            copy_v(sm, sbase + 4 * VOFF, v, kbase + c0 * D, nk - c0, tid)
            tc.cp_async_commit()  # V_j lands while S_j is computed
            # S = Q Kᵀ: per 4 dims, RM + TN 16-byte loads and 4·RM·TN FFMA.
            qk(s, qf, kf, sm, qa, ka)
            if c0 + BC > nk or (CAUSAL and c0 + BC - 1 > r0 + shift):
                for m in range(RM):
                    row = r0 + rl + 4 * m
                    for n in range(TN):
                        col = c0 + tx + 8 * n
                        if col >= nk or (CAUSAL and col > row + shift):
                            s[m * TN + n] = NEG_INF
            # Online softmax, per row: m_new = max(m, max_c S), P̃ = 2^((S − m_new)·τ log2 e),
            # α = 2^((m − m_new)·τ log2 e); while m_new is −inf (no visible key yet) subtract 0.
            for m in range(RM):
                mx = mrow[m]
                for n in range(TN):
                    mx = max(mx, s[m * TN + n])
                mx = tc.oct_max(mx)
                mu = mx if mx != NEG_INF else float32(0.0)
                alpha = tc.ex2((mrow[m] - mu) * sl2)
                mrow[m] = mx
                ps = float32(0.0)
                for n in range(TN):
                    p = tc.ex2((s[m * TN + n] - mu) * sl2)
                    ps += p
                    tc.sts32_f32_a(sm, pw, 4 * m * PS + 8 * n, p)
                lrow[m] = lrow[m] * alpha + ps
                for x in range(NV * 4):
                    acc[m * NV * 4 + x] *= alpha
            tc.cp_async_wait(0)  # this thread's copies of V_j have landed
            cuda.syncthreads()  # everyone's have, every warp is done with K_j, P̃_j is visible
            if j + 1 < nblk:
                copy_k(sm, sbase + 4 * KOFF, k, kbase + (c0 + BC) * D, nk - c0 - BC, tid)
            tc.cp_async_commit()  # K_{j+1} (empty on the last block) lands while O += P̃ V
            # O += P̃ V: per 4 keys, RM loads of P̃, 4·NV of V and 16·RM·NV FFMA.
            pv(acc, qf, vf, sm, pa, va)
        tc.cp_async_wait(0)
        # Epilogue: ℓ over the lane group, O = acc/ℓ and L = m·τ + log ℓ straight to global memory.
        for m in range(RM):
            lsum = tc.oct_sum(lrow[m])
            inv = float32(1.0) / lsum if lsum > 0 else float32(0.0)
            row = r0 + rl + 4 * m
            if row < nq:
                for u in range(NV):
                    for f in range(4):
                        col = 4 * tx + 32 * u + f
                        if col < D:
                            o[b, h, row, col] = acc[(m * NV + u) * 4 + f] * inv
                if tx == 0:
                    lse[b, h, row] = mrow[m] * scale + math.log(lsum) if lsum != 0 else NEG_INF

    return fwd, NT, BR


@cache
def kernel(d: int, bc: int, nw: int, rm: int, causal: bool, unroll: int = 2, minb: int = 1):
    fn, nt, br = _source(d, bc, nw, rm, causal, unroll)
    return tc.jit_kernel(fn, nt, minb), nt, br


def signature():
    a4 = types.Array(float32, 4, "C")
    return types.void(a4, a4, a4, a4, types.Array(float32, 3, "C"), float32, float32)


def default_config(d: int) -> dict:
    """Block shape per head dim: Bc keys, warps, rows per thread (Br = 4·rm·nw), and the blocks per
    SM promised to ptxas (launch bounds: caps the registers)."""
    if d <= 64:  # minb=2 (ptxas held to 128 registers): +5-10% over minb=1 at N = 4,096-16,384
        return dict(bc=64, nw=4, rm=4, unroll=2, minb=2)
    return dict(bc=32, nw=4, rm=4, unroll=2, minb=1)


def supports(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float32 and d % 4 == 0 and 4 <= d <= 128


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, **config):
    """O (and L) for fp32 (B, H, N, d) inputs; ``config`` overrides :func:`default_config`."""
    from ._launch import launch_forward

    return launch_forward("fwd_fp32_v1", kernel, smem_bytes, default_config, supports, q, k, v, causal=causal,
                          scale=scale, return_lse=return_lse, config=config)


#: The versions by the names the records use (:func:`kernels.perf.variant`).
VERSIONS = {"fwd_fp32_v1": SimpleNamespace(name="fwd_fp32_v1", forward=forward, kernel=kernel,
                                           default_config=default_config, supports=supports,
                                           smem_bytes=smem_bytes, signature=signature,
                                           SOURCES={"fwd": (_source, signature)})}
