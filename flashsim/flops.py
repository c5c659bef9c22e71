"""Floating-point operation counts of attention, per algorithm and pass.

A multiply-add counts as 2 FLOPs.  Counts are split into ``matmul`` (what tensor cores do: the
products QKᵀ, PV and their gradients) and ``nonmatmul`` (softmax and other elementwise work,
done on CUDA cores).

Which (i, j) entries are computed.  ``algo=None`` counts the attention maths itself: exactly
the visible (query, key) pairs E (Nq·Nk dense; the bottom-right causal triangle; the allowed
blocks cut by the causal rule — :func:`flashsim.bounds.visible_pairs`).  A tiled algorithm
(flash1, flash2) skips invisible blocks but computes a visible block whole, masked entries
included (a real kernel computes the full Br x Bc tile and then masks it), so it counts
E_blk = Σ over visible blocks of Br_i·Bc_j.  Standard attention and the small-cache algorithm
compute the dense Nq x Nk score matrix (E = Nq·Nk) whatever the mask.  flash2's sliding
``window`` option narrows each query block's visible key blocks to a range (masking.block_range).

Matmul FLOPs per computed entry, in units of 2·d (one length-d multiply-add):

=============  ===  ===========================================================================
algo           fwd  bwd
=============  ===  ===========================================================================
None           2    4: dV = PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀ Q (P stored, nothing recomputed)
standard       2    4: the same, P read back from HBM
flash1         2    5: S = QKᵀ recomputed once, then the four above (FlashAttention's Algorithm 4)
flash2         2    7: the dK/dV kernel recomputes S and does dV, dP, dK (4); the dQ kernel
                    recomputes S and dP again and does dQ (3) — flashsim/algorithms/flash2.py
smallcache     2    (forward only)
=============  ===  ===========================================================================

So the backward is 2× the forward's matmuls without recomputation, 2.5× for FlashAttention
(5 matmuls vs 2) and 3.5× for our two-kernel FlashAttention-2 backward.

Nonmatmul FLOPs: a per-entry constant (exp counted as 1 FLOP, as a compare or a multiply), plus
row-level terms:

* forward, per computed entry: 5 (scale by τ, running max, subtract the max, exp, add to the
  row sum); standard attention adds 1 (divide by the row sum; the flash algorithms divide O
  instead, below).  Per query row: d + 2 (O /= ℓ, L = m + log ℓ) for every algorithm but
  standard.
* backward, per computed entry and per recomputation of P: 3 (scale, subtract L, exp); per
  computation of dS = P ∘ (dP − D): 2; plus 1 for scaling dS by τ.  So None/standard 3,
  flash1 6, flash2 11 (P and dS computed in both kernels).  Per query row: 2·d for
  D = rowsum(dO ∘ O).

``decode`` (flashsim/algorithms/decode.py) computes, per program, its g·Nq query rows against
every key row it loads (rows before the window's start in the first block included), so
E = Hq·Nq·Σ_b (L_b - jf_b·Bc) entries over the whole batch, 2 matmul units and 5 nonmatmul
FLOPs each, plus d + 2 per query row per split program (O /= ℓ, L = m + log ℓ), and with
S > 1 splits the combine's S·(2d + 3) per output row (rescale and add each partial O, the
exps and the sum of the weights).

The online-softmax rescaling of the accumulator (d multiplies per row per key block) is not
counted; it is O(Nq·d·Tc), below the per-entry terms by a factor of about Bc/d.
"""

from __future__ import annotations

import numpy as np

from .algorithms._common import check_blocks
from .bounds import visible_pairs
from .config import Tiling, Workload
from .masking import causal_block_limit, check_window, visible_blocks, window_block_range

#: matmul units (2·d FLOPs each) per computed entry, by algorithm and pass
MATMULS_PER_ENTRY: dict[str | None, dict[str, int]] = {
    None: {"fwd": 2, "bwd": 4},
    "standard": {"fwd": 2, "bwd": 4},
    "flash1": {"fwd": 2, "bwd": 5},
    "flash2": {"fwd": 2, "bwd": 7},
    "smallcache": {"fwd": 2},
}
#: nonmatmul FLOPs per computed entry
NONMATMUL_PER_ENTRY: dict[str | None, dict[str, int]] = {
    None: {"fwd": 5, "bwd": 3},
    "standard": {"fwd": 6, "bwd": 3},
    "flash1": {"fwd": 5, "bwd": 6},
    "flash2": {"fwd": 5, "bwd": 11},
    "smallcache": {"fwd": 5},
}
_TILED = ("flash1", "flash2")
_DENSE = ("standard", "smallcache")


def block_entries(w: Workload, tiling: Tiling, window=None) -> int:
    """E_blk: entries of the visible (Br x Bc) blocks, masked ones inside them included (with a
    sliding ``window``, flash2's option: the blocks of each query block's window range)."""
    window = check_window(window)
    if window is not None and w.block_mask is None:
        check_blocks(w.nq, tiling.block_m, "seq_len_q")
        i = np.arange(tiling.t_r(w.nq), dtype=np.int64)
        rows = np.minimum(tiling.block_m, w.nq - i * tiling.block_m)
        first, lim = window_block_range(w, tiling, i, window)
        cols = np.where(lim > first, np.minimum(lim * tiling.block_n, w.nk) - first * tiling.block_n, 0)
        return int(np.dot(rows, cols))
    if window is not None:
        vis = visible_blocks(w, tiling, window)
    elif w.block_mask is None:
        # query block i sees a prefix of lim_i key blocks: min(lim_i·Bc, Nk) columns
        tr = tiling.t_r(w.nq)
        if not w.causal:
            return w.nq * w.nk
        check_blocks(w.nq, tiling.block_m, "seq_len_q")
        i = np.arange(tr, dtype=np.int64)
        rows = np.minimum(tiling.block_m, w.nq - i * tiling.block_m)
        cols = np.minimum(causal_block_limit(w, tiling, i) * tiling.block_n, w.nk)
        return int(np.dot(rows, cols))
    else:
        vis = visible_blocks(w, tiling)
    rows = np.minimum(tiling.block_m, w.nq - np.arange(vis.shape[0], dtype=np.int64) * tiling.block_m)
    cols = np.minimum(tiling.block_n, w.nk - np.arange(vis.shape[1], dtype=np.int64) * tiling.block_n)
    return int(rows @ vis.astype(np.int64) @ cols)


