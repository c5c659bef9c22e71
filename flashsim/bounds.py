"""Asymptotic HBM-access bounds for exact attention, with the constants we chose made explicit.

All counts are in *elements* moved between HBM and on-chip memory (SRAM of M elements), for the
whole workload: per-head expressions are multiplied by B·H (K/V-only terms by B·Hkv where noted).

Generalising N² to Nq, Nk and masks.  The papers state their bounds for self-attention with one
N.  Every N² there counts the entries of the N x N score matrix that must be computed, so we
replace it by ``V``, the number of *visible* (query, key) pairs: Nq·Nk for dense attention, the
bottom-right causal triangle Σ_i clip(i + Nk - Nq + 1, 0, Nk) for causal masks, and the entries of
the allowed blocks (further cut by the causal rule) for block masks.  For dense attention
V = Nq·Nk, the natural rectangular version; with a block mask of density s, V ≈ s·Nq·Nk, which is
how Proposition 4 of the FlashAttention paper (block-sparse: Θ(Nd + N²d²M⁻¹s)) generalises
Theorem 2.  Every N·d term is the size of one (N x d) operand and is written with the N of that
operand (Nq for Q and O, Nk for K and V).

The keys of :func:`bounds`:

``standard``
    The FlashAttention paper's Algorithm 0 (standard attention), counted exactly per head:
    read Q, K (Nq·d + Nk·d), write S (Nq·Nk), read S (Nq·Nk), write P (Nq·Nk), read P and V
    (Nq·Nk + Nk·d), write O (Nq·d): 2·Nq·d + 2·Nk·d + 4·Nq·Nk = Θ(Nd + N²).  Algorithm 0 always
    materialises the full S and P, so masks do not change it.  It charges each matmul only the
    single read of its operands, which a real schedule achieves only when enough of an operand
    fits on chip; it is *not* a valid count for tiny M (see ``lower_bound``).
``flash``
    Theorem 2 of the FlashAttention paper, Θ(N²d²M⁻¹), with the constant of its proof made
    explicit.  The proof counts Algorithm 1: K and V are read once (2·Nk·d), and each of the
    Tc = Nk/Bc outer iterations streams all of Q (read), O (read and write back: 2·Nq·d) and the
    statistics ℓ, m (read and write: 4·Nq).  With Bc = M/(4d) (the paper's ⌈M/4d⌉ without the
    ceiling) Tc = 4·Nk·d/M and::

        flash = B·H · (2·Nk·d + 3·Nq·d·Tc + 4·Nq·Tc)  =  B·H · (2·Nk·d + 12·V·d²/M + 16·V·d/M)

    with Nq·Nk replaced by V as above.  The proof only writes Θ(Nd·Tc); the 3 (Q read, O read,
    O write) is the constant its Algorithm 1 actually has.
``saha_ye``
    Saha & Ye, "The I/O Complexity of Attention, or How Optimal is FlashAttention?" (ICML 2024,
    arXiv:2402.07443): the I/O complexity of exact attention is Θ(min(N²d²/M, N²d/√M)).  For
    M ≥ d² (large cache) their lower bound Ω(N²d²/M) matches FlashAttention within a constant;
    it is proved with Hong & Kung's red-blue pebble game for standard matrix multiplication and
    extended, through a matrix-compression communication protocol, to algorithms that use fast
    matrix multiplication.  For M < d² (small cache) attention costs as much as matrix
    multiplication, Θ(N²d/√M), and they give an algorithm that achieves it with the standard
    blocked (√M-tile) matrix-multiplication technique, beating FlashAttention there (modelled in
    :mod:`flashsim.algorithms.smallcache`; its exact loop structure is our reconstruction from
    that description).  The two expressions cross at M = d².  We report the expression with
    unit constant: ``saha_ye = B·H · V · min(d²/M, d/√M)``.  (Sources read: the paper's
    abstract and a summary of it; the constants of its proofs are not used here.)
``lower_bound``
    Proposition 3 of the FlashAttention paper: for M in [d, Nd] no algorithm computes exact
    attention with o(N²d²M⁻¹) HBM accesses *for all M in that range*.  This is an asymptotic
    statement, uniform in M, and its proof is only the endpoint M = Θ(Nd), where N²d²/M = Nd and
    writing the output already costs Nd.  It does *not* say that every M needs ≥ c·N²d²/M
    accesses: for M < d² that is false (Saha & Ye's algorithm does Θ(N²d/√M), which is
    o(N²d²/M) there).  So the pointwise expression we use is Saha & Ye's form of it, which equals
    N²d²/M for M ≥ d², together with the input/output floor::

        lower_bound = max( floor,  B·H · V · min(d²/M, d/√M) )           (constant c = 1)

        floor = B·H·(Nq·d [write O] + Nq_needed·d [read Q])  +  B·Hkv·2·Nk_needed·d [read K, V]

    where Nq_needed / Nk_needed are the query rows / key rows that take part in at least one
    visible pair (all of them for dense attention).  The floor is a theorem (every needed input
    element must cross HBM once, every output element once).  The constant c = 1 of the main term
    is a choice, not a theorem: it is the constant of Proposition 3's own proof at its endpoint
    M = Nd (N²d²/M = Nd = the size of O, written exactly once), and it is the convention in which
    the bound is usually quoted.  The tests check that every simulated algorithm stays at or
    above it on a hypothesis space of workloads — evidence for the constant, not a proof.
    (Proven constants exist only for the small-cache term: Irony, Toledo & Tiskin (2004) show
    any classical product with n·m·k multiply-adds moves ≥ nmk/(2√2·√M) − M elements, i.e.
    c ≈ 0.35 for computing QKᵀ alone.)
``regime``
    "large-cache" if M ≥ d², else "small-cache".

These are bounds for the *forward* pass (computing O).
"""

