"""Input handling shared by the kernel launchers: numpy, Numba device arrays and CUDA tensors.

Decisions (tested in tests/test_kernel_inputs.py):

* numpy arrays are copied to the device and results copied back; a non-contiguous numpy array
  is made contiguous first (we copy anyway);
* Numba device arrays and any object with ``__cuda_array_interface__`` (torch, CuPy) are used
  in place, without a copy; they must be C-contiguous, otherwise ``ValueError`` (a silent copy
  would hide a doubling of memory traffic from the traffic measurements);
* q, k, v (and dO) must all be float32 or all float16; other dtypes (bf16 included: Numba has
  no bfloat16 arrays) raise ``ValueError``;
* results come back in the kind of the query input: numpy for numpy, a Numba device array for a
  Numba device array, and a tensor of the same library for torch or CuPy inputs;
* every copy, allocation and launch of one call is on one stream (:func:`launch_stream`): the
  ``stream=`` given, else torch's current stream for torch tensors, else Numba's default stream;
* ``None`` for an array, ``causal``/``return_lse`` that are not bools, a ``scale`` that is not a
  finite real number: ``ValueError`` naming the field (:func:`check_options`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def _is_numba_device_array(x) -> bool:
    """A Numba device array (the CUDA simulator's FakeCUDAArray included: the simulator has no
    ``cuda.is_cuda_ndarray``)."""
    check = getattr(cuda, "is_cuda_ndarray", None)
    if check is not None:
        return bool(check(x))
    return type(x).__name__ == "FakeCUDAArray"


def as_device_array(x, sync: bool = True):
    """A Numba view of a device array or a ``__cuda_array_interface__`` object, without a copy.

    ``sync``: whether Numba first waits for the stream the object's interface names (its
    producer's).  A call that launches on that very stream (torch's current stream, the default
    for torch tensors) passes False: the stream's own order already puts the kernels after the
    producer, and the wait (a stream synchronisation) would hold the host until that stream is
    idle, on every call."""
    if _is_numba_device_array(x):
        return x
    return cuda.as_cuda_array(x, sync=sync)


def _kind(x) -> str:
    mod = type(x).__module__.split(".")[0]
    if isinstance(x, np.ndarray):
        return "numpy"
    if _is_numba_device_array(x):
        return "device"
    if hasattr(x, "__cuda_array_interface__"):
        return mod if mod in ("torch", "cupy") else "device"
    return "other"


def check_options(causal=False, scale=None, return_lse=False) -> None:
    """ValueError naming the option for a ``causal`` or ``return_lse`` that is not a bool (a
    string such as 'yes' would otherwise count as True) or a ``scale`` that is not None or a finite
    real number."""
    for name, x in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(x, (bool, np.bool_)):
            raise ValueError(f"{name}={x!r}: must be a bool")
    if scale is not None and (isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real)
                              or not math.isfinite(scale)):
        raise ValueError(f"scale={scale!r}: must be None or a finite real number")


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def launch_stream(stream, first):
    """The Numba stream every copy, allocation and launch of one call runs on: ``stream`` if given
    (a Numba stream, or a torch stream wrapped with ``cuda.external_stream``), else torch's current
    stream on the tensor's device when ``first`` (the query) is a torch CUDA tensor, so that the
    kernels run after whatever produced their inputs there and the results are ready on it, else
    Numba's default stream.  torch is imported only for torch inputs or streams."""
    if stream is not None:
        if _is_torch(stream):
            return _external_stream(str(getattr(stream, "device", "")), int(stream.cuda_stream))
        if not hasattr(stream, "synchronize"):
            raise ValueError(f"stream={stream!r}: must be a Numba or torch CUDA stream")
        return stream
    if _is_torch(first) and _kind(first) == "torch":
        import torch

        return _external_stream(str(first.device), int(torch.cuda.current_stream(first.device).cuda_stream))
    return cuda.default_stream()


#: (device, stream handle) -> Numba's wrapper of that torch stream, made once: wrapping costs
#: more host time than a short kernel's launch (scripts/device/host_ab.py).  A wrapper holds only
#: the handle, so a stream torch later frees and reallocates at the same address is still right.
_EXTERNAL: dict = {}


def _external_stream(device: str, handle: int):
    key = (device, handle)
    st = _EXTERNAL.get(key)
    if st is None:
        if len(_EXTERNAL) >= 256:  # a program that makes streams without end: start again
            _EXTERNAL.clear()
        st = _EXTERNAL[key] = cuda.external_stream(handle)
    return st


