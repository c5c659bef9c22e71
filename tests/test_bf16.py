"""bfloat16 through the public API: torch bf16 tensors into the fast tensor-core kernels
(fwd_fp16_v3/v4, bwd_fp16_v1/v3 compiled with ``bf16=True``) and the reference FlashAttention-2
kernels (kernels/flash2.py), judged by the 2x rule against plain bf16 attention (every
intermediate rounded to bf16, ``kernels.reference`` with ``dtype="bf16"``) and float64.

Under the CUDA simulator (CI) the tensors are CPU ones (copied to the simulated device as their
int16 bits, results handed back as CPU bf16 tensors) and the sizes tiny; the simulator's twins
of ``mma_bf16`` and ``pack_bf16x2`` (kernels/perf/tc_sim.py) widen and round through the bits.
On a GPU (``FLASHSIM_GPU=1 pytest -m gpu -k bf16``) CUDA tensors at real sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from kernels._bf16 import bf16_bits_to_f32, round_bf16_bits  # noqa: E402
from kernels.perf import bwd_fp16_v1, bwd_fp16_v3, fwd_fp16_v3, fwd_fp16_v4  # noqa: E402
from kernels.reference import (  # noqa: E402
    attention_forward,
    judge_low_precision,
    judge_low_precision_backward,
)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                derandomize=True)


def make(seed, h, hkv, nq, nk, d, device="cpu", b=1):
    """bf16 Q, K, V, dO (standard normals rounded to bf16) and their exact values as float32 numpy."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d), (b, h, nq, d))
    ts = [torch.randn(*s, generator=g).to(torch.bfloat16) for s in shapes]
    return [t.to(device) for t in ts], [t.float().numpy() for t in ts]


def f32(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def test_bits_round_to_nearest_even_as_torch_does():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 10.0 ** rng.integers(-40, 39, 20000)).astype(np.float32)
    x[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38]
    x[6:9] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)]  # ties: to even
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = round_bf16_bits(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(bf16_bits_to_f32(got[nan])))


def check_forward(o, lse, q, k, v, causal, scale, label):
    j = judge_low_precision(f32(o), q, k, v, dtype="bf16", causal=causal, scale=scale)
    print(f"bf16 fwd {label}: {j}")
    assert o.dtype == torch.bfloat16 and j.ok, str(j)
    _, ref_lse = attention_forward(q, k, v, causal=causal, scale=scale)
    lse = f32(lse)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows that see no key must get L = -inf"
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-4, atol=1e-4)


FWD = {"v3": fwd_fp16_v3, "v4": fwd_fp16_v4}


@st.composite
def fwd_cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return dict(impl=draw(st.sampled_from(["v3", "v4", "reference"])), hkv=hkv,
                h=hkv * draw(st.sampled_from([1, 2])), nq=draw(st.integers(1, 24)), nk=draw(st.integers(1, 24)),
                d=draw(st.sampled_from([8, 16, 24])), causal=draw(st.booleans()), scale=None,
                seed=draw(st.integers(0, 2**16)))


