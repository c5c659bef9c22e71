"""The dense closed forms, forward and backward, evaluated over numpy arrays of configurations.

:func:`flashsim.api.closed_form_elements` evaluates one configuration at a time (a few tens of
microseconds each).  For large design-space scans this module evaluates the *dense* (no causal,
no block mask) closed forms of ``standard`` (default options: ``fuse="softmax"``, no dropout,
``gemm_block`` = 128), ``flash1``, ``flash2`` (forward and backward) and ``smallcache``
(forward; it has no backward) over arrays of (Nq, Nk, d, M, B, H, Hkv), broadcasting them
together, with the paper's tiling rule Bc = ⌈M/4d⌉, Br = min(Bc, d) (and s = largest with
3s² + 2s ≤ M for smallcache).  The results are int64 element counts per (tensor, direction),
equal to the scalar closed forms entry for entry (tests/test_closed_vec.py holds them equal;
benchmarks/bench_simulator.py checks a sample).  They repeat the formulas of the algorithm
modules; when a module's model changes, this one must follow.
"""

from __future__ import annotations

import numpy as np

from .config import DTYPE_BYTES, MAX_SIZE, STAT_BYTES

ALGOS = ("standard", "flash1", "flash2", "smallcache")
#: the algorithms with a vectorised backward
BWD_ALGOS = ("standard", "flash1", "flash2")
_STATS = ("l", "m", "L", "D")


