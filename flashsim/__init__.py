"""flashsim: FlashAttention's IO complexity, simulated exactly.

The public API in one place::

    from flashsim import Workload, Tiling, get_gpu, simulate
    w = Workload(batch=64, heads=16, seq_len_q=1024, head_dim=64, dtype="fp16")
    r = simulate(w, "flash2", "fwd", sram_elems=get_gpu("a100").sram_elems(w.elem_bytes))
    r.io.bytes, r.io.to_dict()["breakdown"], r.agrees

The analysis helpers live in their own modules (``flashsim.bounds``, ``flashsim.flops``,
``flashsim.roofline``, ``flashsim.sweep``, ``flashsim.plot``, ``flashsim.report``); their
functions are not re-exported here because several share their module's name, and a function
bound to ``flashsim.bounds`` would hide the module from ``import flashsim.bounds as m``.
"""

from __future__ import annotations

from .algorithms import ALGORITHMS, get_algorithm
from .api import PASSES, SimResult, build_schedule, closed_form_elements, resolve_tiling, simulate
from .config import DTYPE_BYTES, GPUS, STAT_BYTES, BlockMask, Hardware, Tiling, Workload, cdiv, get_gpu
from .traffic import IOCount, Schedule, Traffic, walk

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "DTYPE_BYTES",
    "GPUS",
    "PASSES",
    "STAT_BYTES",
    "BlockMask",
    "Hardware",
    "IOCount",
    "Schedule",
    "SimResult",
    "Tiling",
    "Traffic",
    "Workload",
    "__version__",
    "build_schedule",
    "cdiv",
    "closed_form_elements",
    "get_algorithm",
    "get_gpu",
    "resolve_tiling",
    "simulate",
    "walk",
]
