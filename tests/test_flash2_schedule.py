"""FlashAttention-2 schedules (forward and backward): walker == closed form, and hand counts."""

import time

import numpy as np
import pytest
from _space import label
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashsim.algorithms import flash2
from flashsim.api import simulate
from flashsim.config import BlockMask, Tiling, Workload
from flashsim.traffic import from_elements, walk


@st.composite
def workloads(draw):
    """Ragged Nq, Nk (1 included, Nq ≠ Nk and Nq > Nk with causal), any d, GQA/MQA, causal, block
    masks, and tilings given explicitly or by the paper's rule from an SRAM size."""
    kv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4]))
    nq = draw(st.integers(1, 90))  # 1 included: hypothesis draws the bounds often
    nk = draw(st.one_of(st.just(nq), st.integers(1, 90)))
    d = draw(st.one_of(st.sampled_from([1, 2, 24, 59, 64, 128]), st.integers(1, 130)))
    if draw(st.booleans()):
        tiling = Tiling(draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    else:
        tiling = Tiling.from_sram(draw(st.integers(4 * d, 4 * d * 40)), d)
    mask = None
    if draw(st.booleans()):
        tr, tc = tiling.t_r(nq), tiling.t_c(nk)
        bits = draw(st.lists(st.booleans(), min_size=tr * tc, max_size=tr * tc))
        mask = BlockMask.from_array(np.array(bits).reshape(tr, tc), tiling.block_m, tiling.block_n)
    w = Workload(batch=draw(st.integers(1, 2)), heads=kv * group, kv_heads=kv, seq_len_q=nq, seq_len_k=nk,
                 head_dim=d, dtype=draw(st.sampled_from(["fp16", "fp32"])), causal=draw(st.booleans()),
                 block_mask=mask)
    return w, tiling


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_forward_walker_equals_closed_form(wt):
    w, t = wt
    label(w, t.block_m, t.block_n)
    sched = flash2.schedule(w, t, "fwd")
    io = walk(sched)
    formula = {k: v for k, v in flash2.closed_form(w, t, "fwd").items() if v}
    assert io.elements_by_key() == formula
    assert io.bytes_by_key() == from_elements(formula, sched.tensors).bytes_by_key()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_backward_walker_equals_closed_form(wt):
    w, t = wt
    label(w, t.block_m, t.block_n)
    sched = flash2.schedule(w, t, "bwd")
    io = walk(sched)
    formula = {k: v for k, v in flash2.closed_form(w, t, "bwd").items() if v}
    assert io.elements_by_key() == formula
    assert io.bytes_by_key() == from_elements(formula, sched.tensors).bytes_by_key()
    assert set(io.per_launch) <= {"flash2_bwd_preprocess", "flash2_bwd_dkdv", "flash2_bwd_dq"}


# Hand-derived counts (B = batch, H heads, Hkv kv heads; rows per block in brackets).
HAND_FWD = [
    # Nq=Nk=4, d=2, Br=Bc=2, B=H=1, dense: Tr=2.  Q read 4·2=8; K read Tr·Nk·d=2·4·2=16, V 16;
    # O write 8; L write 4.
    (dict(batch=1, heads=1, seq_len_q=4, head_dim=2), Tiling(2, 2),
     {("Q", "read"): 8, ("K", "read"): 16, ("V", "read"): 16, ("O", "write"): 8, ("L", "write"): 4}),
    # The same, causal: query block 0 (rows 0,1) sees columns <= 1, key block 0 only (2 rows);
    # block 1 (rows 2,3) sees all 4 rows.  K rows 2+4=6, K read 6·2=12, V 12; Q 8, O 8, L 4.
    (dict(batch=1, heads=1, seq_len_q=4, head_dim=2, causal=True), Tiling(2, 2),
     {("Q", "read"): 8, ("K", "read"): 12, ("V", "read"): 12, ("O", "write"): 8, ("L", "write"): 4}),
    # Nq=3, Nk=5, d=3, Br=Bc=2, B=1, H=2, Hkv=1, causal (shift Nk-Nq=2).  Key blocks [2,2,1] rows.
    # Query block 0 (rows 0,1): row 1 sees columns <= 3, key blocks 0,1: 4 rows.  Block 1 (row 2)
    # sees columns <= 4: all 5 rows.  Per head 9 rows; 2 heads: K read 2·9·3=54, V 54;
    # Q read 2·3·3=18, O write 18, L write 2·3=6.
    (dict(batch=1, heads=2, kv_heads=1, seq_len_q=3, seq_len_k=5, head_dim=3, causal=True), Tiling(2, 2),
     {("Q", "read"): 18, ("K", "read"): 54, ("V", "read"): 54, ("O", "write"): 18, ("L", "write"): 6}),
]

HAND_BWD = [
    # Nq=Nk=4, d=2, Br=Bc=2, B=H=1, dense.
    # preprocess: O read 8, dO read 8, D write 4.
    # dK/dV: K, V read 8 each, dK, dV write 8 each; each of the 2 key blocks loads both query
    #   blocks: 8 query rows, Q read 16, dO 16, L 8, D 8.
    # dQ: Q, dO read 8 each, L, D 4 each; K, V read Tr·Nk·d = 16 each; dQ write 8.
    # Totals: Q 16+8=24, dO 8+16+8=32, L 8+4=12, D read 12, K 8+16=24, V 24.
    (dict(batch=1, heads=1, seq_len_q=4, head_dim=2), Tiling(2, 2),
     {("O", "read"): 8, ("dO", "read"): 32, ("D", "write"): 4, ("Q", "read"): 24, ("L", "read"): 12,
      ("D", "read"): 12, ("K", "read"): 24, ("V", "read"): 24, ("dK", "write"): 8, ("dV", "write"): 8,
      ("dQ", "write"): 8}),
    # The same, causal: visible (i, j) pairs (0,0), (1,0), (1,1).
    # dK/dV: key block 0 loads query blocks 0 and 1 (4 rows), key block 1 block 1 (2 rows): 6 rows,
    #   Q read 12, dO 12, L 6, D 6; K, V 8 each.  dQ: query block 0 loads key block 0 (2 rows),
    #   block 1 both (4 rows): K read (2+4)·2=12, V 12; Q, dO 8, L, D 4.
    # Totals: Q 12+8=20, dO 8+12+8=28, L 6+4=10, D read 10, K 8+12=20, V 20.
    (dict(batch=1, heads=1, seq_len_q=4, head_dim=2, causal=True), Tiling(2, 2),
     {("O", "read"): 8, ("dO", "read"): 28, ("D", "write"): 4, ("Q", "read"): 20, ("L", "read"): 10,
      ("D", "read"): 10, ("K", "read"): 20, ("V", "read"): 20, ("dK", "write"): 8, ("dV", "write"): 8,
      ("dQ", "write"): 8}),
    # GQA: B=1, H=2, Hkv=1, Nq=3, Nk=5, d=3, Br=Bc=2, causal (shift 2); query blocks [2,1] rows,
    # key blocks [2,2,1].  Query block 0 sees key blocks 0,1; block 1 sees 0,1,2.
    # preprocess: O read 2·3·3=18, dO 18, D write 6.
    # dK/dV (one program for both heads): K, V read 5·3=15 each, dK, dV write 15 each.  Key block
    #   0 loads query rows 2+1=3, block 1 3, block 2 1: 7 rows per head, 14 for 2 heads:
    #   Q read 14·3=42, dO 42, L 14, D 14.
    # dQ: Q, dO read 18 each, L, D 6 each; key rows per head 4+5=9, 2 heads: K read 18·3=54,
    #   V 54; dQ write 18.
    # Totals: Q 42+18=60, dO 18+42+18=78, L 14+6=20, D read 20, K 15+54=69, V 69.
    (dict(batch=1, heads=2, kv_heads=1, seq_len_q=3, seq_len_k=5, head_dim=3, causal=True), Tiling(2, 2),
     {("O", "read"): 18, ("dO", "read"): 78, ("D", "write"): 6, ("Q", "read"): 60, ("L", "read"): 20,
      ("D", "read"): 20, ("K", "read"): 69, ("V", "read"): 69, ("dK", "write"): 15, ("dV", "write"): 15,
      ("dQ", "write"): 18}),
]


@pytest.mark.parametrize("pass_,case", [("fwd", c) for c in HAND_FWD] + [("bwd", c) for c in HAND_BWD])
def test_hand_counts(pass_, case):
    kw, t, want = case
    w = Workload(dtype="fp32", **kw)
    r = simulate(w, "flash2", pass_, tiling=t)
    assert r.io.elements_by_key() == dict(sorted(want.items()))
    assert r.closed_form.elements_by_key() == dict(sorted(want.items()))


def test_block_mask_must_match_tiling():
    w = Workload(batch=1, heads=1, seq_len_q=8, head_dim=4,
                 block_mask=BlockMask.from_array(np.ones((2, 2), bool), 4, 4))
    with pytest.raises(ValueError, match="block_mask"):
        walk(flash2.schedule(w, Tiling(2, 2), "bwd"))


def test_walker_speed_at_64k():
    """N = 65,536, d = 128 with the H100's fp16 tiling: printed, not asserted (run with -s)."""
    t = Tiling.from_sram_bytes(227 * 1024, 128, 2)
    for causal in (False, True):
        w = Workload(batch=1, heads=1, seq_len_q=65536, head_dim=128, causal=causal)
        for pass_ in ("fwd", "bwd"):
            t0 = time.perf_counter()
            r = simulate(w, "flash2", pass_, tiling=t)
            print(f"flash2 {pass_} causal={causal} N=65536 d=128 {t}: walker+closed form "
                  f"{time.perf_counter() - t0:.2f} s")
            assert r.agrees
