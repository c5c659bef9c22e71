"""PyTorch's SDPA cuDNN backend on Hopper, forward: an ESTIMATE of its bulk (TMA) traffic.

cuDNN's fused attention kernels on sm_90 load their tiles with TMA, so nothing passes the
load/store unit (0 LSU bytes) and only the L2 level can be compared.  Their source is not public;
this schedule states the bytes a FlashAttention-2-style forward must move, the tile re-reads
included, and no more:

    per (batch, head, query block i of Bq rows):
        bulk-load Q_i once; bulk-load K_j, V_j for every key block j of Bk keys it sees
        (causal: key blocks below ⌈(i+1)·Bq / Bk⌉); bulk-store O_i; store LSE_i (option ``lse``,
        SDPA asks for it when an input requires grad)

``block_q`` and ``block_k`` (default 128 x 128) are options because the kernel's own tiles are not
known here; every traffic entry is class ``bulk`` (``flashsim.traffic.bulk_read``/``bulk_write``),
which the walker counts apart from loads and stores.  The estimate leaves out anything cuDNN
moves besides these tiles (e.g. multicast within a cluster would lower the L2 reads).
"""

from __future__ import annotations

import numpy as np

from ..config import STAT_BYTES, Tiling, Workload, cdiv
from ..traffic import Launch, Schedule, TensorLayout, bulk_read, bulk_write
from ._common import block_rows, check_programs, classes

PASSES = ("fwd",)
NEEDS_TILING = False
TILING_TEXT = "assumed tiles Bq = {block_m}, Bk = {block_n} (options block_q, block_k)"
DESCRIPTION = "PyTorch SDPA cuDNN backend forward: an estimate of its TMA (bulk) traffic at the L2 level"
OPTIONS: dict[str, tuple[object, str]] = {
    "block_q": (128, "query rows per tile assumed for cuDNN's kernel"),
    "block_k": (128, "keys per tile assumed for cuDNN's kernel"),
    "lse": (False, "store the logsumexp (SDPA does when an input requires grad)"),
}
FLOPS_AS = "flash2"
KERNEL_NAMES = {"cudnn_sdpa_fwd": r"cudnn|sdpa|fprop|flash"}


def _opts(w: Workload, options: dict) -> tuple[int, int, bool]:
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: torch_cudnn takes only {sorted(OPTIONS)}")
    bq, bk = options.get("block_q", 128), options.get("block_k", 128)
    for name, v in (("block_q", bq), ("block_k", bk)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{name}={v!r}: must be a positive integer")
    lse = options.get("lse", False)
    if not isinstance(lse, bool | np.bool_):
        raise ValueError(f"lse={lse!r}: must be a bool")
    if w.block_mask is not None:
        raise ValueError("block_mask: torch_cudnn has no block-sparse mask")
    if w.causal and w.nq != w.nk:
        raise ValueError(f"seq_len_q={w.nq} != seq_len_k={w.nk} with causal: not modelled")
    if w.dtype == "fp32":
        raise ValueError("dtype='fp32': cuDNN's fused attention runs fp16 and bf16")
    return int(bq), int(bk), bool(lse)


def _key_blocks(w: Workload, bq: int, bk: int) -> np.ndarray:
    tr, tc = cdiv(w.nq, bq), cdiv(w.nk, bk)
    if not w.causal:
        return np.full(tr, tc, dtype=np.int64)
    return np.minimum(tc, -(-((np.arange(tr, dtype=np.int64) + 1) * bq) // bk))


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    bq, bk, lse = _opts(w, options)
    if pass_ != "fwd":
        raise ValueError(f"pass_={pass_!r}: torch_cudnn models the forward only")
    check_programs(w.bh, "batch*heads")
    q0, qn = block_rows(w.nq, bq)
    k0, kn = block_rows(w.nk, bk)
    lim = _key_blocks(w, bq, bk)
    seen_by = np.cumsum(np.bincount(lim, minlength=len(k0) + 1)[::-1])[::-1][1:]

    def accesses():
        for i in range(len(q0)):
            yield bulk_read("Q", q0[i], qn[i])
            yield bulk_read("K", k0[:lim[i]], kn[:lim[i]])
            yield bulk_read("V", k0[:lim[i]], kn[:lim[i]])
            yield bulk_write("O", q0[i], qn[i])
            if lse:
                yield bulk_write("L", q0[i], qn[i])

    def counts():
        qc, kc = classes(q0, qn), classes(k0, kn, seen_by)
        yield bulk_read("Q", qc[0], qc[1], repeat=qc[2])
        yield bulk_read("K", kc[0], kc[1], repeat=kc[2])
        yield bulk_read("V", kc[0], kc[1], repeat=kc[2])
        yield bulk_write("O", qc[0], qc[1], repeat=qc[2])
        if lse:
            yield bulk_write("L", qc[0], qc[1], repeat=qc[2])

    eb = w.elem_bytes
    tensors = {"Q": TensorLayout("Q", w.nq, w.d, eb, w.bh), "K": TensorLayout("K", w.nk, w.d, eb, w.batch * w.hkv),
               "V": TensorLayout("V", w.nk, w.d, eb, w.batch * w.hkv), "O": TensorLayout("O", w.nq, w.d, eb, w.bh)}
    if lse:
        tensors["L"] = TensorLayout("L", w.nq, 1, STAT_BYTES, w.bh)
    p = np.arange(w.bh, dtype=np.int64)
    kv = (p // w.heads) * w.hkv + (p % w.heads) // w.group
    slices = {n: (kv if n in ("K", "V") else p) for n in tensors}
    launch = Launch("cudnn_sdpa_fwd", w.bh, slices, accesses, counts)
    return Schedule("torch_cudnn", tensors, [launch], {"pass": "fwd", "block_m": bq, "block_n": bk, "lse": lse,
                                                       "estimate": "bulk traffic, assumed tiles"})


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    bq, bk, lse = _opts(w, options)
    if pass_ != "fwd":
        raise ValueError(f"pass_={pass_!r}: torch_cudnn models the forward only")
    kv_rows = int(np.minimum(_key_blocks(w, bq, bk) * bk, w.nk).sum())
    out = {("Q", "bulk_read"): w.bh * w.nq * w.d, ("K", "bulk_read"): w.bh * kv_rows * w.d,
           ("V", "bulk_read"): w.bh * kv_rows * w.d, ("O", "bulk_write"): w.bh * w.nq * w.d}
    if lse:
        out[("L", "bulk_write")] = w.bh * w.nq
    return out


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None, **options):
    if tiling is not None:
        raise ValueError("tiling: torch_cudnn takes its assumed tiles as the options block_q and block_k")
    return None, dict(options)


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[int, int]:
    return int(options.get("block_q", 128)), int(options.get("block_k", 128))


__all__ = ["schedule", "closed_form", "plan", "blocks", "PASSES", "NEEDS_TILING", "TILING_TEXT", "DESCRIPTION",
           "OPTIONS", "KERNEL_NAMES"]
