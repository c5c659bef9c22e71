"""kernels._direct: launches that skip Numba's per-call argument work pack exactly what Numba
packs, fall back to Numba's dispatcher wherever they do not apply, and (on the GPU) give the same
bits as the dispatcher's launches."""

import ctypes
import os

import numpy as np
import pytest
from numba.core import types

from kernels import _direct


class FakeArray:
    """The attributes the packer reads of a Numba device array."""

    def __init__(self, ptr, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(shape))
        st, acc = [], self.dtype.itemsize
        for s in reversed(self.shape):
            st.append(acc)
            acc *= s
        self.strides = tuple(reversed(st))
        self.device_ctypes_pointer = ctypes.c_void_p(ptr)


def test_array_packed_as_numba_does():
    """meminfo 0, parent 0, size, itemsize, data pointer, shape, strides in bytes (Numba's
    ``_Kernel._prepare_args`` for an array argument)."""
    a = FakeArray(0x7F0000001000, (2, 3, 5, 64), np.float16)
    out = _direct.pack((_direct._packer(types.Array(types.float16, 4, "C")),), (a,))
    print(out)
    assert out == [0, 0, 1920, 2, 0x7F0000001000, 2, 3, 5, 64, 1920, 640, 128, 2]


def test_scalars_packed_as_ctypes_of_their_type():
    p32, p64, pi = (_direct._packer(t) for t in (types.float32, types.float64, types.int32))
    out = _direct.pack((p32, p64, pi), (np.float32(0.5), 2.0, np.int32(-3)))
    assert [type(x) for x in out] == [ctypes.c_float, ctypes.c_double, ctypes.c_int32]
    assert [x.value for x in out] == [0.5, 2.0, -3]
    assert _direct._packer(types.boolean) is None  # not taken: Numba's own path


class FakeKernel:
    def __init__(self):
        self.calls = []

    def __getitem__(self, cfg):
        return lambda *args: self.calls.append((cfg, args))


def test_unregistered_stream_goes_through_the_dispatcher():
    """Numba's own streams (and everything under the simulator) launch as before."""
    kern = FakeKernel()
    _direct.launch(kern, (4, 2), 128, 0, 1024, "a", np.float32(1))
    assert kern.calls == [(((4, 2), 128, 0, 1024), ("a", np.float32(1)))]
    assert not _direct._COMPILED


def test_off_under_the_simulator():
    from numba import config

    assert _direct.enabled() is (not config.ENABLE_CUDASIM and os.environ.get("FLASHSIM_DIRECT_LAUNCH", "1") != "0")


@pytest.mark.gpu
def test_pack_equals_numbas_prepare_args():
    """On real device arrays and scalars, :func:`kernels._direct.pack` gives the list Numba's
    ``_Kernel._prepare_args`` builds (pointers and ints equal, ctypes scalars of the same type
    and value)."""
    from numba import cuda

    @cuda.jit
    def k(a, b, x, n):
        pass

    a = cuda.device_array((3, 5, 64), np.float16)
    b = cuda.device_array(7, np.float32)
    args = (a, b, np.float32(1.5), np.int64(9))
    k[1, 32](*args)
    cuda.synchronize()
    compiled = k.overloads[tuple(k.typeof_pyval(x) for x in args)]
    ref: list = []
    for t, v in zip(compiled.argument_types, args):
        compiled._prepare_args(t, v, 0, [], ref)
    mine = _direct.pack(tuple(_direct._packer(t) for t in compiled.argument_types), args)
    norm = [(type(x).__name__, x.value) if isinstance(x, ctypes._SimpleCData) else int(x) for x in ref]
    print(norm)
    assert norm == [(type(x).__name__, x.value) if isinstance(x, ctypes._SimpleCData) else int(x) for x in mine]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
