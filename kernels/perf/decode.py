"""The fast decode kernel (split-KV, paged, variable length, GQA-packed, windowed), v2.

Same schedule and combine as the readable kernel (``kernels/decode.py``, whose module docstring
states it), with the key block Bc = T (64 keys for 2-byte precisions, 32 for fp32, smaller where
the query rows need the room), and the work inside a block arranged for a memory-bound loop:

* grid (S, B·Hkv), 128 threads; the number of splits S, unless given, fills the GPU: about four
  thread blocks per SM (:func:`default_splits`), each split at least four key blocks long;
* K_T and V_T are loaded by all 128 threads from flat views of the caches, consecutive threads on
  consecutive elements of a row (a warp moves 64 contiguous bytes of fp16 per instruction: whole
  sectors); where d divides 128 each thread keeps one column and walks the rows, so the loads of
  a tile are unrolled with immediate offsets, 16 in flight per thread (sm_90 SASS, ptxas 13.0);
  into shared memory in the input precision, rows padded to an odd number of 4-byte words;
* τQ and S (then P̃) are kept transposed in shared memory, [x, row] and [key, row], 16-byte
  aligned, so that the RB query rows one thread works on are consecutive words (``LDS.128``);
* the products are register-blocked by RB query rows (the power of two >= g·Nq, at most 8): a
  thread takes (key c, RB rows) of S = Q Kᵀ and loads K[c, x] once for RB FMAs, and (dim x, the
  same rows) of P·V, loading V[c, x] once for RB FMAs; the padded rows (g·Nq rounded up to RB) are
  zeros, never written; the inner loops run on unsigned counters and flat arrays, which keeps
  Numba's negative-index wraparound out of them (about 1.5 instructions per FMA in the SASS at
  g = 8, d = 128, against 5.6 in v1);
* the online softmax is split into a per-row max, an exponent over all (row, key) pairs by all
  threads, and a per-row sum.

Prediction (not measured yet; ``python -m kernels.bench_decode`` measures it): at HBM speed an
H100 SM receives about 14.5 bytes a clock, 35 clocks for a key's 512 bytes of K and V (fp16,
d = 128), time for about 140 warp instructions.  Counted in the sm_90 SASS, a key costs about 55
of them at g·Nq = 1 (memory-bound: the target of 80% of a copy's bandwidth is in reach, if four
or five resident blocks keep enough loads in flight: the kernel does not overlap a block's tile
loads with its arithmetic) and about 125-140 at g·Nq = 8 (at the edge: expect 60-80%); the next
version for GQA packing would put the products on the tensor cores (``mma.m16n8k16``, 8 query
rows as the n = 8 side).

No warp shuffles (the kernel runs as is under the CUDA simulator).  bf16 as in the reference
kernel: int16 bits widened in the kernel.  v1 (2-D shared arrays with signed indices, Q and S
row-major, one element a thread per step of the tile load) is read at commit d983c1c.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from .. import decode as ref

NT = 128
U = uint64
#: Alignment (bytes) of the transposed Q and S arrays, so that a thread's RB consecutive words can
#: be read as vectors; none under the simulator (where kernels/_sim.py locks only unaligned arrays).
ALIGN = None if ref.SIM else 16
SMEM_LIMIT = ref.SMEM_LIMIT
NEG_INF = ref.NEG_INF
ZERO = ref.ZERO
#: Thread blocks per SM the default split count aims at.
BLOCKS_PER_SM = 4
#: Fewest key blocks a split gets from :func:`default_splits`.
MIN_BLOCKS_PER_SPLIT = 4


def _kstride(dt: str, d: int) -> int:
    """Row length of the K, V tiles in shared memory: an odd number of 4-byte words."""
    if ref._EB[dt] == 4:
        return d + (1 - d % 2)
    w = -(-d // 2)
    return 2 * (w + (1 - w % 2))


def row_block(rows: int) -> int:
    """Query rows per thread in the products: the power of two >= rows, at most 8."""
    rb = 1
    while rb < min(rows, 8):
        rb *= 2
    return rb


def rows_padded(rows: int) -> int:
    rb = row_block(rows)
    return -(-rows // rb) * rb


def smem_bytes(dt: str, d: int, rows: int, t: int, page_size: int) -> int:
    rp = rows_padded(rows)
    pages = t // page_size + 2 if page_size else 1
    return (ref._EB[dt] * 2 * t * _kstride(dt, d) + 4 * (rp * d + rp * (t + 1) + rp * d + 3 * rp + 4 * pages))


def tile_keys(dt: str, d: int, rows: int, page_size: int = 0) -> int | None:
    """The key tile T (= Bc) of the fast kernel, or None if even 16 keys do not fit 48 KB."""
    for t in ((64, 32, 16) if ref._EB[dt] == 2 else (32, 16)):
        if smem_bytes(dt, d, rows, t, page_size) <= SMEM_LIMIT:
            return t
    return None


def supports(dt: str, d: int, rows: int, page_size: int = 0) -> bool:
    return dt in ref.DTYPES and tile_keys(dt, d, rows, page_size) is not None


def sm_count() -> int:
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:  # the simulator has no such attribute
        return 132


def default_splits(batch: int, kv_heads: int, longest_blocks: int, sms: int | None = None) -> int:
    """Splits that give about BLOCKS_PER_SM thread blocks per SM, none shorter than
    MIN_BLOCKS_PER_SPLIT key blocks, at most ``ref.MAX_SPLITS``."""
    sms = sm_count() if sms is None else sms
    want = -(-BLOCKS_PER_SM * sms // max(1, batch * kv_heads))
    cap = max(1, longest_blocks // MIN_BLOCKS_PER_SPLIT)
    return int(max(1, min(want, cap, ref.MAX_SPLITS)))


def _source(dt, D, T, G, NQ, PAGED, SPLIT, WINDOW, CAUSAL, PSZ):
    ST = ref._ST[dt]
    LD = ref.loader(dt)
    CV = ref.storer(dt)
    ROWS = G * NQ
    RB = row_block(ROWS)  # rows per thread in the products
    RP = rows_padded(ROWS)
    RC = RP // RB  # row chunks
    KS = _kstride(dt, D)
    NKV, NQT, NPT = T * KS, D * RP, T * RP  # flat shared array sizes
    NPG = T // PSZ + 2 if PAGED else 1

    def decode_fast(q, k, v, bt, lens, o, lse, op, lp, scale, wl, wr, hkv, nkmax):
        # k, v: flat (1-D) views of the caches, (B, Hkv, nkmax, D) or (pages, PSZ, Hkv, D).
        s = cuda.blockIdx.x
        nsplit = cuda.gridDim.x
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        b = bh // hkv
        h = bh % hkv
        length = lens[b]
        lo = max(0, length - NQ - wl) if WINDOW and wl >= 0 else 0
        j0 = lo // T
        nblk = (length - 1) // T - j0 + 1
        bps = (nblk + nsplit - 1) // nsplit
        a = min(nblk, s * bps)
        e = min(nblk, (s + 1) * bps)
        # Flat shared arrays indexed by unsigned offsets (a signed index costs Numba's negative-
        # index wraparound on every access): K, V [c·KS + x]; τQ transposed [x·RP + r] and S, P̃
        # transposed [c·RP + r], so that the RB rows of one thread sit in consecutive words.
        sK = cuda.shared.array(NKV, ST)
        sV = cuda.shared.array(NKV, ST)
        sQT = cuda.shared.array(NQT, float32, alignment=ALIGN)
        sPT = cuda.shared.array(NPT, float32, alignment=ALIGN)
        sAcc = cuda.shared.array((RP, D), float32)
        sM = cuda.shared.array(RP, float32)
        sL = cuda.shared.array(RP, float32)
        sAlpha = cuda.shared.array(RP, float32)
        sPage = cuda.shared.array(NPG, int32)

        for x in range(tid, RP * D, NT):
            r = x // D
            c = x % D
            val = ZERO
            if r < ROWS and e > a:
                val = LD(q[b, h * G + r // NQ, r % NQ, c]) * scale
            sQT[U(c) * U(RP) + U(r)] = val
            sAcc[r, c] = ZERO
        for r in range(tid, RP, NT):
            sM[r] = NEG_INF
            sL[r] = ZERO
        for jj in range(a, e):
            c0 = (j0 + jj) * T
            cols = min(T, length - c0)
            if PAGED:
                p0 = c0 // PSZ
                npages = (c0 + cols - 1) // PSZ - p0 + 1
                for t in range(tid, npages, NT):
                    sPage[t] = bt[b, p0 + t]
                cuda.syncthreads()  # page numbers in before the gather
            # K_T, V_T: consecutive threads on consecutive elements of a row, from flat views of
            # the caches with unsigned offsets; where D divides the block, each thread keeps one
            # column and walks rows NT/D apart.
            if NT % D == 0:
                t = tid % D
                c = tid // D
                dst = U(c) * U(KS) + U(t)
                while c < cols:
                    jrow = c0 + c
                    if PAGED:
                        page = sPage[jrow // PSZ - p0]
                        src = ((U(page) * U(PSZ) + U(jrow % PSZ)) * U(hkv) + U(h)) * U(D) + U(t)
                    else:
                        src = ((U(b) * U(hkv) + U(h)) * U(nkmax) + U(jrow)) * U(D) + U(t)
                    sK[dst] = k[src]
                    sV[dst] = v[src]
                    c += NT // D
                    dst += U(NT // D) * U(KS)
            else:
                for x in range(tid, cols * D, NT):
                    c = x // D
                    t = x % D
                    jrow = c0 + c
                    if PAGED:
                        page = sPage[jrow // PSZ - p0]
                        src = ((U(page) * U(PSZ) + U(jrow % PSZ)) * U(hkv) + U(h)) * U(D) + U(t)
                    else:
                        src = ((U(b) * U(hkv) + U(h)) * U(nkmax) + U(jrow)) * U(D) + U(t)
                    dst = U(c) * U(KS) + U(t)
                    sK[dst] = k[src]
                    sV[dst] = v[src]
            cuda.syncthreads()  # tiles (and Q, the first time) in shared memory
            # S = (τQ) Kᵀ, RB rows per thread (K[c, x] loaded once for RB FMAs); -inf where masked
            # or past the cache.
            for it in range(tid, T * RC, NT):
                c = it % T
                r0 = (it // T) * RB
                acc = cuda.local.array(RB, float32)
                for i in range(RB):
                    acc[i] = ZERO
                if c < cols:
                    kb = U(c) * U(KS)
                    qb = U(r0)
                    t = U(0)
                    while t < U(D):  # (a while loop on an unsigned counter: the leanest loop code)
                        kx = LD(sK[kb + t])
                        for i in range(RB):
                            acc[i] += sQT[qb + U(i)] * kx
                        t += U(1)
                        qb += U(RP)
                j = c0 + c
                pb = U(c) * U(RP) + U(r0)
                for i in range(RB):
                    r = r0 + i
                    pos = length - NQ + r % NQ
                    ok = c < cols
                    if CAUSAL:
                        ok = ok and j <= pos
                    if WINDOW:
                        ok = ok and (wl < 0 or j >= pos - wl) and (wr < 0 or j <= pos + wr)
                    sPT[pb + U(i)] = acc[i] if ok else NEG_INF
            cuda.syncthreads()  # S complete
            for r in range(tid, RP, NT):
                m_old = sM[r]
                m_new = m_old
                for c in range(T):
                    sc = sPT[U(c) * U(RP) + U(r)]
                    if sc > m_new:
                        m_new = sc
                m_use = m_new if m_new != NEG_INF else ZERO
                sAlpha[r] = math.exp(m_old - m_use)
                sM[r] = m_new
            cuda.syncthreads()  # the new maxima are in
            for it in range(tid, T * RP, NT):
                m_new = sM[it % RP]
                sPT[U(it)] = math.exp(sPT[U(it)] - (m_new if m_new != NEG_INF else ZERO))
            cuda.syncthreads()  # P̃ complete
            for r in range(tid, RP, NT):
                lsum = ZERO
                for c in range(T):
                    lsum += sPT[U(c) * U(RP) + U(r)]
                sL[r] = sL[r] * sAlpha[r] + lsum
            # acc = α acc + P̃ V, RB rows per thread (V[c, x] loaded once for RB FMAs); reads P̃ and
            # α, not ℓ: no barrier after the sums
            for it in range(tid, D * RC, NT):
                t = it % D
                r0 = (it // D) * RB
                acc = cuda.local.array(RB, float32)
                for i in range(RB):
                    acc[i] = sAcc[r0 + i, t] * sAlpha[r0 + i]
                vb = U(t)
                pb = U(r0)
                c = U(0)
                while c < U(cols):
                    vx = LD(sV[vb])
                    for i in range(RB):
                        acc[i] += sPT[pb + U(i)] * vx
                    c += U(1)
                    vb += U(KS)
                    pb += U(RP)
                for i in range(RB):
                    sAcc[r0 + i, t] = acc[i]
            cuda.syncthreads()  # P̃, α, V_T, ℓ done with before the next tile
        cuda.syncthreads()
        for x in range(tid, ROWS * D, NT):
            r = x // D
            t = x % D
            l_r = sL[r]
            val = ZERO if l_r == ZERO else sAcc[r, t] / l_r
            if SPLIT:
                op[s, b, h * G + r // NQ, r % NQ, t] = val
            else:
                o[b, h * G + r // NQ, r % NQ, t] = CV(val)
        for r in range(tid, ROWS, NT):
            l_r = sL[r]
            val = NEG_INF if l_r == ZERO else sM[r] + math.log(l_r)
            if SPLIT:
                lp[s, b, h * G + r // NQ, r % NQ] = val
            else:
                lse[b, h * G + r // NQ, r % NQ] = val

    return decode_fast


@cache
def kernel(dt, d, t, g, nq, paged, split, window, causal, psz, min_blocks=0):
    """The compiled kernel; ``min_blocks`` > 0 asks ptxas for registers that let that many blocks
    share an SM (launch bounds; not under the simulator)."""
    fn = _source(dt, d, t, g, nq, paged, split, window, causal, psz)
    if ref.SIM or not min_blocks:
        return cuda.jit(fn)
    return cuda.jit(fn, launch_bounds=(NT, min_blocks))


def _outputs(p, num_splits, t):
    """What v2 and v3 share before their launch: the split count (given and checked, or
    :func:`default_splits` for T-key blocks) and the outputs: O, L and, with more than one split,
    the float32 partials Op, Lp (else 1-element placeholders the kernel never touches)."""
    if num_splits is None:
        longest = max(ref.visible_blocks(int(n), p.nq, t, p.left)[1] for n in p.lengths)
        splits = default_splits(p.b, p.hkv, longest)
    else:
        splits = ref.check_splits(p, num_splits, t)
    if p.b * p.hkv > 65535:
        raise ValueError(f"batch*kv_heads={p.b * p.hkv}: at most 65535")
    o = p.empty((p.b, p.hq, p.nq, p.d), p.dt)
    lse = p.empty((p.b, p.hq, p.nq), np.float32)
    if splits > 1:
        op, _ = p.empty((splits, p.b, p.hq, p.nq, p.d), np.float32)
        lp, _ = p.empty((splits, p.b, p.hq, p.nq), np.float32)
    else:
        op = cuda.device_array((1, 1, 1, 1, 1), np.float32, stream=p.stream)
        lp = cuda.device_array((1, 1, 1, 1), np.float32, stream=p.stream)
    return splits, (o, lse, op, lp)


def _launch(p, kern, kf, vf, splits, outs):
    """Launch a main kernel (grid: splits x B·Hkv) on the flat cache views ``kf``, ``vf``, then the
    reference combine when split; (O, L) in the caller's kind."""
    (o, o_res), (lse, lse_res), op, lp = outs
    nkmax = 0 if p.page_size else p.k.shape[2]
    kern[(splits, p.b * p.hkv), NT, p.stream](p.q, kf, vf, p.bt, p.lens, o, lse, op, lp, float32(p.scale),
                                               p.left, p.right, p.hkv, nkmax)
    if splits > 1:
        cnt = cuda.device_array((1, 2), np.int64, stream=p.stream)
        ref.run_combine(p, op, lp, o, lse, splits, cnt, False)
    return p.out(o_res, p.dt), p.out(lse_res, "fp32")


