"""FlashAttention (Dao et al., 2022) in the paper's own loop order: Algorithms 1 and 4.

Forward (Algorithm 1), per (batch, query head) program::

    init (line 2):  write O = 0, ℓ = 0, m = -inf                      (whole tensors, HBM)
    for j in 0..Tc-1:                      outer loop over key/value blocks
        load K_j, V_j                       (Bc x d each, line 6)
        for each query block i visible to j:
            load Q_i, O_i, ℓ_i, m_i         (Br x d, Br x d, Br, Br; line 8)
            S_ij, m̃_ij, P̃_ij, ℓ̃_ij, m_i^new, ℓ_i^new on chip (lines 9-11)
            write O_i  (normalised by ℓ_i^new: line 12), ℓ_i, m_i (line 13)

The running output O_i is re-read and re-written, already normalised, once per key block: this
is where FlashAttention-1 spends its IO.  Counting elements per program in the dense case
(Nq queries, Nk keys, Tr = ⌈Nq/Br⌉, Tc = ⌈Nk/Bc⌉)::

    K, V reads         Nk·d each          (each K_j, V_j loaded once, line 6)
    Q reads            Tc·Nq·d            (all of Q once per j, line 8)
    O reads            Tc·Nq·d            (line 8)
    O writes           Nq·d + Tc·Nq·d     (init, then "re-write O Tc times", line 12)
    ℓ, m reads         Tc·Nq each         (line 8)
    ℓ, m writes        Nq + Tc·Nq each    (init, then line 13)

    total = 2·Nk·d + Nq·d + 2·Nq + Tc·Nq·(3d + 4)

With the paper's rule Bc = ⌈M/4d⌉, Tc = ⌈Nk/Bc⌉ ≈ 4·Nk·d/M, so the Tc·Nq·3d term is
≈ 12·Nq·Nk·d²/M: the Θ(N²d²M⁻¹) of Theorem 2 (exactly 4·N²d²/M per pass over Q, O read or O
write when M = 4·d·Bc and Bc divides N = Nq = Nk; tests/test_flash1_schedule.py asserts it).

Backward (Algorithm 4), per (batch, kv head) program::

    init (line 5):  write dQ = 0, dK = 0, dV = 0                        (whole tensors, HBM)
    for j in 0..Tc-1:
        load K_j, V_j;  dK̃_j = dṼ_j = 0 on chip                  (lines 7-8)
        for each query head h of the kv head's group, for each visible i:
            load Q_i, O_i, dO_i, dQ_i, ℓ_i, m_i                 (line 10)
            recompute P_ij; dṼ_j += P_ijᵀ dO_i; D_i = rowsum(dO_i ∘ O_i) on chip
            write dQ_i ← dQ_i + τ dS_ij K_j                      (line 20)
        write dK_j, dV_j                                         (line 23)

Line 5 of Algorithm 4 initialises dK and dV to zero in HBM as well as dQ; we model it.  The
init is what makes skipping safe: a key block j that no query block sees (block-sparse or
causal masking) is never visited, and its dK_j, dV_j keep the zeros written at init.

Choices (the kernel in kernels/flash1.py makes the same ones):

* **Skipping.**  Query blocks i that cannot see key block j (bottom-right causal, block mask;
  :func:`flashsim.masking.visible_blocks`) are skipped, as in Algorithm 5 (block-sparse).  A key
  block with no visible query block at all is skipped entirely: K_j, V_j are not loaded (and in
  the backward dK_j, dV_j are not written).  Algorithm 5 as printed loads K_j, V_j before testing
  the mask; that costs at most Nk·d more per tensor and changes no Θ.
* **Grouped-query attention.**  The forward runs one program per (batch, query head), which
  re-reads its kv head's K and V.  The backward runs one program per (batch, kv head) that
  loops over the group's query heads inside the j loop (``slice_offset``), so dK̃_j, dṼ_j sum
  the group's contributions on chip and are written once; K_j, V_j are loaded once per kv head.
* **O's precision.**  O lives in HBM in the input precision (the paper's IO model).  Option
  ``o_fp32=True`` stores it in float32 instead (the kernel offers this because re-rounding O to
  fp16 Tc times costs accuracy, see kernels/flash1.py); element counts are unchanged, bytes
  and sectors of O double for fp16.
* **Transfer order.**  The loop-order stream (``accesses()``, what
  :func:`flashsim.traffic.iter_transfers` replays) lists the key blocks j in a few chunks; within
  a chunk each tensor's transfers form one array in loop order (j outer, then query head, then
  i), not interleaved across tensors: the chunk's K_j, then its V_j, then its Q_i, ...  Counts
  are unaffected.  The walker counts from ``counts()`` instead: each distinct transfer once
  with its multiplicity (query block i's Q_i, O_i, ℓ_i, m_i once per key block it sees), which
  is O(Tr + Tc) work whatever the mask, fast at N = 2^20 with 1 x 1 blocks.

Block-sparse FlashAttention (Proposition 4): with a block mask of nnz nonzero blocks, the Q, O,
ℓ and m traffic is Σ over nonzero blocks (i, j) of the rows of Q_i, i.e. nnz·Br·d per tensor when
Br divides Nq: s·Tr·Tc·Br·d = s·Nq·Tc·d = Θ(s·N²d²/M), plus Θ(Nd) for K, V and the O init.
"""

