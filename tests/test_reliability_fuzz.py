"""Issue 16: a fuzz over valid and invalid inputs to Workload, Tiling, BlockMask and simulate.

The only allowed outcomes are a ValueError, or a result whose walker and closed form agree and
whose counts are non-negative.  Any other exception (TypeError, AttributeError, OverflowError,
MemoryError, AssertionError, ...) fails the test.  Sizes are bounded so that valid draws are
small; invalid ones include numpy scalar types, bools, None, strings, floats, zero, negatives and
ints far past the limits."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flashsim import BlockMask, Tiling, Workload, get_gpu, simulate
from flashsim.algorithms import ALGORITHMS

INT_TYPES = [int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def small_int(draw, lo=1, hi=48):
    """A valid size as a Python or numpy integer (of a type that can hold it)."""
    v = draw(st.integers(lo, hi))
    t = draw(st.sampled_from([t for t in INT_TYPES if np.iinfo(t).max >= v] if v > 1 else INT_TYPES))
    return t(v)


JUNK = st.one_of(
    st.sampled_from([0, -1, -64, None, True, False, np.bool_(True), "64", "", b"8", [], (16,), {}, 1.5, 64.0,
                     np.float64(32.0), np.float32(16.0), float("nan"), float("inf"), 2**31, 2**63, 10**30,
                     -(2**63), np.int64(-5), np.uint8(0), 1j, object()]),
    st.integers(-100, 0),
    st.integers(2**31, 2**70),
    st.floats(allow_nan=True),
)


def size(lo=1, hi=48):
    """Mostly valid sizes, sometimes junk."""
    return st.one_of(small_int(lo, hi), small_int(lo, hi), small_int(lo, hi), JUNK)


@st.composite
def block_masks(draw):
    bm, bn = draw(size(1, 16)), draw(size(1, 16))
    rows, cols = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    kind = draw(st.sampled_from(["bool", "int", "float", "nan", "ragged", "junk"]))
    if kind == "ragged":
        mask = [[True] * draw(st.integers(0, 3)) for _ in range(rows)]
    elif kind == "junk":
        mask = draw(JUNK)
    else:
        vals = draw(st.lists(st.booleans(), min_size=rows * cols, max_size=rows * cols))
        arr = np.array(vals, dtype=bool).reshape(rows, cols)
        if kind == "int":
            arr = arr.astype(np.int64) * draw(st.sampled_from([1, 1, 2]))
        elif kind in ("float", "nan"):
            arr = arr.astype(np.float64)
            if kind == "nan" and arr.size:
                arr.flat[0] = np.nan
        mask = arr
    return BlockMask(bm, bn, mask)  # may raise ValueError: drawn inside the test's try


@st.composite
def calls(draw):
    """Arguments for one simulate call: a valid one, or one with one or two of its inputs replaced
    by junk.  Construction happens in the test (it may refuse)."""
    algo = draw(st.sampled_from(ALGORITHMS))
    nq = draw(small_int(1, 64))
    wl = dict(batch=draw(small_int(1, 3)), heads=draw(small_int(1, 4)), seq_len_q=nq, head_dim=draw(small_int(1, 40)))
    if draw(st.booleans()):
        wl["seq_len_k"] = draw(small_int(1, 64))
    if draw(st.booleans()):
        wl["kv_heads"] = draw(st.sampled_from([1, wl["heads"]]))
    wl["dtype"] = draw(st.sampled_from(["fp16", "fp32", "bf16"]))
    wl["causal"] = algo != "smallcache" and draw(st.sampled_from([False, True, np.bool_(True), np.bool_(False)]))
    mask = "mask" if algo in ("flash1", "flash2") and draw(st.integers(0, 3)) == 0 else None
    pass_ = draw(st.sampled_from(["fwd"] if algo == "smallcache" else ["fwd", "bwd", "fwd+bwd"]))
    tiling = None
    sram = None
    if algo in ("flash1", "flash2") and draw(st.booleans()):
        tiling = ("Tiling", draw(small_int(1, 24)), draw(small_int(1, 24)))
    elif algo != "standard" or draw(st.booleans()):
        sram = draw(small_int(4 * int(wl["head_dim"]), 20000)) if algo != "smallcache" else draw(small_int(5, 20000))
    opts = {}
    if algo == "standard" and draw(st.booleans()):
        opts = dict(gemm_block=draw(small_int(1, 80)), fuse=draw(st.sampled_from(["none", "softmax", "all"])),
                    dropout=draw(st.sampled_from([0.0, 0.1, np.float64(0.5)])))
    if algo == "smallcache" and draw(st.booleans()):
        opts = {"tile": draw(small_int(1, 12))}
        sram = None
    if algo == "flash1" and draw(st.booleans()):
        opts = {"o_fp32": draw(st.sampled_from([True, False, np.bool_(True)]))}
    # junk in up to two places
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        where = draw(st.sampled_from(["workload", "workload", "algo", "pass", "tiling", "sram", "option", "mask"]))
        if where == "workload":
            key = draw(st.sampled_from(["batch", "heads", "seq_len_q", "head_dim", "seq_len_k", "kv_heads", "dtype",
                                        "causal"]))
            wl[key] = draw(st.one_of(JUNK, st.sampled_from(["fp8", [], "yes", 1, None, 16])))
        elif where == "algo":
            algo = draw(st.sampled_from(["flash3", None, ["flash2"], "", 2]))
        elif where == "pass":
            pass_ = draw(st.sampled_from(["sideways", None, "FWD", "bwd+fwd", ["fwd"], 0]))
        elif where == "tiling":
            tiling = draw(st.one_of(st.just((16, 16)), JUNK, st.tuples(st.just("Tiling"), size(1, 24), size(1, 24))))
        elif where == "sram":
            sram = draw(JUNK)
        elif where == "option":
            opts = {draw(st.sampled_from(["gemm_block", "fuse", "dropout", "tile", "o_fp32", "bogus"])): draw(JUNK)}
        else:
            mask = "junk"
    return wl, mask, algo, pass_, tiling, sram, opts


def _check_result(r):
    assert r.agrees, (r.io.elements_by_key(), r.closed_form.elements_by_key())
    assert r.io.bytes == r.closed_form.bytes
    for t in r.io.breakdown.values():
        assert t.elements >= 0 and t.bytes >= 0 and t.sectors is not None and t.sectors >= 0
        assert t.sectors * 32 >= t.bytes
    for t in r.closed_form.breakdown.values():
        assert t.elements >= 0 and t.bytes >= 0


@FUZZ
@given(calls(), st.data())
def test_simulate_fuzz(call, data):
    wl, mask_kind, algo, pass_, tiling, sram, opts = call
    try:
        if mask_kind == "mask":
            w0 = Workload(**wl)
            bm = data.draw(st.sampled_from([1, 4, 8, 16]))
            bn = data.draw(st.sampled_from([1, 4, 8, 16]))
            shape = (-(-w0.nq // bm), -(-w0.nk // bn))
            rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
            wl = dict(wl, block_mask=BlockMask(bm, bn, rng.random(shape) < data.draw(st.sampled_from([0.0, 0.5, 1.0]))))
            if data.draw(st.booleans()):
                tiling = ("Tiling", bm, bn)
        elif mask_kind == "junk":
            wl = dict(wl, block_mask=data.draw(block_masks() | JUNK))
        w = Workload(**wl)
        if isinstance(tiling, tuple) and tiling and tiling[0] == "Tiling":
            tiling = Tiling(tiling[1], tiling[2])
        r = simulate(w, algo, pass_, tiling=tiling, sram_elems=sram, **opts)
    except ValueError as e:
        assert str(e)  # a message, naming the field
        event("ValueError: " + str(e).split("=")[0][:30])
        return
    event(f"result: {algo} {pass_}")
    _check_result(r)
    assert isinstance(r.io.bytes, int) and isinstance(r.io.sectors, int)


@FUZZ
@given(block_masks_args=st.tuples(size(1, 16), size(1, 16)), data=st.data())
def test_block_mask_and_tiling_fuzz(block_masks_args, data):
    try:
        bm = data.draw(block_masks())
    except ValueError:
        bm = None
    if bm is not None:
        assert bm.array.dtype == bool and bm.array.ndim == 2 and bm.array.size > 0
        assert 0.0 <= bm.density <= 1.0
    try:
        t = Tiling(*block_masks_args)
    except ValueError:
        return
    assert type(t.block_m) is int and type(t.block_n) is int and t.block_m > 0 and t.block_n > 0


@settings(max_examples=100, deadline=None)
@given(name=st.one_of(st.sampled_from(["a100", "H100", "h200-sxm", "a100-80gb", "b200", ""]), JUNK))
def test_get_gpu_fuzz(name):
    try:
        g = get_gpu(name)
    except ValueError:
        return
    assert g.max_shared_bytes_per_block > 0
