"""Which (query block, key block) pairs an algorithm must visit: causal and block-sparse masks.

Causal masking is aligned bottom-right (flash-attention >= 2.1): query row i sees key column j
iff j <= i + (Nk - Nq).  A block is *visible* if at least one of its (row, column) pairs is
unmasked and, when the workload has a block-sparsity mask, that mask allows the block.  Tiled
algorithms skip invisible blocks entirely: no K/V tile is loaded for them.

A sliding window ``window=(left, right)`` (an option of flash2, not a workload field) keeps only
keys within ``left`` before and ``right`` after the query's position pos = i + Nk - Nq: row i
sees j iff pos - left <= j <= pos + right (and j <= pos when causal, so right only matters
without it).  The keys a query block sees are then one interval, so its visible key blocks are a
range first .. limit - 1 rather than a prefix.
"""

from __future__ import annotations

import numpy as np

from .config import Tiling, Workload, cdiv


def causal_col_limit(workload: Workload, rows: np.ndarray | int) -> np.ndarray:
    """Number of key columns visible to query row(s) ``rows`` (0 for a fully masked row)."""
    r = np.asarray(rows, dtype=np.int64)
    if not workload.causal:
        return np.full(r.shape, workload.nk, dtype=np.int64)
    return np.clip(r + (workload.nk - workload.nq) + 1, 0, workload.nk)


def _check_mask_blocks(workload: Workload, tiling: Tiling) -> None:
    bm = workload.block_mask
    if bm is not None and (bm.block_m, bm.block_n) != (tiling.block_m, tiling.block_n):
        raise ValueError(
            f"block_mask blocks={(bm.block_m, bm.block_n)}: must equal the tiling "
            f"(block_m, block_n)={(tiling.block_m, tiling.block_n)}"
        )


def check_window(window) -> tuple[int, int] | None:
    """``window`` as (left, right) ints >= 0, or None: from a pair or from the text "L,R"."""
    if window is None:
        return None
    if isinstance(window, str):
        parts = window.replace(" ", "").split(",")
        if len(parts) != 2:
            raise ValueError(f"window={window!r}: must be two integers 'LEFT,RIGHT'")
        try:
            window = (int(parts[0]), int(parts[1]))
        except ValueError:
            raise ValueError(f"window={window!r}: must be two integers 'LEFT,RIGHT'") from None
    try:
        left, right = window  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(f"window={window!r}: must be a pair (left, right) of integers >= 0") from None
    out = []
    for name, v in (("window left", left), ("window right", right)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"window={window!r}: {name}={v!r} must be an integer >= 0")
        if v < 0:
            raise ValueError(f"window={window!r}: {name}={int(v)} must be >= 0")
        out.append(int(v))
    return out[0], out[1]


