"""Standard attention's schedule: walker == closed form, hand counts, and the paper's Algorithm 0/3."""

import numpy as np
import pytest
from _space import label
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim.algorithms import standard
from flashsim.api import simulate
from flashsim.config import BlockMask, Workload, cdiv
from flashsim.traffic import walk


@st.composite
def configs(draw):
    hkv = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 3]))
    nq = draw(st.integers(1, 45))  # 1 included: hypothesis draws the bounds often
    nk = draw(st.integers(1, 45))
    bm = None
    if draw(st.booleans()):
        bmm, bmn = draw(st.integers(1, 16)), draw(st.integers(1, 16))
        shape = (cdiv(nq, bmm), cdiv(nk, bmn))
        bits = draw(st.lists(st.booleans(), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
        bm = BlockMask.from_array(np.array(bits).reshape(shape), bmm, bmn)
    w = Workload(batch=draw(st.integers(1, 2)), heads=hkv * group, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk,
                 head_dim=draw(st.sampled_from([1, 3, 16, 24, 59, 64, 100])),
                 dtype=draw(st.sampled_from(["fp16", "fp32", "bf16"])), causal=draw(st.booleans()), block_mask=bm)
    opts = {"fuse": draw(st.sampled_from(standard.FUSE_CHOICES)),
            "dropout": draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])),
            "gemm_block": draw(st.sampled_from([1, 2, 3, 7, 16, 32, 64, 128]))}
    return w, opts


def _check(w, opts, pass_):
    r = simulate(w, "standard", pass_, **opts)
    assert r.io.elements_by_key() == r.closed_form.elements_by_key(), (w, opts, pass_)
    # bytes follow from the element sizes (Z is 1 byte per element)
    assert r.io.bytes_by_key() == r.closed_form.bytes_by_key()
    return r


@settings(max_examples=500, deadline=None)
@given(configs())
def test_forward_walker_equals_closed_form(cfg):
    w, opts = cfg
    label(w, opts["gemm_block"], opts["gemm_block"])
    _check(w, opts, "fwd")


@settings(max_examples=500, deadline=None)
@given(configs())
def test_backward_walker_equals_closed_form(cfg):
    w, opts = cfg
    label(w, opts["gemm_block"], opts["gemm_block"])
    _check(w, opts, "bwd")


# --------------------------------------------------------------------------------------------
# Hand-derived counts


def _counts(w, pass_, **opts):
    r = _check(w, opts, pass_)
    return r.io.elements_by_key()


def test_forward_hand_counts():
    # 1) B = H = 1, Nq = Nk = 4, d = 2, b = 4, fuse="softmax": Algorithm 0 verbatim.
    #    Q, K, V read 4·2 = 8 each, O written 8; S written 4·4 = 16 and read 16 by the softmax,
    #    P written 16 and read 16 by P·V.
    w = Workload(batch=1, heads=1, seq_len_q=4, head_dim=2)
    assert _counts(w, "fwd", fuse="softmax", gemm_block=4) == {
        ("K", "read"): 8, ("O", "write"): 8, ("P", "read"): 16, ("P", "write"): 16, ("Q", "read"): 8,
        ("S", "read"): 16, ("S", "write"): 16, ("V", "read"): 8}
    # 2) B = 1, H = 2, Hkv = 1, Nq = 5, Nk = 3, d = 3, b = 2, causal, fuse="none".
    #    Tr = ⌈5/2⌉ = 3, Tc = ⌈3/2⌉ = 2, one N x N matrix over both heads E = 2·5·3 = 30.
    #    Q read Tc·2·5·3 = 60; K read Tr·2·3·3 = 54 (each query head reads the shared kv head);
    #    S: GEMM writes 30, scale reads 30 writes 30, mask reads 30 writes 30, softmax reads 30
    #    -> S written 90, read 90; P written 30, read 30; V read Tr·2·3·3 = 54; O written 2·5·3 = 30.
    w = Workload(batch=1, heads=2, kv_heads=1, seq_len_q=5, seq_len_k=3, head_dim=3, causal=True)
    assert _counts(w, "fwd", fuse="none", gemm_block=2) == {
        ("K", "read"): 54, ("O", "write"): 30, ("P", "read"): 30, ("P", "write"): 30, ("Q", "read"): 60,
        ("S", "read"): 90, ("S", "write"): 90, ("V", "read"): 54}
    # 3) B = 2, H = 1, Nq = 3, Nk = 7, d = 5, b = 3, dropout 0.1, fuse="all".
    #    Tr = 1, Tc = 3, E = 2·3·7 = 42.  Q read 3·2·3·5 = 90, K read 1·2·7·5 = 70, S written 42
    #    (scale in the GEMM) and read 42 by mask+softmax+dropout, which writes P 42 and Z 42;
    #    P·V reads P 42 and Z 42 and V 70, writes O 2·3·5 = 30.
    w = Workload(batch=2, heads=1, seq_len_q=3, seq_len_k=7, head_dim=5, dtype="fp32")
    r = simulate(w, "standard", "fwd", fuse="all", dropout=0.1, gemm_block=3)
    assert r.io.elements_by_key() == {
        ("K", "read"): 70, ("O", "write"): 30, ("P", "read"): 42, ("P", "write"): 42, ("Q", "read"): 90,
        ("S", "read"): 42, ("S", "write"): 42, ("V", "read"): 70, ("Z", "read"): 42, ("Z", "write"): 42}
    assert r.io.breakdown[("Z", "write")].bytes == 42 and r.io.breakdown[("P", "write")].bytes == 4 * 42
    # 4) as 3) with fuse="softmax": dropout is its own kernel, reading P 42 and writing Pd 42
    #    and Z 42; P·V reads Pd 42 instead of P and Z.
    assert _counts(w, "fwd", fuse="softmax", dropout=0.1, gemm_block=3) == {
        ("K", "read"): 70, ("O", "write"): 30, ("P", "read"): 42, ("P", "write"): 42, ("Pd", "read"): 42,
        ("Pd", "write"): 42, ("Q", "read"): 90, ("S", "read"): 42, ("S", "write"): 42, ("V", "read"): 70,
        ("Z", "write"): 42}


