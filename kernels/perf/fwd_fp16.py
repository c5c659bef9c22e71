"""The fp16 forward on the tensor cores: FlashAttention-2, four versions (``mma.sync`` m16n8k16; v5, v7 ``wgmma``).

A block of NW warps owns Br = 16·NW·MT query rows (MT m-tiles a warp) and walks the key blocks
(Bc keys) it can see, K and V double-buffered through cp.async; S = Q Kᵀ, P and O stay in
registers (the C layout of two adjacent 16 x 8 tiles is the A layout of one 16 x 16 tile, so P
feeds P·V straight from registers); O is stored through shared memory.  The online softmax, in
log2 units (``sl2`` = τ·log2 e), is the block marked "online softmax" in :func:`_source`; the
tile copies and the products (Q Kᵀ, P V) are :mod:`kernels.perf._tiles`'s.

* ``fwd_fp16_v3`` (``LAZY`` off): fwd_fp16_v2 (read at commit f09d49e) with its integer
  overhead removed: compile-time d, shared memory through its 32-bit window address and the
  lane's ldmatrix offset computed once, one cp.async group a step, a zero-accumulator first mma
  (``tc.mma_z``), K fragments in the order that puts each mma's (b0, b1) in adjacent registers
  (``tc.ldsm_x4_b``), each thread's chunk offsets of a K/V tile computed once.  H200, B·H = 16,
  N = 16,384: d = 64 292 TFLOP/s (3.26x naive, 0.99x SDPA flash; v2 191), d = 128 228.
* ``fwd_fp16_v4`` (``LAZY`` on; shipped): a row's reference max m is moved (and acc, ℓ rescaled)
  only when the new block's max exceeds it by more than 8 in log2 units; otherwise
  P̃ = 2^((S − m)·τlog2e) is computed against the old m and is at most 2^8, well inside fp16
  and float32.  The same function (O = acc/ℓ and L = m·τ + ln ℓ hold for any m); the test is per
  lane pair of rows, so a quad (which shares its rows) always agrees.  H200: d = 128 255 TFLOP/s
  (+10%), then 296 (1.73x naive) with Bc = 32 and Q in registers; d = 64 291.  H100
  (bench_h100_single_run.csv): 3.63-5.59x naive at d = 64, 1.85-2.85x at d = 128.  Its d = 128
  default is Bc = 16 since the tuner (:mod:`kernels.perf.autotune`): 1.08x Bc = 32 on the H100.

* ``fwd_fp16_v5`` (``WG`` on; shipped at d = 64 to 256): v4's loop with its two products on
  Hopper's warpgroup instructions (``wgmma``, sm_90a: ``tc.wgmma_ss``, ``tc.wgmma_rs``).  Two
  warpgroups of 64 rows; S = Q Kᵀ with Q and K read from shared memory by descriptor, O += P V
  with P from registers and V read MN-major; Q, K, V 128-byte swizzled (64-byte where d % 64 is
  1..32, since 929b107) and unpadded
  (``_tiles.f16_swizzled``), made visible to the async proxy by ``fence.proxy.async``.  Why:
  the products leave the SM's issue slots (no ldmatrix, one instruction per 64 x Bc x 16 where
  mma.sync needs 4·Bc/8), so v4's shared-memory and issue limits go.  Measured on the H100
  (kernels/data/bench_fwd_v5_20cf9ec, same rounds): 1.06-1.47x v4 on every bench shape it takes;
  fp16 at N >= 4,096 1.00-1.30x SDPA flash (v4: 0.74-1.04x).  Then one warpgroup with Bc = 64 at
  d = 128 (two blocks an SM) and the prepared launch of repeated torch calls
  (``_launch.with_plan``; its calls had spent 100-170 us on the host beyond the kernel): 1.12-1.41x
  flash on all 40 bench-grid rows, fp16 and bf16 (kernels/data/bench_fwd_v5_6e79fce); then Bc = 48
  at d = 128 (three blocks an SM: :func:`default_config_v5`).  Then every d % 8 == 0 up to 256
  (1133a8a): a tile's rows are whole swizzle atoms, S = Q Kᵀ runs over d rounded up to 16 (a
  16-byte column pad of Q and K zeroed once where d % 16 = 8) and P·V over the whole atoms, O's
  extra columns never stored; the atoms are 64 columns (128-byte rows), or 32 (64-byte rows,
  929b107) where d % 64 is 1..32, so that d = 96 runs P·V over 96 columns, not 128 (with 64-column
  atoms it ran the same 359 TFLOP/s at d = 96 as at d = 112, 1.02x SDPA flash).  H100, N = 4,096,
  B·H = 64, same-run ratios to SDPA flash with the default blocks (off-grid bench of d6b06a6, 3
  rounds, fp16 and bf16): d = 80 1.25-1.27x, 96 1.17-1.22x, 112 1.35x, 160 1.68-1.70x, 192
  1.41-1.42x, 256 1.41-1.49x, where v4 ran 1.08x, 0.91x, 1.14-1.18x, 1.04-1.05x, 0.72-0.73x,
  0.83-0.85x.

* ``fwd_fp16_v6`` (left the tree; read at cf26650, measured at 3f308c8): v5 with each product
  issued and waited for apart, P_{j-1} V_{j-1} in flight while the softmax of block j runs
  (FlashAttention-3's intra-warpgroup overlap), V in three buffers.  H100
  (kernels/data/fwd_fp16_v6_h100_3f308c8, fwd_fp16_v5_blocks_h100_532db74): 1.04-1.05x v5's first
  block at d = 128, 0.91-0.97x at d = 64, and against v5's one-warpgroup d = 128 block
  0.83-1.05x: two resident blocks overlap one's softmax with the other's products already.

* ``fwd_fp16_v7`` (``TMA`` on; shipped at d = 64 to 256 since 5e1107e): v5 with K_j, V_j copied by
  the TMA unit (``tc.tma_load3``: one ``cp.async.bulk.tensor`` a swizzle atom, the unit writing
  the swizzled layout itself, zeros past N and d), announced and waited for on an mbarrier per
  buffer (``tc.mbar_expect_tx``, ``tc.mbar_wait``) where v5 waited for cp.async groups and a
  barrier; one thread issues the copies; the tensor maps come from :mod:`kernels.perf.tma`.  Why:
  v5's 16-byte copies make L2 send the SMs 1.53x the tiles' sectors where d % 16 = 8 (analysis.
  copy_sectors), and every thread issues them (at d = 120 v5's SASS has 27 LDGSTS and a main
  loop of 606 instructions, v7's 3 LDGSTS, Q's, and 432: ``kernels.perf.inspect``).
  H100, N = 4,096, B·H = 64 (kernels/data/fwd_fp16_v7_h100): with its blocks
  (:func:`default_config_v7`: two warpgroups, but v5's one at d = 96, 112, 128) 1.10-1.69x v5 and
  1.19-2.32x SDPA flash at every d from 64 to 256 in steps of 8 (d = 88: 1.19x, v5 0.81x); with
  v5's blocks it lost to v5 at d = 72-88, 104 and 136-168 (0.67-0.97x).  Bench grid at 2eb1598
  (kernels/data/bench_fwd_v7_2eb1598, 5 rounds, fp16 and bf16): 1.21-1.57x SDPA flash on all 40
  rows, 1.31-1.57x at N >= 4,096 (the moonshot's 1.3x on all 24), 0.70-0.90x cuDNN, 1.02-1.23x v5.

* Split-KV (v5 and v7, ``splits`` = S > 1 in the block shape; ``SPLIT`` in :func:`_source`): the
  grid (Tr, B·H, S), split z walking key blocks z·n//S .. (z+1)·n//S - 1 of the n its query block sees, its
  epilogue staging O_i = acc/ℓ in float32 in shared memory (over Q and the K and V buffers, free
  by then, v7's mbarriers placed past it: :func:`smem_bytes_split`) and storing it 32 consecutive
  floats a warp into the partial Op, its logsumexp into Lp; then :func:`combine_source`'s launch
  merges the splits.  Why: a grid of at most one block an SM (B·H = 1, N = 8,192: 128 blocks of
  64 rows on 132 SMs) leaves each SM one warpgroup, nothing to overlap its softmax with; S blocks
  of 1/S the keys give it S.  The launcher's rule (``flashsim.algorithms.fast.fit_to_grid``,
  measured there): H200, B·H = 1, N = 8,192, d = 64 0.74-0.78x -> 1.02-1.05x SDPA flash, d = 128
  0.94-1.06x -> 1.02-1.24x, causal 0.71-0.98x -> 1.12-1.16x
  (kernels/data/fwd_fp16_v7_split_h200_d3e3777).  The unsplit kernel's SASS is unchanged by it
  (sm_90a, d = 64 and 128: kernels/data/fwd_fp16_v7_split_h200_d3e3777/sass.txt).

All four compile for bf16 too (``bf16=True``: the ``.bf16`` mma and ``cvt.rn.bf16x2.f32``; the tiles
are the inputs' bits, moved unchanged), timed on the H100 beside fp16 (NOTES.md, "bf16").

Measurements and the tuning behind the defaults: ``kernels/perf/NOTES.md`` ("fp16 forward").
"""

