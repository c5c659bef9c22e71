"""FlashAttention-2 (Dao, 2023): outer loop over query blocks, logsumexp stored once.

Forward, per (batch, head) and query block i (one thread block each on the GPU)::

    load Q_i                                   (Br x d)
    for each visible key block j:              (causal and block-sparse skipping)
        load K_j, V_j                          (Bc x d each)
        S_ij = Q_i K_jᵀ; online softmax with m_i, ℓ_i kept on chip; acc += P̃_ij V_j
    write O_i = acc / ℓ_i, L_i = m_i + log ℓ_i   (Br x d, Br float32)

So Q and O cross HBM once, K and V once per query block: with Tr = ⌈Nq/Br⌉ blocks,
K and V reads are Tr·Nk·d each, and the whole forward moves Θ(Nq·d + Tr·Nk·d) elements.  With
the paper's rule Br = min(⌈M/4d⌉, d) that is Θ(N²d²/M) for M ≥ d² (Theorem 2's regime).
"""

from __future__ import annotations

import numpy as np

from ..config import Tiling, Workload, cdiv
from ..masking import visible_blocks
from ..traffic import Launch, Schedule, read, write
from ._common import block_rows, layouts, per_query_head_slices, require_tiling

PASSES = ("fwd",)
NEEDS_TILING = True
DESCRIPTION = "FlashAttention-2: outer loop over query blocks; O and L written once"
OPTIONS: dict[str, tuple[object, str]] = {}

_FWD_TENSORS = ("Q", "K", "V", "O", "L")


def _forward(w: Workload, t: Tiling) -> Schedule:
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)
    vis = visible_blocks(w, t)

    def accesses():
        for i in range(len(q0)):
            js = np.flatnonzero(vis[i])
            yield read("Q", q0[i], qn[i])
            # K_j then V_j for each visible j, in loop order: two arrays interleaved.
            rows0 = np.repeat(k0[js], 2)
            nrows = np.repeat(kn[js], 2)
            yield read("K", rows0[0::2], nrows[0::2])
            yield read("V", rows0[1::2], nrows[1::2])
            yield write("O", q0[i], qn[i])
            yield write("L", q0[i], qn[i])

    launch = Launch("flash2_fwd", w.bh, per_query_head_slices(w, _FWD_TENSORS), accesses)
    return Schedule("flash2", layouts(w, _FWD_TENSORS), [launch],
                    {"pass": "fwd", "block_m": t.block_m, "block_n": t.block_n})


def _kv_rows_read_fwd(w: Workload, t: Tiling) -> int:
    """Σ over query blocks i of the key rows loaded for block i, by formula.

    Dense: every block loads all Nk rows, so Tr·Nk.  Causal (bottom-right aligned): block i's
    last row r_i = min((i+1)·Br, Nq) - 1 sees the first c_i = clip(r_i + Nk - Nq + 1, 0, Nk)
    columns; the blocks covering them hold min(Nk, ⌈c_i/Bc⌉·Bc) rows.  Block-sparse: key block j
    is loaded by the nonzero rows of column j of the mask, so Σ_j nnz_j · rows(j).
    """
    tr, tc = t.t_r(w.nq), t.t_c(w.nk)
    if w.block_mask is None:
        if not w.causal:
            return tr * w.nk
        r = np.minimum((np.arange(tr, dtype=np.int64) + 1) * t.block_m, w.nq) - 1
        c = np.clip(r + w.nk - w.nq + 1, 0, w.nk)
        return int(np.minimum(w.nk, -(-c // t.block_n) * t.block_n).sum())
    # With a block mask (and possibly causal), visibility is the mask and the causal rule.
    vis = visible_blocks(w, t)
    rows_j = np.minimum(t.block_n, w.nk - np.arange(tc, dtype=np.int64) * t.block_n)
    return int((vis.sum(axis=0) * rows_j).sum())


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    t = require_tiling(tiling, "flash2")
    if options:
        raise ValueError(f"options={sorted(options)}: flash2 takes none")
    if pass_ != "fwd":
        raise ValueError(f"pass_={pass_!r}: not modelled")
    bh, d = w.bh, w.d
    kv_rows = _kv_rows_read_fwd(w, t)
    return {
        ("Q", "read"): bh * w.nq * d,
        ("K", "read"): bh * kv_rows * d,
        ("V", "read"): bh * kv_rows * d,
        ("O", "write"): bh * w.nq * d,
        ("L", "write"): bh * w.nq,
    }


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    t = require_tiling(tiling, "flash2")
    if options:
        raise ValueError(f"options={sorted(options)}: flash2 takes none")
    if pass_ == "fwd":
        return _forward(w, t)
    raise ValueError(f"pass_={pass_!r}: not modelled")


__all__ = ["schedule", "closed_form", "PASSES", "NEEDS_TILING", "DESCRIPTION", "OPTIONS", "cdiv"]
