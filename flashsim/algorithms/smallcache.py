"""Saha & Ye's small-cache attention (ICML 2024): blocked matrix multiplications with √M tiles.

When the SRAM holds fewer than d² elements, FlashAttention's Br x d and Bc x d tiles shrink to
Br·d ≈ M/4 and its K/V re-reads grow as N²d²/M.  Saha & Ye observe that attention is then as
hard as matrix multiplication and that the classical blocked schedule does better: keep an
s x s tile of the result on chip and stream s x s chunks of the two operands along the inner
dimension, so each result tile of s² entries costs 2·s·k reads for inner dimension k, and a
product of (n x k)(k x m) moves 2·n·m·k/s + n·m elements.  With s ≈ √(M/3) the forward costs
Θ(N²d/√M); materialising S (N² elements) is cheaper than that because √M < d.

Forward, per (batch, query head), with s the largest integer with 3s² + 2s ≤ M (three s x s
tiles plus two length-s statistics vectors on chip)::

    launch smallcache_qk   (S = τ Q Kᵀ, Nq x Nk, inner dimension d):
        for each s-row block I of Q, each s-row block J of K:
            acc = 0 (s x s on chip)
            for each s-column chunk c of d: load Q[I, c], K[J, c]; acc += Q[I, c] K[J, c]ᵀ
            write S[I, J] = τ·acc
    launch smallcache_stats (row logsumexp of S, read once, online):
        for each s-row block I: m = -inf, ℓ = 0 (length s)
            for each s-column block J: load S[I, J]; update m, ℓ online
            write L[I] = m + log ℓ                                   (float32)
    launch smallcache_pv   (O = softmax(S) V, Nq x d, inner dimension Nk):
        for each s-row block I, each s-column chunk c of d:
            load L[I]; acc = 0 (s x s)
            for each s-row block J of V: load S[I, J], V[J, c]; acc += exp(S[I, J] - L[I]) V[J, c]
            write O[I, c] = acc

Per head, with Tq = ⌈Nq/s⌉, Tk = ⌈Nk/s⌉, Td = ⌈d/s⌉ (the closed form below)::

    Q read  Nq·d·Tk      K read  Nk·d·Tq      S write Nq·Nk      S read Nq·Nk·(1 + Td)
    L write Nq           L read  Nq·Td        V read  Nk·d·Tq    O write Nq·d

i.e. ≈ 4·Nq·Nk·d/s + 2·Nq·Nk = Θ(N²d/√M).  Masks are not modelled (the schedule computes the
dense S); a causal or block-sparse workload raises ValueError.  The algorithm needs only M (no
Br, Bc), any M >= 5, including M < 4d where FlashAttention's tiling does not exist:
:func:`flashsim.api.simulate` given ``sram_elems`` passes M through exactly (as this module's
``sram_elems`` option), and :func:`tile_side` turns it into s; an explicit ``tile=s`` option
overrides it.  Given a Br x Bc tiling instead, M is recovered from it as 4·d·Bc.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import Tiling, Workload, as_size, cdiv
from ..traffic import Launch, Schedule, read, write
from ._common import block_rows, classes, layouts, per_query_head_slices

PASSES = ("fwd",)
#: Takes a tiling only to recover M from it (see :func:`tile_side`); M itself (``sram_elems``) or an
#: explicit ``tile`` is exact.
NEEDS_TILING = True
#: How the command line shows the tiling (``block_m`` = ``block_n`` = s, see :func:`blocks`).
TILING_TEXT = "tile side s = {block_m}"
DESCRIPTION = "Saha & Ye small-cache attention: √M-tiled matmuls QKᵀ and PV, S written to HBM"
OPTIONS: dict[str, tuple[object, str]] = {
    "tile": (None, "tile side s (default: largest s with 3s² + 2s ≤ M, M recovered from the tiling)"),
    "sram_elems": (None, "M in elements (default: recovered from the tiling as 4·d·Bc)"),
}

_TENSORS = ("Q", "K", "V", "S", "L", "O")


def tile_for_sram(sram_elems: int) -> int:
    """Largest s with 3s² + 2s ≤ M: three s x s tiles and two s-vectors (m, ℓ) on chip."""
    sram_elems = as_size("sram_elems", sram_elems)
    if sram_elems < 5:
        raise ValueError(f"sram_elems={sram_elems}: the small-cache schedule needs M >= 5 (s >= 1)")
    s = math.isqrt(sram_elems // 3)
    while 3 * (s + 1) ** 2 + 2 * (s + 1) <= sram_elems:
        s += 1
    while 3 * s * s + 2 * s > sram_elems:
        s -= 1
    return s


def tile_side(w: Workload, tiling: Tiling | None, tile=None, sram_elems=None) -> int:
    """The tile side s: ``tile`` if given (refused where it does not fit ``sram_elems``, when
    both are given), else from ``sram_elems``, else from the tiling.

    :func:`flashsim.api.resolve_tiling` turns M into the paper's Bc = ⌈M/4d⌉, so M is recovered
    as 4·d·Bc (equal to the M given when 4d divides it, and at most 4d - 1 more otherwise).
    """
    if tile is not None:
        s = as_size("tile", tile)
        if sram_elems is not None and 3 * s * s + 2 * s > as_size("sram_elems", sram_elems):
            raise ValueError(f"tile={s}: three {s} x {s} tiles and two {s}-vectors need 3s² + 2s = "
                             f"{3 * s * s + 2 * s:,} elements on chip, more than M = {sram_elems:,}")
        return s
    if sram_elems is None:
        if tiling is None:
            raise ValueError("tiling=None: smallcache needs an SRAM size (sram_elems) or tile=s")
        sram_elems = 4 * w.d * tiling.block_n
    return tile_for_sram(sram_elems)


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None,
         **options) -> tuple[Tiling | None, dict]:
    """The M rule: given M, one s x s tile with s from M exactly, run as the ``tile`` option (an
    explicit ``tile`` wins); without M, the tiling as given, M recovered from it as 4·d·Bc."""
    if sram_elems is None:
        return tiling, dict(options)
    s = tile_side(w, None, tile=options.get("tile"), sram_elems=sram_elems)
    return Tiling(s, s), {**options, "tile": s}


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[int, int]:
    """A record's block_m, block_n: both the tile side s (one s x s tile)."""
    extra = {k: options[k] for k in ("tile", "sram_elems") if k in options}
    s = tile_side(w, tiling, **extra)
    return s, s


