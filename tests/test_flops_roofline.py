"""FLOP counts (against brute-force entry counts and the per-algorithm matmul ratios) and the
roofline model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim.api import simulate
from flashsim.config import GPUS, BlockMask, Tiling, Workload, cdiv
from flashsim.flops import block_entries, computed_entries, flops
from flashsim.masking import visible_blocks
from flashsim.roofline import roofline, roofline_from_counts


def brute_visible(w: Workload) -> int:
    i = np.arange(w.nq)[:, None]
    j = np.arange(w.nk)[None, :]
    vis = np.ones((w.nq, w.nk), dtype=bool)
    if w.causal:
        vis &= j <= i + (w.nk - w.nq)
    if w.block_mask is not None:
        bm = w.block_mask
        vis &= bm.array[i // bm.block_m, j // bm.block_n]
    return int(vis.sum())


def brute_block_entries(w: Workload, t: Tiling) -> int:
    vis = visible_blocks(w, t)
    total = 0
    for i in range(vis.shape[0]):
        for j in range(vis.shape[1]):
            if vis[i, j]:
                total += min(t.block_m, w.nq - i * t.block_m) * min(t.block_n, w.nk - j * t.block_n)
    return total


@pytest.mark.parametrize("algo", [None, "standard", "flash1", "flash2", "smallcache"])
def test_dense_forward_is_4_nq_nk_d(algo):
    w = Workload(batch=2, heads=3, seq_len_q=100, seq_len_k=70, head_dim=24)
    f = flops(w, "fwd", algo=algo, sram_elems=1024)
    assert f["matmul"] == 4 * 100 * 70 * 24 * 6
    assert f["total"] == f["matmul"] + f["nonmatmul"]
    assert 0 < f["nonmatmul"] < f["matmul"]


@settings(max_examples=100, deadline=None)
@given(nq=st.integers(1, 80), nk=st.integers(1, 80), br=st.integers(1, 20), bc=st.integers(1, 20),
       causal=st.booleans(), sparse=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_entries_against_brute_force(nq, nk, br, bc, causal, sparse, seed):
    bm = None
    if sparse:
        bm = BlockMask.from_array(np.random.default_rng(seed).random((cdiv(nq, br), cdiv(nk, bc))) < 0.5, br, bc)
    w = Workload(batch=1, heads=1, seq_len_q=nq, seq_len_k=nk, head_dim=8, causal=causal, block_mask=bm)
    t = Tiling(br, bc)
    assert computed_entries(w) == brute_visible(w)
    assert block_entries(w, t) == brute_block_entries(w, t)
    # tiled algorithms compute whole visible blocks: never fewer than the visible entries
    assert computed_entries(w, "flash2", tiling=t) >= computed_entries(w)
    assert computed_entries(w, "standard") == nq * nk
    f = flops(w, "fwd", algo=None)
    assert f["matmul"] == 4 * 8 * brute_visible(w)


def test_causal_roughly_halves():
    n, d = 1024, 64
    w = Workload(batch=1, heads=1, seq_len_q=n, head_dim=d, causal=True)
    assert flops(w, "fwd")["matmul"] == 4 * d * n * (n + 1) // 2
    tiled = flops(w, "fwd", algo="flash2", tiling=Tiling(64, 64))["matmul"]
    # 16 x 16 blocks, 136 visible, each 64 x 64 computed whole
    assert tiled == 4 * d * 136 * 64 * 64
    assert flops(w, "fwd", algo="standard")["matmul"] == 4 * d * n * n


@pytest.mark.parametrize("algo, ratio", [(None, 2.0), ("standard", 2.0), ("flash1", 2.5), ("flash2", 3.5)])
def test_backward_matmul_ratio(algo, ratio):
    w = Workload(batch=1, heads=2, seq_len_q=256, head_dim=32)
    fwd = flops(w, "fwd", algo=algo, sram_elems=4096)["matmul"]
    bwd = flops(w, "bwd", algo=algo, sram_elems=4096)["matmul"]
    assert bwd == ratio * fwd
    both = flops(w, "fwd+bwd", algo=algo, sram_elems=4096)
    assert both["matmul"] == fwd + bwd


def test_flops_errors():
    w = Workload(batch=1, heads=1, seq_len_q=16, head_dim=8)
    with pytest.raises(ValueError, match="pass_"):
        flops(w, "bwd", algo="smallcache")
    with pytest.raises(ValueError, match="pass_"):
        flops(w, "sideways")
    with pytest.raises(ValueError, match="algo"):
        flops(w, "fwd", algo="flash9")


def test_roofline_terms_and_bound():
    g = GPUS["h100"]
    r = roofline_from_counts(1e12, 1e10, 1e9, "h100", "fp16")
    assert r["matmul_s"] == pytest.approx(1e12 / g.matmul_flops["fp16"])
    assert r["nonmatmul_s"] == pytest.approx(1e10 / g.nonmatmul_flops)
    assert r["compute_s"] == pytest.approx(r["matmul_s"] + r["nonmatmul_s"])
    assert r["memory_s"] == pytest.approx(1e9 / g.hbm_bytes_per_s)
    assert r["time_s"] == max(r["compute_s"], r["memory_s"])
    assert r["bound"] == "compute" and r["arithmetic_intensity"] == pytest.approx(1.01e12 / 1e9)
    assert roofline_from_counts(1e9, 0, 1e9, g, "fp16")["bound"] == "memory"
    # fp32: strict CUDA-core rate unless TF32 is allowed
    assert roofline_from_counts(1e12, 0, 1, g, "fp32")["matmul_s"] == pytest.approx(1e12 / 66.9e12)
    assert roofline_from_counts(1e12, 0, 1, g, "fp32", tf32=True)["matmul_s"] == pytest.approx(1e12 / 494.7e12)


def test_roofline_of_simulations():
    w = Workload(batch=4, heads=8, seq_len_q=2048, head_dim=64)
    m = GPUS["a100-80gb"].sram_elems(w.elem_bytes)
    std = roofline(simulate(w, "standard"), "a100-80gb")
    # FlashAttention-2's forward intensity is ≈ Br FLOP/byte (4·N²·d FLOPs over 2·(N²d/Br)
    # two-byte K, V reads): the paper's rule caps Br at d = 64, below the A100's ridge point of
    # 153, so it is memory-bound; with Br = 256 (and Bc = 64, as real kernels choose) it is not.
    f2 = roofline(simulate(w, "flash2", sram_elems=m), "a100-80gb")
    f2_big = roofline(simulate(w, "flash2", tiling=Tiling(256, 64)), "a100-80gb")
    assert std["bound"] == "memory" and f2["bound"] == "memory" and f2_big["bound"] == "compute"
    assert f2["arithmetic_intensity"] == pytest.approx(64, rel=0.05)
    assert f2_big["time_s"] < f2["time_s"] < std["time_s"]
    assert f2_big["arithmetic_intensity"] > f2["ridge_point"] > f2["arithmetic_intensity"] > std["arithmetic_intensity"]
    res = simulate(w, "flash2", sram_elems=m)
    sec = roofline(res, "a100-80gb", sectors=True)
    assert sec["hbm_bytes"] == res.io.sectors * 32 >= res.io.bytes
    with pytest.raises(ValueError, match="sectors"):
        roofline(res, "a100-80gb", sectors=True, use_closed_form=True)
