"""Standard attention (Algorithm 0 of the FlashAttention paper): S and P materialised in HBM.

Forward, per (batch, query head), as a sequence of kernel launches::

    S = Q Kᵀ                      tiled GEMM, writes the Nq x Nk matrix S
    [elementwise passes]          scale by τ, mask, softmax, dropout: see ``fuse``
    O = P V                       tiled GEMM, reads P

Backward (the paper's Algorithm 3, Appendix B.3, plus the elementwise passes)::

    dV = Pᵀ dO;  dP = dO Vᵀ;  dS = P ∘ (dP − rowsum(dP ∘ P));  dQ = dS K;  dK = dSᵀ Q

The paper's count.  Algorithm 0 loads Q, K, writes S, reads S, writes P, reads P and V and
writes O: with Nq = Nk = N, 4Nd + 4N² elements per head, Θ(Nd + N²) (Theorem 2).  Algorithm 3
reads P and dO, writes dV; reads dO and V, writes dP; reads P and dP, writes dS; reads dS and
K, writes dQ; reads dS and Q, writes dK: 7N² + 8Nd per head.  The paper treats each matmul as
reading its operands once; this schedule reproduces both counts exactly with ``fuse="softmax"``,
no dropout and ``gemm_block >= max(Nq, Nk)`` (tests/test_standard_schedule.py checks it).

Tiled matmuls (``gemm_block`` = b, the output tile BM = BN = b, the whole reduction per tile).
With Tr = ⌈Nq/b⌉ and Tc = ⌈Nk/b⌉:

* S = Q Kᵀ and dP = dO Vᵀ (output Nq x Nk): each b x b output tile loads its b rows of the
  left operand and its b rows of the right one (whole head dim d), so Q (dO) is read Tc times
  and K (V) Tr times, and the output is written once;
* O = P V and dQ = dS K (output Nq x d): each block of b output rows reads its b rows of P (dS)
  once and all of V (K), Nk x d, once: P read once, V read Tr times;
* dV = Pᵀ dO and dK = dSᵀ Q (output Nk x d, one program per kv head): each block of b output
  rows reads the b columns of P (dS) over all Nq rows and all of dO (Q), for every query head of
  the group: P read once, dO read Tc times.

Grouped-query attention.  K and V are read by each query head (one program per query head in
the forward, dP and dQ).  dK and dV are *accumulated*, not reduced afterwards: the GEMM for kv
head g takes the group's dS (and P) stacked along the reduction dimension, dK_g = Σ_h dS_hᵀ Q_h,
a single GEMM with reduction length group·Nq, as code that reshapes Q to (B, Hkv, group·Nq, d)
does.  So dK and dV are written once per kv head and no per-query-head dK, dV or reduction
launch exists.  (PyTorch's ``repeat_interleave`` of K and V would instead write expanded copies
and sum them in the backward; that costs 2·group·Nk·d more per kv head and tensor.)

Masks.  Standard attention computes the full S: causal and block masks skip no work; they cost
an elementwise pass (``fuse="none"``) or nothing (fused into the softmax).  The mask itself is
computed from indices (causal) or a tiny block table, so no N x N mask tensor is read.

``fuse`` (which elementwise passes are separate kernels; each separate pass reads and writes the
whole N x N matrix of every head):

* ``"none"``: the eager code of nanoGPT / minGPT's non-flash path, ``att = (q @ k.T) * scale;
  att = att.masked_fill(mask, -inf); att = softmax(att); att = dropout(att); y = att @ v``:
  scale, mask (if causal or block mask), softmax and dropout (if > 0) are four kernels.  Their
  autograd backward runs the mirror passes: dropout backward, softmax backward, mask backward
  (``masked_fill`` of the gradient) and scale backward.
* ``"softmax"`` (the default; the paper's Algorithm 0): scale, mask and softmax in one kernel
  that reads S and writes P, as Megatron-LM's ``FusedScaleMaskSoftmax`` (``scaled_masked_softmax``
  CUDA kernel, forward and backward) does; dropout stays its own kernel (Megatron's
  ``attention_dropout``).
* ``"all"``: additionally the scale folded into the QKᵀ GEMM's epilogue (cuBLAS ``alpha = τ``,
  i.e. ``torch.baddbmm(..., alpha=τ)`` as Megatron-LM and BLOOM do) and dropout fused with the
  softmax: one kernel reads S and writes P and the 1-byte keep mask Z; the P·V and Pᵀ·dO GEMMs
  apply Z ∘ P/(1 − p) while loading P (so the dropped matrix is never stored), and the backward's
  dropout, softmax and scale are one kernel reading P, dP and Z.  This is the fewest N x N passes
  any implementation that materialises S and P can make.

Dropout (``dropout`` = p > 0).  PyTorch's ``native_dropout`` writes the dropped matrix Pd and a
bool mask Z; the softmax output P is kept too, because the softmax backward needs it (dropped
entries of P cannot be recovered from Pd).  So unfused dropout reads P and writes Pd and Z; the
P·V and Pᵀ·dO GEMMs read Pd; the dropout backward reads dP (the gradient of Pd) and Z and writes
dP (the gradient of P, counted against the same tensor).  Z has 1-byte (bool) elements.
"""

