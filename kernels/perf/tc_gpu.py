"""The GPU target of :mod:`kernels.perf.tc`: each helper is a few lines of inline PTX in a CUDA C++
device function (``cuda.declare_device(..., link=cuda.CUSource(...))``), wrapped in a Numba
device function that passes its local/shared arrays with ``ffi.from_buffer``.  With link-time
optimisation (numba-cuda's default when nvJitLink is present) the calls are inlined and the
fragment arrays live in registers.  Import the helpers through :mod:`kernels.perf.tc`, which
documents them; this module is imported only where ``NUMBA_ENABLE_CUDASIM`` is off.
"""

from __future__ import annotations

from functools import cache

from cffi import FFI
from numba import cuda, float32, int32, uint32

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

// The same where ok != 0, as one predicated PTX instruction (ptxas may still branch around it
// where ok is not a constant: bwd_fp16_v3's SASS does), and without a memory clobber: nothing
// in the kernels reads the reduced buffer, so the compiler may keep its addresses as one base
// register plus immediate offsets and order the reductions freely.
extern "C" __device__ int fs_red_v2_f32_if(int* ret, float* g, long long off, float a, float b, int ok) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, %3, 0;\n\t@p red.global.v2.f32.add [%0], {%1, %2};\n\t}"
                 :: "l"(g + off), "f"(a), "f"(b), "r"(ok));
    return 0;
}

extern "C" __device__ int fs_red_v4_f32(int* ret, float* g, long long off, float a, float b, float c, float d) {
    asm volatile("red.global.v4.f32.add [%0], {%1, %2, %3, %4};"
                 :: "l"(g + off), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
    return 0;
}
"""

_ffi = FFI()
_link = cuda.CUSource(_CU)
_mma_raw = cuda.declare_device("fs_mma16816", "int32(CPointer(float32), CPointer(uint32), uint32, uint32)",
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
_red2_if_raw = cuda.declare_device("fs_red_v2_f32_if", "int32(CPointer(float32), int64, float32, float32, int32)",
                                   link=_link)
_red4_raw = cuda.declare_device("fs_red_v4_f32",
                                "int32(CPointer(float32), int64, float32, float32, float32, float32)",
                                link=_link)


@cuda.jit(device=True, forceinline=True)
def red_v2(g, off, a, b):
    """g.flat[off:off+2] += (a, b), atomically per element (one 8-byte reduction; ``off`` even)."""
    _red2_raw(_ffi.from_buffer(g), off, a, b)


@cuda.jit(device=True, forceinline=True)
def red_v2_if(g, off, a, b, ok):
    """:func:`red_v2` where ``ok`` (a predicated PTX instruction; with ``ok`` a constant, no test at all)."""
    _red2_if_raw(_ffi.from_buffer(g), off, a, b, int32(ok))


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
    column 8·(l >> 4), for a tile with row stride ``stride`` (the ``loff`` of :func:`tile_addr`)."""
    lane = cuda.laneid
    return ((lane & 7) + ((lane >> 3) & 1) * 8) * stride + (lane >> 4) * 8


@cuda.jit(device=True, forceinline=True)
def lane_offset_b(stride):
    """The lane's offset for :func:`ldsm_x4_b` and :func:`ldsm_x4_trans_b`: row (l & 7) + 8·(l >> 4),
    column 8·((l >> 3) & 1)."""
    lane = cuda.laneid
    return ((lane & 7) + (lane >> 4) * 8) * stride + ((lane >> 3) & 1) * 8


@cuda.jit(device=True, forceinline=True)
def opaque_u32(x):
    """``x`` as a uint32 the compiler cannot see through (it is not hoisted out of loops)."""
    return _opaque_raw(uint32(x))


@cuda.jit(device=True, forceinline=True)
def ldsm_x4(r, ri, smem, addr, stride):
    _ldsm_a_raw(_ffi.from_buffer(r[ri:]), uint32(addr))


@cuda.jit(device=True, forceinline=True)
def ldsm_x4_trans(r, ri, smem, addr, stride):
    _ldsm_t_a_raw(_ffi.from_buffer(r[ri:]), uint32(addr))


# The ``_b`` forms differ only in the lane offsets folded into ``addr`` (:func:`lane_offset_b`):
# on the GPU the same instruction.
ldsm_x4_b = ldsm_x4
ldsm_x4_trans_b = ldsm_x4_trans


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


# ---------------------------------------------------------------------------------------------
# bf16 forms of the products and the packing (the fp16 kernels compiled with BF16 on): the same
# fragment layouts (PTX ISA: m16n8k16 with .bf16 inputs has .f16's register layout), so ldmatrix
# and cp.async move bf16 tiles unchanged; only the mma and the f32 -> 16-bit rounding differ.

_CU_BF16 = r"""
extern "C" __device__ int fs_mma16816_bf16(int* ret, float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    return 0;
}

extern "C" __device__ int fs_mma16816_z_bf16(int* ret, float* c, const unsigned* a, unsigned b0, unsigned b1) {
    float z = 0.f;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
    return 0;
}

// Two f32 to one bf16x2 register, round to nearest even: lo in bits 0..15, hi in 16..31.
extern "C" __device__ int fs_pack_bf16x2(unsigned* ret, float lo, float hi) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(*ret) : "f"(hi), "f"(lo));
    return 0;
}
"""

_link_bf16 = cuda.CUSource(_CU_BF16)
_mma_bf16_raw = cuda.declare_device("fs_mma16816_bf16", "int32(CPointer(float32), CPointer(uint32), uint32, uint32)",
                                    link=_link_bf16)
_mma_z_bf16_raw = cuda.declare_device("fs_mma16816_z_bf16",
                                      "int32(CPointer(float32), CPointer(uint32), uint32, uint32)", link=_link_bf16)
#: Two floats as one bf16x2 word (round to nearest even), ``lo`` in the low half.
pack_bf16x2 = cuda.declare_device("fs_pack_bf16x2", "uint32(float32, float32)", link=_link_bf16)


@cuda.jit(device=True, forceinline=True)
def mma_bf16(c, ci, a, ai, b0, b1):
    """:func:`mma` with bf16 A and B fragments."""
    _mma_bf16_raw(_ffi.from_buffer(c[ci:]), _ffi.from_buffer(a[ai:]), b0, b1)


@cuda.jit(device=True, forceinline=True)
def mma_z_bf16(c, ci, a, ai, b0, b1):
    """:func:`mma_z` with bf16 A and B fragments."""
    _mma_z_bf16_raw(_ffi.from_buffer(c[ci:]), _ffi.from_buffer(a[ai:]), b0, b1)


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

extern "C" __device__ int fs_sts64_f32(int* ret, unsigned a, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(a), "f"(x), "f"(y) : "memory");
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

extern "C" __device__ int fs_sts128_f32(int* ret, unsigned a, float x, float y, float z, float w) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
    return 0;
}

