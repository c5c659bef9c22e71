"""Device code that more than one fast kernel uses, written once.

Every piece is a generator: called with the kernel's compile-time constants (tile rows, head dim,
row strides, warps), it returns ``tc.device_inline`` device functions, so the kernel compiles as
if the code were written out in it (constant trip counts, no call frames).

* Block set-up: :func:`query_block` (the forwards and bwd_fp16_v1's dQ kernel: one block per
  query block, longest first when causal, across heads in L2-sized sections with
  ``LPT_KV_BYTES``) and :func:`key_block` (the backwards' dK/dV kernels: one block per key
  block, walking the query blocks of every query head of the group).
* Scalars: :func:`lse_log2` (a row's L·log2e, +inf where the row sees no key, so P = 0 there).
* fp16 tiles (``fwd_fp16``, ``bwd_fp16``): :func:`f16_copy`, :func:`f16_chunks` (cp.async
  copies of a tile into shared memory, the copy of a finished tile out), :func:`f16_swizzled`
  (the same into the 128-byte swizzled layout of the warpgroup products), :func:`f16_zero_pad`,
  :func:`f16_frags`, :func:`f16_abt`, :func:`f16_ab` (the products on ``mma.sync``: A Bᵀ over d,
  A·B with B read transposed) and :func:`f16_pack` (accumulators to f16 pairs in shared memory);
  bf16 tiles too (the copies move bits; the products and the packing take ``BF16``).
* fp32 tiles (``fwd_fp32``, ``bwd_fp32``): :func:`f32_copier` (cp.async copies) and the FFMA
  micro-tile products :func:`ffma_abt`, :func:`ffma_ab` with their unrolling :func:`steps`.
"""

from __future__ import annotations

import math

from numba import cuda, float32

from flashsim.algorithms.fast import LPT_L2_BYTES

from ..flash2 import padded_head_dim
from . import tc
from ._launch import LOG2E

NEG_INF = float32(-math.inf)
POS_INF = float32(math.inf)
_device = tc.device_inline


@_device
def lse_log2(lse, b, h, row, nq):
    """L·log2e of query row ``row`` of head (b, h); +inf for a row that does not exist or sees no
    key (L = -inf), so that P = 2^(s·τlog2e − L·log2e) is 0 there."""
    lv = lse[b, h, row] if row < nq else NEG_INF
    return lv * float32(LOG2E) if lv != NEG_INF else POS_INF


# ---------------------------------------------------------------------------------------------
# Block set-up


