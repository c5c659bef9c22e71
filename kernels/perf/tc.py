"""Warp-level building blocks for the fast kernels: tensor-core MMA, ldmatrix, cp.async, shuffles.

numba-cuda has no matrix-unit intrinsics.  On a GPU each helper here is a few lines of inline
PTX in a CUDA C++ device function (``cuda.declare_device(..., link=cuda.CUSource(...))``),
wrapped in a Numba device function that passes its local/shared arrays with ``ffi.from_buffer``;
with link-time optimisation (numba-cuda's default when nvJitLink is present) the calls are
inlined and the fragment arrays live in registers (checked by :mod:`kernels.perf.inspect`:
``HMMA.16816.F32`` in the SASS, no stack frame).

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) there are no linked functions and no warp
shuffles, so every helper has a pure-Python twin with the same per-thread contract: each
simulated thread ends up holding exactly the fragment registers the hardware would give it.
Where the hardware moves data between the lanes of a warp (``mma``, the quad reductions) the
twin exchanges it through shared memory between two ``syncthreads``; so under the simulator
these helpers must be called by every thread of the block, in the same order (they are: the
fast kernels call them outside any thread-dependent branch).  The twins are what CI tests;
the GPU run checks that the PTX does the same thing.

Fragment layouts (PTX ISA, ``mma.m16n8k16`` with f16 inputs and f32 accumulators), for lane
``l`` of a warp, ``g = l // 4`` and ``t = l % 4``:

* A (16 x 16, row major), four 32-bit registers of two f16 each:
  a0 = A[g, 2t:2t+2], a1 = A[g+8, 2t:2t+2], a2 = A[g, 2t+8:2t+10], a3 = A[g+8, 2t+8:2t+10];
* B (16 x 8, "col": stored as Bᵀ, row n holds column n), two registers:
  b0 = B[2t:2t+2, g], b1 = B[2t+8:2t+10, g];
* C, D (16 x 8, f32): c0, c1 = C[g, 2t:2t+2], c2, c3 = C[g+8, 2t:2t+2].

The C layout of two adjacent 16 x 8 tiles is the A layout of one 16 x 16 tile (after packing
pairs to f16): that is why P = softmax(S) can feed the P·V product straight from registers.

``ldsm_x4`` loads four 8 x 8 f16 matrices from shared memory at (row0 + 8·(i & 1),
col0 + 8·(i >> 1)), i = 0..3, into registers r0..r3 of every lane; with ``trans`` each matrix
is transposed on the way.  For a 16 x 16 A tile that gives a0..a3 in order; for B operands:
Kᵀ (K stored [key, dim], not transposed) gives (b0, b1) = (r0, r2) for keys 0..7 and (r1, r3)
for keys 8..15; V (stored [key, dim], transposed) gives (r0, r1) for dims 0..7, (r2, r3) for
dims 8..15.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda, float32, int32, uint32

SIM = bool(config.ENABLE_CUDASIM)
#: Most warps a block of the fast kernels has (sizes the simulator's exchange buffers).
MAX_WARPS = 8


def device_inline(fn):
    """A device function inlined into its caller on the GPU (a plain device function under the
    simulator, which has no ``forceinline``)."""
    return cuda.jit(device=True)(fn) if SIM else cuda.jit(device=True, forceinline=True)(fn)


def jit_kernel(fn, threads: int, min_blocks: int = 1):
    """``cuda.jit`` with launch bounds (threads per block, blocks per SM) where the target takes
    them: ptxas then budgets registers for exactly that; the simulator has no such option."""
    if SIM:
        return cuda.jit(fn)
    return cuda.jit(fn, launch_bounds=(threads, min_blocks))


# ---------------------------------------------------------------------------------------------
# The GPU side: inline PTX, one extern "C" function per instruction (Numba's foreign-function
# ABI: int f(ret*, args...)).  Shared-memory addresses are 32-bit offsets in the shared window,
# converted from the generic pointers Numba passes.

_CU = r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

extern "C" __device__ int fs_mma16816(int* ret, float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    return 0;
}

extern "C" __device__ int fs_ldsm_x4(int* ret, unsigned* r, const char* smem, long long byte_off) {
    unsigned a = smem_addr(smem + byte_off);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    return 0;
}

extern "C" __device__ int fs_ldsm_x4_trans(int* ret, unsigned* r, const char* smem, long long byte_off) {
    unsigned a = smem_addr(smem + byte_off);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    return 0;
}

// 16 bytes global -> shared without passing through registers; src_bytes < 16 zero-fills the rest.
extern "C" __device__ int fs_cp_async16(int* ret, char* smem, long long smem_off, const char* gmem,
                                        long long gmem_off, long long src_bytes) {
    unsigned a = smem_addr(smem + smem_off);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(a), "l"(gmem + gmem_off), "r"((unsigned)src_bytes) : "memory");
    return 0;
}

extern "C" __device__ int fs_cp_async_commit(int* ret) {
    asm volatile("cp.async.commit_group;" ::: "memory");
    return 0;
}

extern "C" __device__ int fs_cp_async_wait0(int* ret) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    return 0;
}

extern "C" __device__ int fs_cp_async_wait1(int* ret) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    return 0;
}

// 16 bytes shared -> global through registers (one LDS.128, one STG.128).
extern "C" __device__ int fs_st_global16(int* ret, char* gmem, long long gmem_off, const char* smem,
                                         long long smem_off) {
    unsigned a = smem_addr(smem + smem_off);
    unsigned x, y, z, w;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(a) : "memory");
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(gmem + gmem_off), "r"(x), "r"(y), "r"(z), "r"(w)
                 : "memory");
    return 0;
}

// The same value, hidden from the optimiser: a shared address computed from it inside a loop is
// recomputed there (one register and immediate offsets) instead of hoisted into many registers.
extern "C" __device__ int fs_opaque_u32(unsigned* ret, unsigned x) {
    asm volatile("mov.b32 %0, %1;" : "=r"(*ret) : "r"(x));
    return 0;
}

// Address-based forms (v3 on): the shared window address is computed once per kernel and every
// access adds a 32-bit offset to it, instead of 64-bit generic pointer arithmetic per access.
extern "C" __device__ int fs_smem_u32(unsigned* ret, const char* smem) {
    *ret = smem_addr(smem);
    return 0;
}

extern "C" __device__ int fs_ldsm_x4_a(int* ret, unsigned* r, unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    return 0;
}

extern "C" __device__ int fs_ldsm_x4_trans_a(int* ret, unsigned* r, unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    return 0;
}

extern "C" __device__ int fs_cp_async16_a(int* ret, unsigned a, const char* gmem, long long gmem_off,
                                          int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(a), "l"(gmem + gmem_off), "r"(src_bytes) : "memory");
    return 0;
}

extern "C" __device__ int fs_st_global16_a(int* ret, char* gmem, long long gmem_off, unsigned a) {
    unsigned x, y, z, w;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(a) : "memory");
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(gmem + gmem_off), "r"(x), "r"(y), "r"(z), "r"(w)
                 : "memory");
    return 0;
}

// D = A·B with a zero accumulator: the first k-step of a product needs no zeroed registers.
extern "C" __device__ int fs_mma16816_z(int* ret, float* c, const unsigned* a, unsigned b0, unsigned b1) {
    float z = 0.f;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
    return 0;
}

extern "C" __device__ int fs_ex2(float* ret, float x) {
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(*ret) : "f"(x));
    return 0;
}

// Two f32 to one f16x2 register, round to nearest even: lo in bits 0..15, hi in 16..31.
extern "C" __device__ int fs_pack_f16x2(unsigned* ret, float lo, float hi) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(*ret) : "f"(hi), "f"(lo));
    return 0;
}

// Vector reductions into global f32 (sm_90): g[off..] += (a, b[, c, d]), atomic per element.
extern "C" __device__ int fs_red_v2_f32(int* ret, float* g, long long off, float a, float b) {
    asm volatile("red.global.v2.f32.add [%0], {%1, %2};" :: "l"(g + off), "f"(a), "f"(b) : "memory");
    return 0;
}

extern "C" __device__ int fs_red_v4_f32(int* ret, float* g, long long off, float a, float b, float c, float d) {
    asm volatile("red.global.v4.f32.add [%0], {%1, %2, %3, %4};"
                 :: "l"(g + off), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
    return 0;
}
"""

