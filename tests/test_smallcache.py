"""The small-cache algorithm of Saha & Ye: walker == closed form, its tile rule, its refusals, and
where it beats (M ≪ d²) and loses to (M ≫ d²) FlashAttention-2."""

import numpy as np
import pytest
from _space import label
from hypothesis import event, given, settings
from hypothesis import strategies as st

from flashsim.algorithms.smallcache import tile_for_sram
from flashsim.api import closed_form_elements, simulate
from flashsim.bounds import bounds_table
from flashsim.config import BlockMask, Tiling, Workload


@settings(max_examples=500, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), d=st.integers(1, 24), hkv=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 3]), batch=st.integers(1, 2), dtype=st.sampled_from(["fp16", "fp32", "bf16"]),
       s=st.integers(1, 16))
def test_walker_equals_closed_form(nq, nk, d, hkv, group, batch, dtype, s):
    w = Workload(batch=batch, heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d, dtype=dtype)
    label(w, s, s, s)
    m = 3 * s * s + 2 * s
    assert tile_for_sram(m) == s
    # M reaches the algorithm as an explicit tile (exact) ...
    r = simulate(w, "smallcache", sram_elems=max(m, 4 * d), tile=s)
    assert r.agrees, (r.io.elements_by_key(), r.closed_form.elements_by_key())
    assert r.io.bytes == r.closed_form.bytes
    assert r.io.sectors >= r.io.bytes // 32


@settings(max_examples=300, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), d=st.integers(1, 40), hkv=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 3]), batch=st.integers(1, 2), dtype=st.sampled_from(["fp16", "fp32", "bf16"]),
       m=st.integers(5, 1000))
def test_walker_equals_closed_form_given_m(nq, nk, d, hkv, group, batch, dtype, m):
    """... or as M itself, any M >= 5 (below 4d too, where FlashAttention's tiling does not exist):
    the tile side is the largest s with 3s² + 2s <= M, exactly."""
    w = Workload(batch=batch, heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d, dtype=dtype)
    s = tile_for_sram(m)
    label(w, s, s, s)
    if m < 4 * d:
        event("M < 4d")
    r = simulate(w, "smallcache", sram_elems=m)
    assert r.tiling is None and r.options == {"sram_elems": m}
    assert r.agrees, (r.io.elements_by_key(), r.closed_form.elements_by_key())
    assert r.io.bytes_by_key() == r.closed_form.bytes_by_key()
    assert r.io.elements == simulate(w, "smallcache", sram_elems=m, tile=s).io.elements
    assert closed_form_elements(w, "smallcache", sram_elems=m) == r.io.elements_by_key()


def test_m_is_exact_not_rounded_to_the_tiling():
    """M = 257 with d = 64: s = 8 (3·64 + 16 = 208 <= 257 < 3·81 + 18 = 261).  Turning M into
    FlashAttention's tiling first (Bc = ⌈257/256⌉ = 2) would recover M = 512 and s = 12, tiles
    that do not fit in 257 elements."""
    w = Workload(batch=1, heads=1, seq_len_q=64, head_dim=64)
    r = simulate(w, "smallcache", sram_elems=257)
    assert tile_for_sram(257) == 8
    assert r.io.elements == simulate(w, "smallcache", sram_elems=10**6, tile=8).io.elements
    assert r.io.elements != simulate(w, "smallcache", sram_elems=10**6, tile=12).io.elements
    row = bounds_table(w, 257, ["smallcache"])[0]
    assert row["simulated"] == r.io.elements
    # below 4d = 256: the small-cache regime FlashAttention's tiling cannot reach
    r = simulate(w, "smallcache", sram_elems=100)
    assert r.agrees and r.options == {"sram_elems": 100}
    with pytest.raises(ValueError, match="sram_elems"):
        simulate(w, "flash2", sram_elems=100)
    for bad in (0, -5, 4, 2.5):
        with pytest.raises(ValueError, match="sram_elems"):
            simulate(w, "smallcache", sram_elems=bad)


