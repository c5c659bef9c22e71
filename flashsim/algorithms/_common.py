"""Layouts and head-to-slice maps shared by the algorithm modules."""

from __future__ import annotations

import numpy as np

from ..config import STAT_BYTES, Tiling, Workload, cdiv
from ..traffic import SECTOR_BYTES, TensorLayout, read

#: The most programs (B·H or B·Hkv) and blocks along one axis (⌈N/block⌉, ⌈d/s⌉) a schedule
#: takes: the walker holds O(programs + blocks) int64s (at the limit, tens of MB each).
MAX_PROGRAMS = 2**22
MAX_BLOCKS = 2**22

#: Tensors with one row per query (Nq rows of d), per query head.
Q_LIKE = ("Q", "O", "dO", "dQ")
#: Tensors with one row per key (Nk rows of d), per kv head.
KV_LIKE = ("K", "V", "dK", "dV")
#: Float32 row statistics, one per query row, per query head.
STATS = ("m", "l", "L", "D")
#: N x N score-shaped matrices of standard attention, per query head.
SCORES = ("S", "P", "dS", "dP", "Z")


def layouts(w: Workload, names: tuple[str, ...] | list[str]) -> dict[str, TensorLayout]:
    """Tensor layouts for ``names`` in the (B, H, rows, cols) convention of the workload."""
    eb = w.elem_bytes
    out = {}
    for n in names:
        if n in Q_LIKE:
            out[n] = TensorLayout(n, w.nq, w.d, eb, w.bh)
        elif n in KV_LIKE:
            out[n] = TensorLayout(n, w.nk, w.d, eb, w.batch * w.hkv)
        elif n in STATS:
            out[n] = TensorLayout(n, w.nq, 1, STAT_BYTES, w.bh)
        elif n in SCORES:
            out[n] = TensorLayout(n, w.nq, w.nk, eb, w.bh)
        else:
            raise KeyError(n)
    return out


def check_programs(n: int, what: str) -> None:
    if n > MAX_PROGRAMS:
        raise ValueError(f"{what}={n:,}: the simulator walks at most {MAX_PROGRAMS:,} programs (thread-block "
                         f"programs per launch); use the closed forms (flashsim.closed_vec) beyond that")


def per_query_head_slices(w: Workload, names) -> dict[str, np.ndarray]:
    """slice_of for launches with one program per (batch, query head) p = b*H + h: query-shaped
    tensors use slice p, kv-shaped tensors slice b*Hkv + h // group."""
    check_programs(w.bh, "batch*heads")
    p = np.arange(w.bh, dtype=np.int64)
    b, h = p // w.heads, p % w.heads
    kv = b * w.hkv + h // w.group
    return {n: (kv if n in KV_LIKE else p) for n in names}


def per_kv_head_slices(w: Workload, names) -> dict[str, np.ndarray]:
    """slice_of for launches with one program per (batch, kv head) p = b*Hkv + g: kv-shaped
    tensors use slice p, query-shaped ones slice b*H + g*group (the first query head of the
    group; accesses add ``slice_offset`` for the others)."""
    check_programs(w.batch * w.hkv, "batch*kv_heads")
    p = np.arange(w.batch * w.hkv, dtype=np.int64)
    b, g = p // w.hkv, p % w.hkv
    q = b * w.heads + g * w.group
    return {n: (p if n in KV_LIKE else q) for n in names}


def check_blocks(n: int, block: int, what: str = "seq_len") -> int:
    """⌈n/block⌉, or a ValueError when that is more blocks than the simulator walks."""
    t = cdiv(n, block)
    if t > MAX_BLOCKS:
        raise ValueError(f"{what}={n:,}: with blocks of {block:,} that is {t:,} blocks; the simulator walks at most "
                         f"{MAX_BLOCKS:,} per axis (larger blocks, or the closed forms in flashsim.closed_vec)")
    return t


def block_rows(n: int, block: int, what: str = "seq_len") -> tuple[np.ndarray, np.ndarray]:
    """First row and row count of each of the ⌈n/block⌉ blocks (the last one ragged)."""
    check_blocks(n, block, what)
    start = np.arange(0, n, block, dtype=np.int64)
    return start, np.minimum(block, n - start)


def paper_rule_plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None,
                    **options) -> tuple[Tiling, dict]:
    """The M rule of the FlashAttention algorithms (their ``plan``): an explicit tiling if given,
    else the paper's Bc = ⌈M/4d⌉, Br = min(Bc, d) from ``sram_elems`` (M >= 4d)."""
    if tiling is not None:
        return tiling, dict(options)
    if sram_elems is None:
        raise ValueError("sram_elems=None: give an SRAM size M or explicit block sizes (block_m, block_n)")
    return Tiling.from_sram(sram_elems, w.head_dim), dict(options)