from __future__ import annotations

import numpy as np

from ..blocks import attach
from ..config import STAT_BYTES, Tiling, Workload
from ..masking import visible_blocks, visible_cols, visible_counts
from ..traffic import Launch, Schedule, TensorLayout, read, write
from ._common import (
    block_rows,
    check_blocks,
    chunks,
    classes,
    head_classes,
    layouts,
    paper_rule_plan,
    per_kv_head_slices,
    per_query_head_slices,
    require_tiling,
    tiling_blocks,
)

PASSES = ("fwd", "bwd")
NEEDS_TILING = True
#: The M rule: a given Br x Bc tiling, else the paper's Bc = ⌈M/4d⌉, Br = min(Bc, d).
plan = paper_rule_plan
#: A record's block_m, block_n: the tiling's.
blocks = tiling_blocks
#: How the command line shows the tiling.
TILING_TEXT = "Br = {block_m}, Bc = {block_n}"
DESCRIPTION = "FlashAttention (v1): outer loop over K/V blocks; O, ℓ, m re-read and re-written per block"
OPTIONS: dict[str, tuple[object, str]] = {
    "o_fp32": (False, "store O in float32 in HBM instead of the input precision (bytes only)"),
}

_FWD_TENSORS = ("Q", "K", "V", "O", "l", "m")
_BWD_TENSORS = ("Q", "K", "V", "O", "dO", "l", "m", "dQ", "dK", "dV")


def _check_options(options: dict) -> bool:
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"options={sorted(unknown)}: flash1 takes only {sorted(OPTIONS)}")
    o_fp32 = options.get("o_fp32", False)
    if not isinstance(o_fp32, (bool, np.bool_)):
        raise ValueError(f"o_fp32={o_fp32!r}: must be a bool")
    return bool(o_fp32)


def _layouts(w: Workload, names, o_fp32: bool) -> dict[str, TensorLayout]:
    out = layouts(w, names)
    if o_fp32 and "O" in out:
        out["O"] = TensorLayout("O", w.nq, w.d, STAT_BYTES, w.bh)
    return out