def test_same_bits_as_the_dispatcher(dtype, d):
    """Forward and backward of the fast kernels on torch tensors: the direct launches (taken:
    their kernels are remembered) give bit-identical O, L, dK, dV to Numba's dispatcher, and dQ
    within rounding (bwd_fp16_v3, which runs at d = 64 and 128, sums it by atomics)."""
    torch = pytest.importorskip("torch")
    import kernels
    from kernels import _arrays

    gen = torch.Generator(device="cuda").manual_seed(d)
    dt = getattr(torch, dtype)
    q, k, v, do = (torch.randn(2, 4, 300, d, device="cuda", dtype=dt, generator=gen) for _ in range(4))

    def run():
        _arrays._EXTERNAL.clear()
        _direct.forget_streams()
        outs = []
        for _ in range(2):  # the first call fills the cache, the second launches directly
            o, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True)
            outs = [o, lse, *kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True)]
        torch.cuda.synchronize()
        return [x.clone() for x in outs]

    direct = run()
    taken = sum(e is not None for e in _direct._COMPILED.values())
    os.environ["FLASHSIM_DIRECT_LAUNCH"] = "0"
    try:
        numba_path = run()
        assert not _direct._COMPILED
    finally:
        del os.environ["FLASHSIM_DIRECT_LAUNCH"]
        _arrays._EXTERNAL.clear()
        _direct.forget_streams()
    print(dtype, d, "direct kernels remembered:", taken)
    assert taken >= 3
    for name, x, y in zip(("O", "L", "dQ", "dK", "dV"), direct, numba_path):
        if name == "dQ":  # bwd_fp16_v3 sums dQ by atomics: last bits vary run to run
            err = float((x.double() - y.double()).norm() / y.double().norm())
            print("dQ", err)
            assert err < 2e-3
            continue
        assert torch.equal(x.view(torch.int16) if x.dtype == torch.bfloat16 else x,
                           y.view(torch.int16) if y.dtype == torch.bfloat16 else y), name


def test_no_prepared_call_under_the_simulator_or_for_other_inputs():
    """kernels.perf._launch.plan_key: None (the full path, every check) for numpy inputs, an
    explicit stream, a scale that is not a positive number, and everything under the simulator."""
    from kernels.perf import _launch

    a = np.zeros((1, 1, 8, 16), np.float16)
    assert _launch.plan_key("fwd_fp16_v4", (a, a, a), {"causal": False}) is None
    assert _launch.plan_key("fwd_fp16_v4", (a, a, a), {"stream": object()}) is None
    assert _launch.plan_key("fwd_fp16_v4", (a, a, a), {"scale": -1.0}) is None
    if not _direct.enabled():
        torch = pytest.importorskip("torch")
        t = torch.zeros(1, 1, 8, 16, dtype=torch.float16)
        assert _launch.plan_key("fwd_fp16_v4", (t, t, t), {}) is None


def test_recorder_notes_launches_and_buffers_in_order():
    """kernels._direct.Recorder: while active, each launch (after it is made) and each noted
    buffer, innermost and outer recorders alike; nothing once it is left."""
    kern = FakeKernel()
    with _direct.Recorder() as outer:
        _direct.launch(kern, 4, 128, 0, 0, "a")
        with _direct.Recorder() as inner:
            _direct.note_alloc("buf")
            _direct.launch(kern, 8, 64, 0, 16, "b")
            assert _direct.recording()
    assert not _direct.recording()
    _direct.launch(kern, 1, 32, 0, 0, "c")
    assert [x[-1] for x in outer.launches] == [("a",), ("b",)] and [x[-1] for x in inner.launches] == [("b",)]
    assert outer.allocs == inner.allocs == ["buf"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant,dtype,d", [("fwd_fp16_v5", "float16", 64), ("fwd_fp16_v5", "bfloat16", 128),
                                             ("fwd_fp16_v4", "float16", 96), ("fwd_fp32_v2", "float32", 64),
                                             ("bwd_fp16_v3", "float16", 64), ("bwd_fp16_v3", "bfloat16", 128),
                                             ("bwd_fp16_v1", "float16", 96), ("bwd_fp32_v2", "float32", 64),
                                             ("bwd_fp32_v1", "float32", 80)])