from __future__ import annotations

import math

import numpy as np

from .config import Workload, as_size
from .masking import causal_col_limit

#: Constant of the N²d²/M term of Theorem 2 as counted from Algorithm 1 (Q read, O read, O write
#: per outer iteration, Tc = 4·Nk·d/M): 3 · 4.
FLASH_CONST = 12
#: Constant of the statistics term of Algorithm 1 (ℓ, m read and written per outer iteration): 4 · 4.
FLASH_STATS_CONST = 16
#: Constant c of the pointwise lower bound's main term (see the module docstring).
LOWER_BOUND_CONST = 1.0


def _row_limits(w: Workload) -> np.ndarray:
    """Columns [0, limit) visible to each query row under the causal rule (all Nk without it)."""
    return causal_col_limit(w, np.arange(w.nq, dtype=np.int64))


def visible_pairs(w: Workload) -> int:
    """V: the number of (query i, key j) pairs with i attending j (causal rule and block mask)."""
    if w.block_mask is None:
        if not w.causal:
            return w.nq * w.nk
        # row i sees clip(i + Nk - Nq + 1, 0, Nk) keys: the integers Nk - Nq + 1 .. Nk, floored at 0
        lo = max(w.nk - w.nq + 1, 1)
        return (w.nk * (w.nk + 1) - (lo - 1) * lo) // 2
    bm = w.block_mask
    mask = bm.array
    tc = mask.shape[1]
    c0 = np.arange(tc, dtype=np.int64) * bm.block_n
    cn = np.minimum(bm.block_n, w.nk - c0)
    lim = _row_limits(w)
    total = 0
    for i in range(mask.shape[0]):
        rows = lim[i * bm.block_m:(i + 1) * bm.block_m]
        cols = mask[i]
        if not cols.any():
            continue
        # visible columns of key block j for each row: clip(limit - c0_j, 0, |block j|)
        per = np.clip(rows[:, None] - c0[None, cols], 0, cn[None, cols])
        total += int(per.sum())
    return total


def needed_rows(w: Workload) -> tuple[int, int]:
    """(query rows, key rows) that take part in at least one visible pair."""
    if w.block_mask is None:
        if not w.causal:
            return w.nq, w.nk
        # the last row sees every key; row i sees one at least iff i + Nk - Nq + 1 > 0
        return w.nk - max(w.nk - w.nq + 1, 1) + 1, w.nk
    lim = _row_limits(w)
    bm = w.block_mask
    mask = bm.array
    tr, tc = mask.shape
    c0 = np.arange(tc, dtype=np.int64) * bm.block_n
    cn = np.minimum(bm.block_n, w.nk - c0)
    nq_needed = 0
    # furthest visible column reached in each key block, over the query blocks allowed there
    reach = np.zeros(tc, dtype=np.int64)
    for i in range(tr):
        rows = lim[i * bm.block_m:(i + 1) * bm.block_m]
        cols = mask[i]
        if not cols.any():
            continue
        first_allowed = c0[cols].min()
        nq_needed += int((rows > first_allowed).sum())
        reach[cols] = np.maximum(reach[cols], np.clip(rows.max() - c0[cols], 0, cn[cols]))
    return nq_needed, int(reach.sum())


