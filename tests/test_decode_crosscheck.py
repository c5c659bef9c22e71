"""The decode kernels' traffic formulas (``kernels.decode.expected_counts``, which the counting
kernels are held to in tests/test_decode_kernel.py) equal the simulator's walker for the decode
schedule (``flashsim.algorithms.decode``), element for element: the chain kernel counters ==
formulas == walker, over hypothesis-drawn batches, lengths, splits, pages and windows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim import Tiling, Workload, simulate
from kernels.decode import expected_counts


@st.composite
def decode_cases(draw):
    hkv, g = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    nq, d, bc = draw(st.integers(1, 3)), draw(st.sampled_from([8, 16])), draw(st.sampled_from([4, 8, 16]))
    page = draw(st.sampled_from([0, 4, 8, 16]))
    nk = draw(st.sampled_from([16, 32, 64]))
    lengths = draw(st.lists(st.integers(nq, nk), min_size=1, max_size=3))
    window = draw(st.none() | st.tuples(st.integers(0, 40), st.just(0)))
    left = -1 if window is None else window[0]
    # the blocks the longest sequence sees (a window's first block to its last): the most splits
    blocks = max((n - 1) // bc - (max(0, n - nq - left) // bc if left >= 0 else 0) + 1 for n in lengths)
    splits = draw(st.integers(1, blocks))
    return hkv, g, nq, d, bc, page, nk, lengths, window, splits


@settings(max_examples=200, deadline=None)
@given(decode_cases())
def test_kernel_formulas_equal_the_walker(case):
    hkv, g, nq, d, bc, page, nk, lengths, window, splits = case
    w = Workload(batch=len(lengths), heads=hkv * g, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d,
                 dtype="fp16")
    opts = dict(num_splits=splits, lengths=lengths)
    if page:
        opts["page_size"] = page
    if window is not None:
        opts["window"] = window
    walked = {k: v for k, v in simulate(w, "decode", "fwd", tiling=Tiling(1, bc), **opts).io.elements_by_key().items()
              if v}
    formulas = expected_counts(lengths, heads=hkv * g, kv_heads=hkv, nq=nq, d=d, bc=bc, splits=splits,
                               page_size=page, window=window)
    assert walked == formulas, (case, walked, formulas)
