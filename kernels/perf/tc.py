"""Warp-level building blocks for the fast kernels: tensor-core MMA, ldmatrix, cp.async, shuffles.

One interface, two targets, chosen here once: on a GPU the helpers of :mod:`kernels.perf.tc_gpu`
(inline PTX in linked CUDA C++, inlined by link-time optimisation: ``HMMA.16816.F32`` in the
SASS, no stack frame, checked by :mod:`kernels.perf.inspect`); under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, no linked functions and no warp shuffles) their pure-Python twins
in :mod:`kernels.perf.tc_sim`, with the same names, signatures and per-thread results.  The
twins exchange data between lanes through shared memory between two ``syncthreads``, so every
thread of a block calls these helpers in the same order (the fast kernels call them outside any
thread-dependent branch).  The twins are what CI tests; the GPU run checks that the PTX does the
same thing.

Fragment layouts (PTX ISA, ``mma.m16n8k16`` with f16 inputs and f32 accumulators), for lane
``l`` of a warp, ``g = l // 4`` and ``t = l % 4``:

* A (16 x 16, row major), four 32-bit registers of two f16 each:
  a0 = A[g, 2t:2t+2], a1 = A[g+8, 2t:2t+2], a2 = A[g, 2t+8:2t+10], a3 = A[g+8, 2t+8:2t+10];
* B (16 x 8, "col": stored as Bᵀ, row n holds column n), two registers:
  b0 = B[2t:2t+2, g], b1 = B[2t+8:2t+10, g];
* C, D (16 x 8, f32): c0, c1 = C[g, 2t:2t+2], c2, c3 = C[g+8, 2t:2t+2].

``mma_bf16``, ``mma_z_bf16`` and ``pack_bf16x2`` are the same with bf16 inputs (the layouts are
the same; ``ldsm_*`` and the 16-byte copies move bits, so they serve both).  :func:`ops` gives a
kernel template its three for a compile-time ``BF16`` flag.

The C layout of two adjacent 16 x 8 tiles is the A layout of one 16 x 16 tile (after packing
pairs to f16): that is why P = softmax(S) can feed the P·V product straight from registers.

``ldsm_x4`` loads four 8 x 8 f16 matrices from shared memory at (row0 + 8·(i & 1),
col0 + 8·(i >> 1)), i = 0..3, into registers r0..r3 of every lane; ``ldsm_x4_trans`` transposes
each matrix on the way.  For a 16 x 16 A tile that gives a0..a3 in order; for B operands: V
(stored [key, dim], transposed) gives (r0, r1) for dims 0..7, (r2, r3) for dims 8..15.  The
``_b`` forms take matrix i at (row0 + 8·(i >> 1), col0 + 8·(i & 1)): from a tile stored [n, k]
(K for S = Q Kᵀ) (r0, r1) are (b0, b1) of rows row0..+7 and (r2, r3) of rows row0+8..+15, each
pair in adjacent registers as the mma wants them; ``ldsm_x4_trans_b`` reads an A operand from a
tile stored transposed, [k, m] (dS from dSᵀ).  All four take ``addr``, the byte address in the
shared window of the tile's corner plus the lane's offset: :func:`tile_addr` of ``sbase``
(:func:`smem_u32`), ``loff`` (:func:`lane_offset`, or :func:`lane_offset_b` for the ``_b``
forms) and the element offset.  The GPU reads ``addr`` alone; the simulator's twin reads
``smem`` and ``stride`` (elements a row) and takes ``addr`` as twice the element offset.

Shared memory is addressed by 32-bit addresses in the shared window computed once per kernel
(``smem_u32``; ``cp_async16_a(smem, sbase, soff, gmem, goff, nvalid)`` and
``st_global16_a(gmem, goff, smem, sbase, soff)`` move 16 bytes global -> shared asynchronously
(zero-filling past ``nvalid`` elements) and shared -> global).  The fp32 helpers
(``*_f32_a``, ``sts32_u32_a``, ``lds64_f32_a``) take byte addresses directly
(``st_global16_f32_a(gmem, goff, smem, a)``: 16 bytes shared -> global, ``goff`` in floats); ``oct_max``,
``oct_sum`` reduce over the 8 lanes 8g..8g+7, ``quad_max2``, ``quad_sum2`` over a quad;
``red_v2``, ``red_v4`` add 2 or 4 floats atomically per element (``red_v2_if`` where a flag
holds, as one predicated PTX instruction); ``mma3_tf32`` and ``tf32_hi``
are the 3xTF32 products of bwd_fp32_v2 (their layout is in :mod:`kernels.perf.tc_gpu`).  Under
the simulator the shared window starts at 0 and the lane offsets are 0.

Hopper's warpgroup products (fwd_fp16_v5; sm_90a): ``wgmma_ss(N, KT, ASTEP, BSTEP, BF16, KPA)`` and
``wgmma_rs(N, KS, BSTEP, BF16)`` make the device functions of one whole product of a warpgroup
(4 warps, 64 rows: warp w % 4 holds rows 16(w % 4) .. + 15 in the ``mma.sync`` C layout), A·Bᵀ
with both operands in shared memory and A·B with A in registers (the ``mma.sync`` A layout) and
B in shared memory; the tiles are 128-byte swizzled (K-major for Q and K, MN-major for V: the
same bytes, rows of 64 halves, chunk c of row r at 16·(c ^ r % 8)) or 64-byte swizzled (rows of
32 halves, chunk c of row r at 16·(c ^ (r // 2) % 4); ``KPA`` = 2 k-steps an atom row, not 4) and described by
:func:`wg_desc`; ``fence_proxy_async`` orders a thread's shared-memory writes before the
products' reads.  The twins decode the descriptors the way the PTX ISA's canonical layouts say
the tensor cores do, so a wrong descriptor fails under the simulator too; whether the ISA was
read right is for the GPU test.

Hopper's TMA copies (fwd_fp16_v7): ``tma_load3(sm, sbase, dst, maps, which, c0, c1, c2, bar)``
has the TMA unit copy the box at (c0, c1, c2) of tensor map ``which`` of ``maps``
(:mod:`kernels.perf.tma`) into shared memory at byte ``dst`` of the window, swizzled as the
wgmma tiles are, and count its bytes on the mbarrier at byte ``bar``; ``mbar_init(sm, sbase,
bar, count)``, ``mbar_expect_tx(sm, sbase, bar, nbytes)`` (one arrival announcing the bytes of
the phase's copies) and ``mbar_wait(sm, sbase, bar, parity)`` are the mbarrier's.  ``sm`` is
read by the twins only (which keep the barrier's state in its 16 bytes of shared memory).
Bulk reductions (bwd_fp16_v3's ``bulkq``): ``bulk_red_f32(g, off, smem, src, nbytes)`` has the
unit add ``nbytes`` of floats at shared byte ``src`` into ``g`` from element ``off`` (one bulk
group of the issuing thread), ``bulk_wait_read()`` waits until it has read them and
``bulk_wait()`` until it is done; the twin adds at the issue.
"""

