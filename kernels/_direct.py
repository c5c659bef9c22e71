"""Launching compiled Numba kernels on torch's streams without Numba's per-call argument work.

``kern[grid, block, stream, smem](*args)`` costs about 40 us of host time on the H100 machine for
a seven-argument kernel (``scripts/device/host_breakdown.py``): Numba types every argument, wraps
each array, builds a launch configuration and a stream object, and only then calls the driver.
A short attention call (B·H = 4, N = 4,096) runs for less than that on the GPU, so a launcher that
spends it per kernel is host-bound.  :func:`launch` does the same launch with what Numba itself
hands the driver (``numba.cuda.dispatcher._Kernel.launch``: per array meminfo 0, parent 0,
size, itemsize, data pointer, shape, strides in bytes; per scalar a ctypes value of its type),
through ``cuda.core.launch``, the library Numba launches with:

* the first launch of a (kernel, argument types, stream) goes through Numba's dispatcher, which
  compiles and type-checks it; its compiled overload (looked up by Numba's own types of the
  arguments) and the ``cuda.core`` kernel are then remembered;
* later launches with arguments of the same Numba types pack them directly; the launch
  configuration and the ``cuda.core`` stream are made once per (grid, block, shared memory) and
  per stream.

Only for streams made by :func:`kernels._arrays._external_stream` (torch's streams: the path every
torch call takes); Numba's own streams, the CUDA simulator and arguments of other types take
Numba's dispatcher as before.  ``FLASHSIM_DIRECT_LAUNCH=0`` turns it off.  What it packs is
checked against Numba's own ``_Kernel._prepare_args`` on the GPU (``tests/test_direct_launch.py``)."""

from __future__ import annotations

import ctypes
import os

import numpy as np
from numba import config

#: id(Numba stream) -> its cuda.core stream, for the streams the direct path may take.
_STREAMS: dict = {}
#: (id(kernel), id(stream), argument keys) -> (dispatcher (held, so that its id is never reused),
#: cuda.core kernel, packers), or None where the direct path does not apply.
_COMPILED: dict = {}
#: (grid, block, shared bytes) -> cuda.core LaunchConfig.
_CONFIGS: dict = {}
#: cuda.core (LaunchConfig, launch, Stream), imported by the first :func:`register_stream`.
_CORE: list = []


def enabled() -> bool:
    """Whether launches may skip Numba's dispatcher (off under the simulator and with
    ``FLASHSIM_DIRECT_LAUNCH=0``)."""
    return not config.ENABLE_CUDASIM and os.environ.get("FLASHSIM_DIRECT_LAUNCH", "1") != "0"


def register_stream(numba_stream, handle: int) -> None:
    """Allow the direct path on ``numba_stream`` (an external stream wrapping ``handle``)."""
    if not enabled():
        return
    if not _CORE:
        from cuda.core import LaunchConfig, Stream
        from cuda.core import launch as core_launch

        _CORE.extend((LaunchConfig, core_launch, Stream))
    _STREAMS[id(numba_stream)] = (numba_stream, _CORE[2].from_handle(int(handle)))


#: Callables run by :func:`forget_streams` (the prepared launches kept above this module).
ON_FORGET: list = []


def forget_streams() -> None:
    """Drop every registered stream and what was remembered for it (prepared launches included)."""
    _STREAMS.clear()
    _COMPILED.clear()
    for f in ON_FORGET:
        f()


def _argkey(a):
    """What decides the compiled overload: Numba's type of a device array (cached on the array),
    the Python type of anything else."""
    t = getattr(a, "_numba_type_", None)
    return t if t is not None else type(a)


def _packer(ty):
    """A function appending an argument of Numba type ``ty`` to the driver's argument list, as
    ``_Kernel._prepare_args`` does, or None for a type this path does not take."""
    from numba.core import types

    if isinstance(ty, types.Array):
        def array(a, out):
            out += (0, 0, a.size, a.dtype.itemsize, a.device_ctypes_pointer.value or 0)
            out += a.shape
            out += a.strides
        return array
    if ty == types.float32:
        return lambda x, out: out.append(ctypes.c_float(x))
    if ty == types.float64:
        return lambda x, out: out.append(ctypes.c_double(x))
    if isinstance(ty, types.Integer):
        c = getattr(ctypes, f"c_{ty}")
        return lambda x, out: out.append(c(x))
    return None


def pack(packers, args) -> list:
    """The driver's argument list of ``args`` (what :func:`launch` hands ``cuda.core.launch``)."""
    out: list = []
    for p, a in zip(packers, args):
        p(a, out)
    return out


def _remember(kern, args):
    """(dispatcher, cuda.core kernel, packers) of the overload the dispatcher chose for ``args``, or None."""
    try:
        types = tuple(kern.typeof_pyval(a) for a in args)
        compiled = kern.overloads.get(types)
        if compiled is None:
            return None
        packers = tuple(_packer(t) for t in compiled.argument_types)
        if any(p is None for p in packers) or len(packers) != len(args):
            return None
        return kern, compiled.library.get_cufunc().kernel, packers
    except Exception:  # noqa: BLE001 - anything unexpected: Numba's own path, always correct
        return None


