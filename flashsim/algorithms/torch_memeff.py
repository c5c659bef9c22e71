"""PyTorch's SDPA memory-efficient backend (the xformers/CUTLASS ``fmha`` kernels vendored in torch
2.11, ``aten/src/ATen/native/transformers/cuda/mem_eff_attention``) on Hopper: the forward.

``dispatch_cutlassF`` runs the sm80 kernels on sm_90 (compute capability 80 <= cc < 100) and takes
the first whose ``kMaxK`` holds the head dim: ``AttentionKernel<T, Sm80, aligned, kQueriesPerBlock,
kKeysPerBlock, kMaxK>`` with (64, 64, 64) for d <= 64 (``fmha_cutlassF_*_aligned_64x64_rf_sm80``),
(64, 128, 128) for d <= 128 (``..._64x128_rf_sm80``), fp16, bf16 and fp32 alike; larger head dims
(the ``32x128_gmem`` kernel, which keeps its output accumulator in global memory) are not modelled.

``kernel_forward.h``, per (query block i of Bq rows, head, batch), one thread block::

    for each key block j of Bk keys (causal, top-left: keys below min(Nk, (i+1)·Bq) only):
        load Q_i and K_j (the MM0 iterators are built inside the key loop: Q is re-read for
        every key block), S = Q_i K_jᵀ, online softmax, load V_j, accumulate in registers
    store O_i (rows past Nq predicated off); store LSE_i when compute_log_sumexp

A causal key loop ends at min(Nk, (i+1)·Bq) keys, so its last K and V tiles hold only the keys
below that (the iterators' extent is clipped, not the whole Bk).  LSE (fp32, (B, H, ⌈Nq/32⌉·32))
is written by threads 0 .. Bq-1 in order, one float each, for the block's rows below ⌈Nq/32⌉·32
(rows past Nq get +inf); SDPA asks for it only when an input requires grad (option ``lse``).  Loads
use ``cp.async`` (LDGSTS) through the load/store unit.  Tensors as the rest of the package: O is
(B, N, H, d) in memory ((B, H, N, d) transposed), whose rows are whole sectors like the per-head
layout counted here.
"""

from __future__ import annotations

import numpy as np

from ..blocks import attach
from ..config import STAT_BYTES, Tiling, Workload, cdiv
from ..traffic import Launch, Schedule, TensorLayout, read, write
from ._common import block_rows, check_programs, classes

PASSES = ("fwd",)
NEEDS_TILING = False
TILING_TEXT = "kernel tiles Bq = {block_m}, Bk = {block_n} (from the head dim)"
DESCRIPTION = "PyTorch SDPA memory-efficient backend (CUTLASS fmha, sm80 kernels on sm_90): forward"
OPTIONS: dict[str, tuple[object, str]] = {
    "lse": (False, "store the logsumexp (SDPA does when an input requires grad)"),
}
FLOPS_AS = "flash2"
#: head dim limit -> (kQueriesPerBlock, kKeysPerBlock)
TILES = ((64, (64, 64)), (128, (64, 128)))
KERNEL_NAMES = {"fmha_cutlassF": r"fmha_cutlassF"}


def tiles(w: Workload) -> tuple[int, int]:
    for limit, t in TILES:
        if w.d <= limit:
            return t
    raise ValueError(f"head_dim={w.d}: torch_memeff models head dims up to 128 (beyond, the 32x128_gmem kernel)")


