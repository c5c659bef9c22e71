"""Any finite scale τ (negative, zero) and NaN rows in the default (fast) kernels, under the CUDA
simulator, against the float64 reference.

The fast kernels keep the running max of the raw scores and apply τ inside the exponent, which
is right only for τ > 0: with τ <= 0 a masked score (-inf) times τ gave +inf or NaN.  The
launchers (kernels/perf/_launch.py ``positive_scale``) now run them on Q' = c·Q with τ' > 0 and
τ'Q' = τQ.  Shapes are ragged (N not a multiple of the key block) and causal, so entries are
masked.  A NaN in a query row must give that row O = NaN and L = NaN (not L = -inf, the marker
of a row that sees no key).
"""

import numpy as np
import pytest

import kernels
from kernels.perf import bwd_fp16_v3, bwd_fp32_v2, fwd_fp16_v3, fwd_fp16_v4, fwd_fp32_v1
from kernels.reference import (
    attention_backward,
    attention_forward,
    judge_low_precision,
    plain_attention_backward_lowp,
    rel_error,
)

NQ, NK = 17, 18  # neither a multiple of 16: ragged query and key blocks; causal masks inside blocks


def make(dtype, d, seed=0, h=1):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, h, NQ, d)).astype(dtype)
    k = rng.standard_normal((1, h, NK, d)).astype(dtype)
    v = rng.standard_normal((1, h, NK, d)).astype(dtype)
    do = rng.standard_normal((1, h, NQ, d)).astype(dtype)
    return q, k, v, do


def check_forward(o, lse, q, k, v, causal, scale, label, tol32=2e-6):
    ref, ref_lse = attention_forward(q, k, v, causal=causal, scale=scale)
    lerr = float(np.abs(lse - ref_lse).max())
    if q.dtype == np.float16:
        j = judge_low_precision(o, q, k, v, causal=causal, scale=scale)
        print(f"fwd {label}: {j}; max |L - L64| {lerr:.2e}")
        assert j.ok, str(j)
    else:
        err = rel_error(o, ref)
        print(f"fwd {label}: rel err {err:.2e}; max |L - L64| {lerr:.2e}")
        assert err <= tol32
    assert np.isfinite(lse).all() and lerr <= 1e-4 * max(1.0, float(np.abs(ref_lse).max()))


def check_backward(grads, q, k, v, do, causal, scale, label, tol32=2e-6):
    """Each gradient against float64: fp32 within ``tol32`` relative; fp16 within 2x plain fp16
    attention's error.  At τ = 0 the exact dQ and dK are 0 and must come out exactly 0."""
    refs = attention_backward(q, k, v, do, causal=causal, scale=scale)
    bases = (plain_attention_backward_lowp(q, k, v, do, causal=causal, scale=scale)
             if q.dtype == np.float16 else (None,) * 3)
    for name, g, r, base in zip(("dQ", "dK", "dV"), grads, refs, bases):
        g = np.asarray(g, np.float64)
        if scale == 0 and name != "dV":
            print(f"bwd {label} {name}: max |g| {np.abs(g).max():.2e} (exact 0)")
            assert np.all(g == 0)
            continue
        err = rel_error(g, r)
        if base is None:
            print(f"bwd {label} {name}: rel err {err:.2e}")
            assert err <= tol32
        else:
            berr = max(rel_error(base, r), float(np.finfo(np.float16).eps) / 2)
            print(f"bwd {label} {name}: rel err {err:.2e}, plain fp16 {berr:.2e}")
            assert err <= 2 * berr


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("scale", [0.0, -0.5, 2.0])
def test_default_kernels_any_scale(scale, dtype):
    """The public API's default path (fwd_fp16_v4 + bwd_fp16_v1, fwd_fp32_v1 + bwd_fp32_v1),
    causal (Nq < Nk: masks inside blocks and a ragged last key block)."""
    q, k, v, do = make(dtype, 8)
    label = f"{np.dtype(dtype).name} scale={scale}"
    o, lse = kernels.flash_attention(q, k, v, causal=True, scale=scale, return_lse=True)
    check_forward(o, lse, q, k, v, True, scale, label)
    grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True, scale=scale)
    check_backward(grads, q, k, v, do, True, scale, label)


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_other_fast_variants_any_scale(scale):
    """fwd_fp16_v3 (v4 without its lazy rescaling), bwd_fp16_v3 (dQ through the float32 buffer)
    and bwd_fp32_v2 (3xTF32, d = 32), causal."""
    q, k, v, do = make(np.float16, 16, seed=1)
    o, lse = fwd_fp16_v3.forward(q, k, v, causal=True, scale=scale, return_lse=True)
    check_forward(o, lse, q, k, v, True, scale, f"fwd_fp16_v3 scale={scale}")
    grads = bwd_fp16_v3.backward(q, k, v, o, lse, do, causal=True, scale=scale, bq=32, bk=32, nw=2, ma=1, mb=1,
                                 mc=1)
    check_backward(grads, q, k, v, do, True, scale, f"bwd_fp16_v3 scale={scale}")
    q, k, v, do = make(np.float32, 32, seed=2)
    o, lse = kernels.flash_attention(q, k, v, causal=True, scale=scale, return_lse=True)
    grads = bwd_fp32_v2.backward(q, k, v, o, lse, do, causal=True, scale=scale, bc=16, br=16, nw=1)
    check_backward(grads, q, k, v, do, True, scale, f"bwd_fp32_v2 scale={scale}")