if not SIM:
    from cffi import FFI

    _ffi = FFI()
    _link = cuda.CUSource(_CU)
    _mma_raw = cuda.declare_device("fs_mma16816", "int32(CPointer(float32), CPointer(uint32), uint32, uint32)",
                                   link=_link)
    _ldsm_raw = cuda.declare_device("fs_ldsm_x4", "int32(CPointer(uint32), CPointer(float16), int64)", link=_link)
    _ldsm_t_raw = cuda.declare_device("fs_ldsm_x4_trans", "int32(CPointer(uint32), CPointer(float16), int64)",
                                      link=_link)
    _cp_raw = cuda.declare_device("fs_cp_async16", "int32(CPointer(float16), int64, CPointer(float16), int64, int64)",
                                  link=_link)
    _stg_raw = cuda.declare_device("fs_st_global16", "int32(CPointer(float16), int64, CPointer(float16), int64)",
                                   link=_link)
    _commit_raw = cuda.declare_device("fs_cp_async_commit", "int32()", link=_link)
    _wait0_raw = cuda.declare_device("fs_cp_async_wait0", "int32()", link=_link)
    _wait1_raw = cuda.declare_device("fs_cp_async_wait1", "int32()", link=_link)
    ex2 = cuda.declare_device("fs_ex2", "float32(float32)", link=_link)
    _smem_u32_raw = cuda.declare_device("fs_smem_u32", "uint32(CPointer(float16))", link=_link)
    _opaque_raw = cuda.declare_device("fs_opaque_u32", "uint32(uint32)", link=_link)
    _ldsm_a_raw = cuda.declare_device("fs_ldsm_x4_a", "int32(CPointer(uint32), uint32)", link=_link)
    _ldsm_t_a_raw = cuda.declare_device("fs_ldsm_x4_trans_a", "int32(CPointer(uint32), uint32)", link=_link)
    _cp_a_raw = cuda.declare_device("fs_cp_async16_a", "int32(uint32, CPointer(float16), int64, int32)", link=_link)
    _stg_a_raw = cuda.declare_device("fs_st_global16_a", "int32(CPointer(float16), int64, uint32)", link=_link)
    _mma_z_raw = cuda.declare_device("fs_mma16816_z", "int32(CPointer(float32), CPointer(uint32), uint32, uint32)",
                                     link=_link)
    _red2_raw = cuda.declare_device("fs_red_v2_f32", "int32(CPointer(float32), int64, float32, float32)",
                                    link=_link)
    _red4_raw = cuda.declare_device("fs_red_v4_f32",
                                    "int32(CPointer(float32), int64, float32, float32, float32, float32)",
                                    link=_link)

    @cuda.jit(device=True, forceinline=True)
    def red_v2(g, off, a, b):
        """g.flat[off:off+2] += (a, b), atomically per element (one 8-byte reduction; ``off`` even)."""
        _red2_raw(_ffi.from_buffer(g), off, a, b)

    @cuda.jit(device=True, forceinline=True)
    def red_v4(g, off, a, b, c, d):
        """g.flat[off:off+4] += (a, b, c, d), atomically per element (one 16-byte reduction;
        ``off`` a multiple of 4)."""
        _red4_raw(_ffi.from_buffer(g), off, a, b, c, d)

    @cuda.jit(device=True, forceinline=True)
    def smem_u32(smem):
        """The 32-bit shared-window address of a shared array's first byte (GPU); 0 in the simulator."""
        return _smem_u32_raw(_ffi.from_buffer(smem))

    @cuda.jit(device=True, forceinline=True)
    def lane_offset(stride):
        """This lane's element offset inside an x4 ldmatrix group: row (l & 7) + 8·((l >> 3) & 1),
        column 8·(l >> 4), for a tile with row stride ``stride``; add it to every ``*_a`` call."""
        lane = cuda.laneid
        return ((lane & 7) + ((lane >> 3) & 1) * 8) * stride + (lane >> 4) * 8

    @cuda.jit(device=True, forceinline=True)
    def lane_offset_b(stride):
        """The lane's offset for :func:`ldsm_x4_b_a`: row (l & 7) + 8·(l >> 4), column 8·((l >> 3) & 1)."""
        lane = cuda.laneid
        return ((lane & 7) + (lane >> 4) * 8) * stride + ((lane >> 3) & 1) * 8

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_b_a(r, ri, smem, sbase, loff, base, stride, row0, col0):
        """B operands from a tile stored [n, k] (such as K for S = Q Kᵀ): matrix i at
        (row0 + 8·(i >> 1), col0 + 8·(i & 1)), so that (r0, r1) are (b0, b1) of rows row0..+7
        and (r2, r3) of rows row0+8..+15, each pair in adjacent registers as the mma wants them.
        ``loff`` from :func:`lane_offset_b`."""
        _ldsm_a_raw(_ffi.from_buffer(r[ri:]), uint32(sbase + 2 * (base + row0 * stride + col0 + loff)))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_a(r, ri, smem, sbase, loff, base, stride, row0, col0):
        """:func:`ldsm_x4` with the lane's offset ``loff`` (:func:`lane_offset`) and the shared
        base address ``sbase`` (:func:`smem_u32`) precomputed: one 32-bit add per load."""
        _ldsm_a_raw(_ffi.from_buffer(r[ri:]), uint32(sbase + 2 * (base + row0 * stride + col0 + loff)))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_trans_a(r, ri, smem, sbase, loff, base, stride, row0, col0):
        _ldsm_t_a_raw(_ffi.from_buffer(r[ri:]), uint32(sbase + 2 * (base + row0 * stride + col0 + loff)))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_trans_b_a(r, ri, smem, sbase, loffb, base, stride, row0, col0):
        """An A operand (16 x 16) from a tile stored transposed, [k, m] (such as dS from dSᵀ
        stored [key, query]): matrix i at (row0 + 8·(i >> 1), col0 + 8·(i & 1)) of the storage,
        each transposed, which is a0..a3 in order.  ``loffb`` from :func:`lane_offset_b`."""
        _ldsm_t_a_raw(_ffi.from_buffer(r[ri:]), uint32(sbase + 2 * (base + row0 * stride + col0 + loffb)))

    @cuda.jit(device=True, forceinline=True)
    def opaque_u32(x):
        """``x`` as a uint32 the compiler cannot see through (it is not hoisted out of loops)."""
        return _opaque_raw(uint32(x))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_at(r, ri, smem, addr, stride):
        """:func:`ldsm_x4_a` at a precomputed byte address: the tile's first element plus the lane's
        :func:`lane_offset` (``stride`` is for the simulator's twin, which gets the bare tile)."""
        _ldsm_a_raw(_ffi.from_buffer(r[ri:]), uint32(addr))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_b_at(r, ri, smem, addr, stride):
        """:func:`ldsm_x4_b_a` at a precomputed address (with the lane's :func:`lane_offset_b`)."""
        _ldsm_a_raw(_ffi.from_buffer(r[ri:]), uint32(addr))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_trans_at(r, ri, smem, addr, stride):
        """:func:`ldsm_x4_trans_a` at a precomputed address (with the lane's :func:`lane_offset`)."""
        _ldsm_t_a_raw(_ffi.from_buffer(r[ri:]), uint32(addr))

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_trans_b_at(r, ri, smem, addr, stride):
        """:func:`ldsm_x4_trans_b_a` at a precomputed address (with :func:`lane_offset_b`)."""
        _ldsm_t_a_raw(_ffi.from_buffer(r[ri:]), uint32(addr))

    @cuda.jit(device=True, forceinline=True)
    def cp_async16_a(smem, sbase, soff, gmem, goff, nvalid):
        _cp_a_raw(uint32(sbase + 2 * soff), _ffi.from_buffer(gmem), goff * 2, int32(nvalid * 2))

    @cuda.jit(device=True, forceinline=True)
    def st_global16_a(gmem, goff, smem, sbase, soff):
        _stg_a_raw(_ffi.from_buffer(gmem), goff * 2, uint32(sbase + 2 * soff))

    @cuda.jit(device=True, forceinline=True)
    def mma_z(c, ci, a, ai, b0, b1):
        """c[ci:ci+4] = A·B (the accumulator's old value is ignored)."""
        _mma_z_raw(_ffi.from_buffer(c[ci:]), _ffi.from_buffer(a[ai:]), b0, b1)
    pack_f16x2 = cuda.declare_device("fs_pack_f16x2", "uint32(float32, float32)", link=_link)

    @cuda.jit(device=True, forceinline=True)
    def mma(c, ci, a, ai, b0, b1):
        """c[ci:ci+4] += A·B for the warp's 16 x 8 x 16 tile; A in a[ai:ai+4], B in (b0, b1)."""
        _mma_raw(_ffi.from_buffer(c[ci:]), _ffi.from_buffer(a[ai:]), b0, b1)

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4(r, ri, smem, base, stride, row0, col0):
        """r[ri:ri+4] = the four 8 x 8 f16 matrices at (row0 + 8(i&1), col0 + 8(i>>1)) of the
        shared f16 array ``smem`` (flat; element (row, col) at base + row·stride + col)."""
        lane = cuda.laneid
        i = lane >> 3
        off = base + (row0 + (i & 1) * 8 + (lane & 7)) * stride + col0 + (i >> 1) * 8
        _ldsm_raw(_ffi.from_buffer(r[ri:]), _ffi.from_buffer(smem), off * 2)

    @cuda.jit(device=True, forceinline=True)
    def ldsm_x4_trans(r, ri, smem, base, stride, row0, col0):
        """As :func:`ldsm_x4`, each matrix transposed."""
        lane = cuda.laneid
        i = lane >> 3
        off = base + (row0 + (i & 1) * 8 + (lane & 7)) * stride + col0 + (i >> 1) * 8
        _ldsm_t_raw(_ffi.from_buffer(r[ri:]), _ffi.from_buffer(smem), off * 2)

    @cuda.jit(device=True, forceinline=True)
    def cp_async16(smem, soff, gmem, goff, nvalid):
        """Copy 8 f16 from ``gmem`` (flat element offset ``goff``) to ``smem`` (offset ``soff``),
        asynchronously; only the first ``nvalid`` (0 or 8) come from memory, the rest are 0."""
        _cp_raw(_ffi.from_buffer(smem), soff * 2, _ffi.from_buffer(gmem), goff * 2, nvalid * 2)

    @cuda.jit(device=True, forceinline=True)
    def st_global16(gmem, goff, smem, soff):
        """Copy 8 f16 from ``smem`` (flat offset ``soff``) to ``gmem`` (flat offset ``goff``)."""
        _stg_raw(_ffi.from_buffer(gmem), goff * 2, _ffi.from_buffer(smem), soff * 2)

    @cuda.jit(device=True, forceinline=True)
    def cp_async_commit():
        _commit_raw()

    @cuda.jit(device=True, forceinline=True)
    def cp_async_wait(pending):
        """Wait until at most ``pending`` (0 or 1) committed groups are still in flight."""
        if pending == 0:
            _wait0_raw()
        else:
            _wait1_raw()

    @cuda.jit(device=True, forceinline=True)
    def pair_swap2(x, y):
        """(x, y) of the lane l ^ 1 (the other lane of this lane's pair)."""
        return cuda.shfl_xor_sync(0xFFFFFFFF, x, 1), cuda.shfl_xor_sync(0xFFFFFFFF, y, 1)

    @cuda.jit(device=True, forceinline=True)
    def quad_max2(x, y):
        """(max of x, max of y) over the 4 lanes of a quad (lanes 4g..4g+3)."""
        x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 1))
        y = max(y, cuda.shfl_xor_sync(0xFFFFFFFF, y, 1))
        x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 2))
        y = max(y, cuda.shfl_xor_sync(0xFFFFFFFF, y, 2))
        return x, y

    @cuda.jit(device=True, forceinline=True)
    def quad_sum2(x, y):
        """(sum of x, sum of y) over the 4 lanes of a quad."""
        x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 1)
        y += cuda.shfl_xor_sync(0xFFFFFFFF, y, 1)
        x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 2)
        y += cuda.shfl_xor_sync(0xFFFFFFFF, y, 2)
        return x, y