def forward(q, k_cache, v_cache, *, cache_seqlens=None, cu_seqlens_k=None, block_table=None, page_size=None,
            num_splits=None, window=None, causal=True, scale=None, stream=None, tile=None, min_blocks=0, _plan=None):
    """The fast decode: see :func:`kernels.decode_attention` (``impl="fast"``).  Tuning knobs (the
    bench's variants): ``tile``, the key block T (16, 32 or 64; default :func:`tile_keys`), and
    ``min_blocks``, thread blocks per SM the registers must allow (0: ptxas decides)."""
    p = _plan or ref.plan(q, k_cache, v_cache, cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k,
                          block_table=block_table, page_size=page_size, window=window, causal=causal,
                          scale=scale, stream=stream)
    rows = p.group * p.nq
    t = tile_keys(p.dt, p.d, rows, p.page_size) if tile is None else tile
    if tile is not None and (tile not in (16, 32, 64) or smem_bytes(p.dt, p.d, rows, tile, p.page_size) > SMEM_LIMIT):
        raise ValueError(f"tile={tile!r}: must be 16, 32 or 64 keys and fit {SMEM_LIMIT} bytes of shared memory")
    if t is None:
        raise ValueError(f"impl='fast': head_dim={p.d} with {rows} query rows per kv head does not fit "
                         f"{SMEM_LIMIT} bytes of shared memory")
    splits, outs = _outputs(p, num_splits, t)
    split = splits > 1
    kern = kernel(p.dt, p.d, t, p.group, p.nq, p.page_size > 0, split, p.windowed, p.causal, max(p.page_size, 1),
                  int(min_blocks))
    kf = p.k.reshape(int(np.prod(p.k.shape)))  # flat views, no copy
    vf = p.v.reshape(int(np.prod(p.v.shape)))
    return _launch(p, kern, kf, vf, splits, outs)


