"""Layouts and head-to-slice maps shared by the algorithm modules."""

from __future__ import annotations

import numpy as np

from ..config import STAT_BYTES, Tiling, Workload
from ..traffic import TensorLayout

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


def per_query_head_slices(w: Workload, names) -> dict[str, np.ndarray]:
    """slice_of for launches with one program per (batch, query head) p = b*H + h: query-shaped
    tensors use slice p, kv-shaped tensors slice b*Hkv + h // group."""
    p = np.arange(w.bh, dtype=np.int64)
    b, h = p // w.heads, p % w.heads
    kv = b * w.hkv + h // w.group
    return {n: (kv if n in KV_LIKE else p) for n in names}


def per_kv_head_slices(w: Workload, names) -> dict[str, np.ndarray]:
    """slice_of for launches with one program per (batch, kv head) p = b*Hkv + g: kv-shaped
    tensors use slice p, query-shaped ones slice b*H + g*group (the first query head of the
    group; accesses add ``slice_offset`` for the others)."""
    p = np.arange(w.batch * w.hkv, dtype=np.int64)
    b, g = p // w.hkv, p % w.hkv
    q = b * w.heads + g * w.group
    return {n: (p if n in KV_LIKE else q) for n in names}


def block_rows(n: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """First row and row count of each of the ⌈n/block⌉ blocks (the last one ragged)."""
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


def require_tiling(tiling: Tiling | None, algo: str) -> Tiling:
    if tiling is None:
        raise ValueError(f"tiling=None: {algo} needs block sizes (block_m, block_n) or an SRAM size")
    return tiling
