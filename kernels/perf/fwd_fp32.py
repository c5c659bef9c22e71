"""The fp32 forward, two versions of FlashAttention-2 in exact fp32 (~1e-7 relative to float64):

* ``fwd_fp32_v1`` (in ``BEST`` at head dims not a multiple of 8): every product an FFMA on the
  CUDA cores, register-tiled like an SGEMM.  H100 (bench_h100_single_run.csv): 1.28-1.55x naive
  fp32 at d = 64, 0.87-1.04x at d = 128.
* ``fwd_fp32_v2`` (in ``BEST`` at every d % 8 == 0 up to 128): v1's semantics, pipeline and softmax,
  but S = Q Kᵀ and O += P V on the TF32 tensor cores as 3xTF32 (``mma.sync.m16n8k8``, x = hi + lo,
  A·B ≈ A_lo·B_hi + A_hi·B_lo + A_hi·B_hi, fp32 accumulators), the method that made the fp32
  backward (bwd_fp32_v2) beat naive.  Its layout is in the comment above
  :func:`_source_v2`.  What changed against v1: the products (FFMA micro-tiles -> m16n8k8 warp
  tiles, 16·MT query rows a warp); P stays in registers (S's C fragment is P's A fragment under a
  key permutation: no shuffle, no shared-memory round trip, where v1 wrote P̃ to shared memory);
  the online softmax's rescale of O folds into the FFMA that adds each block's P V (summed in
  zeroed registers, as the tensor core's accumulator adds round toward zero).
  Prediction (NOTES.md, "fwd_fp32_v2"): 45-60 TFLOP/s at d = 64 and 128, 1.7-2.3x naive at d = 64,
  1.3-1.7x at d = 128.  Measured (H100, 97f1bc6): 2.00-2.10x naive at d = 64, 1.55-1.63x at
  d = 128, N >= 4,096; 1.45x at d = 128, N = 1,024 (the bench record).
  ``ostage`` (default since 88f4ef8): O goes through shared memory, where Q was, and out by 16-byte
  stores of whole sectors, where each lane's scalar stores put one float in a sector (8x the
  sectors of the bytes, a warp's store 8 rows x 4 sectors).  H200, 7 interleaved rounds
  (kernels/data/fwd_fp32_v2_ostage_h200_88f4ef8/): d = 128 1.020x at N = 1,024 (1.450x -> 1.480x
  naive), 1.012x at 4,096; d = 64 0.99-1.01x; O bit-identical.
  Head dims that are not a multiple of 32 (7fda245): the kernel computes with DP = d rounded up to
  32, the columns past d of K, V and Q zeroed in shared memory once a block (``zero_pad``); the
  copies and stores move the d real columns.  H200 (kernels/data/fwd_fp32_v2_pad_h200_f93c02a/):
  1.09-1.57x v1 at d = 40, 80, 112; 1.30-1.54x naive at d = 112, where v1 ran 0.89-0.98x.
  ``qfrag`` (default since 3b6c720): Q split a fragment tile at a time, each lane loading its own
  a0..a3 and storing their hi and lo parts by one ``st.shared.v4`` each (conflict-free, where
  split_q's scalar stores were 16-way).  H200, 9 interleaved rounds
  (kernels/data/fwd_fp32_v2_qfrag_h200_3b6c720/): d = 128 1.04x at N = 1,024 (1.482x -> 1.536x
  naive; the bench: 1.53x), 1.01x at 4,096; d = 64 within the spread; O bit-identical.

fwd_fp32_v1 in detail.  The fp32 counterpart of fwd_fp16 (v3): same module API, arguments and conventions
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
from functools import cache, partial
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32, types

from ..flash2 import padded_head_dim
from . import tc
from ._tiles import NEG_INF, f32_copier, f32_storer, ffma_ab, ffma_abt, query_block


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


# ---------------------------------------------------------------------------------------------
# fwd_fp32_v2: 3xTF32 on the tensor cores (``mma.sync.m16n8k8`` tf32, fp32 accumulators), the
# method of bwd_fp32_v2 on the forward.  Header: the module docstring; prediction: NOTES.md.
#
# Layout.  A block of NW warps owns Br = 16·NW·MT query rows, warp w the MT m-tiles of rows
# 16·(MT·w + mt) + (0..15); every warp walks every key block (Bc keys) of K and V in shared
# memory.  Lane l, g = l // 4, t = l % 4 (fragments: ``tc_gpu``'s m16n8k8 tf32 layout).
#
# * S = Q Kᵀ (reduction over d): the k index of each k-step is permuted so that a lane's two k's
#   (t, t + 4) are the adjacent dims 2t, 2t + 1: A (Q rows g, g + 8) and B (K row g) are one
#   ``ld.shared.v2`` each, as in bwd_fp32_v2's phase A; Q and K rows d + 8 floats apart (≡ 8 mod
#   32 banks: conflict-free).  S's C fragment: c0, c1 = S[g, keys 2t, 2t + 1], c2, c3 the same of
#   row g + 8, in the keys' own order.
# * O += P V (reduction over the keys): here the k index of k-step j is permuted as key
#   8j + 2t for k = t and 8j + 2t + 1 for k = t + 4.  Then P's A fragment of k-step j is the C
#   fragment of S's n-tile j, in registers, with no shuffle and no shared-memory round trip:
#   a0 = c0, a1 = c2, a2 = c1, a3 = c3.  V's B fragment is then b0 = V[8j + 2t, n], b1 =
#   V[8j + 2t + 1, n]; with the n index permuted as in bwd_fp32_v2's phases B and C (n-tile jj of
#   a 32-column group u takes the dims 32u + 4n + jj) one ``ld.shared.v4`` of row 8j + 2t at
#   column 32u + 4g gives b0 of four n-tiles, and one of row 8j + 2t + 1 their b1.  V rows are
#   d + 4 floats apart (≡ 4 mod 32: the 8 lanes of a quarter warp read rows 2t, 2t + 1 and
#   columns 4g in 8 distinct 16-byte bank groups).  The accumulators then hold, per group u, the
#   dims 32u + 8t + (0..7) of rows g and g + 8.
# * Split: every operand x is split as hi = x rounded to tf32 (``tc.tf32_hi``) and lo = x − hi.
#   Q once a query block (``qsplit``, the default): read from global memory, split, and stored
#   as hi and lo A fragments in fragment order (``split_q``), so that S's k-loop reads each with
#   one ``ld.shared.v4``, in the registers' order (a row-major hi/lo pair of tiles would need two
#   register moves an m-tile and k-step to put a0..a3 in order: that first build's main loop had
#   ~500 more IMAD.MOV/MOV in the SASS); without it Q is copied row-major and split a k-step
#   at a time, as K is.  Why not Q in registers: its hi and lo fragments are 2·d registers a lane
#   an m-tile (256 at d = 128).
#   K per k-step and V per k-step and column group, P once a key block, where they are read:
#   each warp splits the K and V fragments of its own products (shared by its MT m-tiles), 3
#   instructions an element, ~2 an mma at MT = 1.  Splitting K and V once a key block into hi
#   and lo tiles would trade those for twice the shared loads (at MT = 1 ~1.9 wavefronts an mma,
#   above what the tensor pipe leaves: NOTES.md) and a store pass: not done.
# * Accumulation in chunks (the tensor core's adds into its accumulator round toward zero;
#   NOTES.md, bwd_fp32_v2): S in AK chunks of d / AK dims summed in zeroed registers and added
#   in fp32; P V_j per 32-column group summed over the block's Bc keys (3·Bc/8 mma) in zeroed
#   registers, then O = α·O + (P V_j) by one FFMA an element (the online softmax's rescale is
#   that FFMA, so it costs nothing extra).
# * Pipeline: fwd_fp32_v1's: one K and one V buffer, V_j copied under S_j and K_{j+1} under
#   P V_j, two barriers a key block.  Online softmax as v1 (log2 units, exponent (s − m)·τ log2 e).


def compute_dim_v2(d: int) -> int:
    """The head dim fwd_fp32_v2 computes with: d rounded up to a multiple of 32 (its 32-column
    groups of O); the columns past d are zeros in shared memory."""
    return -(-d // 32) * 32


def smem_bytes_v2(dp: int, br: int, bc: int, qsplit: bool = False) -> int:
    """Q (Br rows of stride DP + 8; with ``qsplit`` its hi and lo fragments instead, 2·Br·DP), K
    (Bc rows, DP + 8) and V (Bc rows, DP + 4), in floats x 4; DP is the head dim rounded up to a
    multiple of 32 (``dp`` may be rounded to 16 already, as the launcher passes it)."""
    dp = compute_dim_v2(dp)
    return 4 * ((2 * br * dp if qsplit else br * (dp + 8)) + bc * (dp + 8) + bc * (dp + 4))


def _source_v2(D: int, BC: int, NW: int, MT: int, CAUSAL: bool, AK: int = 1, QSPLIT: bool = False,
               OSTAGE: bool = False, QFRAG: bool = False):
    DP = compute_dim_v2(D)  # D (a multiple of 8) padded with zero columns
    QS, VS = DP + 8, DP + 4  # row strides (floats): Q, K; V
    BR = 16 * NW * MT
    NT = 32 * NW
    KS = DP // 8  # k-steps of S = Q Kᵀ
    NA = BC // 8  # n-tiles of S; also the k-steps of O += P V
    NU = DP // 32  # 32-column groups of O (4 n-tiles each)
    NS = 4 * MT * NA  # S accumulators of a lane
    NO = 16 * MT * NU  # O accumulators
    NP = 4 * MT * NA  # P fragments (hi or lo) of a key block: [k-step][m-tile][a0..a3]
    NRAW = max(4 * MT + 2 * NA, 8)  # one k-step's operands, as loaded
    NB = max(2 * NA, 8)  # B fragments of one k-step (hi or lo)
    NT_ = 4 * MT * NA if AK > 1 else 1  # S chunk accumulators
    NTO, NFA, M2 = 16 * MT, 4 * MT, 2 * MT  # local array sizes (literals for Numba)
    QOFF = 0  # Q; with QSPLIT its hi fragments, and its lo fragments from QLOFF
    QLOFF = BR * DP
    KOFF = 2 * BR * DP if QSPLIT else BR * QS
    VOFF = KOFF + BC * QS
    assert D % 8 == 0 and BC % 16 == 0 and MT >= 1 and 1 <= NW <= tc.MAX_WARPS and KS % AK == 0

    start = query_block(BR, BC, CAUSAL)
    copy_q = f32_copier(BR, NT, D, QS)
    copy_k = f32_copier(BC, NT, D, QS)
    copy_v = f32_copier(BC, NT, D, VS)
    store_o = f32_storer(BR, NT, D, VS)  # OSTAGE: O from Q's place (rows DP + 4 apart) to memory
    QCH = D // 4  # 4-float chunks of a Q row (in memory)
    PADC = DP - D  # zero columns of each shared row (K, V, Q; Q's fragments with QSPLIT)
    QCP = -(-BR * QCH // NT)  # Q chunks a thread splits (QSPLIT)

    @tc.device_inline
    def split(x, hi, lo, i):
        h = tc.tf32_hi(x)
        hi[i] = h
        lo[i] = x - h

    @tc.device_inline
    def q_place(r, c):
        """The place (in floats) of Q's element (r, c), c % 4 == 0, in QSPLIT's hi and lo fragment
        tiles: m-tile r // 16, k-step c // 8, lane 4·(r % 8) + (c % 8) // 2, register (r % 16) // 8;
        element (r, c + f) lies at + 4·(f >> 1) + 2·(f & 1).  split_q spells it inline: called
        there, this function changed ptxas's schedule of Q's loads (the same instructions, other
        registers and order), 0.5-0.7% slower at d = 128 in an A/B on the H200 (2026-11-29,
        kernels/data/fwd_fp32_v2_qplace_h200/)."""
        return (((r >> 4) * KS + (c >> 3)) * 32 + 4 * (r & 7) + ((c & 7) >> 1)) * 4 + ((r & 15) >> 3)

    @tc.device_inline
    def split_q(sm, sbase, q, b, h, r0, nq, tid):
        """QSPLIT: Q_i read from global memory once, split, and stored as hi and lo A fragments
        in fragment order (m-tile, k-step, lane, a0..a3: 16 bytes a lane, one ``ld.shared.v4``
        each in S's k-loop, already in the registers' order); rows past Nq are 0.  Element (r, c)
        of the block: m-tile r // 16, k-step c // 8, lane 4·(r % 8) + (c % 8) // 2, register
        (r % 16) // 8 + 2·(c % 2) (S's k permutation: dims 2t, 2t + 1 are k = t, t + 4)."""
        for u in range(QCP):
            e = tid + u * NT
            if QCP * NT == BR * QCH or e < BR * QCH:
                r = e // QCH
                c = (e % QCH) * 4
                ok = r0 + r < nq
                # q_place(r, c), inline (see q_place); (r, c + f) at base + 4·(f >> 1) + 2·(f & 1)
                base = (((r >> 4) * KS + (c >> 3)) * 32 + 4 * (r & 7) + ((c & 7) >> 1)) * 4 + ((r & 15) >> 3)
                for f in range(4):
                    x = q[b, h, r0 + r, c + f] if ok else float32(0.0)
                    hx = tc.tf32_hi(x)
                    tc.sts32_f32_a(sm, sbase + 4 * QOFF, base + 4 * (f >> 1) + 2 * (f & 1), hx)
                    tc.sts32_f32_a(sm, sbase + 4 * QLOFF, base + 4 * (f >> 1) + 2 * (f & 1), x - hx)

    @tc.device_inline
    def split_q_frag(sm, sbase, q, b, h, r0, nq, warp, lane):
        """QFRAG: split_q a fragment tile (16 rows, one k-step of 8 dims) at a time, each warp its
        own m-tiles: lane (g, t) loads rows g and g + 8, dims 2t and 2t + 1 of the tile, its own
        a0..a3, and stores their hi and lo parts by one ``st.shared.v4`` each at its lane's place:
        conflict-free, where split_q's scalar stores (a warp's lanes 8 dims apart: one k-step
        tile, 128 floats, between neighbours) were 16-way; and each load request reads 8 rows x
        one 32-byte sector, 16 bytes of each, where split_q's read 4 bytes of each of 16."""
        g = lane >> 2
        t = lane & 3
        for mm in range(MT):
            mt = MT * warp + mm
            ra = r0 + 16 * mt + g
            rb = ra + 8
            for kk in range(D // 8):
                c = 8 * kk + 2 * t
                x0 = q[b, h, ra, c] if ra < nq else float32(0.0)
                x1 = q[b, h, rb, c] if rb < nq else float32(0.0)
                x2 = q[b, h, ra, c + 1] if ra < nq else float32(0.0)
                x3 = q[b, h, rb, c + 1] if rb < nq else float32(0.0)
                y0 = tc.tf32_hi(x0)
                y1 = tc.tf32_hi(x1)
                y2 = tc.tf32_hi(x2)
                y3 = tc.tf32_hi(x3)
                a = sbase + 4 * (QOFF + (mt * KS + kk) * 128 + 4 * lane)
                tc.sts128_f32_a(sm, a, y0, y1, y2, y3)
                tc.sts128_f32_a(sm, a + 4 * (QLOFF - QOFF), x0 - y0, x1 - y1, x2 - y2, x3 - y3)

    @tc.device_inline
    def zero_pad(sm, sbase, tid):
        """D < DP: zero the PADC columns past D of every shared row the products read (K, V, Q; with
        QSPLIT, Q's hi and lo fragments of those columns, at split_q's places), once a block: the
        copies write only the D columns of a row, so the zeros stay and add nothing to S or O."""
        if PADC:
            for e in range(tid, BC * PADC, NT):
                r = e // PADC
                c = D + e % PADC
                tc.sts32_f32_a(sm, sbase + 4 * KOFF, r * QS + c, float32(0.0))
                tc.sts32_f32_a(sm, sbase + 4 * VOFF, r * VS + c, float32(0.0))
            for e in range(tid, BR * PADC, NT):
                r = e // PADC
                c = D + e % PADC
                if QSPLIT:
                    x = q_place(r, c & ~3) + 4 * ((c & 3) >> 1) + 2 * (c & 1)
                    tc.sts32_f32_a(sm, sbase + 4 * QOFF, x, float32(0.0))
                    tc.sts32_f32_a(sm, sbase + 4 * QLOFF, x, float32(0.0))
                else:
                    tc.sts32_f32_a(sm, sbase + 4 * QOFF, r * QS + c, float32(0.0))

    @tc.device_inline
    def s_step(acc, raw, ah, al, bh, bl, sm, qa, ka, kk):
        """acc += Q Kᵀ over dims 8kk..8kk+7 for the warp's MT x NA tiles: Q rows g, g + 8 of each
        m-tile and K row g of each n-tile, dims 8kk + 2t, + 1, one ``ld.shared.v2`` each (with
        QSPLIT, Q's hi and lo fragments from ``qa``, the lane's place in the fragment tiles: one
        ``ld.shared.v4`` each, no split)."""
        for mt in range(MT):
            if QSPLIT:
                tc.lds128_f32_a(ah, 4 * mt, sm, qa, (mt * KS + kk) * 128)
                tc.lds128_f32_a(al, 4 * mt, sm, qa, QLOFF + (mt * KS + kk) * 128)
            else:
                tc.lds64_f32_a(raw, 4 * mt, sm, qa + 4 * (16 * mt * QS + 8 * kk))  # a0, a2
                tc.lds64_f32_a(raw, 4 * mt + 2, sm, qa + 4 * ((16 * mt + 8) * QS + 8 * kk))  # a1, a3
        for n in range(NA):
            tc.lds64_f32_a(raw, 4 * MT + 2 * n, sm, ka + 4 * (8 * n * QS + 8 * kk))  # b0, b1
        if not QSPLIT:
            for mt in range(MT):
                split(raw[4 * mt], ah, al, 4 * mt)
                split(raw[4 * mt + 2], ah, al, 4 * mt + 1)
                split(raw[4 * mt + 1], ah, al, 4 * mt + 2)
                split(raw[4 * mt + 3], ah, al, 4 * mt + 3)
        for n in range(2 * NA):
            split(raw[4 * MT + n], bh, bl, n)
        tc.mma3_tf32(acc, ah, al, bh, bl, MT, NA)

    @tc.device_inline
    def qk(s, ts, raw, ah, al, bh, bl, sm, qa, ka):
        """S = Q Kᵀ, summed in AK chunks of KS / AK k-steps (the first straight into ``s``, the
        others in zeroed ``ts``, then added in fp32).  The addresses go through ``opaque_u32`` so
        that each stays one register plus immediates (bwd_fp32_v2)."""
        qa = tc.opaque_u32(qa)
        ka = tc.opaque_u32(ka)
        for x in range(NS):
            s[x] = 0.0
        for kk in range(KS // AK):
            s_step(s, raw, ah, al, bh, bl, sm, qa, ka, kk)
        for ck in range(1, AK):
            for x in range(NS):
                ts[x] = 0.0
            for kk in range(KS // AK):
                s_step(ts, raw, ah, al, bh, bl, sm, qa, ka, ck * (KS // AK) + kk)
            for x in range(NS):
                s[x] += ts[x]

    @tc.device_inline
    def pv(acc, to, raw, ph, pl, bh, bl, alpha, sm, va):
        """O = α·O + P V_j, one 32-column group u at a time: P V_j[:, group u] over the NA k-steps
        in zeroed ``to`` (3·NA mma a chain), then one FFMA an element into ``acc``."""
        va = tc.opaque_u32(va)
        for u in range(NU):
            for x in range(16 * MT):
                to[x] = 0.0
            for j in range(NA):
                tc.lds128_f32_a(raw, 0, sm, va, 8 * j * VS + 32 * u)  # b0 of n-tiles 4u..4u+3
                tc.lds128_f32_a(raw, 4, sm, va, (8 * j + 1) * VS + 32 * u)  # their b1
                for jj in range(4):
                    split(raw[jj], bh, bl, 2 * jj)
                    split(raw[4 + jj], bh, bl, 2 * jj + 1)
                tc.mma3_tf32(to, ph[4 * MT * j:], pl[4 * MT * j:], bh, bl, MT, 4)
            for mt in range(MT):
                for jj in range(4):
                    for e in range(4):
                        x = 16 * (u * MT + mt) + 4 * jj + e
                        acc[x] = acc[x] * alpha[2 * mt + (e >> 1)] + to[4 * (4 * mt + jj) + e]

    def fwd(q, k, v, o, lse, sl2, scale):
        sm = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        i, b, h, hk, nq, nk, shift, r0, nblk = start(q, k)
        qbase = ((b * q.shape[1] + h) * nq) * D
        kbase = ((b * k.shape[1] + hk) * nk) * D
        sbase = tc.smem_u32_f32(sm)
        rw = 16 * MT * warp  # the warp's first row in the block
        if QSPLIT:  # the lane's A fragments of the warp's first m-tile, k-step 0
            qa = sbase + 4 * (QOFF + MT * warp * KS * 128 + 4 * lane)
        else:
            qa = sbase + 4 * (QOFF + (rw + g) * QS + 2 * t)  # Q[rw + g, 2t]
        ka = sbase + 4 * (KOFF + g * QS + 2 * t)  # K[g, 2t]
        va = sbase + 4 * (VOFF + 2 * t * VS + 4 * g)  # V[2t, 4g]
        # Q_i (split into its fragment tiles by plain loads and stores, or copied) and K_0 (one
        # cp.async group); rows past N are zero, and so are the columns past D (zero_pad).
        zero_pad(sm, sbase, tid)
        if QSPLIT and QFRAG:  # (visible after the first key block's barrier)
            split_q_frag(sm, sbase, q, b, h, r0, nq, warp, lane)
        elif QSPLIT:
            split_q(sm, sbase, q, b, h, r0, nq, tid)
        else:
            copy_q(sm, sbase + 4 * QOFF, q, qbase + r0 * D, nq - r0, tid)
        if nblk > 0:
            copy_k(sm, sbase + 4 * KOFF, k, kbase, nk, tid)
        tc.cp_async_commit()
        acc = cuda.local.array(NO, float32)
        for x in range(NO):
            acc[x] = 0.0
        s = cuda.local.array(NS, float32)
        ts = cuda.local.array(NT_, float32)
        to = cuda.local.array(NTO, float32)
        raw = cuda.local.array(NRAW, float32)
        ah = cuda.local.array(NFA, float32)
        al = cuda.local.array(NFA, float32)
        bh = cuda.local.array(NB, float32)
        bl = cuda.local.array(NB, float32)
        ph = cuda.local.array(NP, float32)
        pl = cuda.local.array(NP, float32)
        mrow = cuda.local.array(M2, float32)  # running max (raw scores) of rows g, g + 8 of each m-tile
        lrow = cuda.local.array(M2, float32)  # this lane's part of ℓ of the same rows
        alpha = cuda.local.array(M2, float32)
        for x in range(2 * MT):
            mrow[x] = NEG_INF
            lrow[x] = 0.0
        for j in range(nblk):
            c0 = j * BC
            tc.cp_async_wait(0)  # this thread's copies of K_j (and Q_i) have landed
            cuda.syncthreads()  # everyone's have, and every warp is done with V_{j-1}
            copy_v(sm, sbase + 4 * VOFF, v, kbase + c0 * D, nk - c0, tid)
            tc.cp_async_commit()  # V_j lands while S_j is computed
            qk(s, ts, raw, ah, al, bh, bl, sm, qa, ka)
            if c0 + BC > nk or (CAUSAL and c0 + BC - 1 > r0 + shift):
                for mt in range(MT):
                    for n in range(NA):
                        for e in range(4):
                            row = r0 + rw + 16 * mt + g + 8 * (e >> 1)
                            col = c0 + 8 * n + 2 * t + (e & 1)
                            if col >= nk or (CAUSAL and col > row + shift):
                                s[4 * (mt * NA + n) + e] = NEG_INF
            # Online softmax, rows g and g + 8 of each m-tile (a quad holds a row's 8 keys of an
            # n-tile): m_new = max(m, max S), P̃ = 2^((S − m_new)·τ log2 e), α = 2^((m − m_new)·τ
            # log2 e); while m_new is −inf (no visible key yet) subtract 0.  P̃ is split into the
            # A fragments of P V (k-step n = S's n-tile n: a0 = c0, a1 = c2, a2 = c1, a3 = c3).
            for mt in range(MT):
                mx_0 = mrow[2 * mt]
                mx_1 = mrow[2 * mt + 1]
                for n in range(NA):
                    x = 4 * (mt * NA + n)
                    mx_0 = max(mx_0, max(s[x], s[x + 1]))
                    mx_1 = max(mx_1, max(s[x + 2], s[x + 3]))
                mx_0, mx_1 = tc.quad_max2(mx_0, mx_1)
                mu_0 = mx_0 if mx_0 != NEG_INF else float32(0.0)
                mu_1 = mx_1 if mx_1 != NEG_INF else float32(0.0)
                alpha[2 * mt] = tc.ex2((mrow[2 * mt] - mu_0) * sl2)
                alpha[2 * mt + 1] = tc.ex2((mrow[2 * mt + 1] - mu_1) * sl2)
                mrow[2 * mt] = mx_0
                mrow[2 * mt + 1] = mx_1
                ps_0 = float32(0.0)
                ps_1 = float32(0.0)
                for n in range(NA):
                    x = 4 * (mt * NA + n)
                    p0 = tc.ex2((s[x] - mu_0) * sl2)
                    p1 = tc.ex2((s[x + 1] - mu_0) * sl2)
                    p2 = tc.ex2((s[x + 2] - mu_1) * sl2)
                    p3 = tc.ex2((s[x + 3] - mu_1) * sl2)
                    ps_0 += p0 + p1
                    ps_1 += p2 + p3
                    y = 4 * (n * MT + mt)
                    split(p0, ph, pl, y)
                    split(p2, ph, pl, y + 1)
                    split(p1, ph, pl, y + 2)
                    split(p3, ph, pl, y + 3)
                lrow[2 * mt] = lrow[2 * mt] * alpha[2 * mt] + ps_0
                lrow[2 * mt + 1] = lrow[2 * mt + 1] * alpha[2 * mt + 1] + ps_1
            tc.cp_async_wait(0)  # this thread's copies of V_j have landed
            cuda.syncthreads()  # everyone's have, and every warp is done with K_j
            if j + 1 < nblk:
                copy_k(sm, sbase + 4 * KOFF, k, kbase + (c0 + BC) * D, nk - c0 - BC, tid)
            tc.cp_async_commit()  # K_{j+1} (empty on the last block) lands while O += P̃ V
            pv(acc, to, raw, ph, pl, bh, bl, alpha, sm, va)
        tc.cp_async_wait(0)
        # Epilogue: ℓ over the quad, O = acc/ℓ (row g + 8h, dims 32u + 8t + 4f + jj) and
        # L = m·τ + log ℓ.  O straight to global memory by scalar stores (a warp's store: 8 rows
        # x 4 sectors, one element each), or with OSTAGE through shared memory where Q was (every
        # warp is past its last S at the barrier), 4 floats a lane a ``st.shared.v4`` (rows DP + 4
        # apart: conflict-free), then 16 bytes a thread a store, whole sectors.
        if OSTAGE:
            cuda.syncthreads()
        for mt in range(MT):
            l_0, l_1 = tc.quad_sum2(lrow[2 * mt], lrow[2 * mt + 1])
            for hh in range(2):
                lsum = l_0 if hh == 0 else l_1
                inv = float32(1.0) / lsum if lsum > 0 else float32(0.0)
                rb = rw + 16 * mt + g + 8 * hh  # the row in the block
                row = r0 + rb
                if OSTAGE:
                    for u in range(NU):
                        for f in range(2):
                            x = 16 * (u * MT + mt) + 2 * hh + f
                            tc.sts128_f32_a(sm, sbase + 4 * (QOFF + rb * VS + 32 * u + 8 * t + 4 * f), acc[x] * inv,
                                            acc[x + 4] * inv, acc[x + 8] * inv, acc[x + 12] * inv)
                if row < nq:
                    if not OSTAGE:
                        for u in range(NU):
                            for jj in range(4):
                                for f in range(2):
                                    x = 16 * (u * MT + mt) + 4 * jj + 2 * hh + f
                                    col = 32 * u + 8 * t + 4 * f + jj
                                    if PADC == 0 or col < D:
                                        o[b, h, row, col] = acc[x] * inv
                    if t == 0:
                        lse[b, h, row] = mrow[2 * mt + hh] * scale + math.log(lsum) if lsum != 0 else NEG_INF
        if OSTAGE:
            cuda.syncthreads()
            store_o(o, qbase + r0 * D, nq - r0, sm, sbase + 4 * QOFF, tid)

    return fwd, NT, BR


def _check_v2(d: int, bc: int, nw: int, mt: int, ak: int):
    if not 1 <= nw <= tc.MAX_WARPS:
        raise ValueError(f"nw={nw}: must be 1..{tc.MAX_WARPS}")
    if mt < 1 or (tc.SIM and mt > 4):
        raise ValueError(f"mt={mt}: must be >= 1" + (" (at most 4 under the simulator)" if tc.SIM else ""))
    if tc.SIM and bc > 64:
        raise ValueError(f"bc={bc}: at most 64 under the simulator (its mma3_tf32 twin takes 8 n-tiles)")
    ks = compute_dim_v2(d) // 8  # k-steps of the padded head dim
    if ak < 1 or ks % ak:
        raise ValueError(f"ak={ak}: must divide the k-steps of d rounded up to 32, {ks}")


@cache
def kernel_v2(d: int, bc: int, nw: int, mt: int, causal: bool, ak: int = 1, minb: int = 1, qsplit: bool = False,
              ostage: bool = False, qfrag: bool = False):
    """(compiled kernel, threads, Br); ValueError for a block shape the kernel cannot take."""
    _check_v2(d, bc, nw, mt, ak)
    fn, nt, br = _source_v2(d, bc, nw, mt, causal, ak, qsplit, ostage, bool(qfrag))
    return tc.jit_kernel(fn, nt, minb), nt, br


def default_config_v2(d: int) -> dict:
    """Bc keys, warps, m-tiles (16 query rows) a warp, S summed in ak chunks (⌈d / 32⌉: 12 mma a
    chain, bwd_fp32_v2's choice), blocks per SM promised to ptxas, Q split once into hi and lo
    tiles in shared memory (qsplit) rather than a k-step at a time.  Timed on the H100 at N = 4,096
    (kernels/data/fwd_fp32_v2_97f1bc6/, one sweep): at d = 64 Bc 32 with two m-tiles a warp
    (4.69 ms) beat the first choice, Bc 64 with one (5.31-5.52 ms), and every other shape tried;
    at d = 128 the first choice, Bc 32 with one m-tile (221-228 registers, two blocks of 4 warps
    an SM), was the fastest (10.07 ms; Bc 64 13.4, Bc 16 11.3, 8 warps 10.4)."""
    if d <= 64:
        return dict(bc=32, nw=4, mt=2, ak=compute_dim_v2(d) // 32, minb=1, qsplit=True, ostage=True, qfrag=True)
    return dict(bc=32, nw=4, mt=1, ak=compute_dim_v2(d) // 32, minb=1, qsplit=True, ostage=True, qfrag=True)


def supports_v2(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float32 and d % 8 == 0 and 8 <= d <= 128


def forward_v2(q, k, v, *, causal=False, scale=None, return_lse=False, **config):
    """O (and L) for fp32 (B, H, N, d) inputs, d a multiple of 8 up to 128 (padded on chip with
    zero columns to a multiple of 32); ``config`` overrides :func:`default_config_v2`."""
    from ._launch import launch_forward

    qsplit = bool(config.get("qsplit", default_config_v2(q.shape[-1])["qsplit"]))
    return launch_forward("fwd_fp32_v2", kernel_v2, partial(smem_bytes_v2, qsplit=qsplit), default_config_v2,
                          supports_v2, q, k, v, causal=causal, scale=scale, return_lse=return_lse, config=config)


#: The versions by the names the records use (:func:`kernels.perf.variant`).
VERSIONS = {"fwd_fp32_v1": SimpleNamespace(name="fwd_fp32_v1", forward=forward, kernel=kernel,
                                           default_config=default_config, supports=supports,
                                           smem_bytes=smem_bytes, signature=signature,
                                           SOURCES={"fwd": (_source, signature)}),
            "fwd_fp32_v2": SimpleNamespace(name="fwd_fp32_v2", forward=forward_v2, kernel=kernel_v2,
                                           default_config=default_config_v2, supports=supports_v2,
                                           smem_bytes=smem_bytes_v2, signature=signature,
                                           SOURCES={"fwd": (_source_v2, signature)})}