# GQA causal with Nq > Nk (rows that see no key) on v4, d = 24 padded to 32; v3 with Nq < Nk and
# a negative scale (the kernels run Q' = -Q: the bf16 negation); the reference kernel ragged.
@settings(max_examples=1, **SETTINGS)
@given(fwd_cases())
@example(dict(impl="v4", hkv=1, h=2, nq=21, nk=13, d=24, causal=True, scale=None, seed=1))
@example(dict(impl="v3", hkv=1, h=1, nq=9, nk=20, d=16, causal=True, scale=-0.3, seed=2))
@example(dict(impl="reference", hkv=1, h=2, nq=19, nk=11, d=24, causal=True, scale=None, seed=3))
def test_forward_bf16(c):
    (q, k, v, _), (qf, kf, vf, _) = make(c["seed"], c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    if c["impl"] == "reference":
        o, lse = kernels.flash_attention(q, k, v, causal=c["causal"], scale=c["scale"], return_lse=True,
                                         impl="reference", block_m=16, block_n=16)
    else:
        o, lse = FWD[c["impl"]].forward(q, k, v, causal=c["causal"], scale=c["scale"], return_lse=True,
                                        bc=16, nw=1, mt=1, qreg=c["d"] <= 16)
    check_forward(o, lse, qf, kf, vf, c["causal"], c["scale"], str(c))


def check_backward(grads, q, k, v, do, causal, scale, label):
    verdicts = judge_low_precision_backward([f32(g) for g in grads], q, k, v, do, dtype="bf16", causal=causal,
                                            scale=scale)
    for name, j in verdicts.items():
        print(f"bf16 bwd {name} {label}: {j}")
    assert all(g.dtype == torch.bfloat16 for g in grads)
    assert all(j.ok for j in verdicts.values()), {n: str(j) for n, j in verdicts.items()}


# v1 (two kernels, dQ rounded in the kernel) with GQA, causal Nq > Nk and a negative scale (dQ
# negated back in bf16); v3 (one kernel, dQ by float32 atomics then rounded to bf16) ragged at
# d = 32; the reference kernels (three, deterministic).
BWD_CASES = [
    dict(impl="v1", h=2, hkv=1, nq=21, nk=14, d=16, causal=True, scale=-0.4, seed=5,
         cfg=dict(bq=16, bk=16, nw=1, mt=1, reg=True)),
    dict(impl="v3", h=1, hkv=1, nq=40, nk=35, d=32, causal=False, scale=None, seed=6,
         cfg=dict(bq=32, bk=32, nw=2, ma=1, mb=1, mc=1)),
    dict(impl="reference", h=2, hkv=1, nq=13, nk=18, d=16, causal=True, scale=None, seed=7, cfg={}),
]


@pytest.mark.parametrize("c", BWD_CASES, ids=[c["impl"] for c in BWD_CASES])
def test_backward_bf16(c):
    (q, k, v, do), (qf, kf, vf, dof) = make(c["seed"], c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    o64, lse64 = attention_forward(qf, kf, vf, causal=c["causal"], scale=c["scale"])
    o = torch.from_numpy(o64.astype(np.float32)).to(torch.bfloat16)
    lse = lse64.astype(np.float32)
    if c["impl"] == "reference":
        grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=c["causal"], scale=c["scale"],
                                                 impl="reference", block_m=16, block_n=16)
    else:
        mod = bwd_fp16_v1 if c["impl"] == "v1" else bwd_fp16_v3
        grads = mod.backward(q, k, v, o, lse, do, causal=c["causal"], scale=c["scale"], **c["cfg"])
    check_backward(grads, qf, kf, vf, dof, c["causal"], c["scale"], str(c))
    if c["causal"] and c["nq"] > c["nk"]:
        assert np.all(f32(grads[0])[np.isneginf(lse)] == 0), "rows that see no key get dQ = 0"


@pytest.mark.parametrize("variant,args,product,least,exact", [
    ("fwd_fp16_v4", (64, 64, 4, 2, 0, 1), "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 64, False),
    # the warpgroup forward: 4 k-steps of S at d = 64 and 4 of P·V at Bc = 64, each one wgmma
    ("fwd_fp16_v5", (64, 64, 8, 1, 0, 0), "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", 8, True)])
def test_sm90_ptx_of_the_bf16_forward(variant, args, product, least, exact):
    """The fp16 forwards compiled for bf16 at their d = 64 default (no GPU needed; in a subprocess,
    outside the simulator): every product is the .bf16 one, P is packed by cvt.rn.bf16x2.f32, no
    local memory."""
    from _ptx import run_without_simulator

    res = run_without_simulator(
        "from kernels.perf.inspect import lto_ptx\n"
        f"ptx = lto_ptx({variant!r}, *{args!r}, BF16=True)\n"
        f"print(ptx.count({product!r}), ptx.count('.f16.f16'), ptx.count('cvt.rn.bf16x2.f32'), '.local' in ptx)\n")
    assert res.returncode == 0, res.stderr[-2000:]
    bf16, f16, cvt, local = res.stdout.split()
    print(f"{variant}: bf16 products {bf16}, f16 {f16}, cvt.rn.bf16x2 {cvt}, local memory {local}")
    assert (int(bf16) == least if exact else int(bf16) >= least) and int(f16) == 0 and int(cvt) >= 16
    assert local == "False"


def test_public_api_and_torch_op_take_bf16():
    """``impl="auto"`` picks the fast bf16 kernels (``BEST``), the torch op runs forward and
    backward in bf16; the kernels without a bf16 path refuse it by name."""
    from kernels import perf
    from kernels.torch_op import attention

    assert perf.best("fwd", torch.bfloat16, 64).name == "fwd_fp16_v7"
    assert perf.best("fwd", torch.bfloat16, 96).name == "fwd_fp16_v7"
    assert perf.best("fwd", torch.bfloat16, 40).name == "fwd_fp16_v4"
    assert perf.best("bwd", "bfloat16", 128).name == "bwd_fp16_v3"
    assert perf.best("bwd", torch.bfloat16, 40).name == "bwd_fp16_v3"
    assert perf.best("bwd", torch.bfloat16, 24).name == "bwd_fp16_v1"
    assert perf.best("bwd", torch.bfloat16, 40, deterministic=True).name == "bwd_fp16_v1"
    assert perf.best("fwd", "bfloat16", 12) is None  # d % 8 != 0: the reference kernel
    (q, k, v, do), (qf, kf, vf, dof) = make(11, 1, 1, 10, 12, 8)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = attention(qg, kg, vg, causal=True)
    o.backward(do)
    j = judge_low_precision(f32(o), qf, kf, vf, dtype="bf16", causal=True)
    print(f"torch op fwd: {j}")
    assert o.dtype == torch.bfloat16 and j.ok, str(j)
    check_backward((qg.grad, kg.grad, vg.grad), qf, kf, vf, dof, True, None, "torch op")
    with pytest.raises(ValueError, match="bfloat16"):
        kernels.standard_attention(q, k, v)
    with pytest.raises(ValueError, match="bfloat16"):
        kernels.flash1_attention(q, k, v)
    with pytest.raises(ValueError, match="dtypes"):
        kernels.flash_attention(q, k.to(torch.float16), v.to(torch.float16))
    with pytest.raises(ValueError, match="impl='fast'"):
        kernels.flash_attention(q[..., :4].contiguous(), k[..., :4].contiguous(), v[..., :4].contiguous(),
                                impl="fast")


# ---------------------------------------------------------------------------------------------
# On a GPU: CUDA tensors at real sizes, the fast kernels (impl="auto") and the reference ones.


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2000])  # ragged: no block size divides it
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_gpu_forward_bf16(n, d, causal, impl):
    (q, k, v, _), (qf, kf, vf, _) = make(n + d, 4, 2, n, n, d, device="cuda")
    o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl=impl)
    torch.cuda.synchronize()
    check_forward(o, lse, qf, kf, vf, causal, None, f"gpu {impl} n={n} d={d} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [136, 160, 200, 256])  # fwd_fp16_v4's wide-head blocks (Br 256 and 128)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_forward_wide_heads(d, causal, dtype):
    """The shipped forward above d = 128 (8 warps; Q in shared memory up to d = 192, in registers
    above), ragged N, GQA: within 2x plain attention's error in the same dtype against float64
    (bf16 inputs are exact in fp16, so both dtypes see the same numbers)."""
    (q, k, v, _), (qf, kf, vf, _) = make(d, 4, 2, 1000, 777, d, device="cuda")
    if dtype == "fp16":
        q, k, v = (x.to(torch.float16) for x in (q, k, v))
    o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl="fast")
    torch.cuda.synchronize()
    j = judge_low_precision(f32(o), qf, kf, vf, dtype="bf16" if dtype == "bf16" else np.float16, causal=causal,
                            scale=None)
    print(f"{dtype} fwd d={d} causal={causal}: {j}")
    assert j.ok, str(j)
    _, ref_lse = attention_forward(qf, kf, vf, causal=causal, scale=None)
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(f32(lse)[fin], ref_lse[fin], rtol=1e-4, atol=1e-4)


# every backward at d = 64, 96, 128; bwd_fp16_v3 and "auto" also at the head dims whose phases B
# and C end in an odd n-tile (16, 48, 80, 112)
BWD_GPU = ([(d, impl) for d in (64, 96, 128) for impl in ("reference", "auto", "bwd_fp16_v1", "bwd_fp16_v3")]
           + [(d, impl) for d in (16, 48, 80, 112) for impl in ("auto", "bwd_fp16_v3")]
           + [(d, "bwd_fp16_v3") for d in (160, 176, 256)])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000])  # ragged
@pytest.mark.parametrize("d,impl", BWD_GPU)
def test_gpu_backward_bf16(n, d, impl):
    from kernels import perf

    (q, k, v, do), (qf, kf, vf, dof) = make(n * d, 4, 2, n, n, d, device="cuda")
    for causal in (False, True):
        o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True)
        if impl in ("reference", "auto"):
            grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, impl=impl)
        else:
            grads = perf.variant(impl).backward(q, k, v, o, lse, do, causal=causal)
        torch.cuda.synchronize()
        check_backward(grads, qf, kf, vf, dof, causal, None, f"gpu {impl} n={n} d={d} causal={causal}")
