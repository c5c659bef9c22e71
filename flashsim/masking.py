"""Which (query block, key block) pairs an algorithm must visit: causal and block-sparse masks.

Causal masking is aligned bottom-right (flash-attention >= 2.1): query row i sees key column j
iff j <= i + (Nk - Nq).  A block is *visible* if at least one of its (row, column) pairs is
unmasked and, when the workload has a block-sparsity mask, that mask allows the block.  Tiled
algorithms skip invisible blocks entirely: no K/V tile is loaded for them.
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


def visible_blocks(workload: Workload, tiling: Tiling) -> np.ndarray:
    """Boolean (Tr, Tc) array: True where block (i, j) has at least one unmasked entry."""
    br, bc = tiling.block_m, tiling.block_n
    tr, tc = cdiv(workload.nq, br), cdiv(workload.nk, bc)
    vis = np.ones((tr, tc), dtype=bool)
    if workload.causal:
        last_row = np.minimum((np.arange(tr) + 1) * br, workload.nq) - 1
        limit = causal_col_limit(workload, last_row)  # columns [0, limit) visible to the last row
        first_col = np.arange(tc) * bc
        vis &= first_col[None, :] < limit[:, None]
    if workload.block_mask is not None:
        bm = workload.block_mask
        if (bm.block_m, bm.block_n) != (br, bc):
            raise ValueError(
                f"block_mask blocks={(bm.block_m, bm.block_n)}: must equal the tiling "
                f"(block_m, block_n)={(br, bc)}"
            )
        vis &= bm.array
    return vis


def fully_masked_rows(workload: Workload) -> int:
    """Query rows that see no key (only with causal and Nq > Nk): their O is 0, L is -inf."""
    if not workload.causal:
        return 0
    return int(max(0, workload.nq - workload.nk))
