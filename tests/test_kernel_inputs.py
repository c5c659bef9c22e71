"""Input handling of the public kernel API (kernels.flash_attention, flash_attention_backward).

Decisions tested here (documented in kernels/_arrays.py and the API docstrings):
numpy in -> numpy out (inputs copied, non-contiguous numpy made contiguous); Numba device
arrays in -> device arrays out, used in place; device arrays must be C-contiguous; no mixing of
host and device inputs; float32 or float16 only, one dtype for q, k, v, o, dO (lse float32);
shapes checked with messages that name the argument; zero-size dimensions rejected.
"""

import numpy as np
import pytest
from numba import cuda

from kernels import flash_attention, flash_attention_backward
from kernels.counters import INDEX, READ, new_counters
from kernels.reference import attention_forward

B, H, N, D = 1, 2, 5, 16
KW = dict(block_m=8, block_n=8)


def arrays(dtype=np.float32, hkv=H, n=N, d=D, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, n, d)).astype(dtype)
    k = rng.standard_normal((B, hkv, n, d)).astype(dtype)
    v = rng.standard_normal((B, hkv, n, d)).astype(dtype)
    do = rng.standard_normal((B, H, n, d)).astype(dtype)
    return q, k, v, do


@pytest.fixture(scope="module")
def fwd32():
    q, k, v, do = arrays()
    o, lse = flash_attention(q, k, v, return_lse=True, **KW)
    return q, k, v, do, o, lse


def test_numpy_in_numpy_out(fwd32):
    q, k, v, do, o, lse = fwd32
    assert isinstance(o, np.ndarray) and o.shape == q.shape and o.dtype == np.float32
    assert isinstance(lse, np.ndarray) and lse.shape == (B, H, N) and lse.dtype == np.float32
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, **KW)
    assert all(isinstance(x, np.ndarray) for x in (dq, dk, dv))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_device_in_device_out(fwd32):
    q, k, v, do, o_host, _ = fwd32
    qd, kd, vd, dod = (cuda.to_device(x) for x in (q, k, v, do))
    o, lse = flash_attention(qd, kd, vd, return_lse=True, **KW)
    assert not isinstance(o, np.ndarray) and hasattr(o, "copy_to_host")
    np.testing.assert_array_equal(o.copy_to_host(), o_host)
    grads = flash_attention_backward(qd, kd, vd, o, lse, dod, **KW)
    assert all(hasattr(g, "copy_to_host") for g in grads)


def test_non_contiguous_numpy_is_copied(fwd32):
    q, k, v, _, o_ref, _ = fwd32
    wide = np.zeros(q.shape[:-1] + (2 * D,), np.float32)
    wide[..., ::2] = q
    o = flash_attention(wide[..., ::2], k, v, **KW)
    np.testing.assert_array_equal(o, o_ref)


def test_non_contiguous_device_array_rejected(fwd32):
    q, k, v, *_ = fwd32
    wide = cuda.to_device(np.repeat(q, 2, axis=-1))
    kd, vd = cuda.to_device(k), cuda.to_device(v)
    with pytest.raises(ValueError, match="C-contiguous"):
        flash_attention(wide[..., ::2], kd, vd, **KW)


def test_mixed_host_and_device_rejected(fwd32):
    q, k, v, do, o, lse = fwd32
    with pytest.raises(ValueError, match="mix host"):
        flash_attention(q, cuda.to_device(k), cuda.to_device(v), **KW)
    qd, kd, vd, od, dod = (cuda.to_device(x) for x in (q, k, v, o, do))
    with pytest.raises(ValueError, match="mix host"):
        flash_attention_backward(qd, kd, vd, od, lse, dod, **KW)  # lse on the host


@pytest.mark.parametrize("bad", [np.float64, np.int32, np.float16])
def test_wrong_or_mismatched_dtype(fwd32, bad):
    q, k, v, *_ = fwd32
    with pytest.raises(ValueError, match="dtype"):
        flash_attention(q, k.astype(bad), v, **KW)


def test_backward_dtypes(fwd32):
    q, k, v, do, o, lse = fwd32
    with pytest.raises(ValueError, match="dtype"):
        flash_attention_backward(q, k, v, o, lse.astype(np.float16), do, **KW)
    with pytest.raises(ValueError, match="dtype"):
        flash_attention_backward(q, k, v, o, lse, do.astype(np.float16), **KW)
    with pytest.raises(ValueError, match="lse"):
        flash_attention_backward(q, k, v, o, None, do, **KW)