def query_block(BR: int, BC: int, CAUSAL: bool, LPT_KV_BYTES: int = 0, LPT_L2: int = LPT_L2_BYTES):
    """``start(q, k)`` for a block of BR query rows (grid (Tr, B·H)): (i, b, h, hk, nq, nk, shift,
    r0, nblk), the block's index (launched longest first when causal: block x runs query block
    Tr - 1 - x), batch, head, kv head (grouped-query attention: nh / nhk query heads a kv head),
    lengths, the causal shift Nk - Nq (bottom-right alignment), first row, and the number of key
    blocks of BC keys it sees (causal: up to the one holding its last row's last visible key).

    With ``LPT_KV_BYTES`` (causal only: the bytes of one key's K and V rows) the grid runs
    longest first across heads too, in sections of G query heads whose K and V fit in
    ``LPT_L2`` bytes (by default FlashAttention's 50 MiB: ``flashsim.algorithms.fast.lpt_heads``,
    the same rule) (G = the largest power of 2 <= LPT_L2 // (Nk · LPT_KV_BYTES), at least 1,
    times the query heads a kv head): the block the hardware issues l-th (l = x + y·Tr) is in
    section s = l // (G·Tr) and takes, with g = min(G, B·H − s·G) heads in the section and
    w = l − s·G·Tr, query block Tr − 1 − w // g of head s·G + w % g.  Without it each head's
    blocks run longest first, but the last heads' longest blocks start in the last wave."""
    LPT = CAUSAL and LPT_KV_BYTES > 0

    @_device
    def start(q, k):
        nh = q.shape[1]
        nq = q.shape[2]
        nk = k.shape[2]
        if LPT:
            tr = cuda.gridDim.x
            nbh = cuda.gridDim.y
            fit = LPT_L2 // max(1, nk * LPT_KV_BYTES)
            big = 1
            while big * 2 <= fit:
                big *= 2
            big *= nh // k.shape[1]
            lin = cuda.blockIdx.x + cuda.blockIdx.y * tr
            sec = lin // (big * tr)
            g = min(big, nbh - sec * big)
            w = lin - sec * big * tr
            x = w // g
            bh = sec * big + w - x * g
            i = tr - 1 - x
        else:
            i = cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x
            bh = cuda.blockIdx.y
        b = bh // nh
        h = bh % nh
        hk = h // (nh // k.shape[1])
        shift = nk - nq
        r0 = i * BR
        tcount = (nk + BC - 1) // BC
        nblk = tcount
        if CAUSAL:
            nblk = min(tcount, max(0, (min(r0 + BR, nq) - 1 + shift + BC) // BC))
        return i, b, h, hk, nq, nk, shift, r0, nblk

    return start


def key_block(BK: int, BQ: int, CAUSAL: bool, LONGEST_FIRST: bool = False):
    """``start(q, k)`` for a block of BK keys (grid (Tc, B·Hkv)): (b, hk, nh, group, nq, nk, shift,
    c0, i0, nblk, total): batch, kv head, query heads and heads a kv head, lengths, Nk - Nq, the
    first key, the first query block that sees it (causal rows r see keys <= r + shift, so the
    first is the one holding row c0 - shift), the query blocks a head has from there, and the
    steps of the walk (every query head of the group, each over its nblk blocks).

    Block (x, y) takes key block x of kv head y; with ``LONGEST_FIRST`` (causal only) the block
    that the hardware issues l-th (l = x + y·Tc, x fastest) takes key block l // (B·Hkv) of kv
    head l % (B·Hkv): every head's first key block, which sees the most query blocks, before any
    head's second, so that the longest blocks start in the first wave, not the last."""
    HEADS_FIRST = CAUSAL and LONGEST_FIRST

    @_device
    def start(q, k):
        if HEADS_FIRST:
            nbh = cuda.gridDim.y
            lin = cuda.blockIdx.x + cuda.blockIdx.y * cuda.gridDim.x
            kb = lin // nbh
            bk = lin - kb * nbh
        else:
            kb = cuda.blockIdx.x
            bk = cuda.blockIdx.y
        nhk = k.shape[1]
        b = bk // nhk
        hk = bk % nhk
        nh = q.shape[1]
        group = nh // nhk
        nq = q.shape[2]
        nk = k.shape[2]
        shift = nk - nq
        c0 = kb * BK
        tr = (nq + BQ - 1) // BQ
        i0 = 0
        if CAUSAL:
            i0 = max(0, c0 - shift) // BQ
        nblk = max(0, tr - i0)  # (c0 < nk: the grid has ceil(Nk / BK) blocks)
        return b, hk, nh, group, nq, nk, shift, c0, i0, nblk, group * nblk

    return start


@_device
def next_step(ib, hb, nblk):
    """(ib, hb) of the walk's next step: query block i0 + ib of query head hk·group + hb, the
    blocks of a head first (:func:`key_block`).  Carried from step to step by the loops, since
    ``it % nblk`` and ``it // nblk`` divide by a run-time value: a 64-bit division routine."""
    ib1 = ib + 1
    hb1 = hb
    if ib1 == nblk:
        ib1 = 0
        hb1 = hb + 1
    return ib1, hb1


# ---------------------------------------------------------------------------------------------
# fp16 tiles: rows of D halves in shared memory with row stride S (halves), 16-byte chunks.


def f16_copy(ROWS: int, D: int, S: int, NT: int):
    """(load, load2, store, store2): the copies of a ROWS x D f16 tile by NT threads, 16 bytes (8
    halves) a copy.  ``load(sm, sbase, so, x, g0, r0, n, tid)``: rows r0.. of ``x`` (a head's rows
    from flat element offset g0) to shared element offset ``so`` by cp.async; rows past ``n``
    zero-filled (their source is row 0, of which nothing is read).  ``load2`` does the same for
    two arrays with the same offsets (K and V, or Q and dO) into ``so1``, ``so2``.
    ``store(x, g0, r0, n, sm, sbase, so, tid)``: the tile back to rows r0.. (< n) of ``x``;
    ``store2`` for two."""
    CH = D // 8  # 16-byte chunks a row

    @_device
    def load(sm, sbase, so, x, g0, r0, n, tid):
        for e in range(tid, ROWS * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            ok = r0 + r < n
            tc.cp_async16_a(sm, sbase, so + r * S + c, x, g0 + (r0 + r if ok else 0) * D + c, 8 if ok else 0)

    @_device
    def load2(sm, sbase, so1, so2, x1, x2, g0, r0, n, tid):
        for e in range(tid, ROWS * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            ok = r0 + r < n
            goff = g0 + (r0 + r if ok else 0) * D + c
            tc.cp_async16_a(sm, sbase, so1 + r * S + c, x1, goff, 8 if ok else 0)
            tc.cp_async16_a(sm, sbase, so2 + r * S + c, x2, goff, 8 if ok else 0)

    @_device
    def store(x, g0, r0, n, sm, sbase, so, tid):
        for e in range(tid, ROWS * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            if r0 + r < n:
                tc.st_global16_a(x, g0 + (r0 + r) * D + c, sm, sbase, so + r * S + c)

    @_device
    def store2(x1, x2, g0, r0, n, sm, sbase, so1, so2, tid):
        for e in range(tid, ROWS * CH, NT):
            r = e // CH
            c = (e % CH) * 8
            if r0 + r < n:
                tc.st_global16_a(x1, g0 + (r0 + r) * D + c, sm, sbase, so1 + r * S + c)
                tc.st_global16_a(x2, g0 + (r0 + r) * D + c, sm, sbase, so2 + r * S + c)

    return load, load2, store, store2


def f16_chunks(ROWS: int, D: int, S: int, NT: int, SWIZZLE: bool = False, SW: int = 128):
    """(CPT, chunks, load2c): the prefetch of a ROWS x D tile in a main loop, its per-thread
    offsets computed once.  ``chunks(crow, cgof, csof, tid)`` fills the kernel's arrays of CPT
    int32: the thread's chunk u is row crow[u], element offset cgof[u] in a tile in memory and
    csof[u] in shared memory (the same in every block); ``load2c(sm, sbase, so1, so2, x1, x2, g0,
    r0, n, crow, cgof, csof, tid)`` is :func:`f16_copy`'s ``load2`` through them.  ``SWIZZLE``: the
    shared offsets of :func:`f16_swizzled`'s layout with ``SW``-byte rows (S unused)."""
    CH = D // 8
    CPT = -(-ROWS * CH // NT)  # chunks a thread
    ALL = CPT * NT == ROWS * CH  # every thread has CPT chunks: no test
    if SWIZZLE:
        soff = f16_swizzled(ROWS, D, NT, SW)[0]
    else:
        @_device
        def soff(r, c):
            return r * S + c * 8

    @_device
    def chunks(crow, cgof, csof, tid):
        for u in range(CPT):
            e = tid + u * NT
            crow[u] = e // CH
            cgof[u] = (e // CH) * D + (e % CH) * 8
            csof[u] = soff(e // CH, e % CH)

    @_device
    def load2c(sm, sbase, so1, so2, x1, x2, g0, r0, n, crow, cgof, csof, tid):
        gr = g0 + r0 * D
        for u in range(CPT):
            if ALL or tid + u * NT < ROWS * CH:
                ok = r0 + crow[u] < n
                goff = gr + cgof[u] if ok else g0
                tc.cp_async16_a(sm, sbase, so1 + csof[u], x1, goff, 8 if ok else 0)
                tc.cp_async16_a(sm, sbase, so2 + csof[u], x2, goff, 8 if ok else 0)

    return CPT, chunks, load2c


def swizzled_offset(ROWS: int, SW: int = 128):
    """``soff(r, c)`` of :func:`f16_swizzled` as plain Python (the kernels compile it as a device
    function; ``analysis.copy_sectors`` calls it on the host): the element offset of 16-byte chunk
    c of row r in a tile of ROWS rows of SW-byte (128 or 64) swizzle atoms."""
    A = SW // 16  # 16-byte chunks a swizzled row
    if SW not in (64, 128):
        raise ValueError(f"{SW=}: 64 or 128")

    def soff(r, c):
        if A == 8:
            return (c // 8) * (ROWS * 64) + r * 64 + ((c % 8) ^ (r % 8)) * 8
        return (c // 4) * (ROWS * 32) + r * 32 + ((c % 4) ^ ((r // 2) % 4)) * 8

    return soff


def f16_swizzled(ROWS: int, D: int, NT: int, SW: int = 128):
    """(soff, load): the copies of a ROWS x D f16 tile into the swizzled layout that ``wgmma``
    reads (``tc.wgmma_ss``, ``tc.wgmma_rs``), rows of SW = 128 bytes (or 64): column block c // A
    of A = SW / 16 chunks (64 halves, or 32) is an atom of ROWS rows of SW bytes, and 16-byte chunk
    c % A of row r sits at chunk (c % A) ^ (r % 8) of it (128-byte rows) or (c % A) ^ (r // 2 % 4)
    (64-byte rows: the 16-byte chunk bits XORed with the address bits above a row), so the lanes
    that copy a row write distinct bank groups and the tile needs no padding; the last atom may
    hold fewer than A chunks of a row (D not a multiple of 8·A).  ``soff(r, c)``: the chunk's
    element offset; ``load(sm, sbase, so, x, g0, r0, n, tid)`` as :func:`f16_copy`'s (a main loop's
    prefetch: :func:`f16_chunks` with ``SWIZZLE``)."""
    CH = D // 8
    soff = _device(swizzled_offset(ROWS, SW))

    @_device
    def load(sm, sbase, so, x, g0, r0, n, tid):
        for e in range(tid, ROWS * CH, NT):
            r = e // CH
            ok = r0 + r < n
            tc.cp_async16_a(sm, sbase, so + soff(r, e % CH), x, g0 + (r0 + r if ok else 0) * D + (e % CH) * 8,
                            8 if ok else 0)

    return soff, load


def f16_zero_pad(ROWS: int, D: int, S: int, NT: int):
    """``zero_pad(sm, tid)``: zero columns D.. of the first ROWS rows of shared memory (row stride
    S) where d is padded to a multiple of 16 (the ldmatrix k-steps read them; no copy writes
    them)."""
    P = padded_head_dim(D) - D

    @_device
    def zero_pad(sm, tid):
        if P:
            for e in range(tid, ROWS * P, NT):
                sm[(e // P) * S + D + e % P] = 0.0

    return zero_pad


def f16_frags(MT: int, NW: int, KT: int, S: int):
    """(frags, frags_all): a warp's A fragments of its MT m-tiles (rows 16·(NW·mt + warp) of the
    tile at shared element offset ``off``, 16 rows each) by ``ldmatrix.x4``.
    ``frags(fr, sm, sbase, loff, off, warp, kk)`` loads k-step kk into fr[4mt:4mt+4];
    ``frags_all(...)`` every one of the KT k-steps, into fr[4(mt·KT + kk):+4] (held in registers)."""

    @_device
    def frags(fr, sm, sbase, loff, off, warp, kk):
        for mt in range(MT):
            tc.ldsm_x4(fr, 4 * mt, sm, tc.tile_addr(sbase, loff, off, S, 16 * (NW * mt + warp), 16 * kk), S)

    @_device
    def frags_all(fr, sm, sbase, loff, off, warp):
        for mt in range(MT):
            for kk in range(KT):
                tc.ldsm_x4(fr, 4 * (mt * KT + kk), sm,
                           tc.tile_addr(sbase, loff, off, S, 16 * (NW * mt + warp), 16 * kk), S)

    return frags, frags_all


def _mma_pair_of(MMA, MMA_Z):
    @_device
    def mma_pair(c, x, a, ai, fb, first):
        """c[x:x+4], c[x+4:x+8] (+)= A·B for the two n-tiles of one ``ldmatrix.x4`` of B (fb[0:2],
        then fb[2:4]): the zero-accumulator ``mma`` on a product's first k-step (``first``, a
        constant)."""
        if first:
            MMA_Z(c, x, a, ai, fb[0], fb[1])
            MMA_Z(c, x + 4, a, ai, fb[2], fb[3])
        else:
            MMA(c, x, a, ai, fb[0], fb[1])
            MMA(c, x + 4, a, ai, fb[2], fb[3])

    return mma_pair


#: :func:`mma_pair` of fp16 and of bf16 fragments (``tc.ops``).
mma_pair = _mma_pair_of(tc.mma, tc.mma_z)
mma_pair_bf16 = _mma_pair_of(tc.mma_bf16, tc.mma_z_bf16)


def f16_abt(MT: int, NW: int, KT: int, NN: int, S: int, REG: bool, BF16: bool = False):
    """(abt, abt2): c = A Bᵀ over the KT k-steps of d on ``mma.sync`` m16n8k16.  A: the warp's MT
    m-tiles of the tile at ``off`` (fragments held in ``fa`` for every k-step when REG, else
    loaded into it a k-step at a time: :func:`f16_frags`); B: NN n-tiles (8 rows each) of a tile
    stored [n, k] at ``boff``, one ``ldmatrix.x4`` a pair (``tc.ldsm_x4_b``: each mma's (b0, b1)
    in adjacent registers); c[4(mt·NN + n):+4].  ``abt2`` computes two such products (A2, B2 at
    ``off2``, ``boff2``) in one k-loop, their loads and mma interleaved (bwd_fp16_v1's Sᵀ and
    dPᵀ, or S and dP).  ``BF16``: bf16 fragments (the tiles hold bf16 bits)."""
    frags, _ = f16_frags(MT, NW, KT, S)
    pair = mma_pair_bf16 if BF16 else mma_pair

    @_device
    def abt(c, fa, fb, sm, sbase, loff, loffb, off, boff, warp):
        for kk in range(KT):
            if not REG:
                frags(fa, sm, sbase, loff, off, warp, kk)
            for n2 in range(NN // 2):
                tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, boff, S, 16 * n2, 16 * kk), S)
                for mt in range(MT):
                    pair(c, 4 * (mt * NN + 2 * n2), fa, 4 * (mt * KT + kk) if REG else 4 * mt, fb, kk == 0)

    @_device
    def abt2(c, c2, fa, fa2, fb, sm, sbase, loff, loffb, off, off2, boff, boff2, warp):
        for kk in range(KT):
            if not REG:
                frags(fa, sm, sbase, loff, off, warp, kk)
                frags(fa2, sm, sbase, loff, off2, warp, kk)
            for n2 in range(NN // 2):
                tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, boff, S, 16 * n2, 16 * kk), S)
                for mt in range(MT):
                    pair(c, 4 * (mt * NN + 2 * n2), fa, 4 * (mt * KT + kk) if REG else 4 * mt, fb, kk == 0)
                tc.ldsm_x4_b(fb, 0, sm, tc.tile_addr(sbase, loffb, boff2, S, 16 * n2, 16 * kk), S)
                for mt in range(MT):
                    pair(c2, 4 * (mt * NN + 2 * n2), fa2, 4 * (mt * KT + kk) if REG else 4 * mt, fb, kk == 0)

    return abt, abt2


def f16_ab(MT: int, KS: int, NN: int, S: int, BF16: bool = False):
    """``ab(acc, pa, fb, sm, sbase, loff, boff)``: acc += P B over KS k-steps of 16, P the warp's A
    fragments in registers (pa[4(mt·KS + kk):+4], as the C layout of a product packed to f16
    gives them: P·V, Pᵀ·dO, dS·K), B a tile stored [k, n] at ``boff`` read with transposed
    loads, NN n-tiles of 8 (acc[4(mt·NN + n):+4]).  ``BF16``: bf16 fragments."""
    MMA = tc.ops(BF16)[0]

    @_device
    def ab(acc, pa, fb, sm, sbase, loff, boff):
        for kk in range(KS):
            for n2 in range(NN // 2):
                tc.ldsm_x4_trans(fb, 0, sm, tc.tile_addr(sbase, loff, boff, S, 16 * kk, 16 * n2), S)
                for mt in range(MT):
                    MMA(acc, 4 * (mt * NN + 2 * n2), pa, 4 * (mt * KS + kk), fb[0], fb[1])
                    MMA(acc, 4 * (mt * NN + 2 * n2 + 1), pa, 4 * (mt * KS + kk), fb[2], fb[3])

    return ab


def f16_pack(NN: int, S: int, BF16: bool = False):
    """``pack(smw, w0, acc, x0, s0, s1)``: n-tiles x0/4 .. x0/4 + NN - 1 of a C-layout accumulator,
    rows g (times s0) and g + 8 (times s1), packed to f16 pairs into the 32-bit words of shared
    memory from word w0 (the lane's first pair: row g, column 2t) on, 8 halves an n-tile
    (``BF16``: bf16 pairs)."""
    PACK = tc.ops(BF16)[2]

    @_device
    def pack(smw, w0, acc, x0, s0, s1):
        for nt in range(NN):
            x = x0 + 4 * nt
            smw[w0 + 4 * nt] = PACK(acc[x] * s0, acc[x + 1] * s0)
            smw[w0 + 4 * nt + 4 * S] = PACK(acc[x + 2] * s1, acc[x + 3] * s1)

    return pack


# ---------------------------------------------------------------------------------------------
# fp32 tiles: rows of D floats in shared memory, addressed by byte addresses in the shared window
# (``tc.smem_u32_f32``), read by 16-byte ``ld.shared.v4`` (``tc.lds128_f32_a``).


def f32_copier(NROWS: int, NT: int, D: int, SROW: int, ROWSTEP: bool = True):
    """``copy(sm, sa0, g, g0, left, tid)``: an NROWS x D fp32 tile from ``g`` (its rows from flat
    element offset g0, of which ``left`` exist: the rest are zero-filled) to shared byte address
    ``sa0`` with row stride SROW floats, 16 bytes a cp.async, chunk e = tid + u·NT at row e // CH.
    With ROWSTEP, where NT is a multiple of CH (a thread's chunks are then NT / CH rows apart in
    one column), the thread's row, column and addresses are computed once and a tile whose rows
    all exist is copied without a test per chunk (fwd_fp32); bwd_fp32 was measured without it."""
    CH = D // 4  # 16-byte chunks a row
    CP = -(-NROWS * CH // NT)
    RSTEP = NT // CH if ROWSTEP and NT % CH == 0 else 0  # rows between a thread's chunks, if constant

    @_device
    def copy(sm, sa0, g, g0, left, tid):
        if RSTEP:
            ra = tid // CH
            ca = (tid % CH) * 4
            sa = sa0 + 4 * (ra * SROW + ca)
            ga = g0 + ra * D + ca
            la = left - ra
            if la > (CP - 1) * RSTEP:  # every row this thread copies exists
                for u in range(CP):
                    if NROWS % RSTEP == 0 or ra + u * RSTEP < NROWS:
                        tc.cp_async16_f32_a(sm, sa + 4 * u * RSTEP * SROW, g, ga + u * RSTEP * D, 4)
            else:
                for u in range(CP):
                    if NROWS % RSTEP == 0 or ra + u * RSTEP < NROWS:
                        ok = u * RSTEP < la
                        tc.cp_async16_f32_a(sm, sa + 4 * u * RSTEP * SROW, g, ga + u * RSTEP * D if ok else 0,
                                            4 if ok else 0)
        else:
            for u in range(CP):
                e = tid + u * NT
                if CP * NT == NROWS * CH or e < NROWS * CH:
                    r = e // CH
                    c = (e % CH) * 4
                    ok = r < left
                    tc.cp_async16_f32_a(sm, sa0 + 4 * (r * SROW + c), g, g0 + r * D + c if ok else 0,
                                        4 if ok else 0)

    return copy


def f32_storer(NROWS: int, NT: int, D: int, SROW: int):
    """``store(g, g0, left, sm, sa0, tid)``: the first ``left`` rows of an NROWS x D fp32 tile at
    shared byte address ``sa0`` (row stride SROW floats) to ``g`` from flat element offset g0,
    16 bytes a store, chunk e = tid + u·NT at row e // CH: a warp's store covers 512 contiguous
    bytes of a row (or whole rows), every sector whole."""
    CH = D // 4
    CP = -(-NROWS * CH // NT)

    @_device
    def store(g, g0, left, sm, sa0, tid):
        for u in range(CP):
            e = tid + u * NT
            if CP * NT == NROWS * CH or e < NROWS * CH:
                r = e // CH
                c = (e % CH) * 4
                if r < left:
                    tc.st_global16_f32_a(g, g0 + r * D + c, sm, sa0 + 4 * (r * SROW + c))

    return store


def _twice(step, n: int):
    @_device
    def block(acc, a, b, sm, aa, ba, k):
        step(acc, a, b, sm, aa, ba, k)
        step(acc, a, b, sm, aa, ba, k + n)

    return block


def steps(step, UNROLL: int, K0: int, K: int):
    """``run(acc, a, b, sm, aa, ba)``: ``step(acc, a, b, sm, aa, ba, k)`` for k = K0 .. K - 1,
    UNROLL (1, 2 or 4) steps a loop trip by nesting calls (LLVM does not unroll loops this
    large), the remainder one at a time."""
    block, n = step, 1
    while n < UNROLL:
        block, n = _twice(block, n), 2 * n
    NB = (K - K0) // UNROLL
    R = K0 + NB * UNROLL

    @_device
    def run(acc, a, b, sm, aa, ba):
        for kb in range(NB):
            block(acc, a, b, sm, aa, ba, K0 + kb * UNROLL)
        for k in range(R, K):
            step(acc, a, b, sm, aa, ba, k)

    return run


def ffma_abt(M: int, N: int, SA: int, SB: int, KC: int, UNROLL: int):
    """``abt(acc, af, bf, sm, aa, ba)``: acc[m·N + n] = Σ_k A_m[k]·B_n[k] over KC steps of 4 on
    FFMA, the thread's M rows of A at shared byte address aa + 4·SA·m and N rows of B at
    ba + 4·SB·n: per 4 dims M + N 16-byte loads (into af, bf) feed 4·M·N FFMA.  The first step
    sets acc (peeled), the rest run UNROLL a loop trip (:func:`steps`).  S = Q Kᵀ of fwd_fp32,
    Sᵀ = K Qᵀ and dPᵀ = V dOᵀ of bwd_fp32_v1."""

    @_device
    def step(acc, af, bf, sm, aa, ba, kc, first):
        for m in range(M):
            tc.lds128_f32_a(af, 4 * m, sm, aa, SA * m + 4 * kc)
        for n in range(N):
            tc.lds128_f32_a(bf, 4 * n, sm, ba, SB * n + 4 * kc)
        for m in range(M):
            for n in range(N):
                a_ = float32(0.0) if first else acc[m * N + n]
                for e in range(4):
                    a_ += af[4 * m + e] * bf[4 * n + e]
                acc[m * N + n] = a_

    @_device
    def add(acc, af, bf, sm, aa, ba, kc):
        step(acc, af, bf, sm, aa, ba, kc, False)

    rest = steps(add, UNROLL, 1, KC)

    @_device
    def abt(acc, af, bf, sm, aa, ba):
        step(acc, af, bf, sm, aa, ba, 0, True)
        rest(acc, af, bf, sm, aa, ba)

    return abt


def ffma_ab(M: int, U: int, SA: int, SB: int, PC: int, UNROLL: int):
    """``ab(acc, af, bf, sm, aa, ba)``: acc += A B over PC steps of 4 on FFMA: the thread's M rows of
    A at aa + 4·SA·m (4 consecutive k a load), B's rows k at ba + 4·SB·k, its columns 32u + (0..3)
    (u < U); acc[(m·U + u)·4 + f].  Per 4 k, M + 4·U loads feed 16·M·U FFMA.  O += P̃ V of
    fwd_fp32, dV += Pᵀ dO and dK += dSᵀ Q of bwd_fp32_v1."""

    @_device
    def step(acc, af, bf, sm, aa, ba, pc):
        for m in range(M):
            tc.lds128_f32_a(af, 4 * m, sm, aa, SA * m + 4 * pc)
        for e in range(4):
            for u in range(U):
                tc.lds128_f32_a(bf, 4 * u, sm, ba, (4 * pc + e) * SB + 32 * u)
            for m in range(M):
                for u in range(U):
                    for f in range(4):
                        acc[(m * U + u) * 4 + f] += af[4 * m + e] * bf[4 * u + f]

    return steps(step, UNROLL, 0, PC)
