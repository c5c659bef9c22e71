"""Global-memory traffic counters for the kernels: the bridge between simulated and measured.

Every kernel module builds its kernels through a factory that takes ``count: bool``.  With
``count=False`` (the default) the counting code is behind a compile-time constant and Numba
removes it: the kernel is the same machine code as one written without counters.  With
``count=True`` one thread of each thread block adds the size of every tile transfer it
makes (in elements) to a device array of shape ``(len(TENSORS), 2)`` with ``cuda.atomic.add``:
column 0 counts reads, column 1 writes.

In the CUDA simulator these counts must equal the walker of ``flashsim`` exactly for the same
workload and tiling (tests/test_counters*.py); on the GPU they are what the kernel asked for,
which Nsight Compute's LSU-level byte counts then check.
"""

from __future__ import annotations

import numpy as np

#: Row index of each tensor in a counter array.  Append only: indices are baked into kernels.
TENSORS = ("Q", "K", "V", "O", "L", "m", "l", "D", "dO", "dQ", "dK", "dV", "S", "P", "dP", "dS", "Z",
           "Op", "Lp", "BT", "Lens")
INDEX = {name: i for i, name in enumerate(TENSORS)}
READ, WRITE = 0, 1


def new_counters():
    """A zeroed host array for the counters (copy it to the device for a launch)."""
    return np.zeros((len(TENSORS), 2), dtype=np.int64)


def to_elements(counters) -> dict[tuple[str, str], int]:
    """Counter array -> {(tensor, "read" | "write"): elements}, zero entries dropped, in the
    same form as ``flashsim.traffic.IOCount.elements_by_key()``."""
    c = np.asarray(counters)
    out = {}
    for name, i in INDEX.items():
        for col, dr in ((READ, "read"), (WRITE, "write")):
            if c[i, col]:
                out[(name, dr)] = int(c[i, col])
    return dict(sorted(out.items()))