@pytest.mark.parametrize("case", ["q3d", "kv_differ", "batch", "head_dim", "heads", "do", "o", "lse"])
def test_wrong_shapes(fwd32, case):
    q, k, v, do, o, lse = fwd32
    args = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    if case == "q3d":
        args["q"] = q[0]
    elif case == "kv_differ":
        args["v"] = v[:, :, :-1]
    elif case == "batch":
        args["k"] = args["v"] = np.concatenate([k, k])
    elif case == "head_dim":
        args["k"] = args["v"] = k[..., :-1].copy()
    elif case == "heads":  # 2 query heads cannot share 3 kv heads
        args["k"] = args["v"] = np.concatenate([k, k[:, :1]], axis=1)
    elif case == "do":
        args["do"] = do[:, :, :-1]
    elif case == "o":
        args["o"] = o[:, :1]
    elif case == "lse":
        args["lse"] = lse[..., :-1]
    with pytest.raises(ValueError, match=r"shape|ndim|4-D"):
        if case in ("q3d", "kv_differ", "batch", "head_dim", "heads"):
            flash_attention(args["q"], args["k"], args["v"], **KW)
        flash_attention_backward(**args, **KW)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_zero_size_dims_rejected(axis):
    shape = [1, 1, 4, 16]
    shape[axis] = 0
    z = np.zeros(shape, np.float32)
    with pytest.raises(ValueError):
        flash_attention(z, z, z, **KW)


def test_block_sizes_checked(fwd32):
    q, k, v, *_ = fwd32
    with pytest.raises(ValueError, match="shared memory"):
        flash_attention(q, k, v, block_m=128, block_n=128)
    with pytest.raises(ValueError, match="block_m"):
        flash_attention(q, k, v, block_m=0, block_n=8)
    with pytest.raises(ValueError, match="scale"):
        flash_attention(q, k, v, scale=float("nan"), **KW)


def test_gqa_and_default_blocks():
    q, k, v, _ = arrays(hkv=1, n=3)
    o = flash_attention(q, k, v)  # default blocks (bigger than N: one ragged block)
    ref, _ = attention_forward(q, k, v)
    np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-6)


def test_counters_host_filled_in_place_and_device(fwd32):
    q, k, v, *_ = fwd32
    cnt = new_counters()
    flash_attention(q, k, v, counters=cnt, **KW)
    assert cnt[INDEX["Q"], READ] == B * H * N * D
    dev = cuda.to_device(new_counters())
    flash_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), counters=dev, **KW)
    np.testing.assert_array_equal(dev.copy_to_host(), cnt)
    with pytest.raises(ValueError, match="counters"):
        flash_attention(q, k, v, counters=np.zeros((3, 2), np.int32), **KW)


@pytest.mark.gpu
def test_cuda_array_interface_objects_used_in_place():
    """Any object with __cuda_array_interface__ is wrapped without a copy (GPU only: the simulator
    has no cuda.as_cuda_array)."""
    q, k, v, _ = arrays()

    class Wrapped:
        def __init__(self, dev):
            self.dev = dev
            self.__cuda_array_interface__ = dev.__cuda_array_interface__

    qd, kd, vd = (cuda.to_device(x) for x in (q, k, v))
    o = flash_attention(Wrapped(qd), Wrapped(kd), Wrapped(vd), **KW)
    np.testing.assert_array_equal(o.copy_to_host(), flash_attention(q, k, v, **KW))


# Options and missing arrays: one ValueError naming the field, on the reference and the fast
# paths (the fast fp16 kernels take d = 16), before anything is launched.
FP16 = dict(dtype=np.float16)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_none_array_rejected(name, impl):
    q, k, v, _ = arrays(**FP16)
    args = dict(q=q, k=k, v=v)
    args[name] = None
    with pytest.raises(ValueError, match=f"{name}=None"):
        flash_attention(**args, impl=impl)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bf16", [False, True])
