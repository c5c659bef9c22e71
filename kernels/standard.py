"""Standard attention as separate Numba CUDA kernels that materialise S and P in global memory.

This is the ``fuse="softmax"``, dropout = 0 schedule of :mod:`flashsim.algorithms.standard` (the
paper's Algorithm 0 forward and Algorithm 3 backward), launch for launch:

forward::

    gemm_qk        S = Q Kᵀ            tiled GEMM, b x b output tiles, S stored in the input dtype
    softmax        P = softmax(τ·S)     one thread block per row; scale and mask fused
    gemm_pv        O = P V             one thread block per b output rows

backward (P is the forward's; pass it as ``p=``, otherwise it is rebuilt uncounted)::

    gemm_dv        dV = Σ_h P_hᵀ dO_h    one thread block per b rows of dV of one kv head
    gemm_dp        dP = dO Vᵀ
    softmax_bwd    dS = τ·P ∘ (dP − rowsum(P ∘ dP))
    gemm_dq        dQ = dS K
    gemm_dk        dK = Σ_h dS_hᵀ Q_h

S, P, dP and dS are stored in the input precision, as PyTorch does; every product and sum
accumulates in float32.  The GEMM tile b (``gemm_block``, 16 or 32) is both the kernel's
output tile and the schedule's ``gemm_block``: the traffic counters equal the walker exactly.

The row kernels keep their row(s) in shared memory (dynamic, float32), so S (forward) and P and
dP (backward) are read from global memory once each, as PyTorch's shared-memory softmax does
and as the schedule counts.  That caps Nk within 47 KiB of shared memory: on the GPU (128 row
threads) Nk <= 11,648 for the forward softmax and Nk <= 5,824 for the backward (larger Nk raises
``ValueError``).

S is the *unscaled* Q Kᵀ (the scale is fused into the softmax, as in ``fuse="softmax"``): in
fp16 it overflows where |q·k| > 65,504, as in eager code that scales after the matmul (PyTorch's
SDPA math path multiplies Q and K by √τ first instead).

Head dimensions up to ``D_MAX`` = 128 are supported (any value, not only powers of two).
Threads: a GEMM block has b/4 x b threads on the GPU (256 at b = 32, declared as launch bounds;
each thread owns 4 rows of its output column(s)), a row kernel 128.  Traffic counting: thread
(0, 0) of each block adds each whole tile transfer once (``count=True`` variants only).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32

from flashsim.config import BlockMask, cdiv

from ._arrays import check_attention_shapes, to_device
from .counters import INDEX, READ, WRITE, device_counters, new_counters

#: Default GEMM output tile (BM = BN = b); a GEMM block has b/4 x b threads on the GPU.
GEMM_BLOCK = 32
GEMM_BLOCKS = (16, 32)
#: Largest head dimension (the P·V kernels keep a b x D_MAX float32 accumulator in shared memory).
D_MAX = 128
#: Static shared memory per block available to the row kernels' row caches.
_ROW_SMEM_BYTES = 48 * 1024 - 1024
NEG_INF = float("-inf")


def _threads(tile: int, sim: bool | None = None) -> tuple[int, int, int]:
    """(GEMM threads in y, in x, row-kernel threads).  On a GPU: b/4 x b GEMM threads (256 for
    b = 32; each thread owns 4 rows of its column(s), so the GEMMs' 72-128 registers per thread
    fit the register file) and 128 threads per row.  The CUDA simulator runs one Python thread
    per CUDA thread and its cost grows with their number, so there each thread does more of the
    same strided loops: 4 x 4 GEMM threads and 4 per row (same arithmetic, same transfers)."""
    if sim is None:
        from numba import config

        sim = bool(config.ENABLE_CUDASIM)
    return (4, 4, 4) if sim else (max(1, tile // 4), tile, 128)


# --------------------------------------------------------------------------------------------
# Kernel factories.  ``count`` is a closure constant: with count=False the counting branches are
# compiled out.  Arrays are 3-D (B·H or B·Hkv, rows, cols); query head p uses kv head p // group
# (p = b·H + h and H = Hkv·group, so b·Hkv + h // group = p // group).


def _abt_fn(count: bool, tile: int, nty: int, ntx: int, ia: int, ib: int, ic: int):
    """C[p] = A[p] B[p // group]ᵀ: A (Nq x d), B (Nk x d), C (Nq x Nk).  Block (j, i, p) computes
    the b x b tile C_ij, loading A_i and B_j through shared memory in b-wide chunks of d;
    thread (ty, tx) owns C[i0 + ty + r·nty, j0 + tx + c·ntx] (one element when nty = ntx = b)."""

    pad = tile + 1  # row stride of b x b tiles: column reads hit distinct banks

    def kernel(a, b, c, group, counters):
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        j0 = cuda.blockIdx.x * tile
        i0 = cuda.blockIdx.y * tile
        p = cuda.blockIdx.z
        kv = p // group
        nq = a.shape[1]
        nk = b.shape[1]
        d = a.shape[2]
        sa = cuda.shared.array((tile, pad), float32)
        sb = cuda.shared.array((tile, pad), float32)
        sc = cuda.shared.array((tile, pad), float32)
        for r in range(ty, tile, nty):
            for cc in range(tx, tile, ntx):
                sc[r, cc] = float32(0.0)
        for c0 in range(0, d, tile):
            # sa[r, t] = A[i0+r, c0+t], sb[r, t] = B[j0+r, c0+t] (coalesced along d)
            for r in range(ty, tile, nty):
                for t in range(tx, tile, ntx):
                    v = float32(0.0)
                    if i0 + r < nq and c0 + t < d:
                        v = float32(a[p, i0 + r, c0 + t])
                    sa[r, t] = v
                    v = float32(0.0)
                    if j0 + r < nk and c0 + t < d:
                        v = float32(b[kv, j0 + r, c0 + t])
                    sb[r, t] = v
            cuda.syncthreads()
            for r in range(ty, tile, nty):
                for cc in range(tx, tile, ntx):
                    s = float32(0.0)
                    for t in range(tile):
                        s += sa[r, t] * sb[cc, t]
                    sc[r, cc] += s
            cuda.syncthreads()
        for r in range(ty, tile, nty):
            for cc in range(tx, tile, ntx):
                if i0 + r < nq and j0 + cc < nk:
                    c[p, i0 + r, j0 + cc] = sc[r, cc]
        if count:
            if tx == 0 and ty == 0:
                rows = min(tile, nq - i0)
                cols = min(tile, nk - j0)
                cuda.atomic.add(counters, (ia, READ), rows * d)
                cuda.atomic.add(counters, (ib, READ), cols * d)
                cuda.atomic.add(counters, (ic, WRITE), rows * cols)

    return kernel


def _ab_rows_fn(count: bool, tile: int, nty: int, ntx: int, ia: int, ib: int, ic: int):
    """C[p] = A[p] B[p // group]: A (Nq x Nk), B (Nk x d), C (Nq x d).  Block (i, p) computes the
    b x d block C_i, streaming b-column chunks of A_i and b-row chunks of B through shared
    memory; thread (ty, tx) owns C[i0 + ty + r·nty, tx + c·ntx], accumulated in shared memory."""

    pad = tile + 1  # row stride of b x b tiles: column reads hit distinct banks

    def kernel(a, b, c, group, counters):
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        i0 = cuda.blockIdx.x * tile
        p = cuda.blockIdx.y
        kv = p // group
        nq = a.shape[1]
        nk = a.shape[2]
        d = b.shape[2]
        sa = cuda.shared.array((tile, pad), float32)
        sb = cuda.shared.array((tile, D_MAX), float32)
        sc = cuda.shared.array((tile, D_MAX), float32)
        for r in range(ty, tile, nty):
            for col in range(tx, d, ntx):
                sc[r, col] = float32(0.0)
        for k0 in range(0, nk, tile):
            for r in range(ty, tile, nty):
                for t in range(tx, tile, ntx):
                    v = float32(0.0)
                    if i0 + r < nq and k0 + t < nk:
                        v = float32(a[p, i0 + r, k0 + t])
                    sa[r, t] = v
                for col in range(tx, d, ntx):
                    v = float32(0.0)
                    if k0 + r < nk:
                        v = float32(b[kv, k0 + r, col])
                    sb[r, col] = v
            cuda.syncthreads()
            for r in range(ty, tile, nty):
                for col in range(tx, d, ntx):
                    s = float32(0.0)
                    for t in range(tile):
                        s += sa[r, t] * sb[t, col]
                    sc[r, col] += s
            cuda.syncthreads()
        for r in range(ty, tile, nty):
            if i0 + r < nq:
                for col in range(tx, d, ntx):
                    c[p, i0 + r, col] = sc[r, col]
        if count:
            if tx == 0 and ty == 0:
                rows = min(tile, nq - i0)
                cuda.atomic.add(counters, (ia, READ), rows * nk)
                cuda.atomic.add(counters, (ib, READ), nk * d)
                cuda.atomic.add(counters, (ic, WRITE), rows * d)

    return kernel


def _atb_group_fn(count: bool, tile: int, nty: int, ntx: int, ia: int, ib: int, ic: int):
    """C[g] = Σ_{h < group} A[g·group + h]ᵀ B[g·group + h]: A (Nq x Nk), B (Nq x d), C (Nk x d),
    one program per kv head g (the group's heads stacked along the reduction).  Block (j, g)
    computes the b x d block C_j; thread (ty, tx) owns C[j0 + ty + r·nty, tx + c·ntx]."""

    pad = tile + 1  # row stride of b x b tiles: column reads hit distinct banks

    def kernel(a, b, c, group, counters):
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        j0 = cuda.blockIdx.x * tile
        g = cuda.blockIdx.y
        nq = a.shape[1]
        nk = a.shape[2]
        d = b.shape[2]
        sa = cuda.shared.array((tile, pad), float32)
        sb = cuda.shared.array((tile, D_MAX), float32)
        sc = cuda.shared.array((tile, D_MAX), float32)
        for r in range(ty, tile, nty):
            for col in range(tx, d, ntx):
                sc[r, col] = float32(0.0)
        for h in range(group):
            p = g * group + h
            for r0 in range(0, nq, tile):
                # sa[t, r] = A[r0+t, j0+r]: query rows t of the key columns j0.., coalesced along keys
                for t in range(ty, tile, nty):
                    for r in range(tx, tile, ntx):
                        v = float32(0.0)
                        if r0 + t < nq and j0 + r < nk:
                            v = float32(a[p, r0 + t, j0 + r])
                        sa[t, r] = v
                    for col in range(tx, d, ntx):
                        v = float32(0.0)
                        if r0 + t < nq:
                            v = float32(b[p, r0 + t, col])
                        sb[t, col] = v
                cuda.syncthreads()
                for r in range(ty, tile, nty):
                    for col in range(tx, d, ntx):
                        s = float32(0.0)
                        for t in range(tile):
                            s += sa[t, r] * sb[t, col]
                        sc[r, col] += s
                cuda.syncthreads()
        for r in range(ty, tile, nty):
            if j0 + r < nk:
                for col in range(tx, d, ntx):
                    c[g, j0 + r, col] = sc[r, col]
        if count:
            if tx == 0 and ty == 0:
                cols = min(tile, nk - j0)
                cuda.atomic.add(counters, (ia, READ), group * nq * cols)
                cuda.atomic.add(counters, (ib, READ), group * nq * d)
                cuda.atomic.add(counters, (ic, WRITE), cols * d)

    return kernel


def _softmax_fn(count: bool, nthreads: int):
    """P[p, i, :] = softmax(τ·S[p, i, :] with masked entries −∞); a fully masked row gives P = 0.
    Block (i, p), ``nthreads`` threads striding over the row; the row is cached in dynamic shared
    memory so S is read once."""
    iS, iP = INDEX["S"], INDEX["P"]

    def kernel(s, out, scale, causal, bmask, bm_m, bm_n, has_bm, counters):
        t = cuda.threadIdx.x
        i = cuda.blockIdx.x
        p = cuda.blockIdx.y
        nq = s.shape[1]
        nk = s.shape[2]
        row = cuda.shared.array(0, float32)
        red = cuda.shared.array(nthreads, float32)
        # causal, bottom-right aligned: row i sees columns j < i + Nk − Nq + 1
        lim = nk
        if causal:
            lim = min(max(i + nk - nq + 1, 0), nk)
        m = float32(NEG_INF)
        for j in range(t, nk, nthreads):
            x = float32(s[p, i, j]) * scale
            if j >= lim:
                x = float32(NEG_INF)
            if has_bm:
                if bmask[i // bm_m, j // bm_n] == 0:
                    x = float32(NEG_INF)
            row[j] = x
            m = max(m, x)
        red[t] = m
        cuda.syncthreads()
        step = nthreads // 2
        while step > 0:
            if t < step:
                red[t] = max(red[t], red[t + step])
            cuda.syncthreads()
            step //= 2
        m = red[0]
        cuda.syncthreads()
        l_part = float32(0.0)
        for j in range(t, nk, nthreads):
            e = float32(0.0)
            if m != NEG_INF:
                e = math.exp(row[j] - m)
            row[j] = e
            l_part += e
        red[t] = l_part
        cuda.syncthreads()
        step = nthreads // 2
        while step > 0:
            if t < step:
                red[t] += red[t + step]
            cuda.syncthreads()
            step //= 2
        l_i = red[0]
        inv = float32(0.0)
        if l_i > 0:
            inv = float32(1.0) / l_i
        for j in range(t, nk, nthreads):
            out[p, i, j] = row[j] * inv
        if count:
            if t == 0:
                cuda.atomic.add(counters, (iS, READ), nk)
                cuda.atomic.add(counters, (iP, WRITE), nk)

    return kernel


def _softmax_bwd_fn(count: bool, nthreads: int):
    """dS[p, i, :] = τ·P ∘ (dP − D_i), D_i = Σ_j P_ij dP_ij (the softmax Jacobian-vector product;
    the mask needs nothing: masked entries have P = 0).  P and dP rows are cached in dynamic
    shared memory (P at [0, Nk), dP at [Nk, 2Nk)), so each is read once."""
    iP, idP, idS = INDEX["P"], INDEX["dP"], INDEX["dS"]

    def kernel(pm, dp, ds, scale, counters):
        t = cuda.threadIdx.x
        i = cuda.blockIdx.x
        p = cuda.blockIdx.y
        nk = pm.shape[2]
        cache = cuda.shared.array(0, float32)
        red = cuda.shared.array(nthreads, float32)
        acc = float32(0.0)
        for j in range(t, nk, nthreads):
            x = float32(pm[p, i, j])
            y = float32(dp[p, i, j])
            cache[j] = x
            cache[nk + j] = y
            acc += x * y
        red[t] = acc
        cuda.syncthreads()
        step = nthreads // 2
        while step > 0:
            if t < step:
                red[t] += red[t + step]
            cuda.syncthreads()
            step //= 2
        d_i = red[0]
        for j in range(t, nk, nthreads):
            ds[p, i, j] = scale * cache[j] * (cache[nk + j] - d_i)
        if count:
            if t == 0:
                cuda.atomic.add(counters, (iP, READ), nk)
                cuda.atomic.add(counters, (idP, READ), nk)
                cuda.atomic.add(counters, (idS, WRITE), nk)

    return kernel


# name -> (factory, counter tensors (a, b, c) or None for the row kernels)
_GEMMS = {
    "gemm_qk": (_abt_fn, ("Q", "K", "S")),
    "gemm_pv": (_ab_rows_fn, ("P", "V", "O")),
    "gemm_dv": (_atb_group_fn, ("P", "dO", "dV")),
    "gemm_dp": (_abt_fn, ("dO", "V", "dP")),
    "gemm_dq": (_ab_rows_fn, ("dS", "K", "dQ")),
    "gemm_dk": (_atb_group_fn, ("dS", "Q", "dK")),
}


def _python_fn(name: str, count: bool, tile: int, nty: int, ntx: int, nrow: int):
    if name == "softmax":
        return _softmax_fn(count, nrow)
    if name == "softmax_bwd":
        return _softmax_bwd_fn(count, nrow)
    factory, (a, b, c) = _GEMMS[name]
    return factory(count, tile, nty, ntx, INDEX[a], INDEX[b], INDEX[c])


def _launch_bounds(name: str, nty: int, ntx: int, nrow: int) -> int:
    """Threads per block, declared to ptxas so that it fits registers to that block size."""
    return nrow if name.startswith("softmax") else nty * ntx


@cache
def _kernel(name: str, count: bool, tile: int):
    from numba import config

    th = _threads(tile)
    fn = _python_fn(name, count, tile, *th)
    if config.ENABLE_CUDASIM:  # the simulator's jit takes no launch bounds
        return cuda.jit(fn)
    return cuda.jit(fn, launch_bounds=_launch_bounds(name, *th))


def compile_all_ptx(cc=(9, 0), tile: int = GEMM_BLOCK, variants=None) -> dict[str, str]:
    """PTX of every kernel for the GPU configuration (for the no-local-memory check; needs
    NVRTC/NVVM, no GPU, and the CUDA simulator switched off).  ``variants``: (dtype name, count)
    pairs, by default all four of {"fp32", "fp16"} x {False, True}."""
    from numba import types

    dts = {"fp32": types.float32, "fp16": types.float16}
    variants = variants or [(n, c) for n in dts for c in (False, True)]
    out = {}
    i64 = types.Array(types.int64, 2, "C")
    u8 = types.Array(types.uint8, 2, "C")
    for dname, count in variants:
        a3 = types.Array(dts[dname], 3, "C")
        sigs = {
            "softmax": (a3, a3, types.float32, types.int32, u8, types.int64, types.int64, types.int32, i64),
            "softmax_bwd": (a3, a3, a3, types.float32, i64),
        }
        for name in ("softmax", "softmax_bwd", *_GEMMS):
            sig = sigs.get(name, (a3, a3, a3, types.int64, i64))
            th = _threads(tile, sim=False)
            ptx, _ = cuda.compile_ptx(_python_fn(name, count, tile, *th), sig, cc=cc,
                                      launch_bounds=_launch_bounds(name, *th))
            out[f"{name}[{dname}, count={count}]"] = ptx
    return out


# --------------------------------------------------------------------------------------------
# Launchers


@cache
def _dummy(kind: str):
    """Device arrays reused across calls so that a launch without counters or block mask makes no
    host-to-device copy: the counters of ``count=False`` kernels (never touched) and the 1 x 1
    block mask of an unmasked softmax (never read)."""
    return cuda.to_device(new_counters() if kind == "counters" else np.ones((1, 1), np.uint8))


class _Launcher:
    """Shapes, counters and launch helpers shared by the forward and backward."""

    def __init__(self, q, k, v, counters, gemm_block, extra=None, stream=None, causal=False, scale=None):
        if isinstance(gemm_block, (bool, np.bool_, float, np.floating)) or gemm_block not in GEMM_BLOCKS:
            raise ValueError(f"gemm_block={gemm_block!r}: must be one of {list(GEMM_BLOCKS)}")
        self.tile = gemm_block
        self.inp = to_device(q=q, k=k, v=v, **(extra or {}), stream=stream, causal=causal, scale=scale)
        arr = self.inp.arrays
        b, h, hkv, nq, nk, d = check_attention_shapes(arr["q"], arr["k"], arr["v"], arr.get("do"))
        if d > D_MAX:
            raise ValueError(f"head_dim={d}: must be at most {D_MAX}")
        self.b, self.h, self.hkv, self.nq, self.nk, self.d = b, h, hkv, nq, nk, d
        self.group = h // hkv
        self.dtype = self.inp.dtype
        self.q3 = arr["q"].reshape(b * h, nq, d)
        self.k3 = arr["k"].reshape(b * hkv, nk, d)
        self.v3 = arr["v"].reshape(b * hkv, nk, d)
        self.count = counters is not None
        if counters is None:
            self.ctr, self._back = _dummy("counters"), lambda dev: None
        else:  # checked (kind, dtype, shape, writeable) before any kernel runs
            self.ctr, self._back = device_counters(counters, self.inp.stream)
        self.nty, self.ntx, self.threads = _threads(gemm_block)

    def empty(self, *shape):
        return self.inp.empty(shape, self.dtype)

    def finish_counters(self):
        self._back(self.ctr)

    def gemm(self, name, a, b, c, grid_rows, count=None):
        t = self.tile
        cnt = self.count if count is None else count
        kern = _kernel(name, cnt, t)
        if name in ("gemm_qk", "gemm_dp"):
            grid = (cdiv(self.nk, t), cdiv(self.nq, t), a.shape[0])
        else:
            grid = (cdiv(grid_rows, t), c.shape[0])
        kern[grid, (self.ntx, self.nty), self.inp.stream](a, b, c, self.group, self.ctr)

    def forward_intermediates(self, causal, scale, block_mask, count=None):
        """S = Q Kᵀ and P = softmax(τ S) (masked)."""
        cnt = self.count if count is None else count
        bh, nq, nk = self.b * self.h, self.nq, self.nk
        if 4 * nk + 4 * self.threads > _ROW_SMEM_BYTES:
            raise ValueError(f"seq_len_k={nk}: the softmax kernel caches a row in shared memory; Nk must be "
                             f"at most {(_ROW_SMEM_BYTES - 4 * self.threads) // 4}")
        if block_mask is None:
            bm, bmm, bmn, has = _dummy("mask"), 1, 1, 0
        else:
            if not isinstance(block_mask, BlockMask):
                raise ValueError(f"block_mask={type(block_mask).__name__}: must be a flashsim.config.BlockMask")
            want = (cdiv(nq, block_mask.block_m), cdiv(nk, block_mask.block_n))
            if block_mask.shape != want:
                raise ValueError(f"block_mask.shape={block_mask.shape}: must be {want} for Nq={nq}, Nk={nk}")
            bm = cuda.to_device(np.ascontiguousarray(block_mask.array.astype(np.uint8)), stream=self.inp.stream)
            bmm, bmn, has = block_mask.block_m, block_mask.block_n, 1
        s = self.empty(bh, nq, nk)
        p = self.empty(bh, nq, nk)
        self.gemm("gemm_qk", self.q3, self.k3, s, nq, count=cnt)
        kern = _kernel("softmax", cnt, self.tile)
        kern[(nq, bh), self.threads, self.inp.stream, 4 * nk](s, p, np.float32(scale), np.int32(bool(causal)), bm,
                                                              bmm, bmn, np.int32(has), self.ctr)
        return s, p


def _scale(scale, d):
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def standard_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                       block_mask: BlockMask | None = None, return_intermediates: bool = False,
                       counters=None, gemm_block: int = GEMM_BLOCK, stream=None):
    """Standard attention O = softmax(τ Q Kᵀ) V with S and P materialised.

    q: (B, H, Nq, d); k, v: (B, Hkv, Nk, d); float32 or float16 (all the same); numpy arrays or
    CUDA arrays (results come back in the kind of ``q``).  ``counters``: an int64 array from
    :func:`kernels.counters.new_counters` (host or device) that the kernels add their global
    memory transfers to, in elements.  Returns O (B, H, Nq, d), or (O, S, P) with
    ``return_intermediates`` (S unscaled, P = softmax(τ S) after masking; both (B, H, Nq, Nk)).
    """
    ln = _Launcher(q, k, v, counters, gemm_block, stream=stream, causal=causal, scale=scale)
    tau = _scale(scale, ln.d)
    s, p = ln.forward_intermediates(causal, tau, block_mask)
    o = ln.empty(ln.b * ln.h, ln.nq, ln.d)
    ln.gemm("gemm_pv", p, ln.v3, o, ln.nq)
    ln.finish_counters()
    shape4 = (ln.b, ln.h, ln.nq)
    o4 = ln.inp.out(o.reshape(*shape4, ln.d))
    if return_intermediates:
        return o4, ln.inp.out(s.reshape(*shape4, ln.nk)), ln.inp.out(p.reshape(*shape4, ln.nk))
    return o4


def standard_attention_backward(q, k, v, o, do, *, causal: bool = False, scale: float | None = None,
                                block_mask: BlockMask | None = None, counters=None, p=None,
                                gemm_block: int = GEMM_BLOCK, stream=None):
    """Gradients (dQ, dK, dV) of standard attention, the paper's Algorithm 3.

    Standard attention's backward reads the forward's P, not O: pass P (from
    ``standard_attention(..., return_intermediates=True)``) as ``p``.  Without it, S and P are
    recomputed first with the forward's kernels, *not* counted (the counters then hold exactly
    the backward schedule of :mod:`flashsim.algorithms.standard`).  ``o`` is accepted for the
    same signature as the flash kernels and only shape-checked (D = rowsum(P ∘ dP) here).
    dK and dV have the kv heads' shape (summed over each GQA group).
    """
    ln = _Launcher(q, k, v, counters, gemm_block, extra={"do": do}, stream=stream, causal=causal, scale=scale)
    if not hasattr(o, "shape"):
        raise ValueError(f"o: type {type(o).__name__} is not an array")
    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(f"o.shape={tuple(o.shape)}: must equal q.shape={tuple(q.shape)}")
    tau = _scale(scale, ln.d)
    bh, nq, nk, d = ln.b * ln.h, ln.nq, ln.nk, ln.d
    if 8 * nk + 4 * ln.threads > _ROW_SMEM_BYTES:
        raise ValueError(f"seq_len_k={nk}: the softmax backward caches P and dP rows in shared memory; Nk "
                         f"must be at most {(_ROW_SMEM_BYTES - 4 * ln.threads) // 8}")
    if p is None:
        _, p3 = ln.forward_intermediates(causal, tau, block_mask, count=False)
    else:
        pin = to_device(p=p, stream=ln.inp.stream)
        if pin.dtype != ln.dtype or tuple(pin.arrays["p"].shape) != (ln.b, ln.h, nq, nk):
            raise ValueError(f"p: must be ({ln.b}, {ln.h}, {nq}, {nk}) of dtype {ln.dtype}")
        p3 = pin.arrays["p"].reshape(bh, nq, nk)
    do3 = ln.inp.arrays["do"].reshape(bh, nq, d)
    nkv = ln.b * ln.hkv
    dv = ln.empty(nkv, nk, d)
    ln.gemm("gemm_dv", p3, do3, dv, nk)
    dp = ln.empty(bh, nq, nk)
    ln.gemm("gemm_dp", do3, ln.v3, dp, nq)
    ds = ln.empty(bh, nq, nk)
    kern = _kernel("softmax_bwd", ln.count, ln.tile)
    kern[(nq, bh), ln.threads, ln.inp.stream, 8 * nk](p3, dp, ds, np.float32(tau), ln.ctr)
    dq = ln.empty(bh, nq, d)
    ln.gemm("gemm_dq", ds, ln.k3, dq, nq)
    dk = ln.empty(nkv, nk, d)
    ln.gemm("gemm_dk", ds, ln.q3, dk, nk)
    ln.finish_counters()
    return (ln.inp.out(dq.reshape(ln.b, ln.h, nq, d)), ln.inp.out(dk.reshape(ln.b, ln.hkv, nk, d)),
            ln.inp.out(dv.reshape(ln.b, ln.hkv, nk, d)))


__all__ = ["standard_attention", "standard_attention_backward", "compile_all_ptx", "GEMM_BLOCK", "GEMM_BLOCKS",
           "D_MAX"]