// 4 floats global -> shared, asynchronously; src_bytes < 16 zero-fills the rest.
extern "C" __device__ int fs_cp_async16_f32(int* ret, unsigned a, const float* gmem, long long goff, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(a), "l"(gmem + goff), "r"(src_bytes) : "memory");
    return 0;
}
"""

_link_f32 = cuda.CUSource(_CU_F32)
_smem_u32_f32_raw = cuda.declare_device("fs_smem_u32_f32", "uint32(CPointer(float32))", link=_link_f32)
_lds128_f32_raw = cuda.declare_device("fs_lds128_f32", "int32(CPointer(float32), uint32)", link=_link_f32)
_sts32_f32_raw = cuda.declare_device("fs_sts32_f32", "int32(uint32, float32)", link=_link_f32)
_sts64_f32_raw = cuda.declare_device("fs_sts64_f32", "int32(uint32, float32, float32)", link=_link_f32)
_sts128_f32_raw = cuda.declare_device("fs_sts128_f32", "int32(uint32, float32, float32, float32, float32)",
                                     link=_link_f32)
# fp16's 16-byte shared -> global copy (one LDS.128, one STG.E.128), its offset in bytes.
_stg_f32_raw = cuda.declare_device("fs_st_global16_a", "int32(CPointer(float32), int64, uint32)", link=_link)
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
def sts64_f32_a(smem, a, x, y):
    """Store floats ``x``, ``y`` at shared byte address ``a`` (8-byte aligned): one STS.64."""
    _sts64_f32_raw(uint32(a), float32(x), float32(y))


@cuda.jit(device=True, forceinline=True)
def sts128_f32_a(smem, a, x, y, z, w):
    """Store floats ``x``, ``y``, ``z``, ``w`` at shared byte address ``a`` (16-byte aligned): one
    STS.128."""
    _sts128_f32_raw(uint32(a), float32(x), float32(y), float32(z), float32(w))


@cuda.jit(device=True, forceinline=True)
def st_global16_f32_a(gmem, goff, smem, a):
    """The 4 floats at shared byte address ``a`` (16-byte aligned) to ``gmem`` from flat element
    offset ``goff``: one LDS.128 and one 16-byte global store."""
    _stg_f32_raw(_ffi.from_buffer(gmem), goff * 4, uint32(a))


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



# ---------------------------------------------------------------------------------------------
# Warpgroup products (Hopper, sm_90a: numba-cuda compiles for (9, 0, "a") on a 9.0 GPU):
# ``wgmma.mma_async`` m64nNk16, f32 accumulators, B (and for ``wgmma_ss`` A too) read by the
# tensor cores from shared memory through 64-bit matrix descriptors (:func:`kernels.perf.tc.wg_desc`).
# One helper issues every k-step of a product between ``wgmma.fence`` and ``commit_group`` /
# ``wait_group 0``: to the compiler the product is one synchronous statement, so it never touches
# the accumulators while the tensor cores own them.  The descriptor of k-step ks adds, in 16-byte
# units, (ks // KPA)·step (the next swizzle atom: 64 halves of K further with 128-byte swizzling,
# KPA = 4; 32 with 64-byte, KPA = 2) and (ks % KPA)·2 (32 bytes into the atom's rows) for a
# K-major operand, ks·step for an MN-major one.

_CU_WG = r"""
extern "C" __device__ int fs_fence_proxy_async(int* ret) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    return 0;
}
"""

_link_wg = cuda.CUSource(_CU_WG)
_fence_proxy_raw = cuda.declare_device("fs_fence_proxy_async", "int32()", link=_link_wg)


@cuda.jit(device=True, forceinline=True)
def fence_proxy_async():
    """Make this thread's shared-memory writes (st.shared, completed cp.async) visible to the async
    proxy that ``wgmma`` reads shared memory through; then a barrier, before the product."""
    _fence_proxy_raw()


_WAIT0 = 'asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");'


def _wg_operands(n: int) -> tuple[str, str]:
    regs = ",".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))
    return "{" + regs + "}", outs


def _wg_source_ss(name: str, ty: str, n: int, kt: int, astep: int, bstep: int, kpa: int = 4) -> str:
    regs, outs = _wg_operands(n)
    h = n // 2
    return rf"""
