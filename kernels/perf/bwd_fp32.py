"""The fp32 backward: FlashAttention-2's one-kernel schedule with dQ by atomics, two versions.

Both keep the reference's semantics (``kernels/flash2.py``): D = rowsum(dO ∘ O) first
(:func:`kernels.perf._launch.row_dots`); causal aligned bottom-right when Nq ≠ Nk; grouped-query
attention (dK, dV summed over the query heads of a kv head); rows with L = -inf contribute
nothing; keys >= Nk masked.  One block per key block j and kv head (grid (Tc, B·Hkv)) keeps K_j,
V_j and its dK_j, dV_j accumulators on chip and walks the query blocks i (of every query head of
the group) that can see it:

    Sᵀ  = K_j Q_iᵀ,  dPᵀ = V_j dO_iᵀ                  (Bc x Br, reduction over d)
    Pᵀ  = 2^(Sᵀ·τlog2e − L·log2e)  (0 where masked; L = -inf rows get L·log2e = +inf)
    dSᵀ = τ·Pᵀ ∘ (dPᵀ − D)                              (τ folded in once, here)
    dV += Pᵀ dO_i,  dK += dSᵀ Q_i                       (Bc x d, reduction over Br)
    dQ_i += dS K_j                                      (Br x d, reduction over Bc: atomics)

5 products where bwd_fp16_v1's deterministic pair of kernels does 7.  dQ is accumulated in the
zeroed float32 output by 16-byte ``red.global.v4.f32.add`` (sm_90) from every key block, so its
summation order, and its last bit or so, can differ run to run; dK and dV are deterministic.
Three barriers per query block; Q_{i+1}, dO_{i+1} are fetched by cp.async while dQ_i is
computed.  The measurements behind each line are in ``kernels/perf/NOTES.md`` ("fp32 backward").

* ``bwd_fp32_v1``: every product on FFMA, register-tiled like an SGEMM (exact fp32, ~1e-6).
  H200: 34.9 TFLOP/s at d = 64, N = 4,096 (0.98x naive), d = 128 0.72x; H100 (bench_h100_single_run.csv):
  1.12-1.13x naive at d = 64, 0.77x at d = 128; H200 off the grid 1.14x at d = 40, 0.73-0.75x at
  d = 80-112, 1.57x at d = 16.  Shipped at d = 4, 8 and 12.
* ``bwd_fp32_v2``: v1's schedule with every product on the TF32 tensor cores as 3xTF32
  (x = hi + lo, A·B ≈ A_lo·B_hi + A_hi·B_lo + A_hi·B_hi), each product summed in chunks in
  zeroed registers (the tensor core's adds round toward zero).  H100 at d58f3a9: 1.01-1.03x
  naive at d = 128, 1.21-1.24x at d = 64; worst gradient error 9.6e-7 to 1.2e-6 (v1 1.3e-6 to
  3.1e-6 in the same run).  Any d % 8 == 0 up to 128 (d % 4 == 0 since f840550), computed
  padded on chip to 32, 64 or 128 (zero columns): H200 at fb2f674 0.90-0.94x naive at d =
  80-112 (1.23-1.29x v1), 1.07x at d = 40 (v1 1.14x), 0.95x at d = 128 (6daf391).  Fragment
  tiles swizzled (``swz``, af2b32e: the stores after phase A conflict-free or 2-way where
  4-way): 1.04-1.07x its own time before, 0.99x naive at d = 128, 1.16x at 64, 0.94-0.95x at 80
  and 112.  Loops two k-steps an iteration (``unr``, 250bb44: 32-bit counters, one load check
  in two; 6.45 instructions an mma before, the issue slots 47% busy): 1.04-1.06x its own time
  before, 1.04x naive at d = 128, 1.23x at 64, 0.99-1.02x at 80 and 112, 1.77x at 16; at d % 8
  == 4 (f840550) 1.18x at 44 and 0.99x at 100, where v1 runs 1.10x and 0.76x.  Shipped at every
  d % 4 == 0 from 16 to 128.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32, int32, types

from ..flash2 import padded_head_dim
from . import tc
from ._launch import launch_fp32_backward, prepared_backward
from ._launch import saved_forward as saved_forward  # the shipped forward (BEST) of the dtype
from ._tiles import f32_copier, ffma_ab, ffma_abt, key_block, lse_log2, steps

_device = tc.device_inline


# ---------------------------------------------------------------------------------------------
# What the two versions share: the block set-up and tile copies, the warp-grid search, the kernel
# signature.


def _walk(BC: int, BR: int, NT: int, D: int, S: int, CAUSAL: bool, KOFF: int, VOFF: int, QOFF: int, OOFF: int):
    """(start, load_step) of a key-block kernel (both versions; row stride S floats, tile offsets
    in floats).  ``start(sm, sbase, q, k, v, do, tid)`` is :func:`kernels.perf._tiles.key_block`'s
    tuple, after issuing the cp.async copies of K_j, V_j and of step 0's Q_i, dO_i (rows past
    the ends zero-filled; the caller commits the group); ``load_step(sm, sbase, q, do, b, hk, nh,
    group, nq, i0, nblk, it, tid)`` issues those of step ``it`` (query head hk·group + it // nblk,
    block i0 + it % nblk)."""
    block = key_block(BC, BR, CAUSAL)
    copy_k = f32_copier(BC, NT, D, S, ROWSTEP=False)
    copy_q = f32_copier(BR, NT, D, S, ROWSTEP=False)

    @_device
    def load_step(sm, sbase, q, do, b, hk, nh, group, nq, i0, nblk, it, tid):
        rn = (i0 + it % nblk) * BR
        g0 = ((b * nh + hk * group + it // nblk) * nq + rn) * D
        copy_q(sm, sbase + 4 * QOFF, q, g0, nq - rn, tid)
        copy_q(sm, sbase + 4 * OOFF, do, g0, nq - rn, tid)

    @_device
    def start(sm, sbase, q, k, v, do, tid):
        b, hk, nh, group, nq, nk, shift, c0, i0, nblk, total = block(q, k)
        kbase = ((b * k.shape[1] + hk) * nk + c0) * D
        copy_k(sm, sbase + 4 * KOFF, k, kbase, nk - c0, tid)
        copy_k(sm, sbase + 4 * VOFF, v, kbase, nk - c0, tid)
        if total > 0:
            load_step(sm, sbase, q, do, b, hk, nh, group, nq, i0, nblk, 0, tid)
        return b, hk, nh, group, nq, nk, shift, c0, i0, nblk, total

    return start, load_step


def _warp_grid(nw: int, rows: int, ur: int, cols: int, uc: int, cost, cap: int | None = None):
    """Split nw warps as wr x wc over a rows x cols tile in units ur x uc: the (wr, mr, mc) with
    integral warp tiles of mr x mc units (mr·mc <= cap, if given) and the lowest ``cost(mr, mc)``
    (loads per FFMA or per mma)."""
    best = None
    for wr in range(1, nw + 1):
        if nw % wr:
            continue
        wc = nw // wr
        if rows % (ur * wr) or cols % (uc * wc):
            continue
        mr, mc = rows // (ur * wr), cols // (uc * wc)
        if cap is not None and mr * mc > cap:
            continue
        c = cost(mr, mc)
        if best is None or c < best[0]:
            best = (c, wr, mr, mc)
    if best is None:
        raise ValueError(f"no tiling of a {rows} x {cols} tile by {nw=} warps (units {ur} x {uc}, at most {cap})")
    return best[1:]


def signature():
    a4 = types.Array(float32, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, a4, a4, float32, float32)


# ---------------------------------------------------------------------------------------------
# bwd_fp32_v1: FFMA.
#
# Layout.  A block of NW warps (lanes as a 4 x 8 grid, ly = lane // 8, lx = lane % 8, as in
# fwd_fp32_v1) holds K_j, V_j, Q_i, dO_i row-major in shared memory (row stride d16 + 4 floats:
# an odd number of 16-byte units, so 8 consecutive rows fall in 8 different 4-bank groups), and
# Pᵀ, dSᵀ row-major [key][query] with stride ceil32(Br) + 4.  Each product has its own thread
# micro-tile, and every operand is read by 16-byte ``ld.shared.v4`` touching at most 8 distinct
# 16-byte chunks per warp (the rest broadcast: one wavefront):
#
# * Sᵀ, dPᵀ: a thread owns keys k1 + 8m (m < TK) x queries q1 + 4n (n < TQ) (keys by lx,
#   queries by ly); per 4 dims TK loads of K (or V) and TQ of Q (or dO) feed 4·TK·TQ FFMA.  The
#   same thread computes Pᵀ and dSᵀ of exactly the entries of Sᵀ and dPᵀ it owns, and stores them
#   (scalar stores: lx·PS + ly covers 32 distinct banks).
# * dV, dK: keys k2 + 4m (m < TK2, by ly) x columns c2 + 32u + (0..3) (u < TC2, by lx): per 4
#   queries TK2 loads of Pᵀ (dSᵀ) and 4·TC2 of dO (Q) feed 16·TK2·TC2 FFMA.
# * dQ: queries q3 + 16t + (0..3) (t < TQ3, by ly) x columns c3 + 32u + (0..3) (by lx): per key
#   TQ3 loads of dSᵀ and TC3 of K feed 16·TQ3·TC3 FFMA; then one vector reduction per 4 columns.
#
# The warp grid of each product (how the NW warps tile it) is chosen at compile time for the
# fewest loads per FFMA.


def _geometry_v1(d: int, bc: int, br: int):
    """Row strides in floats: Q/K/V/dO (d16 + 4), Pᵀ/dSᵀ (ceil32(Br) + 4); and d rounded up to
    32 (the columns the dK/dV/dQ micro-tiles cover)."""
    d16 = padded_head_dim(d)
    return d16 + 4, -(-br // 32) * 32 + 4, -(-d // 32) * 32


def smem_bytes_v1(d: int, bc: int, br: int) -> int:
    """Dynamic shared memory of one block: K, V (Bc rows), Q, dO (Br rows), Pᵀ, dSᵀ (Bc rows of
    PS), plus 32 floats of slack (the dQ/dK/dV column reads of the last row may run past d)."""
    qks, ps, _ = _geometry_v1(d, bc, br)
    return 4 * (2 * bc * qks + 2 * br * qks + 2 * bc * ps + 32)


def tiling_v1(d: int, bc: int, br: int, nw: int) -> dict:
    """The three products' warp grids and per-thread micro-tiles (raises ValueError if none)."""
    _, _, dc = _geometry_v1(d, bc, br)
    wk1, tk, tq = _warp_grid(nw, bc, 8, br, 4, lambda x, y: (x + y) / (x * y))
    wk2, tk2, tc2 = _warp_grid(nw, bc, 4, dc, 32, lambda x, y: (x + 4 * y) / (16 * x * y))
    wq3, tq3, tc3 = _warp_grid(nw, br, 16, dc, 32, lambda x, y: (x + y) / (16 * x * y))
    return dict(wk1=wk1, tk=tk, tq=tq, wk2=wk2, tk2=tk2, tc2=tc2, wq3=wq3, tq3=tq3, tc3=tc3)


