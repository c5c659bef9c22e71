"""Tensor maps for the TMA copies of ``fwd_fp16_v7`` (``tc.tma_load3``): K and V of a forward call.

On a GPU a tensor map is the 128-byte ``CUtensorMap`` the driver's ``cuTensorMapEncodeTiled``
writes (called through ctypes on ``libcuda``, which every CUDA driver installs; Numba's driver
bindings do not list it), here for a (B·Hkv, N, d) fp16 tensor (bf16 moves as its bits), read
by the TMA unit in boxes of ``box_cols`` x ``box_rows`` into shared memory swizzled in rows of
``row_bytes`` (128 or 64: the layout ``_tiles.f16_swizzled`` describes), coordinates past N or d
filled with zeros.  :func:`kv_maps` puts K's and V's maps in one 256-byte device array, which
the kernel reads from global memory; it remembers them per (pointers, shape, box), as a call's
tensors are often the last call's.  Under the CUDA simulator the "maps" are K and V themselves
with the box (:class:`SimMaps`), which ``tc_sim.tma_load3`` copies from.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
from numba import config, cuda

from .._arrays import device_pointer

# CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
# CUtensorMapFloatOOBfill (cuda.h)
_FLOAT16 = 6
_INTERLEAVE_NONE = 0
_SWIZZLE = {64: 2, 128: 3}
_L2_PROMOTION_128B = 2
_OOB_FILL_ZERO = 0

_ENCODE: list = []
#: (k pointer, v pointer, shape, box) -> the device array of the two maps
_MAPS: dict = {}


@dataclass(frozen=True)
class SimMaps:
    """The simulator's stand-in for the maps: the tensors (each (Z, R, C)) and the box."""

    tensors: tuple
    box_cols: int
    box_rows: int
    row_bytes: int


def _encode_fn():
    if not _ENCODE:
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _ENCODE.append(fn)
    return _ENCODE[0]


def encode(out: np.ndarray, ptr: int, shape: tuple[int, int, int], box_cols: int, box_rows: int,
           row_bytes: int) -> None:
    """Write into ``out`` (128 bytes, 64-byte aligned) the map of the contiguous fp16 tensor at
    device address ``ptr`` of shape (Z, R, C): boxes of box_cols x box_rows x 1."""
    z, r, c = shape
    if ptr % 16 or (c * 2) % 16:
        raise ValueError(f"ptr={ptr:#x}, d={c}: a tensor map needs 16-byte aligned rows")
    if box_cols * 2 != row_bytes or row_bytes not in _SWIZZLE or not 1 <= box_rows <= 256:
        raise ValueError(f"{box_cols=}, {box_rows=}, {row_bytes=}: a box row is one 64- or 128-byte swizzle row")
    dims = (ctypes.c_uint64 * 3)(c, r, z)
    strides = (ctypes.c_uint64 * 2)(c * 2, r * c * 2)
    box = (ctypes.c_uint32 * 3)(box_cols, box_rows, 1)
    estr = (ctypes.c_uint32 * 3)(1, 1, 1)
    rc = _encode_fn()(out.ctypes.data, _FLOAT16, 3, ctypes.c_void_p(ptr), dims, strides, box, estr,
                      _INTERLEAVE_NONE, _SWIZZLE[row_bytes], _L2_PROMOTION_128B, _OOB_FILL_ZERO)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled: CUresult {rc} for shape {shape}, box ({box_cols}, {box_rows})")


def kv_maps(k, v, box_cols: int, box_rows: int, row_bytes: int):
    """The tensor maps of K and V ((B, Hkv, N, d) fp16 device arrays, contiguous), as the
    kernel's ``tm`` argument: a device array of 256 bytes (K's map, then V's), or under the
    simulator a :class:`SimMaps`."""
    b, h, n, d = k.shape
    if config.ENABLE_CUDASIM:
        host = tuple(np.asarray(x.copy_to_host() if hasattr(x, "copy_to_host") else x).reshape(b * h, n, d)
                     for x in (k, v))
        return SimMaps(host, box_cols, box_rows, row_bytes)
    return maps_at(device_pointer(k), device_pointer(v), (b * h, n, d), box_cols, box_rows, row_bytes)


def maps_at(kp: int, vp: int, shape, box_cols: int, box_rows: int, row_bytes: int):
    """:func:`kv_maps` from the tensors' device addresses (a prepared call's replay, whose new
    tensors have the shape of the recorded ones)."""
    key = (kp, vp, tuple(shape), box_cols, box_rows, row_bytes)
    dev = _MAPS.get(key)
    if dev is None:
        raw = np.zeros(256 + 64, np.uint8)
        host = raw[(-raw.ctypes.data) % 64:][:256]
        encode(host[:128], kp, tuple(shape), box_cols, box_rows, row_bytes)
        encode(host[128:], vp, tuple(shape), box_cols, box_rows, row_bytes)
        dev = cuda.to_device(host)  # synchronous: in device memory before any later launch
        from .. import _direct

        if len(_MAPS) >= 256:
            for old in _MAPS.values():
                _direct.DERIVED.pop(device_pointer(old), None)
            _MAPS.clear()
        _MAPS[key] = dev
        _direct.DERIVED[device_pointer(dev)] = (lambda k_, v_: device_pointer(
            maps_at(k_, v_, shape, box_cols, box_rows, row_bytes)), (kp, vp))
    return dev
