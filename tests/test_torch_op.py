"""kernels.torch_op: FlashAttention-2 as a torch custom op, with autograd and torch.compile.

Under the CUDA simulator (CI) the op runs on CPU tensors through the simulated kernels, at tiny
sizes; on a GPU (``FLASHSIM_GPU=1 pytest -m gpu tests/test_torch_op.py``) on CUDA tensors,
including the side-stream case.  Errors are relative Frobenius norms against float64 attention,
printed before they are asserted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import ON_GPU  # noqa: E402

from kernels.torch_op import attention  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"


def ref_attention(q, k, v, causal, scale):
    """float64 attention with bottom-right causal alignment and GQA (kv head h // (H / Hkv))."""
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, -math.inf)
    return torch.softmax(s, -1) @ v


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


def make(b, h, hkv, nq, nk, d, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(b, hkv, nk, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(b, hkv, nk, d, generator=g).to(DEVICE, dtype)
    return q, k, v


class Attn(torch.nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return attention(q, k, v, causal=self.causal)


@pytest.mark.parametrize("causal,hkv,nq,nk", [(False, 2, 16, 16), (True, 1, 12, 20)])
def test_forward_backward_against_float64(causal, hkv, nq, nk):
    """Forward and gradients of the op inside an nn.Module (GQA, causal with Nq != Nk), fp32."""
    d, scale = 16, 16 ** -0.5
    q, k, v = make(1, 2, hkv, nq, nk, d, torch.float32)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    o = Attn(causal)(q, k, v)
    ref = ref_attention(qr, kr, vr, causal, scale)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    o.backward(do)
    ref.backward(do.double())
    errs = {"o": rel(o, ref), "dq": rel(q.grad, qr.grad), "dk": rel(k.grad, kr.grad), "dv": rel(v.grad, vr.grad)}
    print(f"causal={causal} hkv={hkv} nq={nq} nk={nk}: {errs}")
    assert k.grad.shape == k.shape and v.grad.shape == v.shape
    assert max(errs.values()) < 1e-5


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces the op as one node: no graph break, same result."""
    q, k, v = make(1, 2, 2, 8, 8, 16, torch.float32, seed=3)
    fn = torch.compile(lambda q, k, v: attention(q, k, v, causal=True) * 2.0, fullgraph=True, backend="aot_eager")
    got = fn(q, k, v)
    want = 2.0 * ref_attention(q, k, v, True, 16 ** -0.5)
    err = rel(got, want)
    print(f"compiled: {err:.2e}")
    assert err < 1e-5


def test_fake_tensor_shapes():
    """The fake implementation gives the real outputs' shapes and dtypes (what compile relies on)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 8, 16, dtype=torch.float16)
        k = torch.empty(2, 2, 6, 16, dtype=torch.float16)
        o, lse = torch.ops.flashsim.attention_fwd(q, k, k, True, 0.25)
        dq, dk, dv = torch.ops.flashsim.attention_bwd(q, k, k, o, lse, o, True, 0.25)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (2, 4, 8), torch.float32)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)


@pytest.mark.parametrize("bad,field", [
    (dict(causal="yes"), "causal"), (dict(scale=math.nan), "scale"), (dict(dtype=torch.int32), "q.dtype"),
    (dict(dtype=torch.float64), "q.dtype"),
])
def test_bad_input_is_a_value_error(bad, field):
    q, k, v = make(1, 1, 1, 4, 4, 8, bad.pop("dtype", torch.float32))
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        attention(q, k, v, **bad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_side_stream(dtype):
    """Inputs produced on a side stream by a long op and consumed at once on that stream: the op
    must run on torch's current stream (it returned NaN when the kernels ran on Numba's own)."""
    b, h, n, d = 4, 16, 4096, 64
    s = torch.cuda.Stream()
    worst = 0.0
    for trial in range(20):
        torch.cuda.synchronize()
        big = torch.randn(8192, 8192, device="cuda")
        with torch.cuda.stream(s):
            for _ in range(4):  # keep the side stream busy while q, k, v are made
                big = big @ big * 1e-4
            g = torch.Generator(device="cuda").manual_seed(trial)
            q = torch.randn(b, h, n, d, device="cuda", generator=g, dtype=dtype)
            k = torch.randn(b, h, n, d, device="cuda", generator=g, dtype=dtype)
            v = torch.randn(b, h, n, d, device="cuda", generator=g, dtype=dtype)
            o = attention(q, k, v, causal=True)
        s.synchronize()
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        err = rel(o, want)
        worst = max(worst, err if np.isfinite(err) else math.inf)
    print(f"side stream {dtype}: worst rel err over 20 trials {worst:.2e}")
    assert worst < (5e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_gradients_against_sdpa(dtype):
    """fp16 (bf16) gradients of the op against float64, judged by the 2x rule against SDPA's math
    path in fp16 (bf16)."""
    q, k, v = make(2, 8, 2, 1024, 1024, 64, dtype, seed=5)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    plain = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn(q.shape, device="cuda", dtype=dtype)
    attention(*leaves, causal=True).backward(do)
    ref_attention(*ref_leaves, True, 64 ** -0.5).backward(do.double())
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        torch.nn.functional.scaled_dot_product_attention(*plain, is_causal=True, enable_gqa=True).backward(do)
    for name, ours, base, ref in zip("qkv", leaves, plain, ref_leaves):
        e, e0 = rel(ours.grad, ref.grad), rel(base.grad, ref.grad)
        print(f"d{name} {dtype}: ours {e:.2e}, plain {e0:.2e}")
        assert e <= 2 * e0