def _forward(w: Workload, t: Tiling, o_fp32: bool) -> Schedule:
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)

    def init():
        yield write("O", 0, w.nq)
        yield write("l", 0, w.nq)
        yield write("m", 0, w.nq)

    def main():
        # Every visible (i, j) pair in loop order: j outer, i inner, a chunk of j at a time.
        for jj in chunks(len(k0)):
            sub = visible_cols(w, t, jj)
            j_idx, ii = np.nonzero(sub)
            kv_j = jj[sub.any(axis=1)]
            yield read("K", k0[kv_j], kn[kv_j])
            yield read("V", k0[kv_j], kn[kv_j])
            r0, nr = q0[ii], qn[ii]
            for name in ("Q", "O", "l", "m"):
                yield read(name, r0, nr)
            for name in ("O", "l", "m"):
                yield write(name, r0, nr)

    def main_counts():
        # K_j, V_j once per key block some query block sees; Q_i, O_i, ℓ_i, m_i read and
        # O_i, ℓ_i, m_i written once per key block that i sees.
        sees, seen_by = visible_counts(w, t)
        kc = classes(k0, kn, seen_by > 0)
        qc = classes(q0, qn, sees)
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        for name in ("Q", "O", "l", "m"):
            yield read(name, qc[0], qc[1], repeat=qc[2])
        for name in ("O", "l", "m"):
            yield write(name, qc[0], qc[1], repeat=qc[2])

    slices = per_query_head_slices(w, _FWD_TENSORS)
    launches = [Launch("flash1_fwd_init", w.bh, slices, init), Launch("flash1_fwd", w.bh, slices, main, main_counts)]
    return Schedule("flash1", _layouts(w, _FWD_TENSORS, o_fp32), launches,
                    {"pass": "fwd", "block_m": t.block_m, "block_n": t.block_n, "o_fp32": o_fp32})


def _backward(w: Workload, t: Tiling, o_fp32: bool) -> Schedule:
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)
    g = w.group
    heads = np.arange(g, dtype=np.int64)

    def init():
        yield write("dQ", 0, w.nq, slice_offset=heads)
        yield write("dK", 0, w.nk)
        yield write("dV", 0, w.nk)

    def main():
        # Visible (j, h, i) triples in loop order: key block j, then query head h, then block i,
        # a chunk of j at a time.
        for jj in chunks(len(k0)):
            sub = visible_cols(w, t, jj)
            rows, qi = np.nonzero(np.repeat(sub, g, axis=0))  # rows ordered (j, h)
            soff = rows % g
            kv_j = jj[sub.any(axis=1)]
            yield read("K", k0[kv_j], kn[kv_j])
            yield read("V", k0[kv_j], kn[kv_j])
            r0, nr = q0[qi], qn[qi]
            for name in ("Q", "O", "dO", "dQ", "l", "m"):
                yield read(name, r0, nr, slice_offset=soff)
            yield write("dQ", r0, nr, slice_offset=soff)
            yield write("dK", k0[kv_j], kn[kv_j])
            yield write("dV", k0[kv_j], kn[kv_j])

    def main_counts():
        sees, seen_by = visible_counts(w, t)
        kc = classes(k0, kn, seen_by > 0)
        qc = classes(q0, qn, sees)
        hs, per_head = head_classes(g)
        r0, nr, rep = qc[0][None, :], qc[1][None, :], per_head * qc[2][None, :]
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        for name in ("Q", "O", "dO", "dQ", "l", "m"):
            yield read(name, r0, nr, slice_offset=hs, repeat=rep)
        yield write("dQ", r0, nr, slice_offset=hs, repeat=rep)
        yield write("dK", kc[0], kc[1], repeat=kc[2])
        yield write("dV", kc[0], kc[1], repeat=kc[2])

    slices = per_kv_head_slices(w, _BWD_TENSORS)
    progs = w.batch * w.hkv
    launches = [Launch("flash1_bwd_init", progs, slices, init),
                Launch("flash1_bwd", progs, slices, main, main_counts)]
    return Schedule("flash1", _layouts(w, _BWD_TENSORS, o_fp32), launches,
                    {"pass": "bwd", "block_m": t.block_m, "block_n": t.block_n, "o_fp32": o_fp32})


