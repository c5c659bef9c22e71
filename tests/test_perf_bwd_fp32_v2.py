"""bwd_fp32_v2 (fp32 backward as 3xTF32 on the tensor cores, dQ by atomics) against the float64
reference, under the CUDA simulator (its mma twin reads each operand's 19 high bits, as the tensor
core does), with the bar of the exact-FFMA bwd_fp32_v1: every gradient within 2e-6 of float64.

Tiny shapes, one warp (one Python thread per simulated lane), d = 32 (phases B and C take the
columns in groups of 32) and d = 24 and 40 (padded on chip with zero columns to 32 and 64),
blocks of 16 and 32 so that a key block sees several ragged query blocks and heads; two-warp
cases (32 x 32 blocks, the d = 32 default) with GQA and causal Nq > Nk (rows that see no key).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_perf_bwd_fp32 import gradient_errors, inputs

from kernels.perf import bwd_fp32_v1, bwd_fp32_v2, tc
from kernels.perf.bwd_fp32 import padded_dim_v2
from kernels.reference import attention_forward


@st.composite
def cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return dict(hkv=hkv, h=hkv * draw(st.sampled_from([1, 2])), nq=draw(st.integers(1, 40)),
                nk=draw(st.integers(1, 40)), d=32, causal=draw(st.booleans()), bc=draw(st.sampled_from([16, 32])),
                br=draw(st.sampled_from([16, 32])), nw=1, scale=draw(st.sampled_from([None, 0.05, 1.0])),
                fwd=False, seed=draw(st.integers(0, 2**16)))


# GQA causal Nq > Nk with two warps (the first 16 rows see no key); Nq < Nk causal on the saved
# forward of fwd_fp32_v1 (the chain the benchmark runs); one query and one key (dQ = dK = 0
# exactly: measured against the cancelling terms).
@settings(max_examples=1, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
@example(dict(hkv=1, h=2, nq=37, nk=21, d=32, causal=True, bc=32, br=32, nw=2, scale=None, fwd=False, seed=1))
@example(dict(hkv=2, h=2, nq=11, nk=36, d=32, causal=True, bc=32, br=16, nw=1, scale=None, fwd=True, seed=2))
@example(dict(hkv=1, h=1, nq=1, nk=1, d=32, causal=False, bc=16, br=16, nw=1, scale=1.0, fwd=False, seed=3))
# head dims padded on chip with zero columns: 24 -> 32, 40 -> 64 (two warps, GQA, causal Nq > Nk)
@example(dict(hkv=1, h=2, nq=21, nk=19, d=24, causal=True, bc=16, br=16, nw=1, scale=None, fwd=False, seed=4))
@example(dict(hkv=2, h=2, nq=40, nk=36, d=40, causal=True, bc=32, br=32, nw=2, scale=None, fwd=False, seed=5))
# d % 8 == 4: 12 -> 32 and 44 -> 64, dQ's second red.v4 of the last columns past d
@example(dict(hkv=1, h=2, nq=23, nk=18, d=12, causal=True, bc=16, br=16, nw=1, scale=None, fwd=False, seed=9))
@example(dict(hkv=2, h=4, nq=35, nk=37, d=44, causal=False, bc=32, br=32, nw=2, scale=None, fwd=False, seed=10))
def test_backward_fp32_v2(c):
    q, k, v, do = inputs(c["seed"], c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    if c["fwd"]:
        o, lse = bwd_fp32_v2.saved_forward(q, k, v, causal=c["causal"], scale=c["scale"])
    else:
        o, lse = (x.astype(np.float32) for x in attention_forward(q, k, v, causal=c["causal"], scale=c["scale"]))
    cfg = {x: c[x] for x in ("bc", "br", "nw")}
    print(c, bwd_fp32_v2.tiling(c["d"], c["bc"], c["br"], c["nw"]))
    grads = bwd_fp32_v2.backward(q, k, v, o, lse, do, causal=c["causal"], scale=c["scale"], **cfg)
    errs = gradient_errors(grads, q, k, v, do, c["causal"], c["scale"], str(c))
    assert all(e <= 2e-6 for e in errs.values()), errs
    if c["causal"] and c["nq"] > c["nk"]:
        assert np.all(grads[0][:, :, : c["nq"] - c["nk"]] == 0)  # rows that see no key


@pytest.mark.parametrize("cfg", [dict(ak=4), dict(ak=2), dict(swz=False)], ids=["ak4", "ak2", "noswz"])
def test_the_other_loop_shapes(cfg):
    """Phase A summed in 4 or 2 chunks of d (the default at d = 32 is one); the fragment tiles
    unswizzled (swz=False: the layout before the swizzle, four 4-byte stores per lane and tile)."""
    q, k, v, do = inputs(7, 2, 1, 20, 18, 32)
    o, lse = (x.astype(np.float32) for x in attention_forward(q, k, v, causal=True))
    grads = bwd_fp32_v2.backward(q, k, v, o, lse, do, causal=True, bc=16, br=16, nw=1, **cfg)
    errs = gradient_errors(grads, q, k, v, do, True, None, str(cfg))
    assert all(e <= 2e-6 for e in errs.values()), errs


@pytest.mark.parametrize("cfg", [dict(bc=16, br=16, nw=1, ak=2), dict(bc=32, br=16, nw=1, ak=4),
                                 dict(bc=32, br=32, nw=2, ak=1)], ids=["ak2", "ak4", "2warps"])
def test_two_k_steps_an_iteration_change_no_bit(cfg):
    """``unr``: phase A's k-steps two an iteration (where a chunk holds an even number: not at
    ak = 4, d = 32), phases B's and C's too; the same mma in the same order, so dK and dV are the
    same bits and dQ (summed by atomics, in no fixed order) the same up to that order."""
    q, k, v, do = inputs(8, 2, 1, 37, 41, 32)
    o, lse = (x.astype(np.float32) for x in attention_forward(q, k, v, causal=True))
    a, b = (bwd_fp32_v2.backward(q, k, v, o, lse, do, causal=True, unr=u, **cfg) for u in (False, True))
    _same_but_dq_order(a, b, cfg)


def _same_but_dq_order(a, b, what):
    """dK and dV the same bits, dQ (summed by atomics, in no fixed order) the same up to that order."""
    print(what, [float(np.abs(x - y).max()) for x, y in zip(a, b)])
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-6 * float(np.abs(a[0]).max()))


@pytest.mark.skipif(not tc.SIM, reason="the simulator's twin; on a GPU the tests above check the PTX")
def test_split_is_round_to_nearest_tf32():
    """hi = x rounded to 10 mantissa bits (ties away from zero) and x − hi exact: the split the
    3xTF32 products rely on (the simulator's twin of cvt.rna.tf32.f32)."""
    xs = np.array([1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-12, -(1.0 + 2**-11), 3.14159265, 1e-30, -7.5e20], np.float32)
    want = np.array([1.0, 1.0 + 2**-10, 1.0 + 2**-10, -(1.0 + 2**-10), 3.140625, 0.0, 0.0], np.float64)
    for x, w in zip(xs, want):
        hi = np.float32(tc.tf32_hi(x))
        assert np.uint32(np.array([hi]).view(np.uint32)[0]) & np.uint32(0x1FFF) == 0
        assert abs(float(hi) - float(x)) <= 2**-11 * abs(float(x))
        if w:
            assert float(hi) == w, (x, hi, w)
        assert np.float64(hi) + np.float64(np.float32(x - hi)) == np.float64(x)


def test_config_checks():
    q, k, v, do = inputs(6, 1, 1, 8, 8, 32)
    o, lse = (x.astype(np.float32) for x in attention_forward(q, k, v))
    for bad in (dict(bc=24), dict(br=0), dict(tile=2), dict(nw=16), dict(bc=16, br=16, nw=2), dict(ak=3)):
        with pytest.raises(ValueError) as e:
            bwd_fp32_v2.backward(q, k, v, o, lse, do, **bad)
        print(bad, e.value)
    with pytest.raises(ValueError, match="head_dim a multiple of 4 up to 128"):
        bwd_fp32_v2.backward(*(x[..., :10] for x in (q, k, v, o)), lse, do[..., :10])
    assert all(bwd_fp32_v2.supports(np.float32, d) for d in range(4, 129, 4))
    assert not bwd_fp32_v2.supports(np.float16, 64) and not any(bwd_fp32_v2.supports(np.float32, d)
                                                                for d in (2, 6, 38, 132, 136))
    assert [padded_dim_v2(d) for d in (4, 8, 32, 36, 40, 64, 68, 72, 128)] == [32, 32, 32, 64, 64, 64, 128, 128, 128]
    t = bwd_fp32_v2.tiling(128, 64, 64, 8)
    print(t)  # the d = 128 default: A 32 keys x 16 queries, B and C 32 x 32 a warp
    assert (t["ma"], t["na"], t["mb"], t["ub"], t["mc"], t["uc"]) == (2, 2, 2, 1, 2, 1)
    for d in range(4, 129, 4):  # every supported head dim has a default its warps can tile
        cfg = bwd_fp32_v2.default_config(d)
        bwd_fp32_v2.tiling(d, cfg["bc"], cfg["br"], cfg["nw"])


@pytest.mark.gpu
@pytest.mark.parametrize("d", [12, 16, 24, 32, 40, 44, 64, 80, 96, 100, 112, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_fp32_v2_on_gpu(d, causal):
    """The compiled kernel at its default block shapes, 4 query heads on 2 kv heads, N = 1,000
    (ragged blocks): every gradient within 2e-6 of float64 or within 2x of bwd_fp32_v1's error
    (FFMA) on the same inputs; d = 12, 16, 24, 40, 44, 80, 96, 100, 112 run padded on chip to 32, 64
    or 128 (d % 8 == 4: dQ's last red.v4 of a lane past d, skipped)."""
    q, k, v, do = inputs(d + causal, 4, 2, 1000, 1000, d)
    o, lse = (x.astype(np.float32) for x in attention_forward(q, k, v, causal=causal))
    grads = bwd_fp32_v2.backward(q, k, v, o, lse, do, causal=causal)
    errs = gradient_errors(grads, q, k, v, do, causal, None, f"gpu bwd_fp32_v2 d={d} causal={causal}")
    errs1 = gradient_errors(bwd_fp32_v1.backward(q, k, v, o, lse, do, causal=causal), q, k, v, do, causal, None,
                            f"gpu bwd_fp32_v1 d={d} causal={causal}")
    assert all(e <= max(2 * errs1[n], 2e-6) for n, e in errs.items()), (errs, errs1)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 96, 128])
def test_two_k_steps_an_iteration_on_gpu(d):
    """``unr`` on the GPU, causal, 4 query heads on 2 kv heads, N = 1,000: dK and dV the same bits
    as with one k-step an iteration, dQ the same up to its atomics' order."""
    q, k, v, do = inputs(d, 4, 2, 1000, 1000, d)
    o, lse = (x.astype(np.float32) for x in attention_forward(q, k, v, causal=True))
    a, b = (bwd_fp32_v2.backward(q, k, v, o, lse, do, causal=True, unr=u) for u in (False, True))
    _same_but_dq_order(a, b, d)
