"""Careless inputs to the Python API that an audit found passing unchecked (2026-11-29): each now
a ValueError naming the field, before any kernel runs, or the documented result kind.

Kernels run under Numba's CUDA simulator (conftest), at tiny sizes.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from flashsim import Tiling, Workload, get_gpu, simulate  # noqa: E402
from flashsim.parallel import context_parallel  # noqa: E402
from flashsim.roofline import roofline  # noqa: E402
from kernels._arrays import SCALE_MAX  # noqa: E402
from kernels.counters import new_counters  # noqa: E402
from kernels.flash1 import flash1_attention  # noqa: E402
from kernels.standard import standard_attention, standard_attention_backward  # noqa: E402
from kernels.torch_op import attention  # noqa: E402


def qkv(n=16, d=16, dtype=np.float32):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, 1, n, d)).astype(dtype) for _ in range(3))


@pytest.mark.parametrize("scale", [1e39, -1e39, 1e300, np.float64(3e38)])
def test_a_scale_the_kernels_cannot_hold_in_float32_is_refused(scale):
    """|scale|·log2(e) must be finite in float32: a larger finite scale turned every output NaN."""
    q, k, v = qkv()
    assert SCALE_MAX < 3e38 < 3.5e38
    for call in (lambda: kernels.flash_attention(q, k, v, scale=scale),
                 lambda: kernels.flash_attention(q, k, v, scale=scale, impl="reference"),
                 lambda: kernels.decode_attention(q[:, :, :1], k, v, scale=scale),
                 lambda: attention(*(torch.from_numpy(x) for x in (q, k, v)), scale=scale)):
        with pytest.raises(ValueError, match="scale="):
            call()
    o = kernels.flash_attention(q, k, v, scale=1e30)  # large but finite in float32: computed
    assert np.isfinite(o).all()


@pytest.mark.parametrize("threads", [0, -1, 32.9, 5000, True, "64"])
def test_flash1_threads_checked(threads):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="threads="):
        flash1_attention(q, k, v, threads=threads)


def test_flash1_options_checked():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="o_fp32="):
        flash1_attention(q, k, v, o_fp32="no")
    with pytest.raises(ValueError, match="sram_bytes="):
        flash1_attention(q, k, v, sram_bytes=4095.5)
    with pytest.raises(ValueError, match="block_m="):
        flash1_attention(q, k, v, block_m=8.5, block_n=8)
    with pytest.raises(ValueError, match="counters"):
        flash1_attention(q, k, v, counters=[0] * 42)
    ro = new_counters()
    ro.flags.writeable = False
    for fn in (flash1_attention, lambda *a, **kw: kernels.flash_attention(*a, impl="reference", **kw)):
        with pytest.raises(ValueError, match="counters"):
            fn(q, k, v, counters=ro)
        with pytest.raises(ValueError, match="counters"):
            fn(q, k, v, counters=np.zeros((new_counters().shape[0], 4), np.int64)[:, ::2])


def test_cpu_torch_tensors_come_back_as_torch_tensors():
    """Results come back in the query's kind: CPU tensors for CPU tensors (fp32, fp16 and bf16),
    from the FlashAttention-2 forward and backward, FlashAttention-1, standard attention and
    decoding; the same numbers as numpy inputs give."""
    q, k, v = (torch.from_numpy(x) for x in qkv())
    o, lse = kernels.flash_attention(q, k, v, return_lse=True)
    assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor) and o.dtype == torch.float32
    grads = kernels.flash_attention_backward(q, k, v, o, lse, o)
    assert all(isinstance(g, torch.Tensor) for g in grads)
    for dt in (torch.float16, torch.bfloat16):
        o_lo = kernels.flash_attention(q.to(dt), k.to(dt), v.to(dt))
        assert isinstance(o_lo, torch.Tensor) and o_lo.dtype == dt
    ref = kernels.flash_attention(*(x.numpy() for x in (q, k, v)))
    np.testing.assert_array_equal(o.numpy(), ref)
    o1, l1, m1 = flash1_attention(q, k, v, return_stats=True)
    assert all(isinstance(x, torch.Tensor) for x in (o1, l1, m1))
    assert isinstance(standard_attention(q, k, v), torch.Tensor)
    od = kernels.decode_attention(q[:, :, :1], k, v)
    assert isinstance(od if isinstance(od, torch.Tensor) else od[0], torch.Tensor)


def test_counters_of_every_launcher_checked_before_a_kernel_runs():
    """A read-only, wrongly shaped or non-array ``counters`` is a ValueError naming it in flash1,
    flash2 (reference) and standard attention; a CPU int64 tensor collects the counts as a numpy
    array does."""
    q, k, v = qkv()
    ro = new_counters()
    ro.flags.writeable = False
    launchers = (flash1_attention, lambda *a, **kw: kernels.flash_attention(*a, impl="reference", **kw),
                 standard_attention)
    for fn in launchers:
        for bad in (ro, [0] * 42, np.zeros((3, 2), np.int64)):
            with pytest.raises(ValueError, match="counters"):
                fn(q, k, v, counters=bad)
        c_np, c_t = new_counters(), torch.from_numpy(new_counters())
        fn(q, k, v, counters=c_np)
        fn(q, k, v, counters=c_t)
        assert c_np.sum() > 0
        np.testing.assert_array_equal(c_t.numpy(), c_np)


def test_scale_past_floats_range_is_a_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scale="):
        kernels.flash_attention(q, k, v, scale=10**400)


def test_torch_op_inputs_checked_before_the_schema():
    t = torch.zeros(1, 1, 4, 8)
    for bad, field in ((torch.zeros(1, 1, 4, 0), "q.shape"), (np.zeros((1, 1, 4, 8), np.float32), "q:"),
                       ([1.0], "q:"), (torch.tensor(1.0), "q.shape")):
        with pytest.raises(ValueError, match=field):
            attention(bad, t, t)
    with pytest.raises(ValueError, match="v.shape"):
        attention(t, t, torch.zeros(4, 8))


def test_backward_lse_dtype_message_names_float32():
    q, k, v = qkv()
    o, lse = kernels.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"lse.dtype=float64: must be float32"):
        kernels.flash_attention_backward(q, k, v, o, lse.astype(np.float64), o)


def test_standard_attention_arguments_checked():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="gemm_block="):
        standard_attention(q, k, v, gemm_block=16.0)
    with pytest.raises(ValueError, match="o:"):
        standard_attention_backward(q, k, v, None, q)
    with pytest.raises(ValueError, match="o:"):
        standard_attention_backward(q, k, v, [1.0], q)


@pytest.mark.parametrize("eb", [0, -2, 2.5, True])
def test_sram_elems_element_size_checked(eb):
    with pytest.raises(ValueError, match="elem_bytes="):
        get_gpu("h100").sram_elems(eb)


def test_flashsim_api_refusals():
    w = Workload(batch=1, heads=2, seq_len_q=64, seq_len_k=64, head_dim=32, dtype="fp16")
    with pytest.raises(ValueError, match="sim_result"):
        roofline({}, "h100")
    for algo in ("standard", "fast", "torch_flash"):
        with pytest.raises(ValueError, match="tiling="):
            simulate(w, algo, "fwd", tiling=Tiling(16, 16))
    with pytest.raises(ValueError, match="at most 32 warps"):
        simulate(w, "fast", "fwd", config={"nw": 64})
    with pytest.raises(ValueError, match="sram_elems=10: standard attention needs M >= 2"):
        simulate(w, "standard", "fwd", sram_elems=10)  # its GEMMs hold a row of each operand: 2d
    assert simulate(w, "standard", "fwd", sram_elems=64).io.bytes == simulate(w, "standard", "fwd").io.bytes
    cp = context_parallel(Workload(batch=1, heads=4, seq_len_q=256, seq_len_k=256, head_dim=32, dtype="fp16"), 2,
                          sram_elems=8192)
    assert cp.device_steps(np.int64(1)) == cp.device_steps(1) != []
    for dev in (5, -1, 1.0, True):
        with pytest.raises(ValueError, match="device="):
            cp.device_steps(dev)