# ---------------------------------------------------------------------------------------------
# v3 (experimental, not what impl="auto" runs until measured): the products on the tensor cores.
#
# fp16, d = 64 or 128, g·Nq <= 8 query rows per block (the mma's n = 8 side), T = 64 keys a tile,
# 4 warps of 16 keys each.  S^T (16 keys x 8 rows) = τ K_w (16 x d) · Q^T with
# ``mma.m16n8k16`` (kernels.perf.tc: inline PTX on the GPU, pure-Python twins under the
# simulator), Q's fragments held in registers for the whole kernel; the online softmax in shared
# memory as v2; O^T (d x 8) += V^T (d x 64 keys) · P̃^T with each warp owning d/64 chunks of 16
# dims in registers.  K is loaded as 32-bit words into shared memory rows of d/2 + pad words (the
# A fragments are whole words); V is loaded two keys at a time and stored transposed, [dim][key
# pair], its halves rearranged with bit operations, so that the A fragments of V^T are whole
# words too.  P̃ is rounded to fp16 for its product (as flash-attention does); ℓ sums it in float32.


def tc_supports(dt: str, d: int, rows: int) -> bool:
    return dt == "fp16" and d in (64, 128) and rows <= 8


def _tc_words(n: int) -> int:
    """A shared row of n 32-bit words padded to 4 mod 32: the 8 x 4 lanes of a fragment load
    (row g, word t) fall in 32 different banks."""
    return n + (4 - n) % 32


