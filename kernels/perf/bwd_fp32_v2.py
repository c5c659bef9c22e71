"""bwd_fp32_v2: FlashAttention-2 backward in fp32 on the TF32 tensor cores, three products per
product (3xTF32), so that the gradients keep fp32's accuracy.

What changed from ``bwd_fp32_v1`` (the same one-kernel schedule, dQ by ``red.global.v4``, on
FFMA): every product runs as ``mma.m16n8k8`` with tf32 operands.  One tf32 product alone would
round each operand to 11 significant bits (relative error 2^-11, a thousand times fp32's), so
each operand x is split as x = hi + lo, hi = x rounded to tf32, lo = x − hi (exact in fp32), and

    A·B ≈ A_lo·B_hi + A_hi·B_lo + A_hi·B_hi        (A_lo·B_lo < 2^-22 of A·B is dropped)

with every term accumulated in the mma's fp32 registers, small terms first.  What is left of
each operand is below 2^-21 of it, against 2^-24 for fp32's own rounding of the inputs: a dot
product of length k then carries ~2^-21/√k of random error, below the √k·2^-24 that fp32
accumulation itself adds at k = 64-128.  The tests hold it to the same 2e-6 as v1.

Why.  On FFMA, bwd_fp32_v1 runs its five products at ~66% of cuBLAS's SGEMM rate, which beats
torch's naive fp32 backward at d = 64 (1.12x on the H100) but not at d = 128 (0.78x), where
naive's four SGEMMs are large and efficient.  TF32 mma.sync issues 2,048 flop where an FFMA
issues 64, so three of them per product still leave the tensor cores ~10x the FFMA peak per
issue slot; what they cost instead is the split (2 instructions an operand element) and
shared-memory bandwidth (fp32 fragments, twice fp16's bytes).

Layout.  K_j, V_j, Q_i, dO_i row-major in shared memory with row stride d + 8 floats (≡ 8 mod
32 banks).  Phase A (Sᵀ = K Q_iᵀ, dPᵀ = V dO_iᵀ, reduction over d) reads both operands along
their rows: the k index is permuted so that a lane's two k's (t, t + 4 of the fragment) are the
adjacent columns 2t, 2t + 1, one ``ld.shared.v2`` (b0, b1; a0, a2; a1, a3), conflict-free with
that stride.  Phases B (dV += Pᵀ dO_i, dK += dSᵀ Q_i, reduction over queries) and C (dQ_i =
dS K_j, over keys) read dO, Q and K down their columns as B operands: there the n index is
permuted instead, n-tile j of a 32-column group taking columns 4n + j, so one
``ld.shared.v4`` gives a lane b0 (or b1) of four n-tiles, again conflict-free; the
accumulators then hold 8 adjacent columns of a row (8t .. 8t + 7) per group.  Pᵀ, dSᵀ (A of
phase B) and dS (A of phase C) are written by phase A straight in fragment order, 16 x 8 tiles
of 32 lanes x 4 registers, so that phases B and C read an A fragment with one ``ld.shared.v4``.

Each product's warp tiles (16·m rows x 8·n or 32·u columns) are chosen by :func:`tiling` for
the fewest shared-memory bytes per mma.  Barriers and the overlap of Q_{i+1}, dO_{i+1}'s copy
with dQ_i are v1's; masking, GQA, causal (bottom-right aligned) and rows with L = -inf too.
Shared memory at d = 128 (Bc = Br = 64): 188 KB, one block of 8 warps per SM; 253 registers,
no spills (``kernels.perf.inspect bwd_fp32_v2 128 64 64 8 0 0 0 4``).

Accumulation.  The tensor core's adds into its fp32 accumulator behave as if rounded toward
zero, so a long chain of mma into one accumulator drifts one way: the first build, with dV and dK
accumulated over all N/8 · 3 mma, was off by 3.1e-5 at N = 4,096.  So every product is summed in
chunks in zeroed registers and the chunks are added in fp32 (round to nearest): dV, dK per query
block (3·Br/8 = 24 mma), dQ per key block (then ``red.global``), Sᵀ and dPᵀ every 32 dims
(``ak`` = d / 32 chunks, 12 mma each).

Prediction (H100, d = 128, N = 4,096, B·H = 64; naive 43 TFLOP/s, bwd_fp32_v1 34): per 64 x 64
block step a warp issues 960 mma, ~1,500 split instructions and ~290 shared loads; the tensor
pipe needs ~7.7k cycles a step, the issue ~6.5k, shared memory ~6k: a bound near 100 TFLOP/s, so
at 40-50% of it 45-60 TFLOP/s, 1.0-1.4x naive.

Measured (H100, ``kernels.bench``, naive timed in the same run, ``kernels/data/bench_h100.csv``,
fp32 backward rows at commit d58f3a9; FLOPs 2.5 x 4·B·H·N²·d):

* **d = 128: 44.0 TFLOP/s at N = 4,096 (1.01x naive), 45.4 at 8,192 (1.03x), 46.4 at 16,384
  (naive out of memory); bwd_fp32_v1 in the same run 33.5-34.7 (0.77x).**  Causal 2.3-2.4x.
* d = 64: 37.5-39.5 TFLOP/s, 1.21-1.24x naive (v1 1.12-1.13x); causal 2.9-3.3x.
* Worst relative error of dQ, dK, dV against float64 autograd: 9.6e-7 to 1.2e-6 at N = 4,096 to
  16,384, against 1.3e-6 to 3.1e-6 for v1's FFMA in the same run.  ``FLASHSIM_GPU=1 pytest -m
  gpu`` 77 passed on the H100 with v2 as the fp32 backward (``kernels/data/h100_pytest_gpu.json``);
  compute-sanitizer memcheck 0 errors, racecheck 0 hazards.
* The prediction held at its low end.  What mattered, in order (``kernels.perf.tune``, one run
  each beside naive, NOTES.md has the table): the split as an integer add and mask (2
  instructions; ``cvt.rna.tf32.f32`` compiles to 5 on sm_90) took 0.95x to 1.07x; the chunked
  phase A (for the accuracy) cost back 4%; prefetching the next k-step's operands (``pipe``) and
  Sᵀ, dPᵀ in one loop (``fuse``) were 8-9% slower.  Nsight Compute (first build): issue slots 46%
  busy, 0.65 of 2 warps eligible a scheduler, the fragment-order shared stores 4-way conflicted.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, types

from . import tc
from ._launch import LOG2E
from ._launch import saved_forward as saved_forward  # the shipped forward (BEST) of the dtype

NEG_INF = float32(-math.inf)
POS_INF = float32(math.inf)
_device = tc.device_inline


# ---------------------------------------------------------------------------------------------
# Layout


def smem_bytes(d: int, bc: int, br: int) -> int:
    """K, V (Bc rows), Q, dO (Br rows) with row stride d + 8, and Pᵀ, dSᵀ, dS in fragment order."""
    return 4 * (2 * (bc + br) * (d + 8) + 3 * bc * br)


def _warp_grid(nw: int, rows: int, ur: int, cols: int, uc: int, cost, cap: int):
    """Split nw warps as wr x wc over a rows x cols tile in units ur x uc: the (wr, mr, mc) with
    integral warp tiles of mr x mc units (mr·mc <= cap) and the lowest ``cost(mr, mc)``."""
    best = None
    for wr in range(1, nw + 1):
        if nw % wr:
            continue
        wc = nw // wr
        if rows % (ur * wr) or cols % (uc * wc):
            continue
        mr, mc = rows // (ur * wr), cols // (uc * wc)
        if mr * mc > cap:
            continue
        c = cost(mr, mc)
        if best is None or c < best[0]:
            best = (c, wr, mr, mc)
    if best is None:
        raise ValueError(f"no tiling of a {rows} x {cols} tile by {nw=} warps (units {ur} x {uc}, at most {cap})")
    return best[1:]


def tiling(d: int, bc: int, br: int, nw: int) -> dict:
    """Warp grids and warp tiles of the three products (ValueError if the warps cannot tile them).

    A: Sᵀ, dPᵀ (bc x br): wa warps down the keys, tiles of 16·ma keys x 8·na queries;
    B: dV, dK (bc x d): wb down the keys, 16·mb keys x 32·ub columns;
    C: dQ (br x d): wc down the queries, 16·mc queries x 32·uc columns.
    Cost: floats a lane loads per mma (A fragments 4 floats an m-tile, B 2 an n-tile)."""
    wa, ma, na = _warp_grid(nw, bc, 16, br, 8, lambda m, n: (4 * m + 2 * n) / (m * n), 4)
    wb, mb, ub = _warp_grid(nw, bc, 16, d, 32, lambda m, u: (4 * m + 8 * u) / (4 * m * u), 2)
    wc, mc, uc = _warp_grid(nw, br, 16, d, 32, lambda m, u: (4 * m + 8 * u) / (4 * m * u), 2)
    return dict(wa=wa, ma=ma, na=na, wb=wb, mb=mb, ub=ub, wc=wc, mc=mc, uc=uc)


def _source(D: int, BC: int, BR: int, NW: int, CAUSAL: bool, PIPE: bool = False, FUSE: bool = False, AK: int = 1):
    S = D + 8
    t_ = tiling(D, BC, BR, NW)
    WA, MA, NA = t_["wa"], t_["ma"], t_["na"]
    WB, MB, UB = t_["wb"], t_["mb"], t_["ub"]
    WC, MC, UC = t_["wc"], t_["mc"], t_["uc"]
    NT = 32 * NW
    CH = D // 4  # 16-byte chunks per row of Q, K, V, dO
    KS, QS, ES = D // 8, BR // 8, BC // 8  # k-steps of phases A, B, C
    KOFF = 0
    VOFF = BC * S
    QOFF = 2 * BC * S
    OOFF = QOFF + BR * S
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
    NRAW2, NFA2, NFB2 = (4 * MA + 2 * NA, 4 * MA, 2 * NA) if FUSE else (1, 1, 1)  # fused phase A's second set
    assert BC % 16 == 0 and BR % 16 == 0 and D % 32 == 0 and 1 <= NW <= tc.MAX_WARPS and KS % AK == 0

    def copier(NROWS):
        """Copy an NROWS x D tile (global rows from element offset ``g0``, ``left`` of them real,
        the rest zero-filled) to shared byte address ``sa0``, row stride S, 16 bytes a cp.async."""
        CP = -(-NROWS * CH // NT)

        @_device
        def copy(sm, sa0, g, g0, left, tid):
            for u in range(CP):
                e = tid + u * NT
                if CP * NT == NROWS * CH or e < NROWS * CH:
                    r = e // CH
                    c = (e % CH) * 4
                    ok = r < left
                    tc.cp_async16_f32_a(sm, sa0 + 4 * (r * S + c), g, g0 + r * D + c if ok else 0, 4 if ok else 0)

        return copy

    copy_k = copier(BC)
    copy_q = copier(BR)

    @_device
    def split(x, hi, lo, i):
        h = tc.tf32_hi(x)
        hi[i] = h
        lo[i] = x - h

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
    def a_product(acc, ta, raw, ah, al, bh, bl, sm, aa, ba):
        """Sᵀ (dPᵀ) += K (V) Q_iᵀ (dO_iᵀ) over all d for the warp's tiles, summed in AK chunks of
        d / AK in zeroed registers ``ta`` (the tensor core's adds round toward zero; see phase B);
        with PIPE the next k-step's operands are loaded while this one's mma run.  The addresses go through
        ``opaque_u32`` so that the compiler keeps one register each (plus immediate offsets)
        instead of hoisting every k-step's address out of the query-block loop."""
        aa = tc.opaque_u32(aa)
        ba = tc.opaque_u32(ba)
        a_load(raw, sm, aa, ba, 0)
        for ck in range(AK):
            for x in range(NACC_A):
                ta[x] = 0.0
            for kk in range(KS // AK):
                ks = ck * (KS // AK) + kk
                a_split(raw, ah, al, bh, bl)
                if PIPE and ks + 1 < KS:
                    a_load(raw, sm, aa, ba, ks + 1)
                tc.mma3_tf32(ta, ah, al, bh, bl, MA, NA)
                if not PIPE and ks + 1 < KS:
                    a_load(raw, sm, aa, ba, ks + 1)
            for x in range(NACC_A):
                acc[x] += ta[x]

    @_device
    def a_product2(acc, acc2, raw, raw2, ah, al, bh, bl, ah2, al2, bh2, bl2, sm, aa, ba, aa2, ba2):
        """Sᵀ and dPᵀ in the same k-loop: twice the independent mma between the loads."""
        aa = tc.opaque_u32(aa)
        ba = tc.opaque_u32(ba)
        aa2 = tc.opaque_u32(aa2)
        ba2 = tc.opaque_u32(ba2)
        a_load(raw, sm, aa, ba, 0)
        a_load(raw2, sm, aa2, ba2, 0)
        for ks in range(KS):
            a_split(raw, ah, al, bh, bl)
            a_split(raw2, ah2, al2, bh2, bl2)
            if ks + 1 < KS:
                a_load(raw, sm, aa, ba, ks + 1)
                a_load(raw2, sm, aa2, ba2, ks + 1)
            tc.mma3_tf32(acc, ah, al, bh, bl, MA, NA)
            tc.mma3_tf32(acc2, ah2, al2, bh2, bl2, MA, NA)

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
    def c_product(acc, raw, ah, al, bh, bl, sm, fa, ba, NK, M, U, TILE):
        """acc += A B over NK k-steps (512 bytes of fragments between k-steps of A)."""
        fa = tc.opaque_u32(fa)
        ba = tc.opaque_u32(ba)
        c_load(raw, sm, fa, ba, 0, M, U, TILE)
        for ks in range(NK):
            c_split(raw, ah, al, bh, bl, M, U)
            if PIPE and ks + 1 < NK:
                c_load(raw, sm, fa + 512 * (ks + 1), ba, ks + 1, M, U, TILE)
            tc.mma3_tf32(acc, ah, al, bh, bl, M, 4 * U)
            if not PIPE and ks + 1 < NK:
                c_load(raw, sm, fa + 512 * (ks + 1), ba, ks + 1, M, U, TILE)

    def bwd(q, k, v, do, lse, dvec, dq, dk, dv, sl2, scale):
        sm = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
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
        pfa = sbase + 4 * (PF + (kb // 16) * (BR // 8) * 128 + 4 * lane)
        tfa = sbase + 4 * (TF + (kb // 16) * (BR // 8) * 128 + 4 * lane)
        sfa = sbase + 4 * (SF + (qc // 16) * (BC // 8) * 128 + 4 * lane)
        ob = sbase + 4 * (OOFF + t * S + cb + 4 * g)
        qb = sbase + 4 * (QOFF + t * S + cb + 4 * g)
        kc = sbase + 4 * (KOFF + t * S + cc + 4 * g)
        tr = (nq + BR - 1) // BR
        i0 = 0
        if CAUSAL:
            i0 = max(0, c0 - shift) // BR
        nblk = max(0, tr - i0)
        total = group * nblk
        copy_k(sm, sbase + 4 * KOFF, k, kbase, nk - c0, tid)
        copy_k(sm, sbase + 4 * VOFF, v, kbase, nk - c0, tid)
        if total > 0:
            g0 = ((b * nh + hk * group) * nq + i0 * BR) * D
            copy_q(sm, sbase + 4 * QOFF, q, g0, nq - i0 * BR, tid)
            copy_q(sm, sbase + 4 * OOFF, do, g0, nq - i0 * BR, tid)
        tc.cp_async_commit()
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
        raw2 = cuda.local.array(NRAW2, float32)
        ah2 = cuda.local.array(NFA2, float32)
        al2 = cuda.local.array(NFA2, float32)
        bh2 = cuda.local.array(NFB2, float32)
        bl2 = cuda.local.array(NFB2, float32)
        lr = cuda.local.array(NQA, float32)
        dr = cuda.local.array(NQA, float32)
        for it in range(total):
            hq = hk * group + it // nblk
            r0 = (i0 + it % nblk) * BR
            for n in range(NA):
                for f in range(2):
                    row = r0 + qw + 8 * n + 2 * t + f
                    lv = lse[b, hq, row] if row < nq else NEG_INF
                    lr[2 * n + f] = lv * float32(LOG2E) if lv != NEG_INF else POS_INF
                    dr[2 * n + f] = dvec[b, hq, row] if row < nq else float32(0.0)
            for x in range(NACC_A):
                s[x] = 0.0
                dp[x] = 0.0
            tc.cp_async_wait(0)
            cuda.syncthreads()  # Q_i, dO_i landed; every warp is done with the last dS
            if FUSE:
                a_product2(dp, s, raw, raw2, ah, al, bh, bl, ah2, al2, bh2, bl2, sm, va, oa, ka, qa)
            else:
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
                        fo = (((kw // 16 + m) * (BR // 8) + qw // 8 + n) * 128
                              + 4 * (4 * g + (cq & 3)) + (e >> 1) + 2 * (cq >> 2))
                        tc.sts32_f32_a(sm, sbase, PF + fo, p)
                        tc.sts32_f32_a(sm, sbase, TF + fo, ds)
                        # dS tile (query // 16, key // 8): row = query % 16, col = key % 8 = g.
                        rq = ql & 15
                        so = (((ql >> 4) * (BC // 8) + (kl >> 3)) * 128
                              + 4 * (4 * (rq & 7) + (g & 3)) + (rq >> 3) + 2 * (g >> 2))
                        tc.sts32_f32_a(sm, sbase, SF + so, ds)
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
                hn = hk * group + (it + 1) // nblk
                rn = (i0 + (it + 1) % nblk) * BR
                g0 = ((b * nh + hn) * nq + rn) * D
                copy_q(sm, sbase + 4 * QOFF, q, g0, nq - rn, tid)
                copy_q(sm, sbase + 4 * OOFF, do, g0, nq - rn, tid)
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
                            off = (qrow + row) * D + cc + 32 * u + 8 * t
                            tc.red_v4(dq, off, acq[x + 2 * h], acq[x + 4 + 2 * h], acq[x + 8 + 2 * h],
                                      acq[x + 12 + 2 * h])
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
                                dk[b, hk, key, col] = acck[x]
                                dv[b, hk, key, col] = accv[x]

    return bwd, NT, BC


@cache
def kernel(d: int, causal: bool, bc: int, br: int, nw: int, minb: int = 1, pipe: bool = False, fuse: bool = False,
           ak: int = 1):
    """The compiled kernel and its threads per block."""
    fn, nt, _ = _source(d, bc, br, nw, causal, pipe, fuse, ak)
    return tc.jit_kernel(fn, nt, minb), nt


def signature():
    a4 = types.Array(float32, 4, "C")
    st = types.Array(float32, 3, "C")
    return types.void(a4, a4, a4, a4, st, st, a4, a4, a4, float32, float32)


#: name -> (source factory, signature) for kernels.perf.inspect.
SOURCES = {"bwd": (_source, signature)}


def default_config(d: int) -> dict:
    """Bc keys per block, Br queries per step, nw warps, blocks per SM promised to ptxas: 64 x 64
    with eight warps where they tile all three products (d = 64, 128), else 32 x 32 with two;
    phase A summed in chunks of 32 dims (ak = d / 32: 12 tensor-core adds a chunk); no prefetch
    of the next k-step's operands (pipe) and Sᵀ, dPᵀ in separate loops (fuse): both were slower
    on the H100 (module docstring)."""
    ak = max(1, d // 32)
    for bc, br, nw in ((64, 64, 8), (32, 32, 2)):
        try:
            tiling(d, bc, br, nw)
        except ValueError:
            continue
        return dict(bc=bc, br=br, nw=nw, minb=1, pipe=False, fuse=False, ak=ak)
    return dict(bc=64, br=64, nw=8, minb=1, pipe=False, fuse=False, ak=ak)


def supports(dtype, d: int) -> bool:
    return np.dtype(dtype) == np.float32 and d in (32, 64, 128)


def _check(cfg, d):
    if cfg["ak"] < 1 or (d // 8) % cfg["ak"]:
        raise ValueError(f"ak={cfg['ak']}: must divide d / 8 = {d // 8}")


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, **config):
    """(dQ, dK, dV) for fp32 (B, H, N, d) inputs (d = 32, 64 or 128), O and L from the
    forward; ``config`` overrides :func:`default_config`.  dQ is summed over key blocks by
    atomics, in no fixed order."""
    import sys

    from ._launch import launch_fp32_backward

    return launch_fp32_backward("bwd_fp32_v2 takes float32 with head_dim 32, 64 or 128",
                                sys.modules[__name__], q, k, v, o, lse, do, causal=causal, scale=scale,
                                config=config, check=_check)
