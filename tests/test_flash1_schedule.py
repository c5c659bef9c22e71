"""FlashAttention-1 (Algorithms 1 and 4) schedules: walker == closed form, hand counts, Theorem 2,
Proposition 4."""

import numpy as np
import pytest
from _space import label
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim.algorithms import flash1
from flashsim.api import simulate
from flashsim.config import BlockMask, Tiling, Workload
from flashsim.traffic import walk


@st.composite
def configs(draw):
    """Ragged sizes (1 included), Nq != Nk, causal (Nq > Nk included), odd d, GQA/MQA, random
    block masks, tilings explicit or from an SRAM size."""
    nq = draw(st.integers(1, 70))
    nk = draw(st.integers(1, 70))
    d = draw(st.sampled_from([1, 3, 7, 16, 24, 59, 64]))
    hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    batch = draw(st.integers(1, 2))
    if draw(st.booleans()):
        tiling = Tiling(draw(st.integers(1, 20)), draw(st.integers(1, 20)))
    else:
        tiling = Tiling.from_sram(draw(st.integers(4 * d, 4 * d * 24)), d)
    mask = None
    if draw(st.booleans()):
        tr, tc = tiling.t_r(nq), tiling.t_c(nk)
        density = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9]))
        seed = draw(st.integers(0, 2**31 - 1))
        arr = np.random.default_rng(seed).random((tr, tc)) < density
        mask = BlockMask.from_array(arr, tiling.block_m, tiling.block_n)
    w = Workload(batch=batch, heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d,
                 dtype=draw(st.sampled_from(["fp16", "fp32"])), causal=draw(st.booleans()), block_mask=mask)
    return w, tiling, draw(st.booleans())


@settings(max_examples=500, deadline=None)
@given(configs())
def test_forward_walker_equals_closed_form(cfg):
    w, t, o_fp32 = cfg
    label(w, t.block_m, t.block_n)
    r = simulate(w, "flash1", "fwd", tiling=t, o_fp32=o_fp32)
    assert r.io.elements_by_key() == r.closed_form.elements_by_key()
    assert r.io.bytes_by_key() == r.closed_form.bytes_by_key()


@settings(max_examples=500, deadline=None)
@given(configs())
def test_backward_walker_equals_closed_form(cfg):
    w, t, o_fp32 = cfg
    label(w, t.block_m, t.block_n)
    r = simulate(w, "flash1", "bwd", tiling=t, o_fp32=o_fp32)
    assert r.io.elements_by_key() == r.closed_form.elements_by_key()
    assert r.io.bytes_by_key() == r.closed_form.bytes_by_key()


def _walk(w, t, pass_):
    return walk(flash1.schedule(w, t, pass_)).elements_by_key()


# --------------------------------------------------------------------------------------------
# Hand-derived counts


def test_forward_by_hand_dense():
    # Nq = Nk = 4, d = 2, Br = Bc = 2: Tr = Tc = 2, every block visible.
    w = Workload(batch=1, heads=1, seq_len_q=4, head_dim=2)
    want = {
        ("K", "read"): 2 * (2 * 2),  # K_0, K_1: 2 rows x 2 each
        ("V", "read"): 2 * (2 * 2),
        ("Q", "read"): 2 * 2 * (2 * 2),  # Tc = 2 passes x Tr = 2 blocks x (2 x 2)
        ("O", "read"): 2 * 2 * (2 * 2),
        ("O", "write"): 4 * 2 + 2 * 2 * (2 * 2),  # init 4 x 2 = 8, then 16
        ("l", "read"): 2 * 2 * 2,  # Tc x Tr x Br
        ("m", "read"): 2 * 2 * 2,
        ("l", "write"): 4 + 2 * 2 * 2,  # init 4, then 8
        ("m", "write"): 4 + 2 * 2 * 2,
    }
    assert _walk(w, Tiling(2, 2), "fwd") == dict(sorted(want.items()))