def test_backward_hand_counts():
    # 1) B = H = 1, Nq = Nk = 4, d = 2, b = 4, fuse="softmax": Algorithm 3 verbatim.
    #    dV = Pᵀ dO: P 16, dO 8 read, dV 8 written; dP = dO Vᵀ: dO 8, V 8 read, dP 16 written;
    #    dS: P 16, dP 16 read, dS 16 written; dQ = dS K: dS 16, K 8, dQ 8; dK = dSᵀ Q: dS 16, Q 8, dK 8.
    w = Workload(batch=1, heads=1, seq_len_q=4, head_dim=2)
    assert _counts(w, "bwd", fuse="softmax", gemm_block=4) == {
        ("K", "read"): 8, ("P", "read"): 32, ("Q", "read"): 8, ("V", "read"): 8, ("dK", "write"): 8,
        ("dO", "read"): 16, ("dP", "read"): 16, ("dP", "write"): 16, ("dQ", "write"): 8, ("dS", "read"): 32,
        ("dS", "write"): 16, ("dV", "write"): 8}
    # 2) B = 1, H = 2, Hkv = 1, Nq = 5, Nk = 3, d = 3, b = 2, causal, fuse="none".
    #    Tr = 3, Tc = 2, E = 30, Q-shaped 2·5·3 = 30, K as read per query head 2·3·3 = 18, dK/dV 1·3·3 = 9.
    #    dV (one program for the kv head, both query heads stacked): P 30, dO Tc·30 = 60, dV 9;
    #    dP: dO 60, V Tr·18 = 54, dP 30; softmax bwd: P 30, dP 30 read, dS 30 written;
    #    mask bwd and scale bwd: dS 30 read + 30 written each; dQ: dS 30, K 54, dQ 30;
    #    dK: dS 30, Q Tc·30 = 60, dK 9.  P read 60, dO 120, dS written 90 and read 120.
    w = Workload(batch=1, heads=2, kv_heads=1, seq_len_q=5, seq_len_k=3, head_dim=3, causal=True)
    assert _counts(w, "bwd", fuse="none", gemm_block=2) == {
        ("K", "read"): 54, ("P", "read"): 60, ("Q", "read"): 60, ("V", "read"): 54, ("dK", "write"): 9,
        ("dO", "read"): 120, ("dP", "read"): 30, ("dP", "write"): 30, ("dQ", "write"): 30, ("dS", "read"): 120,
        ("dS", "write"): 90, ("dV", "write"): 9}
    # 3) B = 2, H = 1, Nq = 3, Nk = 7, d = 5, b = 3, dropout 0.1, fuse="softmax".
    #    Tr = 1, Tc = 3, E = 42, Q-shaped 30, K-shaped 70.  dV = Pdᵀ dO: Pd 42, dO 3·30 = 90,
    #    dV 70; dP: dO 90, V 70, dP 42; dropout bwd: dP 42 and Z 42 read, dP 42 written;
    #    softmax bwd: P 42, dP 42, dS 42; dQ: dS 42, K 70, dQ 30; dK: dS 42, Q 90, dK 70.
    w = Workload(batch=2, heads=1, seq_len_q=3, seq_len_k=7, head_dim=5)
    assert _counts(w, "bwd", fuse="softmax", dropout=0.1, gemm_block=3) == {
        ("K", "read"): 70, ("P", "read"): 42, ("Pd", "read"): 42, ("Q", "read"): 90, ("V", "read"): 70,
        ("Z", "read"): 42, ("dK", "write"): 70, ("dO", "read"): 180, ("dP", "read"): 84, ("dP", "write"): 84,
        ("dQ", "write"): 30, ("dS", "read"): 84, ("dS", "write"): 42, ("dV", "write"): 70}
    # 4) as 3) with fuse="all": Pᵀ dO reads P 42 and Z 42; the fused dropout+softmax+scale
    #    backward reads P 42, dP 42, Z 42: P read 84, Z read 84, dP written and read 42 once each.
    assert _counts(w, "bwd", fuse="all", dropout=0.1, gemm_block=3) == {
        ("K", "read"): 70, ("P", "read"): 84, ("Q", "read"): 90, ("V", "read"): 70, ("Z", "read"): 84,
        ("dK", "write"): 70, ("dO", "read"): 180, ("dP", "read"): 42, ("dP", "write"): 42, ("dQ", "write"): 30,
        ("dS", "read"): 84, ("dS", "write"): 42, ("dV", "write"): 70}


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), nk=st.integers(1, 300), d=st.integers(1, 160), bh=st.integers(1, 3))
def test_paper_counts_with_whole_matrix_gemms(n, nk, d, bh):
    """gemm_block >= max(Nq, Nk), fuse="softmax": Algorithm 0 moves Nq·d + Nk·d (Q, K) + 2·Nq·Nk
    (S written, read) + 2·Nq·Nk (P written, read) + Nk·d + Nq·d (V, O) per head, i.e. 4Nd + 4N²
    when Nq = Nk = N; Algorithm 3 moves 7N² + 8Nd."""
    w = Workload(batch=1, heads=bh, seq_len_q=n, seq_len_k=nk, head_dim=d)
    big = max(n, nk)
    fwd = simulate(w, "standard", "fwd", fuse="softmax", gemm_block=big)
    assert fwd.agrees
    assert fwd.io.elements == bh * (2 * n * d + 2 * nk * d + 4 * n * nk)
    bwd = simulate(w, "standard", "bwd", fuse="softmax", gemm_block=big)
    assert bwd.agrees
    # dO twice, dQ, Q once (Nq·d each); K, V, dK, dV once (Nk·d each); P 2, dP 2, dS 3 N² terms
    assert bwd.io.elements == bh * (4 * n * d + 4 * nk * d + 7 * n * nk)
    if n == nk:
        assert fwd.io.elements == bh * (4 * n * d + 4 * n * n)
        assert bwd.io.elements == bh * (8 * n * d + 7 * n * n)