else:
    # -----------------------------------------------------------------------------------------
    # The simulator's twins.  Plain Python (the simulator runs device functions as Python), the
    # same per-lane results.  Arithmetic is float32 like the hardware's accumulators; the order
    # of the 16 products inside one mma differs from the tensor core's, which changes nothing
    # beyond float32 rounding.

    import threading

    # The simulator creates a static shared array the first time any thread reaches its line,
    # with no lock: two threads arriving together can each get a private array (seen here as a
    # rare NaN).  Every scratch array below is taken under this lock.
    _ALLOC_LOCK = threading.Lock()

    def _lane():
        tid = int(cuda.threadIdx.x)
        return tid // 32, tid % 32

    def _halves(word) -> np.ndarray:
        return np.array([word], dtype=np.uint32).view(np.float16).astype(np.float32)

    @cuda.jit(device=True)
    def pack_f16x2(lo, hi):
        return int(np.array([lo, hi], dtype=np.float32).astype(np.float16).view(np.uint32)[0])

    @cuda.jit(device=True)
    def ex2(x):
        return float32(math.exp2(x)) if x != -math.inf else float32(0.0)

    @cuda.jit(device=True)
    def mma(c, ci, a, ai, b0, b1):
        warp, lane = _lane()
        g, t = lane // 4, lane % 4
        with _ALLOC_LOCK:
            sa = cuda.shared.array((MAX_WARPS, 16, 16), float32)
            sb = cuda.shared.array((MAX_WARPS, 16, 8), float32)
        sa[warp, g, 2 * t:2 * t + 2] = _halves(a[ai])
        sa[warp, g + 8, 2 * t:2 * t + 2] = _halves(a[ai + 1])
        sa[warp, g, 2 * t + 8:2 * t + 10] = _halves(a[ai + 2])
        sa[warp, g + 8, 2 * t + 8:2 * t + 10] = _halves(a[ai + 3])
        sb[warp, 2 * t:2 * t + 2, g] = _halves(b0)
        sb[warp, 2 * t + 8:2 * t + 10, g] = _halves(b1)
        cuda.syncthreads()
        A, B = sa[warp], sb[warp]
        for e, (r, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
            c[ci + e] = np.float32(c[ci + e]) + np.float32(np.dot(A[r, :], B[:, col]))
        cuda.syncthreads()

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
            r[ri + i] = pack_f16x2(lo, hi)

    @cuda.jit(device=True)
    def ldsm_x4(r, ri, smem, base, stride, row0, col0):
        _ldsm(r, ri, smem, base, stride, row0, col0, False)

    @cuda.jit(device=True)
    def ldsm_x4_trans(r, ri, smem, base, stride, row0, col0):
        _ldsm(r, ri, smem, base, stride, row0, col0, True)

    @cuda.jit(device=True)
    def cp_async16(smem, soff, gmem, goff, nvalid):
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
    def ldsm_x4_b_a(r, ri, smem, sbase, loff, base, stride, row0, col0):
        _ldsm(r, ri, smem, base, stride, row0, col0, False, True)

    @cuda.jit(device=True)
    def ldsm_x4_a(r, ri, smem, sbase, loff, base, stride, row0, col0):
        _ldsm(r, ri, smem, base, stride, row0, col0, False)

    @cuda.jit(device=True)
    def ldsm_x4_trans_a(r, ri, smem, sbase, loff, base, stride, row0, col0):
        _ldsm(r, ri, smem, base, stride, row0, col0, True)

    @cuda.jit(device=True)
    def ldsm_x4_trans_b_a(r, ri, smem, sbase, loffb, base, stride, row0, col0):
        _ldsm(r, ri, smem, base, stride, row0, col0, True, True)

    @cuda.jit(device=True)
    def cp_async16_a(smem, sbase, soff, gmem, goff, nvalid):
        cp_async16(smem, soff, gmem, goff, nvalid)

    @cuda.jit(device=True)
    def opaque_u32(x):
        return x

    # The simulator's shared window starts at 0 and its lane offsets are 0: ``addr`` is twice the
    # element offset of the tile's first element.
    @cuda.jit(device=True)
    def ldsm_x4_at(r, ri, smem, addr, stride):
        _ldsm(r, ri, smem, addr // 2, stride, 0, 0, False)

    @cuda.jit(device=True)
    def ldsm_x4_b_at(r, ri, smem, addr, stride):
        _ldsm(r, ri, smem, addr // 2, stride, 0, 0, False, True)

    @cuda.jit(device=True)
    def ldsm_x4_trans_at(r, ri, smem, addr, stride):
        _ldsm(r, ri, smem, addr // 2, stride, 0, 0, True)

    @cuda.jit(device=True)
    def ldsm_x4_trans_b_at(r, ri, smem, addr, stride):
        _ldsm(r, ri, smem, addr // 2, stride, 0, 0, True, True)

    @cuda.jit(device=True)
    def st_global16_a(gmem, goff, smem, sbase, soff):
        st_global16(gmem, goff, smem, soff)

    @cuda.jit(device=True)
    def mma_z(c, ci, a, ai, b0, b1):
        for e in range(4):
            c[ci + e] = 0.0
        mma(c, ci, a, ai, b0, b1)

    @cuda.jit(device=True)
    def st_global16(gmem, goff, smem, soff):
        flat = gmem.reshape(-1) if hasattr(gmem, "reshape") else gmem
        for e in range(8):
            flat[goff + e] = smem[soff + e]

    @cuda.jit(device=True)
    def cp_async_commit():
        pass

    @cuda.jit(device=True)
    def cp_async_wait(pending):
        pass

    def _quad(x, y, op):
        warp, lane = _lane()
        tid = warp * 32 + lane
        with _ALLOC_LOCK:
            sx = cuda.shared.array(32 * MAX_WARPS, float32)
            sy = cuda.shared.array(32 * MAX_WARPS, float32)
        sx[tid] = x
        sy[tid] = y
        cuda.syncthreads()
        q = tid - tid % 4
        rx, ry = op(sx[q:q + 4]), op(sy[q:q + 4])
        cuda.syncthreads()
        return float32(rx), float32(ry)

    _RED_LOCK = threading.Lock()

    @cuda.jit(device=True)
    def red_v2(g, off, a, b):
        flat = g.reshape(-1)
        with _RED_LOCK:
            flat[off] += a
            flat[off + 1] += b

    @cuda.jit(device=True)
    def red_v4(g, off, a, b, c, d):
        flat = g.reshape(-1)
        with _RED_LOCK:
            flat[off] += a
            flat[off + 1] += b
            flat[off + 2] += c
            flat[off + 3] += d

    @cuda.jit(device=True)
    def pair_swap2(x, y):
        warp, lane = _lane()
        tid = warp * 32 + lane
        with _ALLOC_LOCK:
            sx = cuda.shared.array(32 * MAX_WARPS, float32)
            sy = cuda.shared.array(32 * MAX_WARPS, float32)
        sx[tid] = x
        sy[tid] = y
        cuda.syncthreads()
        rx, ry = sx[tid ^ 1], sy[tid ^ 1]
        cuda.syncthreads()
        return float32(rx), float32(ry)

    @cuda.jit(device=True)
    def quad_max2(x, y):
        return _quad(x, y, np.max)

    @cuda.jit(device=True)
    def quad_sum2(x, y):
        return _quad(x, y, lambda v: np.float32(v[0] + v[1] + v[2] + v[3]))


__all__ = ["SIM", "MAX_WARPS", "mma", "mma_z", "ldsm_x4", "ldsm_x4_trans", "cp_async16", "st_global16",
           "cp_async_commit", "cp_async_wait", "smem_u32", "lane_offset", "lane_offset_b", "ldsm_x4_a",
           "ldsm_x4_b_a", "ldsm_x4_trans_a", "ldsm_x4_trans_b_a", "cp_async16_a", "st_global16_a", "ex2",
           "opaque_u32", "ldsm_x4_at", "ldsm_x4_b_at", "ldsm_x4_trans_at", "ldsm_x4_trans_b_at", "device_inline",
           "pack_f16x2", "pair_swap2", "red_v2", "red_v4", "quad_max2", "quad_sum2", "jit_kernel", "int32"]


# ---------------------------------------------------------------------------------------------
# fp32 helpers (fwd_fp32_v1): 16-byte shared loads into registers, 4-byte shared stores, fp32
# cp.async, and reductions over the 8 lanes 8g..8g+7 of a warp.  Shared memory is addressed by
# byte addresses in the shared window (``smem_u32_f32`` + 4·float offset); under the simulator
# that window starts at 0, so the twins index the array with address // 4.

_CU_F32 = r"""
extern "C" __device__ int fs_smem_u32_f32(unsigned* ret, const float* smem) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(smem));
    *ret = a;
    return 0;
}

extern "C" __device__ int fs_lds128_f32(int* ret, float* r, unsigned a) {
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]) : "r"(a) : "memory");
    return 0;
}

extern "C" __device__ int fs_sts32_f32(int* ret, unsigned a, float x) {
    asm volatile("st.shared.f32 [%0], %1;" :: "r"(a), "f"(x) : "memory");
    return 0;
}

extern "C" __device__ int fs_sts32_u32(int* ret, unsigned a, unsigned x) {
    asm volatile("st.shared.u32 [%0], %1;" :: "r"(a), "r"(x) : "memory");
    return 0;
}

extern "C" __device__ int fs_lds64_f32(int* ret, float* r, unsigned a) {
    asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];" : "=f"(r[0]), "=f"(r[1]) : "r"(a) : "memory");
    return 0;
}

// 4 floats global -> shared, asynchronously; src_bytes < 16 zero-fills the rest.
extern "C" __device__ int fs_cp_async16_f32(int* ret, unsigned a, const float* gmem, long long goff, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(a), "l"(gmem + goff), "r"(src_bytes) : "memory");
    return 0;
}
"""

if not SIM:
    _link_f32 = cuda.CUSource(_CU_F32)
    _smem_u32_f32_raw = cuda.declare_device("fs_smem_u32_f32", "uint32(CPointer(float32))", link=_link_f32)
    _lds128_f32_raw = cuda.declare_device("fs_lds128_f32", "int32(CPointer(float32), uint32)", link=_link_f32)
    _sts32_f32_raw = cuda.declare_device("fs_sts32_f32", "int32(uint32, float32)", link=_link_f32)
    _sts32_u32_raw = cuda.declare_device("fs_sts32_u32", "int32(uint32, uint32)", link=_link_f32)
    _lds64_f32_raw = cuda.declare_device("fs_lds64_f32", "int32(CPointer(float32), uint32)", link=_link_f32)
    _cp_f32_raw = cuda.declare_device("fs_cp_async16_f32", "int32(uint32, CPointer(float32), int64, int32)",
                                      link=_link_f32)

    @cuda.jit(device=True, forceinline=True)
    def smem_u32_f32(smem):
        """The 32-bit shared-window byte address of a float32 shared array's first element (GPU); 0 in
        the simulator."""
        return _smem_u32_f32_raw(_ffi.from_buffer(smem))

    @cuda.jit(device=True, forceinline=True)
    def lds128_f32_a(r, ri, smem, a, off):
        """r[ri:ri+4] = the 4 floats at shared byte address ``a`` + 4·``off`` (16-byte aligned): one
        LDS.128.  ``smem`` is the shared array (read by the simulator's twin only)."""
        _lds128_f32_raw(_ffi.from_buffer(r[ri:]), uint32(a + 4 * off))

    @cuda.jit(device=True, forceinline=True)
    def sts32_f32_a(smem, a, off, x):
        """Store float ``x`` at shared byte address ``a`` + 4·``off``."""
        _sts32_f32_raw(uint32(a + 4 * off), float32(x))

    @cuda.jit(device=True, forceinline=True)
    def sts32_u32_a(smem, a, x):
        """Store the 32-bit word ``x`` (two packed f16, say) at shared byte address ``a`` (4-byte
        aligned).  ``smem`` is a uint32 view of the shared memory (written by the simulator's twin)."""
        _sts32_u32_raw(uint32(a), uint32(x))

    @cuda.jit(device=True, forceinline=True)
    def lds64_f32_a(r, ri, smem, a):
        """r[ri:ri+2] = the 2 floats at shared byte address ``a`` (8-byte aligned): one LDS.64."""
        _lds64_f32_raw(_ffi.from_buffer(r[ri:]), uint32(a))

    @cuda.jit(device=True, forceinline=True)
    def cp_async16_f32_a(smem, a, gmem, goff, nvalid):
        """Copy 4 floats from ``gmem`` (flat element offset ``goff``) to shared byte address ``a``,
        asynchronously; only the first ``nvalid`` (0 or 4) come from memory, the rest are 0."""
        _cp_f32_raw(uint32(a), _ffi.from_buffer(gmem), goff, int32(nvalid * 4))

    @cuda.jit(device=True, forceinline=True)
    def oct_max(x):
        """max of x over the 8 lanes 8g..8g+7 of the warp (g = lane // 8)."""
        x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 1))
        x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 2))
        return max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 4))

    @cuda.jit(device=True, forceinline=True)
    def oct_sum(x):
        """Sum of x over the 8 lanes 8g..8g+7 of the warp."""
        x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 1)
        x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 2)
        return x + cuda.shfl_xor_sync(0xFFFFFFFF, x, 4)

