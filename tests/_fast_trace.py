"""Count the global-memory elements a kernel launch touches under Numba's CUDA simulator.

The fast kernels (kernels/perf) have no traffic counters.  Under the simulator every global
array a kernel indexes is a ``FakeCUDAArray`` (its argument, or a ``reshape`` of it: the
cp.async and store twins of kernels/perf/tc_sim.py index the flat view), while shared and local
arrays are plain numpy arrays.  :func:`trace` patches ``FakeCUDAArray.__getitem__`` and
``__setitem__`` to count scalar reads and writes per launch and per array (the array named by
the kernel parameter whose buffer it lies in; the simulator's kernel call starts a new launch
record): every thread's access (``total``) and the distinct elements each thread block touches,
summed over blocks (``distinct``: what a kernel moves when the lanes of a warp that read one
address, a broadcast, make one request).  The reduction twins (``red_v2``, ``red_v4``) read and write each element once
(``flat[off] += a``): one read and one write per element reduced.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections import Counter

import numpy as np


def _ptr(a) -> int:
    return a.__array_interface__["data"][0]


@contextlib.contextmanager
def trace():
    """Yields a list that fills with one (kernel name, total, distinct) per launch made inside the
    block, ``total`` a Counter {(param, "read"|"write"): accesses}, ``distinct`` the same keys ->
    elements distinct within each thread block, summed over blocks."""
    from numba.cuda.simulator import kernel as sk
    from numba.cuda.simulator.cudadrv import devicearray as da

    launches: list = []
    lock = threading.Lock()
    state = {"ranges": []}  # (start, end, param) of the current launch's arrays

    def name_of(ary) -> str | None:
        p = _ptr(ary)
        for lo, hi, nm in state["ranges"]:
            if lo <= p < hi:
                return nm
        return None

    get0, set0, call0 = da.FakeCUDAArray.__getitem__, da.FakeCUDAArray.__setitem__, sk.FakeCUDAKernel.__call__

    def count(self, idx, what):
        a = self._ary
        if not launches or np.ndim(a[idx]) != 0:
            return
        nm = name_of(a)
        if nm is None:
            return
        ix = idx if isinstance(idx, tuple) else (idx,)
        addr = _ptr(a) + int(np.dot([int(i) for i in ix], a.strides))
        block = tuple(threading.current_thread().blockIdx)
        with lock:
            launches[-1][1][(nm, what)] += 1
            launches[-1][3].setdefault((nm, what), set()).add((block, addr))

    def getitem(self, idx):
        count(self, idx, "read")
        return get0(self, idx)

    def setitem(self, idx, val):
        count(self, idx, "write")
        return set0(self, idx, val)

    def call(self, *args):
        if self._device or sk._kernel_context:
            return call0(self, *args)
        names = list(inspect.signature(self.fn).parameters)
        ranges = []
        for nm, a in zip(names, args, strict=False):
            arr = getattr(a, "_ary", a)
            if isinstance(arr, np.ndarray) and arr.ndim > 0:
                ranges.append((_ptr(arr), _ptr(arr) + arr.nbytes, nm))
        state["ranges"] = ranges
        launches.append((self.fn.__name__, Counter(), Counter(), {}))
        try:
            return call0(self, *args)
        finally:
            name, total, distinct, seen = launches[-1]
            distinct.update({k: len(v) for k, v in seen.items()})
            launches[-1] = (name, total, distinct)

    da.FakeCUDAArray.__getitem__, da.FakeCUDAArray.__setitem__ = getitem, setitem
    sk.FakeCUDAKernel.__call__ = call
    try:
        yield launches
    finally:
        da.FakeCUDAArray.__getitem__, da.FakeCUDAArray.__setitem__ = get0, set0
        sk.FakeCUDAKernel.__call__ = call0
