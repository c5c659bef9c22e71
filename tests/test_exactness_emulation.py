"""The low-precision emulation of the online softmax (analysis/exactness.py) against the float64 reference."""

import numpy as np
import pytest

from analysis.exactness import tiled_attention
from kernels.reference import attention_forward, plain_attention_lowp, rel_error


def _inputs(n=256, d=32, heads=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, heads, n, d)) for _ in range(3)]


@pytest.mark.parametrize("block_n", [1, 7, 64, 256, 1000])
@pytest.mark.parametrize("o_in_hbm", [False, True])
def test_float64_is_exact(block_n, o_in_hbm):
    q, k, v = _inputs()
    ref, _ = attention_forward(q, k, v)
    out = tiled_attention(q, k, v, block_n, store=np.float64, acc=np.float64, o_in_hbm=o_in_hbm)
    err = rel_error(out, ref)
    print(f"float64, Bc={block_n}, o_in_hbm={o_in_hbm}: rel err {err:.2e}")
    assert err < 1e-13


def test_float32_near_unit_roundoff():
    q, k, v = _inputs()
    ref, _ = attention_forward(q, k, v)
    for bn in (16, 256):
        err = rel_error(tiled_attention(q, k, v, bn, store=np.float32, acc=np.float32), ref)
        print(f"float32, Bc={bn}: rel err {err:.2e}")
        assert err < 2e-6


def test_fp16_fp32_accumulator_is_as_good_as_plain_fp16():
    q, k, v = (x.astype(np.float16).astype(np.float64) for x in _inputs())
    ref, _ = attention_forward(q, k, v)
    base = rel_error(plain_attention_lowp(q, k, v), ref)
    err = rel_error(tiled_attention(q, k, v, 32), ref)
    print(f"fp16 store, fp32 acc: {err:.2e}; plain fp16 attention: {base:.2e}")
    assert err <= base


def test_rewriting_o_in_fp16_accumulates_rounding():
    # Tc = 1 rounds O once (the same as the fp32 accumulator); Tc = 256 rounds it 256 times.
    q, k, v = (x.astype(np.float16).astype(np.float64) for x in _inputs())
    ref, _ = attention_forward(q, k, v)
    once = rel_error(tiled_attention(q, k, v, 256, o_in_hbm=True), ref)
    flash2 = rel_error(tiled_attention(q, k, v, 256), ref)
    many = rel_error(tiled_attention(q, k, v, 1, o_in_hbm=True), ref)
    print(f"O in fp16 HBM: Tc=1 {once:.2e}, Tc=256 {many:.2e}; fp32 accumulator {flash2:.2e}")
    assert once == pytest.approx(flash2, rel=1e-6)
    assert many > 2 * once
    # keeping O in float32 in HBM (the kernel's o_fp32 option) removes most of the growth
    many32 = rel_error(tiled_attention(q, k, v, 1, o_in_hbm=True, o_store=np.float32), ref)
    print(f"O in fp32 HBM: Tc=256 {many32:.2e}")
    assert many32 < many / 2


def test_rejects_bad_block():
    q, k, v = _inputs(n=8, d=4)
    with pytest.raises(ValueError, match="block_n"):
        tiled_attention(q, k, v, 0)