def _check(w: Workload, options: dict) -> bool:
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: torch_memeff takes only {sorted(OPTIONS)}")
    lse = options.get("lse", False)
    if not isinstance(lse, bool | np.bool_):
        raise ValueError(f"lse={lse!r}: must be a bool")
    if w.block_mask is not None:
        raise ValueError("block_mask: torch_memeff has no block-sparse mask")
    if w.hkv != w.heads:
        raise ValueError(f"kv_heads={w.hkv}: the memory-efficient backend takes no grouped-query attention")
    if w.causal and w.nq != w.nk:
        raise ValueError(f"seq_len_q={w.nq} != seq_len_k={w.nk} with causal: the kernel's mask is top-left "
                         "aligned, the package's bottom-right; not modelled")
    if w.d % (16 // w.elem_bytes):
        raise ValueError(f"head_dim={w.d}: the aligned kernels need rows of 16-byte multiples")
    tiles(w)
    return bool(lse)


def key_extent(w: Workload, bq: int) -> np.ndarray:
    """Keys each query block's loop covers: Nk, or min(Nk, (i+1)·Bq) when causal."""
    tr = cdiv(w.nq, bq)
    if not w.causal:
        return np.full(tr, w.nk, dtype=np.int64)
    return np.minimum(w.nk, (np.arange(tr, dtype=np.int64) + 1) * bq)


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    lse = _check(w, options)
    if pass_ != "fwd":
        raise ValueError(f"pass_={pass_!r}: torch_memeff models the forward only")
    check_programs(w.bh, "batch*heads")
    bq, bk = tiles(w)
    q0, qn = block_rows(w.nq, bq)
    keys = key_extent(w, bq)
    nblk = -(-keys // bk)
    lse_rows = cdiv(w.nq, 32) * 32
    lse_n = np.clip(lse_rows - q0, 0, bq)

    def accesses():
        for i in range(len(q0)):
            j0 = np.arange(nblk[i], dtype=np.int64) * bk
            jn = np.minimum(bk, keys[i] - j0)
            yield read("Q", np.full(len(j0), q0[i]), qn[i])
            yield read("K", j0, jn)
            yield read("V", j0, jn)
            yield write("O", q0[i], qn[i])
            if lse:
                yield write("L", q0[i], lse_n[i])

    def counts():
        qc = classes(q0, qn, nblk)
        yield read("Q", qc[0], qc[1], repeat=qc[2])
        # full key blocks j < nblk_i - 1 (Bk rows), and each query block's last one (keys_i - start)
        last0 = (nblk - 1) * bk
        full = np.cumsum(np.bincount(np.maximum(nblk - 1, 0), minlength=int(nblk.max()) + 1)[::-1])[::-1][1:]
        k0 = np.arange(len(full), dtype=np.int64) * bk
        st = np.concatenate([k0, last0])
        sz = np.concatenate([np.full(len(full), bk, dtype=np.int64), keys - last0])
        wt = np.concatenate([full, np.ones(len(q0), dtype=np.int64)])
        kc = classes(st, sz, wt)
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        oc = classes(q0, qn)
        yield write("O", oc[0], oc[1], repeat=oc[2])
        if lse:
            lc = classes(q0, lse_n)
            yield write("L", lc[0], lc[1], repeat=lc[2])

    eb = w.elem_bytes
    tensors = {"Q": TensorLayout("Q", w.nq, w.d, eb, w.bh), "K": TensorLayout("K", w.nk, w.d, eb, w.bh),
               "V": TensorLayout("V", w.nk, w.d, eb, w.bh), "O": TensorLayout("O", w.nq, w.d, eb, w.bh)}
    if lse:
        tensors["L"] = TensorLayout("L", lse_rows, 1, STAT_BYTES, w.bh)
    slices = {n: np.arange(w.bh, dtype=np.int64) for n in tensors}
    launch = Launch("fmha_cutlassF", w.bh, slices, accesses, counts)
    sched = Schedule("torch_memeff", tensors, [launch], {"pass": "fwd", "block_m": bq, "block_n": bk, "lse": lse})
    return attach(sched, "torch_memeff", w, None)


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    """Q_i is read once per key block its loop visits (⌈keys_i/Bk⌉), K and V rows once per query
    block for each key it covers (keys_i), O once; LSE min(Bq, ⌈Nq/32⌉·32 - i·Bq) rows a block."""
    lse = _check(w, options)
    if pass_ != "fwd":
        raise ValueError(f"pass_={pass_!r}: torch_memeff models the forward only")
    bq, bk = tiles(w)
    keys = key_extent(w, bq)
    i = np.arange(len(keys), dtype=np.int64)
    rows = np.minimum(bq, w.nq - i * bq)
    bh, d = w.bh, w.d
    out = {("Q", "read"): bh * int((-(-keys // bk) * rows).sum()) * d, ("K", "read"): bh * int(keys.sum()) * d,
           ("V", "read"): bh * int(keys.sum()) * d, ("O", "write"): bh * w.nq * d}
    if lse:
        out[("L", "write")] = bh * int(np.clip(cdiv(w.nq, 32) * 32 - i * bq, 0, bq).sum())
    return out


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None, **options):
    if tiling is not None:
        raise ValueError("tiling: torch_memeff runs the kernel's own tiles (from the head dim); give no block sizes")
    return None, dict(options)


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[int | None, int | None]:
    for limit, t in TILES:
        if w.d <= limit:
            return t
    return None, None


__all__ = ["schedule", "closed_form", "plan", "blocks", "PASSES", "NEEDS_TILING", "TILING_TEXT", "DESCRIPTION",
           "OPTIONS", "KERNEL_NAMES", "TILES", "tiles", "key_extent"]
