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

``requests``: the 32-byte sectors of each warp's requests, for kernels whose accesses to an array
are scalar instructions that every lane of a warp makes alike (no lane skips one: whole blocks,
no row past N): the k-th access of each lane of a warp to that array is taken as one
instruction, and its sectors are the distinct sectors (offsets from the array's start, which a
GPU allocation aligns to 256 bytes) its lanes touch, summed over instructions, warps and blocks.
Meaningless for the cp.async and reduction twins, which move a lane's 16 bytes as 4 scalar
accesses.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections import Counter

import numpy as np


def _ptr(a) -> int:
    return a.__array_interface__["data"][0]


class Launches(list):
    """:func:`trace`'s list of launches, with ``sequences``: per launch, {(block, thread id, param,
    "read"|"write"): the byte offsets from the array's start that thread accessed, in order}, for
    a test that groups accesses into instructions by what it knows of the kernel."""

    def __init__(self):
        super().__init__()
        self.sequences: list = []


@contextlib.contextmanager
def trace():
    """Yields a list (:class:`Launches`) that fills with one (kernel name, total, distinct,
    requests) per launch made inside the block, ``total`` a Counter {(param, "read"|"write"):
    accesses}, ``distinct`` the same keys -> elements distinct within each thread block, summed
    over blocks, ``requests`` the same keys -> sectors of the warps' requests (see the module
    docstring)."""
    from numba.cuda.simulator import kernel as sk
    from numba.cuda.simulator.cudadrv import devicearray as da

    launches = Launches()
    lock = threading.Lock()
    state = {"ranges": []}  # (start, end, param) of the current launch's arrays

    def name_of(ary) -> tuple[str | None, int]:
        p = _ptr(ary)
        for lo, hi, nm in state["ranges"]:
            if lo <= p < hi:
                return nm, lo
        return None, 0

    get0, set0, call0 = da.FakeCUDAArray.__getitem__, da.FakeCUDAArray.__setitem__, sk.FakeCUDAKernel.__call__

    def count(self, idx, what):
        a = self._ary
        if not launches or np.ndim(a[idx]) != 0:
            return
        nm, lo = name_of(a)
        if nm is None:
            return
        ix = idx if isinstance(idx, tuple) else (idx,)
        addr = _ptr(a) + int(np.dot([int(i) for i in ix], a.strides))
        th = threading.current_thread()
        block = tuple(th.blockIdx)
        with lock:
            launches[-1][1][(nm, what)] += 1
            launches[-1][3].setdefault((nm, what), set()).add((block, addr))
            launches[-1][4].setdefault((block, th.thread_id, nm, what), []).append(addr - lo)

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
        launches.append((self.fn.__name__, Counter(), Counter(), {}, {}))
        try:
            return call0(self, *args)
        finally:
            name, total, distinct, seen, seq = launches[-1]
            distinct.update({k: len(v) for k, v in seen.items()})
            launches[-1] = (name, total, distinct, _requests(seq))
            launches.sequences.append(seq)

    da.FakeCUDAArray.__getitem__, da.FakeCUDAArray.__setitem__ = getitem, setitem
    sk.FakeCUDAKernel.__call__ = call
    try:
        yield launches
    finally:
        da.FakeCUDAArray.__getitem__, da.FakeCUDAArray.__setitem__ = get0, set0
        sk.FakeCUDAKernel.__call__ = call0


def _requests(seq: dict) -> Counter:
    """{(param, what): sectors} from each thread's ordered accesses (``seq``: (block, thread id,
    param, what) -> byte offsets): the k-th accesses of a warp's lanes are one request."""
    warps: dict = {}
    for (block, tid, nm, what), offs in seq.items():
        warps.setdefault((block, tid // 32, nm, what), []).append(offs)
    out = Counter()
    for (_, _, nm, what), lanes in warps.items():
        for k in range(max(len(x) for x in lanes)):
            out[(nm, what)] += len({x[k] // 32 for x in lanes if k < len(x)})
    return out
