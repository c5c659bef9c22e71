"""The fp16 backward on the tensor cores (``mma.sync`` m16n8k16), two versions.

Both recompute P from Q, K and L (the reference backward's semantics, ``kernels/flash2.py``):
D = rowsum(dO ∘ O) first (:func:`kernels.perf._launch.row_dots`); key columns >= Nk and causal
entries (bottom-right aligned) get P = 0; rows that see no key have L = +inf in log2 units, so
P = 0 there too; grouped-query attention sums dK, dV over the query heads of a kv head.  Both
compile for bf16 too (``bf16=True``: the ``.bf16`` mma and packing, dQ rounded to bf16; timed on
the H100 beside fp16: NOTES.md, "bf16").  The
helpers, fragment layouts and instruction-count lessons are ``fwd_fp16``'s (and
:mod:`kernels.perf.tc`'s); the set-up, tile copies, products and epilogue packing are
:mod:`kernels.perf._tiles`'s.  Measurements: ``kernels/perf/NOTES.md`` ("fp16 backward").

* ``bwd_fp16_v1``: the reference's deterministic pair of kernels (dK/dV per key block, then dQ
  per query block, no atomics) on the tensor cores: 7 products where a backward with atomics
  does 5.  H100 (bench_h100_single_run.csv): 1.58-1.81x naive at d = 64; d = 128 0.82-0.86x.  Shipped
  wherever v3 does not apply, and for a deterministic backward.
* ``bwd_fp16_v3``: one kernel per key block with dQ by ``red.global.add.v2.f32`` into a float32
  buffer, Pᵀ and dSᵀ through shared memory, 2-D warp tiles in every product (0.45 ldmatrix per
  mma against v1's 0.63).  H100: d = 128 221-243 TFLOP/s, 1.28-1.32x naive, 1.53-1.57x v1 in
  the same run; d = 64 within noise of v1.  Then (084c0c9) each step's query block and head
  carried instead of divided by the block count (a 64-bit division routine, 7 calls a step):
  1.08-1.10x on the H100 (A/B), v3 1.04-1.14x v1 at d = 64, N >= 4,096 (kernels/data/
  bench_grid_bwd_1b357d8: d = 64 0.75-0.84x SDPA flash, d = 128 0.85-0.95x).  Shipped at d = 64
  and 128, then 96 (tile copies across rows, 848949c), 48-112 (odd n-tiles and partial copy
  passes, f27bd21: 1.05-1.29x flash where v1 ran 0.64-1.18x) and 144-256 (64 x 64 blocks,
  bafd8d6: 0.79-1.07x flash at d = 160-256 where v1 ran 0.31-0.84x), and d % 16 = 8 as d + 8 in
  shared memory (53c06f6: d = 72 1.09x, d = 200 1.07x flash, where v1 ran 0.79x, 0.61x).  (Its
  step from the one-kernel bwd_fp16_v2,
  1-D warp tiles, is read at commit f09d49e.)
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

from numba import cuda, float32, int32, types, uint32

from flashsim.algorithms.fast import longest_first_runs  # the key-block order's rule, one for both layers

from .._arrays import dtype_name
from .._direct import launch
from ..flash2 import padded_head_dim
from . import tc
from ._launch import (
    LOG2E,
    dq_to_f16,
    finish_dq,
    prepare_backward,
    prepared_backward,
    raise_smem_limit,
    row_dots,
    tc_view,
    zeroed_dq,
)
from ._launch import saved_forward as saved_forward  # the shipped forward (BEST) of the dtype
from ._tiles import (
    NEG_INF,
    POS_INF,
    f16_ab,
    f16_abt,
    f16_chunks,
    f16_copy,
    f16_frags,
    f16_pack,
    f16_zero_pad,
    key_block,
    lse_log2,
    next_step,
    query_block,
)

# ---------------------------------------------------------------------------------------------
# bwd_fp16_v1: two deterministic kernels.
#
# * dK, dV (grid (Tc, B·Hkv)): warp w owns 16·MT keys of K_j, V_j, whose A fragments it keeps in
#   registers (``KVREG``) or re-reads from shared memory (d = 128).  For each query head of the
#   kv head's group and each query block i that can see the key block (Q_i, dO_i double-buffered
#   through cp.async; L_i and D_i beside them in fp32):
#
#       Sᵀ  = K_j Q_iᵀ                    (keys x queries, f32 in registers)
#       Pᵀ  = 2^(Sᵀ·τlog2e − L·log2e)      (L = +inf for rows that see no key: P = 0)
#       dV += Pᵀ dO_i                     (Pᵀ packed to f16 in the A layout, as P in the forward)
#       dPᵀ = V_j dO_iᵀ
#       dSᵀ = Pᵀ ∘ (dPᵀ − D)
#       dK += dSᵀ Q_i                     (τ applied once at the end)
#
# * dQ (grid (Tr, B·H)): warp w owns 16·MT query rows; for each visible key block j (K_j, V_j
#   double-buffered): S = Q_i K_jᵀ, P, dP = dO_i V_jᵀ, dS = P ∘ (dP − D), dQ += dS K_j.
#
# S and P are computed twice (once per kernel), the price of determinism; FLOPs are still
# counted as 2.5x the forward's (flash-attention's convention), so the TFLOP/s understate the
# work done by 7/5.


def smem_bytes_dkdv_v1(d: int, bkey: int, bq: int) -> int:
    s = padded_head_dim(d) + 8
    return 2 * s * (2 * bkey + 4 * bq) + 4 * 4 * bq  # K, V; Q, dO double-buffered; L·log2e, D (x2)


def smem_bytes_dq_v1(d: int, bq: int, bkey: int) -> int:
    s = padded_head_dim(d) + 8
    return 2 * s * (2 * bq + 4 * bkey) + 4 * 2 * bq  # Q, dO; K, V double-buffered; L·log2e, D


# ---------------------------------------------------------------------------------------------
# dK, dV


def _dkdv_source_v1(D: int, BQ: int, NW: int, MT: int, CAUSAL: bool, KVREG: bool, BF16: bool = False):
    DP = padded_head_dim(D)
    BK = 16 * NW * MT  # keys per block
    NT = 32 * NW
    S = DP + 8
    KT = DP // 16  # k-steps over d (Sᵀ, dPᵀ)
    NQ = BQ // 8  # n-tiles over queries (Sᵀ, dPᵀ)
    KQ = BQ // 16  # k-steps over queries (dV, dK)
    NO = DP // 8  # n-tiles over d (dV, dK)
    NKV = 4 * KT * MT if KVREG else 4 * MT
    NS4, NACC, NPA = 4 * NQ * MT, 4 * NO * MT, 4 * KQ * MT
    KOFF = 0
    VOFF = BK * S
    QOFF = 2 * BK * S  # Q buffers 0, 1
    OOFF = QOFF + 2 * BQ * S  # dO buffers 0, 1
    FOFF = (OOFF + 2 * BQ * S) // 2  # f32 words: L·log2e (2 x BQ), then D (2 x BQ)
    start = key_block(BK, BQ, CAUSAL)
    zero_pad = f16_zero_pad(2 * BK + 4 * BQ, D, S, NT)
    _, kv_load2, _, kv_store2 = f16_copy(BK, D, S, NT)
    CPT, q_chunks, q_load2c = f16_chunks(BQ, D, S, NT)
    _, frags_all = f16_frags(MT, NW, KT, S)
    _, products = f16_abt(MT, NW, KT, NQ, S, KVREG, BF16)
    ab = f16_ab(MT, KQ, NO, S, BF16)
    pack = f16_pack(NO, S, BF16)
    PACK = tc.ops(BF16)[2]

    @tc.device_inline
    def load_step(sm, smf, sbase, q, do, lse, dvec, b, h, nq, rn, buf, crow, cgof, csof, tid):
        """Q, dO rows rn.. of query head h into buffer buf (cp.async), and their L·log2e and D."""
        q_load2c(sm, sbase, QOFF + buf * BQ * S, OOFF + buf * BQ * S, q, do, ((b * q.shape[1] + h) * nq) * D, rn,
                 nq, crow, cgof, csof, tid)
        for r in range(tid, BQ, NT):
            smf[FOFF + buf * BQ + r] = lse_log2(lse, b, h, rn + r, nq)
            smf[FOFF + 2 * BQ + buf * BQ + r] = dvec[b, h, rn + r] if rn + r < nq else float32(0.0)

    def dkdv(q, k, v, do, lse, dvec, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        smf = cuda.shared.array(0, float32)  # the same bytes as f32 words
        smw = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        t = lane % 4
        g = lane // 4
        b, hk, nh, group, nq, nk, shift, c0, i0, nblk, total = start(q, k)
        sbase = tc.smem_u32(sm)
        loff = tc.lane_offset(S)
        loffb = tc.lane_offset_b(S)
        zero_pad(sm, tid)
        kbase = ((b * k.shape[1] + hk) * nk) * D
        kv_load2(sm, sbase, KOFF, VOFF, k, v, kbase, c0, nk, tid)
        crow = cuda.local.array(CPT, int32)  # this thread's chunks of a Q/dO tile (f16_chunks)
        cgof = cuda.local.array(CPT, int32)
        csof = cuda.local.array(CPT, int32)
        q_chunks(crow, cgof, csof, tid)
        if total > 0:  # step 0 (head hk·group, block i0) with K_j, V_j
            load_step(sm, smf, sbase, q, do, lse, dvec, b, hk * group, nq, i0 * BQ, 0, crow, cgof, csof, tid)
        tc.cp_async_commit()
        kf = cuda.local.array(NKV, uint32)
        vf = cuda.local.array(NKV, uint32)
        acck = cuda.local.array(NACC, float32)
        accv = cuda.local.array(NACC, float32)
        for e in range(NACC):
            acck[e] = 0.0
            accv[e] = 0.0
        s = cuda.local.array(NS4, float32)
        dp = cuda.local.array(NS4, float32)
        pa = cuda.local.array(NPA, uint32)
        fb = cuda.local.array(4, uint32)
        # Step it is query block i0 + ib of query head hk·group + hb (ib = it % nblk, hb = it //
        # nblk), carried by next_step (no 64-bit division in the loop).
        ib = 0
        hb = 0
        for it in range(total):
            buf = it % 2
            i = i0 + ib
            r0 = i * BQ
            ib, hb = next_step(ib, hb, nblk)
            if it + 1 < total:
                load_step(sm, smf, sbase, q, do, lse, dvec, b, hk * group + hb, nq,
                          (i0 + ib) * BQ, (it + 1) % 2, crow, cgof, csof, tid)
            tc.cp_async_commit()
            tc.cp_async_wait(1)
            cuda.syncthreads()  # Q_i, dO_i, L_i, D_i (and K_j, V_j the first time) have landed
            if it == 0 and KVREG:
                frags_all(kf, sm, sbase, loff, KOFF, warp)
                frags_all(vf, sm, sbase, loff, VOFF, warp)
            qofs = QOFF + buf * BQ * S
            oofs = OOFF + buf * BQ * S
            lofs = FOFF + buf * BQ
            dofs = FOFF + 2 * BQ + buf * BQ
            # Sᵀ = K Q_iᵀ and dPᵀ = V dO_iᵀ: both have B operands stored [query, d].
            products(s, dp, kf, vf, fb, sm, sbase, loff, loffb, KOFF, VOFF, qofs, oofs, warp)
            # Pᵀ and dSᵀ, element by element: lane holds keys (g, g+8) of each m-tile and
            # queries 8·nt + 2t, +1 of each n-tile.
            diag = CAUSAL and r0 + shift < c0 + BK - 1  # some key of the block is after some query
            for mt in range(MT):
                key0 = c0 + 16 * (NW * mt + warp) + g
                for nt in range(NQ):
                    x = 4 * (mt * NQ + nt)
                    qc = 8 * nt + 2 * t
                    l0 = smf[lofs + qc]
                    l1 = smf[lofs + qc + 1]
                    d0 = smf[dofs + qc]
                    d1 = smf[dofs + qc + 1]
                    p0 = tc.ex2(s[x] * sl2 - l0)
                    p1 = tc.ex2(s[x + 1] * sl2 - l1)
                    p2 = tc.ex2(s[x + 2] * sl2 - l0)
                    p3 = tc.ex2(s[x + 3] * sl2 - l1)
                    if diag:
                        if key0 > r0 + qc + shift:
                            p0 = float32(0.0)
                        if key0 > r0 + qc + 1 + shift:
                            p1 = float32(0.0)
                        if key0 + 8 > r0 + qc + shift:
                            p2 = float32(0.0)
                        if key0 + 8 > r0 + qc + 1 + shift:
                            p3 = float32(0.0)
                    y = 4 * (mt * KQ + nt // 2) + 2 * (nt % 2)
                    pa[y] = PACK(p0, p1)
                    pa[y + 1] = PACK(p2, p3)
                    dp[x] = p0 * (dp[x] - d0)
                    dp[x + 1] = p1 * (dp[x + 1] - d1)
                    dp[x + 2] = p2 * (dp[x + 2] - d0)
                    dp[x + 3] = p3 * (dp[x + 3] - d1)
            ab(accv, pa, fb, sm, sbase, loff, oofs)  # dV += Pᵀ dO_i (B = dO stored [query, d]: transposed loads)
            # dK += dSᵀ Q_i: dSᵀ packed to f16 in the A layout (reusing pa).
            for mt in range(MT):
                for nt in range(NQ):
                    x = 4 * (mt * NQ + nt)
                    y = 4 * (mt * KQ + nt // 2) + 2 * (nt % 2)
                    pa[y] = PACK(dp[x], dp[x + 1])
                    pa[y + 1] = PACK(dp[x + 2], dp[x + 3])
            ab(acck, pa, fb, sm, sbase, loff, qofs)
            cuda.syncthreads()  # every warp is done with buffer it % 2 before it is refilled
        tc.cp_async_wait(0)
        cuda.syncthreads()  # K_j, V_j landed even when no query block was visible
        # Epilogue: dK·τ and dV, packed to f16 into the warp's own rows of the K and V tiles
        # (only this warp read them), then 16 bytes per thread to memory.
        for mt in range(MT):
            w0 = ((16 * (NW * mt + warp) + g) * S + 2 * t) // 2
            pack(smw, KOFF // 2 + w0, acck, 4 * mt * NO, scale, scale)
            pack(smw, VOFF // 2 + w0, accv, 4 * mt * NO, float32(1.0), float32(1.0))
        cuda.syncthreads()
        kv_store2(dk, dv, kbase, c0, nk, sm, sbase, KOFF, VOFF, tid)

    return dkdv, NT, BK


# ---------------------------------------------------------------------------------------------
# dQ


def _dq_source_v1(D: int, BK: int, NW: int, MT: int, CAUSAL: bool, QREG: bool, BF16: bool = False):
    DP = padded_head_dim(D)
    BQ = 16 * NW * MT  # query rows per block
    NT = 32 * NW
    S = DP + 8
    KT = DP // 16  # k-steps over d (S, dP)
    NS = BK // 8  # n-tiles over keys (S, dP)
    KK = BK // 16  # k-steps over keys (dQ)
    NO = DP // 8  # n-tiles over d (dQ)
    NQA = 4 * KT * MT if QREG else 4 * MT
    NS4, NACC, NPA, M2 = 4 * NS * MT, 4 * NO * MT, 4 * KK * MT, 2 * MT
    QOFF = 0
    OOFF = BQ * S
    KOFF = 2 * BQ * S  # K buffers 0, 1
    VOFF = KOFF + 2 * BK * S  # V buffers 0, 1
    start = query_block(BQ, BK, CAUSAL)
    zero_pad = f16_zero_pad(2 * BQ + 4 * BK, D, S, NT)
    _, q_load2, q_store, _ = f16_copy(BQ, D, S, NT)
    CPT, kv_chunks, kv_load2c = f16_chunks(BK, D, S, NT)
    _, frags_all = f16_frags(MT, NW, KT, S)
    _, products = f16_abt(MT, NW, KT, NS, S, QREG, BF16)
    ab = f16_ab(MT, KK, NO, S, BF16)
    pack = f16_pack(NO, S, BF16)
    PACK = tc.ops(BF16)[2]

    def dq_kernel(q, k, v, do, lse, dvec, dq, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        smw = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        t = lane % 4
        g = lane // 4
        i, b, h, hk, nq, nk, shift, r0, nblk = start(q, k)
        sbase = tc.smem_u32(sm)
        loff = tc.lane_offset(S)
        loffb = tc.lane_offset_b(S)
        zero_pad(sm, tid)
        qbase = ((b * q.shape[1] + h) * nq) * D
        kbase = ((b * k.shape[1] + hk) * nk) * D
        q_load2(sm, sbase, QOFF, OOFF, q, do, qbase, r0, nq, tid)
        crow = cuda.local.array(CPT, int32)  # this thread's chunks of a K/V tile (f16_chunks)
        cgof = cuda.local.array(CPT, int32)
        csof = cuda.local.array(CPT, int32)
        kv_chunks(crow, cgof, csof, tid)
        if nblk > 0:
            kv_load2c(sm, sbase, KOFF, VOFF, k, v, kbase, 0, nk, crow, cgof, csof, tid)
        tc.cp_async_commit()
        # Each lane's rows: g and g + 8 of every m-tile; their L·log2e (+inf: row sees nothing)
        # and D, kept in registers.
        lr = cuda.local.array(M2, float32)
        dr = cuda.local.array(M2, float32)
        for mt in range(MT):
            for e in range(2):
                row = r0 + 16 * (NW * mt + warp) + g + 8 * e
                lr[2 * mt + e] = lse_log2(lse, b, h, row, nq)
                dr[2 * mt + e] = dvec[b, h, row] if row < nq else float32(0.0)
        qa = cuda.local.array(NQA, uint32)
        oa = cuda.local.array(NQA, uint32)
        acc = cuda.local.array(NACC, float32)
        for e in range(NACC):
            acc[e] = 0.0
        s = cuda.local.array(NS4, float32)
        dp = cuda.local.array(NS4, float32)
        pa = cuda.local.array(NPA, uint32)
        fb = cuda.local.array(4, uint32)
        for j in range(nblk):
            buf = j % 2
            c0 = j * BK
            if j + 1 < nblk:
                nb_ = (j + 1) % 2
                kv_load2c(sm, sbase, KOFF + nb_ * BK * S, VOFF + nb_ * BK * S, k, v, kbase, c0 + BK, nk,
                          crow, cgof, csof, tid)
            tc.cp_async_commit()
            tc.cp_async_wait(1)
            cuda.syncthreads()  # K_j, V_j (and Q_i, dO_i the first time) have landed
            if j == 0 and QREG:
                frags_all(qa, sm, sbase, loff, QOFF, warp)
                frags_all(oa, sm, sbase, loff, OOFF, warp)
            kofs = KOFF + buf * BK * S
            vofs = VOFF + buf * BK * S
            # S = Q_i K_jᵀ and dP = dO_i V_jᵀ: B operands stored [key, d].
            products(s, dp, qa, oa, fb, sm, sbase, loff, loffb, QOFF, OOFF, kofs, vofs, warp)
            edge = c0 + BK > nk or (CAUSAL and c0 + BK - 1 > r0 + shift)
            for mt in range(MT):
                row = r0 + 16 * (NW * mt + warp) + g
                for nt in range(NS):
                    x = 4 * (mt * NS + nt)
                    col = c0 + 8 * nt + 2 * t
                    p0 = tc.ex2(s[x] * sl2 - lr[2 * mt])
                    p1 = tc.ex2(s[x + 1] * sl2 - lr[2 * mt])
                    p2 = tc.ex2(s[x + 2] * sl2 - lr[2 * mt + 1])
                    p3 = tc.ex2(s[x + 3] * sl2 - lr[2 * mt + 1])
                    if edge:
                        if col >= nk or (CAUSAL and col > row + shift):
                            p0 = float32(0.0)
                        if col + 1 >= nk or (CAUSAL and col + 1 > row + shift):
                            p1 = float32(0.0)
                        if col >= nk or (CAUSAL and col > row + 8 + shift):
                            p2 = float32(0.0)
                        if col + 1 >= nk or (CAUSAL and col + 1 > row + 8 + shift):
                            p3 = float32(0.0)
                    y = 4 * (mt * KK + nt // 2) + 2 * (nt % 2)
                    pa[y] = PACK(p0 * (dp[x] - dr[2 * mt]), p1 * (dp[x + 1] - dr[2 * mt]))
                    pa[y + 1] = PACK(p2 * (dp[x + 2] - dr[2 * mt + 1]), p3 * (dp[x + 3] - dr[2 * mt + 1]))
            ab(acc, pa, fb, sm, sbase, loff, kofs)  # dQ += dS K_j (B = K stored [key, d]: transposed loads)
            cuda.syncthreads()  # every warp is done with buffer j % 2 before it is refilled
        tc.cp_async_wait(0)
        cuda.syncthreads()  # Q_i landed even when no key block was visible
        for mt in range(MT):
            pack(smw, (QOFF + (16 * (NW * mt + warp) + g) * S + 2 * t) // 2, acc, 4 * mt * NO, scale, scale)
        cuda.syncthreads()
        q_store(dq, qbase, r0, nq, sm, sbase, QOFF, tid)

    return dq_kernel, NT, BQ


@cache
def kernels_v1(d: int, causal: bool, bq: int, bk: int, nw: int, mt: int, reg: bool, bf16: bool = False):
    """The compiled (dkdv, dq) kernels with their threads and block rows (``bf16``: for bf16
    inputs)."""
    f1, nt1, bk1 = _dkdv_source_v1(d, bq, nw, mt, causal, reg, bf16)
    f2, nt2, bq2 = _dq_source_v1(d, bk, nw, mt, causal, reg, bf16)
    return (tc.jit_kernel(f1, nt1), nt1, bk1), (tc.jit_kernel(f2, nt2), nt2, bq2)


def default_config_v1(d: int) -> dict:
    """bq: query rows per step of the dK/dV kernel; bk: keys per step of the dQ kernel; nw warps
    with mt m-tiles each (so 16·nw·mt keys, or query rows, per block); reg: K, V (or Q, dO)
    fragments held in registers."""
    if d <= 64:
        return dict(bq=64, bk=64, nw=4, mt=1, reg=True)
    return dict(bq=32, bk=32, nw=4, mt=1, reg=False)


def supports_v1(dtype, d: int) -> bool:
    return dtype_name(dtype) in ("float16", "bfloat16") and d % 8 == 0 and 8 <= d <= 256


def signature_dkdv_v1():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, a4, float32, float32)


def signature_dq_v1():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, float32, float32)


def backward_v1(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp16 or bf16 (B, H, N, d) inputs, O and L from the forward; ``config``
    overrides :func:`default_config_v1`."""
    inp, a, (nb, nh, nhk, nq, nk, d), lse_d, cfg, sc = prepare_backward(
        "bwd_fp16_v1 takes float16 or bfloat16 with head_dim % 8 == 0", default_config_v1, supports_v1, q, k, v, o,
        lse, do, scale=scale, config=config, causal=causal)
    (kdkdv, nt1, bkey), (kdq, nt2, bqr) = kernels_v1(d, bool(causal), **cfg, bf16=inp.bf16)
    dvec = row_dots(inp, a, causal)
    dq = inp.empty((nb, nh, nq, d), inp.dtype)
    dk = inp.empty((nb, nhk, nk, d), inp.dtype)
    dv = inp.empty((nb, nhk, nk, d), inp.dtype)
    sl2, scf = float32(sc * LOG2E), float32(sc)
    qh, kh, vh, doh, dqh, dkh, dvh = tc_view(inp, a["q"], a["k"], a["v"], a["do"], dq, dk, dv)
    args = (qh, kh, vh, doh, lse_d, dvec, dkh, dvh, sl2, scf)
    smem = smem_bytes_dkdv_v1(d, bkey, cfg["bq"])
    raise_smem_limit(kdkdv, args, smem)
    launch(kdkdv, (-(-nk // bkey), nb * nhk), nt1, inp.stream, smem, *args)
    args = (qh, kh, vh, doh, lse_d, dvec, dqh, sl2, scf)
    smem = smem_bytes_dq_v1(d, bqr, cfg["bk"])
    raise_smem_limit(kdq, args, smem)
    launch(kdq, (-(-nq // bqr), nb * nh), nt2, inp.stream, smem, *args)
    finish_dq(inp, dq)
    return inp.out(dq), inp.out(dk), inp.out(dv)

# ---------------------------------------------------------------------------------------------
# bwd_fp16_v3: one kernel, dQ by atomics, 2-D warp tiles in every product.  Per query block i
# (per warp and k-step of 16; d = 128: Bc = 128 keys, Br = 64 queries, 8 warps; d = 64: Br = 128):
#
#     phase A   Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ: a warp owns 16·ma keys x its bq·ma·16/bk queries
#               (d = 128: 32 x 32): ma + na/2 loads for ma·na mma per product
#               Pᵀ = 2^(Sᵀ·τlog2e − L·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − D)  → shared memory, f16, [key, query]
#     phase B   dV += Pᵀ dO_i, dK += dSᵀ Q_i: 16·mb keys x d·16·mb/bk columns (d = 128: 64 x 32
#               with mb = 4, f014f0c's default; 32 x 64 with mb = 2): 6 loads for 16 mma per product
#     phase C   dQ_i += dS K_j: 16·mc queries x its columns (32 x 32): 4 loads for 8 mma, then
#               ``red.global.add.v2.f32`` into a float32 dQ buffer (``bulkq``, on at d = 64 and
#               from d = 112, where it fits: through shared memory and one ``cp.reduce.async.bulk`` a row, a
#               step later)
#
# The element-wise step keeps its L and D in registers loaded as pairs (``ld.shared.v2``) after
# the products and stores Pᵀ and dSᵀ as packed f16 pairs through 32-bit shared addresses
# (``st.shared.u32``, one base a lane plus constant offsets); the cp.async of Q_i and dO_i uses
# one row and column a thread (``load_step``).  Q_i, dO_i, L_i and D_i are double-buffered (issued at the top of
# a step for the next one), so a step has two barriers: one before phase A (the step's tiles
# have landed, every warp is done with the last step's Pᵀ, dSᵀ and buffers), one after it (Pᵀ,
# dSᵀ written).  Each phase takes its shared addresses through ``tc.opaque_u32`` (one register
# plus immediate offsets; hoisted out of the loop they spilled 428 bytes) and the first k-step
# is peeled: at d = 128 (mb = 4) 255 registers and 16 bytes of spills (d = 64, 128 x 128: 254, none),
# 320 HMMA and 144 LDSM a step at d = 128.  Shared memory at d = 128: 177 KB, one block of 8 warps per SM.


def layout_v3(d: int, bq: int, bk: int, nw: int, ma: int, mb: int, mc: int) -> dict:
    """How the warps split each product; ValueError (naming the value) if they cannot.

    Phase A (Sᵀ, dPᵀ, keys x queries): wak = bk / (16·ma) warps along the keys, nw / wak along the
    queries, na n-tiles (8 queries) each.  Phase B (dV, dK, keys x columns): bk / (16·mb) warps along
    the keys, the rest along the d columns, nb n-tiles each.  Phase C (dQ, queries x columns):
    bq / (16·mc) warps along the queries, the rest along the columns, nc n-tiles each.  Phase A's
    n-tiles come in pairs (one ``ldmatrix.x4`` feeds two); phases B and C may have an odd last one
    (its x4 load reads 8 columns past it: the next warp's, or the row's padding, not used).  A
    block's threads copy a tile's 16-byte chunks in passes (chunk tid + u·32·nw of pass u, the
    last pass partial where 32·nw does not divide the tile's chunks; ``rows``: the rows a pass
    copies where 32·nw is a multiple of d / 8, else 0).  d is the tiles' width, a multiple of 16
    (the k-steps of phase A): the head dim, or the head dim + 8 where it is not (the kernel's copies
    then move d - 8 columns a row; ``rows`` is for d)."""
    if not 1 <= nw <= tc.MAX_WARPS:
        raise ValueError(f"{nw=}: must be 1..{tc.MAX_WARPS}")
    if d <= 0 or d % 16:
        raise ValueError(f"{d=}: must be a positive multiple of 16")
    ch = d // 8  # 16-byte chunks a row
    rows = 32 * nw // ch if (32 * nw) % ch == 0 else 0  # whole rows a pass, or 0: a pass's chunks cross rows

    def split(name, m, extent, other, what, pairs):
        if m <= 0 or extent % (16 * m):
            raise ValueError(f"{name}={m}: 16·{name} must divide {what} = {extent}")
        w = extent // (16 * m)
        if nw % w:
            raise ValueError(f"{name}={m}: {w} warps along {what} do not divide nw={nw}")
        rest = nw // w
        if other % ((16 if pairs else 8) * rest):
            raise ValueError(f"{name}={m}: {rest} warps across {other} leave "
                             + ("an odd number of n-tiles" if pairs else "a part of an n-tile"))
        return w, other // rest // 8

    for name, extent in (("bk", bk), ("bq", bq)):
        if extent <= 0 or extent % 16:
            raise ValueError(f"{name}={extent}: must be a positive multiple of 16")
    wak, na = split("ma", ma, bk, bq, "bk", True)
    wbk, nb = split("mb", mb, bk, d, "bk", False)
    wcq, nc = split("mc", mc, bq, d, "bq", False)
    return dict(wak=wak, na=na, wbk=wbk, nb=nb, wcq=wcq, nc=nc, rows=rows)


def _smem_tiles_v3(d: int, bq: int, bk: int, qbuf: int = 2) -> int:
    s = padded_head_dim(d) + 8
    return 2 * (2 * bk * s + 2 * qbuf * bq * s + 2 * bk * (bq + 8)) + 4 * 4 * bq


def smem_bytes_v3(d: int, bq: int, bk: int, bulkq: bool = False, qbuf: int = 2) -> int:
    """K, V (bk rows); Q, dO in ``qbuf`` buffers each (bq rows), rows of d rounded up to 16 plus 8;
    Pᵀ, dSᵀ (bk rows of bq + 8); L·log2e and D, double-buffered, in f32; with ``bulkq``, dQ's tile
    (bq rows of d + 8 floats: :func:`bulk_fits`)."""
    return _smem_tiles_v3(d, bq, bk, qbuf) + (4 * bq * (d + 8) if bulkq else 0)


SMEM_MAX = 227 * 1024  # sm_90's largest opt-in shared memory a block


def bulk_fits(d: int, bq: int, bk: int, qbuf: int = 2) -> bool:
    """Whether dQ's tile for ``bulkq`` (bq rows of d + 8 floats) fits in shared memory beside the
    tiles.  ``bulkq`` (config knob, the default at d = 64 and from d = 112; NOTES.md "dQ by bulk
    reductions"): phase C stores its tile in shared memory, and the next step, after its first
    barrier, sends it to the dQ buffer by one ``cp.reduce.async.bulk`` a row, where every lane's
    ``red.v2`` had.  With one Q and dO buffer (``qbuf`` = 1) it fits up to d = 256."""
    return _smem_tiles_v3(d, bq, bk, qbuf) + 4 * bq * (d + 8) <= SMEM_MAX


def _source_v3(D: int, BQ: int, BK: int, NW: int, MA: int, MB: int, MC: int, CAUSAL: bool, BF16: bool = False,
               BULKQ: bool = False, LONGEST_FIRST: bool = False, QBUF: int = 2):
    # D is the rows' length in memory; the tiles in shared memory are DP = D rounded up to 16
    # columns wide (d % 16 = 8: one 16-byte chunk a row that no copy writes, zeroed once, so the
    # products run over DP columns as at d + 8; the column n-tile past D is never stored).
    DP = padded_head_dim(D)
    PAD = DP != D
    lay = layout_v3(DP, BQ, BK, NW, MA, MB, MC)
    WAK, NA, WBK, NB, WCQ, NC = (lay[k] for k in ("wak", "na", "wbk", "nb", "wcq", "nc"))
    NT = 32 * NW
    S = DP + 8  # row stride (f16) of K, V, Q, dO: 16 bytes of padding keep ldmatrix conflict-free
    SQ = BQ + 8  # row stride (f16) of Pᵀ, dSᵀ
    KT = DP // 16  # phase A: k-steps over d
    KQ = BQ // 16  # phase B: k-steps over queries
    KK = BK // 16  # phase C: k-steps over keys
    CH = D // 8  # 16-byte chunks of a row (in memory: the copies move D columns)
    RPU = NT // CH if NT % CH == 0 else 0  # whole rows a pass, or 0 (layout_v3's ``rows`` for D)
    QU = -(-BQ * CH // NT)  # passes to copy a Q (or dO) tile
    KU = -(-BK * CH // NT)  # passes to copy a K (or V) tile
    FULLQ = QU * NT == BQ * CH  # every pass copies NT chunks (no lane idle in the last)
    FULLK = KU * NT == BK * CH
    WHOLE = RPU > 0  # each pass copies whole rows (8 warps: d = 16, 32, 64, 128, 256; not d = 96)
    NS4, NACC, NQACC = 4 * MA * NA, 4 * MB * NB, 4 * MC * NC
    NFA, NFQ, NFB, NFC = 4 * MA, 2 * NA, 4 * MB, 4 * MC  # fragment registers of phases A, B, C
    KOFF = 0
    VOFF = BK * S
    QOFF = 2 * BK * S  # Q buffers 0, 1
    if QBUF not in (1, 2):
        raise ValueError(f"qbuf={QBUF}: 1 or 2 buffers of Q and dO")
    OOFF = QOFF + QBUF * BQ * S  # dO buffers 0 (, 1)
    POFF = OOFF + QBUF * BQ * S  # Pᵀ [key, query]
    DSOFF = POFF + BK * SQ  # dSᵀ [key, query]
    FOFF = (DSOFF + BK * SQ) // 2  # f32 words: L·log2e (2 x BQ), then D (2 x BQ)
    if BULKQ and not bulk_fits(D, BQ, BK, QBUF):
        raise ValueError(f"bulkq=True: dQ's tile ({BQ} rows of {D + 8} floats) does not fit beside the tiles at "
                         f"d={D}, bq={BQ}, bk={BK}")
    SR = D + 8  # f32 words a row of dQ's tile (BULKQ): 32 bytes of padding, two wavefronts a store
    BOFF = FOFF + 4 * BQ  # f32 words: dQ's tile (BULKQ)
    start = key_block(BK, BQ, CAUSAL, LONGEST_FIRST)
    pack = f16_pack(NB, S, BF16)
    zero_pad = f16_zero_pad(2 * BK + 2 * QBUF * BQ, D, S, NT)  # K, V, Q and dO buffers: rows 0.. of stride S
    MMA, MMA_Z, PACK = tc.ops(BF16)

    @tc.device_inline
    def chunk(lrow, lcol, tid, u):
        """Row and column of the thread's chunk in pass u of a tile copy: chunk tid + u·NT (row
        lrow + u·RPU, column lcol where passes copy whole rows)."""
        if WHOLE:
            return lrow + u * RPU, lcol
        e = tid + u * NT
        return e // CH, (e % CH) * 8

    @tc.device_inline
    def load_step(sm, sbase, q, do, g0, rn, nq, buf, lrow, lcol, tid):
        """Q, dO rows rn.. (a head's rows from element offset g0) into buffer buf: the thread's
        chunk of each pass u (:func:`chunk`)."""
        for u in range(QU):
            r, col = chunk(lrow, lcol, tid, u)
            if FULLQ or r < BQ:  # the last pass's lanes past the tile copy nothing
                ok = rn + r < nq
                goff = g0 + (rn + r) * D + col if ok else 0
                so = buf * (BQ * S) + r * S + col
                tc.cp_async16_a(sm, sbase, QOFF + so, q, goff, 8 if ok else 0)
                tc.cp_async16_a(sm, sbase, OOFF + so, do, goff, 8 if ok else 0)

    @tc.device_inline
    def _products_a(c, fa, fq, sm, aa, ab):
        """c = A Bᵀ over the d columns: A the warp's MA m-tiles of rows at byte address ``aa``, B its
        NA n-tiles of rows at ``ab`` (both stored [row, d], lane offsets included); the first
        k-step, peeled, starts from a zero accumulator, so no branch sits inside the loop."""
        for mt in range(MA):
            tc.ldsm_x4(fa, 4 * mt, sm, aa + 2 * (16 * mt * S), S)
        for n2 in range(NA // 2):
            tc.ldsm_x4_b(fq, 4 * n2, sm, ab + 2 * (16 * n2 * S), S)
        for mt in range(MA):
            for n2 in range(NA // 2):
                x = 4 * (mt * NA + 2 * n2)
                MMA_Z(c, x, fa, 4 * mt, fq[4 * n2], fq[4 * n2 + 1])
                MMA_Z(c, x + 4, fa, 4 * mt, fq[4 * n2 + 2], fq[4 * n2 + 3])
        for kk in range(1, KT):
            for mt in range(MA):
                tc.ldsm_x4(fa, 4 * mt, sm, aa + 2 * (16 * mt * S + 16 * kk), S)
            for n2 in range(NA // 2):
                tc.ldsm_x4_b(fq, 4 * n2, sm, ab + 2 * (16 * n2 * S + 16 * kk), S)
            for mt in range(MA):
                for n2 in range(NA // 2):
                    x = 4 * (mt * NA + 2 * n2)
                    MMA(c, x, fa, 4 * mt, fq[4 * n2], fq[4 * n2 + 1])
                    MMA(c, x + 4, fa, 4 * mt, fq[4 * n2 + 2], fq[4 * n2 + 3])

    @tc.device_inline
    def reduce_dq(dqa, dqo, acq, lim, c0):
        """dQ_i += the lane's phase-C tile: rows 16·mt (+8) from its first, where below ``lim``,
        at element offsets ``dqo`` + constants.  One base register and immediate offsets, no
        address arithmetic between the reductions: each had waited for the previous one to
        release its address registers (the loop's largest long-scoreboard stall in Nsight
        Compute's source view at d = 64); ``lim`` = BQ (a constant: every row exists) drops the
        predicates.  ``c0``: the lane's first column; where d % 16 = 8 the n-tile at columns D..
        (the zeroed pad) is not reduced."""
        for mt in range(MC):
            for nt in range(NC):
                x = 4 * (mt * NC + nt)
                col = (not PAD) or c0 + 8 * nt < D
                tc.red_v2_if(dqa, dqo + (16 * mt * D + 8 * nt), acq[x], acq[x + 1], 16 * mt < lim and col)
                tc.red_v2_if(dqa, dqo + ((16 * mt + 8) * D + 8 * nt), acq[x + 2], acq[x + 3],
                             16 * mt + 8 < lim and col)

    def bwd(q, k, v, do, lse, dvec, dqa, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        smf = cuda.shared.array(0, float32)  # the same bytes as f32 words
        smw = cuda.shared.array(0, uint32)  # and as f16 pairs
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        t = lane % 4
        g = lane // 4
        ka0 = 16 * MA * (warp % WAK)  # phase A: this warp's first key and first query
        qa0 = 8 * NA * (warp // WAK)
        kb0 = 16 * MB * (warp % WBK)  # phase B: first key and first column
        cb0 = 8 * NB * (warp // WBK)
        qc0 = 16 * MC * (warp % WCQ)  # phase C: first query and first column
        cc0 = 8 * NC * (warp // WCQ)
        b, hk, nh, group, nq, nk, shift, c0, i0, nblk, total = start(q, k)
        sbase = tc.smem_u32(sm)
        loff = tc.lane_offset(S)
        loffb = tc.lane_offset_b(S)
        loffp = tc.lane_offset(SQ)
        loffpb = tc.lane_offset_b(SQ)
        # This thread's row and column of every tile load (RPU rows a pass where passes copy
        # whole rows; else chunk() finds them pass by pass).
        lrow = tid // CH
        lcol = (tid % CH) * 8
        kbase = ((b * k.shape[1] + hk) * nk) * D
        for u in range(KU):  # K_j, V_j: a constant trip count (f16_copy's loop spilled more here)
            r, col = chunk(lrow, lcol, tid, u)
            if FULLK or r < BK:
                ok = c0 + r < nk
                goff = kbase + ((c0 + r) if ok else 0) * D + col
                tc.cp_async16_a(sm, sbase, KOFF + r * S + col, k, goff, 8 if ok else 0)
                tc.cp_async16_a(sm, sbase, VOFF + r * S + col, v, goff, 8 if ok else 0)
        zero_pad(sm, tid)  # d % 16 = 8: the column chunk past D of K, V and both Q and dO buffers (rows 0..)
        if total > 0:
            load_step(sm, sbase, q, do, ((b * nh + hk * group) * nq) * D, i0 * BQ, nq, 0, lrow, lcol, tid)
            if tid < BQ:
                row = i0 * BQ + tid
                smf[FOFF + tid] = lse_log2(lse, b, hk * group, row, nq)
                smf[FOFF + 2 * BQ + tid] = dvec[b, hk * group, row] if row < nq else float32(0.0)
        tc.cp_async_commit()
        # L and D of row tid of the step after next: loaded from memory a step before they are
        # stored to shared memory (beside the cp.async of Q and dO), so their latency is hidden.
        lnext = NEG_INF
        dnext = float32(0.0)
        if total > 1 and tid < BQ:
            row = (i0 + 1 % nblk) * BQ + tid
            if row < nq:
                lnext = lse[b, hk * group + 1 // nblk, row]
                dnext = dvec[b, hk * group + 1 // nblk, row]
        acck = cuda.local.array(NACC, float32)
        accv = cuda.local.array(NACC, float32)
        for e in range(NACC):
            acck[e] = 0.0
            accv[e] = 0.0
        s = cuda.local.array(NS4, float32)
        dp = cuda.local.array(NS4, float32)
        fa = cuda.local.array(NFA, uint32)  # A fragments (K or V rows, phase A)
        fq = cuda.local.array(NFQ, uint32)  # B fragments (Q or dO rows, phase A)
        lrg = cuda.local.array(2, float32)  # L·log2e and D of a pair of the lane's queries
        drg = cuda.local.array(2, float32)
        pf = cuda.local.array(NFB, uint32)  # phase B: Pᵀ, dSᵀ fragments
        sf = cuda.local.array(NFB, uint32)
        fb = cuda.local.array(4, uint32)
        af = cuda.local.array(NFC, uint32)  # phase C: dS fragments
        acq = cuda.local.array(NQACC, float32)
        # Phase A's element-wise step: the lane's Pᵀ / dSᵀ words are (key ka0 + g + 16·mt + 8·e,
        # query qa0 + 8·nt + 2t); byte address = base + constant.
        pword = sbase + 2 * (POFF + (ka0 + g) * SQ + qa0 + 2 * t)
        key0 = c0 + ka0 + g  # the lane's first key (global index)
        # Step it is query block i0 + ib of query head hk·group + hb (ib = it % nblk, hb = it //
        # nblk), and (ib1, hb1) the next step's: carried by next_step, because nblk is known only
        # at run time and each division by it was a 64-bit division routine in the loop.
        ib = 0
        hb = 0
        qsum = 0  # BULKQ: the flat dQ offset of the last step's first row, and its rows that exist
        qrows = 0
        for it in range(total):
            buf = it % 2
            hq = hk * group + hb
            i = i0 + ib
            r0 = i * BQ
            ib1, hb1 = next_step(ib, hb, nblk)
            # Barrier 1: this step's tiles have landed, and every warp is done with the last
            # step's Pᵀ, dSᵀ and buffer, which the code below overwrites.
            tc.cp_async_wait(0)
            cuda.syncthreads()
            if BULKQ and tid < qrows:  # the last step's dQ tile, a row a thread, by the TMA unit
                tc.bulk_red_f32(dqa, qsum + tid * D, smf, sbase + 4 * (BOFF + tid * SR), 4 * D)
            if it + 1 < total:
                nb_ = (it + 1) % 2
                if QBUF == 2:  # the next step's Q and dO into the other buffer, beside this step
                    load_step(sm, sbase, q, do, ((b * nh + hk * group + hb1) * nq) * D,
                              (i0 + ib1) * BQ, nq, nb_, lrow, lcol, tid)
                if tid < BQ:
                    smf[FOFF + nb_ * BQ + tid] = lnext * float32(LOG2E) if lnext != NEG_INF else POS_INF
                    smf[FOFF + 2 * BQ + nb_ * BQ + tid] = dnext
                    lnext = NEG_INF
                    dnext = float32(0.0)
                    if it + 2 < total:
                        ib2, hb2 = next_step(ib1, hb1, nblk)
                        row = (i0 + ib2) * BQ + tid
                        if row < nq:
                            lnext = lse[b, hk * group + hb2, row]
                            dnext = dvec[b, hk * group + hb2, row]
            ib = ib1
            hb = hb1
            tc.cp_async_commit()
            qb = buf if QBUF == 2 else 0  # this step's Q and dO buffer
            qofs = QOFF + qb * BQ * S
            oofs = OOFF + qb * BQ * S
            # Phase A.  Sᵀ = K Q_iᵀ and dPᵀ = V dO_iᵀ (A = K or V rows, B = Q or dO rows: all stored
            # [row, d]); the first k-step starts from zero (no branch inside the loops).
            # (Each phase takes its shared addresses through tc.opaque_u32, so they are one
            # register plus immediate offsets, computed where they are used.)
            aa = tc.opaque_u32(sbase + 2 * (ka0 * S + loff))
            ab = tc.opaque_u32(sbase + 2 * (qofs + qa0 * S + loffb))
            _products_a(s, fa, fq, sm, aa + 2 * KOFF, ab)
            _products_a(dp, fa, fq, sm, aa + 2 * VOFF, ab + 2 * (OOFF - QOFF))
            # Pᵀ and dSᵀ element by element.  The lane holds keys key0 + 16·mt (+8) and queries
            # qa0 + 8·nt + 2t (+1); their L·log2e and D come as pairs.
            fbyte = tc.opaque_u32(sbase + 4 * (FOFF + buf * BQ + qa0 + 2 * t))
            pbase = tc.opaque_u32(pword)
            edge = c0 + BK > nk or (CAUSAL and r0 + shift < c0 + BK - 1)
            for nt in range(NA):
                tc.lds64_f32_a(lrg, 0, smf, fbyte + 32 * nt)
                tc.lds64_f32_a(drg, 0, smf, fbyte + 8 * BQ + 32 * nt)
                l0 = lrg[0]
                l1 = lrg[1]
                d0 = drg[0]
                d1 = drg[1]
                for mt in range(MA):
                    x = 4 * (mt * NA + nt)
                    p0 = tc.ex2(s[x] * sl2 - l0)
                    p1 = tc.ex2(s[x + 1] * sl2 - l1)
                    p2 = tc.ex2(s[x + 2] * sl2 - l0)
                    p3 = tc.ex2(s[x + 3] * sl2 - l1)
                    if edge:
                        kr = key0 + 16 * mt
                        qr = r0 + qa0 + 8 * nt + 2 * t + shift
                        if kr >= nk or (CAUSAL and kr > qr):
                            p0 = float32(0.0)
                        if kr >= nk or (CAUSAL and kr > qr + 1):
                            p1 = float32(0.0)
                        if kr + 8 >= nk or (CAUSAL and kr + 8 > qr):
                            p2 = float32(0.0)
                        if kr + 8 >= nk or (CAUSAL and kr + 8 > qr + 1):
                            p3 = float32(0.0)
                    w = 2 * (16 * mt * SQ + 8 * nt)  # byte offset of the (mt, nt) pair, row g
                    tc.sts32_u32_a(smw, pbase + w, PACK(p0, p1))
                    tc.sts32_u32_a(smw, pbase + w + 16 * SQ, PACK(p2, p3))
                    tc.sts32_u32_a(smw, pbase + 2 * (DSOFF - POFF) + w,
                                   PACK(p0 * (dp[x] - d0), p1 * (dp[x + 1] - d1)))
                    tc.sts32_u32_a(smw, pbase + 2 * (DSOFF - POFF) + w + 16 * SQ,
                                   PACK(p2 * (dp[x + 2] - d0), p3 * (dp[x + 3] - d1)))
            if BULKQ and tid < qrows:  # the unit has read the tile: phase C below may rewrite it
                tc.bulk_wait_read()
            # Barrier 2: Pᵀ and dSᵀ of every warp are in shared memory.
            cuda.syncthreads()
            # Phase B.  dV += Pᵀ dO_i, dK += dSᵀ Q_i: A = Pᵀ, dSᵀ rows of this warp's keys; B = dO_i,
            # Q_i stored [query, d] (transposed loads), this warp's columns.
            ap = tc.opaque_u32(sbase + 2 * (POFF + kb0 * SQ + loffp))
            ao = tc.opaque_u32(sbase + 2 * (oofs + cb0 + loff))
            for kk in range(KQ):
                for mt in range(MB):
                    tc.ldsm_x4(pf, 4 * mt, sm, ap + 2 * (16 * mt * SQ + 16 * kk), SQ)
                    tc.ldsm_x4(sf, 4 * mt, sm, ap + 2 * (DSOFF - POFF + 16 * mt * SQ + 16 * kk), SQ)
                for n2 in range(NB // 2):
                    tc.ldsm_x4_trans(fb, 0, sm, ao + 2 * (16 * kk * S + 16 * n2), S)
                    for mt in range(MB):
                        MMA(accv, 4 * (mt * NB + 2 * n2), pf, 4 * mt, fb[0], fb[1])
                        MMA(accv, 4 * (mt * NB + 2 * n2 + 1), pf, 4 * mt, fb[2], fb[3])
                    tc.ldsm_x4_trans(fb, 0, sm, ao - 2 * (OOFF - QOFF) + 2 * (16 * kk * S + 16 * n2), S)
                    for mt in range(MB):
                        MMA(acck, 4 * (mt * NB + 2 * n2), sf, 4 * mt, fb[0], fb[1])
                        MMA(acck, 4 * (mt * NB + 2 * n2 + 1), sf, 4 * mt, fb[2], fb[3])
                if NB % 2:  # the odd last n-tile: the x4 load's second half is not used
                    tc.ldsm_x4_trans(fb, 0, sm, ao + 2 * (16 * kk * S + 16 * (NB // 2)), S)
                    for mt in range(MB):
                        MMA(accv, 4 * (mt * NB + NB - 1), pf, 4 * mt, fb[0], fb[1])
                    tc.ldsm_x4_trans(fb, 0, sm, ao - 2 * (OOFF - QOFF) + 2 * (16 * kk * S + 16 * (NB // 2)), S)
                    for mt in range(MB):
                        MMA(acck, 4 * (mt * NB + NB - 1), sf, 4 * mt, fb[0], fb[1])
            if QBUF == 1 and it + 1 < total:
                # Barrier 3 (one buffer): every warp is done with Q_i and dO_i; the next step's
                # come into the same buffer while phase C runs (ib, hb are the next step's now).
                cuda.syncthreads()
                load_step(sm, sbase, q, do, ((b * nh + hk * group + hb) * nq) * D,
                          (i0 + ib) * BQ, nq, 0, lrow, lcol, tid)
                tc.cp_async_commit()
            # Phase C.  dQ_i += dS K_j: A = dS, read transposed from dSᵀ [key, query]; B = K_j
            # stored [key, d] (transposed loads).  Then into the float32 dQ buffer, 8 bytes a
            # reduction.
            ad = tc.opaque_u32(sbase + 2 * (DSOFF + qc0 + loffpb))
            ak = tc.opaque_u32(sbase + 2 * (KOFF + cc0 + loff))
            for mt in range(MC):
                tc.ldsm_x4_trans_b(af, 4 * mt, sm, ad + 2 * (16 * mt), SQ)
            for n2 in range(NC // 2):
                tc.ldsm_x4_trans(fb, 0, sm, ak + 2 * (16 * n2), S)
                for mt in range(MC):
                    x = 4 * (mt * NC + 2 * n2)
                    MMA_Z(acq, x, af, 4 * mt, fb[0], fb[1])
                    MMA_Z(acq, x + 4, af, 4 * mt, fb[2], fb[3])
            if NC % 2:
                tc.ldsm_x4_trans(fb, 0, sm, ak + 2 * (16 * (NC // 2)), S)
                for mt in range(MC):
                    MMA_Z(acq, 4 * (mt * NC + NC - 1), af, 4 * mt, fb[0], fb[1])
            for kk in range(1, KK):
                for mt in range(MC):
                    tc.ldsm_x4_trans_b(af, 4 * mt, sm, ad + 2 * (16 * kk * SQ + 16 * mt), SQ)
                for n2 in range(NC // 2):
                    tc.ldsm_x4_trans(fb, 0, sm, ak + 2 * (16 * kk * S + 16 * n2), S)
                    for mt in range(MC):
                        x = 4 * (mt * NC + 2 * n2)
                        MMA(acq, x, af, 4 * mt, fb[0], fb[1])
                        MMA(acq, x + 4, af, 4 * mt, fb[2], fb[3])
                if NC % 2:
                    tc.ldsm_x4_trans(fb, 0, sm, ak + 2 * (16 * kk * S + 16 * (NC // 2)), S)
                    for mt in range(MC):
                        MMA(acq, 4 * (mt * NC + NC - 1), af, 4 * mt, fb[0], fb[1])
            if BULKQ:  # the tile into shared memory, for the next step's bulk reductions
                for mt in range(MC):
                    for nt in range(NC):
                        x = 4 * (mt * NC + nt)
                        if (not PAD) or cc0 + 8 * nt + 2 * t < D:
                            w = sbase + 4 * (BOFF + (qc0 + g + 16 * mt) * SR + cc0 + 8 * nt + 2 * t)
                            tc.sts64_f32_a(smf, w, acq[x], acq[x + 1])
                            tc.sts64_f32_a(smf, w + 4 * 8 * SR, acq[x + 2], acq[x + 3])
                tc.fence_proxy_async()  # visible to the TMA unit after the next barrier
                qsum = ((b * nh + hq) * nq + r0) * D
                qrows = min(BQ, nq - r0)
            else:
                dqo = ((b * nh + hq) * nq + r0 + qc0 + g) * D + cc0 + 2 * t  # the lane's first dQ element (flat)
                if r0 + BQ <= nq:  # every row of the block exists (the same for the whole block)
                    reduce_dq(dqa, dqo, acq, BQ, cc0)
                else:
                    reduce_dq(dqa, dqo, acq, nq - (r0 + qc0 + g), cc0)
        tc.cp_async_wait(0)
        cuda.syncthreads()  # K_j, V_j landed even when no query block was visible; phase C is done with K
        if BULKQ and tid < qrows:  # the last step's dQ tile; then every bulk group complete
            tc.bulk_red_f32(dqa, qsum + tid * D, smf, sbase + 4 * (BOFF + tid * SR), 4 * D)
            tc.bulk_wait()
        # Epilogue: dK·τ and dV packed to f16 into the K and V tiles (phase B's layout), then 16
        # bytes a thread to memory.
        for mt in range(MB):
            w0 = ((kb0 + 16 * mt + g) * S + cb0 + 2 * t) // 2
            pack(smw, KOFF // 2 + w0, acck, 4 * mt * NB, scale, scale)
            pack(smw, VOFF // 2 + w0, accv, 4 * mt * NB, float32(1.0), float32(1.0))
        cuda.syncthreads()
        for u in range(KU):
            r, col = chunk(lrow, lcol, tid, u)
            if (FULLK or r < BK) and c0 + r < nk:
                tc.st_global16_a(dk, kbase + (c0 + r) * D + col, sm, sbase, KOFF + r * S + col)
                tc.st_global16_a(dv, kbase + (c0 + r) * D + col, sm, sbase, VOFF + r * S + col)

    return bwd, NT, BK


@cache
def kernel_v3(d: int, causal: bool, bq: int, bk: int, nw: int, ma: int, mb: int, mc: int, minb: int = 1,
              bulkq: bool = False, longest_first: bool = False, qbuf: int = 2, bf16: bool = False):
    """The compiled kernel and its threads per block (``minb`` blocks per SM promised to ptxas;
    ``bulkq``: dQ by bulk reductions, :func:`bulk_fits`; ``longest_first``: causal key blocks in
    the order of their work, :func:`kernels.perf._tiles.key_block`; ``qbuf``: buffers of Q and dO,
    2 (the next step's copied beside this one's products) or 1 (copied after phase B, beside
    phase C, behind one more barrier: room for ``bulkq``'s tile up to d = 256); ``bf16``: for bf16
    inputs)."""
    fn, nt, _ = _source_v3(d, bq, bk, nw, ma, mb, mc, causal, bf16, bulkq, longest_first and causal, qbuf)
    return tc.jit_kernel(fn, nt, minb), nt


def signature_v3():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, types.Array(float32, 4, "C"), a4, a4, float32, float32)


def default_config_v3(d: int) -> dict:
    """bq queries per step, bk keys per block, nw warps; ma, mb, mc: m-tiles a warp owns in phases A
    (keys), B (keys) and C (queries); minb blocks an SM promised to ptxas; bulkq: dQ by every
    lane's ``red.v2`` (off) or by bulk reductions (on at d = 64 and from d = 112 but at d = 232 and
    248, where it spills, :func:`bulk_fits`,
    :func:`_wide_v3`: on an H200, the median over four runs of the time against ``red.v2`` at N =
    4,096 / 16,384: d = 128 0.94 / 0.95, causal 0.94 / 0.93; d = 112 0.94 / 0.94 (one run); d = 96
    1.00 / 1.00, causal 1.02 / 1.02: kernels/data/bwd_fp16_v3_bulk_low_h200_8ab49da, _0aa3913,
    _1e6423e; d = 64 (the 128 x 128 block), medians of 5 runs (2 for the others) at N = 4,096 /
    8,192 / 16,384: 0.98 / 0.98 / 0.98, causal 0.93 / 0.95 / 0.95, bf16 0.95 / 0.97 / 0.97, bf16
    causal 1.06 (0.92 and 1.20) / 0.94 / 0.94; d = 32 1.10 / 1.09 and d = 48 0.92 / 1.01 (one run),
    off: kernels/data/bwd_fp16_v3_bulk_d64_h200_7318fda, _a516f11); longest_first: causal key
    blocks issued every kv head's first before any head's second
    (:func:`kernels.perf._tiles.key_block`; no effect when not causal), where
    :func:`longest_first_runs` says it pays; qbuf: buffers of Q and dO (2 up to d = 128; 1 above,
    where it makes room for ``bulkq``'s tile up to d = 256, but 2 at d = 232 and 248, which take
    dQ by ``red.v2``: :func:`_wide_v3`, :func:`kernel_v3`).
    flash-attention's shapes: 128 x 128 at d = 64 (254 registers, 182 KB,
    no spills; on the H100 0.92x SDPA flash at N = 16,384 where 64 x 128 ran 0.85x, 1.02x at
    N = 4,096 where it ran 0.94x:
    kernels/data/bwd_fp16_v3_d64_h100_460c9a6), and at d = 48 and 80 (255 registers, 16 and 84 bytes
    of spills; 1.16x and 1.20x flash at N = 4,096, 1.13x and 1.17x at 16,384, where 64 x 128 ran
    1.05x, 1.14x, 1.01x, 1.13x in the same runs: kernels/data/bwd_fp16_v3_odd_h100_6d0524e), and at
    d = 32 (1.03x flash at N = 4,096, B·H = 64, where 64 x 128 ran 0.92x and bwd_fp16_v1 0.75x:
    kernels/data/hdim_sweep_h100_17772c5); 64 x 128 otherwise (the only one whose shared memory fits
    at d = 112 and 128; below 128 columns phase C gives each warp one m-tile: 4 warps along the
    queries, 2 across d). At d = 128 phase B's warps own 4 m-tiles (64 keys x 32 columns: 2 warps
    along the keys, 4 along d), as flash-attention's AtomLayoutNdKV = 2: 0.94x flash at N = 16,384
    and 0.98x at N = 4,096 where mb = 2 ran 0.90x and 0.90x (the same record, t128)."""
    pad = padded_head_dim(d) != d
    d = padded_head_dim(d)  # d % 16 = 8 runs as d + 8
    if d in (32, 48, 64, 80):  # dQ by bulk reductions at d = 64 (d = 80: the tile does not fit)
        return dict(bq=128, bk=128, nw=8, ma=4, mb=2, mc=2, minb=1, bulkq=d == 64, longest_first=True, qbuf=2)
    if d > 128:  # 64 keys a block (dK, dV: 128 registers a thread at d = 256)
        return _wide_v3(d, pad)
    # d = 112 and 128: dQ by bulk reductions, whose tile fits beside two Q/dO buffers here (207 KB
    # at d = 128); not at d = 96 (even, causal 2% slower)
    return dict(bq=64, bk=128, nw=8, ma=2, mb=4 if d == 128 else 2, mc=2 if d in (64, 128) else 1, minb=1,
                bulkq=d >= 112, longest_first=True, qbuf=2)


def _wide_v3(d: int, pad: bool = False) -> dict:
    """The block above d = 128: 64 x 64 (dK and dV keep 2·d·64 / 256 = d / 2 f32 registers a
    thread), 8 warps: phase A 2 x 4 warps (keys x queries); phases B and C 2 m-tiles a warp, 2
    warps along the keys (B) or the queries (C) and 4 across d, where d % 32 == 0, else 1 m-tile
    and 4 x 2 (the only split into whole n-tiles); dQ by bulk reductions (``bulkq``), whose tile
    fits beside one Q and dO buffer (``qbuf`` = 1) up to d = 256, beside two up to d = 192.  On
    the H100 (B·H = 16, kernels/data/bwd_fp16_v3_wide_h100_c1d781c)
    the block with one m-tile in phase C and dQ by ``red.v2`` ran 1.07x, 0.91x, 0.83x SDPA flash
    at d = 160, 192, 256 and N = 4,096 (0.97x, 0.81x, 0.79x at 16,384) where 32 queries a step ran
    0.95x, 0.81x, 0.78x (0.88x, 0.71x, 0.72x) and bwd_fp16_v1 0.84x, 0.55x, 0.34x (0.75x, 0.50x,
    0.31x).  On an H200 (kernels/data/bwd_fp16_v3_wide_h200_c9c5d82, B·H = 64, N = 4,096, three
    rounds, the same run) phase C's two m-tiles with ``bulkq`` took 0.92-0.96x the old block's
    time at d = 160, 192 and 176 causal (``bulkq`` alone there), two m-tiles alone 0.98-0.99x at
    d = 224 and 256.  ptxas (old block): 255 registers, no spills at d = 160 and 192, 68 bytes at
    256.
    One Q and dO buffer (``qbuf`` = 1) makes room for dQ's tile up to d = 256, and dQ by bulk
    reductions everywhere above d = 128: on an H200 (B·H = 16, one run of 10 calls a shape,
    kernels/data/bwd_fp16_v3_qbuf_h200_5479d36) fp16 1.12x, 1.25x, 1.10x SDPA flash at d = 192,
    224, 256 and N = 4,096 (0.97x, 1.24x, 1.02x at 16,384) where two buffers ran 0.97x, 1.00x,
    0.85x (0.83x, 0.99x, 0.80x); bf16 at d = 224 and 256 1.32x and 1.08x (1.26x, 1.03x) where two
    ran 1.06x, 0.84x (0.99x, 0.79x); causal d = 256 1.33x (0.96x) where two ran 1.10x (0.84x).
    ptxas at d = 256: spills 52 / 68 bytes (stores / loads) to 16 / 16, no ``red`` in the loop.
    Except at d = 232 and 248 (``d`` here is the padded head dim, 240 and 256, with the pad's
    column predicates): there ``bulkq`` with one buffer takes the block past 255 registers (ptxas:
    156 and 296 bytes of spill stores, 22 and 41 local-memory instructions in the main loop, where
    d = 240 and 256 have 0 and 2), so those two take dQ by ``red.v2`` and two Q/dO buffers (8 and
    64 bytes of spill stores): on an H200 (B·H = 64, N = 4,096, two rounds alternated,
    kernels/data/hdim_sweep_h200_3a43ecf) 0.84x -> 0.94x SDPA flash at d = 232 and 0.62-0.63x ->
    0.94-0.96x at 248, where the same change cost 5-9% at d = 168, 184 and 200 and tied at 216."""
    two = d % 32 == 0
    spills = pad and d >= 240
    return dict(bq=64, bk=64, nw=8, ma=2, mb=2 if two else 1, mc=2 if two else 1, minb=1,
                bulkq=not spills and bulk_fits(d, 64, 64, qbuf=1), longest_first=True, qbuf=2 if spills else 1)


def _accepts_v3(dtype, d: int) -> bool:
    """fp16 or bf16, d % 8 == 0, 16 <= d <= 256 (d % 16 = 8 runs as d + 8 in shared memory; dK and
    dV take 2·d·bk / (32·nw) f32 registers a thread: 128 at d = 128 with 128 keys a block, and at
    d = 256 with 64); :func:`layout_v3` says whether a given block shape splits d rounded up to 16."""
    return dtype_name(dtype) in ("float16", "bfloat16") and d % 8 == 0 and 16 <= d <= 256


def supports_v3(dtype, d: int) -> bool:
    """What :func:`_accepts_v3` and the default block shape can split: d = 16, 24, ..., 256."""
    if not _accepts_v3(dtype, d):
        return False
    cfg = default_config_v3(d)
    try:
        layout_v3(padded_head_dim(d), cfg["bq"], cfg["bk"], cfg["nw"], cfg["ma"], cfg["mb"], cfg["mc"])
    except ValueError:
        return False
    return True


def backward_v3(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp16 or bf16 (B, H, N, d) inputs, O and L from the forward; ``config``
    overrides :func:`default_config_v3`.  dQ is summed over key blocks by float32 atomics in no
    fixed order: it may differ from run to run in its last bits."""
    inp, a, (nb, nh, nhk, nq, nk, d), lse_d, cfg, sc = prepare_backward(
        "bwd_fp16_v3 takes float16 or bfloat16 with head_dim % 8 == 0, 16 to 256",
        default_config_v3, _accepts_v3,
        q, k, v, o, lse, do, scale=scale, config=config, causal=causal)
    # ValueError if the warps cannot split the block
    layout_v3(padded_head_dim(d), cfg["bq"], cfg["bk"], cfg["nw"], cfg["ma"], cfg["mb"], cfg["mc"])
    first = cfg["longest_first"] and longest_first_runs(cfg["bk"], nb * nhk)
    kern, nt = kernel_v3(d, bool(causal), **dict(cfg, longest_first=first), bf16=inp.bf16)
    dvec = row_dots(inp, a, causal)
    dqa, flat = zeroed_dq(inp, (nb, nh, nq, d))
    dk = inp.empty((nb, nhk, nk, d), inp.dtype)
    dv = inp.empty((nb, nhk, nk, d), inp.dtype)
    qh, kh, vh, doh, dkh, dvh = tc_view(inp, a["q"], a["k"], a["v"], a["do"], dk, dv)
    args = (qh, kh, vh, doh, lse_d, dvec, dqa, dkh, dvh, float32(sc * LOG2E), float32(sc))
    smem = smem_bytes_v3(d, cfg["bq"], cfg["bk"], cfg["bulkq"], cfg["qbuf"])
    raise_smem_limit(kern, args, smem)
    launch(kern, (-(-nk // cfg["bk"]), nb * nhk), nt, inp.stream, smem, *args)
    return dq_to_f16(inp, flat, (nb, nh, nq, d), sc), inp.out(dk), inp.out(dv)


#: The versions by the names the records use (:func:`kernels.perf.variant`).
VERSIONS = {
    "bwd_fp16_v1": SimpleNamespace(
        name="bwd_fp16_v1", backward=prepared_backward("bwd_fp16_v1", backward_v1), saved_forward=saved_forward,
        supports=supports_v1,
        default_config=default_config_v1, kernels=kernels_v1, smem_bytes_dkdv=smem_bytes_dkdv_v1,
        smem_bytes_dq=smem_bytes_dq_v1,
        SOURCES={"dkdv": (_dkdv_source_v1, signature_dkdv_v1), "dq": (_dq_source_v1, signature_dq_v1)}),
    "bwd_fp16_v3": SimpleNamespace(
        name="bwd_fp16_v3", backward=prepared_backward("bwd_fp16_v3", backward_v3), saved_forward=saved_forward,
        supports=supports_v3,
        default_config=default_config_v3, kernel=kernel_v3, layout=layout_v3, smem_bytes=smem_bytes_v3,
        signature=signature_v3, SOURCES={"bwd": (_source_v3, signature_v3)}),
}
