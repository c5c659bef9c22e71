"""The fast kernels: numbered variants (llm.c style), each file's header saying what changed and
what it measured.  ``kernels/perf/NOTES.md`` keeps the predictions and outcomes in order.

:func:`best` names the variant the public API (``kernels.flash_attention(impl="auto")``) uses for
a pass and dtype; the readable reference kernels (``kernels/flash2.py``) stay the ones whose
traffic counters are held against the simulator.
"""

from __future__ import annotations

import importlib

import numpy as np

#: (pass, dtype) -> the module of the fastest variant that passed the exactness suite.
BEST = {("fwd", "float16"): "fwd_fp16_v4", ("bwd", "float16"): "bwd_fp16_v1", ("fwd", "float32"): "fwd_fp32_v1",
        ("bwd", "float32"): "bwd_fp32_v1"}


def best(pass_: str, dtype, d: int):
    """The fastest variant's module for this pass, dtype and head dim, or None if none applies."""
    name = BEST.get((pass_, np.dtype(dtype).name))
    if name is None:
        return None
    mod = importlib.import_module(f"{__name__}.{name}")
    return mod if mod.supports(dtype, d) else None
