"""Named sets of configurations to measure, and how each maps onto the simulator.

A configuration is a flat dict: ``kernel`` ("flash2", "flash1", "standard"), ``pass`` ("fwd" or
"bwd"), the workload fields (batch, heads, kv_heads, seq_len_q, seq_len_k, head_dim, dtype,
causal) and the kernel's tiling (``block_m``/``block_n``, or ``sram_bytes`` for flash1, or
``gemm_block`` for standard).  The same dict drives the GPU worker and the simulator, so the two
can never disagree about what was run.
"""

from __future__ import annotations

import numpy as np

from flashsim.config import DTYPE_BYTES, Tiling, Workload

from .fast_set import FAST_KERNELS, fast_set, fast_smoke_set
from .fast_set import metrics as fast_metrics
from .fast_set import sim_options as fast_options
from .torch_set import TORCH_KERNELS, torch_edge_set, torch_set, torch_tma_set

#: The kernels a configuration may name (the worker runs them, the simulator models them);
#: "decode" is the reference decode kernel (``kernels/decode.py``), whose schedule is
#: ``flashsim.algorithms.decode``'s.
KERNELS = ("flash2", "flash1", "standard", "decode", *FAST_KERNELS,  # fast: analysis/fast_set.py
           *TORCH_KERNELS)  # torch_*: analysis/torch_set.py
#: Configuration fields of the decode set beyond :data:`analysis.measure.CONFIG_FIELDS`
#: (``num_splits``; ``page_size``, 0 for a contiguous cache), recorded when a set has them.
DECODE_FIELDS = ("num_splits", "page_size")
#: Configuration fields of the fast set beyond :data:`analysis.measure.CONFIG_FIELDS`
#: (``longest_first``: bwd_fp16_v3's causal key-block order; ``bulkq``: its dQ by bulk reductions
#: instead of ``red.v2``; ``ostage``: fwd_fp32_v2's O stored through shared memory; ``qfrag``: its Q
#: split a fragment tile at a time; ``lpt``: fwd_fp16_v5's and v7's causal block order), recorded
#: when a set has them.
FAST_FIELDS = ("longest_first", "bulkq", "ostage", "qfrag", "lpt")


def workload_of(cfg: dict) -> Workload:
    return Workload(batch=cfg["batch"], heads=cfg["heads"], kv_heads=cfg.get("kv_heads"),
                    seq_len_q=cfg["seq_len_q"], seq_len_k=cfg.get("seq_len_k"), head_dim=cfg["head_dim"],
                    dtype=cfg["dtype"], causal=bool(cfg.get("causal", False)))