from __future__ import annotations

import math
from functools import cache, partial
from types import SimpleNamespace

from numba import cuda, float32, int32, types, uint32

# the combine's block (flashsim's schedule states it)
from flashsim.algorithms.fast import COMBINE_ELEMS, COMBINE_THREADS

from .._arrays import dtype_name
from .._bf16 import storer
from ..flash2 import padded_head_dim
from . import tc
from ._launch import launch_forward
from ._tiles import (
    NEG_INF,
    f16_ab,
    f16_abt,
    f16_chunks,
    f16_copy,
    f16_frags,
    f16_pack,
    f16_swizzled,
    f16_zero_pad,
    query_block,
)


def smem_bytes(dp: int, br: int, bc: int) -> int:
    return 2 * (dp + 8) * (br + 4 * bc)


def swizzle_bytes(d: int) -> int:
    """Bytes of a swizzled tile row (v5, v7): 64 where d % 64 is 1..32 (atoms of 32 columns waste
    fewer: d = 96 three of them, not two of 64), else 128."""
    return 64 if 0 < d % 64 <= 32 else 128


def atom_width(d: int) -> int:
    """Columns of a swizzled tile (v5, v7): d rounded up to whole atoms of :func:`swizzle_bytes` / 2
    halves."""
    a = swizzle_bytes(d) // 2
    return -(-d // a) * a


def smem_bytes_v5(dp: int, br: int, bc: int) -> int:
    # Q, K and V twice, swizzled in whole atoms (of 64 or 32 columns), and 1 KiB to align them
    return 2 * atom_width(dp) * (br + 4 * bc) + 1024


def _source(D: int, BC: int, NW: int, MT: int, CAUSAL: bool, QREG: bool, LAZY: bool = True, BF16: bool = False,
            WG: bool = False, TMA: bool = False, LPT: bool = False, SPLIT: bool = False):
    DP = padded_head_dim(D)
    BR = 16 * NW * MT
    NT = 32 * NW
    S = DP + 8  # shared row stride in f16: 16 bytes of padding keeps ldmatrix rows in distinct banks
    KT = DP // 16  # k-steps of Q·Kᵀ
    NS = BC // 8  # n-tiles of S
    KV = BC // 16  # k-steps of P·V
    NO = DP // 8  # n-tiles of O
    NQA = 4 * KT * MT if QREG else 4 * MT
    NACC, NS4, NPA, M2 = 4 * NO * MT, 4 * NS * MT, 4 * KV * MT, 2 * MT
    QOFF = 0
    KOFF = BR * S  # K buffers 0 and 1
    VOFF = KOFF + 2 * BC * S  # V buffers 0 and 1
    if TMA and not (WG and LAZY):
        raise ValueError(f"{TMA=}: a stage of v5 (WG, LAZY)")
    if SPLIT and not WG:
        raise ValueError(f"{SPLIT=}: v5 and v7 only (WG)")
    OST = DP + 8  # SPLIT: row stride (floats) of the float32 partial O staged in shared memory
    if WG:  # v5: the products on warpgroups (4 warps, 64 rows each: MT = 1), tiles swizzled
        if MT != 1 or NW % 4 or D % 8 or not 8 <= D <= 256 or BC % 16 or not 16 <= BC <= 256:
            raise ValueError(f"{D=}, {BC=}, {NW=}, {MT=}: v5 takes d % 8 = 0 up to 256, MT = 1, whole warpgroups, "
                             "Bc 16..256 in steps of 16")
        # A tile's rows are DA = d rounded up to whole swizzle atoms: RB = 128-byte rows (64
        # columns an atom), or 64-byte rows (32 columns) where d % 64 is 1..32; S = Q Kᵀ runs over
        # the DP columns (d to 16: a column pad of Q and K zeroed below), O += P V over all DA
        # columns of V (N = DA: columns past d hold whatever the buffer held, and only O's own
        # columns past d, which are never stored, depend on them).
        RB = swizzle_bytes(D)
        DA = atom_width(D)
        MODE = 1 if RB == 128 else 2  # the descriptors' swizzle mode
        KPA = RB // 32  # k-steps of 16 halves in an atom's row
        NACC = 4 * (DA // 8)  # O's accumulators: DA // 8 n-tiles (the epilogue packs the first NO)
        QB, KB = 0, 2 * BR * DA  # byte offsets from the 1024-aligned base: Q, K buffers, V buffers
        KSZ = 2 * BC * DA
        VB = KB + 2 * KSZ
        wg_qk = tc.wgmma_ss(BC, KT, BR * RB // 16, BC * RB // 16, BF16, KPA)
        wg_pv = tc.wgmma_rs(DA, BC // 16, RB, BF16)  # 16 keys a k-step: 16 rows of RB bytes
        soff_q, q_load_sw = f16_swizzled(BR, D, NT, RB)
        soff_k = f16_swizzled(BC, D, NT, RB)[0]
        _, kv_chunks_sw, _ = f16_chunks(BC, D, S, NT, SWIZZLE=True, SW=RB)
        PADC = D // 8 if DP != D else 0  # the 16-byte chunk of Q's and K's rows that the copies skip
        if TMA:  # v7: K_j, V_j copied by the TMA unit, one box an atom (ATOMC columns x Bc rows)
            ATOMC = RB // 2
            NATOM = DA // ATOMC
            # two mbarriers (16 bytes each; the twin keeps its state there); SPLIT: past the float32
            # staging of the epilogue too, which may reach beyond the buffers (small Bc, wide Br)
            MB = max(VB + 2 * KSZ, 4 * BR * OST) if SPLIT else VB + 2 * KSZ
            TXB = 2 * BC * DA * 2  # bytes a K_j, V_j pair brings (zeros past d and past N counted)

            @tc.device_inline
            def tma_kv(sm, sbase, ab, tm, buf, c0, zk):
                """Thread 0: K_j, V_j (rows c0.., head zk) into buffer ``buf``, on its mbarrier."""
                bar = 2 * ab + MB + 16 * buf
                tc.mbar_expect_tx(sm, sbase, bar, TXB)
                for a in range(NATOM):
                    tc.tma_load3(sm, sbase, 2 * ab + KB + buf * KSZ + a * BC * RB, tm, 0, a * ATOMC, c0, zk, bar)
                    tc.tma_load3(sm, sbase, 2 * ab + VB + buf * KSZ + a * BC * RB, tm, 1, a * ATOMC, c0, zk, bar)

    @tc.device_inline
    def _rescale(acc, mt, alpha_0, alpha_1):
        """acc *= α for m-tile mt's two rows (α_0 row g, α_1 row g + 8)."""
        for nt in range(NO):
            x = 4 * (mt * NO + nt)
            acc[x] *= alpha_0
            acc[x + 1] *= alpha_0
            acc[x + 2] *= alpha_1
            acc[x + 3] *= alpha_1

    start = query_block(BR, BC, CAUSAL, LPT_KV_BYTES=4 * D if LPT else 0)  # K's and V's rows: 2·d halves
    q_load, _, q_store, _ = f16_copy(BR, D, S, NT)
    _, kv_load2, _, _ = f16_copy(BC, D, S, NT)
    CPT, kv_chunks, kv_load2c = f16_chunks(BC, D, S, NT)
    zero_pad = f16_zero_pad(BR + 4 * BC, D, S, NT)
    _, frags_all = f16_frags(MT, NW, KT, S)
    qk, _ = f16_abt(MT, NW, KT, NS, S, QREG, BF16)
    pv = f16_ab(MT, KV, NO, S, BF16)
    pack = f16_pack(NO, S, BF16)
    PACK = tc.ops(BF16)[2]

    @tc.device_inline
    def body(q, k, v, o, lse, sl2, scale, tm):
        sm = cuda.shared.array(0, types.float16)
        smw = cuda.shared.array(0, uint32)  # the same bytes as 32-bit words
        smf = cuda.shared.array(0, float32)  # and as floats (SPLIT's partial O)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        i, b, h, hk, nq, nk, shift, r0, nblk = start(q, k)
        # Split-KV (SPLIT; grid (Tr, B·H, S)): split z walks key blocks j0 = z·nblk // S .. j1 - 1 of
        # the block's nblk (shares that differ by at most one: none empty unless nblk < S), and
        # writes its partial O and logsumexp in float32 (o, lse: (S·B, H, Nq, d) and (S·B, H, Nq))
        # for :func:`combine_source`'s launch.
        j0 = 0
        j1 = nblk
        ob = b
        if SPLIT:
            j0 = cuda.blockIdx.z * nblk // cuda.gridDim.z
            j1 = (cuda.blockIdx.z + 1) * nblk // cuda.gridDim.z
            ob = cuda.blockIdx.z * q.shape[0] + b
        sbase = tc.smem_u32(sm)
        loff = tc.lane_offset(S)
        loffb = tc.lane_offset_b(S)
        qbase = ((b * q.shape[1] + h) * nq) * D
        kbase = ((b * k.shape[1] + hk) * nk) * D
        crow = cuda.local.array(CPT, int32)  # this thread's chunks of a K/V tile (f16_chunks)
        cgof = cuda.local.array(CPT, int32)
        csof = cuda.local.array(CPT, int32)
        if WG:
            ab = ((1024 - sbase % 1024) % 1024) // 2  # element offset of the 1024-aligned base
            sb = sbase + 2 * ab
            if PADC:  # zeros in Q's and K's column pad (S = Q Kᵀ reads it; no copy writes it; v7's
                # TMA copies write K's, zeros past d)
                for e in range(tid, BR if TMA else BR + 2 * BC, NT):
                    if e < BR:
                        so = ab + QB // 2 + soff_q(e, PADC)
                    else:
                        so = ab + (KB + ((e - BR) // BC) * KSZ) // 2 + soff_k((e - BR) % BC, PADC)
                    for x in range(4):
                        smw[so // 2 + x] = 0
            q_load_sw(sm, sbase, ab, q, qbase, r0, nq, tid)
            zk = b * k.shape[1] + hk
            if TMA:
                if tid == 0:
                    tc.mbar_init(sm, sbase, 2 * ab + MB, 1)
                    tc.mbar_init(sm, sbase, 2 * ab + MB + 16, 1)
                    if j1 > j0:
                        tma_kv(sm, sbase, ab, tm, 0, j0 * BC, zk)
            else:
                kv_chunks_sw(crow, cgof, csof, tid)
                if j1 > j0:
                    kv_load2c(sm, sbase, ab + KB // 2, ab + (VB // 2), k, v, kbase, j0 * BC, nk, crow, cgof, csof,
                              tid)
            # warpgroup warp // 4's 64 rows of Q; its first k-step (tc.wgmma_ss adds the others)
            da = tc.wg_desc(sb + QB + (warp // 4) * 64 * RB, 16, 8 * RB, MODE)
        else:
            ab = 0
            zero_pad(sm, tid)
            q_load(sm, sbase, QOFF, q, qbase, r0, nq, tid)
            if nblk > 0:
                kv_load2(sm, sbase, KOFF, VOFF, k, v, kbase, 0, nk, tid)
        tc.cp_async_commit()
        tc.cp_async_wait(0)
        if TMA:
            tc.fence_proxy_async()  # Q and its zeroed pad, for wgmma (K, V come by the async proxy)
        cuda.syncthreads()  # Q_i, K_0, V_0 (v7: the mbarriers) and the zeroed padding are in shared memory
        # Warp w owns m-tiles mt = 0..MT-1: rows 16·(NW·mt + w) + (0..15) of the block.
        qa = cuda.local.array(NQA, uint32)
        if QREG:
            frags_all(qa, sm, sbase, loff, QOFF, warp)
        acc = cuda.local.array(NACC, float32)
        for e in range(NACC):
            acc[e] = 0.0
        s = cuda.local.array(NS4, float32)
        pa = cuda.local.array(NPA, uint32)
        kb = cuda.local.array(4, uint32)
        m = cuda.local.array(M2, float32)  # running max (raw scores) of rows g, g+8 of each m-tile
        ll = cuda.local.array(M2, float32)  # this lane's part of ℓ for the same rows
        for e in range(M2):
            m[e] = NEG_INF
            ll[e] = 0.0
        if not WG:
            kv_chunks(crow, cgof, csof, tid)
        for j in range(j0, j1):
            buf = (j - j0) % 2
            c0 = j * BC
            if j + 1 < j1:  # K_{j+1}, V_{j+1} into the other buffer
                nb_ = (j + 1 - j0) % 2
                if TMA:
                    if tid == 0:  # every warp is done with buffer nb_ (the barrier ending block j - 1)
                        tma_kv(sm, sbase, ab, tm, nb_, c0 + BC, zk)
                elif WG:
                    kv_load2c(sm, sbase, ab + (KB + nb_ * KSZ) // 2, ab + (VB + nb_ * KSZ) // 2, k, v, kbase,
                              c0 + BC, nk, crow, cgof, csof, tid)
                else:
                    kv_load2c(sm, sbase, KOFF + nb_ * BC * S, VOFF + nb_ * BC * S, k, v, kbase, c0 + BC, nk,
                              crow, cgof, csof, tid)
            if TMA:  # buffer buf's (j // 2)-th filling has landed
                tc.mbar_wait(sm, sbase, 2 * ab + MB + 16 * buf, ((j - j0) // 2) % 2)
            else:
                tc.cp_async_commit()  # (empty on the last block) so that one wait fits every iteration
                tc.cp_async_wait(1)  # everything but the newest group, i.e. K_j, V_j, has landed
                if WG:
                    tc.fence_proxy_async()  # the copies are generic-proxy writes; wgmma reads via the async proxy
                cuda.syncthreads()  # K_j, V_j have landed for every warp
            kofs = KOFF + buf * BC * S
            vofs = VOFF + buf * BC * S
            if WG:  # S = Q Kᵀ: one warpgroup product over d
                wg_qk(s, sm, da, tc.wg_desc(sb + KB + buf * KSZ, 16, 8 * RB, MODE))
            else:  # S = Q Kᵀ: every K fragment pair feeds MT m-tiles.
                qk(s, qa, kb, sm, sbase, loff, loffb, QOFF, kofs, warp)
            if c0 + BC > nk or (CAUSAL and c0 + BC - 1 > r0 + shift):
                for mt in range(MT):
                    for nt in range(NS):
                        for e in range(4):
                            col = c0 + 8 * nt + 2 * t + (e % 2)
                            row = r0 + 16 * (NW * mt + warp) + g + 8 * (e // 2)
                            if col >= nk or (CAUSAL and col > row + shift):
                                s[4 * (mt * NS + nt) + e] = NEG_INF
            for mt in range(MT):
                mx_0 = m[2 * mt]
                mx_1 = m[2 * mt + 1]
                for nt in range(NS):
                    x = 4 * (mt * NS + nt)
                    mx_0 = max(mx_0, max(s[x], s[x + 1]))
                    mx_1 = max(mx_1, max(s[x + 2], s[x + 3]))
                mx_0, mx_1 = tc.quad_max2(mx_0, mx_1)
                # The online softmax.  v4 (LAZY): move the reference max only if a row's max grew
                # by more than 2^8 (the first visible block always does: m starts at -inf);
                # (-inf) - (-inf) is NaN, and NaN > 8 is False: a row with nothing visible yet
                # keeps m = -inf.  v3: move it on every block, rescaling after P below.
                if LAZY:
                    if (mx_0 - m[2 * mt]) * sl2 > 8.0 or (mx_1 - m[2 * mt + 1]) * sl2 > 8.0:
                        mu_0 = mx_0 if mx_0 != NEG_INF else float32(0.0)
                        mu_1 = mx_1 if mx_1 != NEG_INF else float32(0.0)
                        alpha_0 = tc.ex2((m[2 * mt] - mu_0) * sl2)
                        alpha_1 = tc.ex2((m[2 * mt + 1] - mu_1) * sl2)
                        m[2 * mt] = mx_0
                        m[2 * mt + 1] = mx_1
                        ll[2 * mt] *= alpha_0
                        ll[2 * mt + 1] *= alpha_1
                        _rescale(acc, mt, alpha_0, alpha_1)
                    ms_0 = (m[2 * mt] if m[2 * mt] != NEG_INF else float32(0.0)) * sl2
                    ms_1 = (m[2 * mt + 1] if m[2 * mt + 1] != NEG_INF else float32(0.0)) * sl2
                else:
                    mu_0 = mx_0 if mx_0 != NEG_INF else float32(0.0)
                    mu_1 = mx_1 if mx_1 != NEG_INF else float32(0.0)
                    alpha_0 = tc.ex2((m[2 * mt] - mu_0) * sl2)
                    alpha_1 = tc.ex2((m[2 * mt + 1] - mu_1) * sl2)
                    m[2 * mt] = mx_0
                    m[2 * mt + 1] = mx_1
                    ms_0 = mu_0 * sl2
                    ms_1 = mu_1 * sl2
                ps_0 = float32(0.0)
                ps_1 = float32(0.0)
                for nt in range(NS):
                    x = 4 * (mt * NS + nt)
                    p0 = tc.ex2(s[x] * sl2 - ms_0)
                    p1 = tc.ex2(s[x + 1] * sl2 - ms_0)
                    p2 = tc.ex2(s[x + 2] * sl2 - ms_1)
                    p3 = tc.ex2(s[x + 3] * sl2 - ms_1)
                    ps_0 += p0 + p1
                    ps_1 += p2 + p3
                    y = 4 * (mt * KV + nt // 2) + 2 * (nt % 2)
                    pa[y] = PACK(p0, p1)
                    pa[y + 1] = PACK(p2, p3)
                if LAZY:
                    ll[2 * mt] += ps_0
                    ll[2 * mt + 1] += ps_1
                else:
                    ll[2 * mt] = ll[2 * mt] * alpha_0 + ps_0
                    ll[2 * mt + 1] = ll[2 * mt + 1] * alpha_1 + ps_1
                    _rescale(acc, mt, alpha_0, alpha_1)
            if WG:  # O += P V, P from registers, V (MN-major) 64 of d a swizzle atom of Bc rows
                wg_pv(acc, pa, sm, tc.wg_desc(sb + VB + buf * KSZ, BC * RB, 8 * RB, MODE))
            else:
                pv(acc, pa, kb, sm, sbase, loff, vofs)  # O += P V
            cuda.syncthreads()  # every warp is done with buffer j % 2 before it is refilled
        # Epilogue: ℓ over the quad; O = acc/ℓ packed to f16 into the warp's own rows of the Q
        # tile (only this warp read them), then copied out 16 bytes per thread.
        for mt in range(MT):
            l_0, l_1 = tc.quad_sum2(ll[2 * mt], ll[2 * mt + 1])
            inv_0 = float32(1.0) / l_0 if l_0 > 0 else float32(0.0)
            inv_1 = float32(1.0) / l_1 if l_1 > 0 else float32(0.0)
            rl = 16 * (NW * mt + warp) + g
            if SPLIT:  # float32 rows of OST floats from the aligned base, over Q and the K, V buffers
                # (no copy or product is in flight past the loop's last barrier; v7's mbarriers lie
                # beyond: MB)
                for nt in range(NO):
                    x = 4 * (mt * NO + nt)
                    f = ab // 2 + rl * OST + 8 * nt + 2 * t
                    smf[f] = acc[x] * inv_0
                    smf[f + 1] = acc[x + 1] * inv_0
                    smf[f + 8 * OST] = acc[x + 2] * inv_1
                    smf[f + 8 * OST + 1] = acc[x + 3] * inv_1
            else:
                pack(smw, (ab + QOFF + rl * S + 2 * t) // 2, acc, 4 * mt * NO, inv_0, inv_1)
            if t == 0:
                row_0 = r0 + rl
                if row_0 < nq:
                    lse[ob, h, row_0] = m[2 * mt] * scale + math.log(l_0) if l_0 != 0 else NEG_INF
                if row_0 + 8 < nq:
                    lse[ob, h, row_0 + 8] = m[2 * mt + 1] * scale + math.log(l_1) if l_1 != 0 else NEG_INF
        cuda.syncthreads()  # the whole O tile is in shared memory
        if SPLIT:  # a warp stores 32 consecutive floats of the tile's rows (whole sectors)
            for e in range(tid, BR * D, NT):
                rr = e // D
                if r0 + rr < nq:
                    o[ob, h, r0 + rr, e - rr * D] = smf[ab // 2 + rr * OST + e - rr * D]
        else:
            q_store(o, qbase, r0, nq, sm, sbase, ab + QOFF, tid)

    if TMA:  # v7 takes the tensor maps of K and V (kernels.perf.tma.kv_maps)
        def fwd_tma(q, k, v, o, lse, sl2, scale, tm):
            body(q, k, v, o, lse, sl2, scale, tm)

        return fwd_tma, NT, BR

    def fwd(q, k, v, o, lse, sl2, scale):
        body(q, k, v, o, lse, sl2, scale, lse)  # (lse: no tensor map; only v7 reads it)

    return fwd, NT, BR


def kernel(d: int, bc: int, nw: int, mt: int, causal: bool, qreg: bool, lazy: bool = True, bf16: bool = False,
           wg: bool = False, tma: bool = False, lpt: bool = False, splits: int = 1):
    """(compiled kernel, threads, Br) of a block shape; ``splits`` > 1 (v5, v7): the split-KV
    kernel, whose o and lse are the float32 partials that :func:`combine_kernel` merges."""
    return _kernel(d, bc, nw, mt, causal, qreg, lazy, bf16, wg, tma, lpt, splits > 1)


@cache
def _kernel(d, bc, nw, mt, causal, qreg, lazy, bf16, wg, tma, lpt, split):
    fn, nt, br = _source(d, bc, nw, mt, causal, qreg, lazy, bf16, wg, tma, lpt, split)
    return tc.jit_kernel(fn, nt), nt, br


def combine_source(D: int, BF16: bool):
    """The split-KV forward's second launch, grid (⌈Nq·d / 1,024⌉, B·H), on flat views of Op, Lp, O and
    L (with Nq and B·H: one offset a load, where 4-d indexing had cost registers and occupancy):
    thread t of block x merges a head's outputs e = 1,024x + 256k + t, k < 4 (row e // d, column
    e % d), over the S splits' partials of its row, m = max_s Lp_s, w_s = exp(Lp_s − m), O = Σ_s
    w_s Op_s / Σ_s w_s, L = m + ln Σ_s w_s (a row no split saw: O = 0, L = −inf, as the
    one-launch kernel writes it), in one pass over s. A warp's instruction k reads 32
    consecutive floats of each Op_s and writes 32 consecutive elements of O; each thread reads
    its elements' Lp_s (one request a warp instruction a split, for the rows its 32 elements
    span). Four outputs a thread, their loads independent, keep four of Op's loads in flight
    where one output a thread waited for each (fwd_combine took 20 us of 104 at B·H = 1, N =
    8,192, d = 128, S = 2 on an H200, reading 8 MB: ``kernels/perf/NOTES.md``)."""
    CV = storer(BF16)
    CT = COMBINE_THREADS
    CE = COMBINE_ELEMS

    def fwd_combine(op, lp, o, lse, nq, heads):
        # flat views: op, lp (S·B·H, Nq, d) and (S·B·H, Nq); o, lse (B·H, Nq, d) and (B·H, Nq)
        p = cuda.blockIdx.y  # b·H + h
        n = nq * D
        base = cuda.blockIdx.x * (CT * CE) + cuda.threadIdx.x
        # one pass, each Lp_s and Op_s loaded once: the running max m, and tot, acc rescaled when
        # it grows (exp(-inf) = 0 keeps a split that saw nothing out, with its zeros)
        m = cuda.local.array(CE, float32)
        tot = cuda.local.array(CE, float32)
        acc = cuda.local.array(CE, float32)
        lzs = cuda.local.array(CE, float32)
        xs = cuda.local.array(CE, float32)
        for u in range(CE):
            m[u] = NEG_INF
            tot[u] = float32(0.0)
            acc[u] = float32(0.0)
        for z in range(lp.shape[0] // (heads * nq)):
            zp = z * heads + p
            for u in range(CE):  # the loads first, all in flight before the first is used
                e = base + u * CT
                if e < n:
                    lzs[u] = lp[zp * nq + e // D]
                    xs[u] = op[zp * n + e]
            for u in range(CE):
                if base + u * CT < n:
                    lz = lzs[u]
                    mn = max(m[u], lz)
                    mu = mn if mn != NEG_INF else float32(0.0)
                    c = math.exp(m[u] - mu)
                    w = math.exp(lz - mu)
                    tot[u] = tot[u] * c + w
                    acc[u] = acc[u] * c + w * xs[u]
                    m[u] = mn
        for u in range(CE):
            e = base + u * CT
            if e < n:
                t = tot[u]
                o[p * n + e] = CV(acc[u] / t if t > 0 else float32(0.0))
                if e % D == 0:
                    lse[p * nq + e // D] = m[u] + math.log(t) if t > 0 else NEG_INF

    return fwd_combine


@cache
def combine_kernel(d: int, bf16: bool):
    return cuda.jit(combine_source(d, bf16))


def smem_bytes_split(dp: int, br: int) -> int:
    """Shared memory the split-KV epilogue stages its float32 partial O in (rows of dp + 8 floats
    from the 1024-aligned base, Q's and the K, V buffers' bytes and maybe more), and v7's two
    mbarriers after it; the launch takes the larger of this and the version's own."""
    return 1024 + 4 * br * (dp + 8) + 32


def signature():
    a4 = types.Array(types.float16, 4, "C")
    return types.void(a4, a4, a4, a4, types.Array(float32, 3, "C"), float32, float32)


def signature_tma():
    """:func:`signature` and the tensor maps (v7)."""
    return types.void(*signature().args, types.Array(types.uint8, 1, "C"))


def default_config_v3(d: int) -> dict:
    """Block shape per head dim: Bc, warps, m-tiles per warp, Q fragments held in registers."""
    return dict(bc=64, nw=4, mt=2, qreg=d <= 64)


def default_config_v4(d: int) -> dict:
    """v3's, but above d = 64 Bc = 32 with Q's fragments in registers (H200, B·H = 16: 165-291 TFLOP/s
    at N = 4,096-16,384, 1.58-1.69x naive, against 99-189 for Bc = 64 with Q re-read from shared
    memory; 8 warps x 1 m-tile 153-224), and where d rounds up to 128 (113-128) Bc = 16: the tuner
    timed it best on every d = 128 key on an H200 (kernels/data/autotune_h200_6386723: 1.06-1.16x
    Bc 32 at N >= 4,096), and on the H100 1.08x at N = 4,096 and 16,384, 1.13-1.48x causal
    (kernels/data/fwd_fp16_v4_bc16_h100_764a8f3).  Above d = 128 the 4-warp 128-row block with Q
    in registers spills (d = 256: 0.17x SDPA flash); on the H100 at N = 4,096, B·H = 64
    (kernels/data/fwd_fp16_v4_wide_h100_66318c2): up to d = 192 8 warps x 2 m-tiles (Br = 256), Bc = 32,
    Q in shared memory (d = 160 0.98x flash against 0.80x; d = 192 0.64x against 0.45x), above it
    8 warps x 1 m-tile (Br = 128), Bc = 32, Q in registers (d = 256 0.83x against 0.17x)."""
    if d > 192:
        return dict(bc=32, nw=8, mt=1, qreg=True)
    if d > 128:
        return dict(bc=32, nw=8, mt=2, qreg=False)
    return dict(bc=64 if d <= 64 else 16 if 112 < d <= 128 else 32, nw=4, mt=2, qreg=True)


def default_config_v5(d: int) -> dict:
    """Two warpgroups (8 warps, 128 query rows) with Bc = 64 at d <= 64 (112 registers at d = 64: two
    blocks an SM); one warpgroup (4 warps, 64 rows) with Bc = 64 at 64 < d <= 96, Bc = 48 at
    96 < d <= 128 (157 registers, 66.5 KB of shared memory at d = 128: three blocks an SM), Bc = 32
    at 128 < d <= 160, Bc = 48 at 160 < d <= 192, and two warpgroups with Bc = 64 above (tiles 224
    or 256 columns wide).  On the
    H100 at N = 4,096 and 16,384, B·H = 64 and 16 (kernels/data/fwd_fp16_v5_h100_aff81c6): d = 64 Bc 64
    1.06-1.25x SDPA flash against 0.79-0.99x for Bc 128.  At d = 128 the first default, two
    warpgroups with Bc = 128 (217 registers, 164 KB: one block an SM), lost to one warpgroup with
    Bc = 64 (168 registers, 83 KB: two blocks) on every bench-grid row, fp16 and bf16, N
    1,024-16,384, causal or not, in one run (kernels/data/fwd_fp16_v5_blocks_h100_532db74,
    ``grid.csv``): 1.01-1.15x; and that one to Bc = 48 on all 12 rows of a second run (N 1,024,
    4,096, 16,384; ``blocks2.csv``): 1.00-1.10x, 1.27-1.44x SDPA flash at N >= 4,096.  Resident
    blocks overlap one's softmax with another's products; Bc = 32 (four blocks) was slower again.
    At d = 64 one warpgroup, Bc = 48, or both lost to the default on the grid (within 2.4% on one
    row).  The other head dims, N = 4,096, B·H = 64, one timing each against SDPA flash in the same
    run (kernels/data/fwd_fp16_v5_wide_h100_1133a8a; 64-column atoms), one warpgroup with Bc = 48 / 32 /
    64, two with
    Bc = 64: d = 80 1.20 / - / 1.11 / 0.90x; 96 1.12 / 1.05 / 1.09 / 0.87x; 112 1.36 / - / 1.33 /
    1.10x; 160 1.45 / 1.69 / 1.12 / 1.54x; 192 1.48 / 1.29 / 1.07 / 1.35x; 224 1.06 / 1.63 / 1.32 /
    1.69x; 256 0.98 / 1.34 / 1.10 / 1.39x.  With 32-column atoms where d % 64 is 1..32 (929b107,
    ``sw64_929b107/`` and ``tune80_d6b06a6/`` there): d = 96 1.04 / 1.11 / 1.22 / 0.85x, d = 80 Bc
    48 1.25x and Bc 64 1.33x, d = 160 Bc 32 1.73-1.74x (timed twice), Bc 64 1.71x, two warpgroups
    1.53x, d = 224 Bc 32 1.57x, Bc 64 1.24x, two warpgroups 1.72x.  Small grids change the shape
    (``flashsim.algorithms.fast.fit_to_grid``): one warpgroup at d <= 64 and above 192, Bc = 64 at
    96 < d <= 128."""
    if d <= 64:
        return dict(bc=64, nw=8, mt=1, qreg=False, lpt=False, splits=1)
    if d <= 128:
        return dict(bc=64 if d <= 96 else 48, nw=4, mt=1, qreg=False, lpt=False, splits=1)
    if d <= 192:
        return dict(bc=32 if d <= 160 else 48, nw=4, mt=1, qreg=False, lpt=False, splits=1)
    return dict(bc=64, nw=8, mt=1, qreg=False, lpt=False, splits=1)


def default_config_v7(d: int) -> dict:
    """Two warpgroups (128 query rows), Bc = 64, except at d = 96, 112 and 128: v5's one warpgroup
    (Bc = 64 at 96, 48 at 112 and 128).  H100, N = 4,096, B·H = 64, ratios to SDPA flash
    (kernels/data/fwd_fp16_v7_h100): with v5's blocks v7 lost to v5 at d = 72-88, 104 and 136-168
    (0.67-0.97x v5, ``sweep_v5blocks.csv``); two warpgroups ran 1.46x at d = 72 and 1.84x at
    d = 136 where one ran 0.75x and 1.00x (``tune72/``, ``tune136/``), and 1.05-2.32x at every d from
    64 to 256 (``sweep_2wg.csv``), above v5's blocks everywhere but at d = 96 (1.05x against
    1.32-1.35x), 112 (1.45x against 1.51x) and 128 (1.29x against 1.39-1.40x); with v5's block there,
    1.04-1.18x v5 on the grid rows, N 1,024-16,384, causal or not (``grid_final.csv``).

    ``lpt`` (causal blocks longest first across heads, in sections of heads whose K and V fit in
    50 MiB: :func:`kernels.perf._tiles.query_block`): on an H200 at 8a88e34
    (kernels/data/fwd_fp16_v7_lpt_h200_8a88e34, ``kernels.perf.tune``, fp16, lpt off and on
    alternated; the median of the pairs' time on / time off) 0.86x grid order's time at d = 64, N =
    1,024, B·H = 64; 0.93x at N = 4,096; 0.94x at N = 16,384, B·H = 16; at d = 128 0.91x, 0.96x and
    0.94x there; at N = 16,384, B·H = 64 (sections of 8 and 4 heads), two pairs each: 0.99x at d =
    64, 1.02x (1.04x and 0.99x) at d = 128.  Timed at d = 64 and 128 only, without GQA.  v5 keeps
    grid order (not timed with it).  The launcher turns it off where B·H exceeds the SM count, where
    it cost 4-13% (``flashsim.algorithms.fast.fit_to_grid``, measured there)."""
    if d in (96, 112, 128):
        return dict(default_config_v5(d), lpt=True)
    return dict(bc=64, nw=8, mt=1, qreg=False, lpt=True, splits=1)


def supports(dtype, d: int) -> bool:
    return dtype_name(dtype) in ("float16", "bfloat16") and d % 8 == 0 and 8 <= d <= 256


def supports_v5(dtype, d: int) -> bool:
    return dtype_name(dtype) in ("float16", "bfloat16") and d % 8 == 0 and 8 <= d <= 256


def smem_bytes_v7(dp: int, br: int, bc: int) -> int:
    # v5's, and two mbarriers of 16 bytes
    return smem_bytes_v5(dp, br, bc) + 32


def _tma_maps(k, v, d: int, bc: int):
    from .tma import kv_maps

    return kv_maps(k, v, swizzle_bytes(d) // 2, bc, swizzle_bytes(d))


#: What the launcher needs for a split-KV forward (v5, v7; ``splits`` > 1).
SPLIT_KV = SimpleNamespace(combine=combine_kernel, smem=smem_bytes_split, threads=COMBINE_THREADS,
                           elems=COMBINE_ELEMS)


def _version(name: str, lazy: bool, default_config, wg: bool = False, tma: bool = False):
    kern = partial(kernel, lazy=lazy, wg=wg, tma=tma)
    sizes, accepts = ((smem_bytes_v7 if tma else smem_bytes_v5, supports_v5) if wg
                      else (smem_bytes, supports))

    def forward(q, k, v, *, causal=False, scale=None, return_lse=False, **config):
        """O (and L) for fp16 or bf16 (B, H, N, d) inputs; ``config`` overrides the version's
        ``default_config``."""
        return launch_forward(name, kern, sizes, default_config, accepts, q, k, v, causal=causal,
                              scale=scale, return_lse=return_lse, config=config, maps=_tma_maps if tma else None,
                              split=SPLIT_KV if wg else None)

    # v5's products exist only on sm_90a (numba-cuda compiles for it on a 9.0 GPU by itself;
    # kernels.perf.inspect asks for it by CC)
    return SimpleNamespace(name=name, forward=forward, kernel=kern, default_config=default_config,
                           supports=accepts, smem_bytes=sizes, signature=signature_tma if tma else signature,
                           CC=(9, 0, "a") if wg else (9, 0),
                           SOURCES={"fwd": (partial(_source, LAZY=lazy, WG=wg, TMA=tma),
                                            signature_tma if tma else signature)})


#: The versions by the names the records use (:func:`kernels.perf.variant`).
VERSIONS = {"fwd_fp16_v3": _version("fwd_fp16_v3", False, default_config_v3),
            "fwd_fp16_v4": _version("fwd_fp16_v4", True, default_config_v4),
            "fwd_fp16_v5": _version("fwd_fp16_v5", True, default_config_v5, wg=True),
            "fwd_fp16_v7": _version("fwd_fp16_v7", True, default_config_v7, wg=True, tma=True)}