def test_forward_by_hand_causal_rectangular():
    # Nq = 3, Nk = 5, d = 3, Br = Bc = 2, causal bottom-right: row r sees keys <= r + 2.
    # Query blocks: i=0 rows {0,1}, i=1 row {2}; key blocks j=0 {0,1}, j=1 {2,3}, j=2 {4}.
    # Block 0's last row (1) sees keys 0..3 -> j = 0, 1; block 1's row 2 sees keys 0..4 -> j = 0, 1, 2.
    # Query rows visited: 2 rows x 2 blocks + 1 row x 3 blocks = 7.  Every j is seen: K rows 5.
    w = Workload(batch=1, heads=1, seq_len_q=3, seq_len_k=5, head_dim=3, causal=True)
    want = {
        ("K", "read"): 5 * 3,
        ("V", "read"): 5 * 3,
        ("Q", "read"): 7 * 3,
        ("O", "read"): 7 * 3,
        ("O", "write"): 3 * 3 + 7 * 3,  # init 9, then 21
        ("l", "read"): 7,
        ("m", "read"): 7,
        ("l", "write"): 3 + 7,
        ("m", "write"): 3 + 7,
    }
    assert _walk(w, Tiling(2, 2), "fwd") == dict(sorted(want.items()))


def test_forward_by_hand_gqa_block_mask():
    # H = 2 query heads sharing Hkv = 1, Nq = Nk = 4, d = 2, Br = Bc = 2, mask [[1, 0], [0, 0]]:
    # only block (0, 0).  Key block 1 has no visible query block, so K_1, V_1 are never loaded.
    # Per head: K 2x2 = 4, Q_0 2x2 = 4, O write 8 (init) + 4, l/m read 2, write 4 (init) + 2.
    bm = BlockMask.from_array(np.array([[1, 0], [0, 0]], dtype=bool), 2, 2)
    w = Workload(batch=1, heads=2, kv_heads=1, seq_len_q=4, head_dim=2, block_mask=bm)
    want = {
        ("K", "read"): 2 * 4,
        ("V", "read"): 2 * 4,
        ("Q", "read"): 2 * 4,
        ("O", "read"): 2 * 4,
        ("O", "write"): 2 * (8 + 4),
        ("l", "read"): 2 * 2,
        ("m", "read"): 2 * 2,
        ("l", "write"): 2 * (4 + 2),
        ("m", "write"): 2 * (4 + 2),
    }
    assert _walk(w, Tiling(2, 2), "fwd") == dict(sorted(want.items()))


def test_backward_by_hand_dense():
    # Nq = Nk = 4, d = 2, Br = Bc = 2.  Init writes dQ, dK, dV (8 each).  For each of the 2 key
    # blocks: K_j, V_j (4 each); for each of the 2 query blocks: Q, O, dO, dQ (4 each), l, m
    # (2 each) read, dQ (4) written; then dK_j, dV_j (4 each) written.
    w = Workload(batch=1, heads=1, seq_len_q=4, head_dim=2)
    want = {
        ("K", "read"): 8, ("V", "read"): 8,
        ("Q", "read"): 16, ("O", "read"): 16, ("dO", "read"): 16, ("dQ", "read"): 16,
        ("l", "read"): 8, ("m", "read"): 8,
        ("dQ", "write"): 8 + 16,
        ("dK", "write"): 8 + 8, ("dV", "write"): 8 + 8,
    }
    assert _walk(w, Tiling(2, 2), "bwd") == dict(sorted(want.items()))


def test_backward_by_hand_causal_rectangular():
    # Same blocks as the forward causal case: 7 query rows visited, 5 key rows, d = 3.
    w = Workload(batch=1, heads=1, seq_len_q=3, seq_len_k=5, head_dim=3, causal=True)
    want = {
        ("K", "read"): 15, ("V", "read"): 15,
        ("Q", "read"): 21, ("O", "read"): 21, ("dO", "read"): 21, ("dQ", "read"): 21,
        ("l", "read"): 7, ("m", "read"): 7,
        ("dQ", "write"): 9 + 21,  # init 3 x 3, then 21
        ("dK", "write"): 15 + 15,  # init 5 x 3, then 15
        ("dV", "write"): 15 + 15,
    }
    assert _walk(w, Tiling(2, 2), "bwd") == dict(sorted(want.items()))


def test_backward_by_hand_gqa():
    # H = 4, Hkv = 2 (group 2), Nq = 2, Nk = 4, d = 2, Br = Bc = 2: Tr = 1, Tc = 2.
    # 2 programs (one per kv head).  Init: dQ 4 heads x 4 = 16, dK, dV 2 x 8 = 16.
    # Per program, per j (2): K_j, V_j 4 each; 2 query heads x 1 block: Q, O, dO, dQ 4 each,
    # l, m 2 each, dQ write 4; dK_j, dV_j 4 each.
    # K: 2 prog x 2 j x 4 = 16; Q: 2 x 2 x 2 x 4 = 32; l: 2 x 2 x 2 x 2 = 16; dK: 16 + 2 x 2 x 4 = 32.
    w = Workload(batch=1, heads=4, kv_heads=2, seq_len_q=2, seq_len_k=4, head_dim=2)
    want = {
        ("K", "read"): 16, ("V", "read"): 16,
        ("Q", "read"): 32, ("O", "read"): 32, ("dO", "read"): 32, ("dQ", "read"): 32,
        ("l", "read"): 16, ("m", "read"): 16,
        ("dQ", "write"): 16 + 32,
        ("dK", "write"): 16 + 16, ("dV", "write"): 16 + 16,
    }
    assert _walk(w, Tiling(2, 2), "bwd") == dict(sorted(want.items()))