def test_tensor_that_requires_grad_rejected(name, impl, bf16):
    """A torch tensor that requires grad, float16 or bfloat16: a ValueError naming it (fp16 was
    torch's RuntimeError from inside the interface or numpy conversion; bf16 was detached
    silently)."""
    torch = pytest.importorskip("torch")
    args = {n: torch.from_numpy(x) for n, x in zip("qkv", arrays(**FP16)[:3])}
    if bf16:
        args = {n: t.to(torch.bfloat16) for n, t in args.items()}
    args[name] = args[name].clone().requires_grad_(True)
    with pytest.raises(ValueError, match=f"{name}: requires grad"):
        flash_attention(**args, impl=impl)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("name", ["q", "o", "lse", "do"])
def test_backward_none_rejected(name, impl):
    q, k, v, do = arrays(**FP16)
    o = q.copy()
    args = dict(q=q, k=k, v=v, o=o, lse=np.zeros((B, H, N), np.float32), do=do)
    args[name] = None
    with pytest.raises(ValueError, match=f"{name}=None"):
        flash_attention_backward(**args, impl=impl)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("field,value", [("causal", "yes"), ("causal", 1), ("causal", None), ("scale", "0.5"),
                                         ("scale", float("inf")), ("scale", True), ("scale", 1j),
                                         ("return_lse", "no"), ("impl", "fastest")])
def test_bad_options_name_the_field(field, value, impl):
    q, k, v, do = arrays(**FP16)
    kw = {"impl": impl, field: value}
    with pytest.raises(ValueError, match=f"{field}="):
        flash_attention(q, k, v, **kw)
    if field != "return_lse":
        kw.pop("return_lse", None)
        with pytest.raises(ValueError, match=f"{field}="):
            flash_attention_backward(q, k, v, q.copy(), np.zeros((B, H, N), np.float32), do, **kw)


def test_numpy_scalar_options_accepted():
    """numpy bools and numpy real scalars are options like Python's (checked against float64)."""
    q, k, v, _ = arrays()
    o, lse = flash_attention(q, k, v, causal=np.bool_(True), scale=np.float16(0.25), return_lse=np.True_, **KW)
    ref, ref_lse = attention_forward(q, k, v, causal=True, scale=0.25)
    print(f"numpy scalar options: rel err {np.linalg.norm(o - ref) / np.linalg.norm(ref):.2e}")
    np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    o2 = flash_attention(q, k, v, scale=np.int64(1), **KW)
    np.testing.assert_allclose(o2, attention_forward(q, k, v, scale=1.0)[0], rtol=1e-5, atol=1e-6)


def test_other_launchers_check_options():
    """flash1 and standard attention share the checks (kernels/_arrays.py)."""
    from kernels import flash1_attention, standard_attention, standard_attention_backward

    q, k, v, do = arrays()
    with pytest.raises(ValueError, match="causal="):
        flash1_attention(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="q=None"):
        flash1_attention(None, k, v)
    with pytest.raises(ValueError, match="scale="):
        standard_attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="do=None"):
        standard_attention_backward(q, k, v, q, None)


class _DeviceStub:
    """A device array as far as the alignment check sees it: only a data pointer."""

    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (1,), "typestr": "<f2", "version": 3}


def test_misaligned_device_inputs_take_the_reference_kernel_or_a_value_error():
    """The fast kernels copy 16 bytes at a time, and a misaligned copy is a CUDA error that ends the
    context: a device array whose data pointer is not 16-byte aligned (a tensor sliced at an odd
    offset) makes impl="auto" run the reference kernel, and impl="fast" raise naming it."""
    import kernels
    from kernels._arrays import device_pointer, misaligned

    q = np.zeros((1, 1, 8, 64), np.float16)
    good, bad = _DeviceStub(0x7F0000001000), _DeviceStub(0x7F0000001002)
    assert device_pointer(q) is None and device_pointer(bad) == 0x7F0000001002
    assert misaligned(q=q, k=good, v=good) is None and misaligned(q=good, k=good, v=bad) == "v"
    assert kernels._fast("fwd", q, "auto", arrays=dict(q=good, k=good, v=good)) is not None
    assert kernels._fast("fwd", q, "auto", arrays=dict(q=good, k=bad, v=good)) is None
    with pytest.raises(ValueError, match=r"k: data pointer 0x7f0000001002 is not 16-byte aligned"):
        kernels._fast("fwd", q, "fast", arrays=dict(q=good, k=bad, v=good))
    assert kernels._fast("bwd", q, "auto", arrays=dict(q=good, k=good, v=good, o=good, do=bad)) is None
