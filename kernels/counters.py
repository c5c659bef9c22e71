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


def device_counters(counters, stream=0, *, exact: bool = False):
    """(device array the kernels add to, function that hands the totals back) for a launcher's
    ``counters=``, checked before any kernel runs.

    None: a zeroed stand-in (kernels compiled without counting never touch it; ``exact``: of
    :func:`new_counters`' shape, else one row).  A numpy array, or a CPU int64 torch tensor (its
    numpy view, so the totals land in the tensor): copied to the device, the totals copied back;
    it must be writeable and C-contiguous.  A device array (Numba, or any
    ``__cuda_array_interface__`` object: torch, CuPy): used in place.  ValueError naming
    ``counters`` for any other type, a dtype other than int64, or a shape without a row per
    tensor (``exact``: exactly :func:`new_counters`' shape).
    """
    from numba import cuda

    from ._arrays import _is_torch, as_device_array

    rows = len(TENSORS)
    if counters is None:
        return cuda.to_device(np.zeros((rows if exact else 1, 2), dtype=np.int64), stream=stream), lambda dev: None

    def check(dtype, shape):
        ok = np.dtype(dtype) == np.int64 and len(shape) == 2 and (
            tuple(shape) == (rows, 2) if exact else shape[0] >= rows)
        if not ok:
            want = f"an int64 {(rows, 2)} array" if exact else "an int64 (len(TENSORS), 2) array"
            raise ValueError(f"counters: must be {want} from kernels.counters.new_counters(), got {dtype} "
                             f"{tuple(shape)}")

    if _is_torch(counters) and counters.device.type == "cpu":
        counters = counters.numpy()
    if isinstance(counters, np.ndarray):
        check(counters.dtype, counters.shape)
        if not (counters.flags.writeable and counters.flags.c_contiguous):
            raise ValueError("counters: must be a writeable C-contiguous array (the totals are added into it)")

        def back(dev):
            counters[...] = dev.copy_to_host(stream=stream)
            stream.synchronize()

        return cuda.to_device(counters, stream=stream), back
    if not hasattr(counters, "copy_to_host") and not hasattr(counters, "__cuda_array_interface__"):
        raise ValueError(f"counters: type {type(counters).__name__} is neither a numpy nor a device array")
    dev = as_device_array(counters)
    check(dev.dtype, dev.shape)
    return dev, lambda d_: None