# --------------------------------------------------------------------------------------------
# Theorem 2 (forward) and Theorem 5 (backward): Θ(N²d²/M), exactly


@pytest.mark.parametrize("n,d,m_elems", [(1024, 64, 16384), (512, 32, 8192), (999, 24, 5000), (256, 16, 1024)])
def test_theorem2_exact_expression(n, d, m_elems):
    t = Tiling.from_sram(m_elems, d)
    tc = t.t_c(n)
    w = Workload(batch=1, heads=1, seq_len_q=n, head_dim=d)
    r = simulate(w, "flash1", "fwd", tiling=t)
    assert r.agrees
    # K, V once (2Nd); init O, ℓ, m (Nd + 2N); per key block: Q and O read, O written (3Nd) and
    # ℓ, m read and written (4N).
    assert r.io.elements == 2 * n * d + n * d + 2 * n + tc * n * (3 * d + 4)
    # Backward: K, V read once, dK, dV written twice (init + line 23); Q, O, dO, dQ read, dQ
    # written and ℓ, m read per key block; dQ init.
    rb = simulate(w, "flash1", "bwd", tiling=t)
    assert rb.io.elements == 2 * n * d + 4 * n * d + n * d + tc * n * (5 * d + 2)
    if m_elems % (4 * d) == 0 and n % t.block_n == 0:
        # Bc = M/4d exactly, so Tc = N/Bc = 4Nd/M and each pass-count term is 4N²d²/M.
        assert tc * n * d * m_elems == 4 * n * n * d * d
        assert r.io.breakdown[("Q", "read")].elements * m_elems == 4 * n * n * d * d


def test_io_falls_as_one_over_m():
    # Doubling M (with Bc | N) halves the Tc-proportional part of the traffic exactly.
    n, d = 2048, 64
    w = Workload(batch=1, heads=1, seq_len_q=n, head_dim=d)
    fixed = 2 * n * d + n * d + 2 * n
    prev = None
    for m_elems in (4096, 8192, 16384, 32768, 65536):
        io = simulate(w, "flash1", "fwd", sram_elems=m_elems).io.elements - fixed
        if prev is not None:
            assert 2 * io == prev
        prev = io


# --------------------------------------------------------------------------------------------
# Proposition 4: block-sparse FlashAttention, Θ(Nd + N²d²M⁻¹s)


def test_block_sparse_counts_scale_with_nonzero_blocks():
    n, d, m_elems = 256, 16, 1024  # Bc = 16, Br = 16: Tr = Tc = 16
    t = Tiling.from_sram(m_elems, d)
    tr = tc = n // t.block_n
    rng = np.random.default_rng(1)
    for density in (1 / 16, 0.25, 0.5, 1.0):
        arr = rng.random((tr, tc)) < density
        arr[np.arange(tr), rng.integers(0, tc, tr)] = True  # every query block sees something
        nnz = int(arr.sum())
        bm = BlockMask.from_array(arr, t.block_m, t.block_n)
        w = Workload(batch=1, heads=1, seq_len_q=n, head_dim=d, block_mask=bm)
        io = simulate(w, "flash1", "fwd", tiling=t).io.elements_by_key()
        cols = int(arr.any(axis=0).sum())
        # Q, O, ℓ, m move once per nonzero block: nnz·Br·d = s·Tr·Tc·Br·d = s·N·Tc·d
        assert io[("Q", "read")] == nnz * t.block_m * d
        assert io[("O", "read")] == nnz * t.block_m * d
        assert io[("O", "write")] == n * d + nnz * t.block_m * d
        assert io[("l", "read")] == nnz * t.block_m
        # K, V: one load per key block that any query block sees: at most N·d
        assert io[("K", "read")] == cols * t.block_n * d <= n * d
        s = nnz / (tr * tc)
        assert io[("Q", "read")] * m_elems == pytest.approx(4 * n * n * d * d * s)