def _norm(dim) -> tuple:
    dim = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    return tuple(int(x) for x in dim) + (1,) * (3 - len(dim))


def launch(kern, grid, block, stream, smem, *args) -> None:
    """``kern[grid, block, stream, smem](*args)``, directly where the stream allows it; noted by
    every active :class:`Recorder`."""
    _launch(kern, grid, block, stream, smem, args)
    for r in _RECORDERS:
        r.launches.append((kern, grid, block, stream, smem, args))


def _core_stream(stream):
    """The cuda.core stream registered for ``stream`` (:func:`register_stream`), or None."""
    st = _STREAMS.get(id(stream))
    return st[1] if st is not None and st[0] is stream else None


def _launch_config(grid, block, smem):
    """cuda.core's LaunchConfig for (grid, block, shared bytes), made once."""
    ckey = (grid, block, smem)
    cfg = _CONFIGS.get(ckey)
    if cfg is None:
        if len(_CONFIGS) >= 4096:
            _CONFIGS.clear()
        cfg = _CONFIGS[ckey] = _CORE[0](grid=_norm(grid), block=_norm(block), shmem_size=int(smem))
    return cfg


def _launch(kern, grid, block, stream, smem, args) -> None:
    cst = _core_stream(stream)
    if cst is None:
        kern[grid, block, stream, smem](*args)
        return
    key = (id(kern), id(stream), *(_argkey(a) for a in args))
    ent = _COMPILED.get(key, False)
    if ent is False:  # first launch of these types: Numba's dispatcher, then remember
        kern[grid, block, stream, smem](*args)
        _COMPILED[key] = _remember(kern, args)
        return
    if ent is None:
        kern[grid, block, stream, smem](*args)
        return
    _CORE[1](cst, _launch_config(grid, block, smem), ent[1], *pack(ent[2], args))


#: The active recorders (:class:`Recorder`), innermost last.
_RECORDERS: list = []
#: Data pointers of device arrays that live as long as the process (a prepared call may pass them
#: as they are, e.g. the preprocess kernel's unused counters).
PERSISTENT: set = set()
#: Data pointers of device arrays made from a call's inputs (the tensor maps of fwd_fp16_v7:
#: ``kernels.perf.tma``) -> (make, source pointers): ``make(*new source pointers)`` gives the
#: pointer of the array for a prepared call's new inputs.
DERIVED: dict = {}


class Recorder:
    """While active (``with Recorder() as r:``): every :func:`launch` (kernel, grid, block, stream,
    shared bytes, arguments) and every result buffer noted by :func:`note_alloc`, in order, so that
    a call can be prepared for later calls of the same shapes (``kernels.perf._launch``)."""

    def __init__(self):
        self.launches: list = []
        self.allocs: list = []

    def __enter__(self):
        _RECORDERS.append(self)
        return self

    def __exit__(self, *exc):
        _RECORDERS.remove(self)
        return False


def recording() -> bool:
    """Whether a :class:`Recorder` is active."""
    return bool(_RECORDERS)


def note_alloc(tensor) -> None:
    """Tell the active recorders of a buffer (a torch tensor) the call has just allocated."""
    for r in _RECORDERS:
        r.allocs.append(tensor)


class Prepared:
    """One launch whose kernel, grid, block, shared memory, stream, scalars and array shapes are
    fixed, only the arrays' data pointers given per call (:func:`prepare`): what a call that
    repeats with new tensors of the same shapes needs, without Numba's views of them."""

    __slots__ = ("_go", "_stream", "_cfg", "_kernel", "_template", "_slots")

    def __init__(self, go, stream, cfg, kernel, template, slots):
        self._go, self._stream, self._cfg, self._kernel = go, stream, cfg, kernel
        self._template, self._slots = template, slots

    @property
    def pointers(self) -> tuple:
        """The data pointers of the launch it was prepared from, one per array argument."""
        return tuple(self._template[i] for i in self._slots)

    def __call__(self, *pointers) -> None:
        """Launch with these data pointers, one per array argument in argument order."""
        vals = self._template.copy()
        for i, p in zip(self._slots, pointers):
            vals[i] = p
        self._go(self._stream, self._cfg, self._kernel, *vals)


def prepare(kern, grid, block, stream, smem, args):
    """A :class:`Prepared` launch of ``kern`` with the types, shapes and scalar values of ``args``
    on ``stream`` (one :func:`register_stream` took), or None where the direct path does not
    apply.  ``kern`` must have been launched with arguments of these types (its overload exists).
    The argument list is :func:`pack`'s with each array's data pointer (its fifth item) left as a
    slot."""
    cst = _core_stream(stream)
    if cst is None:
        return None
    ent = _remember(kern, args)
    if ent is None:
        return None
    template: list = []
    slots = []
    for p, a in zip(ent[2], args):
        if hasattr(a, "device_ctypes_pointer"):  # an array: meminfo, parent, size, itemsize, data, ...
            slots.append(len(template) + 4)
        p(a, template)
    return Prepared(_CORE[1], cst, _launch_config(grid, block, smem), ent[1], template, tuple(slots))
