"""bwd_fp16_v3: one-kernel FlashAttention-2 backward for fp16 with 2-D warp tiles in every product.

What changed from ``bwd_fp16_v2`` (one kernel, dQ by ``red.global``, Pᵀ and dSᵀ through shared
memory): v2's phase A gave each warp 16 keys by all of its queries, so every k-step loaded the
warp's K and V fragments (one ``ldmatrix`` each) for only two to four ``mma``; and at the block
shape flash-attention uses at d = 128 (Bc = 128 keys, Br = 64 queries, 8 warps) v2 spilled 476
bytes a thread.  Here every phase splits its output among the warps in two dimensions, so each
``ldmatrix`` feeds more ``mma`` (the counts below are per warp and k-step of 16):

    phase A   Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ: a warp owns 16·ma keys x its bq·ma·16/bk queries
              (d = 128: 32 x 32): ma + na/2 loads for ma·na mma per product (4 for 8, v2 5 for 8)
              Pᵀ = 2^(Sᵀ·τlog2e − L·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − D)  → shared memory, f16, [key, query]
    phase B   dV += Pᵀ dO_i, dK += dSᵀ Q_i: 16·mb keys x d·16·mb/bk columns (32 x 64): 6 loads for
              16 mma per product
    phase C   dQ_i += dS K_j: 16·mc queries x its columns (32 x 32): 4 loads for 8 mma, then
              ``red.global.add.v2.f32`` into a float32 dQ buffer

and the register budget is planned: the element-wise step keeps its L and D in registers
loaded as pairs (``ld.shared.v2``) after the products, stores Pᵀ and dSᵀ as packed f16 pairs
through 32-bit shared addresses (``st.shared.u32``, one base a lane plus constant offsets, the
diet that made ``fwd_fp16_v3`` fast), and the cp.async of Q_i and dO_i uses one row and column a
thread (threads x 8 columns is a whole number of rows) instead of v2's per-chunk offset arrays.
Q_i, dO_i, L_i and D_i are double-buffered (issued at the top of a step for the next one), so a
step has two barriers: one before phase A (the step's tiles have landed, and every warp is done
with the last step's Pᵀ, dSᵀ and buffers), one after it (Pᵀ, dSᵀ written).

Shared memory at d = 128: K, V 2 x 34.8 KB; Q, dO double-buffered 69.6 KB; Pᵀ, dSᵀ 36.9 KB; L,
D 1 KB: 177 KB, one block of 8 warps per SM.  The order in which the key blocks' dQ partial sums
land is not fixed, so dQ may differ run to run in its last bits (dK, dV do not).  Masking is
v2's: key columns past Nk and causal entries (bottom-right aligned) get P = 0; rows that see no
key have L = +inf, so P = 0 there too.

Prediction (H100, d = 128, N = 4,096, B·H = 64; bwd_fp16_v1 141 TFLOP/s, 0.84x naive, in the
same bench run): per block step of 64 queries the 8 warps issue 2,560 mma and 1,152 ldmatrix
(0.45 per mma; v1 0.63, v2 0.7) and no local memory; if shared-memory bandwidth is what bounds
v1 (4 cycles an ldmatrix.x4 against ~1.5 a mma per SM) that is 1.3-1.4x v1's time per mma,
and 5 products instead of v1's 7: 180-220 TFLOP/s, 1.05-1.3x naive.

What the compiler made of it (``kernels.perf.inspect``, sm_90, no GPU needed): the first draft
used 255 registers and spilled 428 bytes, most of it 41 shared addresses that the optimiser had
hoisted out of the step loop, one register each, and a branch between every four mma (the
``kk == 0`` test in loops it did not unroll).  Taking each phase's addresses through
``tc.opaque_u32`` (one register plus immediate offsets) and peeling the first k-step left 255
registers and 12 bytes of spills (52 causal; d = 64: 248 registers, none), 320 HMMA and 144
LDSM a step, every loop unrolled.

Measured (H100, ``kernels.bench``, naive and SDPA timed in the same run,
``kernels/data/bench_h100.csv``; FLOPs 2.5 x 4·B·H·N²·d):

* **d = 128: 221-243 TFLOP/s at N = 4,096-16,384, 1.28-1.32x naive, 0.80-0.82x SDPA's flash
  backend, 0.47-0.48x cuDNN; bwd_fp16_v1 in the same run 141-159 (0.82-0.86x naive), so 1.53-1.57x
  v1.**  Causal 173-223 TFLOP/s, 3.1-3.9x naive (which computes the masked half), 1.2-1.5x v1.
  An earlier run (commit 7040685) gave 200 and 231 TFLOP/s at N = 4,096 and 16,384 (1.19x and
  1.27x naive): ~10% run to run at N = 4,096.  The prediction held, at its top end.
* d = 64: within run-to-run noise of v1 (N = 4,096: 126 against v1's 142; N = 16,384: 179
  against 169; causal 108-165 against 116-161), so ``BEST`` keeps the deterministic v1 there.
* Exactness: worst relative error of dQ, dK, dV against float64 autograd 3.0e-4 (N = 4,096) and
  3.3e-4 (N = 16,384), v1's; ``FLASHSIM_GPU=1 pytest -m gpu`` 77 passed on the H100 with v3 as
  the d = 128 backward (``kernels/data/h100_pytest_gpu.json``); compute-sanitizer memcheck 0
  errors, racecheck 0 hazards (``kernels/data/sanitize-*-bwd_fp16_v3.log``).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, types, uint32

from . import tc
from ._launch import LOG2E
from ._launch import saved_forward as saved_forward  # the shipped forward (BEST) of the dtype

NEG_INF = float32(-math.inf)
POS_INF = float32(math.inf)


# ---------------------------------------------------------------------------------------------
# Layout


def layout(d: int, bq: int, bk: int, nw: int, ma: int, mb: int, mc: int) -> dict:
    """How the warps split each product; ValueError (naming the value) if they cannot.

    Phase A (Sᵀ, dPᵀ, keys x queries): wak = bk / (16·ma) warps along the keys, nw / wak along the
    queries, na n-tiles (8 queries) each.  Phase B (dV, dK, keys x columns): bk / (16·mb) warps along
    the keys, the rest along the d columns, nb n-tiles each.  Phase C (dQ, queries x columns):
    bq / (16·mc) warps along the queries, the rest along the columns, nc n-tiles each.  n-tiles come
    in pairs (one ``ldmatrix.x4`` feeds two), and a block's threads load whole rows of a tile at
    a time (32·nw a multiple of d / 8).  d is a multiple of 16 (the k-steps of phase A): no
    padded columns."""
    if not 1 <= nw <= tc.MAX_WARPS:
        raise ValueError(f"{nw=}: must be 1..{tc.MAX_WARPS}")
    if d <= 0 or d % 16 or (32 * nw) % (d // 8):
        raise ValueError(f"{d=}: must be a multiple of 16 whose d / 8 16-byte chunks a row 32·nw = {32 * nw} "
                         "threads load in whole rows")
    rows = 32 * nw // (d // 8)  # rows of a tile the block loads per pass

    def split(name, m, extent, other, what):
        if m <= 0 or extent % (16 * m):
            raise ValueError(f"{name}={m}: 16·{name} must divide {what} = {extent}")
        w = extent // (16 * m)
        if nw % w:
            raise ValueError(f"{name}={m}: {w} warps along {what} do not divide nw={nw}")
        rest = nw // w
        if other % (16 * rest):
            raise ValueError(f"{name}={m}: {rest} warps across {other} leave an odd number of n-tiles")
        return w, other // rest // 8

    if bk <= 0 or bk % 16 or bk % rows:
        raise ValueError(f"{bk=}: must be a positive multiple of 16 and of {rows} (rows loaded per pass)")
    if bq <= 0 or bq % 16 or bq % rows:
        raise ValueError(f"{bq=}: must be a positive multiple of 16 and of {rows} (rows loaded per pass)")
    wak, na = split("ma", ma, bk, bq, "bk")
    wbk, nb = split("mb", mb, bk, d, "bk")
    wcq, nc = split("mc", mc, bq, d, "bq")
    return dict(wak=wak, na=na, wbk=wbk, nb=nb, wcq=wcq, nc=nc, rows=rows)


def smem_bytes(d: int, bq: int, bk: int) -> int:
    """K, V (bk rows); Q, dO double-buffered (bq rows); Pᵀ, dSᵀ (bk rows of bq + 8); L·log2e and D,
    double-buffered, in f32."""
    s = d + 8
    return 2 * (2 * bk * s + 4 * bq * s + 2 * bk * (bq + 8)) + 4 * 4 * bq


def _source(D: int, BQ: int, BK: int, NW: int, MA: int, MB: int, MC: int, CAUSAL: bool):
    lay = layout(D, BQ, BK, NW, MA, MB, MC)
    WAK, NA, WBK, NB, WCQ, NC, RPU = (lay[k] for k in ("wak", "na", "wbk", "nb", "wcq", "nc", "rows"))
    NT = 32 * NW
    S = D + 8  # row stride (f16) of K, V, Q, dO: 16 bytes of padding keep ldmatrix conflict-free
    SQ = BQ + 8  # row stride (f16) of Pᵀ, dSᵀ
    KT = D // 16  # phase A: k-steps over d
    KQ = BQ // 16  # phase B: k-steps over queries
    KK = BK // 16  # phase C: k-steps over keys
    CH = D // 8  # 16-byte chunks of a row
    QU = BQ // RPU  # passes to load a Q (or dO) tile
    KU = BK // RPU
    NS4, NACC, NQACC = 4 * MA * NA, 4 * MB * NB, 4 * MC * NC
    NFA, NFQ, NFB, NFC = 4 * MA, 2 * NA, 4 * MB, 4 * MC  # fragment registers of phases A, B, C
    KOFF = 0
    VOFF = BK * S
    QOFF = 2 * BK * S  # Q buffers 0, 1
    OOFF = QOFF + 2 * BQ * S  # dO buffers 0, 1
    POFF = OOFF + 2 * BQ * S  # Pᵀ [key, query]
    DSOFF = POFF + BK * SQ  # dSᵀ [key, query]
    FOFF = (DSOFF + BK * SQ) // 2  # f32 words: L·log2e (2 x BQ), then D (2 x BQ)

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
                tc.mma_z(c, x, fa, 4 * mt, fq[4 * n2], fq[4 * n2 + 1])
                tc.mma_z(c, x + 4, fa, 4 * mt, fq[4 * n2 + 2], fq[4 * n2 + 3])
        for kk in range(1, KT):
            for mt in range(MA):
                tc.ldsm_x4(fa, 4 * mt, sm, aa + 2 * (16 * mt * S + 16 * kk), S)
            for n2 in range(NA // 2):
                tc.ldsm_x4_b(fq, 4 * n2, sm, ab + 2 * (16 * n2 * S + 16 * kk), S)
            for mt in range(MA):
                for n2 in range(NA // 2):
                    x = 4 * (mt * NA + 2 * n2)
                    tc.mma(c, x, fa, 4 * mt, fq[4 * n2], fq[4 * n2 + 1])
                    tc.mma(c, x + 4, fa, 4 * mt, fq[4 * n2 + 2], fq[4 * n2 + 3])

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
        # This thread's row and column of every tile load (RPU rows a pass).
        lrow = tid // CH
        lcol = (tid % CH) * 8
        kbase = ((b * nhk + hk) * nk) * D
        for u in range(KU):
            r = lrow + u * RPU
            ok = c0 + r < nk
            goff = kbase + ((c0 + r) if ok else 0) * D + lcol
            tc.cp_async16_a(sm, sbase, KOFF + r * S + lcol, k, goff, 8 if ok else 0)
            tc.cp_async16_a(sm, sbase, VOFF + r * S + lcol, v, goff, 8 if ok else 0)
        # Query blocks that see key block j: causal rows r see keys <= r + shift.
        tr = (nq + BQ - 1) // BQ
        i0 = 0
        if CAUSAL:
            i0 = max(0, c0 - shift) // BQ
        nblk = max(0, tr - i0) if c0 < nk else 0
        total = group * nblk
        if total > 0:
            qb = ((b * nh + hk * group) * nq + i0 * BQ) * D
            for u in range(QU):
                r = lrow + u * RPU
                ok = i0 * BQ + r < nq
                goff = qb + r * D + lcol if ok else 0
                tc.cp_async16_a(sm, sbase, QOFF + r * S + lcol, q, goff, 8 if ok else 0)
                tc.cp_async16_a(sm, sbase, OOFF + r * S + lcol, do, goff, 8 if ok else 0)
            if tid < BQ:
                row = i0 * BQ + tid
                lv = lse[b, hk * group, row] if row < nq else NEG_INF
                smf[FOFF + tid] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
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
        for it in range(total):
            buf = it % 2
            hq = hk * group + it // nblk
            i = i0 + it % nblk
            r0 = i * BQ
            # Barrier 1: this step's tiles have landed, and every warp is done with the last
            # step's Pᵀ, dSᵀ and buffer, which the code below overwrites.
            tc.cp_async_wait(0)
            cuda.syncthreads()
            if it + 1 < total:
                nb_ = (it + 1) % 2
                hn = hk * group + (it + 1) // nblk
                rn = (i0 + (it + 1) % nblk) * BQ
                qb = ((b * nh + hn) * nq + rn) * D
                for u in range(QU):
                    r = lrow + u * RPU
                    ok = rn + r < nq
                    goff = qb + r * D + lcol if ok else 0
                    so = nb_ * (BQ * S) + r * S + lcol
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
            qofs = QOFF + buf * BQ * S
            oofs = OOFF + buf * BQ * S
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
                    tc.sts32_u32_a(smw, pbase + w, tc.pack_f16x2(p0, p1))
                    tc.sts32_u32_a(smw, pbase + w + 16 * SQ, tc.pack_f16x2(p2, p3))
                    tc.sts32_u32_a(smw, pbase + 2 * (DSOFF - POFF) + w,
                                   tc.pack_f16x2(p0 * (dp[x] - d0), p1 * (dp[x + 1] - d1)))
                    tc.sts32_u32_a(smw, pbase + 2 * (DSOFF - POFF) + w + 16 * SQ,
                                   tc.pack_f16x2(p2 * (dp[x + 2] - d0), p3 * (dp[x + 3] - d1)))
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
                        tc.mma(accv, 4 * (mt * NB + 2 * n2), pf, 4 * mt, fb[0], fb[1])
                        tc.mma(accv, 4 * (mt * NB + 2 * n2 + 1), pf, 4 * mt, fb[2], fb[3])
                    tc.ldsm_x4_trans(fb, 0, sm, ao - 2 * (OOFF - QOFF) + 2 * (16 * kk * S + 16 * n2), S)
                    for mt in range(MB):
                        tc.mma(acck, 4 * (mt * NB + 2 * n2), sf, 4 * mt, fb[0], fb[1])
                        tc.mma(acck, 4 * (mt * NB + 2 * n2 + 1), sf, 4 * mt, fb[2], fb[3])
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
                    tc.mma_z(acq, x, af, 4 * mt, fb[0], fb[1])
                    tc.mma_z(acq, x + 4, af, 4 * mt, fb[2], fb[3])
            for kk in range(1, KK):
                for mt in range(MC):
                    tc.ldsm_x4_trans_b(af, 4 * mt, sm, ad + 2 * (16 * kk * SQ + 16 * mt), SQ)
                for n2 in range(NC // 2):
                    tc.ldsm_x4_trans(fb, 0, sm, ak + 2 * (16 * kk * S + 16 * n2), S)
                    for mt in range(MC):
                        x = 4 * (mt * NC + 2 * n2)
                        tc.mma(acq, x, af, 4 * mt, fb[0], fb[1])
                        tc.mma(acq, x + 4, af, 4 * mt, fb[2], fb[3])
            qrow = (b * nh + hq) * nq + r0 + qc0 + g  # the lane's first dQ row (flat)
            full = r0 + BQ <= nq  # every row of the block exists: no per-row test
            for mt in range(MC):
                row = r0 + qc0 + 16 * mt + g
                for nt in range(NC):
                    col = cc0 + 8 * nt + 2 * t
                    x = 4 * (mt * NC + nt)
                    if full or row < nq:
                        tc.red_v2(dqa, (qrow + 16 * mt) * D + col, acq[x], acq[x + 1])
                    if full or row + 8 < nq:
                        tc.red_v2(dqa, (qrow + 16 * mt + 8) * D + col, acq[x + 2], acq[x + 3])
        tc.cp_async_wait(0)
        cuda.syncthreads()  # K_j, V_j landed even when no query block was visible; phase C is done with K
        # Epilogue: dK·τ and dV packed to f16 into the K and V tiles (phase B's layout), then 16
        # bytes a thread to memory.
        for mt in range(MB):
            rl = kb0 + 16 * mt + g
            for nt in range(NB):
                x = 4 * (mt * NB + nt)
                w0 = (rl * S + cb0 + 8 * nt + 2 * t) // 2
                smw[KOFF // 2 + w0] = tc.pack_f16x2(acck[x] * scale, acck[x + 1] * scale)
                smw[KOFF // 2 + w0 + 4 * S] = tc.pack_f16x2(acck[x + 2] * scale, acck[x + 3] * scale)
                smw[VOFF // 2 + w0] = tc.pack_f16x2(accv[x], accv[x + 1])
                smw[VOFF // 2 + w0 + 4 * S] = tc.pack_f16x2(accv[x + 2], accv[x + 3])
        cuda.syncthreads()
        for u in range(KU):
            r = lrow + u * RPU
            if c0 + r < nk:
                tc.st_global16_a(dk, kbase + (c0 + r) * D + lcol, sm, sbase, KOFF + r * S + lcol)
                tc.st_global16_a(dv, kbase + (c0 + r) * D + lcol, sm, sbase, VOFF + r * S + lcol)

    return bwd, NT, BK


@cache
def kernel(d: int, causal: bool, bq: int, bk: int, nw: int, ma: int, mb: int, mc: int, minb: int = 1):
    """The compiled kernel and its threads per block (``minb`` blocks per SM promised to ptxas)."""
    fn, nt, _ = _source(d, bq, bk, nw, ma, mb, mc, causal)
    return tc.jit_kernel(fn, nt, minb), nt


def signature():
    a4 = types.Array(types.float16, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, types.Array(float32, 4, "C"), a4, a4, float32, float32)


#: name -> (source factory, signature) for kernels.perf.inspect.
SOURCES = {"bwd": (_source, signature)}


def default_config(d: int) -> dict:
    """bq queries per step, bk keys per block, nw warps; ma, mb, mc: m-tiles a warp owns in phases
    A (keys), B (keys) and C (queries).  flash-attention's d = 128 shape (below 64 columns phase C
    gives each warp one m-tile, so that its column groups stay whole n-tile pairs)."""
    return dict(bq=64, bk=128, nw=8, ma=2, mb=2, mc=2 if d >= 64 else 1, minb=1)


def _accepts(dtype, d: int) -> bool:
    """fp16, d % 16 == 0, d <= 128 (dK and dV take 4·d·bk / (32·nw) f32 registers a thread: 128 at
    d = 128); :func:`layout` says whether a given block shape splits d."""
    return np.dtype(dtype) == np.float16 and d % 16 == 0 and 16 <= d <= 128


def supports(dtype, d: int) -> bool:
    """What :func:`_accepts` and the default block shape can split: d in {32, 64, 128} (its 256
    threads load whole rows of d / 8 16-byte chunks; other head dims take bwd_fp16_v1)."""
    if not _accepts(dtype, d):
        return False
    cfg = default_config(d)
    try:
        layout(d, cfg["bq"], cfg["bk"], cfg["nw"], cfg["ma"], cfg["mb"], cfg["mc"])
    except ValueError:
        return False
    return True


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp16 (B, H, N, d) inputs, O and L from the forward; ``config`` overrides
    :func:`default_config`.  dQ is summed over key blocks by float32 atomics in no fixed order:
    it may differ from run to run in its last bits."""
    from ._launch import dq_to_f16, prepare_backward, raise_smem_limit, row_dots, zeroed_dq

    inp, a, (nb, nh, nhk, nq, nk, d), lse_d, cfg, sc = prepare_backward(
        "bwd_fp16_v3 takes float16 with head_dim % 16 == 0, at most 128", default_config, _accepts, q, k, v, o,
        lse, do, scale=scale, config=config)
    layout(d, cfg["bq"], cfg["bk"], cfg["nw"], cfg["ma"], cfg["mb"], cfg["mc"])  # ValueError if the warps cannot
    kern, nt = kernel(d, bool(causal), **cfg)
    dvec = row_dots(inp, a, causal)
    dqa, flat = zeroed_dq(inp, (nb, nh, nq, d))
    dk = inp.empty((nb, nhk, nk, d), np.float16)
    dv = inp.empty((nb, nhk, nk, d), np.float16)
    args = (a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dqa, dk, dv, float32(sc * LOG2E), float32(sc))
    smem = smem_bytes(d, cfg["bq"], cfg["bk"])
    raise_smem_limit(kern, args, smem)
    kern[(-(-nk // cfg["bk"]), nb * nhk), nt, 0, smem](*args)
    return dq_to_f16(inp, flat, (nb, nh, nq, d), sc), inp.out(dk), inp.out(dv)