def tiling_blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[int | None, int | None]:
    """(block_m, block_n) a record shows for a run of a Br x Bc tiled algorithm (its ``blocks``)."""
    return (None, None) if tiling is None else (tiling.block_m, tiling.block_n)


def classes(start: np.ndarray, size: np.ndarray, weight: np.ndarray | int = 1
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks grouped by what a count can see of them: (start mod 32, size).

    A transfer's elements depend only on its size, and its sectors only on its size and its
    start address mod 32, which for a block starting at row (or column) ``start`` depends only
    on ``start`` mod 32.  Returns (a representative start, the size, the summed ``weight``) per
    class: at most 64 classes for blocks of one size with a ragged last one.
    """
    start = np.asarray(start, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    weight = np.broadcast_to(np.asarray(weight, dtype=np.int64), start.shape)
    n = start.size
    if start.ndim == 1 and n > 2 * SECTOR_BYTES and (size[:-1] == size[0]).all():
        # The usual case (block_rows): one size but for the last block.  No sort: residues of
        # the first n - 1 blocks by bincount, the last block a class of its own.
        r = start[:-1] % SECTOR_BYTES
        tot = np.rint(np.bincount(r, weights=weight[:-1], minlength=SECTOR_BYTES)).astype(np.int64)
        first = np.zeros(SECTOR_BYTES, dtype=np.int64)
        first[r[::-1]] = np.arange(n - 2, -1, -1, dtype=np.int64)  # the first block of each residue
        k = np.flatnonzero(tot)
        rep, sz, tw = (np.append(start[first[k]], start[-1]), np.append(size[first[k]], size[-1]),
                       np.append(tot[k], weight[-1]))
        keep = tw > 0
        return rep[keep], sz[keep], tw[keep]
    key = (start % SECTOR_BYTES) + SECTOR_BYTES * size
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    # float64 sums are exact here: a weight total is at most Tr·Tc·group <= 2^53
    total = np.rint(np.bincount(inv.ravel(), weights=weight.ravel(), minlength=uniq.size)).astype(np.int64)
    keep = total > 0
    return start[first][keep], size[first][keep], total[keep]


def require_tiling(tiling: Tiling | None, algo: str) -> Tiling:
    if tiling is None:
        raise ValueError(f"tiling=None: {algo} needs block sizes (block_m, block_n) or an SRAM size")
    return tiling


def head_classes(group: int) -> tuple[np.ndarray, np.ndarray]:
    """The query heads 0 .. group-1 of a kv head's group, as slice offsets grouped mod 32 (all a
    sector count can see of an offset): (representative offsets, how many heads each stands for),
    both shaped (k, 1) to broadcast against a row of block classes."""
    rep = np.arange(min(group, SECTOR_BYTES), dtype=np.int64)
    return rep[:, None], ((group - rep + SECTOR_BYTES - 1) // SECTOR_BYTES)[:, None]


def chunks(n: int, parts: int = 16, least: int = 32) -> list[np.ndarray]:
    """0 .. n-1 in at most ``parts`` consecutive chunks of at least ``least`` (the last may be
    shorter): how the loop-order streams list an outer loop without holding all of it at once."""
    size = max(least, -(-n // parts))
    return [np.arange(s, min(s + size, n), dtype=np.int64) for s in range(0, n, size)]


#: Threads of the reference preprocess kernel (kernels/flash2.py, D = rowsum(dO ∘ O)) that share
#: a row: a warp's load reads 16 consecutive elements of each of its 2 rows, a row in ⌈d/16⌉ loads.
PREPROCESS_LANES = 16


def preprocess_strips(d: int) -> list[tuple[int, int]]:
    """(first column, columns) of each load of a row by the reference preprocess kernel: [16u,
    16u + 16), the last one cut at d.  The walker's schedule (:func:`strip_reads`) and the L2
    model's thread blocks (``flashsim.blocks``) both read O and dO this way."""
    return [(c0, min(PREPROCESS_LANES, d - c0)) for c0 in range(0, d, PREPROCESS_LANES)]


def strip_reads(tensor: str, row0, nrows, d: int, repeat=1):
    """Reads of rows [row0, row0 + nrows) of ``tensor`` as the reference preprocess kernel makes
    them: columns [16u, 16u + 16) in its load u, each load its own request.  Where a row's strips
    start on 32-byte boundaries (rows of a multiple of 32 bytes: fp16 d % 16 == 0, fp32 d % 8 ==
    0) they touch the sectors of whole rows; elsewhere a strip straddles a sector boundary and
    the strips of one row touch more (fp16 d = 40: 80-byte rows, 3.5 sectors a row where the
    row spans 2.5; measured so on the H100).  Exact where no two rows of one load share a
    sector (rows at least a strip plus 32 bytes long: fp16 d >= 32, fp32 d >= 24), an upper
    bound below that."""
    for c0, nc in preprocess_strips(d):
        yield read(tensor, row0, nrows, c0, nc, repeat=repeat)