def _cdiv(a, b):
    return -(-a // b)


def _isqrt(x: np.ndarray) -> np.ndarray:
    """⌊√x⌋ exactly for int64 x (float estimate, then corrected)."""
    r = np.floor(np.sqrt(x.astype(np.float64))).astype(np.int64)
    r = np.where(r * r > x, r - 1, r)
    return np.where((r + 1) * (r + 1) <= x, r + 1, r)


def smallcache_tile(m: np.ndarray) -> np.ndarray:
    """Largest s with 3s² + 2s ≤ M, vectorised (s = ⌊(√(3M + 1) − 1)/3⌋)."""
    m = np.asarray(m, dtype=np.int64)
    s = (_isqrt(3 * m + 1) - 1) // 3
    return s


def dense_forward(algo: str, nq, d, m, batch=1, heads=1, nk=None, kv_heads=None,
                  gemm_block: int = 128) -> dict[tuple[str, str], np.ndarray]:
    """Element counts per (tensor, direction) of ``algo``'s dense forward, as arrays of the
    inputs' broadcast shape."""
    return dense(algo, "fwd", nq, d, m, batch, heads, nk, kv_heads, gemm_block)


def dense_backward(algo: str, nq, d, m, batch=1, heads=1, nk=None, kv_heads=None,
                   gemm_block: int = 128) -> dict[tuple[str, str], np.ndarray]:
    """Element counts per (tensor, direction) of ``algo``'s dense backward (``BWD_ALGOS``)."""
    return dense(algo, "bwd", nq, d, m, batch, heads, nk, kv_heads, gemm_block)


def _sizes(name: str, x) -> np.ndarray:
    """``x`` as an int64 array of sizes in [1, MAX_SIZE]; floats (never truncated), bools and
    non-numbers are refused with a ValueError naming ``name``."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: must be an integer or an integer array ({e})") from None
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: must be an integer or an integer array, not dtype {a.dtype} (sizes are never "
                         f"truncated)")
    if a.size and (a.min() <= 0 or a.max() > MAX_SIZE):
        bad = a.min() if a.min() <= 0 else a.max()
        raise ValueError(f"{name}={bad}: sizes must be in [1, {MAX_SIZE:,}]")
    return a.astype(np.int64)


def dense(algo: str, pass_: str, nq, d, m, batch=1, heads=1, nk=None, kv_heads=None,
          gemm_block: int = 128) -> dict[tuple[str, str], np.ndarray]:
    """Element counts per (tensor, direction) of ``algo``'s dense ``pass_`` ("fwd" or "bwd").

    Sizes must be integers (Python, numpy or integer arrays; floats are refused, not truncated)
    in [1, 2**31 - 1].  Configurations whose counts could exceed int64 (8·B·H·Nq·Nk·(d + 1) >=
    2^63) are refused with a ValueError.
    """
    nq, d, m, batch, heads = (_sizes(n, x) for n, x in
                              (("nq", nq), ("d", d), ("m", m), ("batch", batch), ("heads", heads)))
    nk = None if nk is None else _sizes("nk", nk)
    kv_heads = None if kv_heads is None else _sizes("kv_heads", kv_heads)
    gemm_block = int(_sizes("gemm_block", gemm_block))
    est = 8.0 * batch * heads * nq * (nq if nk is None else nk) * (d + 1.0)
    if np.size(est) and np.max(est) >= 2.0**63:
        raise ValueError("nq, nk, d, batch, heads: counts of these sizes could exceed int64 (8·B·H·Nq·Nk·(d + 1) "
                         ">= 2**63); use flashsim.api.closed_form_elements (Python ints) instead")
    if pass_ == "fwd":
        out = _dense_forward(algo, nq, d, m, batch, heads, nk, kv_heads, gemm_block)
    elif pass_ == "bwd":
        out = _dense_backward(algo, nq, d, m, batch, heads, nk, kv_heads, gemm_block)
    else:
        raise ValueError(f"pass_={pass_!r}: must be 'fwd' or 'bwd'")
    shape = np.broadcast_shapes(*(np.shape(x) for x in (nq, d, m, batch, heads, nk, kv_heads) if x is not None))
    return {k: np.broadcast_to(np.asarray(v, dtype=np.int64), shape) for k, v in out.items()}


def _dense_forward(algo: str, nq, d, m, batch, heads, nk, kv_heads,
                   gemm_block: int = 128) -> dict[tuple[str, str], np.ndarray]:
    if algo not in ALGOS:
        raise ValueError(f"algo={algo!r}: vectorised closed forms exist for {list(ALGOS)}")
    nq = np.asarray(nq, dtype=np.int64)
    nk = nq if nk is None else np.asarray(nk, dtype=np.int64)
    d = np.asarray(d, dtype=np.int64)
    m = np.asarray(m, dtype=np.int64)
    b = np.asarray(batch, dtype=np.int64)
    h = np.asarray(heads, dtype=np.int64)
    if kv_heads is not None and np.any(h % np.asarray(kv_heads, dtype=np.int64)):
        raise ValueError("kv_heads: must divide heads")
    bh = b * h
    qd, kd = bh * nq * d, bh * nk * d
    if algo == "standard":
        g = int(gemm_block)
        tr, tc = _cdiv(nq, g), _cdiv(nk, g)
        e = bh * nq * nk
        return {("Q", "read"): tc * qd, ("K", "read"): tr * kd, ("S", "write"): e, ("S", "read"): e,
                ("P", "write"): e, ("P", "read"): e, ("V", "read"): tr * kd, ("O", "write"): qd}
    if algo == "smallcache":
        if np.any(m < 5):
            raise ValueError("sram_elems: smallcache needs M >= 5")
        s = smallcache_tile(m)
        tq, tk, td = _cdiv(nq, s), _cdiv(nk, s), _cdiv(d, s)
        e = bh * nq * nk
        return {("Q", "read"): qd * tk, ("K", "read"): kd * tq, ("S", "write"): e, ("S", "read"): e * (1 + td),
                ("L", "write"): bh * nq, ("L", "read"): bh * nq * td, ("V", "read"): kd * tq, ("O", "write"): qd}
    if np.any(m < 4 * d):
        raise ValueError("sram_elems: FlashAttention needs M >= 4*d")
    bc = _cdiv(m, 4 * d)
    br = np.minimum(bc, d)
    if algo == "flash2":
        tr = _cdiv(nq, br)
        return {("Q", "read"): qd, ("K", "read"): tr * kd, ("V", "read"): tr * kd, ("O", "write"): qd,
                ("L", "write"): bh * nq}
    # flash1: each of the Tc key blocks streams Q, O, ℓ, m; O, ℓ, m also initialised once
    tc = _cdiv(nk, bc)
    qrows = tc * nq
    return {("K", "read"): kd, ("V", "read"): kd, ("Q", "read"): bh * qrows * d, ("O", "read"): bh * qrows * d,
            ("O", "write"): bh * (nq + qrows) * d, ("l", "read"): bh * qrows, ("m", "read"): bh * qrows,
            ("l", "write"): bh * (nq + qrows), ("m", "write"): bh * (nq + qrows)}


def _dense_backward(algo: str, nq, d, m, batch, heads, nk, kv_heads,
                    gemm_block: int = 128) -> dict[tuple[str, str], np.ndarray]:
    if algo not in BWD_ALGOS:
        raise ValueError(f"algo={algo!r}: vectorised backward closed forms exist for {list(BWD_ALGOS)}")
    nq = np.asarray(nq, dtype=np.int64)
    nk = nq if nk is None else np.asarray(nk, dtype=np.int64)
    d = np.asarray(d, dtype=np.int64)
    m = np.asarray(m, dtype=np.int64)
    b = np.asarray(batch, dtype=np.int64)
    h = np.asarray(heads, dtype=np.int64)
    hkv = h if kv_heads is None else np.asarray(kv_heads, dtype=np.int64)
    if np.any(h % hkv):
        raise ValueError("kv_heads: must divide heads")
    bh, bkv = b * h, b * hkv
    qd, kd, kvd = bh * nq * d, bh * nk * d, bkv * nk * d  # Q-shaped, K as read per query head, dK as stored
    if algo == "standard":
        # fuse="softmax", no dropout: dV = Pᵀ dO, dP = dO Vᵀ, softmax backward, dQ = dS K, dK = dSᵀ Q
        g = int(gemm_block)
        tr, tc = _cdiv(nq, g), _cdiv(nk, g)
        e = bh * nq * nk
        return {("P", "read"): 2 * e, ("dO", "read"): 2 * tc * qd, ("dV", "write"): kvd, ("V", "read"): tr * kd,
                ("dP", "write"): e, ("dP", "read"): e, ("dS", "write"): e, ("dS", "read"): 2 * e,
                ("K", "read"): tr * kd, ("dQ", "write"): qd, ("Q", "read"): tc * qd, ("dK", "write"): kvd}
    if np.any(m < 4 * d):
        raise ValueError("sram_elems: FlashAttention needs M >= 4*d")
    bc = _cdiv(m, 4 * d)
    br = np.minimum(bc, d)
    if algo == "flash2":
        # dK/dV reads Q, dO, L, D once per (key block, query row); dQ once more, and K, V per query block
        q_rows = _cdiv(nk, bc) * nq + nq
        kv = kvd + _cdiv(nq, br) * kd
        return {("O", "read"): qd, ("dO", "read"): bh * (nq + q_rows) * d, ("D", "write"): bh * nq,
                ("Q", "read"): bh * q_rows * d, ("L", "read"): bh * q_rows, ("D", "read"): bh * q_rows,
                ("K", "read"): kv, ("V", "read"): kv, ("dK", "write"): kvd, ("dV", "write"): kvd,
                ("dQ", "write"): qd}
    # flash1: each of the Tc key blocks (one program per kv head) streams Q, O, dO, dQ, ℓ, m of
    # every query head of its group; dQ, dK, dV also initialised once
    q_rows = _cdiv(nk, bc) * nq
    qr = bh * q_rows * d
    return {("K", "read"): kvd, ("V", "read"): kvd, ("Q", "read"): qr, ("O", "read"): qr, ("dO", "read"): qr,
            ("dQ", "read"): qr, ("dQ", "write"): qd + qr, ("l", "read"): bh * q_rows, ("m", "read"): bh * q_rows,
            ("dK", "write"): 2 * kvd, ("dV", "write"): 2 * kvd}


def totals(counts: dict[tuple[str, str], np.ndarray], dtype: str = "fp16") -> tuple[np.ndarray, np.ndarray]:
    """(elements, bytes) summed over tensors; the statistics are float32, the rest ``dtype``."""
    eb = DTYPE_BYTES[dtype]
    el = sum(counts.values())
    by = sum(v * (STAT_BYTES if t in _STATS else eb) for (t, _), v in counts.items())
    return el, by


__all__ = ["dense", "dense_forward", "dense_backward", "totals", "smallcache_tile", "ALGOS", "BWD_ALGOS"]
