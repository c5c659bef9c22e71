"""Input handling shared by the kernel launchers: numpy, Numba device arrays and CUDA tensors.

Decisions (tested in tests/test_kernel_inputs.py):

* numpy arrays are copied to the device and results copied back; a non-contiguous numpy array
  is made contiguous first (we copy anyway);
* Numba device arrays and any object with ``__cuda_array_interface__`` (torch, CuPy) are used
  in place, without a copy; they must be C-contiguous, otherwise ``ValueError`` (a silent copy
  would hide a doubling of memory traffic from the traffic measurements);
* q, k, v (and dO) must all be float32, all float16, or (where the caller takes it:
  ``to_device(bf16=True)``) all bfloat16; other dtypes raise ``ValueError``.  Numba has no
  bfloat16 arrays: a torch bf16 tensor travels as its int16 bits (``t.view(torch.int16)``, no
  copy; :data:`BF16` is that carrier's dtype, ``Inputs.bf16`` says so), a CPU one copied to the
  device like a numpy array, its results coming back as CPU torch tensors (kind "torch-cpu");
* results come back in the kind of the query input: numpy for numpy, a Numba device array for a
  Numba device array, and a tensor of the same library for torch or CuPy inputs;
* every copy, allocation and launch of one call is on one stream (:func:`launch_stream`): the
  ``stream=`` given, else torch's current stream for torch tensors, else Numba's default stream;
* a torch tensor that requires grad: ``ValueError`` naming it (these kernels record no autograd:
  ``kernels.torch_op.attention`` does);
* a device array whose data pointer is not 16-byte aligned: the fast kernels refuse it with a
  ``ValueError`` naming it (:func:`check_fast_alignment`; they copy 16 bytes at a time, and a
  misaligned copy is a CUDA error that ends the context), and ``impl="auto"`` gives it to the
  reference kernels, which read element by element;
* ``None`` for an array, ``causal``/``return_lse`` that are not bools, a ``scale`` that is not a
  finite real number or that float32 cannot hold once multiplied by log2(e) (:data:`SCALE_MAX`):
  ``ValueError`` naming the field (:func:`check_options`);
* a CPU torch tensor of float32 or float16 is copied like a numpy array and its results come
  back as CPU tensors (kind "torch-cpu", as for bfloat16).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from . import _direct

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
#: The dtype of the device arrays that carry bfloat16 values (their bits; ``kernels/_bf16.py``).
BF16 = np.dtype(np.int16)


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str | None:
    """'float32', 'float16', 'bfloat16', ... for a numpy dtype, a torch dtype or a name (None if it
    names no dtype); remembered per dtype (numpy's name lookup costs host time on every call)."""
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    try:
        if len(_DTYPE_NAMES) < 256:
            _DTYPE_NAMES[dtype] = name
    except TypeError:  # unhashable
        pass
    return name


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    s = str(dtype).replace("torch.", "")
    if s == "bfloat16":
        return s
    try:
        return np.dtype(dtype).name
    except TypeError:
        try:
            return np.dtype(s).name
        except TypeError:
            return None


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
    idle, on every call; such a contiguous torch tensor gets its view from :func:`_torch_view`."""
    if _is_numba_device_array(x):
        return x
    if (not sync and _is_torch(x) and getattr(x, "is_cuda", False) is True and not x.requires_grad
            and x.is_contiguous()):
        return _torch_view(x)  # (a tensor that requires grad has no interface: torch's error below)
    return cuda.as_cuda_array(x, sync=sync)


#: (data pointer, shape, dtype, device) of a contiguous CUDA tensor -> a Numba view of that memory
#: that does not hold the tensor.  Making a view costs about 13 us of host time (Numba's interface
#: import and device-array set-up; scripts/device/host_breakdown.py), five of them per forward
#: call, and torch's caching allocator hands the same addresses back call after call.  A view is
#: only a pointer, shape and dtype, so it is right for whatever live tensor has that key: the
#: caller's tensor is alive for the call, and the view is used only within it.
_VIEWS: dict = {}


def _torch_view(t):
    key = (t.data_ptr(), t.shape, t.dtype, t.device)
    dev = _VIEWS.get(key)
    if dev is None:
        if len(_VIEWS) >= 1024:
            _VIEWS.clear()
        desc = dict(t.__cuda_array_interface__)
        desc.pop("stream", None)  # no wait (sync=False), and no stream object made per view
        dev = _VIEWS[key] = cuda.from_cuda_array_interface(desc, owner=None, sync=False)
    return dev


def _kind(x) -> str:
    if getattr(x, "is_cuda", False) is True and _is_torch(x):  # without building its interface
        return "torch"
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
    if scale is not None:
        check_scale(scale)


#: The largest |scale| the kernels take: they compute in float32, with the scores scaled by
#: scale·log2(e), which must stay finite there (a larger finite scale would turn every output NaN).
SCALE_MAX = float(np.finfo(np.float32).max) / math.log2(math.e)


def check_scale(scale) -> float:
    """``scale`` as a float; ValueError naming it unless it is a real number (not a bool) with
    |scale| <= :data:`SCALE_MAX`."""
    try:
        finite = not isinstance(scale, (bool, np.bool_)) and isinstance(scale, numbers.Real) and math.isfinite(scale)
    except OverflowError:  # an int past float's range, e.g. 10**400
        finite = False
    if not finite:
        raise ValueError(f"scale={scale!r}: must be None or a finite real number")
    if abs(float(scale)) > SCALE_MAX:
        raise ValueError(f"scale={scale!r}: |scale| must be at most {SCALE_MAX:.3g} (the kernels scale the scores by "
                         "scale·log2(e) in float32)")
    return float(scale)


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
        dev = first.device
        return _external_stream(str(dev), _current_stream_handle(dev))
    return cuda.default_stream()


def _current_stream_handle(dev) -> int:
    """The handle of torch's current stream on device ``dev``: torch's own raw-stream query
    (what Triton's launcher calls; a fraction of a microsecond), else the public
    ``torch.cuda.current_stream(dev).cuda_stream`` (a stream object made per call, 3-7 us)."""
    import torch

    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw is not None and dev.index is not None:
        return int(raw(dev.index))
    return int(torch.cuda.current_stream(dev).cuda_stream)


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
            _direct.forget_streams()
        st = _EXTERNAL[key] = cuda.external_stream(handle)
        _direct.register_stream(st, handle)
    return st


@dataclass
class Inputs:
    """Device views of the inputs plus what is needed to hand results back."""

    arrays: dict  # name -> device array
    kind: str  # "numpy" | "torch-cpu" | "device" | "torch" | "cupy"
    dtype: np.dtype  # of the device arrays: float32, float16, or BF16 (int16 bits) for bfloat16
    stream: object = 0  # the Numba stream of this call (launch_stream)
    _owned: dict = field(default_factory=dict)  # id(device view) -> the tensor that owns its memory

    @property
    def bf16(self) -> bool:
        """Whether the inputs are bfloat16 (carried as int16 bits)."""
        return self.dtype == BF16

    @property
    def dtype_name(self) -> str:
        """'float32', 'float16' or 'bfloat16'."""
        return "bfloat16" if self.bf16 else self.dtype.name

    @property
    def host(self) -> bool:
        """Whether the inputs came from the host (numpy arrays or CPU torch tensors)."""
        return self.kind in ("numpy", "torch-cpu")

    def empty(self, shape, dtype):
        """An uninitialised device array for a result (``dtype`` :data:`BF16` for a bfloat16
        result, when the inputs are bfloat16).  For torch inputs the memory comes from torch's
        caching allocator (a cudaMalloc per call would cost more than a short kernel) and
        :meth:`out` hands back that tensor itself."""
        if self.kind == "torch":
            import torch

            bf16 = self.bf16 and np.dtype(dtype) == BF16
            tdt = torch.bfloat16 if bf16 else getattr(torch, np.dtype(dtype).name)
            t = torch.empty(tuple(shape), dtype=tdt, device="cuda")
            # fresh memory on the current stream: nothing to wait for
            dev = as_device_array(t.view(torch.int16) if bf16 else t, sync=False)
            self._owned[id(dev)] = t
            _direct.note_alloc(t)
            return dev
        return cuda.device_array(tuple(shape), dtype=dtype, stream=self.stream)

    def out(self, dev):
        """Return a device result in the caller's kind."""
        if id(dev) in self._owned:
            return self._owned[id(dev)]
        if self.kind in ("numpy", "torch-cpu"):
            host = dev.copy_to_host(stream=self.stream)
            self.stream.synchronize()
            if self.kind == "numpy":
                return host
            import torch

            t = torch.from_numpy(np.ascontiguousarray(host))
            return t.view(torch.bfloat16) if self.bf16 and host.dtype == BF16 else t
        if self.kind == "torch":
            import torch

            return torch.as_tensor(dev, device="cuda")
        if self.kind == "cupy":
            import cupy

            return cupy.asarray(dev)
        return dev


def _bf16_tensor(name, x, st, sync, bf16):
    """(device array of the int16 bits, kind) of a torch bfloat16 tensor, without a copy on the
    device; ValueError where the caller has no bf16 path (``bf16`` False)."""
    if not bf16:
        raise ValueError(f"{name}.dtype={x.dtype}: must be float32 or float16 (this kernel has no bfloat16 path)")
    import torch

    bits = x.view(torch.int16)  # (to_device refused a tensor that requires grad)
    if x.device.type != "cuda":
        return cuda.to_device(np.ascontiguousarray(bits.contiguous().numpy()), stream=st), "torch-cpu"
    if not x.is_contiguous():
        raise ValueError(f"{name}: device array must be C-contiguous (got strides {tuple(x.stride())})")
    return as_device_array(bits, sync=sync), "torch"


def to_device(*, stream=None, causal=False, scale=None, return_lse=False, bf16=False, **named) -> Inputs:
    """Validate and move/wrap arrays given by name (q=..., k=..., v=...) on the call's stream
    (:func:`launch_stream` of ``stream`` and the first array); check the options
    (:func:`check_options`).  ``bf16``: whether torch bfloat16 tensors are taken (as their bits,
    dtype :data:`BF16`)."""
    check_options(causal, scale, return_lse)
    if not named:
        raise ValueError("no arrays given")
    st = launch_stream(stream, next(iter(named.values())))
    arrays, kinds, dtypes = {}, set(), set()
    first_kind = None
    for name, x in named.items():
        if x is None:
            raise ValueError(f"{name}=None: must be an array")
        if _is_torch(x) and getattr(x, "requires_grad", False) is True:
            raise ValueError(f"{name}: requires grad, and these kernels record no autograd: pass {name}.detach(), "
                             "or kernels.torch_op.attention for gradients")
        if _is_torch(x) and str(getattr(x, "dtype", "")) == "torch.bfloat16":
            arrays[name], kind = _bf16_tensor(name, x, st, stream is not None, bf16)
            kinds.add("host" if kind == "torch-cpu" else "device")
            dtypes.add(BF16)
            first_kind = first_kind or kind
            continue
        kind = _kind(x)
        if kind == "other" and _is_torch(x) and getattr(x, "device", None) is not None and x.device.type == "cpu":
            x, kind = x.detach().contiguous().numpy(), "torch-cpu"  # results come back as CPU tensors
        elif kind == "other":
            if hasattr(x, "__array__"):
                x, kind = np.asarray(x), "numpy"
            else:
                raise ValueError(f"{name}: type {type(x).__name__} is neither a numpy array nor a CUDA array")
        kinds.add("host" if kind in ("numpy", "torch-cpu") else "device")
        if kind in ("numpy", "torch-cpu"):
            dt = x.dtype
            if dt not in SUPPORTED_DTYPES:
                raise ValueError(f"{name}.dtype={dt}: must be float32 or float16"
                                 + (" (bfloat16: pass torch tensors)" if bf16 else ""))
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
        first_kind = first_kind or kind
    if len(dtypes) > 1:
        names = sorted("bfloat16" if d == BF16 else str(d) for d in dtypes)
        raise ValueError(f"dtypes={names}: all inputs must share one dtype")
    if len(kinds) > 1:
        raise ValueError("inputs mix host (numpy) and device arrays: pass all on the host or all on the device")
    return Inputs(arrays, first_kind, dtypes.pop(), st)


#: Bytes to which the fast kernels need a device array's data aligned: they copy 16 bytes at a time
#: (cp.async, and the TMA unit's tensor maps), and a misaligned copy is a CUDA error that ends the
#: process's context.
FAST_ALIGN = 16


def device_pointer(x) -> int | None:
    """The data pointer of a device array (a CUDA torch tensor, any ``__cuda_array_interface__``
    object), None for host arrays (they are copied to fresh, aligned device memory)."""
    if _is_torch(x):
        return int(x.data_ptr()) if getattr(x, "is_cuda", False) else None
    cai = getattr(x, "__cuda_array_interface__", None)
    return int(cai["data"][0]) if cai else None


def misaligned(align: int = FAST_ALIGN, **arrays) -> str | None:
    """The name of the first of ``arrays`` on the device whose data pointer is not ``align``-byte
    aligned (a contiguous tensor sliced at an odd offset), else None."""
    for name, x in arrays.items():
        p = device_pointer(x)
        if p is not None and p % align:
            return name
    return None


def check_fast_alignment(**arrays) -> None:
    """ValueError naming the first device array the fast kernels cannot copy from (:func:`misaligned`)."""
    name = misaligned(**arrays)
    if name is not None:
        raise ValueError(f"{name}: data pointer {device_pointer(arrays[name]):#x} is not {FAST_ALIGN}-byte aligned "
                         f"(the fast kernels copy {FAST_ALIGN} bytes at a time); pass a copy, or impl='reference'")


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
