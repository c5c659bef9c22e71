"""Thread blocks: what each thread block of a launch reads and writes, in order, as the GPU runs it.

The walker (:mod:`flashsim.traffic`) needs only one program's transfers per launch, in any
order within a tensor.  An L2 model needs more: the launch's real grid (which thread blocks
exist, in the order the hardware issues them: x fastest, then y, then z), how many of them one
SM holds at once (threads and shared memory per block), and each block's global accesses as a
sequence of *steps* (one step = the tiles a block loads or stores between two barriers of its
main loop).  :class:`BlockSpec` carries that (and, for a few measured kernels, their registers
per thread, which limit the blocks an SM holds); :func:`attach` fills ``Launch.blocks`` of every
launch of a schedule built by ``flashsim.algorithms`` (standard, flash1, flash2, decode, fast,
torch_flash, torch_memeff, torch_naive), from the same workload and tiling.  A tile is a load, a
store or a reduction (``Tiles.reduction``: red/atomics, which the L2 model takes as
read-modify-writes); a bulk (TMA) copy is a load or a store like any other.

The block programs follow the reference kernels (kernels/flash2.py, kernels/flash1.py,
kernels/standard.py, kernels/perf) and PyTorch's vendored FlashAttention-2 launch by launch:

* **flash2** forward: grid (Tr, B·H), block (i, p): step Q_i; one step per visible key block j
  (K_j and V_j); step O_i, L_i.  Backward: preprocess grid (Tr, B·H), one step (O_i, dO_i, then
  D_i); dK/dV grid (Tc, B·Hkv), block (j, p): step K_j, V_j; one step per (query head g of the
  group, visible query block i): Q_i, dO_i, L_i, D_i; step dK_j, dV_j; dQ grid (Tr, B·H): step
  Q_i, dO_i, L_i, D_i; one step per visible j (K_j, V_j); step dQ_i.  Threads min(128,
  max(32, Br·Bc/4)) (preprocess 128); static shared memory as the kernels declare it.
* **fast** (kernels/perf, :mod:`flashsim.algorithms.fast`), flash2's builders with the kernels'
  orders: threads 32 per warp and dynamic shared memory as the launchers ask
  (``fast.block_resources``).  Forwards: grid (Tr, B·H), block x runs query block i = x, or
  Tr - 1 - x when causal (longest first; fwd_fp16_v7 causal with ``lpt``, its default: longest
  first across sections of ``fast.lpt_heads`` heads, ``fast.lpt_order``); fwd_fp16_v4: step Q_i, K_0, V_0 (one cp.async
  group), then one step per further visible key block (K_j, V_j, copied a step ahead), then L_i
  and O_i; the fp32 forwards: step Q_i, K_0, then V_j and K_{j+1} in steps of their own, then
  O_i, L_i.  Backwards: the preprocess (flash2's, Br = 64); the key-block kernel, grid (Tc,
  B·Hkv) (bwd_fp16_v3 causal with ``longest_first``, where ``fast.longest_first_runs``: the
  l-th block issued takes key block l // (B·Hkv) of kv head l % (B·Hkv)): step K_j, V_j with
  the first Q_i, dO_i; the copies of step n + 1 issued in step n; L_i, D_i with them
  (bwd_fp16_v1), a step ahead of them (bwd_fp16_v3) or in the step that uses them, once per key
  warp (fp32); the reduction of dQ_i (into dQacc, fp32: dQ) after the
  next step's copies; step dK_j, dV_j.  bwd_fp16_v1's dQ kernel is a query-block kernel like
  the forward (Q_i, dO_i, L_i, D_i, then K_j, V_j a step ahead, then dQ_i).  The zero fill and
  the fp32 -> fp16 conversion: min(1024, ⌈B·H·Nq·d / 256⌉) blocks of 256 threads, a grid-stride
  loop: block x's step k moves elements (k·G + x)·256 .. + 255, cut into rows.
* **torch_flash** (:mod:`flashsim.algorithms.torch_flash`): grids (x, B, H) (batch before
  head).  Forward: 4 warps, shared memory Q + K + V tiles; step Q_i with K_n, n = n_block_max -
  1, then V_n and K_{n-1} in steps of their own down to V_0; O_i, L_i.  Backward: the
  ``contiguous()`` copies, 512 outputs (of the (B, N, H, d) copy) a block of 128 threads, one
  step; dot(dO, O): dO_t_i, O_t_i, D_i and the zeroed dQaccum_i in one step; the main kernel (8
  warps, ``kSmemSize1colblock``): K_j, V_j and the first dO_t, Q; query blocks from the last
  down to the first that sees j, dO_t and Q a step ahead, LSE and D in their step (once per
  warp sharing the rows), the dQaccum atomics (reductions) after them; dK_j, dV_j (GQA: the
  expanded ones); the conversion: dQaccum_i, then dQ_i; GQA's ``sum_out``: 512 outputs a block
  of 128 threads, each reading the group's inputs.  dO_t, O_t and the expanded gradients are
  laid out per head, as the walker lays them.
* **torch_memeff** (:mod:`flashsim.algorithms.torch_memeff`, CUTLASS's
  ``fmha_cutlassF_*_rf_sm80``): grid (Tr, H, B), Bq·Bk/32 threads; block (i, h, b): for each
  key block j of its loop (causal: keys below min(Nk, (i+1)·Bq), the last tile clipped) a step
  Q_i with K_j (the MM0 iterators are rebuilt every key block, so Q_i is re-read) and a step
  V_j; then O_i (and LSE_i).  Shared memory and registers per thread as ncu reports them for
  the H100 record's kernels (``MEMEFF_RESOURCES``: 128 registers, 4 blocks an SM at d <= 64).
* **torch_naive** (:mod:`flashsim.algorithms.torch_naive`): ``vectorized_elementwise_kernel``
  (scale, its backward, T = dP ∘ P, ones, ~mask) 128 threads of 8 elements (16 where input
  and output add up to 1 byte), block x the flat elements x·W .. (x + 1)·W - 1, one step; the
  softmax kernels: the warp softmax (up to 2,048 columns forward, 1,024 backward) 128 threads,
  128 / min(32, 2^⌈log2 Nk⌉) warps of one row each (two at <= 128 columns), else one row a
  block (min(1024, Nk) threads), rows read then written; ``masked_fill_`` one block per 128·vt
  columns of a row: its first vt - 1 iterations' input, the last iteration's kept lanes, the
  mask, the output; ``triu_tril`` 128 chunks of 8 bytes a block: the chunks that start in the
  kept triangle loaded, all stored.  GEMMs: the fp16/bf16 ``nvjet`` kernels as persistent
  clusters (cr x cc CTAs of 384 threads and 168 registers, one an SM; min(cluster tiles,
  ⌊sms/(cr·cc)⌋) clusters, grid (cr·cc, clusters, 1)) dealt the cluster tiles round robin,
  column groups fastest, then row groups, then heads (an assumption: nvjet schedules tiles
  dynamically); each CTA's tile a step per K slice of 64 (A's slice read by the cluster's CTAs
  in the first column only, B's by those in the first row: TMA multicast, one L2 read a
  cluster), then its C tile; the fp32 sm80 kernels one tile a block, a step per K slice of 8,
  grid x along C's columns for C = X·Yᵀ (cuBLAS "tn") and along C's rows otherwise, as the
  record's grids have them.
* **flash1**: one block per program (grid (B·H) forward, (B·Hkv) backward): the init block
  writes its zeros in one step; the main block loads K_j, V_j (one step per key block with a
  visible query block), then per visible (query head, i) one step that reads Q_i, O_i, ℓ_i, m_i
  (backward: Q_i, O_i, dO_i, dQ_i, ℓ_i, m_i) and writes O_i, ℓ_i, m_i (backward dQ_i); the
  backward writes dK_j, dV_j in a step after each j.
* **decode**: grid (S, B·Hkv) (split fastest), block (s, b·Hkv + h): step L_b (the sequence's
  length, one int32 of Lens, read by every block); step Q (if the split has a key block); one
  step per key block (its block-table entries, then K and V, page segment by page segment, row
  by row when Hkv > 1); step O, L (S = 1) or Op, Lp.  Combine grid
  (B·Hq·Nq): one step reading Lp and Op of every split, then O and L.  128 threads; shared
  memory an estimate (Q, a K and a V block, the fp32 scores and accumulator), not a kernel's
  declaration.
* **standard**: C = A Bᵀ (S = Q Kᵀ, dP = dO Vᵀ) grid (Tc, Tr, B·H), block (j, i, p): one step
  per b-wide slice of the head dimension (A[i, c0:c0+b] and B[j, c0:c0+b]), then the b x b tile
  of C; C = A B (O = P V, dQ = dS K) grid (Tr, B·H): one step per key slice k0 (A[i, k0:k0+b],
  B[k0:k0+b, :]), then C's b rows; C = Σ_h A_hᵀ B_h (dV, dK) grid (Tc, B·Hkv): one step per
  (h, r0) (A_h[r0:r0+b, j], B_h[r0:r0+b, :]), then C's b rows; the row-wise kernels (softmax,
  its backward, and the unfused elementwise passes) grid (Nq, B·H): one block per row, one
  step that reads the row of each input and writes the row of each output.  GEMM blocks have
  b/4 x b threads, row blocks 128.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from .config import STAT_BYTES, Tiling, Workload
from .masking import visible_blocks

#: Shared memory the CUDA runtime reserves per thread block (compute capability 8.x, 9.0).
RESERVED_SMEM_BYTES = 1024
#: 32-bit registers per SM (compute capability 8.0 and 9.0) and the per-warp allocation unit.
REGISTERS_PER_SM, REGISTER_UNIT = 65536, 256


@dataclass(frozen=True)
class Tiles:
    """The tiles of thread blocks [lo, hi) in grid order.

    Block ``b - lo`` makes steps ``step_ptr[b - lo] .. step_ptr[b - lo + 1] - 1``; step ``s``
    transfers tiles ``tile_ptr[s] .. tile_ptr[s + 1] - 1``, in order.  Tile ``t`` is rows
    ``row0[t] .. row0[t] + nrows[t] - 1``, columns ``col0[t] .. col0[t] + ncols[t] - 1`` of slice
    ``slice[t]`` of tensor ``names[tensor[t]]``, a store if ``write[t]``, a reduction (red or
    atomics: a read-modify-write in the L2; ``write`` is also set) if ``reduction[t]``.
    """

    step_ptr: np.ndarray
    tile_ptr: np.ndarray
    names: tuple[str, ...]
    tensor: np.ndarray  # index into names
    slice: np.ndarray
    row0: np.ndarray
    nrows: np.ndarray
    col0: np.ndarray
    ncols: np.ndarray
    write: np.ndarray
    reduction: np.ndarray


@dataclass(frozen=True)
class BlockSpec:
    """A launch as the GPU runs it: ``grid`` (x, y, z), ``threads`` and ``smem_bytes`` per block,
    and ``tiles(lo, hi)``, the accesses of blocks lo..hi-1 in grid order (x fastest)."""

    grid: tuple[int, int, int]
    threads: int
    smem_bytes: int
    tiles: Callable[[int, int], Tiles]
    #: registers per thread where a measured kernel's count is known (ncu's
    #: ``launch__registers_per_thread``); None: not modelled
    registers: int | None = None

    @property
    def num_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def blocks_per_sm(self, gpu) -> int:
        """Resident blocks per SM: the preset's block and thread limits and shared memory (each
        block also reserves RESERVED_SMEM_BYTES), and, where ``registers`` is given, the register
        file (REGISTERS_PER_SM, allocated per warp in units of REGISTER_UNIT).  Without it
        registers are not modelled (the schedule does not know the kernel's register count)."""
        per_sm_smem = gpu.max_shared_bytes_per_block + RESERVED_SMEM_BYTES
        by_smem = per_sm_smem // (self.smem_bytes + RESERVED_SMEM_BYTES)
        n = min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // self.threads, by_smem)
        if self.registers is not None:
            per_warp = -(-self.registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
            n = min(n, REGISTERS_PER_SM // (per_warp * -(-self.threads // 32)))
        return max(1, n)


# ---------------------------------------------------------------------------------------------
# Packing: tiles given as (block, step key) pairs, sorted into steps.


class _Parts:
    """Collects tiles as flat arrays; ``pack`` orders them by (block, step key, insertion)."""

    def __init__(self, lo: int, hi: int, cols: dict[str, int]):
        self.lo, self.hi, self.cols = lo, hi, cols
        self.items: list[tuple] = []

    def add(self, tensor: str, write: bool, block, key, slc, row0, nrows, col0=0, ncols=None, *,
            red: bool = False) -> None:
        """Tiles of ``tensor`` (a load, a store if ``write``, a reduction if ``red``)."""
        if ncols is None:
            ncols = self.cols[tensor]
        arrs = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (block, key, slc, row0, nrows, col0,
                                                                             ncols)))
        if arrs[0].size:
            self.items.append((tensor, 2 if red else int(bool(write)), *(a.ravel() for a in arrs)))

    def pack(self) -> Tiles:
        nb = self.hi - self.lo
        if not self.items:
            z = np.zeros(0, dtype=np.int64)
            return Tiles(np.zeros(nb + 1, dtype=np.int64), np.zeros(1, dtype=np.int64), (), z, z, z, z, z, z,
                         np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))
        cat = [np.concatenate([it[k] for it in self.items]) for k in range(2, 9)]
        block, key, slc, row0, nrows, col0, ncols = cat
        # one sort key: block (relative, < 2^22) above the step key (< 2^41); a stable sort keeps
        # the insertion order inside a step
        ck = ((block - self.lo) << 41) | key
        order = np.argsort(ck, kind="stable")
        ck = ck[order]
        sizes = [it[2].size for it in self.items]
        part = np.repeat(np.arange(len(self.items)), sizes)[order]
        names = tuple(dict.fromkeys(it[0] for it in self.items))
        tensor = np.array([names.index(it[0]) for it in self.items], dtype=np.int64)[part]
        op = np.array([it[1] for it in self.items], dtype=np.int64)[part]
        new_step = np.ones(ck.size, dtype=bool)
        new_step[1:] = ck[1:] != ck[:-1]
        starts = np.flatnonzero(new_step)
        tile_ptr = np.append(starts, ck.size).astype(np.int64)
        steps_per_block = np.bincount(ck[starts] >> 41, minlength=nb)
        step_ptr = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(steps_per_block, out=step_ptr[1:])
        return Tiles(step_ptr, tile_ptr, names, tensor, slc[order], row0[order], nrows[order], col0[order],
                     ncols[order], op >= 1, op == 2)


