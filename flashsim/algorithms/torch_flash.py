"""PyTorch's SDPA flash backend (FlashAttention-2 as vendored in torch 2.11) on Hopper (sm_90).

``torch.nn.functional.scaled_dot_product_attention`` with the flash backend runs the FlashAttention-2
kernels PyTorch vendors in ``aten/src/ATen/native/transformers/cuda/flash_attn/``.  This module
states, launch by launch, what those kernels move for (B, H, N, d) contiguous inputs on an H100,
derived from that source (``flash_api.cpp``, ``flash_fwd_launch_template.h``,
``flash_bwd_launch_template.h``, ``flash_fwd_kernel.h``, ``flash_bwd_kernel.h``,
``flash_bwd_preprocess_kernel.h``), not fitted to measurements.

Tiles (``Flash_fwd_kernel_traits`` / ``Flash_bwd_kernel_traits`` chosen by ``run_mha_fwd_hdimXX``
and ``run_mha_bwd_hdimXX`` without dropout on sm_90, whose opt-in shared memory is >= 144 KB);
fp16 and bf16 alike::

    head dim   forward Bm x Bn   backward Bm x Bn, warps, AtomLayoutMSdP
       32        128 x 128         128 x 128, 8, 4
       64        128 x 128         128 x 128, 8, 4
       96        128 x 64           64 x 128, 8, 2
      128        128 x 64           64 x 128, 8, 2

Forward, ``flash_fwd_kernel``, grid (⌈Nq/Bm⌉, B, H), one program per query block::

    load Q_i (rows past Nq predicated off)
    for n = n_block_max - 1 .. 0: load K_n, V_n        (n_block_max = ⌈Nk/Bn⌉, causal:
                                                         min(⌈Nk/Bn⌉, ⌈((i+1)·Bm + Nk - Nq)/Bn⌉))
    store O_i; store LSE_i                              (fp32, (B, H, Nq))

LSE is stored by the threads of MMA column 0: each warp's store instruction writes 8 consecutive
rows (32 bytes), so its requests are 8-row groups (``_groups``).  mha_fwd would switch to the
split-KV kernels when B·H·⌈Nq/64⌉ < 0.8 · 2 · SMs (``num_splits_heuristic``); those are not modelled
and such a workload is refused (``sms`` option, 132 for the H100 SXM).

Backward (``_scaled_dot_product_flash_attention_backward_cuda`` -> ``_flash_attention_backward``
-> ``mha_bwd`` -> ``run_flash_bwd_seqk_parallel``), in launch order:

1. ``contiguous()`` of dO and 2. of O: the wrapper hands FlashAttention the (B, N, H, d) views
   (``transpose(1, 2)``) of the (B, H, N, d) tensors and ``_flash_attention_backward`` makes them
   contiguous: one elementwise copy kernel each, reading the tensor and writing a (B, N, H, d) copy
   (``dO_t``, ``O_t``).  Every head row is whole 32-byte sectors (d·E a multiple of 32), so the copy's
   sectors are those of whole slices whatever the order it walks them in.
3. ``flash_bwd_dot_do_o_kernel`` (grid (⌈Nq/Bm⌉, B, H)): loads dO_t_i, O_t_i (rows past Nq
   predicated off); stores D_i = rowsum(dO ∘ O) for all Bm rows (``softmax_d`` is (B, H, Nq
   rounded up to 128), fp32) by one thread per 8-thread row group: a warp's store writes 4
   consecutive rows (16 bytes), so D's store requests are 4-row groups; and zeroes the Bm x d
   fp32 tile of ``dq_accum`` ((B, Nq rounded to 128, H, d rounded to 32), fp32) it owns.
4. ``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`` (grid (⌈Nk/Bn⌉, B, H), one program per key
   block j of each QUERY head)::

       load K_j, V_j
       for i = ⌈Nq/Bm⌉ - 1 down to m_block_min(j)        (causal: max(0, ⌊(j·Bn + Nq - Nk)/Bm⌋))
           load dO_t_i, Q_i; load LSE_i and D_i (fp32)
           atomicAdd the Bm x d fp32 partial dQ into dq_accum_i      (reductions, all Bm rows)
       store dK_j, dV_j

   LSE and D are read by the threads that hold MMA rows (``taccScS_row``): a warp's load
   instruction reads 8 consecutive rows, and the kNWarps / AtomLayoutMSdP warps that share those
   rows each make the request: 8-row groups, each requested 2 (d <= 64) or 4 (d > 64) times.  LSE
   rows past Nq are predicated off, D's are not (D is padded).  With GQA (H > Hkv) each query head's
   program writes its own dK, dV into ``dk_expanded``/``dv_expanded`` ((B, Nk, H, d)).
5. ``flash_bwd_convert_dq_kernel`` (grid (⌈Nq/Bm⌉, B, H)): loads the Bm x d fp32 tile of
   dq_accum (all rows), stores dQ_i (rows past Nq predicated off).
6. With GQA, 7.: ``at::sum_out`` of dk_expanded and dv_expanded over each kv head's group (a
   ``reduce_kernel`` each): reads the expanded gradient, writes dK (dV).  ``Reduce.cuh`` for this
   shape (the group dim reduced, its stride d > 1: not the fastest input dim): "vectorize
   output" with ``output_vec_size`` = 4 (``get_output_vec_size``: 4 divides d and the strides),
   block (32, 4), every thread one vector of 4 consecutive outputs, all the group's inputs; it
   loads each input vector whole (8 bytes, a warp 256 contiguous bytes: coalesced) but stores
   the 4 outputs one element at a time (``set_results_to_output``): each of the 4 store
   instructions of a warp spans the warp's 256 bytes, 8 sectors, so the stores ask for 4x the
   sectors they hold.  They are ``per_thread_rows`` writes of dK viewed as rows of 4 elements
   (``dK_vec``, ``dV_vec``).

Tensors: ``dQaccum`` (fp32 rows of d, Nq rounded up to 128 per head), ``D`` (fp32, Nq rounded up
to 128 per head), ``dO_t``/``O_t`` (the contiguous copies), ``dK_exp``/``dV_exp`` (GQA).  Their
real layouts interleave heads ((B, N, H, ·)); as every row is whole sectors, sector counts are
those of the per-head layout used here.  The element counts of LSE and D include the repeated
requests (they are what the load/store unit is asked for).  Loads, stores and the dQ reductions
are counted apart (``flashsim.traffic`` classes ``load``, ``store``, ``reduction``).
"""