def computed_entries(w: Workload, algo: str | None = None, tiling: Tiling | None = None,
                     sram_elems: int | None = None, window=None) -> int:
    """Entries of S (per head) that ``algo`` computes; see the module docstring."""
    if algo is None:
        return visible_pairs(w)
    if algo in _DENSE:
        return w.nq * w.nk
    if algo in _TILED:
        from .api import resolve_tiling

        t = resolve_tiling(w, algo, tiling, sram_elems)
        return block_entries(w, t, window)
    raise ValueError(f"algo={algo!r}: no FLOP model; choose one of {[a for a in MATMULS_PER_ENTRY if a]}")


def _flops_as(w: Workload, algo, tiling, options):
    """(algorithm, tiling, options) whose FLOPs a kernel schedule has: its module's ``FLOPS_AS``
    algorithm with the module's forward blocks (``blocks``) as the tiling."""
    from .algorithms import ALL_ALGORITHMS, get_algorithm

    if not isinstance(algo, str) or algo not in ALL_ALGORITHMS:
        return algo, tiling, options
    mod = get_algorithm(algo)
    if getattr(mod, "FLOPS_AS", None) is None:
        return algo, tiling, options
    bm, bn = mod.blocks(w, tiling, **options)
    return mod.FLOPS_AS, (None if bm is None else Tiling(bm, bn)), {}


def flops(workload: Workload, pass_: str, algo: str | None = None, tiling: Tiling | None = None,
          sram_elems: int | None = None, **options) -> dict:
    """FLOPs of ``pass_`` ("fwd", "bwd" or "fwd+bwd") for the whole workload (all B·H heads).

    Returns {"matmul", "nonmatmul", "total", "entries"} (entries: computed score entries per
    head).  ``tiling``/``sram_elems`` matter only for tiled algorithms with masks.  ``options``
    are those of :func:`flashsim.api.simulate`: flash2's ``window`` and decode's options change
    the entries computed; the others (fusion, dropout, tiles) do not change the arithmetic and
    are ignored.
    """
    w = workload
    passes = pass_.split("+")
    if any(p not in ("fwd", "bwd") for p in passes):
        raise ValueError(f"pass_={pass_!r}: must be 'fwd', 'bwd' or 'fwd+bwd'")
    if algo == "decode":
        return _decode_flops(w, passes, tiling, sram_elems, options)
    if algo == "fast":  # FlashAttention-2's arithmetic on the variant's own tiles, pass by pass
        from .algorithms.fast import flop_tiling

        parts = [flops(w, p, "flash2", flop_tiling(w, p, options.get("kernel"), options.get("config"),
                                                   options.get("sms")))
                 for p in passes]
        out = {k: sum(x[k] for x in parts) for k in ("matmul", "nonmatmul", "total")}
        return out | {"entries": parts[0]["entries"]}
    if algo not in MATMULS_PER_ENTRY:  # a kernel's schedule (torch_flash, ...) counts as the algorithm it runs
        algo, tiling, options = _flops_as(w, algo, tiling, options)
    if algo not in MATMULS_PER_ENTRY:
        raise ValueError(f"algo={algo!r}: no FLOP model; choose one of {[a for a in MATMULS_PER_ENTRY if a]}")
    e = computed_entries(w, algo, tiling, sram_elems, options.get("window") if algo in _TILED else None)
    mm = nm = 0
    for p in passes:
        if p not in MATMULS_PER_ENTRY[algo]:
            raise ValueError(f"pass_={p!r}: algorithm {algo!r} has no {p} pass")
        mm += MATMULS_PER_ENTRY[algo][p] * 2 * w.d * e
        nm += NONMATMUL_PER_ENTRY[algo][p] * e
        if p == "fwd" and algo != "standard":
            nm += (w.d + 2) * w.nq
        if p == "bwd":
            nm += 2 * w.d * w.nq
    return {"matmul": w.bh * mm, "nonmatmul": w.bh * nm, "total": w.bh * (mm + nm), "entries": e}


def _decode_flops(w: Workload, passes: list[str], tiling: Tiling | None, sram_elems: int | None,
                  options: dict) -> dict:
    """FLOPs of the decode schedule (see the module docstring); forward only."""
    from .algorithms.decode import decode_plan
    from .api import resolve_tiling

    if passes != ["fwd"]:
        raise ValueError(f"pass_={'+'.join(passes)!r}: algorithm 'decode' has only a fwd pass")
    p = decode_plan(w, resolve_tiling(w, "decode", tiling, sram_elems), **options)
    e = p.hq * p.nq * int((p.lengths - p.jf * p.bc).sum())
    rows = p.batch * p.hq * p.nq
    mm = 2 * 2 * w.d * e
    nm = 5 * e + (w.d + 2) * rows * p.splits
    if p.splits > 1:
        nm += rows * p.splits * (2 * w.d + 3)
    return {"matmul": mm, "nonmatmul": nm, "total": mm + nm, "entries": e}


__all__ = ["flops", "computed_entries", "block_entries", "MATMULS_PER_ENTRY", "NONMATMUL_PER_ENTRY"]