def tiling_of(cfg: dict) -> Tiling | None:
    if cfg["kernel"] == "standard" or cfg["kernel"] in FAST_KERNELS:  # the fast kernels fix their tiles
        return None
    if cfg["kernel"] == "decode":  # a program holds g·Nq query rows; only Bc is a block size
        return Tiling(1, cfg["block_n"])
    if cfg.get("sram_bytes"):
        return Tiling.from_sram(cfg["sram_bytes"] // DTYPE_BYTES[cfg["dtype"]], cfg["head_dim"])
    return Tiling(cfg["block_m"], cfg["block_n"])


def sim_options(cfg: dict) -> dict:
    if cfg["kernel"] in FAST_KERNELS:
        return fast_options(cfg)
    if cfg["kernel"] == "standard":
        return {"fuse": "softmax", "gemm_block": cfg["gemm_block"]}
    if cfg["kernel"] == "decode":
        # the worker runs every sequence at the full cache length Nk, no window; page 0: contiguous
        return {"num_splits": cfg["num_splits"], "page_size": cfg.get("page_size") or None}
    if cfg["kernel"] == "flash1":
        # the kernel keeps O in float32 in HBM for fp16 inputs (kernels/flash1.py)
        return {"o_fp32": cfg["dtype"] == "fp16"}
    return {}


def config_id(cfg: dict) -> str:
    parts = [cfg["kernel"], cfg["pass"], f"b{cfg['batch']}h{cfg['heads']}",
             f"n{cfg['seq_len_q']}", f"d{cfg['head_dim']}", cfg["dtype"]]
    if cfg["kernel"] != "decode" and cfg.get("kv_heads") not in (None, cfg["heads"]):  # grouped-query
        parts[2] += f"kv{cfg['kv_heads']}"
    if cfg.get("seq_len_k") and cfg["seq_len_k"] != cfg["seq_len_q"]:
        parts.insert(4, f"nk{cfg['seq_len_k']}")
    if cfg.get("causal"):
        parts.append("causal")
    if cfg.get("sram_bytes"):
        parts.append(f"M{cfg['sram_bytes'] // 1024}k")
    elif cfg.get("block_m"):
        parts.append(f"br{cfg['block_m']}bc{cfg['block_n']}")
    if cfg.get("gemm_block"):
        parts.append(f"g{cfg['gemm_block']}")
    if cfg["kernel"] == "decode":
        parts.append(f"s{cfg['num_splits']}")
        if cfg.get("page_size"):
            parts.append(f"p{cfg['page_size']}")
    return "-".join(parts)


def _cfg(kernel, pass_, n, d, dtype, causal=False, batch=1, heads=16, **tiling) -> dict:
    c = {"kernel": kernel, "pass": pass_, "batch": batch, "heads": heads, "kv_heads": heads,
         "seq_len_q": n, "seq_len_k": n, "head_dim": d, "dtype": dtype, "causal": causal}
    c.update(tiling)
    return c


def _f2(pass_, n, d, dtype, causal=False, **kw) -> dict:
    """A FlashAttention-2 configuration with the kernel's default blocks for its pass."""
    # imported here, not at the top: kernels loads numba's CUDA target (most of a second), and
    # the simulator-side readers of this module (compare, the notebooks, the CLI) never need it
    from kernels.flash2 import default_blocks

    br, bc = default_blocks("fwd" if pass_ == "fwd" else "bwd", np.float16 if dtype == "fp16" else np.float32, d)
    return _cfg("flash2", pass_, n, d, dtype, causal=causal, block_m=br, block_n=bc, **kw)


def main_set() -> list[dict]:
    """The measured set (taken on the H100, then the H200): N 512..16,384, d 64 and 128, fp16
    and fp32, causal and not, forward and backward, and the FlashAttention-1 SRAM sweep (a 24x
    range of M)."""
    out = []
    # FlashAttention-2 forward: the N sweep at both head dims, fp16; fp32 and causal spot checks.
    for d in (64, 128):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            out.append(_f2("fwd", n, d, "fp16"))
        for n in (1024, 4096, 16384):
            out.append(_f2("fwd", n, d, "fp16", causal=True))
        for n in (1024, 4096):
            out.append(_f2("fwd", n, d, "fp32"))
    # FlashAttention-2 tile sweep at N = 4096, d = 64: Br·Bc from 64 to 2048 (32x).
    for br, bc in ((8, 8), (16, 16), (32, 32)):
        out.append(_cfg("flash2", "fwd", 4096, 64, "fp16", block_m=br, block_n=bc))
    # FlashAttention-2 backward.
    for d in (64, 128):
        for n in (512, 2048, 8192):
            out.append(_f2("bwd", n, d, "fp16"))
    out.append(_f2("bwd", 2048, 64, "fp16", causal=True))
    out.append(_f2("bwd", 2048, 64, "fp32"))
    # FlashAttention-1 (Algorithm 1 order): M from 8 KB to 192 KB at N = 2048, d = 64, and an
    # N sweep at fixed M, fp16; a d = 128 and an fp32 point.
    for kb in (8, 16, 32, 64, 128, 192):
        out.append(_cfg("flash1", "fwd", 2048, 64, "fp16", sram_bytes=kb * 1024))
    for n in (512, 1024, 4096):
        out.append(_cfg("flash1", "fwd", n, 64, "fp16", sram_bytes=32 * 1024))
    out.append(_cfg("flash1", "fwd", 2048, 128, "fp16", sram_bytes=64 * 1024))
    out.append(_cfg("flash1", "fwd", 2048, 64, "fp32", sram_bytes=64 * 1024))
    out.append(_cfg("flash1", "fwd", 2048, 64, "fp16", causal=True, sram_bytes=32 * 1024))
    # Standard attention (S and P in HBM): N sweep, fwd and bwd.
    for n in (512, 1024, 2048, 4096):
        out.append(_cfg("standard", "fwd", n, 64, "fp16", gemm_block=32))
    out.append(_cfg("standard", "fwd", 2048, 128, "fp16", gemm_block=32))
    out.append(_cfg("standard", "fwd", 2048, 64, "fp32", gemm_block=32))
    out.append(_cfg("standard", "fwd", 2048, 64, "fp16", causal=True, gemm_block=32))
    for n in (512, 2048):
        out.append(_cfg("standard", "bwd", n, 64, "fp16", gemm_block=32))
    return out


def smoke_set() -> list[dict]:
    """A handful of small configurations: for checking the harness end to end."""
    return [
        _f2("fwd", 256, 64, "fp16", batch=1, heads=2),
        _f2("bwd", 256, 64, "fp16", batch=1, heads=2),
        _cfg("flash1", "fwd", 256, 64, "fp16", batch=1, heads=2, sram_bytes=16 * 1024),
        _cfg("standard", "fwd", 256, 64, "fp16", batch=1, heads=2, gemm_block=32),
        _cfg("standard", "bwd", 256, 64, "fp16", batch=1, heads=2, gemm_block=32),
    ]


def _decode(nk, splits, page=0, nq=1, batch=1, kv_heads=8, group=8, d=128, dtype="fp16") -> dict:
    """A reference decode kernel configuration: Nq query rows against a full cache of Nk rows
    (every sequence of length Nk), GQA packing of ``group`` query heads per kv head, the kernel's
    default key block (``kernels.decode.default_block_n``), contiguous (page 0) or paged."""
    from kernels.decode import default_block_n

    bc = default_block_n(dtype, d, group * nq, page)
    c = _cfg("decode", "fwd", nq, d, dtype, causal=True, batch=batch, heads=kv_heads * group, block_n=bc,
             num_splits=splits, page_size=page)
    c.update(kv_heads=kv_heads, seq_len_k=nk)
    return c


def decode_set() -> list[dict]:
    """The decode set (issue 19): the reference decode kernel, fp16, d = 128, GQA 8:1 (64 query
    heads on 8 kv heads), batch 1, Nq = 1 unless said: Nk = 4,096, 65,536 and 1,048,576 at 16
    splits; 1, 4 and 64 splits at Nk = 65,536; pages of 16, 64 and 256 rows at Nk = 65,536 and 16
    splits; Nq = 4 there; Nk = 262,144 paged (128 rows) at 64 splits.  11 configurations, 21
    launches (more than one split adds the combine launch)."""
    out = [_decode(nk, 16) for nk in (4096, 65536, 1048576)]
    out += [_decode(65536, s) for s in (1, 4, 64)]
    out += [_decode(65536, 16, page=p) for p in (16, 64, 256)]
    out += [_decode(65536, 16, nq=4), _decode(262144, 64, page=128)]
    return out


def parts_set() -> list[dict]:
    """Standard attention with 16 x 16 GEMM tiles (issue 14): rows of S, P and dP stored 32 (fp16)
    or 64 (fp32) bytes at a time, so that four or two blocks store each 128-byte line, where the
    main set's 32 x 32 tiles store halves in fp16 and whole lines in fp32.  A test of the L2
    model's merge of lines stored in parts (flashsim.config.Hardware.l2_split_merge), which the
    half-line probes set and these launches did not: forward at N = 1,024, 2,048 and 4,096, fp16
    and fp32, and the backward at N = 2,048; d = 64, B·H = 16.  8 configurations, 28 launches."""
    out = [_cfg("standard", "fwd", n, 64, dt, gemm_block=16) for dt in ("fp16", "fp32") for n in (1024, 2048, 4096)]
    out += [_cfg("standard", "bwd", 2048, 64, dt, gemm_block=16) for dt in ("fp16", "fp32")]
    return out


#: Named sets.  The data file is named after the set, so "h100" and "h200" name the same
#: configurations measured on each GPU.
SETS = {"main": main_set, "h100": main_set, "h200": main_set, "smoke": smoke_set, "decode": decode_set,
        "fast": fast_set, "fast_smoke": fast_smoke_set, "torch": torch_set, "torch_tma": torch_tma_set,
        "torch_edge": torch_edge_set, "parts": parts_set}
#: Sets measured with metrics chosen by the set (default: analysis.ncu.METRICS and the optional
#: ones the installed ncu knows): set -> a function giving the metrics.
SET_METRICS = {"fast": fast_metrics, "fast_smoke": fast_metrics}