from __future__ import annotations

import numpy as np

from ..blocks import attach
from ..config import STAT_BYTES, Tiling, Workload, cdiv
from ..traffic import Launch, Schedule, TensorLayout, read, reduction, write
from ._common import block_rows, check_programs, classes

PASSES = ("fwd", "bwd")
NEEDS_TILING = False
TILING_TEXT = "kernel tiles Bm = {block_m}, Bn = {block_n} (forward; from the head dim)"
DESCRIPTION = ("PyTorch SDPA flash backend (FlashAttention-2 vendored in torch 2.11) on sm_90: its launches, "
               "tiles, padding and dQ atomics")
OPTIONS: dict[str, tuple[object, str]] = {
    "sms": (132, "streaming multiprocessors of the GPU (split-KV heuristic of mha_fwd; 132: H100 SXM)"),
}
#: The FLOP model of the tiled FlashAttention-2 schedule applies (flashsim.flops).
FLOPS_AS = "flash2"

#: head dim -> (fwd Bm, fwd Bn, bwd Bm, bwd Bn, bwd warps, AtomLayoutMSdP) on sm_90, no dropout
TRAITS = {32: (128, 128, 128, 128, 8, 4), 64: (128, 128, 128, 128, 8, 4), 96: (128, 64, 64, 128, 8, 2),
          128: (128, 64, 64, 128, 8, 2)}

