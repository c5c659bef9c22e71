"""Eager "naive" attention as PyTorch runs it (torch 2.11 on Hopper), forward and autograd backward.

The code users (and ``kernels/bench.py``) write::

    s = (q * d**-0.5) @ k.transpose(-1, -2)
    if causal:
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v

and ``torch.autograd.grad(o, (q, k, v), do)`` for the backward.  Launch by launch (every tensor
(B, H, ·, ·) contiguous; ``matmul`` of 4-d tensors is one batched cuBLAS GEMM, the transposed
``k`` a transposed operand, not a copy; ``masked_fill`` out of place is ``clone`` then
``masked_fill_``, and the clone of a contiguous tensor is a ``cudaMemcpyAsync``, no kernel: ncu
lists no launch for it and the schedule has none, so its traffic, one read and one write of S,
is not counted here)::

    forward                                   reads            writes
    scale        q * τ (elementwise)          Q                Qs
    gemm_qk      Qs Kᵀ                        Qs, K (tiles)    S
    [causal: ones (fill), tril, bitwise_not (~mask), masked_fill_ of Sm, the clone of S (mask, Sm in, Sm out)]
    softmax      softmax over the last dim    S (or Sm)        P
    gemm_pv      P V                          P, V (tiles)     O

    backward (autograd's order, as the H100 record shows it: each bmm's second operand first)
    gemm_dv      dV = Pᵀ dO                   P, dO            dV
    gemm_dp      dP = dO Vᵀ                   dO, V            dP
    softmax_mul  T = dP ∘ P (softmax_backward_cuda_out multiplies first)     dP, P     T
    softmax_bwd  dS = T − P·rowsum(T)         T, P             dS
    [causal: masked_fill backward: masked_fill_ of dSm, the clone of dS (mask read per head)]
    gemm_dk      (dKᵀ) = Qsᵀ dS               Qs, dS           dKT
    gemm_dq      dQs = dS K                   dS, K            dQs
    scale_bwd    dQ = dQs ∘ τ                 dQs              dQ

The softmax kernels read each row once: ``host_softmax`` runs the persistent warp softmax up to
2,048 columns (8 KB a row), beyond that ``cunn_SoftMaxForwardReg`` (the row in registers, at most
9 values a thread) or ``cunn_SoftMaxForwardSmem`` (the row in shared memory); the backward's
``softmax_warp_backward`` (N = 1,024 here) and ``cunn_SoftMaxBackwardSmem`` read T and P once
each (the multi-pass ``cunn_SoftMaxForward``/``Backward`` and the ``Gmem`` kernels, for rows
too long for these, are not modelled).  The warp softmax (forward up to 2,048 columns, backward
up to 1,024: :func:`warp_softmax`) loads and stores one element a lane, so each warp instruction
moves 32 consecutive columns of a row, whose sectors the LSU counts apart (:func:`warp_pieces`:
rows of 2,000 bytes cost 78.5 sectors where they span 62.5).  Elementwise kernels read and
write whole tensors; the mask kernels move 1-byte booleans.  ``masked_fill_`` (``gpu_kernel`` with
``if (mask) return value; return self;``, ``elementwise_kernel<128, vt>``: thread t of block b
takes elements b·128·vt + t + 128·i, i < vt; vt = 4 for 2-byte elements, 2 for 4-byte ones) reads
the (broadcast) mask for every element of every head and writes every element; it loads its input
in iterations 0 .. vt-2 for every lane, and in the last only for the lanes whose element is kept
(the compiled kernel's shape, read off the H100 record: its loads equal this to the sector at N =
1,024 and 4,096, 83% and 86% of the input's sectors, where loading only the kept lanes of every
iteration would give 51% and 50%, and loading all 100%).  Causal naive attention needs Nk to be a
multiple of 128·vt (a block whole in a row); fp32 (vt = 2) is not measured.  ``triu_tril_kernel`` (bool: 8 elements a
thread, ``elements_per_thread = 8 / sizeof``) gives thread t the 8 bytes [8t, 8t + 8) of a row and
moves them one byte per instruction (the stride is a run-time value): at each of its 8 steps a warp
asks for 32 bytes spread over 256, so every step touches all the sectors of the warp's span.  Its
loads are made only by the threads whose chunk starts inside the kept triangle (col - row <= Nk -
Nq), all 8 bytes of such a chunk; its stores by every thread.  They are ``per_thread_rows``
accesses of the mask viewed as rows of 8 bytes (``Mask1``, ``Mask``: Nq·Nk/8 rows), one per warp
piece of a matrix row: exact when a warp never spans two matrix rows (Nk a multiple of 256).

GEMMs.  cuBLAS computes the row-major C = A·B as the column-major Cᵀ, so its "m" runs along C's
columns: a kernel tile m x n (as in the kernel's name, ``tilesize128x256x64``) covers n rows and m
columns of C.  Each output tile loads its band of A (all of the reduction dimension) and its band of
B once: A is read ⌈N/m⌉ times, B ⌈M/n⌉ times, C written once.  ``gemm_tiles`` (an option, cuBLAS
order "MxN", one for all GEMMs or one per GEMM launch in order) sets them; the default 128x128 is a
placeholder, not cuBLAS's choice: ``analysis/torch_set.py`` reads each measured GEMM's tile from
its kernel name.  fp16/bf16 GEMMs on sm_90 (cuBLASLt's ``nvjet`` kernels in torch 2.11) load
through TMA: their traffic is class ``bulk`` (counted at the L2 level; 0 LSU bytes).  They run in
thread-block clusters (``nvjet_sm90_hsh_64x128_64x8_1x2_``: tile 64 x 128, K step 64 x 8 stages,
clusters of 1 x 2 tiles, cuBLAS order): the tiles of a cluster that share a band of an operand
receive it by TMA multicast, one read for the cluster (``gemm_clusters``, same order and format
as ``gemm_tiles``), so A is read ⌈⌈N/m⌉/cm⌉ times and B ⌈⌈M/n⌉/cn⌉ times.  fp32 GEMMs (TF32 off)
run sm80-style kernels without clusters that load through the LSU (``cp.async``): class ``load``.
"""

