"""The small-cache algorithm of Saha & Ye: walker == closed form, its tile rule, its refusals, and
where it beats (M ≪ d²) and loses to (M ≫ d²) FlashAttention-2."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim.algorithms.smallcache import tile_for_sram
from flashsim.api import closed_form_elements, simulate
from flashsim.config import BlockMask, Workload


@settings(max_examples=300, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), d=st.integers(1, 24), hkv=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 3]), batch=st.integers(1, 2), dtype=st.sampled_from(["fp16", "fp32", "bf16"]),
       s=st.integers(1, 16))
def test_walker_equals_closed_form(nq, nk, d, hkv, group, batch, dtype, s):
    w = Workload(batch=batch, heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d, dtype=dtype)
    m = 3 * s * s + 2 * s
    assert tile_for_sram(m) == s
    # M reaches the algorithm as an explicit tile (exact) ...
    r = simulate(w, "smallcache", sram_elems=max(m, 4 * d), tile=s)
    assert r.agrees, (r.io.elements_by_key(), r.closed_form.elements_by_key())
    assert r.io.bytes == r.closed_form.bytes
    assert r.io.sectors >= r.io.bytes // 32


def test_m_recovered_from_the_tiling():
    """Without ``tile`` the module recovers M = 4·d·Bc from the paper's tiling (exact when 4d | M)."""
    w = Workload(batch=1, heads=1, seq_len_q=40, seq_len_k=33, head_dim=16)
    m = 4 * 16 * 20
    r = simulate(w, "smallcache", sram_elems=m)
    assert r.agrees and r.io.elements == simulate(w, "smallcache", sram_elems=m, tile=tile_for_sram(m)).io.elements


def test_tile_rule():
    for m in range(5, 5000):
        s = tile_for_sram(m)
        assert 3 * s * s + 2 * s <= m < 3 * (s + 1) ** 2 + 2 * (s + 1)
    with pytest.raises(ValueError, match="sram_elems"):
        tile_for_sram(4)


def test_refuses_masks_and_backward():
    base = dict(batch=1, heads=1, seq_len_q=16, head_dim=8)
    with pytest.raises(ValueError, match="causal"):
        closed_form_elements(Workload(**base, causal=True), "smallcache", sram_elems=64)
    bm = BlockMask.from_array(np.ones((2, 2), bool), 8, 8)
    with pytest.raises(ValueError, match="block_mask"):
        simulate(Workload(**base, block_mask=bm), "smallcache", sram_elems=256)
    with pytest.raises(ValueError, match="pass_"):
        simulate(Workload(**base), "smallcache", "bwd", sram_elems=64)
    with pytest.raises(ValueError, match="tile"):
        simulate(Workload(**base), "smallcache", sram_elems=64, tile=0)


def _total(w, algo, m):
    return sum(closed_form_elements(w, algo, "fwd", sram_elems=m).values())


@pytest.mark.parametrize("d, m", [(256, 1024), (128, 512), (256, 4096), (512, 8192)])
def test_beats_flash2_when_m_much_below_d2(d, m):
    assert m * 8 <= d * d
    w = Workload(batch=1, heads=2, seq_len_q=4096, head_dim=d)
    sc, f2 = _total(w, "smallcache", m), _total(w, "flash2", m)
    assert sc < f2 / 2, (sc, f2)


@pytest.mark.parametrize("d, m", [(64, 65536), (64, 16384), (32, 16384), (128, 131072)])
def test_loses_to_flash2_when_m_much_above_d2(d, m):
    assert m >= 4 * d * d
    w = Workload(batch=1, heads=2, seq_len_q=4096, head_dim=d)
    sc, f2 = _total(w, "smallcache", m), _total(w, "flash2", m)
    assert sc > f2, (sc, f2)


def test_count_is_theta_n2d_over_sqrt_m():
    """Θ(N²d/√M) in the small-cache regime: ≈ 4√3·N²d/√M + 2N² when the tiles divide evenly."""
    for d in (64, 128, 256):
        for m in (4 * d, 16 * d, d * d // 4, d * d):
            n = 2048
            w = Workload(batch=1, heads=1, seq_len_q=n, head_dim=d)
            ratio = _total(w, "smallcache", m) / (n * n * d / np.sqrt(m))
            assert 4 * np.sqrt(3) * 0.9 <= ratio <= 4 * np.sqrt(3) + 4, (d, m, ratio)