#: Outputs per thread of the GQA ``sum_out`` reduce kernels (``output_vec_size``: 4 for every head
#: dim of TRAITS, all multiples of 4).
SUM_VEC = 4

#: The ncu kernel-name pattern (a regular expression, searched) of each launch, by launch name.
KERNEL_NAMES = {
    "sdpa_flash_fwd": r"flash_fwd_kernel",
    "contiguous_dO": r"elementwise_kernel|copy",
    "contiguous_O": r"elementwise_kernel|copy",
    "flash_bwd_dot_do_o": r"flash_bwd_dot_do_o_kernel",
    "flash_bwd_dq_dk_dv": r"flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
    "flash_bwd_convert_dq": r"flash_bwd_convert_dq_kernel",
    "sum_dK": r"reduce_kernel",
    "sum_dV": r"reduce_kernel",
}


def _options(options: dict) -> int:
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: torch_flash takes only {sorted(OPTIONS)}")
    sms = options.get("sms", OPTIONS["sms"][0])
    if isinstance(sms, bool) or not isinstance(sms, int | np.integer) or sms < 1:
        raise ValueError(f"sms={sms!r}: must be a positive integer")
    return int(sms)


def check_workload(w: Workload, what: str = "torch_flash") -> None:
    """The workloads the vendored FlashAttention-2 runs as modelled here (ValueError otherwise)."""
    if w.dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype={w.dtype!r}: {what} (FlashAttention-2) runs fp16 and bf16 only")
    if w.d not in TRAITS:
        raise ValueError(f"head_dim={w.d}: {what} models head dims {sorted(TRAITS)} (the kernels' own sizes; "
                         "others are padded to the next one, which is not modelled)")
    if w.block_mask is not None:
        raise ValueError(f"block_mask: {what} has no block-sparse mask")
    if w.causal and w.nq > w.nk:
        raise ValueError(f"seq_len_q={w.nq} > seq_len_k={w.nk} with causal: query blocks that see no key take "
                         "an early exit that is not modelled")


def num_splits(w: Workload, sms: int) -> int:
    """``num_splits_heuristic`` of flash_api.cpp (``set_params_splitkv``, no dropout): 1 means the
    plain forward kernel runs."""
    block_n = 256 if w.d <= 64 else (128 if w.d <= 128 else 64)
    n_blocks, work, slots = cdiv(w.nk, block_n), w.bh * cdiv(w.nq, 64), 2 * sms
    if work >= 0.8 * slots:
        return 1
    most = min(128, slots, n_blocks)
    eligible = [s == 1 or cdiv(n_blocks, s) != cdiv(n_blocks, s - 1) for s in range(1, most + 1)]
    eff = [0.0 if not ok else (work * s / slots) / np.ceil(work * s / slots) for s, ok in
           zip(range(1, most + 1), eligible)]
    best = max(eff)
    for s in range(1, most + 1):
        if eligible[s - 1] and eff[s - 1] >= 0.85 * best:
            return s
    return 1


def tiles(w: Workload) -> tuple[int, int, int, int, int, int]:
    """(fwd Bm, fwd Bn, bwd Bm, bwd Bn, bwd warps, AtomLayoutMSdP) for the workload's head dim."""
    check_workload(w)
    return TRAITS[w.d]


def d_store_rows(d: int) -> int:
    """Rows of D one warp's store writes in dot_do_o: 32 threads / kGmemThreadsPerRow, where
    kGmemThreadsPerRow = kBlockKSmem / 8 (kBlockKSmem = 64 if 64 divides d, else 32)."""
    return 32 // ((64 if d % 64 == 0 else 32) // 8)


def _round(n: int, m: int) -> int:
    return cdiv(n, m) * m


