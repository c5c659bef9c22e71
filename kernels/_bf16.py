"""bfloat16 through its bits: Numba has no bfloat16 arrays, so a bf16 tensor travels as int16 (its
16 bits; ``t.view(torch.int16)``, zero-copy) and kernels widen each element to float32 themselves
(the 16 bits shifted to the top of a float32 word) and round results back to bf16 (to nearest
even).  The bit casts are ``libdevice.int_as_float``/``float_as_int`` on the GPU and numpy views
under the CUDA simulator (its libdevice functions are stubs).  Shared by the decode kernels
(``kernels/decode.py``, ``kernels/perf/decode.py``), the reference FlashAttention-2 kernels
(``kernels/flash2.py``) and the fast kernels' host-side helpers (``kernels/perf/_launch.py``).
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, float32, int16, int32, int64

if config.ENABLE_CUDASIM:
    def _f32_from_bits_py(u):
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)

    def _bits_from_f32_py(f):
        return int(np.float32(f).view(np.uint32))

    f32_from_bits = cuda.jit(device=True)(_f32_from_bits_py)
    bits_from_f32 = cuda.jit(device=True)(_bits_from_f32_py)
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, forceinline=True)
    def f32_from_bits(u):
        return libdevice.int_as_float(int32(u))

    @cuda.jit(device=True, forceinline=True)
    def bits_from_f32(f):
        return int64(libdevice.float_as_int(f)) & 0xFFFFFFFF


@cuda.jit(device=True)
def ld_bf16(x):
    """float32 of a bf16 element held as int16 bits."""
    return f32_from_bits((int64(x) & 0xFFFF) << 16)


@cuda.jit(device=True)
def ld_plain(x):
    return float32(x)


@cuda.jit(device=True)
def cvt_bf16(f):
    """The int16 bits of float32 ``f`` rounded to bf16 (nearest even; NaN stays a quiet NaN)."""
    u = bits_from_f32(f)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        r = (u >> 16) | 0x40
    else:
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = r & 0xFFFF
    return int16(r - 65536 if r >= 32768 else r)


@cuda.jit(device=True)
def cvt_plain(f):
    return f


def loader(bf16: bool):
    """The device function that widens a stored element to float32."""
    return ld_bf16 if bf16 else ld_plain


def storer(bf16: bool):
    """The device function that makes a float32 storable (bf16: its int16 bits)."""
    return cvt_bf16 if bf16 else cvt_plain


# Host-side twins (numpy): the simulator's tensor-core helpers, kernels.reference.round_bf16.

def round_bf16_bits(x) -> np.ndarray:
    """The uint16 bits of float32 ``x`` rounded to bf16, nearest even (NaN: a quiet NaN)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, (u >> 16) | 0x40, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
    return (r & 0xFFFF).astype(np.uint16)


def bf16_bits_to_f32(bits) -> np.ndarray:
    """float32 values of bf16 bits (any 16-bit integer array)."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