from __future__ import annotations

import numpy as np

from ..blocks import attach
from ..config import Tiling, Workload, as_size, cdiv
from ..traffic import Access, Launch, Schedule, TensorLayout, read, write
from ._common import block_rows, classes, head_classes, layouts, per_kv_head_slices, per_query_head_slices

PASSES = ("fwd", "bwd")
NEEDS_TILING = False
#: How the command line shows the tiling.
TILING_TEXT = "not tiled"
DESCRIPTION = "standard attention (Algorithm 0): S and P materialised in HBM, tiled GEMMs, elementwise passes"
FUSE_CHOICES = ("none", "softmax", "all")
OPTIONS: dict[str, tuple[object, str]] = {
    "fuse": ("softmax", "elementwise passes fused: 'none' (scale, mask, softmax, dropout each a kernel, as eager "
                        "nanoGPT), 'softmax' (scale+mask+softmax one kernel, as Megatron's FusedScaleMaskSoftmax; "
                        "the paper's Algorithm 0), 'all' (scale in the QKᵀ GEMM epilogue, dropout fused with softmax)"),
    "dropout": (0.0, "dropout probability p; if > 0 the forward writes the 1-byte keep mask Z, the backward reads it"),
    "gemm_block": (128, "output tile BM = BN of the tiled GEMMs (whole head dim per tile); >= max(Nq, Nk) gives the "
                        "paper's idealised count with every operand read once"),
}



def check_sram(w: Workload, sram_elems) -> None:
    """The least M it runs at: 2d elements.  Its count does not depend on M, but its tiled GEMMs
    load whole rows of their operands (the head dim in one tile): even a 1 x 1 output tile holds
    a row of each operand (S = QKᵀ: a row of Q and of K; O = P·V: a row of V and the row of O it
    accumulates).  ValueError naming ``sram_elems`` below it."""
    m = as_size("sram_elems", sram_elems)
    if m < 2 * w.d:
        raise ValueError(f"sram_elems={m}: standard attention needs M >= 2*d = {2 * w.d} elements (its tiled "
                         "GEMMs hold at least one row of each operand, the whole head dim, on chip)")


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None, **options) -> tuple[None, dict]:
    """The M rule: no block sizes (its count does not depend on M), but M >= 2d (:func:`check_sram`)."""
    if sram_elems is not None:
        check_sram(w, sram_elems)
    return None, dict(options)


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[None, None]:
    """A record's block_m, block_n: none (not tiled)."""
    return None, None


_GEMM_S = ("Q", "K", "S")


def _options(options: dict) -> tuple[str, float, int]:
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"options={sorted(unknown)}: standard takes only {sorted(OPTIONS)}")
    fuse = options.get("fuse", OPTIONS["fuse"][0])
    dropout = options.get("dropout", OPTIONS["dropout"][0])
    gb = options.get("gemm_block", OPTIONS["gemm_block"][0])
    if not isinstance(fuse, str) or fuse not in FUSE_CHOICES:
        raise ValueError(f"fuse={fuse!r}: must be one of {list(FUSE_CHOICES)}")
    if (isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, (int, float, np.integer, np.floating))
            or not 0.0 <= dropout < 1.0):
        raise ValueError(f"dropout={dropout!r}: must be a number in [0, 1)")
    return fuse, float(dropout), as_size("gemm_block", gb)


def _tensors(w: Workload, names: list[str]) -> dict[str, TensorLayout]:
    """Layouts; Z (bool keep mask) and Pd (dropped P) are score-shaped, built here."""
    std = [n for n in names if n not in ("Z", "Pd")]
    out = layouts(w, std)
    if "Pd" in names:
        out["Pd"] = TensorLayout("Pd", w.nq, w.nk, w.elem_bytes, w.bh)
    if "Z" in names:
        out["Z"] = TensorLayout("Z", w.nq, w.nk, 1, w.bh)
    return out