def _groups(starts: np.ndarray, valid: np.ndarray, block: int, size: int, weight: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``size``-row request groups of blocks of ``block`` rows starting at ``starts`` with
    ``valid`` rows each (rows past it predicated off; a group with none makes no request), each
    block weighted ``weight``: flattened (group starts, group rows, weights)."""
    g = np.arange(0, block, size, dtype=np.int64)
    st = (starts[:, None] + g[None, :]).ravel()
    rows = np.clip(valid[:, None] - g[None, :], 0, size).ravel()
    wt = np.broadcast_to(np.asarray(weight, dtype=np.int64)[:, None], (len(starts), len(g))).ravel()
    keep = (rows > 0) & (wt > 0)
    return st[keep], rows[keep], wt[keep]


def fwd_key_blocks(w: Workload, bm: int, bn: int) -> np.ndarray:
    """n_block_max of each query block of the forward (the key blocks 0 .. n_block_max - 1 it loads)."""
    tm, tn = cdiv(w.nq, bm), cdiv(w.nk, bn)
    if not w.causal:
        return np.full(tm, tn, dtype=np.int64)
    i = np.arange(tm, dtype=np.int64)
    return np.clip(-(-((i + 1) * bm + w.nk - w.nq) // bn), 0, tn)


def bwd_first_query_block(w: Workload, bm: int, bn: int) -> np.ndarray:
    """m_block_min of each key block of the backward (it visits query blocks m_block_min .. last)."""
    tn = cdiv(w.nk, bn)
    if not w.causal:
        return np.zeros(tn, dtype=np.int64)
    tau = np.arange(tn, dtype=np.int64) * bn + w.nq - w.nk
    return np.maximum(0, np.where(tau >= 0, tau // bm, 0))


def _slices(w: Workload, names, kv_names=("K", "V", "dK", "dV")) -> dict[str, np.ndarray]:
    check_programs(w.bh, "batch*heads")
    p = np.arange(w.bh, dtype=np.int64)
    kv = (p // w.heads) * w.hkv + (p % w.heads) // w.group
    return {n: (kv if n in kv_names else p) for n in names}


def _forward(w: Workload, sms: int) -> Schedule:
    bm, bn = TRAITS[w.d][:2]
    splits = num_splits(w, sms)
    if splits > 1:
        raise ValueError(f"batch*heads*ceil(seq_len_q/64)={w.bh * cdiv(w.nq, 64)} < 0.8 * 2 * sms={sms}: mha_fwd "
                         f"would run the split-KV kernels ({splits} splits), which are not modelled")
    q0, qn = block_rows(w.nq, bm)
    k0, kn = block_rows(w.nk, bn)
    lim = fwd_key_blocks(w, bm, bn)
    seen_by = np.cumsum(np.bincount(lim, minlength=len(k0) + 1)[::-1])[::-1][1:]  # #{i : lim_i > j}

    def accesses():
        for i in range(len(q0)):
            yield read("Q", q0[i], qn[i])
            js = np.arange(lim[i] - 1, -1, -1)
            yield read("K", k0[js], kn[js])
            yield read("V", k0[js], kn[js])
            yield write("O", q0[i], qn[i])
            gs, gr, _ = _groups(q0[i:i + 1], qn[i:i + 1], bm, 8, np.ones(1, dtype=np.int64))
            yield write("L", gs, gr)

    def counts():
        qc = classes(q0, qn)
        kc = classes(k0, kn, seen_by)
        yield read("Q", qc[0], qc[1], repeat=qc[2])
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        yield write("O", qc[0], qc[1], repeat=qc[2])
        lc = classes(*_groups(q0, qn, bm, 8, np.ones(len(q0), dtype=np.int64)))
        yield write("L", lc[0], lc[1], repeat=lc[2])

    eb = w.elem_bytes
    tensors = {"Q": TensorLayout("Q", w.nq, w.d, eb, w.bh), "K": TensorLayout("K", w.nk, w.d, eb, w.batch * w.hkv),
               "V": TensorLayout("V", w.nk, w.d, eb, w.batch * w.hkv), "O": TensorLayout("O", w.nq, w.d, eb, w.bh),
               "L": TensorLayout("L", w.nq, 1, STAT_BYTES, w.bh)}
    launch = Launch("sdpa_flash_fwd", w.bh, _slices(w, tensors), accesses, counts)
    return Schedule("torch_flash", tensors, [launch], {"pass": "fwd", "block_m": bm, "block_n": bn,
                                                        "kernels": [KERNEL_NAMES["sdpa_flash_fwd"]]})


def _bwd_visits(w: Workload, bm: int, bn: int) -> np.ndarray:
    """How many key blocks visit each query block in the backward's main kernel."""
    first = bwd_first_query_block(w, bm, bn)
    return np.cumsum(np.bincount(first, minlength=cdiv(w.nq, bm)))[:cdiv(w.nq, bm)]


def _backward(w: Workload) -> Schedule:
    bm, bn, nwarps, atom_m = TRAITS[w.d][2:]
    reps = nwarps // atom_m  # warps that request the same LSE / D rows
    gqa = w.hkv != w.heads
    nq_r, d_r = _round(w.nq, 128), _round(w.d, 32)
    q0, qn = block_rows(w.nq, bm)
    k0, kn = block_rows(w.nk, bn)
    tm = len(q0)
    full = np.full(tm, bm, dtype=np.int64)
    first = bwd_first_query_block(w, bm, bn)
    visits = _bwd_visits(w, bm, bn)
    dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")
    eb = w.elem_bytes
    tensors = {
        "Q": TensorLayout("Q", w.nq, w.d, eb, w.bh), "K": TensorLayout("K", w.nk, w.d, eb, w.batch * w.hkv),
        "V": TensorLayout("V", w.nk, w.d, eb, w.batch * w.hkv), "O": TensorLayout("O", w.nq, w.d, eb, w.bh),
        "dO": TensorLayout("dO", w.nq, w.d, eb, w.bh), "L": TensorLayout("L", w.nq, 1, STAT_BYTES, w.bh),
        "dO_t": TensorLayout("dO_t", w.nq, w.d, eb, w.bh), "O_t": TensorLayout("O_t", w.nq, w.d, eb, w.bh),
        "D": TensorLayout("D", nq_r, 1, STAT_BYTES, w.bh), "dQaccum": TensorLayout("dQaccum", nq_r, d_r, 4, w.bh),
        "dQ": TensorLayout("dQ", w.nq, w.d, eb, w.bh),
        "dK": TensorLayout("dK", w.nk, w.d, eb, w.batch * w.hkv),
        "dV": TensorLayout("dV", w.nk, w.d, eb, w.batch * w.hkv),
    }
    if gqa:
        tensors["dK_exp"] = TensorLayout("dK_exp", w.nk, w.d, eb, w.bh)
        tensors["dV_exp"] = TensorLayout("dV_exp", w.nk, w.d, eb, w.bh)
        del tensors["dK"], tensors["dV"]  # written by sum_out through their views dK_vec, dV_vec
    slices = _slices(w, tensors)

    def copy(src, dst):
        def acc():
            yield read(src, 0, w.nq)
            yield write(dst, 0, w.nq)
        return acc

    def dot():
        for i in range(tm):
            yield read("dO_t", q0[i], qn[i])
            yield read("O_t", q0[i], qn[i])
            gs, gr, _ = _groups(q0[i:i + 1], full[:1], bm, d_store_rows(w.d), np.ones(1, dtype=np.int64))
            yield write("D", gs, gr)
            yield write("dQaccum", q0[i], bm, 0, w.d)

    def dot_counts():
        qc = classes(q0, qn)
        yield read("dO_t", qc[0], qc[1], repeat=qc[2])
        yield read("O_t", qc[0], qc[1], repeat=qc[2])
        dc = classes(*_groups(q0, full, bm, d_store_rows(w.d), np.ones(tm, dtype=np.int64)))
        yield write("D", dc[0], dc[1], repeat=dc[2])
        fc = classes(q0, full)
        yield write("dQaccum", fc[0], fc[1], 0, w.d, repeat=fc[2])

    def main():
        for j in range(len(k0)):
            yield read("K", k0[j], kn[j])
            yield read("V", k0[j], kn[j])
            for i in range(tm - 1, first[j] - 1, -1):
                yield read("dO_t", q0[i], qn[i])
                yield read("Q", q0[i], qn[i])
                one = np.full(1, reps, dtype=np.int64)
                gs, gr, gw = _groups(q0[i:i + 1], qn[i:i + 1], bm, 8, one)
                yield read("L", gs, gr, repeat=gw)
                gs, gr, gw = _groups(q0[i:i + 1], full[:1], bm, 8, one)
                yield read("D", gs, gr, repeat=gw)
                yield reduction("dQaccum", q0[i], bm, 0, w.d)
            yield write(dk, k0[j], kn[j])
            yield write(dv, k0[j], kn[j])

    def main_counts():
        kc = classes(k0, kn)
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        qc = classes(q0, qn, visits)
        yield read("dO_t", qc[0], qc[1], repeat=qc[2])
        yield read("Q", qc[0], qc[1], repeat=qc[2])
        lc = classes(*_groups(q0, qn, bm, 8, visits * reps))
        yield read("L", lc[0], lc[1], repeat=lc[2])
        dc = classes(*_groups(q0, full, bm, 8, visits * reps))
        yield read("D", dc[0], dc[1], repeat=dc[2])
        rc = classes(q0, full, visits)
        yield reduction("dQaccum", rc[0], rc[1], 0, w.d, repeat=rc[2])
        yield write(dk, kc[0], kc[1], repeat=kc[2])
        yield write(dv, kc[0], kc[1], repeat=kc[2])

    def convert():
        for i in range(tm):
            yield read("dQaccum", q0[i], bm, 0, w.d)
            yield write("dQ", q0[i], qn[i])

    def convert_counts():
        fc = classes(q0, full)
        yield read("dQaccum", fc[0], fc[1], 0, w.d, repeat=fc[2])
        qc = classes(q0, qn)
        yield write("dQ", qc[0], qc[1], repeat=qc[2])

    launches = [
        Launch("contiguous_dO", w.bh, slices, copy("dO", "dO_t")),
        Launch("contiguous_O", w.bh, slices, copy("O", "O_t")),
        Launch("flash_bwd_dot_do_o", w.bh, slices, dot, dot_counts),
        Launch("flash_bwd_dq_dk_dv", w.bh, slices, main, main_counts),
        Launch("flash_bwd_convert_dq", w.bh, slices, convert, convert_counts),
    ]
    if gqa:
        # at::sum_out over each kv head's group: one program per (batch, kv head) reads the group's
        # query heads' expanded rows and writes the kv head's gradient
        kvp = np.arange(w.batch * w.hkv, dtype=np.int64)
        lead = (kvp // w.hkv) * w.heads + (kvp % w.hkv) * w.group
        vec = SUM_VEC
        for src, out in (("dK_exp", "dK"), ("dV_exp", "dV")):
            view = f"{out}_vec"  # the kv head's gradient as rows of `vec` outputs, one thread each
            tensors[view] = TensorLayout(view, w.nk * w.d // vec, vec, eb, w.batch * w.hkv)

            def summed(src=src, view=view):
                yield read(src, 0, w.nk, slice_offset=np.arange(w.group, dtype=np.int64))
                yield write(view, 0, w.nk * w.d // vec, per_thread_rows=True)
            launches.append(Launch(f"sum_{out}", w.batch * w.hkv, {src: lead, view: kvp}, summed))
    return Schedule("torch_flash", tensors, launches,
                    {"pass": "bwd", "block_m": bm, "block_n": bn,
                     "kernels": [KERNEL_NAMES[n.name] for n in launches if n.name in KERNEL_NAMES]})


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    sms = _options(options)
    check_workload(w)
    if pass_ == "fwd":
        return attach(_forward(w, sms), "torch_flash", w, None)
    if pass_ == "bwd":
        return attach(_backward(w), "torch_flash", w, None)
    raise ValueError(f"pass_={pass_!r}: not modelled")


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    """Element counts by formula.  Forward: query block i loads min(⌈Nk/Bn⌉, ⌈((i+1)·Bm + Nk -
    Nq)/Bn⌉) key blocks (causal) or all; backward: query block i is visited by as many key blocks
    (the same count: key block j visits i iff j·Bn + Nq - Nk < (i+1)·Bm)."""
    _options(options)
    check_workload(w)
    bh, d, nq, nk = w.bh, w.d, w.nq, w.nk
    if pass_ == "fwd":
        bm, bn = TRAITS[d][:2]
        lim = fwd_key_blocks(w, bm, bn)
        kv_rows = int(np.minimum(lim * bn, nk).sum())  # blocks 0 .. lim-1 hold min(lim·Bn, Nk) rows
        return {("Q", "read"): bh * nq * d, ("K", "read"): bh * kv_rows * d, ("V", "read"): bh * kv_rows * d,
                ("O", "write"): bh * nq * d, ("L", "write"): bh * nq}
    if pass_ != "bwd":
        raise ValueError(f"pass_={pass_!r}: not modelled")
    bm, bn, nwarps, atom_m = TRAITS[d][2:]
    reps = nwarps // atom_m
    tm, tn = cdiv(nq, bm), cdiv(nk, bn)
    i = np.arange(tm, dtype=np.int64)
    visits = np.clip(-(-((i + 1) * bm + nk - nq) // bn), 0, tn) if w.causal else np.full(tm, tn)
    rows_i = np.minimum(bm, nq - i * bm)
    q_rows = int((visits * rows_i).sum())
    padded_rows = int(visits.sum()) * bm
    gqa = w.hkv != w.heads
    dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")
    out = {
        ("dO", "read"): bh * nq * d, ("dO_t", "write"): bh * nq * d,
        ("O", "read"): bh * nq * d, ("O_t", "write"): bh * nq * d,
        ("dO_t", "read"): bh * (nq + q_rows) * d, ("O_t", "read"): bh * nq * d,
        ("D", "write"): bh * tm * bm, ("dQaccum", "write"): bh * tm * bm * d,
        ("K", "read"): bh * nk * d, ("V", "read"): bh * nk * d,
        ("Q", "read"): bh * q_rows * d, ("L", "read"): bh * q_rows * reps, ("D", "read"): bh * padded_rows * reps,
        ("dQaccum", "reduction"): bh * padded_rows * d,
        (dk, "write"): bh * nk * d, (dv, "write"): bh * nk * d,
        ("dQaccum", "read"): bh * tm * bm * d, ("dQ", "write"): bh * nq * d,
    }
    if gqa:
        out.update({("dK_exp", "read"): bh * nk * d, ("dV_exp", "read"): bh * nk * d,
                    ("dK_vec", "write"): w.batch * w.hkv * nk * d, ("dV_vec", "write"): w.batch * w.hkv * nk * d})
    return out


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None, **options):
    """No M rule: the kernel's tiles follow from the head dim (TRAITS); a given tiling is refused."""
    if tiling is not None:
        raise ValueError("tiling: torch_flash runs the kernel's own tiles (from the head dim); give no block sizes")
    return None, dict(options)


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[int | None, int | None]:
    """The forward kernel's Bm, Bn (the backward's are in the schedule's meta)."""
    if w.d not in TRAITS:
        return None, None
    return TRAITS[w.d][0], TRAITS[w.d][1]


__all__ = ["schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "PASSES", "NEEDS_TILING", "DESCRIPTION",
           "OPTIONS", "TRAITS", "KERNEL_NAMES", "num_splits", "tiles"]