def test_m_recovered_from_the_tiling():
    """Given a Br x Bc tiling instead of M, the module recovers M = 4·d·Bc (exact when 4d | M)."""
    w = Workload(batch=1, heads=1, seq_len_q=40, seq_len_k=33, head_dim=16)
    m = 4 * 16 * 20
    r = simulate(w, "smallcache", tiling=Tiling.from_sram(m, 16))
    assert r.agrees and r.io.elements == simulate(w, "smallcache", sram_elems=m, tile=tile_for_sram(m)).io.elements
    assert r.io.elements == simulate(w, "smallcache", sram_elems=m).io.elements


def _hand(w, m):
    r = simulate(w, "smallcache", sram_elems=m)
    assert r.closed_form.elements_by_key() == r.io.elements_by_key()
    return r


def test_hand_counts():
    # 1) B = H = 1, Nq = 3, Nk = 5, d = 4, fp32, M = 16: s = 2 (3·4 + 4 = 16 <= 16 < 3·9 + 6).
    #    Blocks: query rows [2, 1] (Tq = 2), key rows [2, 2, 1] (Tk = 3), head-dim chunks [2, 2] (Td = 2).
    #    smallcache_qk, loop (I, J, c): Q[I, c] is loaded once per J: Tk · (all of Q) = 3·12 = 36;
    #      K[J, c] once per I: Tq · 20 = 40; S[I, J] written once: 3·5 = 15.
    #    smallcache_stats: S read 15, L written 3.
    #    smallcache_pv, loop (I, c, J): L[I] once per (I, c): Td · 3 = 6; S[I, J] once per (I, c, J):
    #      Td · 15 = 30 (S read 15 + 30 = 45); V[J, c] once per I: Tq · 20 = 40; O[I, c] written
    #      once: 12.
    w = Workload(batch=1, heads=1, seq_len_q=3, seq_len_k=5, head_dim=4, dtype="fp32")
    r = _hand(w, 16)
    assert r.io.elements_by_key() == {
        ("K", "read"): 40, ("L", "read"): 6, ("L", "write"): 3, ("O", "write"): 12, ("Q", "read"): 36,
        ("S", "read"): 45, ("S", "write"): 15, ("V", "read"): 40}
    # bytes: fp32 throughout (L is float32 anyway); sectors of O: four 2 x 2, 2 x 2, 1 x 2, 1 x 2
    # tiles of 16-byte rows at a 256-byte-aligned base; O[0, 0] = bytes [0, 8) and [16, 24), one
    # sector; O[0, 1] = [8, 16) and [24, 32), one; O[1, 0] = [32, 40), one; O[1, 1] = [40, 48), one.
    assert r.io.bytes == 4 * r.io.elements
    assert r.io.breakdown[("O", "write")].sectors == 4
    # 2) B = 1, H = 2, Hkv = 1, Nq = Nk = 4, d = 3, fp16, M = 5 < 4d = 12: s = 1, Tq = Tk = 4, Td = 3.
    #    Per query head: Q read Tk·12 = 48, K read Tq·12 = 48 (each query head reads the shared kv
    #    head), V 48, S written 16 and read 16 + Td·16 = 64, L written 4 and read Td·4 = 12, O 12.
    w = Workload(batch=1, heads=2, kv_heads=1, seq_len_q=4, head_dim=3)
    r = _hand(w, 5)
    assert r.io.elements_by_key() == {
        ("K", "read"): 96, ("L", "read"): 24, ("L", "write"): 8, ("O", "write"): 24, ("Q", "read"): 96,
        ("S", "read"): 128, ("S", "write"): 32, ("V", "read"): 96}
    assert r.io.breakdown[("L", "read")].bytes == 4 * 24 and r.io.breakdown[("S", "read")].bytes == 2 * 128


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
    with pytest.raises(ValueError, match="tile=5: .* more than M = 64"):  # 3·25 + 10 = 85 > 64
        simulate(Workload(**base), "smallcache", sram_elems=64, tile=5)
    assert simulate(Workload(**base), "smallcache", sram_elems=64, tile=4).io.elements > 0  # 56 <= 64


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