def visit_counts(w: Workload, t: Tiling) -> tuple[int, int]:
    """(query rows visited, key rows loaded) per head, by formula.

    ``q_rows`` = Σ over visible blocks (i, j) of the rows of Q_i: how many query rows the inner
    loop touches over the whole j loop.  ``kv_rows`` = Σ over key blocks j with at least one
    visible query block of the rows of K_j.

    * Dense: every block is visible: q_rows = Tc·Nq, kv_rows = Nk.
    * Causal (bottom-right): query block i's last row r_i = min((i+1)·Br, Nq) - 1 sees the first
      c_i = clip(r_i + Nk - Nq + 1, 0, Nk) keys, which lie in ⌈c_i/Bc⌉ key blocks; the earlier
      rows of block i see fewer keys but the block is visible if its last row sees any, so
      q_rows = Σ_i rows(i)·⌈c_i/Bc⌉.  The last query block (r = Nq - 1) sees all Nk keys, so
      every key block has a visible query block: kv_rows = Nk.
    * Block mask (with or without causal): visibility is the mask and the causal rule, so
      q_rows = Σ_i rows(i)·(row sum i) and kv_rows = Σ_j rows(j)·[column sum j > 0].
    """
    br, bc = t.block_m, t.block_n
    tr, tc = t.t_r(w.nq), t.t_c(w.nk)
    if w.block_mask is None and not w.causal:
        return tc * w.nq, w.nk
    check_blocks(w.nq, br, "seq_len_q")
    rows_i = np.minimum(br, w.nq - np.arange(tr, dtype=np.int64) * br)
    rows_j = np.minimum(bc, w.nk - np.arange(tc, dtype=np.int64) * bc)
    if w.block_mask is None:
        last = np.minimum((np.arange(tr, dtype=np.int64) + 1) * br, w.nq) - 1
        c = np.clip(last + w.nk - w.nq + 1, 0, w.nk)
        blocks_i = -(-c // bc)
        c_max = int(c.max())  # = Nk: the last query row sees every key
        return int((rows_i * blocks_i).sum()), int(min(w.nk, -(-c_max // bc) * bc))
    vis = visible_blocks(w, t)
    return int((rows_i * vis.sum(axis=1)).sum()), int((rows_j * vis.any(axis=0)).sum())


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    t = require_tiling(tiling, "flash1")
    _check_options(options)
    q_rows, kv_rows = visit_counts(w, t)
    d, bh, nq = w.d, w.bh, w.nq
    if pass_ == "fwd":
        # programs: one per (batch, query head); each reads its kv head's K, V
        return {
            ("K", "read"): bh * kv_rows * d,
            ("V", "read"): bh * kv_rows * d,
            ("Q", "read"): bh * q_rows * d,
            ("O", "read"): bh * q_rows * d,
            ("O", "write"): bh * (nq + q_rows) * d,
            ("l", "read"): bh * q_rows,
            ("m", "read"): bh * q_rows,
            ("l", "write"): bh * (nq + q_rows),
            ("m", "write"): bh * (nq + q_rows),
        }
    if pass_ == "bwd":
        # programs: one per (batch, kv head), looping over the group's query heads
        bkv = w.batch * w.hkv
        return {
            ("K", "read"): bkv * kv_rows * d,
            ("V", "read"): bkv * kv_rows * d,
            ("Q", "read"): bh * q_rows * d,
            ("O", "read"): bh * q_rows * d,
            ("dO", "read"): bh * q_rows * d,
            ("dQ", "read"): bh * q_rows * d,
            ("dQ", "write"): bh * (nq + q_rows) * d,
            ("l", "read"): bh * q_rows,
            ("m", "read"): bh * q_rows,
            ("dK", "write"): bkv * (w.nk + kv_rows) * d,
            ("dV", "write"): bkv * (w.nk + kv_rows) * d,
        }
    raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    t = require_tiling(tiling, "flash1")
    o_fp32 = _check_options(options)
    if pass_ == "fwd":
        return attach(_forward(w, t, o_fp32), "flash1", w, t)
    if pass_ == "bwd":
        return attach(_backward(w, t, o_fp32), "flash1", w, t)
    raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")


__all__ = ["schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "visit_counts", "PASSES", "NEEDS_TILING",
           "DESCRIPTION", "OPTIONS"]