from __future__ import annotations

import importlib

from numba import config, cuda, uint64

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


@device_inline
def tile_addr(sbase, loff, base, stride, row0, col0):
    """The ``addr`` of an ``ldsm_x4*`` load: shared window address ``sbase`` plus 2 bytes per
    element of (base + row0·stride + col0 + the lane's offset ``loff``)."""
    return sbase + 2 * (base + row0 * stride + col0 + loff)


@device_inline
def wg_desc(addr, lbo, sbo, mode):
    """The 64-bit ``wgmma`` matrix descriptor of a tile at shared-window byte address ``addr``
    (16-byte aligned; a swizzled tile: its atoms aligned to 8 of their rows), leading and stride
    byte offsets ``lbo``, ``sbo``, swizzling ``mode`` in bits 62-63: 1 for 128-byte rows, 2 for
    64-byte rows (PTX ISA, "Matrix Descriptor Format": address, LBO and SBO in 16-byte units in
    bits 0-13, 16-29, 32-45)."""
    return (uint64((addr & 0x3FFFF) >> 4) | (uint64(lbo >> 4) << uint64(16)) | (uint64(sbo >> 4) << uint64(32))
            | (uint64(mode) << uint64(62)))


def ops(bf16: bool):
    """(mma, mma_z, pack) of the 16-bit input type: fp16 (``mma``, ``mma_z``, ``pack_f16x2``) or
    bf16 (``mma_bf16``, ``mma_z_bf16``, ``pack_bf16x2``)."""
    if bf16:
        return mma_bf16, mma_z_bf16, pack_bf16x2  # noqa: F821  (set from the target below)
    return mma, mma_z, pack_f16x2  # noqa: F821


#: The helpers: the same names and signatures on both targets.
HELPERS = ("mma", "mma_z", "pack_f16x2", "mma_bf16", "mma_z_bf16", "pack_bf16x2",
           "ex2", "smem_u32", "lane_offset", "lane_offset_b", "opaque_u32",
           "ldsm_x4", "ldsm_x4_b", "ldsm_x4_trans", "ldsm_x4_trans_b", "cp_async16_a", "st_global16_a",
           "cp_async_commit", "cp_async_wait", "quad_max2", "quad_sum2", "red_v2", "red_v2_if", "red_v4",
           "smem_u32_f32", "lds128_f32_a", "sts32_f32_a", "sts64_f32_a", "sts128_f32_a", "sts32_u32_a",
           "lds64_f32_a", "cp_async16_f32_a", "st_global16_f32_a",
           "oct_max", "oct_sum", "tf32_hi", "mma3_tf32", "fence_proxy_async", "wgmma_ss", "wgmma_rs",
           "mbar_init", "mbar_expect_tx", "mbar_wait", "tma_load3",
           "bulk_red_f32", "bulk_wait_read", "bulk_wait")

_target = importlib.import_module(".tc_sim" if SIM else ".tc_gpu", __package__)
globals().update({name: getattr(_target, name) for name in HELPERS})  # AttributeError if a target lacks one

__all__ = ["SIM", "MAX_WARPS", "device_inline", "jit_kernel", "tile_addr", "wg_desc", "ops", *HELPERS]