# --------------------------------------------------------------------------------------------
# Launch builders.  Every launch runs one program per (batch, query head) unless it reduces over
# a GQA group (dV, dK: one per (batch, kv head)); a program loops over its output tiles.


#: In the loop-order stream (``accesses()``, for iter_transfers) a program's outer loop is listed
#: in at most _CHUNKS chunks of at least _MIN_CHUNK iterations; within a chunk each tensor's
#: transfers form one array in loop order (only the interleaving of different tensors inside a
#: chunk is lost, which changes no count).  The walker counts from the grouped ``counts()``: the
#: GEMM output tiles as (row class) x (column class), O(Tr + Tc) whatever gemm_block is.
_CHUNKS = 16
_MIN_CHUNK = 32


def _chunks(n: int) -> list[np.ndarray]:
    size = max(_MIN_CHUNK, cdiv(n, _CHUNKS))
    return [np.arange(s, min(s + size, n), dtype=np.int64) for s in range(0, n, size)]


def _gemm_abt(w: Workload, b: int, name: str, a: str, bt: str, c: str) -> Launch:
    """C = A Bᵀ (Nq x Nk) from A (Nq x d, per query head) and B (Nk x d, per kv head): for each
    output tile (i, j), in row-major order, load A_i and B_j, write C_ij."""
    r0, rn = block_rows(w.nq, b)
    c0, cn = block_rows(w.nk, b)
    tc = len(c0)

    def accesses():
        for ii in _chunks(len(r0)):
            i_idx = np.repeat(ii, tc)  # (i, j) pairs of the chunk, j inner
            j_idx = np.tile(np.arange(tc), len(ii))
            yield read(a, r0[i_idx], rn[i_idx])  # A_i once per output tile
            yield read(bt, c0[j_idx], cn[j_idx])
            yield write(c, r0[i_idx], rn[i_idx], c0[j_idx], cn[j_idx])

    def counts():
        # A_i once per output tile of row i (Tc times), B_j Tr times, each C_ij once: the tiles
        # grouped into (row class) x (column class).
        rc, cc = classes(r0, rn), classes(c0, cn)
        yield read(a, rc[0], rc[1], repeat=rc[2] * tc)
        yield read(bt, cc[0], cc[1], repeat=cc[2] * len(r0))
        yield write(c, rc[0][:, None], rc[1][:, None], cc[0][None, :], cc[1][None, :],
                    repeat=rc[2][:, None] * cc[2][None, :])

    return Launch(name, w.bh, per_query_head_slices(w, (a, bt, c)), accesses, counts)


def _gemm_rows(w: Workload, b: int, name: str, a: list[str], bfull: str, c: str) -> Launch:
    """C = A B (Nq x d) from A (Nq x Nk, per query head; several tensors when a prologue combines
    them, e.g. P and Z) and B (Nk x d, per kv head): for each block of b output rows, read those
    rows of A once and all of B once, write C_i."""
    r0, rn = block_rows(w.nq, b)

    def accesses():
        for ii in _chunks(len(r0)):
            for t in a:
                yield read(t, r0[ii], rn[ii])
            yield read(bfull, 0 * ii, w.nk)  # all of B, once per output block
            yield write(c, r0[ii], rn[ii])

    def counts():
        rc = classes(r0, rn)
        for t in a:
            yield read(t, rc[0], rc[1], repeat=rc[2])
        yield read(bfull, 0, w.nk, repeat=len(r0))
        yield write(c, rc[0], rc[1], repeat=rc[2])

    return Launch(name, w.bh, per_query_head_slices(w, (*a, bfull, c)), accesses, counts)