else:

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

    def _oct(x, op):
        warp, lane = _lane()
        tid = warp * 32 + lane
        with _ALLOC_LOCK:
            sx = cuda.shared.array(32 * MAX_WARPS, float32)
        sx[tid] = x
        cuda.syncthreads()
        g = tid - tid % 8
        r = op(sx[g:g + 8])
        cuda.syncthreads()
        return float32(r)

    def _tree_sum8(v):
        # the butterfly's order: lanes (0+1)+(2+3) ... in float32, as the shuffles on the GPU
        a = [np.float32(v[i]) + np.float32(v[i ^ 1]) for i in range(8)]
        b = [a[i] + a[i ^ 2] for i in range(8)]
        return b[0] + b[4]

    @cuda.jit(device=True)
    def oct_max(x):
        return _oct(x, np.max)

    @cuda.jit(device=True)
    def oct_sum(x):
        return _oct(x, _tree_sum8)


__all__ += ["smem_u32_f32", "lds128_f32_a", "sts32_f32_a", "sts32_u32_a", "lds64_f32_a", "cp_async16_f32_a",
            "oct_max", "oct_sum"]


# ---------------------------------------------------------------------------------------------
# TF32 tensor cores for exact-fp32 products (bwd_fp32_v2): ``mma.m16n8k8`` with tf32 operands and
# f32 accumulators, and the rounding of an f32 to tf32 that splits it as x = hi + lo (3xTF32:
# A·B ≈ A_lo·B_hi + A_hi·B_lo + A_hi·B_hi, the A_lo·B_lo term being below f32's rounding).
#
# Fragment layout (PTX ISA, m16n8k8 .tf32), lane l, g = l // 4, t = l % 4, one element a register:
#   A (16 x 8, row major): a0 = A[g, t], a1 = A[g+8, t], a2 = A[g, t+4], a3 = A[g+8, t+4];
#   B (8 x 8, "col"):      b0 = B[t, g], b1 = B[t+4, g];
#   C, D (16 x 8, f32):    c0, c1 = C[g, 2t:2t+2], c2, c3 = C[g+8, 2t:2t+2].
# The tensor core reads only the 19 high bits (sign, exponent, 10 mantissa bits) of a tf32
# operand register, so ``lo`` = x − hi may be passed as it is: the 13 bits it loses are below
# 2^-21 of x.