def _tc_source(D, G, NQ, PAGED, SPLIT, WINDOW, CAUSAL, PSZ):
    from . import tc

    T = 64
    ROWS = G * NQ
    RP = 8
    KW = _tc_words(D // 2)  # K rows: D/2 words
    VW = _tc_words(T // 2)  # V^T rows (one per dim): T/2 key pairs
    NKW, NVW, NPT = T * KW, D * VW, T * RP
    KC = D // 16  # k-chunks of the score product
    MC = D // 64  # 16-dim chunks of O^T per warp
    NQB, NACC = 2 * KC, 4 * MC  # Q fragments, O^T accumulators (registers)
    WPR = D // 2  # words a K row
    RSTEP = NT // WPR  # rows loaded at once (one word column per thread)
    NPG = T // PSZ + 2 if PAGED else 1
    mma = tc.mma
    pack = tc.pack_f16x2
    M16 = 0xFFFF
    H16 = 0xFFFF0000

    def decode_tc(q, kw, vw, bt, lens, o, lse, op, lp, scale, wl, wr, hkv, nkmax):
        # kw, vw: flat uint32 views of the fp16 caches (two halves a word).
        s = cuda.blockIdx.x
        nsplit = cuda.gridDim.x
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t4 = lane % 4
        b = bh // hkv
        h = bh % hkv
        length = lens[b]
        lo = max(0, length - NQ - wl) if WINDOW and wl >= 0 else 0
        j0 = lo // T
        nblk = (length - 1) // T - j0 + 1
        bps = (nblk + nsplit - 1) // nsplit
        a = min(nblk, s * bps)
        e = min(nblk, (s + 1) * bps)
        sK = cuda.shared.array(NKW, uint32)
        sVT = cuda.shared.array(NVW, uint32)
        sPT = cuda.shared.array(NPT, float32)
        sM = cuda.shared.array(RP, float32)
        sL = cuda.shared.array(RP, float32)
        sAlpha = cuda.shared.array(RP, float32)
        sPage = cuda.shared.array(NPG, int32)
        # Q^T fragments (b0, b1 of each k-chunk) for row g: registers for the whole kernel.
        qb = cuda.local.array(NQB, uint32)
        for kc in range(KC):
            for half in range(2):
                x = kc * 16 + half * 8 + 2 * t4
                lo_v = ZERO
                hi_v = ZERO
                if g < ROWS:  # Q as it is (fp16 exactly); τ multiplies the float32 scores
                    lo_v = float32(q[b, h * G + g // NQ, g % NQ, x])
                    hi_v = float32(q[b, h * G + g // NQ, g % NQ, x + 1])
                qb[2 * kc + half] = pack(lo_v, hi_v)
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = ZERO
        frag = cuda.local.array(4, uint32)
        cs = cuda.local.array(4, float32)
        if tid < RP:
            sM[tid] = NEG_INF
            sL[tid] = ZERO
        for jj in range(a, e):
            c0 = (j0 + jj) * T
            cols = min(T, length - c0)
            if PAGED:
                p0 = c0 // PSZ
                npages = (c0 + cols - 1) // PSZ - p0 + 1
                for i in range(tid, npages, NT):
                    sPage[i] = bt[b, p0 + i]
                cuda.syncthreads()  # page numbers in before the gather
            # K: one word column per thread, rows RSTEP apart; rows past the cache are zeros.
            wcol = tid % WPR
            c = tid // WPR
            while c < T:
                word = uint32(0)
                if c < cols:
                    jrow = c0 + c
                    if PAGED:
                        page = sPage[jrow // PSZ - p0]
                        src = ((U(page) * U(PSZ) + U(jrow % PSZ)) * U(hkv) + U(h)) * U(WPR) + U(wcol)
                    else:
                        src = ((U(b) * U(hkv) + U(h)) * U(nkmax) + U(jrow)) * U(WPR) + U(wcol)
                    word = kw[src]
                sK[U(c) * U(KW) + U(wcol)] = word
                c += RSTEP
            # V: keys 2p and 2p+1 of one word column -> two words of V^T (dims 2·wcol, 2·wcol + 1).
            p = tid // WPR
            while p < T // 2:
                w0 = uint32(0)
                w1 = uint32(0)
                for half in range(2):
                    cc = 2 * p + half
                    if cc < cols:
                        jrow = c0 + cc
                        if PAGED:
                            page = sPage[jrow // PSZ - p0]
                            src = ((U(page) * U(PSZ) + U(jrow % PSZ)) * U(hkv) + U(h)) * U(WPR) + U(wcol)
                        else:
                            src = ((U(b) * U(hkv) + U(h)) * U(nkmax) + U(jrow)) * U(WPR) + U(wcol)
                        if half == 0:
                            w0 = vw[src]
                        else:
                            w1 = vw[src]
                sVT[U(2 * wcol) * U(VW) + U(p)] = uint32((w0 & M16) | ((w1 & M16) << 16))
                sVT[U(2 * wcol + 1) * U(VW) + U(p)] = uint32((w0 >> 16) | (w1 & H16))
                p += RSTEP
            cuda.syncthreads()  # K, V^T in shared memory
            # S^T for this warp's 16 keys: KC mma steps.
            for i in range(4):
                cs[i] = ZERO
            kb = warp * 16
            for kc in range(KC):
                base = U(kb + g) * U(KW) + U(kc * 8 + t4)
                frag[0] = sK[base]
                frag[1] = sK[base + U(8 * KW)]
                frag[2] = sK[base + U(4)]
                frag[3] = sK[base + U(8 * KW + 4)]
                mma(cs, 0, frag, 0, qb[2 * kc], qb[2 * kc + 1])
            for i in range(4):
                key = kb + g + 8 * (i // 2)
                r = 2 * t4 + i % 2
                j = c0 + key
                pos = length - NQ + r % NQ
                ok = key < cols
                if CAUSAL:
                    ok = ok and j <= pos
                if WINDOW:
                    ok = ok and (wl < 0 or j >= pos - wl) and (wr < 0 or j <= pos + wr)
                sPT[U(key) * U(RP) + U(r)] = cs[i] * scale if ok else NEG_INF
            cuda.syncthreads()  # S complete
            if tid < RP:
                m_old = sM[tid]
                m_new = m_old
                for key in range(T):
                    sc = sPT[U(key) * U(RP) + U(tid)]
                    if sc > m_new:
                        m_new = sc
                m_use = m_new if m_new != NEG_INF else ZERO
                sAlpha[tid] = math.exp(m_old - m_use)
                sM[tid] = m_new
            cuda.syncthreads()  # the new maxima are in
            for i in range(tid, T * RP, NT):
                m_new = sM[i % RP]
                sPT[U(i)] = math.exp(sPT[U(i)] - (m_new if m_new != NEG_INF else ZERO))
            cuda.syncthreads()  # P̃ complete
            if tid < RP:
                lsum = ZERO
                for key in range(T):
                    lsum += sPT[U(key) * U(RP) + U(tid)]
                sL[tid] = sL[tid] * sAlpha[tid] + lsum
            # O^T = α O^T + V^T P̃^T on this warp's dim chunks (reads P̃ and α: no barrier needed
            # after the sums, which only write ℓ)
            a0 = sAlpha[2 * t4]
            a1 = sAlpha[2 * t4 + 1]
            for mi in range(MC):
                acc[4 * mi] *= a0
                acc[4 * mi + 1] *= a1
                acc[4 * mi + 2] *= a0
                acc[4 * mi + 3] *= a1
            for kc in range(T // 16):
                pk = U(kc * 16 + 2 * t4) * U(RP) + U(g)
                b0 = pack(sPT[pk], sPT[pk + U(RP)])
                b1 = pack(sPT[pk + U(8 * RP)], sPT[pk + U(9 * RP)])
                for mi in range(MC):
                    m = warp + 4 * mi
                    base = U(m * 16 + g) * U(VW) + U(kc * 8 + t4)
                    frag[0] = sVT[base]
                    frag[1] = sVT[base + U(8 * VW)]
                    frag[2] = sVT[base + U(4)]
                    frag[3] = sVT[base + U(8 * VW + 4)]
                    mma(acc, 4 * mi, frag, 0, b0, b1)
            cuda.syncthreads()  # P̃, α, K, V^T, ℓ done with before the next tile
        cuda.syncthreads()
        for mi in range(MC):
            for i in range(4):
                x = (warp + 4 * mi) * 16 + g + 8 * (i // 2)
                r = 2 * t4 + i % 2
                if r < ROWS:
                    l_r = sL[r]
                    val = ZERO if l_r == ZERO else acc[4 * mi + i] / l_r
                    if SPLIT:
                        op[s, b, h * G + r // NQ, r % NQ, x] = val
                    else:
                        o[b, h * G + r // NQ, r % NQ, x] = val
        if tid < ROWS:
            l_r = sL[tid]
            val = NEG_INF if l_r == ZERO else sM[tid] + math.log(l_r)
            if SPLIT:
                lp[s, b, h * G + tid // NQ, tid % NQ] = val
            else:
                lse[b, h * G + tid // NQ, tid % NQ] = val

    return decode_tc


@cache
def tc_kernel(d, g, nq, paged, split, window, causal, psz):
    return cuda.jit(_tc_source(d, g, nq, paged, split, window, causal, psz))


def forward_tc(q, k_cache, v_cache, *, cache_seqlens=None, cu_seqlens_k=None, block_table=None, page_size=None,
               num_splits=None, window=None, causal=True, scale=None, stream=None, _plan=None):
    """v3, the tensor-core decode (fp16, d = 64 or 128, Hq/Hkv·Nq <= 8): arguments as
    :func:`forward`; ValueError where it does not apply."""
    p = _plan or ref.plan(q, k_cache, v_cache, cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k,
                          block_table=block_table, page_size=page_size, window=window, causal=causal,
                          scale=scale, stream=stream)
    rows = p.group * p.nq
    if not tc_supports(p.dt, p.d, rows):
        raise ValueError(f"the tensor-core decode takes fp16, head_dim 64 or 128 and at most 8 query rows per kv "
                         f"head: got {p.dt}, head_dim={p.d}, {rows} rows")
    t = 64
    splits, outs = _outputs(p, num_splits, t)
    split = splits > 1
    kw = p.k.reshape(int(np.prod(p.k.shape))).view(np.uint32)
    vw = p.v.reshape(int(np.prod(p.v.shape))).view(np.uint32)
    kern = tc_kernel(p.d, p.group, p.nq, p.page_size > 0, split, p.windowed, p.causal, max(p.page_size, 1))
    return _launch(p, kern, kw, vw, splits, outs)