def io_floor(w: Workload) -> int:
    """Elements any exact algorithm must move: O written once, needed Q, K, V rows read once."""
    nq_needed, nk_needed = needed_rows(w)
    return w.bh * (w.nq + nq_needed) * w.d + w.batch * w.hkv * 2 * nk_needed * w.d


def _check_m(sram_elems) -> float:
    if isinstance(sram_elems, bool) or not isinstance(sram_elems, (int, float, np.integer, np.floating)):
        raise ValueError(f"sram_elems={sram_elems!r}: must be a positive number of elements")
    if not (sram_elems > 0 and math.isfinite(sram_elems)):
        raise ValueError(f"sram_elems={sram_elems!r}: must be a positive number of elements")
    return float(sram_elems)


def bounds(workload: Workload, sram_elems: float) -> dict[str, float]:
    """The bounds of the module docstring for one workload and SRAM size M (elements)."""
    w = workload
    m = _check_m(sram_elems)
    d, bh = w.d, w.bh
    v = visible_pairs(w)
    standard = bh * (2 * w.nq * d + 2 * w.nk * d + 4 * w.nq * w.nk)
    flash = bh * (2 * w.nk * d + FLASH_CONST * v * d * d / m + FLASH_STATS_CONST * v * d / m)
    saha_ye = bh * v * min(d * d / m, d / math.sqrt(m))
    lower = max(float(io_floor(w)), LOWER_BOUND_CONST * saha_ye)
    return {
        "standard": float(standard),
        "flash": float(flash),
        "lower_bound": float(lower),
        "saha_ye": float(saha_ye),
        "regime": "large-cache" if m >= d * d else "small-cache",
    }


def check_sram(workload: Workload, algo: str, sram_elems) -> None:
    """ValueError naming ``sram_elems`` where ``algo`` cannot run with M = ``sram_elems`` elements
    on chip although its count does not depend on M: the module's own ``check_sram`` (standard
    attention: M >= 2d), which its ``plan`` applies too; nothing for the others (FlashAttention's
    rule, M >= 4d, is :meth:`flashsim.config.Tiling.from_sram`, smallcache's in its module)."""
    from .algorithms import get_algorithm

    check = getattr(get_algorithm(algo), "check_sram", None)
    if check is not None:
        check(workload, sram_elems)


def bounds_table(workload: Workload, sram_elems: int, algos=None, pass_: str = "fwd",
                 walk: bool = False) -> list[dict]:
    """Each algorithm's simulated element count beside the bounds, with ratios.

    Every row holds ``algo``, ``simulated`` (elements; the closed form, or the walker when
    ``walk=True``), the bounds of :func:`bounds`, ``ratio_lower`` = simulated / lower_bound,
    ``ratio_saha_ye`` and ``ratio_flash``.  An algorithm that is not available (module missing)
    or cannot run this workload (at this M: :func:`check_sram` for standard attention) gets
    ``simulated=None`` and an ``error`` string.
    """
    from .algorithms import ALGORITHMS
    from .api import closed_form_elements, simulate

    algos = ALGORITHMS if algos is None else tuple(algos)
    sram_elems = as_size("sram_elems", sram_elems)  # an exact M: a float is not truncated
    b = bounds(workload, sram_elems)
    rows = []
    for a in algos:
        row: dict = {"algo": a, "pass": pass_, "sram_elems": sram_elems, **b}
        try:  # simulate and closed_form_elements refuse an M the algorithm cannot run at
            if walk:
                sim = simulate(workload, a, pass_, sram_elems=sram_elems).io.elements
            else:
                sim = sum(closed_form_elements(workload, a, pass_, sram_elems=sram_elems).values())
        except (ImportError, ValueError) as e:
            row.update(simulated=None, ratio_lower=None, ratio_saha_ye=None, ratio_flash=None, error=str(e))
            rows.append(row)
            continue
        row.update(simulated=int(sim), ratio_lower=sim / b["lower_bound"],
                   ratio_saha_ye=sim / b["saha_ye"] if b["saha_ye"] else None,
                   ratio_flash=sim / b["flash"], error="")
        rows.append(row)
    return rows


__all__ = ["bounds", "bounds_table", "check_sram", "visible_pairs", "needed_rows", "io_floor", "FLASH_CONST",
           "LOWER_BOUND_CONST"]
