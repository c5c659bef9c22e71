"""The simulator's ``cuda.shared.array`` made thread-safe (kernels/_sim.py): every thread of a
block gets the same array for a line, and two lines get two arrays.  And its barrier without
polling: barriers in a loop, threads that return before the others' barriers, an exception in
one thread, and ``syncthreads_count`` behave as the simulator's own barrier made them.

The test switches Python threads every microsecond, which makes the race likely: without the
lock, 60 launches of this kernel (4 blocks of 128 threads, three shared arrays) gave 2 wrong
blocks of 240 here; with it, none."""

import sys

import numpy as np
import pytest
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


@cuda.jit
def _prefix_sums(out, stop_at):
    """A block-wide running sum by doubling, one barrier pair per step; threads t >= stop_at
    return before the last step (the others' barriers must not wait for them)."""
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = t + 1
    cuda.syncthreads()
    k = 1
    while k < 64:
        if t >= stop_at and k == 32:
            out[cuda.blockIdx.x, t] = -1
            return
        v = s[t - k] if t >= k else 0
        cuda.syncthreads()
        s[t] += v
        cuda.syncthreads()
        k *= 2
    out[cuda.blockIdx.x, t] = s[t] + cuda.syncthreads_count(t % 2) * 1000


@cuda.jit
def _fail_in_one_thread(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == 5:
        out[1000] = 1  # out of bounds: an IndexError in thread 5 only
    cuda.syncthreads()
    out[t] = t


def test_event_barrier_keeps_the_simulators_semantics():
    assert _sim.event_barrier()
    t = np.arange(64)
    sums = (t + 1) * (t + 2) // 2
    out = np.zeros((3, 64), np.float32)
    _prefix_sums[3, 64](out, 64)
    print(out[0, :8], out[0, -1])
    assert (out == sums + 32 * 1000).all()  # 32 odd threads counted by syncthreads_count
    out = np.zeros((2, 64), np.float32)
    _prefix_sums[2, 64](out, 48)
    # threads 48-63 left before the k = 32 step: the others finish it without them
    assert (out[:, 48:] == -1).all()
    early = np.where(t >= 32, sums - (t - 31) * (t - 30) // 2, sums)  # s[t] after the k = 16 step
    want = early[:48] + np.where(t[:48] >= 32, early[np.maximum(t[:48] - 32, 0)], 0) + 24 * 1000
    assert (out[:, :48] == want).all()
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        _fail_in_one_thread[1, 32](np.zeros(32, np.float32))
