"""The simulator's ``cuda.shared.array`` made thread-safe (kernels/_sim.py): every thread of a
block gets the same array for a line, and two lines get two arrays.

The test switches Python threads every microsecond, which makes the race likely: without the
lock, 60 launches of this kernel (4 blocks of 128 threads, three shared arrays) gave 2 wrong
blocks of 240 here; with it, none."""

import sys

import numpy as np
from numba import config, cuda, float32

import kernels  # noqa: F401  (installs the patch)
from kernels import _sim


@cuda.jit
def _rotate(out):
    a = cuda.shared.array(128, float32)
    b = cuda.shared.array(128, float32)
    c = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    a[t] = t
    b[t] = -t
    c[t] = 2 * t
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = a[(t + 1) % 128] + 1000 * b[(t + 2) % 128] + c[(t + 3) % 128]


def test_shared_arrays_are_one_per_line_and_block():
    assert config.ENABLE_CUDASIM and _sim.lock_shared_arrays()
    t = np.arange(128)
    want = ((t + 1) % 128 - 1000 * ((t + 2) % 128) + 2 * ((t + 3) % 128)).astype(np.float32)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        bad = 0
        for _ in range(15):
            out = np.zeros((4, 128), np.float32)
            _rotate[4, 128](out)
            bad += int((out != want).any(axis=1).sum())
    finally:
        sys.setswitchinterval(old)
    assert bad == 0, f"{bad} of 60 blocks saw another thread's private shared array"
