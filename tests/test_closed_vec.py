"""The vectorised dense-forward closed forms equal the scalar ones entry for entry."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim import closed_vec
from flashsim.algorithms.smallcache import tile_for_sram
from flashsim.api import build_schedule, closed_form_elements
from flashsim.config import Workload
from flashsim.traffic import from_elements


def _available(algo):
    try:
        closed_form_elements(Workload(batch=1, heads=1, seq_len_q=4, head_dim=2), algo, sram_elems=64, **(
            {"tile": 1} if algo == "smallcache" else {}))
    except ImportError:
        return False
    return True


@settings(max_examples=100, deadline=None)
@given(nq=st.integers(1, 5000), nk=st.integers(1, 5000), d=st.integers(1, 300), m_mult=st.integers(4, 5000),
       batch=st.integers(1, 4), hkv=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2]),
       dtype=st.sampled_from(["fp16", "fp32"]))
def test_vectorised_equals_scalar(nq, nk, d, m_mult, batch, hkv, group, dtype):
    m = m_mult * d
    w = Workload(batch=batch, heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d, dtype=dtype)
    for algo in closed_vec.ALGOS:
        if not _available(algo) or (algo == "smallcache" and m < 5):
            continue
        opts = {"tile": tile_for_sram(m)} if algo == "smallcache" else {}
        want = closed_form_elements(w, algo, "fwd", sram_elems=m, **opts)
        vec = closed_vec.dense_forward(algo, np.array([nq]), d, m, batch, w.heads, nk=nk, kv_heads=hkv)
        assert {k: int(v[0]) for k, v in vec.items() if int(v[0])} == want, algo
        el, by = closed_vec.totals(vec, dtype)
        io = from_elements(want, build_schedule(w, algo, "fwd", sram_elems=m, **opts).tensors)
        assert (int(el[0]), int(by[0])) == (io.elements, io.bytes)


@settings(max_examples=100, deadline=None)
@given(nq=st.integers(1, 5000), nk=st.integers(1, 5000), d=st.integers(1, 300), m_mult=st.integers(4, 5000),
       batch=st.integers(1, 4), hkv=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2, 3]),
       dtype=st.sampled_from(["fp16", "fp32"]))
def test_vectorised_backward_equals_scalar(nq, nk, d, m_mult, batch, hkv, group, dtype):
    m = m_mult * d
    w = Workload(batch=batch, heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d, dtype=dtype)
    for algo in closed_vec.BWD_ALGOS:
        if not _available(algo):
            continue
        want = closed_form_elements(w, algo, "bwd", sram_elems=m)
        vec = closed_vec.dense_backward(algo, np.array([nq]), d, m, batch, w.heads, nk=nk, kv_heads=hkv)
        assert {k: int(v[0]) for k, v in vec.items() if int(v[0])} == want, algo
        el, by = closed_vec.totals(vec, dtype)
        io = from_elements(want, build_schedule(w, algo, "bwd", sram_elems=m).tensors)
        assert (int(el[0]), int(by[0])) == (io.elements, io.bytes)


def test_dense_arrays_and_refusals():
    nq = np.array([1, 100, 4097])
    for pass_ in ("fwd", "bwd"):
        vec = closed_vec.dense("flash2", pass_, nq, 64, 16384, 2, 8, kv_heads=2)
        for k in range(len(nq)):
            w = Workload(batch=2, heads=8, kv_heads=2, seq_len_q=int(nq[k]), head_dim=64)
            assert {t: int(v[k]) for t, v in vec.items() if int(v[k])} == closed_form_elements(
                w, "flash2", pass_, sram_elems=16384)
    with pytest.raises(ValueError, match="algo"):
        closed_vec.dense_backward("smallcache", 128, 64, 1000)
    with pytest.raises(ValueError, match="pass_"):
        closed_vec.dense("flash2", "both", 128, 64, 1000)
    with pytest.raises(ValueError, match="kv_heads"):
        closed_vec.dense_backward("flash1", 128, 64, 1000, heads=4, kv_heads=3)


def test_smallcache_tile_vectorised():
    m = np.arange(5, 200000)
    s = closed_vec.smallcache_tile(m)
    assert np.all(3 * s * s + 2 * s <= m) and np.all(3 * (s + 1) ** 2 + 2 * (s + 1) > m)
    assert s[1000] == tile_for_sram(1005)


def test_rejects_small_m():
    with pytest.raises(ValueError, match="sram_elems"):
        closed_vec.dense_forward("flash2", 128, 64, 100)