def test_prepared_call_same_bits_as_the_full_path(variant, dtype, d, monkeypatch):
    """A call that repeats an earlier call's key replays what that call launched, without the
    input checks (to_device is not called): on new tensors its results equal, bit for bit (dQ of
    the atomic backwards within rounding), those of the full path on the same tensors; another
    shape or option is another key."""
    torch = pytest.importorskip("torch")
    from kernels import _arrays
    from kernels.perf import _launch
    from kernels.perf import variant as get

    mod = get(variant)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v, do, q2, k2, v2, do2 = (torch.randn(2, 4, 300, d, device="cuda", dtype=dt, generator=gen)
                                    for _ in range(8))
    bwd = variant.startswith("bwd")
    if bwd:
        o, lse = mod.saved_forward(q, k, v, causal=True)
        o2, lse2 = mod.saved_forward(q2, k2, v2, causal=True)

        def call(q, k, v, do, o, lse):
            return mod.backward(q, k, v, o, lse, do, causal=True)
    else:
        o = lse = o2 = lse2 = None

        def call(q, k, v, do, o, lse):
            return mod.forward(q, k, v, causal=True, return_lse=True)
    _launch._PLANS.clear()
    call(q, k, v, do, o, lse)  # the full path, recorded and prepared
    assert len(_launch._PLANS) == 1
    with monkeypatch.context() as m:
        m.setattr(_arrays, "to_device", lambda *a, **k: pytest.fail("the prepared call ran the checks"))
        got = call(q2, k2, v2, do2, o2, lse2)
    _launch._PLANS.clear()
    want = call(q2, k2, v2, do2, o2, lse2)
    torch.cuda.synchronize()
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.dtype == y.dtype and x.shape == y.shape
        if bwd and i == 0 and variant != "bwd_fp16_v1":  # dQ by float32 atomics: last bits vary
            err = float((x.double() - y.double()).norm() / y.double().norm())
            print(variant, "dQ", err)
            assert err < 2e-3
            continue
        bits = (lambda t: t.view(torch.int16)) if t_is_bf16(x, torch) else (lambda t: t)
        assert torch.equal(bits(x), bits(y)), (variant, i)
    if not bwd:
        mod.forward(q2, k2, v2, causal=False)  # other options, other keys
        mod.forward(q2[:, :, :200].contiguous(), k2, v2, causal=True, return_lse=True)
        assert len(_launch._PLANS) == 3


def t_is_bf16(x, torch) -> bool:
    return x.dtype == torch.bfloat16


class _Arr:
    """What the replay reads of a device-array argument: its data pointer."""

    def __init__(self, ptr):
        self.device_ctypes_pointer = ctypes.c_void_p(ptr)


def test_replay_maps_each_pointer_to_its_input_or_buffer(monkeypatch):
    """kernels.perf._launch._replay on CPU torch tensors, the launch preparation faked: each array
    argument of each recorded launch is replayed with the pointer of the same input or of the
    same new buffer (persistent arrays as they were), scalars are left to the prepared launch,
    and the results are the new buffers in the recorded order; aliased inputs, an unknown
    pointer or a result that is not a buffer give no replay."""
    torch = pytest.importorskip("torch")
    from kernels.perf import _launch

    fired = []

    class FakePrepared:
        def __init__(self, kern, args):
            self.kern = kern
            self.pointers = tuple(a.device_ctypes_pointer.value for a in args if isinstance(a, _Arr))

        def __call__(self, *ptrs):
            fired.append((self.kern, ptrs))

    monkeypatch.setattr(_direct, "prepare", lambda kern, grid, block, stream, smem, args: FakePrepared(kern, args))
    q, k = torch.zeros(4), torch.zeros(4)
    o, tmp = torch.empty(2, 3), torch.empty(5, dtype=torch.float64)
    rec = _direct.Recorder()
    rec.allocs += [o, tmp]
    persistent = 0x7000
    monkeypatch.setattr(_direct, "PERSISTENT", {persistent})
    rec.launches += [("pre", 1, 32, 0, 0, (_Arr(k.data_ptr()), _Arr(tmp.data_ptr()), _Arr(persistent), 1.5)),
                     ("main", 2, 64, 0, 0, (_Arr(q.data_ptr()), _Arr(tmp.data_ptr()), _Arr(o.data_ptr())))]
    run = _launch._replay(rec, (q, k), o)
    q2, k2 = torch.ones(4), torch.ones(4)
    out = run((q2, k2))
    assert out.shape == (2, 3) and out.dtype == o.dtype and out.data_ptr() not in (o.data_ptr(), 0)
    (k1, p1), (k2_, p2) = fired
    assert k1 == "pre" and k2_ == "main" and p1[0] == k2.data_ptr() and p1[2] == persistent
    assert p2[0] == q2.data_ptr() and p2[2] == out.data_ptr() and p1[1] == p2[1] not in (tmp.data_ptr(),)
    # two results, in order
    assert [t.shape for t in _launch._replay(rec, (q, k), (tmp, o))((q2, k2))] == [(5,), (2, 3)]
    # refused: aliased inputs; a pointer that is neither input, buffer nor persistent; a foreign result
    assert _launch._replay(rec, (q, q), o) is None
    bad = _direct.Recorder()
    bad.allocs += [o]
    bad.launches += [("x", 1, 32, 0, 0, (_Arr(0x1234),))]
    assert _launch._replay(bad, (q, k), o) is None
    assert _launch._replay(rec, (q, k), torch.empty(1)) is None
