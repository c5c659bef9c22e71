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

#: The kernels a configuration may name (the worker runs them, the simulator models them).
KERNELS = ("flash2", "flash1", "standard")


def workload_of(cfg: dict) -> Workload:
    return Workload(batch=cfg["batch"], heads=cfg["heads"], kv_heads=cfg.get("kv_heads"),
                    seq_len_q=cfg["seq_len_q"], seq_len_k=cfg.get("seq_len_k"), head_dim=cfg["head_dim"],
                    dtype=cfg["dtype"], causal=bool(cfg.get("causal", False)))


def tiling_of(cfg: dict) -> Tiling | None:
    if cfg["kernel"] == "standard":
        return None
    if cfg.get("sram_bytes"):
        return Tiling.from_sram(cfg["sram_bytes"] // DTYPE_BYTES[cfg["dtype"]], cfg["head_dim"])
    return Tiling(cfg["block_m"], cfg["block_n"])


def sim_options(cfg: dict) -> dict:
    if cfg["kernel"] == "standard":
        return {"fuse": "softmax", "gemm_block": cfg["gemm_block"]}
    if cfg["kernel"] == "flash1":
        # the kernel keeps O in float32 in HBM for fp16 inputs (kernels/flash1.py)
        return {"o_fp32": cfg["dtype"] == "fp16"}
    return {}


def config_id(cfg: dict) -> str:
    parts = [cfg["kernel"], cfg["pass"], f"b{cfg['batch']}h{cfg['heads']}",
             f"n{cfg['seq_len_q']}", f"d{cfg['head_dim']}", cfg["dtype"]]
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


#: Named sets.  The data file is named after the set, so "h100" and "h200" name the same
#: configurations measured on each GPU.
SETS = {"main": main_set, "h100": main_set, "h200": main_set, "smoke": smoke_set}