def window_block_range(workload: Workload, tiling: Tiling, rows: np.ndarray,
                       window: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """For query blocks ``rows``, the key blocks they see with a sliding window: first .. limit - 1
    (first = limit = 0 when none).  Block i's rows r = i·Br .. e_i see the union of the rows'
    intervals [pos_r - left, pos_r + R] (R = 0 if causal else right), which is the interval
    [pos_first - left, pos_last + R] clipped to [0, Nk - 1]: consecutive rows' intervals overlap."""
    left, right = window
    br, bc, nk = tiling.block_m, tiling.block_n, workload.nk
    i = np.asarray(rows, dtype=np.int64)
    shift = nk - workload.nq
    first_row, last_row = i * br, np.minimum((i + 1) * br, workload.nq) - 1
    c0 = np.maximum(0, first_row + shift - left)
    c1 = np.minimum(nk - 1, last_row + shift + (0 if workload.causal else right))
    empty = c1 < c0
    return np.where(empty, 0, c0 // bc), np.where(empty, 0, c1 // bc + 1)


def causal_block_limit(workload: Workload, tiling: Tiling, rows: np.ndarray) -> np.ndarray:
    """For query blocks ``rows``, the number of key blocks they see under the causal rule alone
    (all Tc without causal masking): block i sees key blocks 0 .. limit_i - 1, a prefix."""
    br, bc = tiling.block_m, tiling.block_n
    i = np.asarray(rows, dtype=np.int64)
    if not workload.causal:
        return np.full(i.shape, cdiv(workload.nk, bc), dtype=np.int64)
    last_row = np.minimum((i + 1) * br, workload.nq) - 1
    return -(-causal_col_limit(workload, last_row) // bc)  # key blocks whose first column is visible


def block_range(workload: Workload, tiling: Tiling, rows: np.ndarray, window=None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(first, limit) per query block of ``rows``: the key blocks first .. limit - 1 it sees by
    the causal rule and the window (block mask aside); first = 0 without a window."""
    window = check_window(window)
    if window is not None:
        return window_block_range(workload, tiling, rows, window)
    lim = causal_block_limit(workload, tiling, rows)
    return np.zeros_like(lim), lim


def visible_rows(workload: Workload, tiling: Tiling, rows: np.ndarray, window=None) -> np.ndarray:
    """Boolean (len(rows), Tc) array: the rows ``rows`` of :func:`visible_blocks` only (so a
    schedule can list its loop in chunks of query blocks without the whole Tr x Tc array)."""
    _check_mask_blocks(workload, tiling)
    i = np.asarray(rows, dtype=np.int64)
    tc = cdiv(workload.nk, tiling.block_n)
    first, lim = block_range(workload, tiling, i, window)
    jj = np.arange(tc, dtype=np.int64)[None, :]
    vis = (jj < lim[:, None]) & (jj >= first[:, None])
    if workload.block_mask is not None:
        vis &= workload.block_mask.array[i]
    return vis


def visible_cols(workload: Workload, tiling: Tiling, cols: np.ndarray, window=None) -> np.ndarray:
    """Boolean (len(cols), Tr) array: the columns ``cols`` of :func:`visible_blocks`, transposed
    (key block outer)."""
    _check_mask_blocks(workload, tiling)
    j = np.asarray(cols, dtype=np.int64)
    tr = cdiv(workload.nq, tiling.block_m)
    first, lim = block_range(workload, tiling, np.arange(tr, dtype=np.int64), window)
    vis = (j[:, None] < lim[None, :]) & (j[:, None] >= first[None, :])
    if workload.block_mask is not None:
        vis &= workload.block_mask.array[:, j].T
    return vis


def visible_blocks(workload: Workload, tiling: Tiling, window=None) -> np.ndarray:
    """Boolean (Tr, Tc) array: True where block (i, j) has at least one unmasked entry.

    Tr x Tc booleans: at N = 2^20 with 1 x 1 blocks that is a terabyte.  The simulator itself
    uses :func:`visible_counts` (O(Tr + Tc)) and :func:`visible_rows` (a chunk at a time).
    """
    tr = cdiv(workload.nq, tiling.block_m)
    return visible_rows(workload, tiling, np.arange(tr, dtype=np.int64), window)


def visible_counts(workload: Workload, tiling: Tiling, window=None) -> tuple[np.ndarray, np.ndarray]:
    """(per query block i, the number of key blocks it sees; per key block j, the number of query
    blocks that see it): the row and column sums of :func:`visible_blocks`, in O(Tr + Tc) memory
    and time when there is no block mask (a causal block sees a prefix of the key blocks, so
    column j is seen by the blocks whose prefix is longer than j)."""
    _check_mask_blocks(workload, tiling)
    tr, tc = cdiv(workload.nq, tiling.block_m), cdiv(workload.nk, tiling.block_n)
    if workload.block_mask is not None:
        vis = visible_blocks(workload, tiling, window)
        return vis.sum(axis=1, dtype=np.int64), vis.sum(axis=0, dtype=np.int64)
    first, lim = block_range(workload, tiling, np.arange(tr, dtype=np.int64), window)
    # col_count[j] = #{i : first_i <= j < lim_i} = #{i : lim_i > j} - #{i : first_i > j}
    #             = (Tr - #{i : lim_i <= j}) - (Tr - #{i : first_i <= j})
    le = np.cumsum(np.bincount(lim, minlength=tc + 1))[:tc]
    fe = np.cumsum(np.bincount(first, minlength=tc + 1))[:tc]
    return lim - first, (fe - le).astype(np.int64)


def fully_masked_rows(workload: Workload) -> int:
    """Query rows that see no key (only with causal and Nq > Nk): their O is 0, L is -inf."""
    if not workload.causal:
        return 0
    return int(max(0, workload.nq - workload.nk))