from __future__ import annotations

import re

import numpy as np

from ..blocks import attach
from ..config import Tiling, Workload, cdiv
from ..tma import BOX_ROW_BYTES, box_row_sectors, multicast_row_sectors
from ..traffic import Launch, Schedule, TensorLayout, bulk_read, bulk_write, read, write
from ._common import block_rows, check_programs, classes

PASSES = ("fwd", "bwd")
NEEDS_TILING = False
TILING_TEXT = "no tiling of its own (cuBLAS GEMM tiles: gemm_tiles)"
DESCRIPTION = "eager naive attention in PyTorch (scale, GEMM, mask, softmax, GEMM) and its autograd backward"
OPTIONS: dict[str, tuple[object, str]] = {
    "gemm_tiles": ("128x128", "cuBLAS GEMM tile(s), cuBLAS order MxN (M along C's columns): one for all GEMMs "
                              "or a comma-separated list, one per GEMM launch"),
    "gemm_clusters": ("1x1", "thread-block cluster(s) of the TMA GEMMs, cuBLAS order MxN (tiles along C's columns x "
                             "along its rows), one for all or one per GEMM launch: an operand band shared by a "
                             "cluster's tiles is multicast, read once"),
    "sms": (132, "streaming multiprocessors of the GPU (the persistent TMA GEMMs' clusters; 132: H100 SXM)"),
}
FLOPS_AS = "standard"

#: ncu kernel-name pattern of each launch
KERNEL_NAMES = {
    "scale": r"elementwise_kernel", "scale_bwd": r"elementwise_kernel",
    "gemm_qk": r"gemm|xmma|cutlass|nvjet", "gemm_pv": r"gemm|xmma|cutlass|nvjet", "gemm_dp": r"gemm|xmma|cutlass|nvjet",
    "gemm_dv": r"gemm|xmma|cutlass|nvjet", "gemm_dq": r"gemm|xmma|cutlass|nvjet", "gemm_dk": r"gemm|xmma|cutlass|nvjet",
    "mask_ones": r"elementwise_kernel|fill", "mask_tril": r"triu_tril", "mask_not": r"elementwise_kernel",
    "masked_fill": r"masked_fill",
    "softmax": r"softmax|SoftMax", "softmax_mul": r"elementwise_kernel", "softmax_bwd": r"softmax|SoftMax",
    "mask_bwd_fill": r"masked_fill",
}
GEMMS = ("gemm_qk", "gemm_pv", "gemm_dp", "gemm_dv", "gemm_dq", "gemm_dk")