_CU_TF32 = r"""
extern "C" __device__ int fs_mma1688_tf32(int* ret, float* c, const float* a, const float* b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
    return 0;
}

// x rounded to the nearest tf32 (ties away from zero), as an f32 whose 13 low bits are 0: two
// integer instructions (cvt.rna.tf32.f32 compiles to five on sm_90, with a test for inf/NaN
// that this needs not: inf stays inf, a NaN stays a NaN, and a finite x that rounds past the
// largest tf32 becomes inf, as rounding should make it).
extern "C" __device__ int fs_tf32_hi(float* ret, float x) {
    *ret = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xFFFFE000u);
    return 0;
}
"""

if not SIM:
    _link_tf32 = cuda.CUSource(_CU_TF32)
    _mma_tf32_raw = cuda.declare_device("fs_mma1688_tf32",
                                        "int32(CPointer(float32), CPointer(float32), CPointer(float32))",
                                        link=_link_tf32)
    #: x rounded to the nearest tf32 value (an f32 with its 13 low mantissa bits 0).
    tf32_hi = cuda.declare_device("fs_tf32_hi", "float32(float32)", link=_link_tf32)

    @cuda.jit(device=True, forceinline=True)
    def _mma_tf32(c, ci, a, ai, b, bi):
        """c[ci:ci+4] += A·B on the tensor cores: A the 16 x 8 tf32 fragment a[ai:ai+4] (a0..a3),
        B the 8 x 8 fragment b[bi:bi+2]; every lane of the warp calls it together."""
        _mma_tf32_raw(_ffi.from_buffer(c[ci:]), _ffi.from_buffer(a[ai:]), _ffi.from_buffer(b[bi:]))

    @cuda.jit(device=True, forceinline=True)
    def mma3_tf32(acc, ah, al, bh, bl, M, N):
        """acc[4(mN + n):+4] += A_m·B_n for M A tiles (ah, al: hi and lo parts, 4 registers a tile)
        and N B tiles (bh, bl: 2 a tile), as 3xTF32: A_lo·B_hi, A_hi·B_lo, A_hi·B_hi, small terms
        first, each term over all M·N tiles before the next so that no mma waits on the last."""
        for m in range(M):
            for n in range(N):
                _mma_tf32(acc, 4 * (m * N + n), al, 4 * m, bh, 2 * n)
        for m in range(M):
            for n in range(N):
                _mma_tf32(acc, 4 * (m * N + n), ah, 4 * m, bl, 2 * n)
        for m in range(M):
            for n in range(N):
                _mma_tf32(acc, 4 * (m * N + n), ah, 4 * m, bh, 2 * n)

else:

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


__all__ += ["tf32_hi", "mma3_tf32"]