extern "C" __device__ int {name}(int* ret, float* d, unsigned long long da, unsigned long long db) {{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < {kt}; ++ks) {{
        unsigned long long a = da + (unsigned long long)((ks / {kpa}) * {astep} + (ks % {kpa}) * 2);
        unsigned long long b = db + (unsigned long long)((ks / {kpa}) * {bstep} + (ks % {kpa}) * 2);
        asm volatile("{{\n.reg .pred p;\nsetp.ne.b32 p, %{h + 2}, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {regs}, %{h}, %{h + 1}, "
                     "p, 1, 1, 0, 0;\n}}\n"
                     : {outs} : "l"(a), "l"(b), "r"(ks));
    }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    {_WAIT0}
    return 0;
}}
"""


def _wg_source_rs(name: str, ty: str, n: int, ks_: int, bstep: int) -> str:
    regs, outs = _wg_operands(n)
    h = n // 2
    return rf"""
extern "C" __device__ int {name}(int* ret, float* d, const unsigned* a, unsigned long long db) {{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < {ks_}; ++kk) {{
        unsigned long long b = db + (unsigned long long)(kk * {bstep});
        asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {regs}, "
                     "{{%{h}, %{h + 1}, %{h + 2}, %{h + 3}}}, %{h + 4}, 1, 1, 1, 1;\n"
                     : {outs} : "r"(a[4 * kk]), "r"(a[4 * kk + 1]), "r"(a[4 * kk + 2]), "r"(a[4 * kk + 3]), "l"(b));
    }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    {_WAIT0}
    return 0;
}}
"""


@cache
def wgmma_ss(N: int, KT: int, ASTEP: int, BSTEP: int, BF16: bool = False, KPA: int = 4):
    """``ss(d, sm, da, db)``: d[0:N/2] = A·Bᵀ over KT k-steps of 16 (the first with the accumulator's
    old value ignored): A the warpgroup's 64 rows and B N rows, both K-major and swizzled in
    shared memory, described by ``da``, ``db`` at k-step 0 (ASTEP, BSTEP: their swizzle atoms'
    stride in 16-byte units; KPA k-steps an atom row: 4 for 128-byte swizzling, 2 for 64-byte).
    d in the C layout of ``mma.sync`` for the warp's 16 rows (warp w % 4 of the warpgroup: rows
    16(w % 4) + g, + 8; columns 8n + 2t, + 1).  ``sm`` is read by the simulator's twin only."""
    ty = "bf16" if BF16 else "f16"
    name = f"fs_wg_ss_{ty}_n{N}_k{KT}_{ASTEP}_{BSTEP}_a{KPA}"
    raw = cuda.declare_device(name, "int32(CPointer(float32), uint64, uint64)",
                              link=cuda.CUSource(_wg_source_ss(name, ty, N, KT, ASTEP, BSTEP, KPA)))

    @cuda.jit(device=True, forceinline=True)
    def ss(d, sm, da, db):
        raw(_ffi.from_buffer(d), da, db)

    return ss


