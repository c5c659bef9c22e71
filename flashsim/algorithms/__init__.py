"""The registry of simulated algorithms.

Each algorithm lives in its own module, which defines

* ``PASSES``: the passes it models, a subset of ``("fwd", "bwd")``;
* ``NEEDS_TILING``: whether it takes block sizes (standard attention does not);
* ``DESCRIPTION``: one line;
* ``schedule(workload, tiling, pass_, **options) -> flashsim.traffic.Schedule``: the exact tile
  schedule, walked by :func:`flashsim.traffic.walk`;
* ``closed_form(workload, tiling, pass_, **options) -> dict[(tensor, direction), int]``: the same
  element counts from formulas alone (no loop over tiles), which must equal the walker's exactly;
* ``OPTIONS``: a dict of option name -> (default, help text) that ``schedule`` and
  ``closed_form`` accept;
* ``plan(workload, sram_elems=None, tiling=None, **options) -> (tiling, options)``: its M rule,
  the tiling and options it runs with given the on-chip memory M (elements) and/or explicit
  block sizes (FlashAttention: the given tiling, else the paper's Bc = ⌈M/4d⌉, Br = min(Bc, d);
  standard attention: no tiling; smallcache: one s x s tile from M exactly);
* ``blocks(workload, tiling, **options) -> (block_m, block_n)``: the block sizes a record shows
  for a run (None for an algorithm that is not tiled).
* ``TILING_TEXT``: how the command line shows the tiling, a format string of ``block_m`` and
  ``block_n``.
* optionally ``summary(workload, tiling, gpu, **options) -> dict``: what ``flashsim simulate``
  reports for it in place of the paper's forward-attention IO bounds (decode: its own bounds and
  the proposed split count).

Code above this package asks the module, never the algorithm's name, what to do.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: algorithm name -> module (relative to this package)
_MODULES = {
    "standard": "standard",
    "flash1": "flash1",
    "flash2": "flash2",
    "smallcache": "smallcache",
    "decode": "decode",
    "fast": "fast",
    "torch_flash": "torch_flash",
    "torch_naive": "torch_naive",
    "torch_memeff": "torch_memeff",
    "torch_cudnn": "torch_cudnn",
}

#: Decoding schedules: they take a KV cache's options (lengths, splits, pages) and mask causally
#: whatever the workload says, so the attention-wide lists (``bounds``, ``sweep``, the lower-bound
#: checks) leave them out; ``simulate`` takes them.
DECODERS = ("decode",)
#: Schedules of the kernels PyTorch launches (issue 15): fixed tiles from the kernels' own source.
TORCH_KERNELS = ("torch_flash", "torch_naive", "torch_memeff", "torch_cudnn")
#: Schedules of particular kernels (``fast``: kernels/perf's variants; PyTorch's), which take only
#: the workloads those kernels do and fix their own tiles: ``simulate`` takes them, the
#: attention-wide lists (bounds, sweeps) leave them out.
KERNELS = ("fast", *TORCH_KERNELS)
#: The attention algorithms: every workload, the paper's bounds apply.
ALGORITHMS = tuple(a for a in _MODULES if a not in DECODERS + KERNELS)
#: Everything ``get_algorithm`` knows.
ALL_ALGORITHMS = tuple(_MODULES)


def get_algorithm(name: str) -> ModuleType:
    if not isinstance(name, str) or name not in _MODULES:
        raise ValueError(f"algo={name!r}: unknown algorithm; choose one of {list(_MODULES)}")
    return importlib.import_module(f".{_MODULES[name]}", __name__)