def test_fusion_and_tiling_order():
    w = Workload(batch=1, heads=2, seq_len_q=200, seq_len_k=150, head_dim=40, causal=True)
    for pass_ in ("fwd", "bwd"):
        for p in (0.0, 0.2):
            tot = {f: simulate(w, "standard", pass_, fuse=f, dropout=p).io.bytes for f in standard.FUSE_CHOICES}
            assert tot["none"] > tot["softmax"] >= tot["all"]
            if p > 0:
                assert tot["softmax"] > tot["all"]
        # smaller GEMM tiles re-read Q, K, V more
        by_b = [simulate(w, "standard", pass_, gemm_block=b).io.elements for b in (16, 64, 256)]
        assert by_b[0] > by_b[1] > by_b[2]


def test_launch_sequence_and_gqa_accumulation():
    w = Workload(batch=2, heads=6, kv_heads=2, seq_len_q=33, seq_len_k=20, head_dim=24, causal=True)
    s = standard.schedule(w, None, "fwd", fuse="none", dropout=0.1)
    assert [ln.name for ln in s.launches] == ["gemm_qk", "scale", "mask", "softmax", "dropout", "gemm_pv"]
    s = standard.schedule(w, None, "bwd", fuse="none", dropout=0.1)
    assert [ln.name for ln in s.launches] == ["gemm_dv", "gemm_dp", "dropout_bwd", "softmax_bwd", "mask_bwd",
                                              "scale_bwd", "gemm_dq", "gemm_dk"]
    assert [ln.name for ln in standard.schedule(w, None, "bwd").launches] == [
        "gemm_dv", "gemm_dp", "scale_mask_softmax_bwd", "gemm_dq", "gemm_dk"]
    # dK, dV accumulated over the group: written once per kv head, one program per kv head
    io = walk(s)
    assert io.breakdown[("dK", "write")].elements == 2 * 2 * 20 * 24
    assert io.per_launch["gemm_dk"].breakdown[("dS", "read")].elements == 2 * 6 * 33 * 20
    assert [ln.programs for ln in s.launches if ln.name in ("gemm_dv", "gemm_dk")] == [4, 4]
    assert s.tensors["Z"].elem_bytes == 1


def test_options_are_checked():
    w = Workload(batch=1, heads=1, seq_len_q=8, head_dim=4)
    for bad in ({"fuse": "some"}, {"dropout": 1.0}, {"dropout": -0.1}, {"gemm_block": 0}, {"gemm_block": 2.5},
                {"block": 3}):
        with pytest.raises(ValueError):
            standard.schedule(w, None, "fwd", **bad)
        with pytest.raises(ValueError):
            standard.closed_form(w, None, "fwd", **bad)
    assert set(standard.OPTIONS) == {"fuse", "dropout", "gemm_block"}
    assert not standard.NEEDS_TILING and standard.PASSES == ("fwd", "bwd")


def test_large_n_is_fast():
    import time

    w = Workload(batch=1, heads=16, seq_len_q=65536, head_dim=128, causal=True)
    t = time.perf_counter()
    r = simulate(w, "standard", "fwd+bwd", fuse="none", dropout=0.1)
    assert r.agrees
    assert time.perf_counter() - t < 60  # ~1 s unloaded; generous for a busy 2-core CI machine