def parse_tiles(spec, count: int, what: str = "gemm_tiles") -> list[tuple[int, int]]:
    """``gemm_tiles`` (or ``gemm_clusters``, ``what``) as ``count`` (rows, cols) pairs of C (cuBLAS
    MxN = cols x rows)."""
    items = [spec] if isinstance(spec, tuple) else str(spec).split(",")
    out = []
    for it in items:
        m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", it) if isinstance(it, str) else None
        if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise ValueError(f"{what}={spec!r}: each item is MxN with positive integers, e.g. '128x256'")
        out.append((int(m.group(2)), int(m.group(1))))
    if len(out) == 1:
        out *= count
    if len(out) != count:
        raise ValueError(f"{what}={spec!r}: give one item or {count} (one per GEMM launch), not {len(out)}")
    return out


def _options(options: dict) -> tuple[str, str, int]:
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: torch_naive takes only {sorted(OPTIONS)}")
    sms = options.get("sms", OPTIONS["sms"][0])
    if isinstance(sms, bool) or not isinstance(sms, int | np.integer) or sms < 1:
        raise ValueError(f"sms={sms!r}: must be a positive integer")
    return (options.get("gemm_tiles", OPTIONS["gemm_tiles"][0]),
            options.get("gemm_clusters", OPTIONS["gemm_clusters"][0]), int(sms))


def _check(w: Workload) -> None:
    if w.block_mask is not None:
        raise ValueError("block_mask: torch_naive has no block-sparse mask")
    if w.hkv != w.heads:
        raise ValueError(f"kv_heads={w.hkv}: torch_naive models kv_heads == heads (naive GQA would need "
                         "repeat_interleave, not modelled)")
    if w.causal and w.nk % fill_block(w):
        raise ValueError(f"seq_len_k={w.nk}: causal torch_naive needs a multiple of {fill_block(w)} (masked_fill_'s "
                         "thread blocks, 128 threads x 4 (fp16, bf16) or 2 (fp32) elements, whole in a row)")


def fill_block(w: Workload) -> int:
    """Elements of one thread block of ``masked_fill_``'s ``elementwise_kernel<128, vt>``: vt = 4
    for 2-byte elements, 2 for 4-byte ones (``gpu_kernel_impl_nocast``'s unroll factor)."""
    return 128 * (4 if w.elem_bytes < 4 else 2)