@dataclass
class Inputs:
    """Device views of the inputs plus what is needed to hand results back."""

    arrays: dict  # name -> device array
    kind: str  # "numpy" | "device" | "torch" | "cupy"
    dtype: np.dtype
    stream: object = 0  # the Numba stream of this call (launch_stream)
    _owned: dict = field(default_factory=dict)  # id(device view) -> the tensor that owns its memory

    def empty(self, shape, dtype):
        """An uninitialised device array for a result.  For torch inputs the memory comes from
        torch's caching allocator (a cudaMalloc per call would cost more than a short kernel)
        and :meth:`out` hands back that tensor itself."""
        if self.kind == "torch":
            import torch

            t = torch.empty(tuple(shape), dtype=getattr(torch, np.dtype(dtype).name), device="cuda")
            dev = as_device_array(t, sync=False)  # fresh memory on the current stream: nothing to wait for
            self._owned[id(dev)] = t
            return dev
        return cuda.device_array(tuple(shape), dtype=dtype, stream=self.stream)

    def out(self, dev):
        """Return a device result in the caller's kind."""
        if id(dev) in self._owned:
            return self._owned[id(dev)]
        if self.kind == "numpy":
            host = dev.copy_to_host(stream=self.stream)
            self.stream.synchronize()
            return host
        if self.kind == "torch":
            import torch

            return torch.as_tensor(dev, device="cuda")
        if self.kind == "cupy":
            import cupy

            return cupy.asarray(dev)
        return dev


def to_device(*, stream=None, causal=False, scale=None, return_lse=False, **named) -> Inputs:
    """Validate and move/wrap arrays given by name (q=..., k=..., v=...) on the call's stream
    (:func:`launch_stream` of ``stream`` and the first array); check the options
    (:func:`check_options`)."""
    check_options(causal, scale, return_lse)
    if not named:
        raise ValueError("no arrays given")
    st = launch_stream(stream, next(iter(named.values())))
    arrays, kinds, dtypes = {}, set(), set()
    for name, x in named.items():
        if x is None:
            raise ValueError(f"{name}=None: must be an array")
        kind = _kind(x)
        if kind == "other":
            if hasattr(x, "__array__"):
                x, kind = np.asarray(x), "numpy"
            else:
                raise ValueError(f"{name}: type {type(x).__name__} is neither a numpy array nor a CUDA array")
        kinds.add("host" if kind == "numpy" else "device")
        if kind == "numpy":
            dt = x.dtype
            if dt not in SUPPORTED_DTYPES:
                raise ValueError(f"{name}.dtype={dt}: must be float32 or float16")
            arrays[name] = cuda.to_device(np.ascontiguousarray(x), stream=st)
        else:
            # inputs produced on torch's current stream, which the call launches on (stream=None):
            # no wait; with an explicit stream, Numba waits for the producer's stream first
            dev = as_device_array(x, sync=not (stream is None and kind == "torch"))
            dt = np.dtype(dev.dtype)
            if dt not in SUPPORTED_DTYPES:
                raise ValueError(f"{name}.dtype={dt}: must be float32 or float16")
            if not dev.is_c_contiguous():
                raise ValueError(f"{name}: device array must be C-contiguous (got strides {dev.strides})")
            arrays[name] = dev
        dtypes.add(dt)
    if len(dtypes) > 1:
        raise ValueError(f"dtypes={sorted(str(d) for d in dtypes)}: all inputs must share one dtype")
    if len(kinds) > 1:
        raise ValueError("inputs mix host (numpy) and device arrays: pass all on the host or all on the device")
    kind = _kind(next(iter(named.values())))
    if kind == "other":
        kind = "numpy"
    return Inputs(arrays, kind, dtypes.pop(), st)


def check_attention_shapes(q, k, v, do=None) -> tuple[int, int, int, int, int, int]:
    """Check (B, H, Nq, d), (B, Hkv, Nk, d) shapes; return (B, H, Hkv, Nq, Nk, d)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) != 4:
            raise ValueError(f"{name}.shape={tuple(x.shape)}: must be 4-D (batch, heads, seq_len, head_dim)")
    b, h, nq, d = q.shape
    bk, hkv, nk, dk = k.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}: must be equal")
    if bk != b:
        raise ValueError(f"k.shape[0]={bk}: batch must equal q.shape[0]={b}")
    if dk != d:
        raise ValueError(f"k.shape[3]={dk}: head_dim must equal q.shape[3]={d}")
    if hkv == 0 or h % hkv:
        raise ValueError(f"k.shape[1]={hkv}: kv heads must divide q heads={h}")
    if min(b, h, nq, nk, d) <= 0:
        raise ValueError(f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}: every size must be positive")
    if do is not None and tuple(do.shape) != tuple(q.shape):
        raise ValueError(f"do.shape={tuple(do.shape)}: must equal q.shape={tuple(q.shape)}")
    return b, h, hkv, nq, nk, d
