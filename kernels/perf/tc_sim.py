"""The CUDA simulator's target of :mod:`kernels.perf.tc`: a pure-Python twin of every GPU helper
with the same names, signatures and per-thread contract (each simulated thread ends up holding
exactly the fragment registers the hardware would give it).  Where the hardware moves data
between the lanes of a warp (``mma``, the quad and octet reductions) the twin exchanges it
through shared memory between two ``syncthreads``, so every thread of the block must call these
helpers in the same order.  Arithmetic is float32 like the hardware's accumulators; the order
of the products inside one mma differs from the tensor core's, which changes nothing beyond
float32 rounding.  Import through :mod:`kernels.perf.tc` (which defines ``MAX_WARPS`` first).
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import cuda, float32

from .._bf16 import round_bf16_bits
from .tc import MAX_WARPS

# The simulator creates a static shared array the first time any thread reaches its line,
# with no lock: two threads arriving together can each get a private array (seen here as a
# rare NaN).  Every scratch array below is taken under this lock.
_ALLOC_LOCK = threading.Lock()


def _lane():
    tid = int(cuda.threadIdx.x)
    return tid // 32, tid % 32


def _halves(word) -> np.ndarray:
    return np.array([word], dtype=np.uint32).view(np.float16).astype(np.float32)


def _halves_bf16(word) -> np.ndarray:
    return (np.array([word], dtype=np.uint32).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


@cuda.jit(device=True)
def pack_f16x2(lo, hi):
    return int(np.array([lo, hi], dtype=np.float32).astype(np.float16).view(np.uint32)[0])


@cuda.jit(device=True)
def ex2(x):
    return float32(math.exp2(x)) if x != -math.inf else float32(0.0)


@cuda.jit(device=True)
def pack_bf16x2(lo, hi):
    return int(round_bf16_bits(np.array([lo, hi], dtype=np.float32)).view(np.uint32)[0])


def _mma(c, ci, a, ai, b0, b1, halves):
    warp, lane = _lane()
    g, t = lane // 4, lane % 4
    with _ALLOC_LOCK:
        sa = cuda.shared.array((MAX_WARPS, 16, 16), float32)
        sb = cuda.shared.array((MAX_WARPS, 16, 8), float32)
    sa[warp, g, 2 * t:2 * t + 2] = halves(a[ai])
    sa[warp, g + 8, 2 * t:2 * t + 2] = halves(a[ai + 1])
    sa[warp, g, 2 * t + 8:2 * t + 10] = halves(a[ai + 2])
    sa[warp, g + 8, 2 * t + 8:2 * t + 10] = halves(a[ai + 3])
    sb[warp, 2 * t:2 * t + 2, g] = halves(b0)
    sb[warp, 2 * t + 8:2 * t + 10, g] = halves(b1)
    cuda.syncthreads()
    A, B = sa[warp], sb[warp]
    for e, (r, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
        c[ci + e] = np.float32(c[ci + e]) + np.float32(np.dot(A[r, :], B[:, col]))
    cuda.syncthreads()


@cuda.jit(device=True)
def mma(c, ci, a, ai, b0, b1):
    _mma(c, ci, a, ai, b0, b1, _halves)


@cuda.jit(device=True)
def mma_bf16(c, ci, a, ai, b0, b1):
    # bf16 x bf16 products are exact in float32 (8-bit significands); the sums are float32's
    _mma(c, ci, a, ai, b0, b1, _halves_bf16)


def _ldsm(r, ri, smem, base, stride, row0, col0, trans, border=False):
    _, lane = _lane()
    g, t = lane // 4, lane % 4
    for i in range(4):
        if border:
            mr, mc = row0 + 8 * (i >> 1), col0 + 8 * (i & 1)
        else:
            mr, mc = row0 + 8 * (i & 1), col0 + 8 * (i >> 1)
        if trans:
            lo = smem[base + (mr + 2 * t) * stride + mc + g]
            hi = smem[base + (mr + 2 * t + 1) * stride + mc + g]
        else:
            lo = smem[base + (mr + g) * stride + mc + 2 * t]
            hi = smem[base + (mr + g) * stride + mc + 2 * t + 1]
        # the two 16-bit elements' bits, unchanged (an fp16 or a bf16 tile)
        r[ri + i] = int(np.array([lo, hi], dtype=smem.dtype).view(np.uint32)[0])


def _cp_async16(smem, soff, gmem, goff, nvalid):
    flat = gmem.reshape(-1) if hasattr(gmem, "reshape") else gmem
    for e in range(8):
        smem[soff + e] = flat[goff + e] if e < nvalid else 0.0


@cuda.jit(device=True)
def smem_u32(smem):
    return 0


@cuda.jit(device=True)
def lane_offset(stride):
    return 0


@cuda.jit(device=True)
def lane_offset_b(stride):
    return 0


@cuda.jit(device=True)
def cp_async16_a(smem, sbase, soff, gmem, goff, nvalid):
    _cp_async16(smem, soff, gmem, goff, nvalid)


@cuda.jit(device=True)
def opaque_u32(x):
    return x


# The simulator's shared window starts at 0 and its lane offsets are 0 (``smem_u32``,
# ``lane_offset``): ``addr`` is twice the element offset of the tile's first element.


def _ldsm_twin(trans, border):
    @cuda.jit(device=True)
    def ldsm(r, ri, smem, addr, stride):
        _ldsm(r, ri, smem, addr // 2, stride, 0, 0, trans, border)

    return ldsm


ldsm_x4, ldsm_x4_b = _ldsm_twin(False, False), _ldsm_twin(False, True)
ldsm_x4_trans, ldsm_x4_trans_b = _ldsm_twin(True, False), _ldsm_twin(True, True)


@cuda.jit(device=True)
def st_global16_a(gmem, goff, smem, sbase, soff):
    flat = gmem.reshape(-1) if hasattr(gmem, "reshape") else gmem
    for e in range(8):
        flat[goff + e] = smem[soff + e]


@cuda.jit(device=True)
def mma_z(c, ci, a, ai, b0, b1):
    for e in range(4):
        c[ci + e] = 0.0
    mma(c, ci, a, ai, b0, b1)


@cuda.jit(device=True)
def mma_z_bf16(c, ci, a, ai, b0, b1):
    for e in range(4):
        c[ci + e] = 0.0
    mma_bf16(c, ci, a, ai, b0, b1)


@cuda.jit(device=True)
def cp_async_commit():
    pass


@cuda.jit(device=True)
def cp_async_wait(pending):
    pass


def _lanes(n, op, *xs):
    """op over the n lanes n·(l // n) .. + n - 1 of each of the values xs (quad: n = 4, octet: 8)."""
    warp, lane = _lane()
    tid = warp * 32 + lane
    with _ALLOC_LOCK:
        sx = cuda.shared.array((2, 32 * MAX_WARPS), float32)
    for i, x in enumerate(xs):
        sx[i, tid] = x
    cuda.syncthreads()
    q = tid - tid % n
    r = tuple(float32(op(sx[i, q:q + n])) for i in range(len(xs)))
    cuda.syncthreads()
    return r


def _tree_sum(v):
    # the butterfly's order: lanes (0+1)+(2+3) ... in float32, as the shuffles on the GPU
    a = [np.float32(x) for x in v]
    step = 1
    while step < len(a):
        a = [a[i] + a[i ^ step] for i in range(len(a))]
        step *= 2
    return a[0]


_RED_LOCK = threading.Lock()


@cuda.jit(device=True)
def red_v2(g, off, a, b):
    flat = g.reshape(-1)
    with _RED_LOCK:
        flat[off] += a
        flat[off + 1] += b


@cuda.jit(device=True)
def red_v2_if(g, off, a, b, ok):
    if ok:
        red_v2(g, off, a, b)


@cuda.jit(device=True)
def red_v4(g, off, a, b, c, d):
    flat = g.reshape(-1)
    with _RED_LOCK:
        flat[off] += a
        flat[off + 1] += b
        flat[off + 2] += c
        flat[off + 3] += d


@cuda.jit(device=True)
def quad_max2(x, y):
    return _lanes(4, np.max, x, y)


@cuda.jit(device=True)
def quad_sum2(x, y):
    return _lanes(4, _tree_sum, x, y)


@cuda.jit(device=True)
def smem_u32_f32(smem):
    return 0


@cuda.jit(device=True)
def lds128_f32_a(r, ri, smem, a, off):
    base = a // 4 + off
    for e in range(4):
        r[ri + e] = smem[base + e]


@cuda.jit(device=True)
def sts32_f32_a(smem, a, off, x):
    smem[a // 4 + off] = x


@cuda.jit(device=True)
def sts64_f32_a(smem, a, x, y):
    smem[a // 4] = x
    smem[a // 4 + 1] = y


@cuda.jit(device=True)
def sts128_f32_a(smem, a, x, y, z, w):
    smem[a // 4] = x
    smem[a // 4 + 1] = y
    smem[a // 4 + 2] = z
    smem[a // 4 + 3] = w


@cuda.jit(device=True)
def st_global16_f32_a(gmem, goff, smem, a):
    flat = gmem.reshape(-1) if hasattr(gmem, "reshape") else gmem
    for e in range(4):
        flat[goff + e] = smem[a // 4 + e]


@cuda.jit(device=True)
def sts32_u32_a(smem, a, x):
    smem[a // 4] = x


@cuda.jit(device=True)
def lds64_f32_a(r, ri, smem, a):
    r[ri] = smem[a // 4]
    r[ri + 1] = smem[a // 4 + 1]


@cuda.jit(device=True)
def cp_async16_f32_a(smem, a, gmem, goff, nvalid):
    flat = gmem.reshape(-1) if hasattr(gmem, "reshape") else gmem
    base = a // 4
    for e in range(4):
        smem[base + e] = flat[goff + e] if e < nvalid else 0.0


@cuda.jit(device=True)
def oct_max(x):
    return _lanes(8, np.max, x)[0]


@cuda.jit(device=True)
def oct_sum(x):
    return _lanes(8, _tree_sum, x)[0]


def _tf32_trunc(x) -> np.ndarray:
    # what the tensor core reads of operand registers: their 19 high bits
    u = np.array(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return u.view(np.float32).astype(np.float64)


@cuda.jit(device=True)
def tf32_hi(x):
    u = np.array([x], dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)  # round the magnitude, ties away
    return float32(u.view(np.float32)[0])

#: the most A and B tiles one mma3_tf32 call takes under the simulator
_M3, _N3 = 4, 8


@cuda.jit(device=True)
def mma3_tf32(acc, ah, al, bh, bl, M, N):
    # One exchange for all M·N tiles and the three terms (a barrier per mma would make the
    # simulator six times slower than the fp16 kernels' tests); the sum of the three terms is
    # rounded to f32 once, where the tensor core rounds after each.
    warp, lane = _lane()
    g, t = lane // 4, lane % 4
    with _ALLOC_LOCK:
        sa = cuda.shared.array((MAX_WARPS, 2, _M3, 16, 8), float32)
    with _ALLOC_LOCK:
        sb = cuda.shared.array((MAX_WARPS, 2, _N3, 8, 8), float32)
    for h, (a, b) in enumerate(((ah, bh), (al, bl))):
        for m in range(M):
            sa[warp, h, m, g, t] = a[4 * m]
            sa[warp, h, m, g + 8, t] = a[4 * m + 1]
            sa[warp, h, m, g, t + 4] = a[4 * m + 2]
            sa[warp, h, m, g + 8, t + 4] = a[4 * m + 3]
        for n in range(N):
            sb[warp, h, n, t, g] = b[2 * n]
            sb[warp, h, n, t + 4, g] = b[2 * n + 1]
    cuda.syncthreads()
    A = _tf32_trunc(sa[warp, :, :M])
    B = _tf32_trunc(sb[warp, :, :N])
    cuda.syncthreads()
    rows = (g, g, g + 8, g + 8)
    cols = (2 * t, 2 * t + 1, 2 * t, 2 * t + 1)
    for m in range(M):
        for n in range(N):
            for e in range(4):
                a_h, a_l = A[0, m, rows[e]], A[1, m, rows[e]]
                b_h, b_l = B[0, n, :, cols[e]], B[1, n, :, cols[e]]
                x = np.dot(a_l, b_h) + np.dot(a_h, b_l) + np.dot(a_h, b_h)
                i = 4 * (m * N + n) + e
                acc[i] = np.float32(np.float32(acc[i]) + np.float32(x))




# ---------------------------------------------------------------------------------------------
# Warpgroup products: the descriptor decoded as the PTX ISA's canonical swizzled layouts (T = 8
# halves of 16 bytes; R = 128 bytes a row with 128-byte swizzling, 64 with 64-byte): K-major
# ((8, m), (T, 2k)) : ((R/2 halves, SBO), (1, T)) and MN-major ((R/2 halves, m), (8, k)) :
# ((1, LBO), (R/2 halves, SBO)), then the byte address's 16-byte chunk bits XORed with the bits
# above a row's bytes (Swizzle<3, 4, 3> for 128-byte rows, <2, 4, 3> for 64-byte rows).  Each
# thread computes its own accumulators from the shared tiles (all of the warpgroup's A rows and B
# columns it needs are there); A in registers is exchanged through shared memory as ``mma`` does.

#: descriptor mode (bits 62-63) -> bytes of a swizzled row
_ROW_BYTES = {1: 128, 2: 64}


def _desc(desc):
    desc = int(desc)
    mode = desc >> 62
    assert mode in _ROW_BYTES, f"descriptor {desc:#x}: the twin decodes 128- and 64-byte swizzling only"
    return (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, _ROW_BYTES[mode]


def _swz(byte, row):
    return byte ^ (((byte >> 7) & (row // 16 - 1)) << 4)


def _values(sm, byte, row, bf16):
    idx = _swz(byte, row) // 2
    x = np.asarray(sm)
    if bf16:
        return (x.view(np.uint16)[idx].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x[idx].astype(np.float64)


def _kmajor(sm, desc, rows, bf16):
    """The (rows, 16) operand of one k-step, K-major."""
    start, _, sbo, row = _desc(desc)
    r = np.asarray(rows)[:, None]
    k = np.arange(16)[None, :]
    return _values(sm, start + (r % 8) * row + (r // 8) * sbo + 2 * k, row, bf16)


def _mnmajor(sm, desc, n, bf16):
    """The (16, n) operand of one k-step, MN-major."""
    start, lbo, sbo, row = _desc(desc)
    k = np.arange(16)[:, None]
    c = np.arange(n)[None, :]
    w = row // 2  # halves a row
    return _values(sm, start + (c % w) * 2 + (c // w) * lbo + (k % 8) * row + (k // 8) * sbo, row, bf16)


def _wg_rows():
    warp, lane = _lane()
    g, t = lane // 4, lane % 4
    return warp, g, t, 16 * (warp % 4) + g


def _wg_store(d, D, t, n, add):
    for nt in range(n // 8):
        for e in range(4):
            x = 4 * nt + e
            v = D[e // 2, 8 * nt + 2 * t + e % 2]
            d[x] = np.float32(np.float32(d[x]) + np.float32(v)) if add else np.float32(v)


def wgmma_ss(N, KT, ASTEP, BSTEP, BF16=False, KPA=4):
    N, KT, ASTEP, BSTEP, KPA = int(N), int(KT), int(ASTEP), int(BSTEP), int(KPA)  # numpy ints would wrap at 2**31

    @cuda.jit(device=True)
    def ss(d, sm, da, db):
        _, g, t, r = _wg_rows()
        D = np.zeros((2, N))
        for ks in range(KT):
            step = (ks // KPA, (ks % KPA) * 2)
            a = _kmajor(sm, int(da) + step[0] * ASTEP + step[1], [r, r + 8], BF16)
            b = _kmajor(sm, int(db) + step[0] * BSTEP + step[1], range(N), BF16)
            D += a @ b.T
        _wg_store(d, D, t, N, False)

    return ss


def wgmma_rs(N, KS, BSTEP, BF16=False):
    N, KS, BSTEP = int(N), int(KS), int(BSTEP)  # numpy ints would wrap at 2**31
    halves = _halves_bf16 if BF16 else _halves

    @cuda.jit(device=True)
    def rs(d, a, sm, db):
        warp, g, t, _ = _wg_rows()
        with _ALLOC_LOCK:
            sa = cuda.shared.array((MAX_WARPS, 16, 128), float32)
        for kk in range(KS):
            c = 16 * kk + 2 * t
            sa[warp, g, c:c + 2] = halves(a[4 * kk])
            sa[warp, g + 8, c:c + 2] = halves(a[4 * kk + 1])
            sa[warp, g, c + 8:c + 10] = halves(a[4 * kk + 2])
            sa[warp, g + 8, c + 8:c + 10] = halves(a[4 * kk + 3])
        cuda.syncthreads()
        A = sa[warp, [g, g + 8], :16 * KS].astype(np.float64)
        cuda.syncthreads()
        D = np.zeros((2, N))
        for kk in range(KS):
            D += A[:, 16 * kk:16 * kk + 16] @ _mnmajor(sm, int(db) + kk * BSTEP, N, BF16)
        _wg_store(d, D, t, N, True)

    return rs


@cuda.jit(device=True)
def fence_proxy_async():
    pass


# TMA copies and mbarriers (fwd_fp16_v7).  An mbarrier's state lives in the 16 shared-memory
# bytes at its address, as int32: [completed phases, bytes still to land, arrivals still to come,
# arrivals a phase].  The copy lands at once, when issued, and counts its bytes; a phase
# completes when its arrivals have come and its bytes have landed; a waiter polls (other threads
# run meanwhile) and fails after 60 s instead of hanging.
_MBAR_LOCK = threading.Lock()


def _mbar_words(sm, sbase, bar):
    a = int(sbase) + int(bar)
    assert a % 8 == 0, f"mbarrier at byte {a}: not 8-byte aligned"
    return np.asarray(sm).view(np.int32), a // 4


def _mbar_step(w, i, arrivals, nbytes):
    w[i + 1] += nbytes
    w[i + 2] -= arrivals
    if w[i + 2] == 0 and w[i + 1] == 0:
        w[i] += 1
        w[i + 2] = w[i + 3]


@cuda.jit(device=True)
def mbar_init(sm, sbase, bar, count):
    w, i = _mbar_words(sm, sbase, bar)
    with _MBAR_LOCK:
        w[i:i + 4] = (0, 0, count, count)


@cuda.jit(device=True)
def mbar_expect_tx(sm, sbase, bar, nbytes):
    w, i = _mbar_words(sm, sbase, bar)
    with _MBAR_LOCK:
        _mbar_step(w, i, 1, int(nbytes))


@cuda.jit(device=True)
def mbar_wait(sm, sbase, bar, parity):
    import time

    w, i = _mbar_words(sm, sbase, bar)
    end = time.monotonic() + 60
    while True:
        with _MBAR_LOCK:
            if int(w[i]) % 2 != int(parity):
                return
        if time.monotonic() > end:
            raise RuntimeError(f"mbarrier at byte {int(sbase) + int(bar)}: phase of parity {parity} never completed")
        time.sleep(1e-5)


@cuda.jit(device=True)
def tma_load3(sm, sbase, dst, maps, which, c0, c1, c2, bar):
    t = maps.tensors[int(which)]
    bc, br, rb = maps.box_cols, maps.box_rows, maps.row_bytes
    dst = int(sbase) + int(dst)
    assert dst % (8 * rb) == 0, f"TMA box at byte {dst}: not aligned to its swizzle pattern ({8 * rb} bytes)"
    c0, c1, c2 = int(c0), int(c1), int(c2)
    box = np.zeros((br, bc), np.uint16)  # past the tensor's end: zeros
    if 0 <= c2 < t.shape[0]:
        part = t[c2, c1:c1 + br, c0:c0 + bc].view(np.uint16)
        box[:part.shape[0], :part.shape[1]] = part
    byte = dst + np.arange(br)[:, None] * rb + 2 * np.arange(bc)[None, :]
    np.asarray(sm).view(np.uint16)[_swz(byte, rb) // 2] = box
    w, i = _mbar_words(sm, sbase, bar)
    with _MBAR_LOCK:
        _mbar_step(w, i, 0, -box.nbytes)


@cuda.jit(device=True)
def bulk_red_f32(g, off, smem, src, nbytes):
    # the unit's reduction, done at the issue: the shared bytes are final then (a barrier after
    # their writers' fence), and nothing reads the global sum before the kernel ends
    n = nbytes // 4
    flat = g.reshape(-1)
    with _RED_LOCK:
        for e in range(n):
            flat[off + e] += smem[src // 4 + e]


@cuda.jit(device=True)
def bulk_wait_read():
    pass


@cuda.jit(device=True)
def bulk_wait():
    pass
