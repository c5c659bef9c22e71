"""The fast kernels' thread-block programs (flashsim/blocks.py, ``_fast``) and their DRAM level:
every launch's tiles move exactly the walker's elements, tensor by tensor and class by class;
block shapes equal kernels.perf's launches; a tiny case by hand; reductions in the L2 by hand;
the DRAM agreement on the committed H100 records."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from flashsim import Workload
from flashsim.algorithms import fast
from flashsim.api import build_schedule
from flashsim.traffic import walk

ROOT = Path(__file__).resolve().parents[1]
FAST = ROOT / "analysis" / "data" / "h100" / "fast"


def W(b, h, n, d, *, hkv=None, nk=None, dtype="fp16", causal=False):
    return Workload(batch=b, heads=h, kv_heads=hkv or h, seq_len_q=n, seq_len_k=nk or n, head_dim=d, dtype=dtype,
                    causal=causal)


def _tile_elements(spec, lo=0, hi=None) -> Counter:
    """Elements of blocks lo..hi-1 by (tensor, "read" | "write" | "reduction")."""
    t = spec.tiles(lo, spec.num_blocks if hi is None else hi)
    out = Counter()
    kind = np.where(t.reduction, 2, np.where(t.write, 1, 0))
    for k, name in enumerate(t.names):
        for code, what in enumerate(("read", "write", "reduction")):
            m = (t.tensor == k) & (kind == code)
            if m.any():
                out[(name, what)] += int((t.nrows[m] * t.ncols[m]).sum())
    return out


CASES = [
    ("fwd_fp16_v4", "fwd", W(2, 4, 200, 64, hkv=2)), ("fwd_fp16_v4", "fwd", W(1, 3, 150, 32, nk=260, causal=True)),
    ("fwd_fp16_v4", "fwd", W(1, 2, 96, 128, dtype="bf16", causal=True)),
    ("fwd_fp32_v1", "fwd", W(1, 2, 130, 80, dtype="fp32", causal=True)),
    ("fwd_fp32_v2", "fwd", W(2, 2, 100, 64, dtype="fp32")),
    ("bwd_fp16_v1", "bwd", W(1, 4, 150, 64, hkv=2, causal=True)), ("bwd_fp16_v1", "bwd", W(1, 2, 70, 128, nk=90)),
    ("bwd_fp16_v3", "bwd", W(1, 4, 200, 128, hkv=2, causal=True)), ("bwd_fp16_v3", "bwd", W(2, 2, 100, 32)),
    ("bwd_fp32_v1", "bwd", W(1, 2, 130, 96, dtype="fp32", causal=True)),
    ("bwd_fp32_v2", "bwd", W(1, 4, 100, 64, hkv=1, dtype="fp32")),
]


@pytest.mark.parametrize("kernel,pass_,w", CASES)
def test_tiles_move_the_walkers_elements(kernel, pass_, w):
    """Summed over every block's tiles, each launch loads, stores and reduces exactly the elements
    the walker counts for it, tensor by tensor (the block model orders and groups the transfers,
    never changes them); a chunk of blocks and its complement add up to the whole grid."""
    sched = build_schedule(w, "fast", pass_, None, kernel=kernel)
    io = walk(sched)
    assert len(sched.launches) == len(io.per_launch)
    for launch, (name, c) in zip(sched.launches, io.per_launch.items()):
        assert launch.blocks is not None, name
        want = Counter({k: t.elements for k, t in c.breakdown.items() if t.elements})
        got = _tile_elements(launch.blocks)
        assert got == want, name
        n = launch.blocks.num_blocks
        cut = n // 3
        assert _tile_elements(launch.blocks, 0, cut) + _tile_elements(launch.blocks, cut, n) == want, name


def test_block_shapes_equal_the_kernels_launches():
    """Threads and dynamic shared memory per block are what kernels.perf's launchers ask for (every
    kernel's shared memory is dynamic), for each variant's default shapes and an override."""
    from kernels.flash2 import padded_head_dim
    from kernels.perf import bwd_fp16, bwd_fp32, fwd_fp16, fwd_fp32

    for d in (32, 64, 80, 96, 128):
        for name in fast.VARIANTS:
            if not fast.supports(name, fast.VARIANTS[name][1], d):
                continue
            for config in (None, {"nw": 2}):
                if name == "bwd_fp32_v2" and config:
                    continue  # its warp grid wants its own shapes
                c = fast.parse_config(name, d, config)
                t = fast.tiles(name, d, config)
                got = fast.block_resources(name, d, config)
                dp = padded_head_dim(d)
                if name == "fwd_fp16_v4":
                    want = {"fwd": (32 * c["nw"], fwd_fp16.smem_bytes(dp, t["fwd"].block_m, c["bc"]))}
                elif name == "fwd_fp32_v1":
                    want = {"fwd": (32 * c["nw"], fwd_fp32.smem_bytes(dp, t["fwd"].block_m, c["bc"]))}
                elif name == "fwd_fp32_v2":
                    want = {"fwd": (32 * c["nw"], fwd_fp32.smem_bytes_v2(dp, t["fwd"].block_m, c["bc"],
                                                                         qsplit=c["qsplit"]))}
                elif name == "bwd_fp16_v1":
                    rows = 16 * c["nw"] * c["mt"]
                    want = {"dkdv": (32 * c["nw"], bwd_fp16.smem_bytes_dkdv_v1(d, rows, c["bq"])),
                            "dq": (32 * c["nw"], bwd_fp16.smem_bytes_dq_v1(d, rows, c["bk"]))}
                elif name == "bwd_fp16_v3":
                    want = {"dkdv": (32 * c["nw"], bwd_fp16.smem_bytes_v3(d, c["bq"], c["bk"]))}
                elif name == "bwd_fp32_v1":
                    want = {"dkdv": (32 * c["nw"], bwd_fp32.smem_bytes_v1(d, c["bc"], c["br"]))}
                else:
                    want = {"dkdv": (32 * c["nw"], bwd_fp32.smem_bytes_v2(d, c["bc"], c["br"]))}
                assert got == want, (name, d, config)