def _gemm_cols_group(w: Workload, b: int, name: str, a: list[str], bq: str, c: str) -> Launch:
    """C = Σ_h A_hᵀ B_h (Nk x d, one program per kv head) from A_h (Nq x Nk) and B_h (Nq x d) of
    each query head h of the group: for each block of b output rows (key block j) and each h,
    read the b columns of A_h over all Nq rows and all of B_h; write C_j once."""
    c0, cn = block_rows(w.nk, b)

    def accesses():
        for jj in _chunks(len(c0)):
            j_idx = np.repeat(jj, w.group)  # (j, h) pairs of the chunk, h inner
            h_idx = np.tile(np.arange(w.group, dtype=np.int64), len(jj))
            for t in a:
                yield read(t, 0, w.nq, c0[j_idx], cn[j_idx], slice_offset=h_idx)
            yield read(bq, 0, w.nq, slice_offset=h_idx)
            yield write(c, c0[jj], cn[jj])

    def counts():
        cc = classes(c0, cn)
        hs, per_head = head_classes(w.group)
        for t in a:
            yield read(t, 0, w.nq, cc[0][None, :], cc[1][None, :], slice_offset=hs, repeat=per_head * cc[2][None, :])
        yield read(bq, 0, w.nq, slice_offset=hs, repeat=per_head * len(c0))
        yield write(c, cc[0], cc[1], repeat=cc[2])

    return Launch(name, w.batch * w.hkv, per_kv_head_slices(w, (*a, bq, c)), accesses, counts)


def _rowwise(w: Workload, name: str, reads: list[str], writes: list[str]) -> Launch:
    """An elementwise or row-wise kernel over the N x N matrices: each program reads its whole
    Nq x Nk slice of every input and writes its whole slice of every output."""
    acc: list[Access] = [read(t, 0, w.nq) for t in reads] + [write(t, 0, w.nq) for t in writes]
    return Launch(name, w.bh, per_query_head_slices(w, (*reads, *writes)), lambda: acc)


def _forward(w: Workload, fuse: str, p_drop: float, b: int) -> Schedule:
    masked = w.causal or w.block_mask is not None
    drop = p_drop > 0
    L = [_gemm_abt(w, b, "gemm_qk", "Q", "K", "S")]
    if fuse == "none":
        L.append(_rowwise(w, "scale", ["S"], ["S"]))
        if masked:
            L.append(_rowwise(w, "mask", ["S"], ["S"]))
        L.append(_rowwise(w, "softmax", ["S"], ["P"]))
    elif fuse == "softmax":
        L.append(_rowwise(w, "scale_mask_softmax", ["S"], ["P"]))
    else:
        L.append(_rowwise(w, "mask_softmax_dropout" if drop else "mask_softmax", ["S"], ["P", "Z"] if drop else ["P"]))
    if drop and fuse != "all":
        L.append(_rowwise(w, "dropout", ["P"], ["Pd", "Z"]))
        pv_in = ["Pd"]
    else:
        pv_in = ["P", "Z"] if drop else ["P"]
    L.append(_gemm_rows(w, b, "gemm_pv", pv_in, "V", "O"))
    names = ["Q", "K", "V", "O", "S", "P"] + (["Pd"] if drop and fuse != "all" else []) + (["Z"] if drop else [])
    return Schedule("standard", _tensors(w, names), L,
                    {"pass": "fwd", "fuse": fuse, "dropout": p_drop, "gemm_block": b})


def _backward(w: Workload, fuse: str, p_drop: float, b: int) -> Schedule:
    masked = w.causal or w.block_mask is not None
    drop = p_drop > 0
    if drop and fuse != "all":
        dv_in = ["Pd"]
    else:
        dv_in = ["P", "Z"] if drop else ["P"]
    L = [_gemm_cols_group(w, b, "gemm_dv", dv_in, "dO", "dV"),
         _gemm_abt(w, b, "gemm_dp", "dO", "V", "dP")]
    if drop and fuse != "all":
        L.append(_rowwise(w, "dropout_bwd", ["dP", "Z"], ["dP"]))
    if fuse == "none":
        L.append(_rowwise(w, "softmax_bwd", ["P", "dP"], ["dS"]))
        if masked:
            L.append(_rowwise(w, "mask_bwd", ["dS"], ["dS"]))
        L.append(_rowwise(w, "scale_bwd", ["dS"], ["dS"]))
    elif fuse == "softmax":
        L.append(_rowwise(w, "scale_mask_softmax_bwd", ["P", "dP"], ["dS"]))
    else:
        L.append(_rowwise(w, "dropout_softmax_scale_bwd" if drop else "softmax_scale_bwd",
                          ["P", "dP", "Z"] if drop else ["P", "dP"], ["dS"]))
    L.append(_gemm_rows(w, b, "gemm_dq", ["dS"], "K", "dQ"))
    L.append(_gemm_cols_group(w, b, "gemm_dk", ["dS"], "Q", "dK"))
    names = ["Q", "K", "V", "dO", "dQ", "dK", "dV", "P", "dP", "dS"]
    names += (["Pd"] if drop and fuse != "all" else []) + (["Z"] if drop else [])
    return Schedule("standard", _tensors(w, names), L,
                    {"pass": "bwd", "fuse": fuse, "dropout": p_drop, "gemm_block": b})


