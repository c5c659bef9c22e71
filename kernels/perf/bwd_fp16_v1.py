"""bwd_fp16_v1: FlashAttention-2 backward for fp16 on the tensor cores (mma.sync m16n8k16).

The reference backward (``kernels/flash2.py``: preprocess, dK/dV kernel, dQ kernel, no atomics,
deterministic) with every product moved onto the tensor cores in the manner of
``fwd_fp16_v3`` (its docstring has the helpers, layouts and the instruction-count lessons):

* **preprocess**: D_i = rowsum(dO_i ∘ O_i), the reference kernel (memory-bound, coalesced);
* **dK, dV** (grid (Tc, B·Hkv)): warp w owns 16·MT keys of K_j, V_j, whose A fragments it
  keeps in registers (``KVREG``) or re-reads from shared memory (d = 128).  For each query head
  of the kv head's group and each query block i that can see the key block (Q_i, dO_i
  double-buffered through cp.async; L_i and D_i beside them in fp32):

      Sᵀ  = K_j Q_iᵀ                    (keys x queries, f32 in registers)
      Pᵀ  = 2^(Sᵀ·τlog2e − L·log2e)      (L = +inf for rows that see no key: P = 0)
      dV += Pᵀ dO_i                     (Pᵀ packed to f16 in the A layout, as P in the forward)
      dPᵀ = V_j dO_iᵀ
      dSᵀ = Pᵀ ∘ (dPᵀ − D)
      dK += dSᵀ Q_i                     (τ applied once at the end)

* **dQ** (grid (Tr, B·H)): warp w owns 16·MT query rows; for each visible key block j (K_j, V_j
  double-buffered): S = Q_i K_jᵀ, P, dP = dO_i V_jᵀ, dS = P ∘ (dP − D), dQ += dS K_j.

So S and P are computed twice (once per kernel): 7 products where the forward had 2, against
5 for a backward with atomically accumulated dQ; the price of determinism.  FLOPs are still
counted as 2.5x the forward's (flash-attention's convention), so the TFLOP/s here understate
the work done by 7/5.

Masking: key columns >= Nk and causal entries (bottom-right aligned) get P = 0; keys or query
rows beyond the ends are never written.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int32, types, uint32

from ..flash2 import padded_head_dim
from . import tc
from ._launch import LOG2E
from ._launch import saved_forward as saved_forward  # the shipped forward (BEST) of the dtype

NEG_INF = float32(-math.inf)
POS_INF = float32(math.inf)


def smem_bytes_dkdv(d: int, bkey: int, bq: int) -> int:
    s = padded_head_dim(d) + 8
    return 2 * s * (2 * bkey + 4 * bq) + 4 * 4 * bq  # K, V; Q, dO double-buffered; L·log2e, D (x2)


def smem_bytes_dq(d: int, bq: int, bkey: int) -> int:
    s = padded_head_dim(d) + 8
    return 2 * s * (2 * bq + 4 * bkey) + 4 * 2 * bq  # Q, dO; K, V double-buffered; L·log2e, D


# ---------------------------------------------------------------------------------------------
# dK, dV


def _dkdv_source(D: int, BQ: int, NW: int, MT: int, CAUSAL: bool, KVREG: bool):
    DP = padded_head_dim(D)
    BK = 16 * NW * MT  # keys per block
    NT = 32 * NW
    S = DP + 8
    KT = DP // 16  # k-steps over d (Sᵀ, dPᵀ)
    NQ = BQ // 8  # n-tiles over queries (Sᵀ, dPᵀ)
    KQ = BQ // 16  # k-steps over queries (dV, dK)
    NO = DP // 8  # n-tiles over d (dV, dK)
    CH = D // 8
    CPT = -(-BQ * CH // NT)  # 16-byte chunks of a Q (or dO) tile per thread
    NKV = 4 * KT * MT if KVREG else 4 * MT
    NS4, NACC, NPA = 4 * NQ * MT, 4 * NO * MT, 4 * KQ * MT
    KOFF = 0
    VOFF = BK * S
    QOFF = 2 * BK * S  # Q buffers 0, 1
    OOFF = QOFF + 2 * BQ * S  # dO buffers 0, 1
    FOFF = (OOFF + 2 * BQ * S) // 2  # f32 words: L·log2e (2 x BQ), then D (2 x BQ)

    def dkdv(q, k, v, do, lse, dvec, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        smf = cuda.shared.array(0, float32)  # the same bytes as f32 words
        smw = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        t = lane % 4
        g = lane // 4
        j = cuda.blockIdx.x
        bk = cuda.blockIdx.y
        nhk = k.shape[1]
        b = bk // nhk
        hk = bk % nhk
        nh = q.shape[1]
        group = nh // nhk
        nq = q.shape[2]
        nk = k.shape[2]
        shift = nk - nq
        c0 = j * BK
        sbase = tc.smem_u32(sm)
        loff = tc.lane_offset(S)
        loffb = tc.lane_offset_b(S)
        if DP > D:
            for e in range(tid, (2 * BK + 4 * BQ) * (DP - D), NT):
                sm[(e // (DP - D)) * S + D + e % (DP - D)] = 0.0
        kbase = ((b * nhk + hk) * nk) * D
        for e in range(tid, BK * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            ok = c0 + r < nk
            goff = kbase + ((c0 + r) if ok else 0) * D + c
            tc.cp_async16_a(sm, sbase, KOFF + r * S + c, k, goff, 8 if ok else 0)
            tc.cp_async16_a(sm, sbase, VOFF + r * S + c, v, goff, 8 if ok else 0)
        # Query blocks that see key block j: causal rows r see keys <= r + shift, so the first
        # is the one holding row c0 - shift.
        tr = (nq + BQ - 1) // BQ
        i0 = 0
        if CAUSAL:
            i0 = max(0, c0 - shift) // BQ
        nblk = max(0, tr - i0) if c0 < nk else 0
        total = group * nblk
        # This thread's chunks of a Q/dO tile: row crow[u], offsets in memory and shared memory.
        crow = cuda.local.array(CPT, int32)
        cgof = cuda.local.array(CPT, int32)
        csof = cuda.local.array(CPT, int32)
        for u in range(CPT):
            e = tid + u * NT
            crow[u] = e // CH
            cgof[u] = (e // CH) * D + (e % CH) * 8
            csof[u] = (e // CH) * S + (e % CH) * 8
        # Prefetch step 0 (head hk·group, block i0) with K_j, V_j.
        if total > 0:
            qb = ((b * nh + hk * group) * nq + i0 * BQ) * D
            for u in range(CPT):
                if CPT * NT == BQ * CH or tid + u * NT < BQ * CH:
                    ok = i0 * BQ + crow[u] < nq
                    goff = qb + cgof[u] if ok else 0
                    tc.cp_async16_a(sm, sbase, QOFF + csof[u], q, goff, 8 if ok else 0)
                    tc.cp_async16_a(sm, sbase, OOFF + csof[u], do, goff, 8 if ok else 0)
            for r in range(tid, BQ, NT):
                row = i0 * BQ + r
                lv = lse[b, hk * group, row] if row < nq else NEG_INF
                smf[FOFF + r] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
                smf[FOFF + 2 * BQ + r] = dvec[b, hk * group, row] if row < nq else float32(0.0)
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
        for it in range(total):
            buf = it % 2
            i = i0 + it % nblk
            r0 = i * BQ
            if it + 1 < total:
                nb_ = (it + 1) % 2
                hn = hk * group + (it + 1) // nblk
                rn = (i0 + (it + 1) % nblk) * BQ
                qb = ((b * nh + hn) * nq + rn) * D
                for u in range(CPT):
                    if CPT * NT == BQ * CH or tid + u * NT < BQ * CH:
                        ok = rn + crow[u] < nq
                        goff = qb + cgof[u] if ok else 0
                        so = nb_ * (BQ * S) + csof[u]
                        tc.cp_async16_a(sm, sbase, QOFF + so, q, goff, 8 if ok else 0)
                        tc.cp_async16_a(sm, sbase, OOFF + so, do, goff, 8 if ok else 0)
                for r in range(tid, BQ, NT):
                    row = rn + r
                    lv = lse[b, hn, row] if row < nq else NEG_INF
                    smf[FOFF + nb_ * BQ + r] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
                    smf[FOFF + 2 * BQ + nb_ * BQ + r] = dvec[b, hn, row] if row < nq else float32(0.0)
            tc.cp_async_commit()
            tc.cp_async_wait(1)
            cuda.syncthreads()  # Q_i, dO_i, L_i, D_i (and K_j, V_j the first time) have landed
            if it == 0 and KVREG:
                for mt in range(MT):
                    for kk in range(KT):
                        tc.ldsm_x4(kf, 4 * (mt * KT + kk), sm,
                                   tc.tile_addr(sbase, loff, KOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
                        tc.ldsm_x4(vf, 4 * (mt * KT + kk), sm,
                                   tc.tile_addr(sbase, loff, VOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
            qofs = QOFF + buf * BQ * S
            oofs = OOFF + buf * BQ * S
            lofs = FOFF + buf * BQ
            dofs = FOFF + 2 * BQ + buf * BQ
            # Sᵀ = K Q_iᵀ and dPᵀ = V dO_iᵀ: both have B operands stored [query, d].
            for kk in range(KT):
                if not KVREG:
                    for mt in range(MT):
                        tc.ldsm_x4(kf, 4 * mt, sm,
                                   tc.tile_addr(sbase, loff, KOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
                        tc.ldsm_x4(vf, 4 * mt, sm,
                                   tc.tile_addr(sbase, loff, VOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
                for n2 in range(NQ // 2):
                    tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, qofs, S, 16 * n2, 16 * kk), S)
                    for mt in range(MT):
                        ai = 4 * (mt * KT + kk) if KVREG else 4 * mt
                        x = 4 * (mt * NQ + 2 * n2)
                        if kk == 0:
                            tc.mma_z(s, x, kf, ai, fb[0], fb[1])
                            tc.mma_z(s, x + 4, kf, ai, fb[2], fb[3])
                        else:
                            tc.mma(s, x, kf, ai, fb[0], fb[1])
                            tc.mma(s, x + 4, kf, ai, fb[2], fb[3])
                    tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, oofs, S, 16 * n2, 16 * kk), S)
                    for mt in range(MT):
                        ai = 4 * (mt * KT + kk) if KVREG else 4 * mt
                        x = 4 * (mt * NQ + 2 * n2)
                        if kk == 0:
                            tc.mma_z(dp, x, vf, ai, fb[0], fb[1])
                            tc.mma_z(dp, x + 4, vf, ai, fb[2], fb[3])
                        else:
                            tc.mma(dp, x, vf, ai, fb[0], fb[1])
                            tc.mma(dp, x + 4, vf, ai, fb[2], fb[3])
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
                    pa[y] = tc.pack_f16x2(p0, p1)
                    pa[y + 1] = tc.pack_f16x2(p2, p3)
                    dp[x] = p0 * (dp[x] - d0)
                    dp[x + 1] = p1 * (dp[x + 1] - d1)
                    dp[x + 2] = p2 * (dp[x + 2] - d0)
                    dp[x + 3] = p3 * (dp[x + 3] - d1)
            # dV += Pᵀ dO_i (B = dO stored [query, d]: transposed loads).
            for kk in range(KQ):
                for n2 in range(NO // 2):
                    tc.ldsm_x4_trans(fb, 0, sm, tc.tile_addr(sbase, loff, oofs, S, 16 * kk, 16 * n2), S)
                    for mt in range(MT):
                        tc.mma(accv, 4 * (mt * NO + 2 * n2), pa, 4 * (mt * KQ + kk), fb[0], fb[1])
                        tc.mma(accv, 4 * (mt * NO + 2 * n2 + 1), pa, 4 * (mt * KQ + kk), fb[2], fb[3])
            # dK += dSᵀ Q_i: dSᵀ packed to f16 in the A layout (reusing pa).
            for mt in range(MT):
                for nt in range(NQ):
                    x = 4 * (mt * NQ + nt)
                    y = 4 * (mt * KQ + nt // 2) + 2 * (nt % 2)
                    pa[y] = tc.pack_f16x2(dp[x], dp[x + 1])
                    pa[y + 1] = tc.pack_f16x2(dp[x + 2], dp[x + 3])
            for kk in range(KQ):
                for n2 in range(NO // 2):
                    tc.ldsm_x4_trans(fb, 0, sm, tc.tile_addr(sbase, loff, qofs, S, 16 * kk, 16 * n2), S)
                    for mt in range(MT):
                        tc.mma(acck, 4 * (mt * NO + 2 * n2), pa, 4 * (mt * KQ + kk), fb[0], fb[1])
                        tc.mma(acck, 4 * (mt * NO + 2 * n2 + 1), pa, 4 * (mt * KQ + kk), fb[2], fb[3])
            cuda.syncthreads()  # every warp is done with buffer it % 2 before it is refilled
        tc.cp_async_wait(0)
        cuda.syncthreads()  # K_j, V_j landed even when no query block was visible
        # Epilogue: dK·τ and dV, packed to f16 into the warp's own rows of the K and V tiles
        # (only this warp read them), then 16 bytes per thread to memory.
        for mt in range(MT):
            rl = 16 * (NW * mt + warp) + g
            for nt in range(NO):
                x = 4 * (mt * NO + nt)
                w0 = (rl * S + 8 * nt + 2 * t) // 2
                smw[KOFF // 2 + w0] = tc.pack_f16x2(acck[x] * scale, acck[x + 1] * scale)
                smw[KOFF // 2 + w0 + 4 * S] = tc.pack_f16x2(acck[x + 2] * scale, acck[x + 3] * scale)
                smw[VOFF // 2 + w0] = tc.pack_f16x2(accv[x], accv[x + 1])
                smw[VOFF // 2 + w0 + 4 * S] = tc.pack_f16x2(accv[x + 2], accv[x + 3])
        cuda.syncthreads()
        for e in range(tid, BK * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            if c0 + r < nk:
                tc.st_global16_a(dk, kbase + (c0 + r) * D + c, sm, sbase, KOFF + r * S + c)
                tc.st_global16_a(dv, kbase + (c0 + r) * D + c, sm, sbase, VOFF + r * S + c)

    return dkdv, NT, BK


# ---------------------------------------------------------------------------------------------
# dQ


def _dq_source(D: int, BK: int, NW: int, MT: int, CAUSAL: bool, QREG: bool):
    DP = padded_head_dim(D)
    BQ = 16 * NW * MT  # query rows per block
    NT = 32 * NW
    S = DP + 8
    KT = DP // 16  # k-steps over d (S, dP)
    NS = BK // 8  # n-tiles over keys (S, dP)
    KK = BK // 16  # k-steps over keys (dQ)
    NO = DP // 8  # n-tiles over d (dQ)
    CH = D // 8
    CPT = -(-BK * CH // NT)
    NQA = 4 * KT * MT if QREG else 4 * MT
    NS4, NACC, NPA, M2 = 4 * NS * MT, 4 * NO * MT, 4 * KK * MT, 2 * MT
    QOFF = 0
    OOFF = BQ * S
    KOFF = 2 * BQ * S  # K buffers 0, 1
    VOFF = KOFF + 2 * BK * S  # V buffers 0, 1

    def dq_kernel(q, k, v, do, lse, dvec, dq, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        smw = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        t = lane % 4
        g = lane // 4
        i = cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x
        bh = cuda.blockIdx.y
        nh = q.shape[1]
        b = bh // nh
        h = bh % nh
        hk = h // (nh // k.shape[1])
        nq = q.shape[2]
        nk = k.shape[2]
        shift = nk - nq
        r0 = i * BQ
        sbase = tc.smem_u32(sm)
        loff = tc.lane_offset(S)
        loffb = tc.lane_offset_b(S)
        if DP > D:
            for e in range(tid, (2 * BQ + 4 * BK) * (DP - D), NT):
                sm[(e // (DP - D)) * S + D + e % (DP - D)] = 0.0
        qbase = ((b * nh + h) * nq) * D
        kbase = ((b * k.shape[1] + hk) * nk) * D
        tck = (nk + BK - 1) // BK
        nblk = tck
        if CAUSAL:
            nblk = min(tck, max(0, (min(r0 + BQ, nq) - 1 + shift + BK) // BK))
        for e in range(tid, BQ * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            ok = r0 + r < nq
            goff = qbase + (r0 + r if ok else 0) * D + c
            tc.cp_async16_a(sm, sbase, QOFF + r * S + c, q, goff, 8 if ok else 0)
            tc.cp_async16_a(sm, sbase, OOFF + r * S + c, do, goff, 8 if ok else 0)
        crow = cuda.local.array(CPT, int32)
        cgof = cuda.local.array(CPT, int32)
        csof = cuda.local.array(CPT, int32)
        for u in range(CPT):
            e = tid + u * NT
            crow[u] = e // CH
            cgof[u] = (e // CH) * D + (e % CH) * 8
            csof[u] = (e // CH) * S + (e % CH) * 8
        if nblk > 0:
            for u in range(CPT):
                if CPT * NT == BK * CH or tid + u * NT < BK * CH:
                    ok = crow[u] < nk
                    goff = kbase + cgof[u] if ok else kbase
                    tc.cp_async16_a(sm, sbase, KOFF + csof[u], k, goff, 8 if ok else 0)
                    tc.cp_async16_a(sm, sbase, VOFF + csof[u], v, goff, 8 if ok else 0)
        tc.cp_async_commit()
        # Each lane's rows: g and g + 8 of every m-tile; their L·log2e (+inf: row sees nothing)
        # and D, kept in registers.
        lr = cuda.local.array(M2, float32)
        dr = cuda.local.array(M2, float32)
        for mt in range(MT):
            for e in range(2):
                row = r0 + 16 * (NW * mt + warp) + g + 8 * e
                lv = lse[b, h, row] if row < nq else NEG_INF
                lr[2 * mt + e] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
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
                gnext = kbase + (c0 + BK) * D
                for u in range(CPT):
                    if CPT * NT == BK * CH or tid + u * NT < BK * CH:
                        ok = c0 + BK + crow[u] < nk
                        goff = gnext + cgof[u] if ok else kbase
                        so = nb_ * (BK * S) + csof[u]
                        tc.cp_async16_a(sm, sbase, KOFF + so, k, goff, 8 if ok else 0)
                        tc.cp_async16_a(sm, sbase, VOFF + so, v, goff, 8 if ok else 0)
            tc.cp_async_commit()
            tc.cp_async_wait(1)
            cuda.syncthreads()  # K_j, V_j (and Q_i, dO_i the first time) have landed
            if j == 0 and QREG:
                for mt in range(MT):
                    for kk in range(KT):
                        tc.ldsm_x4(qa, 4 * (mt * KT + kk), sm,
                                   tc.tile_addr(sbase, loff, QOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
                        tc.ldsm_x4(oa, 4 * (mt * KT + kk), sm,
                                   tc.tile_addr(sbase, loff, OOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
            kofs = KOFF + buf * BK * S
            vofs = VOFF + buf * BK * S
            # S = Q_i K_jᵀ and dP = dO_i V_jᵀ: B operands stored [key, d].
            for kk in range(KT):
                if not QREG:
                    for mt in range(MT):
                        tc.ldsm_x4(qa, 4 * mt, sm,
                                   tc.tile_addr(sbase, loff, QOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
                        tc.ldsm_x4(oa, 4 * mt, sm,
                                   tc.tile_addr(sbase, loff, OOFF, S, 16 * (NW * mt + warp), 16 * kk), S)
                for n2 in range(NS // 2):
                    tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, kofs, S, 16 * n2, 16 * kk), S)
                    for mt in range(MT):
                        ai = 4 * (mt * KT + kk) if QREG else 4 * mt
                        x = 4 * (mt * NS + 2 * n2)
                        if kk == 0:
                            tc.mma_z(s, x, qa, ai, fb[0], fb[1])
                            tc.mma_z(s, x + 4, qa, ai, fb[2], fb[3])
                        else:
                            tc.mma(s, x, qa, ai, fb[0], fb[1])
                            tc.mma(s, x + 4, qa, ai, fb[2], fb[3])
                    tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, vofs, S, 16 * n2, 16 * kk), S)
                    for mt in range(MT):
                        ai = 4 * (mt * KT + kk) if QREG else 4 * mt
                        x = 4 * (mt * NS + 2 * n2)
                        if kk == 0:
                            tc.mma_z(dp, x, oa, ai, fb[0], fb[1])
                            tc.mma_z(dp, x + 4, oa, ai, fb[2], fb[3])
                        else:
                            tc.mma(dp, x, oa, ai, fb[0], fb[1])
                            tc.mma(dp, x + 4, oa, ai, fb[2], fb[3])
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
                    pa[y] = tc.pack_f16x2(p0 * (dp[x] - dr[2 * mt]), p1 * (dp[x + 1] - dr[2 * mt]))
                    pa[y + 1] = tc.pack_f16x2(p2 * (dp[x + 2] - dr[2 * mt + 1]), p3 * (dp[x + 3] - dr[2 * mt + 1]))
            # dQ += dS K_j (B = K stored [key, d]: transposed loads).
            for kk in range(KK):
                for n2 in range(NO // 2):
                    tc.ldsm_x4_trans(fb, 0, sm, tc.tile_addr(sbase, loff, kofs, S, 16 * kk, 16 * n2), S)
                    for mt in range(MT):
                        tc.mma(acc, 4 * (mt * NO + 2 * n2), pa, 4 * (mt * KK + kk), fb[0], fb[1])
                        tc.mma(acc, 4 * (mt * NO + 2 * n2 + 1), pa, 4 * (mt * KK + kk), fb[2], fb[3])
            cuda.syncthreads()  # every warp is done with buffer j % 2 before it is refilled
        tc.cp_async_wait(0)
        cuda.syncthreads()  # Q_i landed even when no key block was visible
        for mt in range(MT):
            rl = 16 * (NW * mt + warp) + g
            for nt in range(NO):
                x = 4 * (mt * NO + nt)
                w0 = (QOFF + rl * S + 8 * nt + 2 * t) // 2
                smw[w0] = tc.pack_f16x2(acc[x] * scale, acc[x + 1] * scale)
                smw[w0 + 4 * S] = tc.pack_f16x2(acc[x + 2] * scale, acc[x + 3] * scale)
        cuda.syncthreads()
        for e in range(tid, BQ * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            if r0 + r < nq:
                tc.st_global16_a(dq, qbase + (r0 + r) * D + c, sm, sbase, QOFF + r * S + c)

    return dq_kernel, NT, BQ


@cache
def kernels(d: int, causal: bool, bq: int, bk: int, nw: int, mt: int, reg: bool):
    """The compiled (dkdv, dq) kernels with their threads and block rows."""
    f1, nt1, bk1 = _dkdv_source(d, bq, nw, mt, causal, reg)
    f2, nt2, bq2 = _dq_source(d, bk, nw, mt, causal, reg)
    return (tc.jit_kernel(f1, nt1), nt1, bk1), (tc.jit_kernel(f2, nt2), nt2, bq2)


def default_config(d: int) -> dict:
    """bq: query rows per step of the dK/dV kernel; bk: keys per step of the dQ kernel; nw warps
    with mt m-tiles each (so 16·nw·mt keys, or query rows, per block); reg: K, V (or Q, dO)
    fragments held in registers."""
    if d <= 64:
        return dict(bq=64, bk=64, nw=4, mt=1, reg=True)
    return dict(bq=32, bk=32, nw=4, mt=1, reg=False)


def supports(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float16 and d % 8 == 0 and 8 <= d <= 256


def signature_dkdv():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, a4, float32, float32)


def signature_dq():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, float32, float32)


#: name -> (source factory, signature) for kernels.perf.inspect ("bwd_fp16_v1:dq").
SOURCES = {"dkdv": (_dkdv_source, signature_dkdv), "dq": (_dq_source, signature_dq)}


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp16 (B, H, N, d) inputs, O and L from the forward; ``config`` overrides
    :func:`default_config`."""
    from ._launch import prepare_backward, raise_smem_limit, row_dots

    inp, a, (nb, nh, nhk, nq, nk, d), lse_d, cfg, sc = prepare_backward(
        "bwd_fp16_v1 takes float16 with head_dim % 8 == 0", default_config, supports, q, k, v, o, lse, do,
        scale=scale, config=config)
    (kdkdv, nt1, bkey), (kdq, nt2, bqr) = kernels(d, bool(causal), **cfg)
    dvec = row_dots(inp, a, causal)
    dq = inp.empty((nb, nh, nq, d), np.float16)
    dk = inp.empty((nb, nhk, nk, d), np.float16)
    dv = inp.empty((nb, nhk, nk, d), np.float16)
    sl2, scf = float32(sc * LOG2E), float32(sc)
    args = (a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dk, dv, sl2, scf)
    smem = smem_bytes_dkdv(d, bkey, cfg["bq"])
    raise_smem_limit(kdkdv, args, smem)
    kdkdv[(-(-nk // bkey), nb * nhk), nt1, 0, smem](*args)
    args = (a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dq, sl2, scf)
    smem = smem_bytes_dq(d, bqr, cfg["bk"])
    raise_smem_limit(kdq, args, smem)
    kdq[(-(-nq // bqr), nb * nh), nt2, 0, smem](*args)
    return inp.out(dq), inp.out(dk), inp.out(dv)