def _source_v1(D: int, BC: int, BR: int, NW: int, CAUSAL: bool, UNROLL: int = 2, VRED: bool = True):
    QKS, PS, DC = _geometry_v1(D, BC, BR)
    t_ = tiling_v1(D, BC, BR, NW)
    WK1, TK, TQ = t_["wk1"], t_["tk"], t_["tq"]
    WK2, TK2, TC2 = t_["wk2"], t_["tk2"], t_["tc2"]
    WQ3, TQ3, TC3 = t_["wq3"], t_["tq3"], t_["tc3"]
    NT = 32 * NW
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

    start, load_step = _walk(BC, BR, NT, D, QKS, CAUSAL, KOFF, VOFF, QOFF, OOFF)
    # Sᵀ (dPᵀ): keys 8m apart x queries 4n apart, over d; dV (dK): keys 4m apart x columns
    # 32u + (0..3), over the queries.
    st_product = ffma_abt(TK, TQ, 8 * QKS, 4 * QKS, KC, UNROLL)
    kv_product = ffma_ab(TK2, TC2, 4 * PS, QKS, QC, UNROLL)

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

    dq_product = steps(dq_step, UNROLL, 0, EC)

    def bwd(q, k, v, do, lse, dvec, dq, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        ly = lane >> 3
        lx = lane & 7
        sbase = tc.smem_u32_f32(sm)
        # The thread's places in the three products' tiles (the layout above).
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
        b, hk, nh, group, nq, nk, shift, c0, i0, nblk, total = start(sm, sbase, q, k, v, do, tid)
        tc.cp_async_commit()  # K_j, V_j and the first Q_i, dO_i: one group
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
                lr[n] = lse_log2(lse, b, hq, row, nq)
                dr[n] = dvec[b, hq, row] if row < nq else float32(0.0)
            tc.cp_async_wait(0)  # this thread's copies of Q_i, dO_i (and K_j, V_j) have landed
            cuda.syncthreads()  # everyone's have; every warp is done with the last dSᵀ
            # dPᵀ = V dO_iᵀ and Sᵀ = K Q_iᵀ: per 4 dims, TK + TQ loads and 4·TK·TQ FFMA each.
            st_product(dp, af, bf, sm, va1, oa1)
            st_product(s, af, bf, sm, ka1, qa1)
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
            kv_product(accv, pf, vf, sm, pa2, oa2)
            kv_product(acck, pf, vf, sm, sa2, qa2)
            cuda.syncthreads()  # every warp is done with Q_i, dO_i
            if it + 1 < total:
                load_step(sm, sbase, q, do, b, hk, nh, group, nq, i0, nblk, it + 1, tid)
            tc.cp_async_commit()  # Q_{i+1}, dO_{i+1} land while dQ_i is computed
            # dQ_i partial = dS K_j: per key, TQ3 + TC3 loads and 16·TQ3·TC3 FFMA.
            for x in range(NA3):
                acq[x] = 0.0
            dq_product(acq, sf, kf, sm, sa3, ka3)
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
def kernel_v1(d: int, causal: bool, bc: int, br: int, nw: int, unroll: int = 2, minb: int = 1, vred: bool = True):
    """The compiled kernel and its threads per block."""
    fn, nt, _ = _source_v1(d, bc, br, nw, causal, unroll, vred)
    return tc.jit_kernel(fn, nt, minb), nt


def default_config_v1(d: int) -> dict:
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
        tiling_v1(d, cfg["bc"], cfg["br"], cfg["nw"])
    except ValueError:
        cfg["nw"] = 4
    return cfg


def supports_v1(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float32 and d % 4 == 0 and 4 <= d <= 128


def backward_v1(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp32 (B, H, N, d) inputs, O and L from the forward; ``config`` overrides
    :func:`default_config`.  dQ's summation order over key blocks is not fixed (atomics)."""
    return launch_fp32_backward("bwd_fp32_v1 takes float32 with head_dim % 4 == 0, <= 128",
                                VERSIONS["bwd_fp32_v1"], q, k, v, o, lse, do, causal=causal, scale=scale, config=config)
# ---------------------------------------------------------------------------------------------
# bwd_fp32_v2: 3xTF32 on the tensor cores.
#
# Layout.  K_j, V_j, Q_i, dO_i row-major in shared memory with row stride d + 8 floats (≡ 8 mod
# 32 banks).  Phase A (Sᵀ = K Q_iᵀ, dPᵀ = V dO_iᵀ, reduction over d) reads both operands along
# their rows: the k index is permuted so that a lane's two k's (t, t + 4 of the fragment) are the
# adjacent columns 2t, 2t + 1, one ``ld.shared.v2`` (b0, b1; a0, a2; a1, a3), conflict-free with
# that stride.  Phases B (dV += Pᵀ dO_i, dK += dSᵀ Q_i, reduction over queries) and C (dQ_i =
# dS K_j, over keys) read dO, Q and K down their columns as B operands: there the n index is
# permuted instead, n-tile j of a 32-column group taking columns 4n + j, so one
# ``ld.shared.v4`` gives a lane b0 (or b1) of four n-tiles, again conflict-free; the
# accumulators then hold 8 adjacent columns of a row (8t .. 8t + 7) per group.  Pᵀ, dSᵀ (A of
# phase B) and dS (A of phase C) are written by phase A straight in fragment order, 16 x 8 tiles
# of 32 lanes x 4 registers, so that phases B and C read an A fragment with one ``ld.shared.v4``.
# Each product's warp tiles are chosen by :func:`tiling_v2` for the fewest shared-memory bytes
# per mma.  Accumulation: every product is summed in chunks in zeroed registers and the chunks
# are added in fp32 (round to nearest): dV, dK per query block (3·Br/8 = 24 mma), dQ per key
# block (then ``red.global``), Sᵀ and dPᵀ every 32 dims (``ak`` = d / 32 chunks, 12 mma each).


def padded_dim_v2(d: int) -> int:
    """The head dim bwd_fp32_v2 computes with: d rounded up to 32, 64 or 128 (the dims its warp
    tiles were chosen for); the columns past d are zeros in shared memory."""
    return 32 if d <= 32 else 64 if d <= 64 else 128


def smem_bytes_v2(d: int, bc: int, br: int) -> int:
    """K, V (Bc rows), Q, dO (Br rows) with row stride DP + 8 (:func:`padded_dim_v2`), and Pᵀ,
    dSᵀ, dS in fragment order."""
    dp = padded_dim_v2(d)
    return 4 * (2 * (bc + br) * (dp + 8) + 3 * bc * br)


def tiling_v2(d: int, bc: int, br: int, nw: int) -> dict:
    """Warp grids and warp tiles of the three products (ValueError if the warps cannot tile them).

    A: Sᵀ, dPᵀ (bc x br): wa warps down the keys, tiles of 16·ma keys x 8·na queries;
    B: dV, dK (bc x d): wb down the keys, 16·mb keys x 32·ub columns;
    C: dQ (br x d): wc down the queries, 16·mc queries x 32·uc columns.
    Cost: floats a lane loads per mma (A fragments 4 floats an m-tile, B 2 an n-tile).  d is
    taken padded (:func:`padded_dim_v2`)."""
    d = padded_dim_v2(d)
    wa, ma, na = _warp_grid(nw, bc, 16, br, 8, lambda m, n: (4 * m + 2 * n) / (m * n), 4)
    wb, mb, ub = _warp_grid(nw, bc, 16, d, 32, lambda m, u: (4 * m + 8 * u) / (4 * m * u), 2)
    wc, mc, uc = _warp_grid(nw, br, 16, d, 32, lambda m, u: (4 * m + 8 * u) / (4 * m * u), 2)
    return dict(wa=wa, ma=ma, na=na, wb=wb, mb=mb, ub=ub, wc=wc, mc=mc, uc=uc)


def _source_v2(D: int, BC: int, BR: int, NW: int, CAUSAL: bool, AK: int = 1, SWZ: bool = False, UNR: bool = False):
    DP = padded_dim_v2(D)  # the compute head dim; D (a multiple of 4) padded with zero columns
    PADC = DP - D
    S = DP + 8
    t_ = tiling_v2(D, BC, BR, NW)
    WA, MA, NA = t_["wa"], t_["ma"], t_["na"]
    WB, MB, UB = t_["wb"], t_["mb"], t_["ub"]
    WC, MC, UC = t_["wc"], t_["mc"], t_["uc"]
    NT = 32 * NW
    KS, QS, ES = DP // 8, BR // 8, BC // 8  # k-steps of phases A, B, C
    KOFF = 0
    VOFF = BC * S
    QOFF = 2 * BC * S
    OOFF = QOFF + BR * S
    # SWZ: the fragment tiles' 16-byte chunks permuted so that the stores after phase A hit the
    # banks without conflicts (Pᵀ, dSᵀ, two values a lane by one STS.64) or 2-way (dS) where they
    # were 4-way: Pᵀ and dSᵀ lane L's chunk at L ^ ((L >> 3) & 1), dS's at L ^ (((L >> 3) & 1) << 2)
    # (phase B's and C's ``ld.shared.v4`` read the chunk of their lane, still one 512-byte tile).
    PF = OOFF + BR * S  # Pᵀ: tiles (key // 16, query // 8), 128 floats each
    TF = PF + BC * BR  # dSᵀ: the same
    SF = TF + BC * BR  # dS: tiles (query // 16, key // 8)
    NACC_A = 4 * MA * NA
    NACC_B = 16 * MB * UB
    NACC_C = 16 * MC * UC
    NFA = 4 * max(MA, MB, MC)  # A fragments of one k-step (hi or lo)
    NFB = 2 * max(NA, 4 * UB, 4 * UC)  # B fragments
    NQA = 2 * NA  # the queries of a lane in phase A
    NRAW = max(4 * MA + 2 * NA, 4 * MB + 8 * UB, 4 * MC + 8 * UC)  # one k-step's operands, as loaded
    assert BC % 16 == 0 and BR % 16 == 0 and D % 4 == 0 and 1 <= NW <= tc.MAX_WARPS and KS % AK == 0
    UNR_A = UNR and (KS // AK) % 2 == 0  # phase A's chunks of k-steps taken two at a time
    NCK = np.int32(AK) if UNR_A else AK  # its chunk count, counted in 32 bits with UNR_A

    start, load_step = _walk(BC, BR, NT, D, S, CAUSAL, KOFF, VOFF, QOFF, OOFF)

    @_device
    def split(x, hi, lo, i):
        h = tc.tf32_hi(x)
        hi[i] = h
        lo[i] = x - h

    @_device
    def zero_pad(sm, sbase, tid):
        """D < DP: zero the PADC columns past D of the K, V (Bc rows) and Q, dO (Br rows) tiles,
        once a block; the copies write the D real columns only, so the zeros stay."""
        if PADC:
            for e in range(tid, BC * PADC, NT):
                x = (e // PADC) * S + D + e % PADC
                tc.sts32_f32_a(sm, sbase, KOFF + x, float32(0.0))
                tc.sts32_f32_a(sm, sbase, VOFF + x, float32(0.0))
            for e in range(tid, BR * PADC, NT):
                x = (e // PADC) * S + D + e % PADC
                tc.sts32_f32_a(sm, sbase, QOFF + x, float32(0.0))
                tc.sts32_f32_a(sm, sbase, OOFF + x, float32(0.0))

    @_device
    def a_load(raw, sm, aa, ba, ks):
        """Phase A's operands of k-step ks (dims 8ks..8ks+7) for the warp's MA x NA tiles, as
        loaded: raw[4m:4m+4] = a0, a2, a1, a3 of A tile m (``aa``: byte address of row g, column
        2t of the warp's first A row; a lane's k = t, t + 4 are the columns 2t, 2t + 1),
        raw[4MA + 2n:+2] = b0, b1 of B tile n (``ba`` likewise)."""
        for m in range(MA):
            tc.lds64_f32_a(raw, 4 * m, sm, aa + 4 * (16 * m * S + 8 * ks))
            tc.lds64_f32_a(raw, 4 * m + 2, sm, aa + 4 * ((16 * m + 8) * S + 8 * ks))
        for n in range(NA):
            tc.lds64_f32_a(raw, 4 * MA + 2 * n, sm, ba + 4 * (8 * n * S + 8 * ks))

    @_device
    def a_split(raw, ah, al, bh, bl):
        for m in range(MA):
            split(raw[4 * m], ah, al, 4 * m)
            split(raw[4 * m + 2], ah, al, 4 * m + 1)
            split(raw[4 * m + 1], ah, al, 4 * m + 2)
            split(raw[4 * m + 3], ah, al, 4 * m + 3)
        for n in range(2 * NA):
            split(raw[4 * MA + n], bh, bl, n)

    @_device
    def a_step(ta, raw, ah, al, bh, bl, sm, aa, ba, ks, chk):
        """One k-step of phase A: split the loaded operands, the mma, then load k-step ks + 1
        (if ``chk``, only where there is one)."""
        a_split(raw, ah, al, bh, bl)
        tc.mma3_tf32(ta, ah, al, bh, bl, MA, NA)
        if not chk or ks + 1 < KS:
            a_load(raw, sm, aa, ba, ks + 1)

    @_device
    def a_product(acc, ta, raw, ah, al, bh, bl, sm, aa, ba):
        """Sᵀ (dPᵀ) += K (V) Q_iᵀ (dO_iᵀ) over all d for the warp's tiles, summed in AK chunks of
        d / AK in zeroed registers ``ta`` (the tensor core's adds round toward zero; see phase B),
        the next k-step's operands loaded after this one's mma.  The addresses go through
        ``opaque_u32`` so that the compiler keeps one register each (plus immediate offsets)
        instead of hoisting every k-step's address out of the query-block loop."""
        aa = tc.opaque_u32(aa)
        ba = tc.opaque_u32(ba)
        a_load(raw, sm, aa, ba, 0)
        for ck in range(NCK):
            for x in range(NACC_A):
                ta[x] = 0.0
            if UNR_A:  # two k-steps an iteration, 32-bit counters; only the second checks for a next
                for k2 in range(int32(KS // AK // 2)):
                    k0 = ck * (KS // AK) + 2 * k2
                    a_step(ta, raw, ah, al, bh, bl, sm, aa, ba, k0, False)
                    a_step(ta, raw, ah, al, bh, bl, sm, aa, ba, k0 + 1, True)
            else:
                for kk in range(KS // AK):
                    a_step(ta, raw, ah, al, bh, bl, sm, aa, ba, ck * (KS // AK) + kk, True)
            for x in range(NACC_A):
                acc[x] += ta[x]

    @_device
    def c_load(raw, sm, fa, ba, ks, M, U, TILE):
        """Operands of k-step ks of phases B and C: raw[4m:4m+4] = a0..a3 of A tile m, read from
        fragment-order tiles at byte address ``fa`` (TILE bytes between the warp's m-tiles);
        raw[4M + 8u:+4] = b0 and raw[4M + 8u + 4:+4] = b1 of n-tiles 4u..4u+3, read down the
        columns of a row-major tile from ``ba`` (row t, column 4g of the warp's first group)."""
        for m in range(M):
            tc.lds128_f32_a(raw, 4 * m, sm, fa + m * TILE, 0)
        for u in range(U):
            tc.lds128_f32_a(raw, 4 * M + 8 * u, sm, ba + 4 * (8 * ks * S + 32 * u), 0)
            tc.lds128_f32_a(raw, 4 * M + 8 * u + 4, sm, ba + 4 * ((8 * ks + 4) * S + 32 * u), 0)

    @_device
    def c_split(raw, ah, al, bh, bl, M, U):
        for m in range(4 * M):
            split(raw[m], ah, al, m)
        for u in range(U):
            for j in range(4):
                split(raw[4 * M + 8 * u + j], bh, bl, 2 * (4 * u + j))
                split(raw[4 * M + 8 * u + 4 + j], bh, bl, 2 * (4 * u + j) + 1)

    @_device
    def c_step(acc, raw, ah, al, bh, bl, sm, fa, ba, NK, M, U, TILE, ks, chk):
        """One k-step of phases B and C: split, the mma, then load k-step ks + 1 (if ``chk``, only
        where there is one)."""
        c_split(raw, ah, al, bh, bl, M, U)
        tc.mma3_tf32(acc, ah, al, bh, bl, M, 4 * U)
        if not chk or ks + 1 < NK:
            c_load(raw, sm, fa + 512 * (ks + 1), ba, ks + 1, M, U, TILE)

    @_device
    def c_product(acc, raw, ah, al, bh, bl, sm, fa, ba, NK, M, U, TILE):
        """acc += A B over NK k-steps (512 bytes of fragments between k-steps of A)."""
        fa = tc.opaque_u32(fa)
        ba = tc.opaque_u32(ba)
        c_load(raw, sm, fa, ba, 0, M, U, TILE)
        if UNR:  # two k-steps an iteration (NK, Br or Bc over 8, is even)
            for k2 in range(int32(NK // 2)):
                c_step(acc, raw, ah, al, bh, bl, sm, fa, ba, NK, M, U, TILE, 2 * k2, False)
                c_step(acc, raw, ah, al, bh, bl, sm, fa, ba, NK, M, U, TILE, 2 * k2 + 1, True)
        else:
            for ks in range(NK):
                c_step(acc, raw, ah, al, bh, bl, sm, fa, ba, NK, M, U, TILE, ks, True)

    def bwd(q, k, v, do, lse, dvec, dq, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        sbase = tc.smem_u32_f32(sm)
        zero_pad(sm, sbase, tid)  # (visible after the first step's barrier)
        b, hk, nh, group, nq, nk, shift, c0, i0, nblk, total = start(sm, sbase, q, k, v, do, tid)
        tc.cp_async_commit()  # K_j, V_j and the first Q_i, dO_i: one group
        # Warp tiles: A keys kw.., queries qw..; B keys kb.., columns cb..; C queries qc.., columns cc..
        kw = 16 * MA * (warp % WA)
        qw = 8 * NA * (warp // WA)
        kb = 16 * MB * (warp % WB)
        cb = 32 * UB * (warp // WB)
        qc = 16 * MC * (warp % WC)
        cc = 32 * UC * (warp // WC)
        ka = sbase + 4 * (KOFF + (kw + g) * S + 2 * t)
        va = sbase + 4 * (VOFF + (kw + g) * S + 2 * t)
        qa = sbase + 4 * (QOFF + (qw + g) * S + 2 * t)
        oa = sbase + 4 * (OOFF + (qw + g) * S + 2 * t)
        lb = lane ^ ((lane >> 3) & 1) if SWZ else lane  # the lane's chunk of a Pᵀ, dSᵀ tile
        lc = lane ^ (((lane >> 3) & 1) << 2) if SWZ else lane  # of a dS tile
        pfa = sbase + 4 * (PF + (kb // 16) * (BR // 8) * 128 + 4 * lb)
        tfa = sbase + 4 * (TF + (kb // 16) * (BR // 8) * 128 + 4 * lb)
        sfa = sbase + 4 * (SF + (qc // 16) * (BC // 8) * 128 + 4 * lc)
        ob = sbase + 4 * (OOFF + t * S + cb + 4 * g)
        qb = sbase + 4 * (QOFF + t * S + cb + 4 * g)
        kc = sbase + 4 * (KOFF + t * S + cc + 4 * g)
        acck = cuda.local.array(NACC_B, float32)
        accv = cuda.local.array(NACC_B, float32)
        acb = cuda.local.array(NACC_B, float32)
        for x in range(NACC_B):
            acck[x] = 0.0
            accv[x] = 0.0
        s = cuda.local.array(NACC_A, float32)
        dp = cuda.local.array(NACC_A, float32)
        ta = cuda.local.array(NACC_A, float32)
        acq = cuda.local.array(NACC_C, float32)
        ah = cuda.local.array(NFA, float32)
        al = cuda.local.array(NFA, float32)
        bh = cuda.local.array(NFB, float32)
        bl = cuda.local.array(NFB, float32)
        raw = cuda.local.array(NRAW, float32)
        lr = cuda.local.array(NQA, float32)
        dr = cuda.local.array(NQA, float32)
        pe = cuda.local.array(4, float32)
        de = cuda.local.array(4, float32)
        for it in range(total):
            hq = hk * group + it // nblk
            r0 = (i0 + it % nblk) * BR
            for n in range(NA):
                for f in range(2):
                    row = r0 + qw + 8 * n + 2 * t + f
                    lr[2 * n + f] = lse_log2(lse, b, hq, row, nq)
                    dr[2 * n + f] = dvec[b, hq, row] if row < nq else float32(0.0)
            for x in range(NACC_A):
                s[x] = 0.0
                dp[x] = 0.0
            tc.cp_async_wait(0)
            cuda.syncthreads()  # Q_i, dO_i landed; every warp is done with the last dS
            a_product(dp, ta, raw, ah, al, bh, bl, sm, va, oa)
            a_product(s, ta, raw, ah, al, bh, bl, sm, ka, qa)
            # Pᵀ, dSᵀ (fragment order for phase B) and dS (for phase C) of the warp's entries.
            edge = c0 + BC > nk or (CAUSAL and c0 + BC - 1 > r0 + shift)
            for m in range(MA):
                for n in range(NA):
                    for e in range(4):
                        x = 4 * (m * NA + n) + e
                        kl = kw + 16 * m + g + 8 * (e >> 1)  # key in the block
                        cq = 2 * t + (e & 1)  # query in the 8-query tile
                        ql = qw + 8 * n + cq  # query in the block
                        p = tc.ex2(s[x] * sl2 - lr[2 * n + (e & 1)])
                        if edge:
                            if c0 + kl >= nk or (CAUSAL and c0 + kl > r0 + ql + shift):
                                p = float32(0.0)
                        ds = (p * scale) * (dp[x] - dr[2 * n + (e & 1)])
                        # Pᵀ tile (key // 16, query // 8): lane 4·(row % 8) + col % 4, register
                        # row // 8 + 2·(col // 4), with row = key % 16, col = query % 8.
                        if SWZ:
                            pe[e] = p  # stored below, e and e + 2 (rows g, g + 8) by one STS.64
                            de[e] = ds
                        else:
                            fo = (((kw // 16 + m) * (BR // 8) + qw // 8 + n) * 128
                                  + 4 * (4 * g + (cq & 3)) + (e >> 1) + 2 * (cq >> 2))
                            tc.sts32_f32_a(sm, sbase, PF + fo, p)
                            tc.sts32_f32_a(sm, sbase, TF + fo, ds)
                        # dS tile (query // 16, key // 8): row = query % 16, col = key % 8 = g.
                        rq = ql & 15
                        lq = 4 * (rq & 7) + (g & 3)
                        if SWZ:
                            lq ^= ((lq >> 3) & 1) << 2
                        so = ((ql >> 4) * (BC // 8) + (kl >> 3)) * 128 + 4 * lq + (rq >> 3) + 2 * (g >> 2)
                        tc.sts32_f32_a(sm, sbase, SF + so, ds)
                    if SWZ:
                        for e1 in range(2):
                            cq = 2 * t + e1
                            lp = 4 * g + (cq & 3)
                            lp ^= (lp >> 3) & 1
                            fo = ((kw // 16 + m) * (BR // 8) + qw // 8 + n) * 128 + 4 * lp + 2 * (cq >> 2)
                            tc.sts64_f32_a(sm, sbase + 4 * (PF + fo), pe[e1], pe[e1 + 2])
                            tc.sts64_f32_a(sm, sbase + 4 * (TF + fo), de[e1], de[e1 + 2])
            cuda.syncthreads()  # Pᵀ, dSᵀ, dS visible
            # The tensor core adds into its accumulator rounding toward zero, a bias that grows with
            # the number of adds: each query block's part of dV and dK is summed in zeroed
            # registers (3·Br/8 adds) and then added to the running sums with round-to-nearest.
            for x in range(NACC_B):
                acb[x] = 0.0
            c_product(acb, raw, ah, al, bh, bl, sm, pfa, ob, QS, MB, UB, 512 * (BR // 8))
            for x in range(NACC_B):
                accv[x] += acb[x]
                acb[x] = 0.0
            c_product(acb, raw, ah, al, bh, bl, sm, tfa, qb, QS, MB, UB, 512 * (BR // 8))
            for x in range(NACC_B):
                acck[x] += acb[x]
            cuda.syncthreads()  # every warp is done with Q_i, dO_i
            if it + 1 < total:
                load_step(sm, sbase, q, do, b, hk, nh, group, nq, i0, nblk, it + 1, tid)
            tc.cp_async_commit()  # Q_{i+1}, dO_{i+1} land while dQ_i is computed
            for x in range(NACC_C):
                acq[x] = 0.0
            c_product(acq, raw, ah, al, bh, bl, sm, sfa, kc, ES, MC, UC, 512 * (BC // 8))
            # dQ rows qc + 16m + g (+8): columns cc + 32u + 8t + j (register e = 0 or 2 of n-tile
            # 4u + j) and + 4 + j (e = 1 or 3).
            qrow = (b * nh + hq) * nq
            for m in range(MC):
                for h in range(2):
                    row = r0 + qc + 16 * m + g + 8 * h
                    if row < nq:
                        for u in range(UC):
                            x = 16 * (m * UC + u)
                            col = cc + 32 * u + 8 * t  # and col + 4 (past D where D % 8 == 4)
                            off = (qrow + row) * D + col
                            if PADC == 0 or col < D:
                                tc.red_v4(dq, off, acq[x + 2 * h], acq[x + 4 + 2 * h], acq[x + 8 + 2 * h],
                                          acq[x + 12 + 2 * h])
                            if PADC == 0 or col + 4 < D:
                                tc.red_v4(dq, off + 4, acq[x + 2 * h + 1], acq[x + 5 + 2 * h], acq[x + 9 + 2 * h],
                                          acq[x + 13 + 2 * h])
        tc.cp_async_wait(0)
        # dK (τ is in dSᵀ) and dV from registers, with phase C's column mapping.
        for m in range(MB):
            for h in range(2):
                key = c0 + kb + 16 * m + g + 8 * h
                if key < nk:
                    for u in range(UB):
                        for jj in range(4):
                            for f in range(2):
                                x = 16 * (m * UB + u) + 4 * jj + 2 * h + f
                                col = cb + 32 * u + 8 * t + 4 * f + jj
                                if PADC == 0 or col < D:
                                    dk[b, hk, key, col] = acck[x]
                                    dv[b, hk, key, col] = accv[x]

    return bwd, NT, BC


@cache
def kernel_v2(d: int, causal: bool, bc: int, br: int, nw: int, minb: int = 1, ak: int = 1, swz: bool = False,
              unr: bool = False):
    """The compiled kernel and its threads per block."""
    fn, nt, _ = _source_v2(d, bc, br, nw, causal, ak, bool(swz), bool(unr))
    return tc.jit_kernel(fn, nt, minb), nt


def default_config_v2(d: int) -> dict:
    """Bc keys per block, Br queries per step, nw warps, blocks per SM promised to ptxas: 64 x 64
    with eight warps where they tile all three products (d = 64, 128), else 32 x 32 with two;
    phase A summed in chunks of 32 dims (ak = d / 32: 12 tensor-core adds a chunk); the product
    loops two k-steps an iteration (unr: the same mma in the same order, with half the loop
    counting and load checks; 1.03-1.07x on the H200, kernels/data/bwd_fp32_v2_unr_h200_250bb44).
    A prefetch of the next k-step's operands and Sᵀ, dPᵀ in one loop were options until 0f39089
    (NOTES.md): both were slower on the H100."""
    ak = padded_dim_v2(d) // 32
    for bc, br, nw in ((64, 64, 8), (32, 32, 2)):
        try:
            tiling_v2(d, bc, br, nw)
        except ValueError:
            continue
        return dict(bc=bc, br=br, nw=nw, minb=1, ak=ak, swz=True, unr=True)
    return dict(bc=64, br=64, nw=8, minb=1, ak=ak, swz=True, unr=True)


def supports_v2(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float32 and d % 4 == 0 and 4 <= d <= 128


def _check_v2(cfg, d):
    ks = padded_dim_v2(d) // 8
    if cfg["ak"] < 1 or ks % cfg["ak"]:
        raise ValueError(f"ak={cfg['ak']}: must divide the k-steps of d padded to 32, 64 or 128, {ks}")


def backward_v2(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp32 (B, H, N, d) inputs (d a multiple of 4 up to 128, computed padded
    to 32, 64 or 128: :func:`padded_dim_v2`), O and L from the forward; ``config`` overrides
    :func:`default_config`.  dQ is summed over key blocks by atomics, in no fixed order."""
    return launch_fp32_backward("bwd_fp32_v2 takes float32 with head_dim a multiple of 4 up to 128",
                                VERSIONS["bwd_fp32_v2"], q, k, v, o, lse, do, causal=causal, scale=scale,
                                config=config, check=_check_v2)


def _version(name, **fns):
    return SimpleNamespace(name=name, saved_forward=saved_forward, signature=signature,
                           SOURCES={"bwd": (fns["_source"], signature)}, **{k: v for k, v in fns.items()})


#: The versions by the names the records use (:func:`kernels.perf.variant`).
VERSIONS = {
    "bwd_fp32_v1": _version("bwd_fp32_v1", _source=_source_v1, smem_bytes=smem_bytes_v1, tiling=tiling_v1,
                            kernel=kernel_v1, default_config=default_config_v1, supports=supports_v1,
                            backward=prepared_backward("bwd_fp32_v1", backward_v1)),
    "bwd_fp32_v2": _version("bwd_fp32_v2", _source=_source_v2, smem_bytes=smem_bytes_v2, tiling=tiling_v2,
                            kernel=kernel_v2, default_config=default_config_v2, supports=supports_v2,
                            backward=prepared_backward("bwd_fp32_v2", backward_v2)),
}