# --------------------------------------------------------------------------------------------
# Closed forms


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    """Element counts by formula.  With E = B·H·Nq·Nk (one N x N matrix over all heads),
    Tr = ⌈Nq/b⌉, Tc = ⌈Nk/b⌉, b = gemm_block:

    forward: Q read Tc·B·H·Nq·d, K and V read Tr·B·H·Nk·d each, O written B·H·Nq·d; S written
    and read once per N x N pass that touches it (1 + [none]·(1 + [masked]) of each); P written
    once and read once by P·V (plus once by unfused dropout, which writes Pd and Z, E each);
    fused dropout writes Z and P·V reads Z.

    backward: dO read 2·Tc·B·H·Nq·d (dV and dP), V and K read Tr·B·H·Nk·d, Q read
    Tc·B·H·Nq·d, dQ written B·H·Nq·d, dK and dV written B·Hkv·Nk·d; P read by Pᵀ dO (Pd if
    unfused dropout) and by the softmax backward; dP written once and read once (twice each
    with unfused dropout); dS written once and read by dQ and dK, plus one read and write per
    unfused mask and scale pass; Z read by each pass that applies dropout.
    """
    fuse, p_drop, b = _options(options)
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")
    masked = w.causal or w.block_mask is not None
    drop = p_drop > 0
    tr, tc = cdiv(w.nq, b), cdiv(w.nk, b)
    e = w.bh * w.nq * w.nk
    qd = w.bh * w.nq * w.d
    kd = w.bh * w.nk * w.d  # K or V rows as read by every query head
    kvd = w.batch * w.hkv * w.nk * w.d  # dK or dV as stored
    out: dict[tuple[str, str], int] = {}

    def add(t: str, dr: str, n: int) -> None:
        out[(t, dr)] = out.get((t, dr), 0) + int(n)

    unfused_drop = drop and fuse != "all"
    if pass_ == "fwd":
        add("Q", "read", tc * qd)
        add("K", "read", tr * kd)
        add("S", "write", e)
        passes_on_s = 1 + (fuse == "none") * (1 + masked)  # softmax, and scale/mask when unfused
        add("S", "read", passes_on_s * e)
        add("S", "write", (passes_on_s - 1) * e)
        add("P", "write", e)
        if unfused_drop:
            add("P", "read", e)
            add("Pd", "write", e)
            add("Z", "write", e)
            add("Pd", "read", e)
        else:
            add("P", "read", e)
            if drop:
                add("Z", "write", e)
                add("Z", "read", e)
        add("V", "read", tr * kd)
        add("O", "write", qd)
    else:
        # dV = Pᵀ dO (Pd with unfused dropout; P and Z with fused dropout)
        add("Pd" if unfused_drop else "P", "read", e)
        if drop and not unfused_drop:
            add("Z", "read", e)
        add("dO", "read", tc * qd)
        add("dV", "write", kvd)
        # dP = dO Vᵀ
        add("dO", "read", tc * qd)
        add("V", "read", tr * kd)
        add("dP", "write", e)
        if unfused_drop:
            add("dP", "read", e)
            add("Z", "read", e)
            add("dP", "write", e)
        # softmax backward (with dropout and scale when fused)
        add("P", "read", e)
        add("dP", "read", e)
        if drop and not unfused_drop:
            add("Z", "read", e)
        add("dS", "write", e)
        if fuse == "none":
            extra = 1 + masked
            add("dS", "read", extra * e)
            add("dS", "write", extra * e)
        # dQ = dS K, dK = dSᵀ Q
        add("dS", "read", 2 * e)
        add("K", "read", tr * kd)
        add("dQ", "write", qd)
        add("Q", "read", tc * qd)
        add("dK", "write", kvd)
    return {k: v for k, v in sorted(out.items()) if v}


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    """The launch sequence; ``tiling`` is ignored (standard attention takes none; the GEMM tile
    is the ``gemm_block`` option)."""
    fuse, p_drop, b = _options(options)
    if pass_ == "fwd":
        return attach(_forward(w, fuse, p_drop, b), "standard", w, None)
    if pass_ == "bwd":
        return attach(_backward(w, fuse, p_drop, b), "standard", w, None)
    raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")


__all__ = ["schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "PASSES", "NEEDS_TILING", "DESCRIPTION",
           "OPTIONS", "FUSE_CHOICES"]