def _cols(schedule) -> dict[str, int]:
    return {n: t.cols for n, t in schedule.tensors.items()}


def _rows(n: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    start = np.arange(0, n, b, dtype=np.int64)
    return start, np.minimum(b, n - start)


def _grid_index(lo: int, hi: int, nx: int, ny: int | None = None) -> tuple[np.ndarray, ...]:
    """Blocks lo..hi-1 and their (x, y, z) in a grid of nx x ny (x fastest); ny=None: 2-D grid."""
    b = np.arange(lo, hi, dtype=np.int64)
    if ny is None:
        return b, b % nx, b // nx, np.zeros_like(b)
    return b, b % nx, (b // nx) % ny, b // (nx * ny)


# ---------------------------------------------------------------------------------------------
# FlashAttention-2 (kernels/flash2.py)


def _f2_threads(br: int, bc: int) -> int:
    return min(128, max(32, br * bc // 4))


def _f2_smem(kind: str, eb: int, d: int, br: int, bc: int) -> int:
    dp = -(-d // 16) * 16
    kp = dp + 4 // eb
    if kind == "fwd":
        return eb * (br * dp + 2 * bc * kp) + 4 * (br * (bc + 1) + br * dp + 3 * br)
    if kind == "dkdv":
        return eb * (2 * bc * kp + 2 * br * dp) + 4 * (2 * br + br * bc + 2 * bc * dp)
    if kind == "dq":
        return eb * (2 * br * dp + 2 * bc * kp) + 4 * (2 * br + br * bc + br * dp)
    return 4 * (128 + br)  # preprocess


#: Step key of a block's epilogue (keys stay below 2^41).
_LAST = 1 << 40


def _query_of(x, y, tr: int, reverse: bool, order, slice_of=None):
    """(query block, head) that block (x, y) of a (Tr, B·H) grid runs: with ``order`` (arrays (i, p)
    by issue order l = x + y·Tr: ``fast.lpt_order``) its l-th entry, else query block x (Tr - 1 - x
    with ``reverse``) of head y (``slice_of(y)`` where the grid orders the heads otherwise)."""
    if order is not None:
        lin = x + y * tr
        return order[0][lin], order[1][lin]
    return (tr - 1 - x if reverse else x), (y if slice_of is None else slice_of(y))


def _query_block_tiles(w: Workload, cols, q0, qn, k0, kn, vis_of, reads, writes, kv_steps, reverse=False,
                       slice_of=None, order=None):
    """``tiles(lo, hi)`` of a query-block kernel: grid (Tr, B·H), block (x, p) runs query block
    i = x (Tr - 1 - x with ``reverse``: longest first) of query head p (``slice_of(p)`` where the
    grid orders the heads otherwise; with ``order``, arrays (i, p) by issue order, the block issued
    l-th runs query block order[0][l] of head order[1][l]: ``fast.lpt_order``).  Step 0 loads
    the block's rows of each tensor in ``reads``; K_j and V_j of each visible key block j come at
    steps ``kv_steps(j, i)`` (a pair of key arrays: K's, V's), the ``writes`` at the end."""
    tr = len(q0)

    def tiles(lo, hi):
        P = _Parts(lo, hi, cols)
        b, x, y, _ = _grid_index(lo, hi, tr)
        i, p = _query_of(x, y, tr, reverse, order, slice_of)
        for name in reads:
            P.add(name, False, b, 0, p, q0[i], qn[i])
        bi, j = np.nonzero(vis_of()[i])
        kkey, vkey = kv_steps(j, i[bi])
        P.add("K", False, b[bi], kkey, p[bi] // w.group, k0[j], kn[j])
        P.add("V", False, b[bi], vkey, p[bi] // w.group, k0[j], kn[j])
        for name in writes:
            P.add(name, True, b, _LAST, p, q0[i], qn[i])
        return P.pack()

    return tiles


def _key_block_tiles(w: Workload, cols, q0, qn, k0, kn, vis_of, q_lead, stat_lead, stat_reads=1, red=None,
                     heads_first=False):
    """``tiles(lo, hi)`` of a key-block kernel: grid (Tc, B·Hkv), block (j, p) (with
    ``heads_first``, the block issued l-th takes j = l // (B·Hkv), p = l % (B·Hkv): every head's
    first key block before any head's second, bwd_fp16_v3's ``longest_first``): K_j and V_j at step
    0, then the block's steps n = 0, 1, ... over (query head g of the group, visible query
    block i), g slowest: Q_i, dO_i at step n + ``q_lead``, L_i and D_i (each ``stat_reads``
    times) at step max(0, n + ``stat_lead``), and with ``red`` the reduction of dQ_i into that
    tensor at step n + 1 (after the loads issued there); dK_j, dV_j at the end.  flash2 loads a
    step's tiles in the step (leads 1); the fast kernels prefetch (lead 0: step n's loads are
    issued while step n - 1 computes)."""
    tc = len(k0)

    def tiles(lo, hi):
        P = _Parts(lo, hi, cols)
        b, j, pk, _ = _grid_index(lo, hi, tc)
        if heads_first:
            nbh = w.batch * w.hkv
            j, pk = b // nbh, b % nbh
        P.add("K", False, b, 0, pk, k0[j], kn[j])
        P.add("V", False, b, 0, pk, k0[j], kn[j])
        vt = vis_of().T  # (Tc, Tr): key block j seen by query block i
        rank = np.cumsum(vt, axis=1) - 1
        sub = np.repeat(vt[j], w.group, axis=0)  # rows (block, g), columns i
        r, i = np.nonzero(sub)
        bl, g = r // w.group, r % w.group
        n = g * vt.sum(axis=1)[j[bl]] + rank[j[bl], i]
        bb, qs = b[bl], pk[bl] * w.group + g

        def stats():
            for name in ("L", "D"):
                for _ in range(stat_reads):
                    P.add(name, False, bb, np.maximum(0, n + stat_lead), qs, q0[i], qn[i])

        if stat_lead > q_lead:  # read in the step they belong to, before the next step's copies
            stats()
        for name in ("Q", "dO"):
            P.add(name, False, bb, n + q_lead, qs, q0[i], qn[i])
        if stat_lead <= q_lead:
            stats()
        if red is not None:
            P.add(red, True, bb, n + 1, qs, q0[i], qn[i], red=True)
        P.add("dK", True, b, _LAST, pk, k0[j], kn[j])
        P.add("dV", True, b, _LAST, pk, k0[j], kn[j])
        return P.pack()

    return tiles


def _preprocess_spec(w: Workload, cols, br: int) -> BlockSpec:
    """The preprocess kernel (kernels/flash2.py, D = rowsum(dO ∘ O)): grid (Tr, B·H), one step;
    O and dO in the 16-column strips its loads take (``algorithms._common.preprocess_strips``)."""
    from .algorithms._common import preprocess_strips

    q0, qn = _rows(w.nq, br)
    strips = preprocess_strips(w.d)

    def tiles(lo, hi):
        P = _Parts(lo, hi, cols)
        b, i, p, _ = _grid_index(lo, hi, len(q0))
        for name in ("O", "dO"):
            for c0, nc in strips:
                P.add(name, False, b, 0, p, q0[i], qn[i], c0, nc)
        P.add("D", True, b, 0, p, q0[i], qn[i])
        return P.pack()

    return BlockSpec((len(q0), w.bh, 1), 128, _f2_smem("pre", w.elem_bytes, w.d, br, br), tiles)


def _flash2(schedule, w: Workload, t: Tiling) -> None:
    br, bc = t.block_m, t.block_n
    q0, qn = _rows(w.nq, br)
    k0, kn = _rows(w.nk, bc)
    tr, tc = len(q0), len(k0)
    window = schedule.meta.get("window")
    vis_of = cache(lambda: visible_blocks(w, t, window))  # computed when a trace is first asked for
    cols = _cols(schedule)
    eb = w.elem_bytes
    in_step = lambda j, i: (1 + j, 1 + j)  # noqa: E731  K_j, V_j: the step after the query rows'
    fwd = _query_block_tiles(w, cols, q0, qn, k0, kn, vis_of, ("Q",), ("O", "L"), in_step)
    dq = _query_block_tiles(w, cols, q0, qn, k0, kn, vis_of, ("Q", "dO", "L", "D"), ("dQ",), in_step)
    dkdv = _key_block_tiles(w, cols, q0, qn, k0, kn, vis_of, q_lead=1, stat_lead=1)
    specs = {
        "flash2_fwd": BlockSpec((tr, w.bh, 1), _f2_threads(br, bc), _f2_smem("fwd", eb, w.d, br, bc), fwd),
        "flash2_bwd_preprocess": _preprocess_spec(w, cols, br),
        "flash2_bwd_dkdv": BlockSpec((tc, w.batch * w.hkv, 1), _f2_threads(br, bc),
                                     _f2_smem("dkdv", eb, w.d, br, bc), dkdv),
        "flash2_bwd_dq": BlockSpec((tr, w.bh, 1), _f2_threads(br, bc), _f2_smem("dq", eb, w.d, br, bc), dq),
    }
    for launch in schedule.launches:
        launch.blocks = specs[launch.name]


# ---------------------------------------------------------------------------------------------
# FlashAttention-1 (kernels/flash1.py): one block per program


def _flash1(schedule, w: Workload, t: Tiling) -> None:
    br, bc = t.block_m, t.block_n
    q0, qn = _rows(w.nq, br)
    k0, kn = _rows(w.nk, bc)
    tr = len(q0)
    cols = _cols(schedule)
    bwd = schedule.meta.get("pass") == "bwd"
    progs = w.batch * w.hkv if bwd else w.bh
    smem = STAT_BYTES * 5 * br + w.elem_bytes * (2 * bc * w.d + br * w.d + br * bc)

    def init(lo, hi):
        P = _Parts(lo, hi, cols)
        b = np.arange(lo, hi, dtype=np.int64)
        if bwd:
            for g in range(w.group):
                P.add("dQ", True, b, 0, b * w.group + g, 0, w.nq)
            P.add("dK", True, b, 0, b, 0, w.nk)
            P.add("dV", True, b, 0, b, 0, w.nk)
        else:
            for name in ("O", "l", "m"):
                P.add(name, True, b, 0, b, 0, w.nq)
        return P.pack()

    def main(lo, hi):
        P = _Parts(lo, hi, cols)
        b = np.arange(lo, hi, dtype=np.int64)
        vis = visible_blocks(w, t)
        kv_j = np.flatnonzero(vis.any(axis=0))
        kvs = b if bwd else b // w.group
        heads = w.group if bwd else 1
        stride = 2 + heads * tr  # step keys per key block j
        for j in kv_j.tolist():
            base = j * stride
            P.add("K", False, b, base, kvs, k0[j], kn[j])
            P.add("V", False, b, base, kvs, k0[j], kn[j])
            ii = np.flatnonzero(vis[:, j])
            for g in range(heads):
                key = base + 1 + g * tr + ii
                bb, kk = np.meshgrid(b, key, indexing="ij")
                qs = (bb * w.group + g) if bwd else bb
                rows0, nrs = q0[ii][None, :], qn[ii][None, :]
                reads = ("Q", "O", "dO", "dQ", "l", "m") if bwd else ("Q", "O", "l", "m")
                for name in reads:
                    P.add(name, False, bb, kk, qs, rows0, nrs)
                for name in (("dQ",) if bwd else ("O", "l", "m")):
                    P.add(name, True, bb, kk, qs, rows0, nrs)
            if bwd:
                P.add("dK", True, b, base + stride - 1, kvs, k0[j], kn[j])
                P.add("dV", True, b, base + stride - 1, kvs, k0[j], kn[j])
        return P.pack()

    names = ("flash1_bwd_init", "flash1_bwd") if bwd else ("flash1_fwd_init", "flash1_fwd")
    specs = {names[0]: BlockSpec((progs, 1, 1), 128, 0, init), names[1]: BlockSpec((progs, 1, 1), 128, smem, main)}
    for launch in schedule.launches:
        launch.blocks = specs[launch.name]


# ---------------------------------------------------------------------------------------------
# Standard attention (kernels/standard.py)


def _standard(schedule, w: Workload) -> None:
    gb = int(schedule.meta["gemm_block"])
    cols = _cols(schedule)
    r0, rn = _rows(w.nq, gb)
    c0, cn = _rows(w.nk, gb)
    tr, tc = len(r0), len(c0)
    d0, dn = _rows(w.d, gb)
    gemm_threads = max(1, gb // 4) * gb
    last = 1 << 40

    def listed(launch):
        """The launch's transfers in order, grouped (``counts``, O(Tr + Tc)) where the schedule has
        them: the loop-order stream of a 1 x 1-block GEMM at N = 2^20 would hold 2^36 tiles."""
        return launch.counts() if launch.counts is not None else launch.accesses()

    def roles(launch) -> tuple[list[str], str, str]:
        reads, writes = [], []
        for a in listed(launch):
            (writes if a.write else reads).append(a.tensor)
            if a.write:
                break
        return reads[:-1], reads[-1], writes[0]

    def abt(a: str, bt: str, c: str) -> BlockSpec:
        def tiles(lo, hi):
            P = _Parts(lo, hi, cols)
            b, j, i, p = _grid_index(lo, hi, tc, tr)
            for s in range(len(d0)):
                P.add(a, False, b, s, p, r0[i], rn[i], d0[s], dn[s])
                P.add(bt, False, b, s, p // w.group, c0[j], cn[j], d0[s], dn[s])
            P.add(c, True, b, last, p, r0[i], rn[i], c0[j], cn[j])
            return P.pack()
        return BlockSpec((tc, tr, w.bh), gemm_threads, 3 * gb * (gb + 1) * 4, tiles)

    def rows(a: list[str], bfull: str, c: str) -> BlockSpec:
        def tiles(lo, hi):
            P = _Parts(lo, hi, cols)
            b, i, p, _ = _grid_index(lo, hi, tr)
            for s in range(tc):
                for name in a:
                    P.add(name, False, b, s, p, r0[i], rn[i], c0[s], cn[s])
                P.add(bfull, False, b, s, p // w.group, c0[s], cn[s])
            P.add(c, True, b, last, p, r0[i], rn[i])
            return P.pack()
        return BlockSpec((tr, w.bh, 1), gemm_threads, 4 * (gb * (gb + 1) + 2 * gb * 128), tiles)

    def colsg(a: list[str], bq: str, c: str) -> BlockSpec:
        def tiles(lo, hi):
            P = _Parts(lo, hi, cols)
            b, j, pk, _ = _grid_index(lo, hi, tc)
            for h in range(w.group):
                for s in range(tr):
                    key = h * tr + s
                    for name in a:
                        P.add(name, False, b, key, pk * w.group + h, r0[s], rn[s], c0[j], cn[j])
                    P.add(bq, False, b, key, pk * w.group + h, r0[s], rn[s])
            P.add(c, True, b, last, pk, c0[j], cn[j])
            return P.pack()
        return BlockSpec((tc, w.batch * w.hkv, 1), gemm_threads, 4 * (gb * (gb + 1) + 2 * gb * 128), tiles)

    def rowwise(reads: list[str], writes: list[str]) -> BlockSpec:
        def tiles(lo, hi):
            P = _Parts(lo, hi, cols)
            b, r, p, _ = _grid_index(lo, hi, w.nq)
            for name in reads:
                P.add(name, False, b, 0, p, r, 1)
            for name in writes:
                P.add(name, True, b, 0, p, r, 1)
            return P.pack()
        return BlockSpec((w.nq, w.bh, 1), 128, 4 * len(reads) * w.nk + 4 * 128, tiles)

    for launch in schedule.launches:
        if launch.name in ("gemm_qk", "gemm_dp"):
            a, bt, c = roles(launch)
            launch.blocks = abt(a[0], bt, c)
        elif launch.name in ("gemm_pv", "gemm_dq"):
            launch.blocks = rows(*roles(launch))
        elif launch.name in ("gemm_dv", "gemm_dk"):
            launch.blocks = colsg(*roles(launch))
        else:
            acc = list(listed(launch))
            launch.blocks = rowwise([x.tensor for x in acc if not x.write], [x.tensor for x in acc if x.write])


# ---------------------------------------------------------------------------------------------
# Decoding (flashsim/algorithms/decode.py)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items: each item's group and its index inside the group."""
    counts = np.asarray(counts, dtype=np.int64)
    grp = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return grp, np.arange(grp.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def _decode(schedule, w: Workload, plan) -> None:
    from .algorithms.decode import _blocks, _pages_of, _segments

    p = plan
    cols = _cols(schedule)
    nsplit, bk, gq = p.splits, p.batch * p.hkv, p.group * p.nq
    last = 1 << 40

    @cache
    def arrays():  # made when a trace is first asked for
        blk = _blocks(p)
        segs = None if p.page is None else _segments(p, blk)
        pages = (None, None) if p.page is None else _pages_of(p, blk["r0"], blk["n"])
        key_of = blk["b"] * nsplit + blk["s"]  # nondecreasing: blocks in (b, j) order, s = k // bps
        seg_start = None if segs is None else np.searchsorted(segs["blk"], np.arange(blk["b"].size), "left")
        seg_count = None if segs is None else np.bincount(segs["blk"], minlength=blk["b"].size)
        return blk, segs, pages, key_of, seg_start, seg_count

    def main(lo, hi):
        blk, segs, (pg0, npg), key_of, seg_start, seg_count = arrays()
        P = _Parts(lo, hi, cols)
        q, s, y, _ = _grid_index(lo, hi, nsplit)  # block (s, y): split s of program y = b·Hkv + h
        b, h = y // p.hkv, y % p.hkv
        st = np.searchsorted(key_of, b * nsplit + s, "left")
        cnt = np.searchsorted(key_of, b * nsplit + s, "right") - st
        has = cnt > 0
        P.add("Lens", False, q, 0, 0, b, 1)  # the length first: it gives the block its range
        P.add("Q", False, q[has], 1, y[has], 0, gq)
        gi, k = _expand(cnt)
        e = st[gi] + k  # the key blocks of each grid block, in order
        step = 2 + k
        if p.page is None:
            for name in ("K", "V"):
                P.add(name, False, q[gi], step, y[gi], blk["r0"][e], blk["n"][e])
        else:
            P.add("BT", False, q[gi], step, b[gi], pg0[e], npg[e])
            si, sk = _expand(seg_count[e])
            sg = seg_start[e][si] + sk  # the page segments of each key block
            qq, kk, hh = q[gi][si], step[si], h[gi][si]
            if p.hkv == 1:
                for name in ("K", "V"):
                    P.add(name, False, qq, kk, segs["phys"][sg], segs["a"][sg], segs["n"][sg])
            else:  # one row per transfer: slice (page row)·Hkv + h
                ri, rk = _expand(segs["n"][sg])
                x = segs["phys"][sg][ri] * p.page + segs["a"][sg][ri] + rk
                for name in ("K", "V"):
                    P.add(name, False, qq[ri], kk[ri], x * p.hkv + hh[ri], 0, 1)
        if nsplit == 1:
            P.add("O", True, q, last, y, 0, gq)
            P.add("L", True, q, last, y, 0, gq)
        else:
            P.add("Op", True, q, last, s * bk + y, 0, gq)
            P.add("Lp", True, q, last, s * bk + y, 0, gq)
        return P.pack()

    def combine(lo, hi):
        P = _Parts(lo, hi, cols)
        c = np.arange(lo, hi, dtype=np.int64)  # (b, query head, row) = (y, r) with r < g·Nq
        y, r = c // gq, c % gq
        sp = np.arange(nsplit, dtype=np.int64)[None, :]
        cc, yy, rr = c[:, None], y[:, None], r[:, None]
        P.add("Lp", False, cc, 0, sp * bk + yy, rr, 1)
        P.add("Op", False, cc, 0, sp * bk + yy, rr, 1)
        P.add("O", True, c, last, y, r, 1)
        P.add("L", True, c, last, y, r, 1)
        return P.pack()

    eb, d, bc = w.elem_bytes, w.d, p.bc
    smem = eb * (gq * d + 2 * bc * d) + STAT_BYTES * (gq * bc + gq * d + 3 * gq)
    specs = {"decode": BlockSpec((nsplit, bk, 1), 128, smem, main),
             "decode_split": BlockSpec((nsplit, bk, 1), 128, smem, main),
             "decode_combine": BlockSpec((bk * gq, 1, 1), 128, STAT_BYTES * nsplit * (d + 1), combine)}
    for launch in schedule.launches:
        launch.blocks = specs[launch.name]


# ---------------------------------------------------------------------------------------------
# The fast kernels (kernels/perf; flashsim/algorithms/fast.py)


def _flat_tiles(P: _Parts, name: str, write: bool, block, key, start, end, rows: int, cols: int,
                slices=None) -> None:
    """Elements [start, end) of a tensor of slices of rows x cols elements, flat (the slices back
    to back), as tiles: each range cut at slice boundaries, then into its partial first row, its
    whole rows and its partial last row.  ``slices``: the tensor slice of each flat slice index
    (default the same)."""
    per = rows * cols
    fs, ls = start // per, (end - 1) // per
    g, k = _expand(ls - fs + 1)  # the slices each range touches
    slc = fs[g] + k
    a = np.maximum(start[g], slc * per) - slc * per
    e = np.minimum(end[g], (slc + 1) * per) - slc * per
    blk, ky = block[g], key[g]
    ra, ca, rb, cb = a // cols, a % cols, e // cols, e % cols
    if slices is not None:
        slc = np.asarray(slices, dtype=np.int64)[slc]
    one = ra == rb  # inside one row
    head = one | (ca > 0)
    P.add(name, write, blk[head], ky[head], slc[head], ra[head], 1, ca[head], np.where(one, cb, cols)[head] - ca[head])
    body0 = ra + (ca > 0)
    body = ~one & (rb > body0)
    P.add(name, write, blk[body], ky[body], slc[body], body0[body], (rb - body0)[body])
    tail = ~one & (cb > 0)
    P.add(name, write, blk[tail], ky[tail], slc[tail], rb[tail], 1, 0, cb[tail])


#: kernels/perf/_launch.py's ``elementwise_grid``: at most 1024 blocks of 256 threads, grid-stride.
ELEMENTWISE_BLOCKS, ELEMENTWISE_THREADS = 1024, 256


def _elementwise_spec(w: Workload, schedule, reads: tuple[str, ...], writes: tuple[str, ...]) -> BlockSpec:
    """A grid-stride loop over the B·H·Nq·d elements (zero fill, fp32 -> fp16): block x's step k
    reads (then writes) the elements k·G·T + x·T .. + T - 1 (G blocks of T threads)."""
    n = w.bh * w.nq * w.d
    grid = min(ELEMENTWISE_BLOCKS, -(-n // ELEMENTWISE_THREADS))
    stride = grid * ELEMENTWISE_THREADS
    lay = schedule.tensors

    def tiles(lo, hi):
        P = _Parts(lo, hi, _cols(schedule))
        blocks = np.arange(lo, hi, dtype=np.int64)
        bi, k = _expand(-(-(n - blocks * ELEMENTWISE_THREADS) // stride))
        start = k * stride + blocks[bi] * ELEMENTWISE_THREADS
        end = np.minimum(start + ELEMENTWISE_THREADS, n)
        for names, wr in ((reads, False), (writes, True)):
            for name in names:
                _flat_tiles(P, name, wr, blocks[bi], k, start, end, lay[name].rows, lay[name].cols)
        return P.pack()

    return BlockSpec((grid, 1, 1), ELEMENTWISE_THREADS, 0, tiles)


def _split_main(w: Workload, cols, t: Tiling, splits: int, reverse: bool, lpt_heads: int):
    """The split-KV forward's main launch (``fast._forward_split``): grid (Tr, B·H, S); block
    (x, y, z) runs the query block and head that (x, y) runs unsplit (grid order, longest first
    when causal, ``lpt`` sections), Q_i at step 0, key blocks z·n_i//S .. (z+1)·n_i//S - 1 of the n_i it sees
    (K_j, V_j at step j - its first), Op_i (flat rows) and Lp_i into slice z·B·H + p at the end."""
    from .algorithms import fast

    q0, qn = _rows(w.nq, t.block_m)
    k0, kn = _rows(w.nk, t.block_n)
    tr, d = len(q0), w.d
    nvis = cache(lambda: visible_blocks(w, t).sum(axis=1))  # a prefix of the key blocks (no block mask)
    order = fast.lpt_order(tr, w.bh, lpt_heads) if lpt_heads else None

    def tiles(lo, hi):
        P = _Parts(lo, hi, cols)
        b, x, y, z = _grid_index(lo, hi, tr, w.bh)
        i, p = _query_of(x, y, tr, reverse, order)
        P.add("Q", False, b, 0, p, q0[i], qn[i])
        n_i = nvis()[i]
        j0 = z * n_i // splits
        bi, k = _expand((z + 1) * n_i // splits - j0)
        j = j0[bi] + k
        P.add("K", False, b[bi], k, p[bi] // w.group, k0[j], kn[j])  # the first with Q (step 0)
        P.add("V", False, b[bi], k, p[bi] // w.group, k0[j], kn[j])
        P.add("Op", True, b, _LAST, z * w.bh + p, q0[i] * d, qn[i] * d)
        P.add("Lp", True, b, _LAST, z * w.bh + p, q0[i], qn[i])
        return P.pack()

    return (tr, w.bh, splits), tiles


def _split_combine(w: Workload, cols, splits: int) -> BlockSpec:
    """The split-KV forward's combine launch: grid (⌈Nq·d/1,024⌉, B·H), 256 threads; block (x, p)
    reads, for each split z, the Lp of rows of its elements 1,024x .. (a warp instruction's 32 at
    a time) and their run of Op (slice z·B·H + p), then writes their run of O and the L of the
    rows it starts."""
    from .algorithms.fast import COMBINE_ELEMS, COMBINE_THREADS, combine_warps

    T = COMBINE_THREADS * COMBINE_ELEMS  # elements a block
    n = w.nq * w.d
    nx = -(-n // T)
    cw = cache(lambda: combine_warps(w.nq, w.d))  # a head's warps: Lp's rows and the L stores are a warp's

    def tiles(lo, hi):
        P = _Parts(lo, hi, cols)
        b, x, p, _ = _grid_index(lo, hi, nx)
        e0 = x * T
        cnt = np.minimum(T, n - e0)
        bi, k = _expand(-(-cnt // 32))  # the block's warp instructions, T // 32 from x·T // 32 on
        c = cw()
        wi = x[bi] * (T // 32) + k
        has = c["ln"][wi] > 0
        for z in range(splits):
            P.add("Lp", False, b[bi], 0, z * w.bh + p[bi], c["row0"][wi], c["rows"][wi])
            P.add("Op", False, b, 0, z * w.bh + p, e0, cnt)
        P.add("O", True, b, _LAST, p, e0, cnt)
        P.add("L", True, b[bi][has], _LAST, p[bi][has], c["l0"][wi][has], c["ln"][wi][has])
        return P.pack()

    return BlockSpec((nx, w.bh, 1), COMBINE_THREADS, 0, tiles)


def _fast(schedule, w: Workload, config) -> None:
    from .algorithms import fast

    name = schedule.meta["kernel"]
    res = fast.block_resources(name, w.d, config)
    tl = fast.tiles(name, w.d, config)
    cols = _cols(schedule)
    reverse = bool(w.causal)  # kernels.perf._tiles.query_block: longest first when causal

    def query_kernel(t: Tiling, reads, writes, kv_steps, lpt_heads=0):
        q0, qn = _rows(w.nq, t.block_m)
        k0, kn = _rows(w.nk, t.block_n)
        vis_of = cache(lambda: visible_blocks(w, t))
        order = fast.lpt_order(len(q0), w.bh, lpt_heads) if lpt_heads else None
        return (len(q0), w.bh, 1), _query_block_tiles(w, cols, q0, qn, k0, kn, vis_of, reads, writes, kv_steps,
                                                      reverse, order=order)

    specs = {}
    c = fast.parse_config(name, w.d, config)
    splits = c.get("splits", 1)
    lpt = w.causal and c.get("lpt", False)  # v5, v7 (v4 and the fp32 forwards have no such knob)
    heads = fast.lpt_heads(w.nk, w.d, w.elem_bytes, w.group) if lpt else 0
    if splits > 1:
        grid, fn = _split_main(w, cols, tl["fwd"], splits, reverse, heads)
        smem = max(res["fwd"][1], fast.split_smem(w.d, tl["fwd"].block_m))
        specs[name] = BlockSpec(grid, res["fwd"][0], smem, fn)
        specs["fwd_combine"] = _split_combine(w, cols, splits)
    elif name in fast.VARIANTS and fast.VARIANTS[name][0] == "fwd":
        if name in ("fwd_fp16_v4", "fwd_fp16_v5", "fwd_fp16_v7"):  # K_j, V_j a step ahead
            grid, fn = query_kernel(tl["fwd"], ("Q",), ("L", "O"), lambda j, i: (j, j), lpt_heads=heads)
        else:  # fp32: Q_i, K_0; then V_j and K_{j+1} in steps of their own
            grid, fn = query_kernel(tl["fwd"], ("Q",), ("O", "L"), lambda j, i: (2 * j, 2 * j + 1))
        specs[name] = BlockSpec(grid, *res["fwd"], fn)
    else:
        specs["flash2_bwd_preprocess"] = _preprocess_spec(w, cols, fast.PREPROCESS_ROWS)
        t = tl["dkdv"]
        q0, qn = _rows(w.nq, t.block_m)
        k0, kn = _rows(w.nk, t.block_n)
        vis_of = cache(lambda: visible_blocks(w, t))
        grid = (len(k0), w.batch * w.hkv, 1)
        if name == "bwd_fp16_v1":
            fn = _key_block_tiles(w, cols, q0, qn, k0, kn, vis_of, q_lead=0, stat_lead=0)
            specs[f"{name}_dkdv"] = BlockSpec(grid, *res["dkdv"], fn)
            qgrid, qfn = query_kernel(tl["dq"], ("Q", "dO", "L", "D"), ("dQ",), lambda j, i: (j, j))
            specs[f"{name}_dq"] = BlockSpec(qgrid, *res["dq"], qfn)
        elif name == "bwd_fp16_v3":  # L, D of a step read a step before its Q, dO copies
            first = bool(w.causal) and c["longest_first"] and fast.longest_first_runs(c["bk"], w.batch * w.hkv)
            fn = _key_block_tiles(w, cols, q0, qn, k0, kn, vis_of, q_lead=0, stat_lead=-1, red="dQacc",
                                  heads_first=first)
            specs[name] = BlockSpec(grid, *res["dkdv"], fn)
            specs["zero_fill"] = _elementwise_spec(w, schedule, (), ("dQacc",))
            specs["dq_to_f16"] = _elementwise_spec(w, schedule, ("dQacc",), ("dQ",))
        else:  # fp32: L, D read by each key warp in the step that uses them
            fn = _key_block_tiles(w, cols, q0, qn, k0, kn, vis_of, q_lead=0, stat_lead=1,
                                  stat_reads=fast.key_warps(name, w.d, config), red="dQ")
            specs[name] = BlockSpec(grid, *res["dkdv"], fn)
            specs["zero_fill"] = _elementwise_spec(w, schedule, (), ("dQ",))
    for launch in schedule.launches:
        launch.blocks = specs[launch.name]


# ---------------------------------------------------------------------------------------------
# PyTorch's SDPA flash backend (flashsim/algorithms/torch_flash.py: FlashAttention-2 in torch 2.11)

#: at::elementwise_kernel<128, 4> (the contiguous() copies): 128 threads, 4 elements each.
TORCH_COPY_THREADS, TORCH_COPY_ITEMS = 128, 4


def _torch_flash(schedule, w: Workload) -> None:
    from .algorithms import torch_flash as tf

    cols = _cols(schedule)
    eb, d, heads = w.elem_bytes, w.d, w.heads

    def head_slice(yz):  # grids (x, B, H): y the batch, z the head
        return (yz % w.batch) * heads + yz // w.batch

    specs = {}
    if schedule.meta["pass"] == "fwd":
        bm, bn = tf.TRAITS[d][:2]
        q0, qn = _rows(w.nq, bm)
        k0, kn = _rows(w.nk, bn)
        lim = tf.fwd_key_blocks(w, bm, bn)
        vis = np.arange(len(k0))[None, :] < lim[:, None]

        def kv_steps(j, i):  # n = lim - 1 .. 0: K_{n} with Q (then after V_{n+1}), V_n in a step of its own
            t = lim[i] - 1 - j
            return 2 * t, 2 * t + 1

        fn = _query_block_tiles(w, cols, q0, qn, k0, kn, lambda: vis, ("Q",), ("O", "L"), kv_steps,
                                slice_of=head_slice)
        specs["sdpa_flash_fwd"] = BlockSpec((len(q0), w.batch, heads), 4 * 32, eb * (bm * d + 2 * bn * d), fn)
    else:
        bm, bn, nwarps, atom_m = tf.TRAITS[d][2:]
        reps = nwarps // atom_m
        q0, qn = _rows(w.nq, bm)
        k0, kn = _rows(w.nk, bn)
        tm, tn = len(q0), len(k0)
        first = tf.bwd_first_query_block(w, bm, bn)
        gqa = w.hkv != heads
        dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")

        def copy(src, dst):  # dst (B, N, H, d) contiguous from src (B, H, N, d): 512 outputs a block
            n = w.bh * w.nq * d
            per = TORCH_COPY_THREADS * TORCH_COPY_ITEMS

            def tiles(lo, hi):
                P = _Parts(lo, hi, cols)
                blocks = np.arange(lo, hi, dtype=np.int64)
                start, end = blocks * per, np.minimum(blocks * per + per, n)
                g, k = _expand((end - 1) // d - start // d + 1)  # the (b, n, h) rows each block touches
                r = start[g] // d + k
                c0 = np.maximum(start[g], r * d) - r * d
                c1 = np.minimum(end[g], (r + 1) * d) - r * d
                b, row, h = r // (w.nq * heads), (r // heads) % w.nq, r % heads
                P.add(src, False, blocks[g], 0, b * heads + h, row, 1, c0, c1 - c0)
                P.add(dst, True, blocks[g], 0, b * heads + h, row, 1, c0, c1 - c0)
                return P.pack()

            return BlockSpec((-(-n // per), 1, 1), TORCH_COPY_THREADS, 0, tiles)

        def dot(lo, hi):
            P = _Parts(lo, hi, cols)
            b, i, yz, _ = _grid_index(lo, hi, tm)
            p = head_slice(yz)
            P.add("dO_t", False, b, 0, p, q0[i], qn[i])
            P.add("O_t", False, b, 0, p, q0[i], qn[i])
            P.add("D", True, b, 0, p, q0[i], bm)
            P.add("dQaccum", True, b, 0, p, q0[i], bm, 0, d)
            return P.pack()

        def main(lo, hi):  # block (j, p): K_j, V_j; query blocks Tm - 1 down to first[j]
            P = _Parts(lo, hi, cols)
            b, j, yz, _ = _grid_index(lo, hi, tn)
            p = head_slice(yz)
            kv = (p // heads) * w.hkv + (p % heads) // w.group
            P.add("K", False, b, 0, kv, k0[j], kn[j])
            P.add("V", False, b, 0, kv, k0[j], kn[j])
            bl, n = _expand(tm - first[j])
            i, bb, pp = tm - 1 - n, b[bl], p[bl]
            for _ in range(reps):  # read at the top of the step that uses them, by each warp sharing the rows
                P.add("L", False, bb, n + 1, pp, q0[i], qn[i])
                P.add("D", False, bb, n + 1, pp, q0[i], bm)
            P.add("dO_t", False, bb, n, pp, q0[i], qn[i])  # a step ahead (step 0: with K_j, V_j)
            P.add("Q", False, bb, n, pp, q0[i], qn[i])
            P.add("dQaccum", True, bb, n + 1, pp, q0[i], bm, 0, d, red=True)
            P.add(dk, True, b, _LAST, kv if not gqa else p, k0[j], kn[j])
            P.add(dv, True, b, _LAST, kv if not gqa else p, k0[j], kn[j])
            return P.pack()

        def convert(lo, hi):
            P = _Parts(lo, hi, cols)
            b, i, yz, _ = _grid_index(lo, hi, tm)
            p = head_slice(yz)
            P.add("dQaccum", False, b, 0, p, q0[i], bm, 0, d)
            P.add("dQ", True, b, 0, p, q0[i], qn[i])
            return P.pack()

        smem_main = eb * (3 * bm * d + 2 * bn * d + 2 * bm * bn)  # kSmemSize1colblock (V not in registers)
        specs.update({"contiguous_dO": copy("dO", "dO_t"), "contiguous_O": copy("O", "O_t"),
                      "flash_bwd_dot_do_o": BlockSpec((tm, w.batch, heads), 32 * nwarps, 0, dot),
                      "flash_bwd_dq_dk_dv": BlockSpec((tn, w.batch, heads), 32 * nwarps, smem_main, main),
                      "flash_bwd_convert_dq": BlockSpec((tm, w.batch, heads), 32 * nwarps, eb * bm * d, convert)})
        if gqa:  # at::sum_out: a thread reads its 4 outputs' group of inputs, then writes them
            vec = tf.SUM_VEC
            nout = w.batch * w.hkv * w.nk * d
            per = 128 * vec
            kvp = np.arange(w.batch * w.hkv, dtype=np.int64)
            lead = (kvp // w.hkv) * heads + (kvp % w.hkv) * w.group

            def summed(src, view):
                def tiles(lo, hi):
                    P = _Parts(lo, hi, cols)
                    blocks = np.arange(lo, hi, dtype=np.int64)
                    start, end = blocks * per, np.minimum(blocks * per + per, nout)
                    zero = np.zeros_like(blocks)
                    for g in range(w.group):
                        _flat_tiles(P, src, False, blocks, zero, start, end, w.nk, d, lead + g)
                    _flat_tiles(P, view, True, blocks, zero, start, end, w.nk * d // vec, vec)
                    return P.pack()

                return BlockSpec((-(-nout // per), 1, 1), 128, 0, tiles)

            specs["sum_dK"] = summed("dK_exp", "dK_vec")
            specs["sum_dV"] = summed("dV_exp", "dV_vec")
    for launch in schedule.launches:
        launch.blocks = specs[launch.name]


# ---------------------------------------------------------------------------------------------
# PyTorch's SDPA memory-efficient backend (flashsim/algorithms/torch_memeff.py: CUTLASS fmha)

#: (element bytes, kQueriesPerBlock, kKeysPerBlock) -> (dynamic shared memory, registers per
#: thread) of the ``fmha_cutlassF_*_aligned_*_rf_sm80`` kernels as the H100 torch record's ncu
#: reports them (``launch__shared_mem_per_block_dynamic``, ``launch__registers_per_thread``);
#: bf16 as fp16.  A kernel not measured (fp32 at d > 64) gets the fp16 kernel's shared memory
#: scaled by the element size, an estimate, and no register limit.
MEMEFF_RESOURCES = {(2, 64, 64): (18944, 128), (2, 64, 128): (52224, 128), (4, 64, 64): (36352, 168)}


def _torch_memeff(schedule, w: Workload) -> None:
    from .algorithms import torch_memeff as tm

    bq, bk = schedule.meta["block_m"], schedule.meta["block_n"]
    cols = _cols(schedule)
    q0, qn = _rows(w.nq, bq)
    keys = tm.key_extent(w, bq)
    nblk = -(-keys // bk)
    lse = schedule.meta["lse"]
    lse_n = np.clip(schedule.tensors["L"].rows - q0, 0, bq) if lse else None

    def tiles(lo, hi):  # grid (Tr, H, B): block (i, h, b)
        P = _Parts(lo, hi, cols)
        b, i, h, z = _grid_index(lo, hi, len(q0), w.heads)
        p = z * w.heads + h
        g, j = _expand(nblk[i])  # key block j of block g: Q_i and K_j (MM0), then V_j (MM1)
        kr = np.minimum(bk, keys[i[g]] - j * bk)
        P.add("Q", False, b[g], 2 * j, p[g], q0[i[g]], qn[i[g]])
        P.add("K", False, b[g], 2 * j, p[g], j * bk, kr)
        P.add("V", False, b[g], 2 * j + 1, p[g], j * bk, kr)
        P.add("O", True, b, _LAST, p, q0[i], qn[i])
        if lse:
            P.add("L", True, b, _LAST, p, q0[i], lse_n[i])
        return P.pack()

    eb = 2 if w.elem_bytes < 4 else 4
    smem, regs = MEMEFF_RESOURCES.get((eb, bq, bk), (MEMEFF_RESOURCES[(2, bq, bk)][0] * eb // 2, None))
    spec = BlockSpec((len(q0), w.heads, w.batch), bq * bk // 32, smem, tiles, regs)
    for launch in schedule.launches:
        launch.blocks = spec


# ---------------------------------------------------------------------------------------------
# Eager naive attention (flashsim/algorithms/torch_naive.py): ATen's elementwise, softmax and mask
# kernels and cuBLAS's GEMMs

#: ``vectorized_elementwise_kernel``: 128 threads, each ``elems_per_thread`` elements (16 where its
#: inputs and output add up to 1 byte, else 8: ATen's CUDA ``elems_per_thread<io_sizes>``).
ATEN_THREADS = 128
#: Registers per thread of every nvjet GEMM of the H100 record (ncu), 384 threads a CTA: one CTA an SM.
NVJET_REGISTERS, NVJET_THREADS = 168, 384
#: K step of the GEMMs' main loops: nvjet's (the ``_64x4_`` of its names), the sm80 fp32 kernels'
#: (``tilesize128x64x8_stage3``: 8, three stages of fp32 A and B tiles in shared memory).
NVJET_K_STEP, SM80_K_STEP, SM80_STAGES = 64, 8, 3


def _naive_gemm(P: _Parts, g, b, key, p, t_r, t_c, base) -> None:
    """Tile (row tile ``t_r``, column tile ``t_c``) of C = A·B of head ``p`` (a torch_naive
    ``_Gemm``) by blocks ``b``: one step per K slice (A's slice where ``a_of`` is set, B's where
    ``b_of``), then C's tile; step keys from ``base``.  ``key``: (a_of, b_of, kstep)."""
    a_of, b_of, ks = key
    r0, rn, c0, cn = g.r0[t_r], g.rn[t_r], g.c0[t_c], g.cn[t_c]
    k0, kn = _rows(g.k, ks)
    bi, s = _expand(np.full(b.size, k0.size))
    kk, kw = k0[s], kn[s]
    for (name, how), lo, n, on in ((g.a, r0, rn, a_of), (g.b, c0, cn, b_of)):
        m = on[bi]
        if how == "rows":  # the band is the tensor's rows; K its columns
            P.add(name, False, b[bi][m], base[bi][m] + s[m], p[bi][m], lo[bi][m], n[bi][m], kk[m], kw[m])
        else:  # the band is the tensor's columns; K its rows
            P.add(name, False, b[bi][m], base[bi][m] + s[m], p[bi][m], kk[m], kw[m], lo[bi][m], n[bi][m])
    P.add(g.c, True, b, base + k0.size, p, r0, rn, c0, cn)


def _torch_naive(schedule, w: Workload, parts, sms: int) -> None:
    from .algorithms.torch_naive import fill_block, fill_kept, tril_active, warp_softmax

    cols = _cols(schedule)
    lay = schedule.tensors
    specs = {}

    def flat(reads, writes, per_block, n):
        def tiles(lo, hi):
            P = _Parts(lo, hi, cols)
            blocks = np.arange(lo, hi, dtype=np.int64)
            start, end = blocks * per_block, np.minimum(blocks * per_block + per_block, n)
            zero = np.zeros_like(blocks)
            for names, wr in ((reads, False), (writes, True)):
                for name in names:
                    _flat_tiles(P, name, wr, blocks, zero, start, end, lay[name].rows, lay[name].cols)
            return P.pack()
        return tiles

    def softmax(reads, writes, bwd):  # host_softmax: warp softmax (rows per block) or one row a block
        nk = w.nk
        if warp_softmax(w, bwd):
            p2 = 1 << max(0, (nk - 1).bit_length())
            warp = min(p2, 32)
            rows, threads = (ATEN_THREADS // warp) * (2 if p2 <= 128 else 1), ATEN_THREADS
        else:
            rows, threads = 1, min(1024, -(-nk // 32) * 32)
        n = w.bh * w.nq
        return BlockSpec((-(-n // rows), 1, 1), threads, 0, flat(reads, writes, rows * nk, n * nk))

    def gemm(g):
        tr, tc = len(g.r0), len(g.c0)
        if g.bulk:  # nvjet: persistent clusters of cr x cc CTAs, cluster tiles dealt round robin
            size = g.cr * g.cc
            gr, gc = -(-tr // g.cr), -(-tc // g.cc)
            units = w.bh * gr * gc
            ncl = min(units, max(1, sms // size))
            per = -(-units // ncl)
            ks = NVJET_K_STEP
            nks = -(-g.k // ks)

            def tiles(lo, hi):
                P = _Parts(lo, hi, cols)
                b, x, c, _ = _grid_index(lo, hi, size)
                bi, n = _expand(np.full(b.size, per))
                u = c[bi] + n * ncl  # the cluster's n-th unit: column groups fastest, then row groups, then heads
                a, o = x[bi] // g.cc, x[bi] % g.cc
                t_r, t_c = (u // gc) % gr * g.cr + a, u % gc * g.cc + o
                ok = (u < units) & (t_r < tr) & (t_c < tc)
                bb, p = b[bi][ok], (u // (gc * gr))[ok]
                _naive_gemm(P, g, bb, (o[ok] == 0, a[ok] == 0, ks), p, t_r[ok], t_c[ok], n[ok] * (nks + 1))
                return P.pack()

            return BlockSpec((size, ncl, 1), NVJET_THREADS, 0, tiles, NVJET_REGISTERS)
        # sm80 fp32 kernels: one tile a block; grid x along C's columns for C = X·Yᵀ (B given as
        # rows, cuBLAS "tn"), along C's rows otherwise, as the record's grids show
        cols_first = g.b[1] == "rows"
        nx, ny = (tc, tr) if cols_first else (tr, tc)

        def tiles(lo, hi):
            P = _Parts(lo, hi, cols)
            b, x, y, p = _grid_index(lo, hi, nx, ny)
            t_r, t_c = (y, x) if cols_first else (x, y)
            on = np.ones(b.size, dtype=bool)
            _naive_gemm(P, g, b, (on, on, SM80_K_STEP), p, t_r, t_c, np.zeros_like(b))
            return P.pack()

        tm, tn = int(g.rn.max()), int(g.cn.max())
        return BlockSpec((nx, ny, w.bh), 128, SM80_STAGES * (tm + tn) * SM80_K_STEP * w.elem_bytes, tiles)

    for name, kind, p in parts:
        if kind == "gemm":
            specs[name] = gemm(p)
        elif kind == "ew" and name in ("softmax", "softmax_bwd"):
            specs[name] = softmax(*p, name == "softmax_bwd")
        elif kind == "ew":  # vectorized_elementwise_kernel over the output's elements
            reads, writes = p
            n = lay[writes[0]].slices * lay[writes[0]].rows * lay[writes[0]].cols
            io = sum(lay[t].elem_bytes for t in reads + writes)
            per = ATEN_THREADS * (16 if io == 1 else 8)
            specs[name] = BlockSpec((-(-n // per), 1, 1), ATEN_THREADS, 0, flat(reads, writes, per, n))
        elif kind == "fill":  # masked_fill_: block (head, row, column block) of fill_block columns
            (x, mask), blk = p[0], fill_block(w)
            per_row = w.nk // blk
            kept = fill_kept(w)[2].reshape(w.nq, per_row)

            def tiles(lo, hi, x=x, mask=mask, blk=blk, per_row=per_row, kept=kept):
                P = _Parts(lo, hi, cols)
                b = np.arange(lo, hi, dtype=np.int64)
                cb, r, h = b % per_row, (b // per_row) % w.nq, b // (per_row * w.nq)
                c0 = cb * blk
                P.add(x, False, b, 0, h, r, 1, c0, blk - 128)  # iterations 0 .. vt-2: every lane
                kn = kept[r, cb]
                m = kn > 0
                P.add(x, False, b[m], 0, h[m], r[m], 1, c0[m] + blk - 128, kn[m])  # the last: kept lanes
                P.add(mask, False, b, 0, 0, r, 1, c0, blk)
                P.add(x, True, b, 0, h, r, 1, c0, blk)
                return P.pack()

            specs[name] = BlockSpec((w.bh * w.nq * per_row, 1, 1), 128, 0, tiles)
        else:  # tril: thread t of block b the 8-byte chunk 128·b + t; loads where it starts in the triangle
            cpr, total = w.nk // 8, w.nq * w.nk // 8
            act = tril_active(w)

            def tiles(lo, hi, cpr=cpr, total=total, act=act):
                P = _Parts(lo, hi, cols)
                b = np.arange(lo, hi, dtype=np.int64)
                s, e = b * ATEN_THREADS, np.minimum(b * ATEN_THREADS + ATEN_THREADS, total)
                g, k = _expand((e - 1) // cpr - s // cpr + 1)  # the matrix rows each block's chunks touch
                r = s[g] // cpr + k
                c_lo, c_hi = np.maximum(s[g], r * cpr), np.minimum(e[g], r * cpr + act[r])
                m = c_hi > c_lo
                P.add("Mask1", False, b[g][m], 0, 0, c_lo[m], (c_hi - c_lo)[m])
                P.add("Mask", True, b, 0, 0, s, e - s)
                return P.pack()

            specs[name] = BlockSpec((-(-total // ATEN_THREADS), 1, 1), ATEN_THREADS, 0, tiles)
    for launch in schedule.launches:
        launch.blocks = specs[launch.name]


def attach(schedule, algo: str, w: Workload, tiling: Tiling | None, plan=None):
    """Fill ``launch.blocks`` of every launch of ``schedule`` (built by ``algo`` for ``w`` and
    ``tiling``; ``plan``: decode's resolved options, fast's block-shape config) and return the
    schedule.  Algorithms without a block model (smallcache) are returned as they are."""
    if algo == "decode":
        _decode(schedule, w, plan)
    elif algo == "fast":
        _fast(schedule, w, plan)
    elif algo == "torch_flash":
        _torch_flash(schedule, w)
    elif algo == "torch_memeff":
        _torch_memeff(schedule, w)
    elif algo == "torch_naive":
        _torch_naive(schedule, w, *plan)
    elif algo == "flash2":
        _flash2(schedule, w, tiling)
    elif algo == "flash1":
        _flash1(schedule, w, tiling)
    elif algo == "standard":
        _standard(schedule, w)
    return schedule
