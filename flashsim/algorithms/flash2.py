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

Backward: three launches, deterministic (no atomics), the split of the Triton tutorial and of
``kernels/flash2.py``, which these schedules describe transfer for transfer::

    flash2_bwd_preprocess, per (batch, query head), per query block i:
        load O_i, dO_i; write D_i = rowsum(dO_i ∘ O_i)             (Br float32)
    flash2_bwd_dkdv, per (batch, kv head), per key block j:
        load K_j, V_j; dK_j = dV_j = 0 (float32, on chip)
        for each query head g of the kv head's group, each query block i that sees j:
            load Q_i, dO_i, L_i, D_i
            P = exp(τ Q_i K_jᵀ - L_i); dV_j += Pᵀ dO_i
            dS = P ∘ (dO_i V_jᵀ - D_i); dK_j += τ dSᵀ Q_i
        write dK_j, dV_j                                           (the group's sum: GQA needs no reduction)
    flash2_bwd_dq, per (batch, query head), per query block i:
        load Q_i, dO_i, L_i, D_i; dQ_i = 0
        for each key block j that i sees: load K_j, V_j; dQ_i += τ dS K_j
        write dQ_i

P is recomputed from Q, K and L; nothing N x N touches HBM.  K and V are read once by dK/dV
and once per query block by dQ (as in the forward); Q, dO, L, D once per visible (i, j) pair
by dK/dV and once by dQ.  Dense, that is Θ(Nq·d + Tc·Nq·d + Tr·Nk·d) elements per head
(Tc = ⌈Nk/Bc⌉).  A key block that no query block sees is still loaded (K_j, V_j) and its
zero dK_j, dV_j written, as the kernel does: the outputs must be defined everywhere.
"""

from __future__ import annotations

import numpy as np

from ..blocks import attach
from ..config import Tiling, Workload, cdiv
from ..masking import check_window, visible_blocks, visible_cols, visible_counts, visible_rows, window_block_range
from ..traffic import Launch, Schedule, read, write
from ._common import (
    block_rows,
    check_blocks,
    classes,
    head_classes,
    layouts,
    paper_rule_plan,
    per_kv_head_slices,
    per_query_head_slices,
    require_tiling,
    strip_reads,
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
DESCRIPTION = ("FlashAttention-2: outer loop over query blocks; O and L written once; "
               "backward split into D, dK/dV (per key block) and dQ (per query block)")
OPTIONS: dict[str, tuple[object, str]] = {
    "window": (None, "sliding window LEFT,RIGHT: query row i (position pos = i + Nk - Nq) sees keys "
                     "pos - LEFT .. pos + RIGHT (RIGHT capped at 0 by --causal); key blocks wholly outside "
                     "are skipped"),
}

_FWD_TENSORS = ("Q", "K", "V", "O", "L")
_BWD_TENSORS = ("Q", "K", "V", "O", "L", "D", "dO", "dQ", "dK", "dV")


#: The loop-order stream (``accesses()``, for iter_transfers) lists each program's loop in at
#: most _CHUNKS chunks of at least _MIN_CHUNK outer iterations: within a chunk, each tensor's
#: transfers form one array, in loop order; only the interleaving of different tensors inside
#: a chunk is not kept (it changes no count).  The walker counts from the grouped ``counts()``
#: (each distinct transfer once, with its multiplicity): O(Tr + Tc) whatever the mask.
_CHUNKS = 16
_MIN_CHUNK = 32


def _chunks(n: int) -> list[np.ndarray]:
    size = max(_MIN_CHUNK, -(-n // _CHUNKS))
    return [np.arange(s, min(s + size, n), dtype=np.int64) for s in range(0, n, size)]


def _forward(w: Workload, t: Tiling, window=None) -> Schedule:
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)

    def accesses():
        # Query blocks i in chunks (see _CHUNKS): per chunk, Q_i of each i, then K_j and V_j of
        # each (i, visible j) pair with i outer, then O_i and L_i.
        for ii in _chunks(len(q0)):
            _, j_idx = np.nonzero(visible_rows(w, t, ii, window))
            yield read("Q", q0[ii], qn[ii])
            yield read("K", k0[j_idx], kn[j_idx])
            yield read("V", k0[j_idx], kn[j_idx])
            yield write("O", q0[ii], qn[ii])
            yield write("L", q0[ii], qn[ii])

    def counts():
        # Q_i, O_i, L_i once per query block; K_j, V_j once per query block that sees j.
        _, seen_by = visible_counts(w, t, window)
        qc = classes(q0, qn)
        kc = classes(k0, kn, seen_by)
        yield read("Q", qc[0], qc[1], repeat=qc[2])
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        yield write("O", qc[0], qc[1], repeat=qc[2])
        yield write("L", qc[0], qc[1], repeat=qc[2])

    launch = Launch("flash2_fwd", w.bh, per_query_head_slices(w, _FWD_TENSORS), accesses, counts)
    return Schedule("flash2", layouts(w, _FWD_TENSORS), [launch],
                    {"pass": "fwd", "block_m": t.block_m, "block_n": t.block_n, "window": window})


def _backward(w: Workload, t: Tiling, window=None) -> Schedule:
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)
    heads, per_head = head_classes(w.group)

    def preprocess():
        for ii in _chunks(len(q0)):  # per query block i: O_i, dO_i in (16-column strips), D_i out
            yield from strip_reads("O", q0[ii], qn[ii], w.d)
            yield from strip_reads("dO", q0[ii], qn[ii], w.d)
            yield write("D", q0[ii], qn[ii])

    def preprocess_counts():
        qc = classes(q0, qn)
        yield from strip_reads("O", qc[0], qc[1], w.d, repeat=qc[2])
        yield from strip_reads("dO", qc[0], qc[1], w.d, repeat=qc[2])
        yield write("D", qc[0], qc[1], repeat=qc[2])

    def dkdv():
        for jj in _chunks(len(k0)):
            # Loop order: key block j outer; then query head g of the group, then the query
            # blocks i that see j.  (j, g, i) triples in that order:
            sub = visible_cols(w, t, jj, window)  # (chunk, Tr): which i each j of the chunk loads
            j_idx, i_idx = np.nonzero(np.repeat(sub, w.group, axis=0))  # rows ordered (j, g)
            g_idx = j_idx % w.group
            yield read("K", k0[jj], kn[jj])
            yield read("V", k0[jj], kn[jj])
            for name in ("Q", "dO", "L", "D"):
                yield read(name, q0[i_idx], qn[i_idx], slice_offset=g_idx)
            yield write("dK", k0[jj], kn[jj])
            yield write("dV", k0[jj], kn[jj])

    def dkdv_counts():
        # K_j, V_j in and dK_j, dV_j out once per key block; Q_i, dO_i, L_i, D_i once per key
        # block that i sees, for each query head g of the group (slice offset g).
        sees, _ = visible_counts(w, t, window)
        kc = classes(k0, kn)
        qc = classes(q0, qn, sees)
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        for name in ("Q", "dO", "L", "D"):
            yield read(name, qc[0][None, :], qc[1][None, :], slice_offset=heads, repeat=per_head * qc[2][None, :])
        yield write("dK", kc[0], kc[1], repeat=kc[2])
        yield write("dV", kc[0], kc[1], repeat=kc[2])

    def dq():
        for ii in _chunks(len(q0)):
            for name in ("Q", "dO", "L", "D"):
                yield read(name, q0[ii], qn[ii])
            _, j_idx = np.nonzero(visible_rows(w, t, ii, window))  # visible key blocks of each i, i outer
            yield read("K", k0[j_idx], kn[j_idx])
            yield read("V", k0[j_idx], kn[j_idx])
            yield write("dQ", q0[ii], qn[ii])

    def dq_counts():
        _, seen_by = visible_counts(w, t, window)
        qc = classes(q0, qn)
        kc = classes(k0, kn, seen_by)
        for name in ("Q", "dO", "L", "D"):
            yield read(name, qc[0], qc[1], repeat=qc[2])
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        yield write("dQ", qc[0], qc[1], repeat=qc[2])

    qs = per_query_head_slices(w, _BWD_TENSORS)
    ks = per_kv_head_slices(w, _BWD_TENSORS)
    launches = [
        Launch("flash2_bwd_preprocess", w.bh, qs, preprocess, preprocess_counts),
        Launch("flash2_bwd_dkdv", w.batch * w.hkv, ks, dkdv, dkdv_counts),
        Launch("flash2_bwd_dq", w.bh, qs, dq, dq_counts),
    ]
    return Schedule("flash2", layouts(w, _BWD_TENSORS), launches,
                    {"pass": "bwd", "block_m": t.block_m, "block_n": t.block_n, "window": window})


def _kv_rows_read_fwd(w: Workload, t: Tiling, window=None) -> int:
    """Σ over query blocks i of the key rows loaded for block i, by formula.

    Dense: every block loads all Nk rows, so Tr·Nk.  Causal (bottom-right aligned): block i's
    last row r_i = min((i+1)·Br, Nq) - 1 sees the first c_i = clip(r_i + Nk - Nq + 1, 0, Nk)
    columns; the blocks covering them hold min(Nk, ⌈c_i/Bc⌉·Bc) rows.  Block-sparse: key block j
    is loaded by the nonzero rows of column j of the mask, so Σ_j nnz_j · rows(j).  Sliding
    window: block i sees the key blocks first_i .. limit_i - 1 (masking.window_block_range), which
    hold min(Nk, limit_i·Bc) - first_i·Bc rows (none when first_i = limit_i).
    """
    tr, tc = t.t_r(w.nq), t.t_c(w.nk)
    if window is not None and w.block_mask is None:
        check_blocks(w.nq, t.block_m, "seq_len_q")
        first, lim = window_block_range(w, t, np.arange(tr, dtype=np.int64), window)
        return int(np.where(lim > first, np.minimum(w.nk, lim * t.block_n) - first * t.block_n, 0).sum())
    if w.block_mask is None:
        if not w.causal:
            return tr * w.nk
        check_blocks(w.nq, t.block_m, "seq_len_q")
        r = np.minimum((np.arange(tr, dtype=np.int64) + 1) * t.block_m, w.nq) - 1
        c = np.clip(r + w.nk - w.nq + 1, 0, w.nk)
        return int(np.minimum(w.nk, -(-c // t.block_n) * t.block_n).sum())
    # With a block mask (and possibly causal), visibility is the mask and the causal rule.
    vis = visible_blocks(w, t, window)
    rows_j = np.minimum(t.block_n, w.nk - np.arange(tc, dtype=np.int64) * t.block_n)
    return int((vis.sum(axis=0) * rows_j).sum())


def _q_rows_read_dkdv(w: Workload, t: Tiling, window=None) -> int:
    """Σ over key blocks j of the query rows loaded for block j by one query head, by formula.

    Dense: every key block loads all Nq rows, so Tc·Nq.  Causal (bottom-right aligned): query
    block i sees key block j iff its last row r_i = min((i+1)·Br, Nq) - 1 satisfies
    j·Bc <= r_i + Nk - Nq, i.e. min((i+1)·Br, Nq) > τ_j with τ_j = j·Bc + Nq - Nk.  If τ_j >= Nq no
    block does; otherwise exactly the blocks i >= ⌊τ_j/Br⌋ (clipped at 0) do, and they hold
    Nq - clip(⌊τ_j/Br⌋·Br, 0, Nq) rows.  Block-sparse: query block i is loaded by the nonzero
    columns of row i of the mask, so Σ_i nnz_i · rows(i).  Sliding window: block i is loaded by
    the limit_i - first_i key blocks it sees, so Σ_i (limit_i - first_i) · rows(i).
    """
    tr, tc = t.t_r(w.nq), t.t_c(w.nk)
    if window is not None and w.block_mask is None:
        check_blocks(w.nq, t.block_m, "seq_len_q")
        first, lim = window_block_range(w, t, np.arange(tr, dtype=np.int64), window)
        rows_i = np.minimum(t.block_m, w.nq - np.arange(tr, dtype=np.int64) * t.block_m)
        return int(((lim - first) * rows_i).sum())
    if w.block_mask is None:
        if not w.causal:
            return tc * w.nq
        check_blocks(w.nk, t.block_n, "seq_len_k")
        tau = np.arange(tc, dtype=np.int64) * t.block_n + w.nq - w.nk
        first = np.clip((tau // t.block_m) * t.block_m, 0, w.nq)
        return int(np.where(tau >= w.nq, 0, w.nq - first).sum())
    vis = visible_blocks(w, t, window)
    rows_i = np.minimum(t.block_m, w.nq - np.arange(tr, dtype=np.int64) * t.block_m)
    return int((vis.sum(axis=1) * rows_i).sum())


def _window(options: dict):
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: flash2 takes only {sorted(OPTIONS)}")
    return check_window(options.get("window"))


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    t = require_tiling(tiling, "flash2")
    window = _window(options)
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: not modelled")
    bh, d = w.bh, w.d
    kv_rows = _kv_rows_read_fwd(w, t, window)
    if pass_ == "bwd":
        # dK/dV reads each (Q_i, dO_i, L_i, D_i) once per key block that i sees, for each of
        # the BH query heads; dQ reads them once more.  K, V: once by dK/dV (per kv head),
        # then as in the forward by dQ.
        q_rows = _q_rows_read_dkdv(w, t, window) + w.nq
        kv_once = w.batch * w.hkv * w.nk * d
        return {
            ("O", "read"): bh * w.nq * d,
            ("dO", "read"): bh * (w.nq + q_rows) * d,
            ("D", "write"): bh * w.nq,
            ("Q", "read"): bh * q_rows * d,
            ("L", "read"): bh * q_rows,
            ("D", "read"): bh * q_rows,
            ("K", "read"): kv_once + bh * kv_rows * d,
            ("V", "read"): kv_once + bh * kv_rows * d,
            ("dK", "write"): kv_once,
            ("dV", "write"): kv_once,
            ("dQ", "write"): bh * w.nq * d,
        }
    return {
        ("Q", "read"): bh * w.nq * d,
        ("K", "read"): bh * kv_rows * d,
        ("V", "read"): bh * kv_rows * d,
        ("O", "write"): bh * w.nq * d,
        ("L", "write"): bh * w.nq,
    }


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    t = require_tiling(tiling, "flash2")
    window = _window(options)
    if pass_ == "fwd":
        return attach(_forward(w, t, window), "flash2", w, t)
    if pass_ == "bwd":
        return attach(_backward(w, t, window), "flash2", w, t)
    raise ValueError(f"pass_={pass_!r}: not modelled")


__all__ = ["schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "PASSES", "NEEDS_TILING", "DESCRIPTION",
           "OPTIONS", "cdiv"]
