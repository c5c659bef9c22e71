"""Issue 16, scale: the walker counts grouped transfers (``Launch.counts``) in O(Tr + Tc), equal to
the loop-order stream transfer for transfer, so any N <= 2^20 runs without Tr x Tc or N x N arrays.
(Speed itself is measured by benchmarks/bench_scale.py, not asserted here.)"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashsim import BlockMask, Tiling, Workload, simulate
from flashsim.api import build_schedule
from flashsim.bounds import needed_rows, visible_pairs
from flashsim.flops import block_entries
from flashsim.masking import visible_blocks, visible_cols, visible_counts, visible_rows
from flashsim.traffic import walk

RUNS = [("flash1", "fwd"), ("flash1", "bwd"), ("flash2", "fwd"), ("flash2", "bwd"), ("standard", "fwd"),
        ("standard", "bwd"), ("smallcache", "fwd")]


@st.composite
def cases(draw):
    algo, pass_ = draw(st.sampled_from(RUNS))
    ints = st.sampled_from([int, np.int32, np.int64, np.uint16])
    nq, nk = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    bm, bn = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    causal = algo != "smallcache" and draw(st.booleans())
    mask = None
    if algo in ("flash1", "flash2") and draw(st.booleans()):
        shape = (-(-nq // bm), -(-nk // bn))
        bits = draw(st.lists(st.booleans(), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
        mask = BlockMask(bm, bn, np.array(bits, bool).reshape(shape))
    t = draw(ints)
    w = Workload(batch=t(draw(st.integers(1, 2))), heads=t(hkv * group), kv_heads=t(hkv), seq_len_q=t(nq),
                 seq_len_k=t(nk), head_dim=t(draw(st.integers(1, 40))), dtype=draw(st.sampled_from(["fp16", "fp32"])),
                 causal=causal, block_mask=mask)
    opts = {}
    if algo == "standard":
        opts = dict(gemm_block=draw(st.integers(1, 40)), fuse=draw(st.sampled_from(["none", "softmax", "all"])),
                    dropout=draw(st.sampled_from([0.0, 0.1])))
    if algo == "smallcache":
        opts = dict(tile=draw(st.integers(1, 12)))
    return w, algo, pass_, None if algo == "standard" else Tiling(bm, bn), opts  # standard takes no tiling


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_grouped_counts_equal_the_loop_order_stream(case):
    """walk() over the grouped ``counts`` == walk(ordered=True) over ``accesses()``: elements,
    bytes and sectors, per tensor and per launch."""
    w, algo, pass_, tiling, opts = case
    sched = build_schedule(w, algo, pass_, tiling, **opts)
    assert walk(sched) == walk(sched, ordered=True)


@settings(max_examples=150, deadline=None)
@given(nq=st.integers(1, 90), nk=st.integers(1, 90), bm=st.integers(1, 20), bn=st.integers(1, 20),
       causal=st.booleans())
def test_visibility_without_the_dense_array(nq, nk, bm, bn, causal):
    w = Workload(batch=1, heads=1, seq_len_q=nq, seq_len_k=nk, head_dim=8, causal=causal)
    t = Tiling(bm, bn)
    vis = visible_blocks(w, t)
    rows, cols = visible_counts(w, t)
    np.testing.assert_array_equal(rows, vis.sum(axis=1))
    np.testing.assert_array_equal(cols, vis.sum(axis=0))
    np.testing.assert_array_equal(visible_rows(w, t, np.array([0, vis.shape[0] - 1])), vis[[0, -1]])
    np.testing.assert_array_equal(visible_cols(w, t, np.array([vis.shape[1] - 1])), vis[:, [-1]].T)
    # flops' block entries and the bounds' visible pairs / needed rows, by formula
    r = np.minimum(bm, nq - np.arange(vis.shape[0]) * bm)
    c = np.minimum(bn, nk - np.arange(vis.shape[1]) * bn)
    assert block_entries(w, t) == int(r @ vis.astype(np.int64) @ c)
    lim = np.clip(np.arange(nq) + nk - nq + 1, 0, nk) if causal else np.full(nq, nk)
    assert visible_pairs(w) == int(lim.sum())
    assert needed_rows(w) == (int((lim > 0).sum()), int(lim.max()))


@pytest.mark.parametrize("algo, pass_, causal", [(a, p, c) for a, p in RUNS for c in (False, True)
                                                 if not (a == "smallcache" and c)])  # smallcache: dense only
def test_n_2_20_with_the_smallest_blocks(algo, pass_, causal):
    """N = 2^20, d = 64 and the smallest M each algorithm takes (1 x 1 blocks: 10^12 block pairs;
    flash2 at N = 32,768 and M = 256 took 164 s and 11.5 GB before): walker == closed form, sectors
    counted, well under 1 GB of Python-visible memory."""
    n = 2**20
    w = Workload(batch=1, heads=2, seq_len_q=n, head_dim=64, causal=causal)
    kw = {"standard": dict(gemm_block=1), "smallcache": dict(sram_elems=5)}.get(algo, dict(sram_elems=4 * 64))
    tracemalloc.start()
    try:
        r = simulate(w, algo, pass_, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{algo} {pass_} causal={causal}: peak {peak / 2**20:.0f} MiB, {r.io.bytes:,} bytes")
    assert r.agrees and r.io.sectors > 0 and r.io.bytes == r.closed_form.bytes
    assert peak < 2**30


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 3000), block=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_classes_group_blocks_by_what_a_count_sees(n, block, seed):
    """classes() (both its paths: one size but the last, and the general sort) sums the weights
    of the blocks with the same (start mod 32, size), and its representatives are real blocks."""
    from flashsim.algorithms._common import block_rows, classes

    start, size = block_rows(n, block)
    weight = np.random.default_rng(seed).integers(0, 5, start.size)
    want: dict = {}
    for s0, sz, wt in zip(start.tolist(), size.tolist(), weight.tolist()):
        want[(s0 % 32, sz)] = want.get((s0 % 32, sz), 0) + wt
    for st_, sz_ in ((start, size), (start[::-1].copy(), size[::-1].copy())):  # reversed: the general path
        wt_ = weight if st_[0] == start[0] else weight[::-1].copy()
        rep, sizes, tot = classes(st_, sz_, wt_)
        got: dict = {}
        for s0, sz, t in zip(rep.tolist(), sizes.tolist(), tot.tolist()):
            assert s0 in set(st_.tolist())
            got[(s0 % 32, sz)] = got.get((s0 % 32, sz), 0) + t
        assert got == {k: v for k, v in want.items() if v}


@pytest.mark.parametrize("algo, pass_", RUNS)
def test_grouped_counts_at_a_few_hundred_blocks(algo, pass_):
    """Past the 64 blocks where classes() takes its fast path: grouped == loop order, ragged, GQA."""
    causal = algo != "smallcache"
    w = Workload(batch=1, heads=6, kv_heads=2, seq_len_q=601, seq_len_k=533, head_dim=37, causal=causal)
    opts = {"standard": dict(gemm_block=3), "smallcache": dict(tile=7)}.get(algo, {})
    sched = build_schedule(w, algo, pass_, None if algo == "standard" else Tiling(3, 2), **opts)
    assert walk(sched) == walk(sched, ordered=True)