def _check(w: Workload, pass_: str) -> None:
    if pass_ != "fwd":
        raise ValueError(f"pass_={pass_!r}: smallcache models only the forward pass")
    if w.causal:
        raise ValueError("causal=True: smallcache models dense attention only (no causal mask)")
    if w.block_mask is not None:
        raise ValueError("block_mask: smallcache models dense attention only (no block mask)")


def _options(options: dict) -> dict:
    extra = set(options) - set(OPTIONS)
    if extra:
        raise ValueError(f"options={sorted(extra)}: smallcache takes only {sorted(OPTIONS)}")
    return options


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    _check(w, pass_)
    s = tile_side(w, tiling, **_options(options))
    q0, qn = block_rows(w.nq, s, "seq_len_q")
    k0, kn = block_rows(w.nk, s, "seq_len_k")
    c0, cn = block_rows(w.d, s, "head_dim")
    tq, tk, td = len(q0), len(k0), len(c0)
    slices = per_query_head_slices(w, _TENSORS)

    # Each launch yields one access per tensor holding all of a program's transfers of that
    # tensor as arrays, in loop order (the walker vectorises over them); the interleaving of
    # different tensors inside the loop nest is not kept.
    def qk():
        # loop nest (I, J, c), flattened I-major
        ii, jj, cc = (x.ravel() for x in np.meshgrid(np.arange(tq), np.arange(tk), np.arange(td), indexing="ij"))
        yield read("Q", q0[ii], qn[ii], c0[cc], cn[cc])
        yield read("K", k0[jj], kn[jj], c0[cc], cn[cc])
        i2, j2 = (x.ravel() for x in np.meshgrid(np.arange(tq), np.arange(tk), indexing="ij"))
        yield write("S", q0[i2], qn[i2], k0[j2], kn[j2])

    def stats():
        i2, j2 = (x.ravel() for x in np.meshgrid(np.arange(tq), np.arange(tk), indexing="ij"))
        yield read("S", q0[i2], qn[i2], k0[j2], kn[j2])
        yield write("L", q0, qn)

    def pv():
        # loop nest (I, c, J): L[I] once per output chunk, S[I, J] and V[J, c] per J
        ii, cc, jj = (x.ravel() for x in np.meshgrid(np.arange(tq), np.arange(td), np.arange(tk), indexing="ij"))
        i2, c2 = (x.ravel() for x in np.meshgrid(np.arange(tq), np.arange(td), indexing="ij"))
        yield read("L", q0[i2], qn[i2])
        yield read("S", q0[ii], qn[ii], k0[jj], kn[jj])
        yield read("V", k0[jj], kn[jj], c0[cc], cn[cc])
        yield write("O", q0[i2], qn[i2], c0[c2], cn[c2])

    # The same transfers grouped (see flashsim.traffic.Launch.counts): row blocks, key blocks
    # and column chunks each in classes, a tile of two of them their outer product.
    def outer(x, y, times=1):
        return dict(row0=x[0][:, None], nrows=x[1][:, None], col0=y[0][None, :], ncols=y[1][None, :],
                    repeat=x[2][:, None] * y[2][None, :] * times)

    def qk_counts():
        qc, kc, cc = classes(q0, qn), classes(k0, kn), classes(c0, cn)
        yield read("Q", **outer(qc, cc, tk))
        yield read("K", **outer(kc, cc, tq))
        yield write("S", **outer(qc, kc))

    def stats_counts():
        qc, kc = classes(q0, qn), classes(k0, kn)
        yield read("S", **outer(qc, kc))
        yield write("L", qc[0], qc[1], repeat=qc[2])

    def pv_counts():
        qc, kc, cc = classes(q0, qn), classes(k0, kn), classes(c0, cn)
        yield read("L", qc[0], qc[1], repeat=qc[2] * td)
        yield read("S", **outer(qc, kc, td))
        yield read("V", **outer(kc, cc, tq))
        yield write("O", **outer(qc, cc))

    launches = [Launch(name, w.bh, slices, fn, cnt) for name, fn, cnt in
                (("smallcache_qk", qk, qk_counts), ("smallcache_stats", stats, stats_counts),
                 ("smallcache_pv", pv, pv_counts))]
    return Schedule("smallcache", layouts(w, _TENSORS), launches, {"pass": "fwd", "tile": s})


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    _check(w, pass_)
    s = tile_side(w, tiling, **_options(options))
    bh, nq, nk, d = w.bh, w.nq, w.nk, w.d
    tq, tk, td = cdiv(nq, s), cdiv(nk, s), cdiv(d, s)
    return {
        ("Q", "read"): bh * nq * d * tk,
        ("K", "read"): bh * nk * d * tq,
        ("S", "write"): bh * nq * nk,
        ("S", "read"): bh * nq * nk * (1 + td),
        ("L", "write"): bh * nq,
        ("L", "read"): bh * nq * td,
        ("V", "read"): bh * nk * d * tq,
        ("O", "write"): bh * nq * d,
    }


__all__ = ["schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "tile_for_sram", "tile_side", "PASSES",
           "NEEDS_TILING", "DESCRIPTION", "OPTIONS"]
