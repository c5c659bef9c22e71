"""Test setup: kernels run under Numba's CUDA simulator unless FLASHSIM_GPU=1.

The simulator must be switched on before numba is first imported, hence here, at the top of
the first module pytest loads.  On a GPU machine run ``FLASHSIM_GPU=1 pytest -m gpu``.
"""

import os
import sys

ON_GPU = os.environ.get("FLASHSIM_GPU") == "1"
if not ON_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    # The simulator runs one Python thread per CUDA thread and hands over at every barrier; a
    # short switch interval makes those hand-overs ~10x faster without changing what runs.
    sys.setswitchinterval(2e-4)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a real GPU (FLASHSIM_GPU=1 pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poisoned():
    """The CUDA simulator's dynamic shared memory 0xFF-filled (NaN) at every block, as a GPU's holds
    whatever was there: a kernel's read of bytes it never wrote shows in its result."""
    from kernels import _sim

    was = _sim.poison_dynamic_shared(True)
    yield
    _sim.poison_dynamic_shared(was)
