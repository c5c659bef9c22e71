"""bwd_fp32_v1: FlashAttention-2 backward in exact fp32 on the CUDA cores, register-tiled like an SGEMM.

What it is.  The fp32 counterpart of bwd_fp16_v1, with the module API the rest of the code
expects (``backward``, ``saved_forward``, ``supports``, ``default_config``, ``kernel``,
``SOURCES``) and the reference's semantics (``kernels/flash2.py``): D = rowsum(dO ∘ O) first;
causal aligned bottom-right when Nq ≠ Nk; grouped-query attention (dK, dV summed over the query
heads of a kv head); rows with L = -inf contribute nothing; keys >= Nk masked.  Every product is
an FFMA (no tensor cores, no TF32), so the gradients match the float64 reference to ~1e-7
relative.  The target is torch's naive fp32 backward with TF32 off (autograd through
softmax(QKᵀ·τ)V: four cuBLAS SGEMMs on the stored P plus N² elementwise passes), 34-35
TFLOP/s at d = 64 and 47 at d = 128 on the H200 in flash-attention's FLOP convention (2.5x the
forward's 4·B·H·N²·d).

Why one kernel with atomics.  bwd_fp16_v1 is deterministic: a dK/dV kernel and a separate dQ
kernel that recomputes S and P, 7 products where a backward needs 5.  On the tensor cores that
is affordable; on FFMA it is not: to beat naive's 4 GEMMs the products must already run at
≳ 35 TFLOP/s, about what fwd_fp32_v1 reaches, and 7/5 of the work cannot.  So this is
FlashAttention-2's own schedule: one block per key block j and kv head (grid (Tc, B·Hkv)) keeps
K_j, V_j and its dK_j, dV_j accumulators on chip and walks the query blocks i (of every query
head of the group) that can see it:

    Sᵀ  = K_j Q_iᵀ,  dPᵀ = V_j dO_iᵀ                  (Bc x Br, reduction over d)
    Pᵀ  = 2^(Sᵀ·τlog2e − L·log2e)  (0 where masked; L = -inf rows get L·log2e = +inf)
    dSᵀ = τ·Pᵀ ∘ (dPᵀ − D)                              (τ folded in once, here)
    dV += Pᵀ dO_i,  dK += dSᵀ Q_i                       (Bc x d, reduction over Br)
    dQ_i += dS K_j                                      (Br x d, reduction over Bc: atomics)

dQ is accumulated in the float32 output itself (zeroed first) by 16-byte vector reductions
(``red.global.v4.f32.add``, sm_90) from every key block: the order in which the Tc partial sums
arrive differs run to run, so dQ can differ between runs in the last bit or so (~1 ulp of the
partial sums); the value is as exact as any fixed order (each partial is exact fp32 FFMA, the
sum of Tc of them rounds the same way up to order), dK and dV are deterministic.  That is the
price of doing 5 products instead of 7, and flash-attention pays it too.

Layout.  A block of NW warps (lanes as a 4 x 8 grid, ly = lane // 8, lx = lane % 8, as in
fwd_fp32_v1) holds K_j, V_j, Q_i, dO_i row-major in shared memory (row stride d16 + 4 floats:
an odd number of 16-byte units, so 8 consecutive rows fall in 8 different 4-bank groups), and
Pᵀ, dSᵀ row-major [key][query] with stride ceil32(Br) + 4.  Each product has its own thread
micro-tile, and every operand is read by 16-byte ``ld.shared.v4`` touching at most 8 distinct
16-byte chunks per warp (the rest broadcast: one wavefront):

* Sᵀ, dPᵀ: a thread owns keys k1 + 8m (m < TK) x queries q1 + 4n (n < TQ) (keys by lx,
  queries by ly); per 4 dims TK loads of K (or V) and TQ of Q (or dO) feed 4·TK·TQ FFMA.  The
  same thread computes Pᵀ and dSᵀ of exactly the entries of Sᵀ and dPᵀ it owns, and stores them
  (scalar stores: lx·PS + ly covers 32 distinct banks).
* dV, dK: keys k2 + 4m (m < TK2, by ly) x columns c2 + 32u + (0..3) (u < TC2, by lx): per 4
  queries TK2 loads of Pᵀ (dSᵀ) and 4·TC2 of dO (Q) feed 16·TK2·TC2 FFMA.
* dQ: queries q3 + 16t + (0..3) (t < TQ3, by ly) x columns c3 + 32u + (0..3) (by lx): per key
  TQ3 loads of dSᵀ and TC3 of K feed 16·TQ3·TC3 FFMA; then one vector reduction per 4 columns.

The warp grid of each product (how the NW warps tile it) is chosen at compile time for the
fewest loads per FFMA.  Three barriers per query block; Q_{i+1}, dO_{i+1} are fetched by
cp.async while dQ_i is computed (the dQ product reads only K and dSᵀ).

Prediction (d = 64, Bc = Br = 64, NW = 8: TK = TQ = 4, TK2 = 4, TC2 = 1, TQ3 = TC3 = 1).  Per
query block a thread issues 5 x 1,024 = 5,120 FFMA against 640 LDS.128 (8 FFMA per load in
every product), 16 MUFU.EX2, ~130 elementwise/mask instructions, 32 scalar shared stores, 4
vector reductions, 8 cp.async and ~40 loop/address instructions: FFMA is ~86% of the issue.
Shared memory: 640 one-wavefront loads per 5,120 FFMA cycles per warp, with 2 warps per
scheduler in a block: the LSU ~50% busy, not the limit but not idle.  Against the forward
(which reaches 30-37 TFLOP/s at 85% FFMA share with 12 warps per SM) this has 8-16 warps per SM
(one or two blocks of 104 KB), 3 barriers per 5,120 FFMA instead of 2 per 4,096, and a lower
FFMA:load ratio (8 vs 10.7), so I expect ~50% of the FMA peak, ~30-35 TFLOP/s.  Flash-attention's
count (2.5 x the forward's 4·N²·d = five products of 2·N²·d) is exactly the five products done
here, so that is also the counted rate: 0.9-1.0x naive at d = 64.  It is close.

Measured (H200, ``kernels.perf.tune``, naive timed in the same run; FLOPs 2.5 x 4·B·H·N²·d,
halved for causal; relative error of the worst gradient against float64 autograd on the saved
forward of fwd_fp32_v1, 1.3e-6 at N = 4,096 and 2.4e-6 at N = 16,384):

* the predicted shape (NW = 8, 222 registers: one block per SM), d = 64, N = 4,096, B·H = 64:
  28.9 TFLOP/s, 0.81x naive (35.5); with minb = 2 (128 registers, 108 bytes spilled, two
  blocks) 31.4, 0.89x.  Inside the predicted range, at its bottom.
* NW = 4 (254 registers, two blocks of 4 warps per SM; micro-tiles of 8 x 4 in all three
  products: 10.7 FFMA per load), now the default at d <= 64: N = 4,096 (B·H 64)
  34.9 TFLOP/s, 0.98x naive; N = 16,384 (B·H 16) 36.2, **1.03x**; causal 30.1 at N = 4,096
  (NW = 8, minb 2: 2.15x naive, whose causal backward does the full N² work) and 36.3 at
  N = 16,384 (2.61x).
* d = 128, N = 4,096, B·H = 64: NW = 8, Br = 64 (the default) 34.1 TFLOP/s, 0.72x naive (47.4);
  Br = 32 26.6 (0.56x); causal (Br = 32) 25.4-26.5, 1.27-1.32x.
* scalar atomics for dQ instead of 16-byte reductions: -5%; UNROLL = 1: -7 to -13%; Bc = 32: -24%;
  NW = 8 with Bc = 128: 34.2 / 35.8 (0.97x / 1.02x), the same as NW = 4.

So the products run at ~54% of the FFMA peak, as the forward's do; an FFMA backward with five
products only ties torch's four cuBLAS SGEMMs at d = 64 and loses at d = 128, where naive's
GEMMs are larger and its N² elementwise passes relatively cheaper.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, types

from ..flash2 import padded_head_dim
from . import tc
from ._launch import LOG2E
from ._launch import saved_forward as saved_forward  # the shipped forward (BEST) of the dtype

NEG_INF = float32(-math.inf)
POS_INF = float32(math.inf)
#: Device functions are inlined into the kernel (the simulator's jit has no such option).
_device = cuda.jit(device=True) if tc.SIM else cuda.jit(device=True, forceinline=True)


# ---------------------------------------------------------------------------------------------
# Layout


def _geometry(d: int, bc: int, br: int):
    """Row strides in floats: Q/K/V/dO (d16 + 4), Pᵀ/dSᵀ (ceil32(Br) + 4); and d rounded up to
    32 (the columns the dK/dV/dQ micro-tiles cover)."""
    d16 = padded_head_dim(d)
    return d16 + 4, -(-br // 32) * 32 + 4, -(-d // 32) * 32


def smem_bytes(d: int, bc: int, br: int) -> int:
    """Dynamic shared memory of one block: K, V (Bc rows), Q, dO (Br rows), Pᵀ, dSᵀ (Bc rows of
    PS), plus 32 floats of slack (the dQ/dK/dV column reads of the last row may run past d)."""
    qks, ps, _ = _geometry(d, bc, br)
    return 4 * (2 * bc * qks + 2 * br * qks + 2 * bc * ps + 32)


def _warp_grid(nw: int, a: int, ua: int, b: int, ub: int, cost):
    """Split nw warps as wa x wb over an a x b tile whose warp tiles are ua·ta x ub·tb: the
    (wa, ta, tb) with integral micro-tiles and the lowest ``cost(ta, tb)`` (loads per FFMA)."""
    best = None
    for wa in range(1, nw + 1):
        if nw % wa:
            continue
        wb = nw // wa
        if a % (ua * wa) or b % (ub * wb):
            continue
        ta, tb = a // (ua * wa), b // (ub * wb)
        c = cost(ta, tb)
        if best is None or c < best[0]:
            best = (c, wa, ta, tb)
    if best is None:
        raise ValueError(f"no tiling of a {a} x {b} tile by {nw} warps (units {ua} x {ub})")
    return best[1:]


def tiling(d: int, bc: int, br: int, nw: int) -> dict:
    """The three products' warp grids and per-thread micro-tiles (raises ValueError if none)."""
    _, _, dc = _geometry(d, bc, br)
    wk1, tk, tq = _warp_grid(nw, bc, 8, br, 4, lambda x, y: (x + y) / (x * y))
    wk2, tk2, tc2 = _warp_grid(nw, bc, 4, dc, 32, lambda x, y: (x + 4 * y) / (16 * x * y))
    wq3, tq3, tc3 = _warp_grid(nw, br, 16, dc, 32, lambda x, y: (x + y) / (16 * x * y))
    return dict(wk1=wk1, tk=tk, tq=tq, wk2=wk2, tk2=tk2, tc2=tc2, wq3=wq3, tq3=tq3, tc3=tc3)


