"""bwd_fp16_v2: one-kernel FlashAttention-2 backward for fp16, dQ by atomics (5 products, not 7).

What changed from ``bwd_fp16_v1``: v1 is the deterministic pair of kernels (dK/dV, then dQ) and
so computes S and P twice, 7 tensor-core products where this one does 5.  Here a block owns key
block j (K_j, V_j in shared memory, dK_j, dV_j in registers) and, for every query block i that
sees it, adds its share dS_ij K_j of dQ_i into a float32 buffer with ``red.global.v2.f32.add``;
a last small kernel applies τ and rounds that buffer to fp16.  The order in which the Tc partial
sums land is not fixed, so dQ may differ run to run in its last bits (dK, dV do not).

The second change is the one flash-attention makes at d = 128: Pᵀ and dSᵀ go through shared
memory, so that each product can split its output among the warps in its own way.  In v1 a warp
that computed 16 keys of Sᵀ had to accumulate all d columns of dK and dV for them (128 f32
registers each at d = 128: K and V could not stay in registers, and every product fed two
``mma`` per ``ldmatrix``).  Per query block i (Br queries), with NW warps and Bc keys:

    phase A   warp (kw, qg): keys 16kw..16kw+15 x its Br/qa queries of
              Sᵀ = K_j Q_iᵀ,  dPᵀ = V_j dO_iᵀ                          (f32 registers)
              Pᵀ = 2^(Sᵀ·τlog2e − L·log2e),  dSᵀ = Pᵀ ∘ (dPᵀ − D)  → shared, f16, [key, query]
    phase B   warp (wk, wd): mb m-tiles of keys x d/rd columns of
              dV += Pᵀ dO_i,  dK += dSᵀ Q_i                    (A from shared, B from shared)
    phase C   warp (wq, wc): mc m-tiles of queries x d/wdc columns of
              dQ_i += dS K_j  (A = dS read transposed from dSᵀ)   → red.global.v2.f32 into dQacc

(``layout`` gives the split), with Q_i, dO_i, L_i, D_i double-buffered through cp.async as in
v1.  Bc = 64 keys per block with 8 warps at d = 128 keeps dK and dV at 32 f32 registers each a
thread (Bc = 128 spilled 400 bytes).  Masking is v1's: key columns past Nk and causal entries
(bottom-right aligned) get P = 0; rows that see no key have L = +inf, so P = 0 there too.

Prediction (d = 128, Br = Bc = 64, NW = 8; H200): v1 spends 7 products; 5 at v1's per-product
rate would be 7/5 x 139-154 = 195-215 TFLOP/s, and the ldmatrix-to-mma ratio of phases B and C
falls from 1/2 to 3/8 and 1/2 (phase A 5/16): 220-260 TFLOP/s, 0.9-1.05x naive.

Measured (H200, ``kernels.perf.tune``, naive and SDPA flash timed in the same run; FLOPs 2.5 x
4·B·H·N²·d; worst relative error of dQ, dK, dV against float64 autograd 3.0e-4 at N = 4,096 and
3.2e-4 at N = 16,384, as v1's):

* **the prediction failed: v2 ties v1 at d = 128 and loses at d = 64.**  d = 128, N = 4,096,
  B·H = 64: the predicted shape 135.5-136.4 TFLOP/s, 0.57-0.59x naive (v1 146.9, 0.63x, same
  session); Bc = 128 with Br = 32: 128.3; 16-byte reductions: 132.4; Br = 32 with two blocks
  per SM (``minb`` 2, 128 registers, the default): 148.8-150.6, 0.63x.  N = 16,384, B·H = 16:
  158.3, 0.62x (v1 156.5, 0.61x); causal N = 4,096: 125.8, 1.78x (v1 125.8, 1.81x).  d = 64:
  N = 4,096 134.9-139.3, 1.10-1.12x (v1 1.19x in the bench); N = 16,384 156.7, 1.19x (v1 169.8,
  1.30x, same session).
* Where the time goes (d = 128, predicted shape): without the reductions (and so without phase
  C's mma, which the compiler then drops) 10.1 ms became 7.0 ms, but halving the reductions
  (Bc = 128) or their instructions (16 bytes after a lane-pair shuffle) changed nothing: L2
  atomic bandwidth is not the limit.  Nsight Compute: tensor pipe active 33% of cycles, issue
  slots 34%, 6 instructions per HMMA with 8 warps per SM; stalls per issue: fixed-latency
  dependency 1.84, global load 0.91, shared load 0.82, barrier 0.36.  The SASS of the
  element-wise step spends ~70 instructions per 8 query columns, mostly address arithmetic
  for each shared load and store.  Loading L and D a step ahead (now done) did not move the time.
  So the two products saved were paid for by the Pᵀ/dSᵀ round trip through shared memory, a
  barrier more, and the instruction overhead that v3 had removed from the forward.

Not in ``BEST``: no faster than v1 where v1 loses (d = 128) and slower where v1 wins (d = 64),
and its dQ is not bitwise reproducible.  Next, if taken up: the element-wise step with
precomputed 32-bit shared addresses (v3's diet) and L, D read as pairs.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int32, types, uint32

from . import tc

LOG2E = 1.4426950408889634
NEG_INF = float32(-math.inf)
POS_INF = float32(math.inf)


# ---------------------------------------------------------------------------------------------
# Layout


def _pad(d: int) -> int:
    return -(-d // 16) * 16


def layout(d: int, bq: int, bk: int, nw: int, wkv: int, wq: int) -> dict:
    """How the warps split each product; ValueError (naming the value) if they cannot.

    Phase A: bk / 16 warps along the keys (one m-tile each) times qa = nw·16 / bk along the
    queries (bq / qa each); phase B: wkv warps along the keys (mb = bk / 16 / wkv m-tiles each)
    times rd = nw / wkv along the columns (nob = (d16 / 8) / rd n-tiles each); phase C: wq warps
    along the queries (mc = bq / 16 / wq m-tiles) times wdc = nw / wq along the columns (noc
    n-tiles).  Each warp's n-tiles come in pairs (one ``ldmatrix.x4`` feeds two)."""
    if not 1 <= nw <= tc.MAX_WARPS:
        raise ValueError(f"{nw=}: must be 1..{tc.MAX_WARPS}")
    if bk <= 0 or bk % 16 or nw % (bk // 16):
        raise ValueError(f"{bk=}: must be 16 times a divisor of nw={nw}")
    qa = nw // (bk // 16)
    if bq <= 0 or bq % (16 * qa) or bq > 32 * nw:
        raise ValueError(f"{bq=}: must be a positive multiple of {16 * qa} ({qa} warps share a key tile), "
                         f"at most 32·nw = {32 * nw}")
    if wkv <= 0 or nw % wkv or (bk // 16) % wkv:
        raise ValueError(f"{wkv=}: must divide nw={nw} and bk/16={bk // 16}")
    if wq <= 0 or nw % wq or (bq // 16) % wq:
        raise ValueError(f"{wq=}: must divide nw={nw} and bq/16={bq // 16}")
    no = _pad(d) // 8
    rd, wdc = nw // wkv, nw // wq
    if no % (2 * rd):
        raise ValueError(f"{wkv=}: {rd} warps across d16={_pad(d)} columns leave an odd number of n-tiles")
    if no % (2 * wdc):
        raise ValueError(f"{wq=}: {wdc} warps across d16={_pad(d)} columns leave an odd number of n-tiles")
    return dict(qa=qa, mb=(bk // 16) // wkv, rd=rd, nob=no // rd, mc=(bq // 16) // wq, wdc=wdc, noc=no // wdc)


def smem_bytes(d: int, bq: int, bk: int) -> int:
    """K, V (bk rows); Q, dO double-buffered (bq rows); Pᵀ, dSᵀ (bk rows of bq + 8); L·log2e and
    D, double-buffered, in f32."""
    s = _pad(d) + 8
    return 2 * (2 * bk * s + 4 * bq * s + 2 * bk * (bq + 8)) + 4 * 4 * bq


def _source(D: int, BQ: int, BK: int, NW: int, WKV: int, WQ: int, CAUSAL: bool, KVREG: bool, VRED4: bool = False):
    lay = layout(D, BQ, BK, NW, WKV, WQ)
    QA, MB, RD, NOB = lay["qa"], lay["mb"], lay["rd"], lay["nob"]
    MC, WDC, NOC = lay["mc"], lay["wdc"], lay["noc"]
    WA = BK // 16  # phase A: warps along the keys
    BQW = BQ // QA  # phase A: queries per warp
    DP = _pad(D)
    NT = 32 * NW
    S = DP + 8  # row stride (f16) of K, V, Q, dO
    SQ = BQ + 8  # row stride (f16) of Pᵀ, dSᵀ
    KT = DP // 16  # phase A: k-steps over d
    NQ = BQW // 8  # phase A: n-tiles over the warp's queries
    KQ = BQ // 16  # phase B: k-steps over queries
    KK = BK // 16  # phase C: k-steps over keys
    CH = D // 8
    CPT = -(-BQ * CH // NT)  # 16-byte chunks of a Q (or dO) tile per thread
    NKV = 4 * KT if KVREG else 4
    NS4, NACC, NQACC, NR4, NMC4 = 4 * NQ, 4 * MB * NOB, 4 * MC * NOC, 4 * MB, 4 * MC
    KOFF = 0
    VOFF = BK * S
    QOFF = 2 * BK * S  # Q buffers 0, 1
    OOFF = QOFF + 2 * BQ * S  # dO buffers 0, 1
    POFF = OOFF + 2 * BQ * S  # Pᵀ [key, query]
    DSOFF = POFF + BK * SQ  # dSᵀ [key, query]
    FOFF = (DSOFF + BK * SQ) // 2  # f32 words: L·log2e (2 x BQ), then D (2 x BQ)

    def bwd(q, k, v, do, lse, dvec, dqa, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, types.float16)
        smf = cuda.shared.array(0, float32)  # the same bytes as f32 words
        smw = cuda.shared.array(0, uint32)  # and as f16 pairs
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        t = lane % 4
        g = lane // 4
        kw = warp % WA  # phase A: key tile and query group
        qg = warp // WA
        wk = warp // RD  # phase B: key group and column group
        wd = warp % RD
        wqr = warp // WDC  # phase C: query group and column group
        wc = warp % WDC
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
        loffp = tc.lane_offset(SQ)
        loffpb = tc.lane_offset_b(SQ)
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
        # Query blocks that see key block j: causal rows r see keys <= r + shift.
        tr = (nq + BQ - 1) // BQ
        i0 = 0
        if CAUSAL:
            i0 = max(0, c0 - shift) // BQ
        nblk = max(0, tr - i0) if c0 < nk else 0
        total = group * nblk
        crow = cuda.local.array(CPT, int32)
        cgof = cuda.local.array(CPT, int32)
        csof = cuda.local.array(CPT, int32)
        for u in range(CPT):
            e = tid + u * NT
            crow[u] = e // CH
            cgof[u] = (e // CH) * D + (e % CH) * 8
            csof[u] = (e // CH) * S + (e % CH) * 8
        if total > 0:
            qb = ((b * nh + hk * group) * nq + i0 * BQ) * D
            for u in range(CPT):
                if CPT * NT == BQ * CH or tid + u * NT < BQ * CH:
                    ok = i0 * BQ + crow[u] < nq
                    goff = qb + cgof[u] if ok else 0
                    tc.cp_async16_a(sm, sbase, QOFF + csof[u], q, goff, 8 if ok else 0)
                    tc.cp_async16_a(sm, sbase, OOFF + csof[u], do, goff, 8 if ok else 0)
            if tid < BQ:
                row = i0 * BQ + tid
                lv = lse[b, hk * group, row] if row < nq else NEG_INF
                smf[FOFF + tid] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
                smf[FOFF + 2 * BQ + tid] = dvec[b, hk * group, row] if row < nq else float32(0.0)
        tc.cp_async_commit()
        # L and D of row tid of the step after next, loaded a step before they are stored (to
        # shared memory, beside the cp.async of Q and dO), so that their latency is hidden.
        lnext = NEG_INF
        dnext = float32(0.0)
        if total > 1 and tid < BQ:
            row = (i0 + 1 % nblk) * BQ + tid
            if row < nq:
                lnext = lse[b, hk * group + 1 // nblk, row]
                dnext = dvec[b, hk * group + 1 // nblk, row]
        kf = cuda.local.array(NKV, uint32)
        vf = cuda.local.array(NKV, uint32)
        acck = cuda.local.array(NACC, float32)
        accv = cuda.local.array(NACC, float32)
        for e in range(NACC):
            acck[e] = 0.0
            accv[e] = 0.0
        s = cuda.local.array(NS4, float32)
        dp = cuda.local.array(NS4, float32)
        pf = cuda.local.array(NR4, uint32)
        sf = cuda.local.array(NR4, uint32)
        af = cuda.local.array(NMC4, uint32)
        acq = cuda.local.array(NQACC, float32)
        fb = cuda.local.array(4, uint32)
        key0 = c0 + 16 * kw + g  # phase A: this lane's keys key0, key0 + 8
        qw = qg * BQW  # and the first of its queries
        for it in range(total):
            buf = it % 2
            hq = hk * group + it // nblk
            i = i0 + it % nblk
            r0 = i * BQ
            # One barrier a step: Q_i etc. (committed one step ago) have landed, and every warp
            # is done with step it - 1, so its buffer, Pᵀ and dSᵀ can be overwritten.
            tc.cp_async_wait(0)
            cuda.syncthreads()
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
                if tid < BQ:
                    smf[FOFF + nb_ * BQ + tid] = lnext * float32(LOG2E) if lnext != NEG_INF else POS_INF
                    smf[FOFF + 2 * BQ + nb_ * BQ + tid] = dnext
                    lnext = NEG_INF
                    dnext = float32(0.0)
                    if it + 2 < total:
                        row = (i0 + (it + 2) % nblk) * BQ + tid
                        if row < nq:
                            lnext = lse[b, hk * group + (it + 2) // nblk, row]
                            dnext = dvec[b, hk * group + (it + 2) // nblk, row]
            tc.cp_async_commit()
            if it == 0 and KVREG:
                for kk in range(KT):
                    tc.ldsm_x4_a(kf, 4 * kk, sm, sbase, loff, KOFF, S, 16 * kw, 16 * kk)
                    tc.ldsm_x4_a(vf, 4 * kk, sm, sbase, loff, VOFF, S, 16 * kw, 16 * kk)
            qofs = QOFF + buf * BQ * S
            oofs = OOFF + buf * BQ * S
            lofs = FOFF + buf * BQ
            dofs = FOFF + 2 * BQ + buf * BQ
            # Phase A.  Sᵀ = K Q_iᵀ and dPᵀ = V dO_iᵀ: B operands stored [query, d].
            for kk in range(KT):
                ai = 4 * kk if KVREG else 0
                if not KVREG:
                    tc.ldsm_x4_a(kf, 0, sm, sbase, loff, KOFF, S, 16 * kw, 16 * kk)
                    tc.ldsm_x4_a(vf, 0, sm, sbase, loff, VOFF, S, 16 * kw, 16 * kk)
                for n2 in range(NQ // 2):
                    tc.ldsm_x4_b_a(fb, 0, sm, sbase, loffb, qofs, S, qw + 16 * n2, 16 * kk)
                    if kk == 0:
                        tc.mma_z(s, 8 * n2, kf, ai, fb[0], fb[1])
                        tc.mma_z(s, 8 * n2 + 4, kf, ai, fb[2], fb[3])
                    else:
                        tc.mma(s, 8 * n2, kf, ai, fb[0], fb[1])
                        tc.mma(s, 8 * n2 + 4, kf, ai, fb[2], fb[3])
                    tc.ldsm_x4_b_a(fb, 0, sm, sbase, loffb, oofs, S, qw + 16 * n2, 16 * kk)
                    if kk == 0:
                        tc.mma_z(dp, 8 * n2, vf, ai, fb[0], fb[1])
                        tc.mma_z(dp, 8 * n2 + 4, vf, ai, fb[2], fb[3])
                    else:
                        tc.mma(dp, 8 * n2, vf, ai, fb[0], fb[1])
                        tc.mma(dp, 8 * n2 + 4, vf, ai, fb[2], fb[3])
            # Pᵀ and dSᵀ element by element (lane: keys key0, key0 + 8; queries 8·nt + 2t, +1),
            # packed to f16 pairs into shared memory.
            edge = c0 + BK > nk or (CAUSAL and r0 + shift < c0 + BK - 1)
            wrow = (POFF + (16 * kw + g) * SQ) // 2
            drow = (DSOFF + (16 * kw + g) * SQ) // 2
            for nt in range(NQ):
                qc = qw + 8 * nt + 2 * t
                l0 = smf[lofs + qc]
                l1 = smf[lofs + qc + 1]
                d0 = smf[dofs + qc]
                d1 = smf[dofs + qc + 1]
                p0 = tc.ex2(s[4 * nt] * sl2 - l0)
                p1 = tc.ex2(s[4 * nt + 1] * sl2 - l1)
                p2 = tc.ex2(s[4 * nt + 2] * sl2 - l0)
                p3 = tc.ex2(s[4 * nt + 3] * sl2 - l1)
                if edge:
                    qr = r0 + qc + shift
                    if key0 >= nk or (CAUSAL and key0 > qr):
                        p0 = float32(0.0)
                    if key0 >= nk or (CAUSAL and key0 > qr + 1):
                        p1 = float32(0.0)
                    if key0 + 8 >= nk or (CAUSAL and key0 + 8 > qr):
                        p2 = float32(0.0)
                    if key0 + 8 >= nk or (CAUSAL and key0 + 8 > qr + 1):
                        p3 = float32(0.0)
                w = qc // 2
                smw[wrow + w] = tc.pack_f16x2(p0, p1)
                smw[wrow + w + 4 * SQ] = tc.pack_f16x2(p2, p3)
                smw[drow + w] = tc.pack_f16x2(p0 * (dp[4 * nt] - d0), p1 * (dp[4 * nt + 1] - d1))
                smw[drow + w + 4 * SQ] = tc.pack_f16x2(p2 * (dp[4 * nt + 2] - d0), p3 * (dp[4 * nt + 3] - d1))
            cuda.syncthreads()  # Pᵀ, dSᵀ of every warp are in shared memory
            # Phase B.  dV += Pᵀ dO_i, dK += dSᵀ Q_i: A = Pᵀ, dSᵀ rows (keys) of this warp's
            # m-tiles; B = dO_i, Q_i stored [query, d] (transposed loads), this warp's columns.
            cb = 8 * NOB * wd
            for kk in range(KQ):
                for mt in range(MB):
                    tc.ldsm_x4_a(pf, 4 * mt, sm, sbase, loffp, POFF, SQ, 16 * (wk * MB + mt), 16 * kk)
                    tc.ldsm_x4_a(sf, 4 * mt, sm, sbase, loffp, DSOFF, SQ, 16 * (wk * MB + mt), 16 * kk)
                for n2 in range(NOB // 2):
                    tc.ldsm_x4_trans_a(fb, 0, sm, sbase, loff, oofs, S, 16 * kk, cb + 16 * n2)
                    for mt in range(MB):
                        tc.mma(accv, 4 * (mt * NOB + 2 * n2), pf, 4 * mt, fb[0], fb[1])
                        tc.mma(accv, 4 * (mt * NOB + 2 * n2 + 1), pf, 4 * mt, fb[2], fb[3])
                    tc.ldsm_x4_trans_a(fb, 0, sm, sbase, loff, qofs, S, 16 * kk, cb + 16 * n2)
                    for mt in range(MB):
                        tc.mma(acck, 4 * (mt * NOB + 2 * n2), sf, 4 * mt, fb[0], fb[1])
                        tc.mma(acck, 4 * (mt * NOB + 2 * n2 + 1), sf, 4 * mt, fb[2], fb[3])
            # Phase C.  dQ_i += dS K_j: A = dS, read transposed from dSᵀ [key, query]; B = K_j
            # stored [key, d] (transposed loads).  Then into dQacc by 8-byte reductions.
            cc = 8 * NOC * wc
            for kk in range(KK):
                for mt in range(MC):
                    tc.ldsm_x4_trans_b_a(af, 4 * mt, sm, sbase, loffpb, DSOFF, SQ, 16 * kk, 16 * (wqr * MC + mt))
                for n2 in range(NOC // 2):
                    tc.ldsm_x4_trans_a(fb, 0, sm, sbase, loff, KOFF, S, 16 * kk, cc + 16 * n2)
                    for mt in range(MC):
                        if kk == 0:
                            tc.mma_z(acq, 4 * (mt * NOC + 2 * n2), af, 4 * mt, fb[0], fb[1])
                            tc.mma_z(acq, 4 * (mt * NOC + 2 * n2 + 1), af, 4 * mt, fb[2], fb[3])
                        else:
                            tc.mma(acq, 4 * (mt * NOC + 2 * n2), af, 4 * mt, fb[0], fb[1])
                            tc.mma(acq, 4 * (mt * NOC + 2 * n2 + 1), af, 4 * mt, fb[2], fb[3])
            qrow = (b * nh + hq) * nq
            for mt in range(MC):
                row = r0 + 16 * (wqr * MC + mt) + g
                for nt in range(NOC):
                    col = cc + 8 * nt + 2 * t
                    x = 4 * (mt * NOC + nt)
                    if VRED4:
                        # Lanes t, t ^ 1 trade halves: the even one then holds row g, columns
                        # 2t..2t+3, the odd one row g + 8, columns 2t-2..2t+1: 16 bytes each.
                        a0, a1, a2, a3 = acq[x], acq[x + 1], acq[x + 2], acq[x + 3]
                        odd = t & 1
                        s0, s1 = a2, a3
                        if odd:
                            s0, s1 = a0, a1
                        y0, y1 = tc.pair_swap2(s0, s1)  # every lane, outside any branch
                        if col - 2 * odd < D:
                            if odd == 0 and row < nq:
                                tc.red_v4(dqa, (qrow + row) * D + col, a0, a1, y0, y1)
                            if odd == 1 and row + 8 < nq:
                                tc.red_v4(dqa, (qrow + row + 8) * D + col - 2, y0, y1, a2, a3)
                    elif col < D:
                        if row < nq:
                            tc.red_v2(dqa, (qrow + row) * D + col, acq[x], acq[x + 1])
                        if row + 8 < nq:
                            tc.red_v2(dqa, (qrow + row + 8) * D + col, acq[x + 2], acq[x + 3])
        tc.cp_async_wait(0)
        cuda.syncthreads()  # K_j, V_j landed even when no query block was visible
        # Epilogue: dK·τ and dV packed to f16 into the K and V tiles (phase B's layout), then 16
        # bytes per thread to memory.
        for mt in range(MB):
            rl = 16 * (wk * MB + mt) + g
            for nt in range(NOB):
                x = 4 * (mt * NOB + nt)
                w0 = (rl * S + 8 * NOB * wd + 8 * nt + 2 * t) // 2
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

    return bwd, NT, BK


@cache
def kernel(d: int, causal: bool, bq: int, bk: int, nw: int, wkv: int, wq: int, reg: bool, minb: int = 1,
           vred: int = 2):
    """The compiled kernel and its threads per block (``minb`` blocks per SM promised to ptxas;
    dQ reduced 8 or 16 bytes at a time, ``vred`` 2 or 4 floats)."""
    if vred not in (2, 4):
        raise ValueError(f"{vred=}: must be 2 or 4")
    fn, nt, _ = _source(d, bq, bk, nw, wkv, wq, causal, reg, vred == 4)
    return tc.jit_kernel(fn, nt, minb), nt


def signature():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, types.Array(float32, 4, "C"), a4, a4, float32, float32)


#: name -> (source factory, signature) for kernels.perf.inspect.
SOURCES = {"bwd": (_source, signature)}


def default_config(d: int) -> dict:
    """bq queries per step and bk keys per block; nw warps; wkv warps along the keys in phase B
    (the other nw/wkv split the columns); wq warps along the queries in phase C; reg: K, V
    fragments of phase A held in registers.  Head dims the warps cannot split fall back to four
    warps, one column group in phases B and C."""
    if d <= 64:
        cfg = dict(bq=64, bk=64, nw=4, wkv=2, wq=2, reg=True, minb=1, vred=2)
    else:
        cfg = dict(bq=32, bk=64, nw=8, wkv=2, wq=2, reg=False, minb=2, vred=2)
    try:
        layout(d, cfg["bq"], cfg["bk"], cfg["nw"], cfg["wkv"], cfg["wq"])
    except ValueError:  # d16 / 8 is always even
        cfg.update(bq=64, bk=64, nw=4, wkv=4, wq=4)
    return cfg


def supports(dtype, d: int) -> bool:
    """fp16, d % 8 == 0, d <= 128: at d = 256 dK and dV alone would take 256 f32 registers a
    thread (bwd_fp16_v1 takes those)."""
    return np.dtype(dtype) == np.float16 and d % 8 == 0 and 8 <= d <= 128


def saved_forward(q, k, v, *, causal=False, scale=None):
    """(O, L) from the fastest fp16 forward: what :func:`backward` needs."""
    from . import fwd_fp16_v4

    return fwd_fp16_v4.forward(q, k, v, causal=causal, scale=scale, return_lse=True)


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp16 (B, H, N, d) inputs, O and L from the forward; ``config`` overrides
    :func:`default_config`.  dQ is summed over key blocks by float32 atomics in no fixed order:
    it may differ from run to run in its last bits."""
    from ._launch import dq_to_f16, prepare_backward, raise_smem_limit, row_dots, zeroed_dq

    inp, a, (nb, nh, nhk, nq, nk, d), lse_d, cfg, sc = prepare_backward(
        "bwd_fp16_v2 takes float16 with head_dim % 8 == 0", default_config, supports, q, k, v, o, lse, do,
        scale=scale, config=config, causal=causal)
    layout(d, cfg["bq"], cfg["bk"], cfg["nw"], cfg["wkv"], cfg["wq"])  # ValueError if the warps cannot split it
    kern, nt = kernel(d, bool(causal), **cfg)
    dvec = row_dots(inp, a, causal)
    dqa, flat = zeroed_dq(inp, (nb, nh, nq, d))
    dk = inp.empty((nb, nhk, nk, d), np.float16)
    dv = inp.empty((nb, nhk, nk, d), np.float16)
    args = (a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dqa, dk, dv, float32(sc * LOG2E), float32(sc))
    smem = smem_bytes(d, cfg["bq"], cfg["bk"])
    raise_smem_limit(kern, args, smem)
    kern[(-(-nk // cfg["bk"]), nb * nhk), nt, inp.stream, smem](*args)
    return dq_to_f16(inp, flat, (nb, nh, nq, d), sc), inp.out(dk), inp.out(dv)
