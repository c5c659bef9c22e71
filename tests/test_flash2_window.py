"""flash2's sliding-window option: the key-block ranges against an element-level mask, and
walker == closed form (forward and backward) over hypothesis-drawn workloads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim import Tiling, Workload, simulate
from flashsim.masking import visible_blocks


def element_mask(w: Workload, left: int, right: int) -> np.ndarray:
    """Nq x Nk: row i (position pos = i + Nk - Nq) sees j iff pos - left <= j <= pos + right, and
    j <= pos when causal."""
    pos = np.arange(w.nq)[:, None] + w.nk - w.nq
    j = np.arange(w.nk)[None, :]
    m = (j >= pos - left) & (j <= pos + right)
    if w.causal:
        m &= j <= pos
    return m


@st.composite
def cases(draw):
    hkv, g = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    w = Workload(batch=draw(st.integers(1, 2)), heads=hkv * g, kv_heads=hkv, seq_len_q=draw(st.integers(1, 30)),
                 seq_len_k=draw(st.integers(1, 30)), head_dim=draw(st.integers(1, 5)),
                 dtype=draw(st.sampled_from(["fp16", "fp32"])), causal=draw(st.booleans()))
    t = Tiling(draw(st.integers(1, 7)), draw(st.integers(1, 7)))
    return w, t, (draw(st.integers(0, 35)), draw(st.integers(0, 35)))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_window_blocks_and_counts(case):
    w, t, win = case
    m = element_mask(w, *win)
    tr, tc = t.t_r(w.nq), t.t_c(w.nk)
    want = np.zeros((tr, tc), dtype=bool)
    for i in range(tr):
        for j in range(tc):
            want[i, j] = m[i * t.block_m:(i + 1) * t.block_m, j * t.block_n:(j + 1) * t.block_n].any()
    assert (visible_blocks(w, t, win) == want).all()
    for p in ("fwd", "bwd"):
        r = simulate(w, "flash2", p, tiling=t, window=win)
        if not r.agrees:
            print(p, r.io.elements_by_key(), r.closed_form.elements_by_key())
        assert r.agrees
    # FLOPs: the entries of the visible blocks, masked ones inside included
    from flashsim.flops import block_entries, flops

    rows_i = np.minimum(t.block_m, w.nq - np.arange(tr) * t.block_m)
    cols_j = np.minimum(t.block_n, w.nk - np.arange(tc) * t.block_n)
    assert block_entries(w, t, win) == int(rows_i @ want.astype(np.int64) @ cols_j)
    assert flops(w, "fwd", "flash2", t, window=win)["entries"] == block_entries(w, t, win)
    # forward K reads: each query head loads the rows of every visible block once
    rows = np.minimum(t.block_n, w.nk - np.arange(tc) * t.block_n)
    k = simulate(w, "flash2", "fwd", tiling=t, window=win).io.elements_by_key().get(("K", "read"), 0)
    assert k == w.bh * int(want.sum(axis=0) @ rows) * w.d


def test_window_hand_count():
    # Nq = Nk = 8, Br = Bc = 2, causal, window left 2: row i sees i-2 .. i.  Query block 0 (rows
    # 0, 1) sees key block 0; block 1 (rows 2, 3: keys 0..3) blocks 0, 1; block 2 (keys 2..5) blocks
    # 1, 2; block 3 (keys 4..7) blocks 2, 3: 7 key blocks of 2 rows = 14 rows per head (dense: 4·8 = 32).
    w = Workload(batch=1, heads=1, seq_len_q=8, head_dim=4, causal=True)
    r = simulate(w, "flash2", "fwd", tiling=Tiling(2, 2), window=(2, 0))
    assert r.io.elements_by_key()[("K", "read")] == 14 * 4


def test_window_bad():
    w = Workload(batch=1, heads=1, seq_len_q=8, head_dim=4)
    for bad in [(-1, 0), (1,), "a,b", (1.5, 0)]:
        with pytest.raises(ValueError, match="window"):
            simulate(w, "flash2", "fwd", tiling=Tiling(2, 2), window=bad)


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_window_block_model_requests_what_the_walker_counts(pass_):
    from flashsim.api import build_schedule
    from flashsim.l2 import dram_traffic
    from flashsim.traffic import walk

    w = Workload(batch=1, heads=2, kv_heads=1, seq_len_q=40, seq_len_k=56, head_dim=8, causal=True)
    sched = build_schedule(w, "flash2", pass_, tiling=Tiling(8, 8), window=(12, 0))
    io = walk(sched)
    for launch in dram_traffic(sched, "h100").launches:
        c = io.per_launch[launch.name]
        assert launch.requested_read_bytes == 32 * c.read_sectors
        assert launch.requested_write_bytes == 32 * c.write_sectors