@cache
def wgmma_rs(N: int, KS: int, BSTEP: int, BF16: bool = False):
    """``rs(d, a, sm, db)``: d[0:N/2] += A·B over KS k-steps of 16: A from registers (a[4kk:4kk+4],
    the A layout of ``mma.sync`` m16n8k16 for the warp's 16 rows), B (16·KS x N) MN-major and
    swizzled in shared memory (the mode is the descriptor's), described by ``db`` at k-step 0,
    the next k-step BSTEP 16-byte units further."""
    ty = "bf16" if BF16 else "f16"
    name = f"fs_wg_rs_{ty}_n{N}_k{KS}_{BSTEP}"
    raw = cuda.declare_device(name, "int32(CPointer(float32), CPointer(uint32), uint64)",
                              link=cuda.CUSource(_wg_source_rs(name, ty, N, KS, BSTEP)))

    @cuda.jit(device=True, forceinline=True)
    def rs(d, a, sm, db):
        raw(_ffi.from_buffer(d), _ffi.from_buffer(a), db)

    return rs


# ---------------------------------------------------------------------------------------------
# Tensor-memory-accelerator copies (Hopper: ``cp.async.bulk.tensor``, fwd_fp16_v7).  One thread
# asks the TMA unit for a box of a tensor; the unit writes it into shared memory, swizzled as its
# tensor map says, and counts the bytes on an mbarrier in shared memory, on which every thread
# waits.  The tensor map (``CUtensorMap``, 128 bytes, made on the host by
# ``cuTensorMapEncodeTiled``: :mod:`kernels.perf.tma`) is read from global memory, which the PTX
# allows besides the ``__grid_constant__`` kernel parameter that CUDA C++ uses and Numba does not
# declare.  The barrier's phase completes when its one arrival (``mbar_expect_tx``, made by the
# thread that issues the copies, before them) has come and the bytes it announced have landed.

_CU_TMA = r"""
extern "C" __device__ int fs_mbar_init(int* ret, unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    return 0;
}

extern "C" __device__ int fs_mbar_expect_tx(int* ret, unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
    return 0;
}

extern "C" __device__ int fs_mbar_wait(int* ret, unsigned bar, unsigned parity) {
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
    return 0;
}

extern "C" __device__ int fs_tma_load3(int* ret, unsigned dst, const unsigned char* map, int c0, int c1, int c2,
                                       unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
    return 0;
}

// Bulk reductions (sm_90): the TMA unit adds nbytes of f32 at shared byte ``src`` into global memory
// at g + off, atomically per element, as one bulk group of the issuing thread; that thread waits
// for the unit to have read its groups' shared bytes (``.read``) or finished them.
extern "C" __device__ int fs_bulk_red_f32(int* ret, float* g, long long off, unsigned src, unsigned nbytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(g + off), "r"(src), "r"(nbytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    return 0;
}

extern "C" __device__ int fs_bulk_wait_read(int* ret) {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    return 0;
}

extern "C" __device__ int fs_bulk_wait(int* ret) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    return 0;
}
"""