def _source(D: int, BC: int, BR: int, NW: int, CAUSAL: bool, UNROLL: int = 2, VRED: bool = True):
    QKS, PS, DC = _geometry(D, BC, BR)
    t_ = tiling(D, BC, BR, NW)
    WK1, TK, TQ = t_["wk1"], t_["tk"], t_["tq"]
    WK2, TK2, TC2 = t_["wk2"], t_["tk2"], t_["tc2"]
    WQ3, TQ3, TC3 = t_["wq3"], t_["tq3"], t_["tc3"]
    NT = 32 * NW
    CH = D // 4  # 16-byte chunks per row of Q, K, V, dO
    KC = D // 4  # 4-dim steps of Sᵀ, dPᵀ
    QC = BR // 4  # 4-query steps of dV, dK
    EC = BC // 4  # 4-key steps of dQ
    NS, NKF, NQF = TK * TQ, 4 * TK, 4 * TQ
    NA2, NP2, NB2 = TK2 * TC2 * 4, 4 * TK2, 4 * TC2
    NA3, NS3, NB3 = TQ3 * TC3 * 16, 4 * TQ3, 4 * TC3
    KOFF = 0
    VOFF = BC * QKS
    QOFF = 2 * BC * QKS
    OOFF = QOFF + BR * QKS
    POFF = OOFF + BR * QKS
    SOFF = POFF + BC * PS
    assert BC % 16 == 0 and BR % 16 == 0 and D % 4 == 0 and 1 <= NW <= tc.MAX_WARPS and UNROLL in (1, 2, 4)

    def copier(NROWS):
        """A device function copying an NROWS x D tile (global rows from element offset ``g0``, of
        which ``left`` exist: the rest are zero-filled) to shared byte address ``sa0`` with row
        stride QKS, 16 bytes per cp.async, chunk e = tid + u·NT at row e // CH."""
        CP = -(-NROWS * CH // NT)

        @_device
        def copy(sm, sa0, g, g0, left, tid):
            for u in range(CP):
                e = tid + u * NT
                if CP * NT == NROWS * CH or e < NROWS * CH:
                    r = e // CH
                    c = (e % CH) * 4
                    ok = r < left
                    tc.cp_async16_f32_a(sm, sa0 + 4 * (r * QKS + c), g, g0 + r * D + c if ok else 0, 4 if ok else 0)

        return copy

    copy_k = copier(BC)
    copy_q = copier(BR)

    @_device
    def st_step(acc, af, bf, sm, aa, ba, kc, first):
        """Sᵀ (or dPᵀ) += A[:, 4kc:4kc+4] B[:, 4kc:4kc+4]ᵀ for the thread's TK keys x TQ queries;
        A = K (V) rows k1 + 8m, B = Q (dO) rows q1 + 4n.  Sets instead of adding if ``first``."""
        for m in range(TK):
            tc.lds128_f32_a(af, 4 * m, sm, aa, 8 * m * QKS + 4 * kc)
        for n in range(TQ):
            tc.lds128_f32_a(bf, 4 * n, sm, ba, 4 * n * QKS + 4 * kc)
        for m in range(TK):
            for n in range(TQ):
                a_ = float32(0.0) if first else acc[m * TQ + n]
                for e in range(4):
                    a_ += af[4 * m + e] * bf[4 * n + e]
                acc[m * TQ + n] = a_

    @_device
    def st_step2(acc, af, bf, sm, aa, ba, kc, first):
        st_step(acc, af, bf, sm, aa, ba, kc, False)
        st_step(acc, af, bf, sm, aa, ba, kc + 1, False)

    @_device
    def st_step4(acc, af, bf, sm, aa, ba, kc, first):
        st_step2(acc, af, bf, sm, aa, ba, kc, False)
        st_step2(acc, af, bf, sm, aa, ba, kc + 2, False)

    @_device
    def kv_step(acc, pf, bf, sm, pa, ba, pc):
        """dV (dK) += Pᵀ (dSᵀ)[keys, 4pc:4pc+4] dO (Q)[4pc:4pc+4, cols] for the thread's TK2 keys
        x 4·TC2 columns."""
        for m in range(TK2):
            tc.lds128_f32_a(pf, 4 * m, sm, pa, 4 * m * PS + 4 * pc)
        for e in range(4):
            for u in range(TC2):
                tc.lds128_f32_a(bf, 4 * u, sm, ba, (4 * pc + e) * QKS + 32 * u)
            for m in range(TK2):
                for u in range(TC2):
                    for f in range(4):
                        acc[(m * TC2 + u) * 4 + f] += pf[4 * m + e] * bf[4 * u + f]

    @_device
    def kv_step2(acc, pf, bf, sm, pa, ba, pc):
        kv_step(acc, pf, bf, sm, pa, ba, pc)
        kv_step(acc, pf, bf, sm, pa, ba, pc + 1)

    @_device
    def kv_step4(acc, pf, bf, sm, pa, ba, pc):
        kv_step2(acc, pf, bf, sm, pa, ba, pc)
        kv_step2(acc, pf, bf, sm, pa, ba, pc + 2)

    @_device
    def dq_step(acc, sf, bf, sm, sa, ka, ec):
        """dQ += dS[queries, 4ec:4ec+4] K[4ec:4ec+4, cols] for the thread's 4·TQ3 queries x 4·TC3
        columns; dSᵀ row (key) e gives 4 consecutive queries per load."""
        for e in range(4):
            for t in range(TQ3):
                tc.lds128_f32_a(sf, 4 * t, sm, sa, (4 * ec + e) * PS + 16 * t)
            for u in range(TC3):
                tc.lds128_f32_a(bf, 4 * u, sm, ka, (4 * ec + e) * QKS + 32 * u)
            for t in range(TQ3):
                for g in range(4):
                    for u in range(TC3):
                        for f in range(4):
                            acc[((t * 4 + g) * TC3 + u) * 4 + f] += sf[4 * t + g] * bf[4 * u + f]

    @_device
    def dq_step2(acc, sf, bf, sm, sa, ka, ec):
        dq_step(acc, sf, bf, sm, sa, ka, ec)
        dq_step(acc, sf, bf, sm, sa, ka, ec + 1)

    @_device
    def dq_step4(acc, sf, bf, sm, sa, ka, ec):
        dq_step2(acc, sf, bf, sm, sa, ka, ec)
        dq_step2(acc, sf, bf, sm, sa, ka, ec + 2)

    st_block = {1: st_step, 2: st_step2, 4: st_step4}[UNROLL]
    kv_block = {1: kv_step, 2: kv_step2, 4: kv_step4}[UNROLL]
    dq_block = {1: dq_step, 2: dq_step2, 4: dq_step4}[UNROLL]
    KB, KR = (KC - 1) // UNROLL, 1 + (KC - 1) // UNROLL * UNROLL  # step 0 is peeled (S = ...)
    QB, QR = QC // UNROLL, QC // UNROLL * UNROLL
    EB, ER = EC // UNROLL, EC // UNROLL * UNROLL

    def bwd(q, k, v, do, lse, dvec, dq, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        ly = lane >> 3
        lx = lane & 7
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
        c0 = j * BC
        kbase = ((b * nhk + hk) * nk + c0) * D
        sbase = tc.smem_u32_f32(sm)
        # The thread's places in the three products' tiles (see the module docstring).
        k1 = 8 * TK * (warp % WK1) + lx
        q1 = 4 * TQ * (warp // WK1) + ly
        k2 = 4 * TK2 * (warp % WK2) + ly
        c2 = 32 * TC2 * (warp // WK2) + 4 * lx
        q3 = 16 * TQ3 * (warp % WQ3) + 4 * ly
        c3 = 32 * TC3 * (warp // WQ3) + 4 * lx
        ka1 = sbase + 4 * (KOFF + k1 * QKS)  # K[k1, 0]
        va1 = sbase + 4 * (VOFF + k1 * QKS)  # V[k1, 0]
        qa1 = sbase + 4 * (QOFF + q1 * QKS)  # Q[q1, 0]
        oa1 = sbase + 4 * (OOFF + q1 * QKS)  # dO[q1, 0]
        pw = sbase + 4 * (POFF + k1 * PS + q1)  # Pᵀ[k1, q1]
        dsw = sbase + 4 * (SOFF + k1 * PS + q1)  # dSᵀ[k1, q1]
        pa2 = sbase + 4 * (POFF + k2 * PS)  # Pᵀ[k2, 0]
        sa2 = sbase + 4 * (SOFF + k2 * PS)  # dSᵀ[k2, 0]
        oa2 = sbase + 4 * (OOFF + c2)  # dO[0, c2]
        qa2 = sbase + 4 * (QOFF + c2)  # Q[0, c2]
        sa3 = sbase + 4 * (SOFF + q3)  # dSᵀ[0, q3]
        ka3 = sbase + 4 * (KOFF + c3)  # K[0, c3]
        # Query blocks that see key block j: causal row r sees keys <= r + shift.
        tr = (nq + BR - 1) // BR
        i0 = 0
        if CAUSAL:
            i0 = max(0, c0 - shift) // BR
        nblk = max(0, tr - i0)
        total = group * nblk
        # K_j, V_j and the first Q_i, dO_i: one cp.async group (rows past the ends zero-filled).
        copy_k(sm, sbase + 4 * KOFF, k, kbase, nk - c0, tid)
        copy_k(sm, sbase + 4 * VOFF, v, kbase, nk - c0, tid)
        if total > 0:
            g0 = ((b * nh + hk * group) * nq + i0 * BR) * D
            copy_q(sm, sbase + 4 * QOFF, q, g0, nq - i0 * BR, tid)
            copy_q(sm, sbase + 4 * OOFF, do, g0, nq - i0 * BR, tid)
        tc.cp_async_commit()
        acck = cuda.local.array(NA2, float32)
        accv = cuda.local.array(NA2, float32)
        for x in range(NA2):
            acck[x] = 0.0
            accv[x] = 0.0
        s = cuda.local.array(NS, float32)
        dp = cuda.local.array(NS, float32)
        af = cuda.local.array(NKF, float32)
        bf = cuda.local.array(NQF, float32)
        pf = cuda.local.array(NP2, float32)
        vf = cuda.local.array(NB2, float32)
        acq = cuda.local.array(NA3, float32)
        sf = cuda.local.array(NS3, float32)
        kf = cuda.local.array(NB3, float32)
        lr = cuda.local.array(TQ, float32)
        dr = cuda.local.array(TQ, float32)
        for it in range(total):
            hq = hk * group + it // nblk
            r0 = (i0 + it % nblk) * BR
            # L·log2e (+inf for rows that see no key or do not exist: P = 0) and D of the
            # thread's queries, straight from global memory.
            for n in range(TQ):
                row = r0 + q1 + 4 * n
                lv = lse[b, hq, row] if row < nq else NEG_INF
                lr[n] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
                dr[n] = dvec[b, hq, row] if row < nq else float32(0.0)
            tc.cp_async_wait(0)  # this thread's copies of Q_i, dO_i (and K_j, V_j) have landed
            cuda.syncthreads()  # everyone's have; every warp is done with the last dSᵀ
            # dPᵀ = V dO_iᵀ and Sᵀ = K Q_iᵀ: per 4 dims, TK + TQ loads and 4·TK·TQ FFMA each.
            st_step(dp, af, bf, sm, va1, oa1, 0, True)
            for kb in range(KB):
                st_block(dp, af, bf, sm, va1, oa1, 1 + kb * UNROLL, False)
            for kc in range(KR, KC):
                st_step(dp, af, bf, sm, va1, oa1, kc, False)
            st_step(s, af, bf, sm, ka1, qa1, 0, True)
            for kb in range(KB):
                st_block(s, af, bf, sm, ka1, qa1, 1 + kb * UNROLL, False)
            for kc in range(KR, KC):
                st_step(s, af, bf, sm, ka1, qa1, kc, False)
            # Pᵀ and dSᵀ of the entries the thread owns, to shared memory.
            edge = c0 + BC > nk or (CAUSAL and c0 + BC - 1 > r0 + shift)
            for m in range(TK):
                key = c0 + k1 + 8 * m
                for n in range(TQ):
                    x = m * TQ + n
                    p = tc.ex2(s[x] * sl2 - lr[n])
                    if edge:
                        if key >= nk or (CAUSAL and key > r0 + q1 + 4 * n + shift):
                            p = float32(0.0)
                    tc.sts32_f32_a(sm, pw, 8 * m * PS + 4 * n, p)
                    tc.sts32_f32_a(sm, dsw, 8 * m * PS + 4 * n, (p * scale) * (dp[x] - dr[n]))
            cuda.syncthreads()  # Pᵀ, dSᵀ are visible
            # dV += Pᵀ dO_i and dK += dSᵀ Q_i: per 4 queries, TK2 + 4·TC2 loads, 16·TK2·TC2 FFMA.
            for qb in range(QB):
                kv_block(accv, pf, vf, sm, pa2, oa2, qb * UNROLL)
            for pc in range(QR, QC):
                kv_step(accv, pf, vf, sm, pa2, oa2, pc)
            for qb in range(QB):
                kv_block(acck, pf, vf, sm, sa2, qa2, qb * UNROLL)
            for pc in range(QR, QC):
                kv_step(acck, pf, vf, sm, sa2, qa2, pc)
            cuda.syncthreads()  # every warp is done with Q_i, dO_i
            if it + 1 < total:
                hn = hk * group + (it + 1) // nblk
                rn = (i0 + (it + 1) % nblk) * BR
                g0 = ((b * nh + hn) * nq + rn) * D
                copy_q(sm, sbase + 4 * QOFF, q, g0, nq - rn, tid)
                copy_q(sm, sbase + 4 * OOFF, do, g0, nq - rn, tid)
            tc.cp_async_commit()  # Q_{i+1}, dO_{i+1} land while dQ_i is computed
            # dQ_i partial = dS K_j: per key, TQ3 + TC3 loads and 16·TQ3·TC3 FFMA.
            for x in range(NA3):
                acq[x] = 0.0
            for eb in range(EB):
                dq_block(acq, sf, kf, sm, sa3, ka3, eb * UNROLL)
            for ec in range(ER, EC):
                dq_step(acq, sf, kf, sm, sa3, ka3, ec)
            qrow = (b * nh + hq) * nq
            for t in range(TQ3):
                for g in range(4):
                    row = r0 + q3 + 16 * t + g
                    if row < nq:
                        for u in range(TC3):
                            col = c3 + 32 * u
                            if col < D:
                                x = ((t * 4 + g) * TC3 + u) * 4
                                if VRED:
                                    tc.red_v4(dq, (qrow + row) * D + col, acq[x], acq[x + 1], acq[x + 2], acq[x + 3])
                                else:
                                    for f in range(4):
                                        cuda.atomic.add(dq, (b, hq, row, col + f), acq[x + f])
        tc.cp_async_wait(0)
        # Epilogue: dK (τ already in dSᵀ) and dV straight from registers to global memory.
        for m in range(TK2):
            key = c0 + k2 + 4 * m
            if key < nk:
                for u in range(TC2):
                    for f in range(4):
                        col = c2 + 32 * u + f
                        if col < D:
                            dk[b, hk, key, col] = acck[(m * TC2 + u) * 4 + f]
                            dv[b, hk, key, col] = accv[(m * TC2 + u) * 4 + f]

    return bwd, NT, BC


@cache
def kernel(d: int, causal: bool, bc: int, br: int, nw: int, unroll: int = 2, minb: int = 1, vred: bool = True):
    """The compiled kernel and its threads per block."""
    fn, nt, _ = _source(d, bc, br, nw, causal, unroll, vred)
    return tc.jit_kernel(fn, nt, minb), nt


def signature():
    a4 = types.Array(float32, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, a4, a4, float32, float32)


#: name -> (source factory, signature) for kernels.perf.inspect.
SOURCES = {"bwd": (_source, signature)}


def default_config(d: int) -> dict:
    """Bc keys per block, Br queries per step, nw warps, loop unrolling, blocks per SM promised to
    ptxas (launch bounds), dQ reduced by 16-byte vector atomics (sm_90) or scalar ones.

    Measured on the H200 (kernels/perf/NOTES.md): d <= 64 four warps (254 registers, two blocks
    per SM: larger micro-tiles, 10.7 FFMA per load) beat eight (222 registers, one block) by 10-20%;
    d = 128 eight warps with Br = 64 beat Br = 32 by 28%.  Head dims whose columns (d rounded up
    to 32) the eight warps cannot tile (68..96) take four."""
    if d <= 64:
        return dict(bc=64, br=64, nw=4, unroll=2, minb=1, vred=True)
    cfg = dict(bc=64, br=64, nw=8, unroll=2, minb=1, vred=True)
    try:
        tiling(d, cfg["bc"], cfg["br"], cfg["nw"])
    except ValueError:
        cfg["nw"] = 4
    return cfg


def supports(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float32 and d % 4 == 0 and 4 <= d <= 128


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp32 (B, H, N, d) inputs, O and L from the forward; ``config`` overrides
    :func:`default_config`.  dQ's summation order over key blocks is not fixed (atomics)."""
    import sys

    from ._launch import launch_fp32_backward

    return launch_fp32_backward("bwd_fp32_v1 takes float32 with head_dim % 4 == 0, <= 128",
                                sys.modules[__name__], q, k, v, o, lse, do, causal=causal, scale=scale, config=config)