@pytest.mark.parametrize("fwd", [fwd_fp16_v4, fwd_fp16_v3, fwd_fp32_v1])
def test_nan_query_row_gives_nan_l(fwd):
    """A NaN in Q row r: O row r and L_r are NaN (L = -inf stays the marker of a row that sees
    no key); the other rows are untouched.  Causal with Nq < Nk, so every row sees a key."""
    dtype = np.float32 if fwd is fwd_fp32_v1 else np.float16
    q, k, v, _ = make(dtype, 16, seed=3)
    q[0, 0, 5, 3] = np.nan
    o, lse = fwd.forward(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = attention_forward(q, k, v, causal=True)
    _, kern_lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True, impl="reference")
    print(f"{fwd.name}: L[5] = {lse[0, 0, 5]} (reference kernel {kern_lse[0, 0, 5]}, float64 "
          f"{ref_lse[0, 0, 5]}), O[5] NaN: {np.isnan(o[0, 0, 5]).all()}")
    assert np.isnan(ref_lse[0, 0, 5]) and np.isnan(kern_lse[0, 0, 5]) and np.isnan(lse[0, 0, 5])
    assert np.isnan(o[0, 0, 5]).all()
    rows = np.arange(NQ) != 5
    assert np.isfinite(lse[0, 0, rows]).all() and np.isfinite(o[0, 0, rows]).all()
    np.testing.assert_allclose(lse[0, 0, rows], ref_lse[0, 0, rows], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_any_scale_and_nan_row_on_gpu(dtype):
    """The same on the GPU (the compiled kernels, Q' made by _launch._times): N = 1000 (ragged),
    d = 64, causal, forward and backward of the default path against float64 (fp32 within 1e-5,
    as the other GPU tests at N ~ 1,000), and a NaN query row giving L = NaN there."""
    rng = np.random.default_rng(4)
    q, k, v, do = (rng.standard_normal((1, 2, 1000, 64)).astype(dtype) for _ in range(4))
    for scale in (0.0, -0.125, 0.125):
        label = f"gpu {np.dtype(dtype).name} scale={scale}"
        o, lse = kernels.flash_attention(q, k, v, causal=True, scale=scale, return_lse=True)
        check_forward(o, lse, q, k, v, True, scale, label, tol32=1e-5)
        grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True, scale=scale)
        check_backward(grads, q, k, v, do, True, scale, label, tol32=1e-5)
    q[0, 1, 700, 5] = np.nan
    o, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True)
    print(f"gpu NaN row: L = {lse[0, 1, 700]}, O NaN {np.isnan(o[0, 1, 700]).all()}")
    assert np.isnan(lse[0, 1, 700]) and np.isnan(o[0, 1, 700]).all()
    assert np.isfinite(lse[0, 0]).all() and np.isfinite(np.delete(lse[0, 1], 700)).all()


@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("causal", [False, True])
def test_flash1_and_standard_any_scale(scale, causal):
    """FlashAttention-1 and standard attention keep the scale's sign through the softmax too."""
    from kernels import flash1_attention, standard_attention
    from kernels.reference import attention_forward, rel_error

    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 1, 17, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 18, 8)).astype(np.float32) for _ in range(2))
    ref = attention_forward(*(x.astype(np.float64) for x in (q, k, v)), causal=causal, scale=scale)
    ref = ref[0] if isinstance(ref, tuple) else ref
    for name, out in (("flash1", flash1_attention(q, k, v, causal=causal, scale=scale, block_m=8, block_n=8)),
                      ("standard", standard_attention(q, k, v, causal=causal, scale=scale, gemm_block=16))):
        out = out[0] if isinstance(out, tuple) else out
        err = rel_error(out, ref)
        print(f"{name} scale={scale} causal={causal}: {err:.2e}")
        assert err < 1e-6
