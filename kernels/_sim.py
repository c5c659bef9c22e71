"""A fix for a race in Numba's CUDA simulator, applied when the simulator is on.

The simulator runs one Python thread per CUDA thread, and ``cuda.shared.array`` returns the
block's array for the calling source line: it looks the line up in a dict and, if absent,
creates the array and stores it, with no lock.  Two threads that reach the line together can
both miss and each get a private, uninitialised array, so that one thread's writes never reach
the others: a rare wrong or huge result (seen in CI as a relative error of 1.7e20 in the reference
fp32 backward's dQ, a case that passed when hypothesis ran it again; tests/test_sim_shared.py
provokes it by switching threads every microsecond: 2 wrong blocks in 240 without the lock, none
with it).  The same lookup done under a lock removes the race.  The simulator twins of the fast
kernels' helpers (``kernels/perf/tc_sim.py``) had worked around it for their own scratch arrays;
this covers every kernel.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

_LOCK = threading.Lock()


def lock_shared_arrays() -> bool:
    """Make the simulator's ``cuda.shared.array`` thread-safe (idempotent).  Returns whether the
    patch is in place (False when the simulator is off or its internals are not as expected)."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        return False
    from numba.cuda.simulator import kernelapi

    cls = kernelapi.FakeCUDAShared
    if getattr(cls, "_flashsim_locked", False):
        return True
    if not hasattr(cls, "array") or not isinstance(getattr(cls(0), "_allocations", None), dict):
        return False  # not the simulator this was written against: leave it alone
    original = cls.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return original(self, shape, dtype, alignment)  # dynamic shared memory: no lookup
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)  # the simulator's own key
        with _LOCK:
            res = self._allocations.get(caller)
            if res is None:
                from numba.core import types
                from numba.np import numpy_support

                dt = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
                res = np.empty(shape, dt)
                self._allocations[caller] = res
        return res

    cls.array = array
    cls._flashsim_locked = True
    return True


#: Whether the simulator fills a block's dynamic shared memory with 0xFF bytes (a NaN in fp16,
#: bf16 and fp32) instead of zeros: on a GPU it holds whatever the last block left, so a kernel
#: that reads bytes it never wrote passes under the simulator's zeros and fails here.
POISON = False


def poison_dynamic_shared(on: bool = True) -> bool:
    """Set :data:`POISON` (the simulator's dynamic shared memory 0xFF-filled at every block) and
    return its previous value; False, and nothing set, when the simulator is off."""
    global POISON
    from numba import config

    if not config.ENABLE_CUDASIM:
        return False
    from numba.cuda.simulator import kernelapi

    cls = kernelapi.FakeCUDAShared
    if not getattr(cls, "_flashsim_poison", False):
        original = cls.__init__

        def init(self, dynshared_size):
            original(self, dynshared_size)
            if POISON:
                self._dynshared.fill(-1)

        cls.__init__ = init
        cls._flashsim_poison = True
    was, POISON = POISON, bool(on)
    return was