_link_tma = cuda.CUSource(_CU_TMA)
_bulk_red_raw = cuda.declare_device("fs_bulk_red_f32", "int32(CPointer(float32), int64, uint32, uint32)",
                                    link=_link_tma)
_bulk_wait_read_raw = cuda.declare_device("fs_bulk_wait_read", "int32()", link=_link_tma)
_bulk_wait_raw = cuda.declare_device("fs_bulk_wait", "int32()", link=_link_tma)
_mbar_init_raw = cuda.declare_device("fs_mbar_init", "int32(uint32, uint32)", link=_link_tma)
_mbar_tx_raw = cuda.declare_device("fs_mbar_expect_tx", "int32(uint32, uint32)", link=_link_tma)
_mbar_wait_raw = cuda.declare_device("fs_mbar_wait", "int32(uint32, uint32)", link=_link_tma)
_tma3_raw = cuda.declare_device("fs_tma_load3", "int32(uint32, CPointer(uint8), int32, int32, int32, uint32)",
                                link=_link_tma)


@cuda.jit(device=True, forceinline=True)
def mbar_init(sm, sbase, bar, count):
    """The mbarrier at byte ``bar`` of the shared window (8-byte aligned) expects ``count``
    arrivals a phase; then a barrier of the block before anyone waits on it."""
    _mbar_init_raw(uint32(sbase + bar), uint32(count))


@cuda.jit(device=True, forceinline=True)
def mbar_expect_tx(sm, sbase, bar, nbytes):
    """Arrive on the mbarrier, announcing ``nbytes`` that copies will bring in this phase."""
    _mbar_tx_raw(uint32(sbase + bar), uint32(nbytes))


@cuda.jit(device=True, forceinline=True)
def mbar_wait(sm, sbase, bar, parity):
    """Wait until the mbarrier's phase of parity ``parity`` (0, 1, 0, ...) has completed."""
    _mbar_wait_raw(uint32(sbase + bar), uint32(parity))


@cuda.jit(device=True, forceinline=True)
def tma_load3(sm, sbase, dst, maps, which, c0, c1, c2, bar):
    """Copy the box at coordinates (c0, c1, c2) (innermost first) of tensor map ``which`` of
    ``maps`` (128 bytes each) into shared memory at byte ``dst`` of the window, its bytes counted on
    the mbarrier at byte ``bar``.  Coordinates past the tensor's end are filled with zeros."""
    _tma3_raw(uint32(sbase + dst), _ffi.from_buffer(maps[128 * which:]), int32(c0), int32(c1), int32(c2),
              uint32(sbase + bar))


@cuda.jit(device=True, forceinline=True)
def bulk_red_f32(g, off, smem, src, nbytes):
    """g.flat[off:off + nbytes/4] += the floats at shared byte ``src`` of the window, by the TMA unit
    (``cp.reduce.async.bulk``: one instruction, atomic per element; ``nbytes`` and both addresses
    multiples of 16), committed as a bulk group of this thread.  The shared bytes must be visible to
    the async proxy (``fence_proxy_async`` by their writers, then a barrier) and stay unchanged
    until this thread's :func:`bulk_wait_read`."""
    _bulk_red_raw(_ffi.from_buffer(g), off, uint32(src), uint32(nbytes))


@cuda.jit(device=True, forceinline=True)
def bulk_wait_read():
    """Wait until the TMA unit has read the shared bytes of this thread's bulk groups."""
    _bulk_wait_read_raw()


@cuda.jit(device=True, forceinline=True)
def bulk_wait():
    """Wait until this thread's bulk groups are complete (their global writes done)."""
    _bulk_wait_raw()
