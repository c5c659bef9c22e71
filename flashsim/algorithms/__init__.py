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
  ``closed_form`` accept.
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
}

ALGORITHMS = tuple(_MODULES)


def get_algorithm(name: str) -> ModuleType:
    if not isinstance(name, str) or name not in _MODULES:
        raise ValueError(f"algo={name!r}: unknown algorithm; choose one of {list(_MODULES)}")
    return importlib.import_module(f".{_MODULES[name]}", __name__)
