"""The paper's Figure 2 (left) at the level it was measured: LSU and DRAM bytes of one attention layer.

:func:`figure2_row` counts one case, forward plus backward: the walker's LSU-level bytes and the
DRAM bytes of :func:`flashsim.l2.dram_traffic` on a GPU preset (the L2 carried from launch to
launch within the pass, the dirty lines left at the end written back and counted).
:data:`PAPER_CASES` are the two cases that stand for the paper's bars on GPT-2 medium (N = 1,024,
d = 64, 16 heads, batch 64, fp16): standard attention as GPT-2 trains it (causal mask, dropout
0.1, scale + mask + softmax fused into one kernel as Megatron does, the paper's Algorithm 0) and
FlashAttention-1 without a mask, with the blocks the paper's rule gives for the preset's shared
memory.  ``scripts/figure2_dram.py`` prints these and the other variants.
"""

from __future__ import annotations

import time

from flashsim.api import build_schedule, resolve_tiling
from flashsim.config import Workload, get_gpu
from flashsim.l2 import dram_traffic
from flashsim.traffic import walk

#: GPT-2 medium's attention layer as the paper's Figure 2 (left) measures it.
GPT2_MEDIUM = {"batch": 64, "heads": 16, "seq_len_q": 1024, "head_dim": 64, "dtype": "fp16"}

#: The paper's figures (GB of HBM reads and writes, forward + backward, A100).
PAPER_GB = {"standard": 40.3, "standard_revision": 35.3, "flash1": 4.4}

#: (name, algorithm, causal, options) of the two cases that stand for the paper's two bars.
PAPER_CASES = (
    ("standard", "standard", True, {"fuse": "softmax", "dropout": 0.1}),
    ("flash1", "flash1", False, {}),
)


def figure2_row(algo: str, causal: bool, options: dict | None = None, gpu: str = "a100", sample: int = 16,
                shape: dict | None = None) -> dict:
    """LSU and DRAM bytes (GB) of one case, forward + backward, on ``gpu``'s preset.

    ``sample``: the L2 model's set sampling (one set in ``sample`` simulated, counts scaled).
    ``shape``: the workload's fields (default :data:`GPT2_MEDIUM`); ``causal`` is added."""
    options = dict(options or {})
    hw = get_gpu(gpu)
    w = Workload(**(shape or GPT2_MEDIUM), causal=causal)
    tiling = resolve_tiling(w, algo, None, hw.sram_elems(w.elem_bytes))
    t0 = time.perf_counter()
    sched = build_schedule(w, algo, "fwd+bwd", tiling, **options)
    lsu = walk(sched)
    d = dram_traffic(sched, hw, sample=sample)
    blocks = "" if tiling is None else f"{tiling.block_m}x{tiling.block_n}"
    return {"algo": algo, "causal": causal, "fuse": options.get("fuse", ""), "dropout": options.get("dropout", ""),
            "blocks": blocks, "gpu": gpu, "sample": sample,
            "lsu_GB": lsu.sectors * 32 / 1e9, "dram_read_GB": d.read_bytes / 1e9,
            "dram_write_GB": d.write_bytes / 1e9, "dram_GB": d.bytes / 1e9,
            "seconds": time.perf_counter() - t0}


def paper_figure2(gpu: str = "a100", sample: int = 16) -> dict[str, dict]:
    """:func:`figure2_row` of each of :data:`PAPER_CASES`, by name."""
    return {name: figure2_row(algo, causal, opts, gpu, sample) for name, algo, causal, opts in PAPER_CASES}


__all__ = ["GPT2_MEDIUM", "PAPER_GB", "PAPER_CASES", "figure2_row", "paper_figure2"]