def fill_kept(w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """masked_fill_'s loads of its input in the last of its vt iterations (columns [B - 128, B)
    of each block of B = :func:`fill_block` columns), which the kernel makes only for the lanes
    whose element is kept (col <= row + Nk - Nq): (row, first column, columns) of each kept run."""
    blk = fill_block(w)
    r = np.arange(w.nq, dtype=np.int64)[:, None]
    c0 = (np.arange(w.nk // blk, dtype=np.int64) * blk + blk - 128)[None, :]
    n = np.clip(r + w.nk - w.nq + 1 - c0, 0, 128)
    r, c0 = np.broadcast_arrays(r, c0)
    return r.ravel(), c0.ravel(), n.ravel()


def warp_softmax(w: Workload, bwd: bool) -> bool:
    """Whether ATen's ``host_softmax`` (``host_softmax_backward``) runs the warp softmax of
    PersistentSoftmax.cuh for rows of Nk elements: up to 2,048 of them and 8,192 bytes forward,
    1,024 and 4,096 bytes backward; a block a row (``cunn_SoftMax*``) beyond."""
    return w.nk <= (1024 if bwd else 2048) and w.nk * w.elem_bytes <= (4096 if bwd else 8192)


def warp_pieces(nk: int) -> tuple[np.ndarray, np.ndarray]:
    """The warp softmax's loads and stores of a row, one element a lane (``elements[i][it] =
    src[... + it * WARP_SIZE]``, the lanes past the row idle): pieces of 32 consecutive columns,
    the last ragged, as (first column, columns).  Each is one warp instruction, whose sectors
    the LSU counts apart: a row starting 16 bytes into a sector (rows of 2,000 bytes) makes
    every 64-byte piece span 3 sectors (H200 torch_edge: 78.5 sectors a row at N = 1,000, fp16,
    where the row spans 62.5)."""
    c0 = np.arange(0, nk, 32, dtype=np.int64)
    return c0, np.minimum(32, nk - c0)


class _Gemm:
    """C (M x N) = A (M x K) · B (K x N) of one program, output tiles tm x tn (rows x cols).

    ``a = (tensor, "rows")``: A's rows are the tensor's rows (K = its columns); ``(tensor, "cols")``:
    A = tensorᵀ (A's rows are its columns, K = its rows).  ``b = (tensor, "rows")``: B = tensorᵀ
    (C's columns are its rows); ``(tensor, "cols")``: C's columns are its columns (K = its rows).
    ``cr`` x ``cc``: the thread-block cluster (tiles along C's rows x along its columns); a band
    of A is shared by the cc tiles of a cluster row and multicast (read once for them), a band of
    B by the cr tiles of a cluster column; a partial cluster at the edge still reads once.
    """

    def __init__(self, m, n, k, a, b, c, tm, tn, bulk, cr=1, cc=1, *, eb: int):
        self.m, self.n, self.k, self.a, self.b, self.c, self.bulk, self.eb = m, n, k, a, b, c, bulk, eb
        self.r0, self.rn = block_rows(m, tm)
        self.c0, self.cn = block_rows(n, tn)
        self.tm, self.tn, self.cr, self.cc = tm, tn, cr, cc

    def _band(self, spec, starts, sizes, rows_of_k, weight):
        """The reads of an operand's band: rows ``starts`` .. of all K columns ("rows") or
        columns ``starts`` .. of all K rows ("cols"); by TMA in rows of at most 128 bytes, a
        piece of 128 bytes a K step ("rows") or of the tile's width ("cols"), as the unit asks."""
        t, how = spec
        if not self.bulk:
            yield read(t, starts, sizes, repeat=weight) if how == "rows" else read(t, 0, rows_of_k, starts, sizes,
                                                                                    repeat=weight)
            return
        if how == "rows":
            for c0, cn in zip(*self._pieces(0, self.k)[:2]):
                yield bulk_read(t, starts, sizes, c0, cn, repeat=weight)
            return
        c0, cn, owner = self._pieces(starts, sizes)
        yield bulk_read(t, 0, rows_of_k, c0, cn, repeat=np.broadcast_to(weight, np.shape(sizes) or (1,))[owner])

    def _loads(self) -> tuple[int, int]:
        """How many times each band of A and of B is read: ⌈column tiles / cc⌉, ⌈row tiles / cr⌉."""
        return cdiv(len(self.c0), self.cc), cdiv(len(self.r0), self.cr)

    def _c_pieces(self, c0, cn) -> tuple[np.ndarray, np.ndarray]:
        """(first column, columns) of the pieces in which C's tile columns c0 .. c0 + cn - 1 are
        stored: the tile whole through the LSU; by TMA, pieces of 128 bytes from the tile's first
        column, one swizzle row each, each counting the sectors its bytes span (measured on an
        H200: the 120 GEMMs of analysis/data/h200/tma_box_sweep, L2 write sectors to the sector,
        where whole tile rows give up to 11.5% too few on rows that start inside a sector; its
        tiles are whole multiples of 64 columns or the matrix's only tile, so pieces from the
        tile's first column and pieces at multiples of 64 columns are not told apart)."""
        if not self.bulk:
            return np.atleast_1d(np.asarray(c0, dtype=np.int64)), np.atleast_1d(np.asarray(cn, dtype=np.int64))
        return self._pieces(c0, cn)[:2]

    def _pieces(self, c0, cn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Column runs c0 .. c0 + cn - 1 cut into pieces of one TMA box row (BOX_ROW_BYTES) from
        each run's first column: (first column, columns, index of the run) of each piece."""
        c0, cn = np.atleast_1d(np.asarray(c0, dtype=np.int64)), np.atleast_1d(np.asarray(cn, dtype=np.int64))
        p = max(1, BOX_ROW_BYTES // self.eb)
        k = cdiv(cn, p)
        owner = np.repeat(np.arange(cn.size), k)
        first = c0[owner] + (np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)) * p
        return first, np.minimum(p, c0[owner] + cn[owner] - first), owner

    def counts(self):
        na, nb = self._loads()
        rc, cc = classes(self.r0, self.rn), classes(self.c0, self.cn)
        yield from self._band(self.a, rc[0], rc[1], self.k, rc[2] * na)
        yield from self._band(self.b, cc[0], cc[1], self.k, cc[2] * nb)
        wr = bulk_write if self.bulk else write
        pc = classes(*self._c_pieces(self.c0, self.cn))
        yield wr(self.c, rc[0][:, None], rc[1][:, None], pc[0][None, :], pc[1][None, :],
                 repeat=rc[2][:, None] * pc[2][None, :])

    def accesses(self):
        wr = bulk_write if self.bulk else write
        for i in range(len(self.r0)):
            for j in range(len(self.c0)):
                if j % self.cc == 0:  # the first tile of its cluster row loads (multicasts) A's band
                    yield from self._band(self.a, self.r0[i], self.rn[i], self.k, 1)
                if i % self.cr == 0:
                    yield from self._band(self.b, self.c0[j], self.cn[j], self.k, 1)
                pc = self._c_pieces(self.c0[j], self.cn[j])
                yield wr(self.c, self.r0[i], self.rn[i], pc[0], pc[1])

    def received_sectors(self, eb: int, slices: int, kstep: int = 64) -> int:
        """Sectors of A and B the SMs receive over ``slices`` programs when the operands come by
        TMA (``bulk``): the sum of :meth:`received_by_operand`."""
        return sum(self.received_by_operand(eb, slices, kstep))

    def received_by_operand(self, eb: int, slices: int, kstep: int = 64) -> tuple[int, int]:
        """(A's, B's) sectors the SMs receive over ``slices`` programs when the operands come by
        TMA (``bulk``), by :mod:`flashsim.tma`'s rules.  The grid is padded to whole clusters
        (⌈row tiles / cr⌉·cr x ⌈column tiles / cc⌉·cc CTAs), and every CTA, those past the
        matrix's edge included, receives for each K step (``kstep`` elements) a box of A tm rows
        by kstep columns and one of B tn by kstep, of which the parts past M, N or K are zeros; a
        box row wider than 128 bytes (a transposed operand's tile, tn or tm columns, or a K step
        over 128 bytes) comes as pieces of 128 bytes, one swizzle row each.  A band read by one
        CTA counts each box row's in-bounds sectors where they lie plus a sector for each 32
        bytes of zeros
        (:func:`flashsim.tma.box_row_sectors`); a multicast band (A where cc > 1, B where cr > 1)
        counts once per receiving CTA, by :func:`flashsim.tma.multicast_row_sectors`.  Measured on
        an H200: analysis/data/h200/torch_tma, torch_edge, tma_box_sweep, tma_mc_probe."""
        kp = cdiv(self.k, kstep) * kstep
        prt = cdiv(len(self.r0), self.cr) * self.cr
        pct = cdiv(len(self.c0), self.cc) * self.cc

        def boxes(spec, width, tiles, extent, multicast):
            """Sectors of one receiving of ``tiles`` boxes of an operand, summed over the slices:
            its tensor is extent x K ("rows": a box is width rows by kstep columns, per K step) or
            K x extent ("cols": kstep rows by width columns), a box row in pieces of at most 128
            bytes, slices back to back."""
            if spec[1] == "rows":  # a box row: kstep columns of a row, at each K step
                row = np.arange(tiles * width, dtype=np.int64)[:, None]
                first, span = np.arange(0, kp, kstep, dtype=np.int64), kstep
                pitch, live = self.k, row < extent
            else:  # a box row: the tile's width columns of a K row, at each tile
                row = np.arange(kp, dtype=np.int64)[:, None]
                first, span = np.arange(tiles, dtype=np.int64) * width, width
                pitch, live = extent, row < self.k
            piece = max(1, min(span, BOX_ROW_BYTES // eb))  # columns of a box row
            off = np.arange(0, span, piece, dtype=np.int64)
            c0 = (first[:, None] + off[None, :]).reshape(1, -1)
            cols = np.tile(np.minimum(piece, span - off), len(first))[None, :]
            shape = np.broadcast_shapes(row.shape, c0.shape)
            start = np.broadcast_to(row * pitch * eb + c0 * eb, shape)
            inb = np.broadcast_to(np.where(live, np.clip(pitch - c0, 0, cols), 0), shape)
            cols = np.broadcast_to(cols, shape)
            base = np.arange(slices, dtype=np.int64) * (extent * self.k * eb) % 128  # a slice's first byte
            rule = multicast_row_sectors if multicast else box_row_sectors
            total = 0
            for b0, count in zip(*np.unique(base, return_counts=True)):
                for c in np.unique(cols):
                    m = cols == c
                    got = rule(start[m] + b0, inb[m] * eb, int(c) * eb)
                    total += int(count) * int(got.sum())
            return total
        return (pct * boxes(self.a, self.tm, prt, self.m, self.cc > 1),
                prt * boxes(self.b, self.tn, pct, self.n, self.cr > 1))

    def elements(self) -> dict[tuple[str, str], int]:
        """The same counts by formula: A read ⌈(N/tn)/cc⌉ times, B ⌈(M/tm)/cr⌉ times, C once."""
        na, nb = self._loads()
        rk, wk = ("bulk_read", "bulk_write") if self.bulk else ("read", "write")
        return {(self.a[0], rk): na * self.m * self.k, (self.b[0], rk): nb * self.n * self.k,
                (self.c, wk): self.m * self.n}


def _parts(w: Workload, pass_: str, tiles: str, clusters: str = "1x1"):
    """(tensors, [(launch name, kind, payload)]) of a pass: kind "gemm" (a _Gemm), "ew" (reads,
    writes: whole tensors) or "tril"."""
    eb = w.elem_bytes
    nq, nk, d, bh = w.nq, w.nk, w.d, w.bh
    bulk = w.dtype != "fp32"
    t = {}

    def mat(name, rows, cols, e=eb, slices=bh):
        t[name] = TensorLayout(name, rows, cols, e, slices)

    for n in ("Q", "Qs", "O", "dO", "dQs", "dQ"):
        mat(n, nq, d)
    for n in ("K", "V", "dV"):
        mat(n, nk, d)
    for n in ("S", "Sm", "P", "dP", "T", "dS", "dSm"):
        mat(n, nq, nk)
    mat("dKT", d, nk)
    for n in ("Mask1", "Mask"):  # tril's view: rows of 8 bytes (a thread's chunk)
        mat(n, nq * nk // 8, 8, 1, 1)
    mat("NotMask", nq, nk, 1, 1)
    parts = []
    causal = w.causal

    def gemm(m, n, k, a, b, c, tile, cluster):
        return _Gemm(m, n, k, a, b, c, *tile, bulk, *cluster, eb=eb)

    if pass_ == "fwd":
        tl, cl = parse_tiles(tiles, 2), parse_tiles(clusters, 2, "gemm_clusters")
        parts.append(("scale", "ew", (["Q"], ["Qs"])))
        parts.append(("gemm_qk", "gemm", gemm(nq, nk, d, ("Qs", "rows"), ("K", "rows"), "S", tl[0], cl[0])))
        s = "S"
        if causal:  # clone (a memcpy, no launch), then masked_fill_ of the clone in place
            parts += [("mask_ones", "ew", ([], ["Mask1"])), ("mask_tril", "tril", None),
                      ("mask_not", "ew", (["Mask"], ["NotMask"])),
                      ("masked_fill", "fill", (["Sm", "NotMask"], ["Sm"]))]
            s = "Sm"
        parts.append(("softmax", "ew", ([s], ["P"])))
        parts.append(("gemm_pv", "gemm", gemm(nq, d, nk, ("P", "rows"), ("V", "cols"), "O", tl[1], cl[1])))
    else:  # autograd's order: each matmul's second operand's gradient first
        tl, cl = parse_tiles(tiles, 4), parse_tiles(clusters, 4, "gemm_clusters")
        parts.append(("gemm_dv", "gemm", gemm(nk, d, nq, ("P", "cols"), ("dO", "cols"), "dV", tl[0], cl[0])))
        parts.append(("gemm_dp", "gemm", gemm(nq, nk, d, ("dO", "rows"), ("V", "rows"), "dP", tl[1], cl[1])))
        parts.append(("softmax_mul", "ew", (["dP", "P"], ["T"])))
        parts.append(("softmax_bwd", "ew", (["T", "P"], ["dS"])))
        ds = "dS"
        if causal:  # masked_fill's backward: clone of dS (a memcpy, no launch), masked_fill_ in place
            parts.append(("mask_bwd_fill", "fill", (["dSm", "NotMask"], ["dSm"])))
            ds = "dSm"
        parts.append(("gemm_dk", "gemm", gemm(d, nk, nq, ("Qs", "cols"), (ds, "cols"), "dKT", tl[2], cl[2])))
        parts.append(("gemm_dq", "gemm", gemm(nq, d, nk, (ds, "rows"), ("K", "cols"), "dQs", tl[3], cl[3])))
        parts.append(("scale_bwd", "ew", (["dQs"], ["dQ"])))
    used = set()
    for _, kind, p in parts:
        if kind == "gemm":
            used |= {p.a[0], p.b[0], p.c}
        elif kind in ("ew", "fill"):
            used |= set(p[0]) | set(p[1])
        else:
            used |= {"Mask1", "Mask"}
    return {k: v for k, v in t.items() if k in used}, parts


def _pass_parts(w: Workload, pass_: str, options: dict):
    """(tensors, parts, (gemm_tiles, gemm_clusters, sms)) of a pass after the checks every entry
    point makes: the options, the workload, the pass."""
    opts = _options(options)
    _check(w)
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: not modelled")
    return (*_parts(w, pass_, opts[0], opts[1]), opts)


def tril_active(w: Workload) -> np.ndarray:
    """Chunks of 8 entries ``tril(nk - nq)`` loads in each row r: those starting at a kept column,
    8c <= r + Nk - Nq, so min(Nk/8, ⌊(r + Nk - Nq)/8⌋ + 1), or none when r + Nk - Nq < 0."""
    t = np.arange(w.nq, dtype=np.int64) + w.nk - w.nq
    return np.where(t < 0, 0, np.minimum(w.nk // 8, t // 8 + 1))


def _warp_pieces(w: Workload, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Chunks 0 .. chunks_r - 1 of each row r, in the global chunk numbering (row r starts at chunk
    r·Nk/8), cut at warp boundaries (multiples of 32): (first chunk, chunk count) of each piece."""
    cpr = w.nk // 8
    base = np.arange(w.nq, dtype=np.int64) * cpr
    first_w, last_w = base // 32, (base + np.maximum(chunks, 1) - 1) // 32
    count = np.where(chunks > 0, last_w - first_w + 1, 0)
    row = np.repeat(np.arange(w.nq, dtype=np.int64), count)
    k = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    wstart = (first_w[row] + k) * 32
    lo = np.maximum(wstart, base[row])
    hi = np.minimum(wstart + 32, base[row] + chunks[row])
    return lo, hi - lo


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    tensors, parts, (tiles, clusters, sms) = _pass_parts(w, pass_, options)
    check_programs(w.bh, "batch*heads")
    slices = {n: (np.zeros(w.bh, dtype=np.int64) if tensors[n].slices == 1 else np.arange(w.bh, dtype=np.int64))
              for n in tensors}
    launches = []
    for name, kind, p in parts:
        if kind == "gemm":
            launches.append(Launch(name, w.bh, slices, p.accesses, p.counts))
        elif kind == "ew":
            # whole rows; the warp softmax's loads and stores a warp's 32 consecutive columns each
            warp = name in ("softmax", "softmax_bwd") and warp_softmax(w, name == "softmax_bwd")
            cols = warp_pieces(w.nk) if warp else (0, None)

            def acc(p=p, cols=cols):
                for r in p[0]:
                    yield read(r, 0, tensors[r].rows, *cols)
                for wt in p[1]:
                    yield write(wt, 0, tensors[wt].rows, *cols)
            programs = 1 if all(tensors[n].slices == 1 for n in p[0] + p[1]) else w.bh
            launches.append(Launch(name, programs, {n: s[:programs] for n, s in slices.items()}, acc))
        elif kind == "fill":  # masked_fill_(mask) in place: the input's loads of the last iteration kept only
            def fill(p=p):
                x, mask = p[0]
                blk = fill_block(w)
                cols = np.arange(w.nk // blk, dtype=np.int64) * blk
                yield read(x, 0, w.nq, cols, blk - 128)  # iterations 0 .. vt-2: every lane loads
                kr, kc, kn = fill_kept(w)
                yield read(x, kr, 1, kc, kn)
                yield read(mask, 0, w.nq)
                yield write(x, 0, w.nq)
            launches.append(Launch(name, w.bh, slices, fill))
        else:  # tril: per-thread 8-byte chunks, loads where the chunk starts in the triangle
            def tril():
                r0, rn = _warp_pieces(w, tril_active(w))
                yield read("Mask1", r0, rn, 0, 8, per_thread_rows=True)
                r0, rn = _warp_pieces(w, np.full(w.nq, w.nk // 8, dtype=np.int64))
                yield write("Mask", r0, rn, 0, 8, per_thread_rows=True)
            launches.append(Launch(name, 1, {n: s[:1] for n, s in slices.items()}, tril))
    sched = Schedule("torch_naive", tensors, launches,
                     {"pass": pass_, "gemm_tiles": tiles, "gemm_clusters": clusters,
                      "kernels": [KERNEL_NAMES[ln.name] for ln in launches]})
    return attach(sched, "torch_naive", w, None, (parts, sms))


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    tensors, parts, _ = _pass_parts(w, pass_, options)
    out: dict[tuple[str, str], int] = {}

    def add(k, n):
        out[k] = out.get(k, 0) + int(n)

    for _, kind, p in parts:
        if kind == "gemm":
            for k, n in p.elements().items():
                add(k, w.bh * n)
        elif kind == "ew":  # one program per head, or one for the (Nq, Nk) mask kernels alone
            programs = 1 if all(tensors[n].slices == 1 for n in p[0] + p[1]) else w.bh
            for r in p[0]:
                add((r, "read"), programs * tensors[r].rows * tensors[r].cols)  # a shared mask: per head
            for wt in p[1]:
                add((wt, "write"), programs * tensors[wt].rows * tensors[wt].cols)
        elif kind == "fill":
            x, mask = p[0]
            every = w.nq * w.nk // fill_block(w) * (fill_block(w) - 128)  # iterations 0 .. vt-2
            add((x, "read"), w.bh * (every + int(fill_kept(w)[2].sum())))
            add((mask, "read"), w.bh * w.nq * w.nk)
            add((x, "write"), w.bh * w.nq * w.nk)
        else:
            add(("Mask1", "read"), 8 * int(tril_active(w).sum()))
            add(("Mask", "write"), w.nq * w.nk)
    return out


def received_read_sectors(w: Workload, pass_: str, ksteps="64", **options) -> list[int | None]:
    """Per launch of the pass: the read sectors its SMs receive from L2 (what Nsight Compute
    counts as ``l1tex__m_xbar2l1tex_read_sectors``) for the TMA GEMMs (:meth:`_Gemm.received_sectors`:
    the boxes of a cluster-padded grid by :mod:`flashsim.tma`'s rules, K in steps of ``ksteps``
    elements, one for all GEMMs or
    a comma-separated list, one per GEMM launch, as nvjet's names give them:
    ``nvjet_sm90_hsh_64x8_64x16_``, K step 64), None for the other launches (their SMs receive
    what the schedule loads, without multicast)."""
    _, parts, _ = _pass_parts(w, pass_, options)
    gemms = sum(kind == "gemm" for _, kind, _ in parts)
    ks = str(ksteps).split(",")
    if not all(k.strip().isdigit() and 0 < int(k) <= 256 for k in ks) or len(ks) not in (1, gemms):
        raise ValueError(f"ksteps={ksteps!r}: one integer from 1 to 256 (a TMA box's side) or {gemms} "
                         "(one per GEMM launch)")
    step = iter([int(k) for k in ks] * (gemms if len(ks) == 1 else 1))  # the GEMMs' K steps in launch order
    out = []
    for _, kind, p in parts:
        k = next(step) if kind == "gemm" else None
        out.append(p.received_sectors(w.elem_bytes, w.bh, k) if kind == "gemm" and p.bulk else None)
    return out


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None, **options):
    if tiling is not None:
        raise ValueError("tiling: torch_naive has no tiles of its own (cuBLAS tiles: the gemm_tiles option)")
    return None, dict(options)


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[None, None]:
    return None, None


__all__ = ["schedule", "closed_form", "received_read_sectors", "plan", "blocks",
           "PASSES", "NEEDS_TILING", "TILING_TEXT", "DESCRIPTION",
           "OPTIONS", "KERNEL_NAMES", "GEMMS", "parse_tiles", "cdiv", "fill_block", "fill_kept", "tril_active",
           "warp_softmax", "warp_pieces"]
