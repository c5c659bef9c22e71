"""The decode schedule (flashsim/algorithms/decode.py): walker == closed form == a literal
program-by-program count from the schedule's description, over hypothesis-drawn workloads;
hand-derived counts for small cases; bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim import Tiling, Workload, simulate
from flashsim.algorithms.decode import decode_plan, floor_sum
from flashsim.api import build_schedule
from flashsim.traffic import walk

EB = {"fp32": 4, "fp16": 2, "bf16": 2}


def literal(w: Workload, bc: int, **opts):
    """Every program of both launches, every transfer one contiguous byte range, counted as the
    decode module's docstring describes (elements per (tensor, direction); sectors: each
    transfer's 32-byte sectors).  Independent of the walker's grouped representation."""
    p = decode_plan(w, Tiling(1, bc), **opts)
    splits, page, window = p.splits, p.page, p.window
    B, hq, hkv, g, nq, d, nk, eb = w.batch, w.heads, w.hkv, w.group, w.nq, w.d, w.nk, w.elem_bytes
    L = p.lengths
    sizes = {"Q": B * hq * nq * d * eb}
    kv = B * hkv * nk * d * eb
    sizes["K"] = sizes["V"] = kv
    if page is not None:
        sizes["BT"] = B * (nk // page) * 4
    sizes["Lens"] = B * 4
    sizes["O"], sizes["L"] = B * hq * nq * d * eb, B * hq * nq * 4
    if splits > 1:
        sizes["Op"], sizes["Lp"] = splits * B * hq * nq * d * 4, splits * B * hq * nq * 4
    base, a = {}, 0
    for n, s in sizes.items():
        base[n] = a
        a += -(-s // 256) * 256
    el: dict = {}
    sec: dict = {}

    def xfer(t, dr, off, nbytes, esize):
        addr = base[t] + off
        key = (t, dr)
        el[key] = el.get(key, 0) + nbytes // esize
        sec[key] = sec.get(key, 0) + ((addr + nbytes - 1) // 32 - addr // 32 + 1)

    gq = g * nq
    for b in range(B):
        lo = 0 if window is None else max(0, int(L[b]) - nq - window[0])
        js = list(range(lo // bc, (int(L[b]) - 1) // bc + 1))
        bps = -(-len(js) // splits)
        for h in range(hkv):
            for s in range(splits):
                mine = js[s * bps:(s + 1) * bps]
                xfer("Lens", "read", b * 4, 4, 4)  # every program, an empty split's too
                if mine:
                    xfer("Q", "read", ((b * hq + h * g) * nq) * d * eb, gq * d * eb, eb)
                for j in mine:
                    r0, r1 = j * bc, min((j + 1) * bc, int(L[b]))
                    if page is None:
                        for t in ("K", "V"):
                            xfer(t, "read", ((b * hkv + h) * nk + r0) * d * eb, (r1 - r0) * d * eb, eb)
                        continue
                    pg0, pg1 = r0 // page, (r1 - 1) // page
                    xfer("BT", "read", (b * (nk // page) + pg0) * 4, (pg1 - pg0 + 1) * 4, 4)
                    for t in ("K", "V"):
                        if hkv == 1:
                            for pg in range(pg0, pg1 + 1):
                                s0, s1 = max(r0, pg * page), min(r1, (pg + 1) * page)
                                phys = int(p.block_table[b, pg])
                                xfer(t, "read", (phys * page + s0 - pg * page) * d * eb, (s1 - s0) * d * eb, eb)
                        else:
                            for r in range(r0, r1):
                                phys = int(p.block_table[b, r // page])
                                xfer(t, "read", ((phys * page + r % page) * hkv + h) * d * eb, d * eb, eb)
                row = (b * hq + h * g) * nq
                if splits == 1:
                    xfer("O", "write", row * d * eb, gq * d * eb, eb)
                    xfer("L", "write", row * 4, gq * 4, 4)
                else:
                    xfer("Op", "write", ((s * B * hq * nq) + row) * d * 4, gq * d * 4, 4)
                    xfer("Lp", "write", ((s * B * hq * nq) + row) * 4, gq * 4, 4)
    if splits > 1:
        for r in range(B * hq * nq):  # (b, query head, query row)
            for s in range(splits):
                xfer("Lp", "read", (s * B * hq * nq + r) * 4, 4, 4)
            for s in range(splits):
                xfer("Op", "read", (s * B * hq * nq + r) * d * 4, d * 4, 4)
            xfer("O", "write", r * d * eb, d * eb, eb)
            xfer("L", "write", r * 4, 4, 4)
    return el, sec


def check(w, bc, **opts):
    res = simulate(w, "decode", "fwd", tiling=Tiling(1, bc), **opts)
    el, sec = literal(w, bc, **opts)
    got = res.io.elements_by_key()
    walked_sec = {k: t.sectors for k, t in res.io.breakdown.items() if t.elements}
    ordered = walk(build_schedule(w, "decode", "fwd", tiling=Tiling(1, bc), **opts), ordered=True)
    if got != el or walked_sec != sec or not res.agrees:
        print("walker", got, walked_sec)
        print("closed", res.closed_form.elements_by_key())
        print("literal", el, sec)
    assert res.agrees
    assert got == el
    assert walked_sec == sec
    assert ordered.elements_by_key() == got and ordered.sectors == res.io.sectors
    return res


@st.composite
def decode_cases(draw):
    hkv, g = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batch, nq, d = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 9))
    dtype = draw(st.sampled_from(["fp16", "fp32", "bf16"]))
    bc = draw(st.integers(1, 8))
    page = draw(st.one_of(st.none(), st.integers(1, 8)))
    nk = draw(st.integers(max(nq, 1), 24))
    if page is not None:
        nk = -(-nk // page) * page
    w = Workload(batch=batch, heads=hkv * g, kv_heads=hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d, dtype=dtype)
    lengths = draw(st.one_of(st.none(), st.lists(st.integers(nq, nk), min_size=batch, max_size=batch)))
    window = draw(st.one_of(st.none(), st.tuples(st.integers(0, 12), st.integers(0, 3))))
    table = None
    if page is not None and draw(st.booleans()):
        npages = batch * (nk // page)
        table = np.array(draw(st.lists(st.integers(0, npages - 1), min_size=npages, max_size=npages)),
                         dtype=draw(st.sampled_from([np.int32, np.int64]))).reshape(batch, nk // page)
    p = decode_plan(w, Tiling(1, bc), page_size=page, window=window, lengths=lengths, block_table=table)
    splits = draw(st.integers(1, int(p.nblk.max())))
    return w, bc, dict(num_splits=splits, page_size=page, window=window, lengths=lengths, block_table=table)


@settings(max_examples=300, deadline=None)
@given(decode_cases())
def test_walker_closed_form_literal(case):
    w, bc, opts = case
    res = simulate(w, "decode", "fwd", tiling=Tiling(1, bc), **opts)
    el, sec = literal(w, bc, **opts)
    walked_sec = {k: t.sectors for k, t in res.io.breakdown.items() if t.elements}
    if res.io.elements_by_key() != el or walked_sec != sec or not res.agrees:
        print(w, bc, opts)
        print("walker", res.io.elements_by_key(), walked_sec)
        print("closed", res.closed_form.elements_by_key())
        print("literal", el, sec)
    assert res.agrees
    assert res.io.elements_by_key() == el
    assert walked_sec == sec


@settings(max_examples=60, deadline=None)
@given(decode_cases())
def test_ordered_stream_equals_grouped(case):
    w, bc, opts = case
    sched = build_schedule(w, "decode", "fwd", tiling=Tiling(1, bc), **opts)
    a, b = walk(sched), walk(sched, ordered=True)
    assert a.elements_by_key() == b.elements_by_key()
    assert {k: t.sectors for k, t in a.breakdown.items()} == {k: t.sectors for k, t in b.breakdown.items()}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 50), st.integers(0, 60), st.integers(0, 60))
def test_floor_sum(n, m, a, b):
    assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


# ---------------------------------------------------------------------------------------------
# Hand-derived counts


def w_(**kw):
    base = dict(batch=1, heads=4, kv_heads=2, seq_len_q=1, seq_len_k=10, head_dim=8, dtype="fp16")
    return Workload(**{**base, **kw})


def test_hand_single_split():
    # B = 1, Hq = 4, Hkv = 2 (g = 2), Nq = 1, d = 8, L = 10, Bc = 4: key blocks rows 0-3, 4-7, 8-9.
    r = check(w_(), 4)
    assert r.io.elements_by_key() == {
        ("Lens", "read"): 1 * 2 * 1,       # B·Hkv·S: each program reads its sequence's length
        ("Q", "read"): 4 * 1 * 8 * 1,      # Hq·Nq·d · (one nonempty split)
        ("K", "read"): 2 * 8 * 10,         # Hkv·d·(L - jf·Bc) = 2·8·10
        ("V", "read"): 2 * 8 * 10,
        ("O", "write"): 1 * 4 * 1 * 8,     # B·Hq·Nq·d
        ("L", "write"): 1 * 4 * 1,
    }


def test_hand_two_splits():
    # nblk = 3, S = 2: bps = ⌈3/2⌉ = 2, splits hold blocks {0, 1} and {2}: both read Q.
    r = check(w_(), 4, num_splits=2)
    assert r.io.elements_by_key() == {
        ("Lens", "read"): 1 * 2 * 2,                           # B·Hkv·S
        ("Q", "read"): 4 * 8 * 2, ("K", "read"): 160, ("V", "read"): 160,
        ("Op", "write"): 2 * 4 * 8, ("Lp", "write"): 2 * 4,    # S·B·Hq·Nq·d, S·B·Hq·Nq
        ("Op", "read"): 2 * 4 * 8, ("Lp", "read"): 2 * 4,      # the combine reads them back
        ("O", "write"): 4 * 8, ("L", "write"): 4,
    }
    assert set(r.io.per_launch) == {"decode_split", "decode_combine"}


def test_hand_varlen_empty_split():
    # B = 2, lengths 10 and 3, S = 3: sequence 0 has 3 blocks (1 per split), sequence 1 one block
    # (splits 1 and 2 empty: no Q, K, V read, but the length read and Op and Lp written).
    r = check(w_(batch=2), 4, num_splits=3, lengths=[10, 3])
    e = r.io.elements_by_key()
    assert e[("Lens", "read")] == 2 * 2 * 3  # B·Hkv·S: all 12 programs, the 4 empty ones too
    assert e[("Q", "read")] == 4 * 8 * (3 + 1)
    assert e[("K", "read")] == 2 * 8 * (10 + 3)
    assert e[("Op", "write")] == 3 * 2 * 4 * 8 and e[("Lp", "write")] == 3 * 2 * 4
    assert e[("O", "write")] == 2 * 4 * 8 and e[("L", "write")] == 2 * 4
    # cu_seqlens [0, 10, 13] (or its text) is the same batch
    assert check(w_(batch=2), 4, num_splits=3, cu_seqlens=[0, 10, 13]).io.elements_by_key() == e
    r3 = simulate(w_(batch=2), "decode", "fwd", tiling=Tiling(1, 4), num_splits=3, cu_seqlens="0,10,13")
    assert r3.io.elements_by_key() == e


def test_hand_paged_block_table_reads():
    w = Workload(batch=1, heads=1, seq_len_q=1, seq_len_k=12, head_dim=4, dtype="fp16")
    # Bc = 4, P = 3: blocks [0,4) pages 0-1, [4,8) pages 1-2, [8,12) pages 2-3: 2 + 2 + 2 = 6 entries
    assert check(w, 4, page_size=3).io.elements_by_key()[("BT", "read")] == 6
    # P = 6: [0,4) page 0, [4,8) pages 0-1, [8,12) page 1: 1 + 2 + 1 = 4 (page 0 and 1 read twice)
    assert check(w, 4, page_size=6).io.elements_by_key()[("BT", "read")] == 4
    # with Hkv = 2 every kv head's program reads them: 2·6
    w2 = Workload(batch=1, heads=2, kv_heads=2, seq_len_q=1, seq_len_k=12, head_dim=4, dtype="fp16")
    assert check(w2, 4, page_size=3).io.elements_by_key()[("BT", "read")] == 12


def test_hand_window():
    # Nq = 2, L = 20, window left 5: rows at positions 18, 19 see keys >= 13, so lo = 13,
    # jf = 13 // 4 = 3, blocks 3 and 4 (rows 12..19: row 12 read and masked): 8 rows.
    w = w_(seq_len_q=2, seq_len_k=20)
    e = check(w, 4, window=(5, 2)).io.elements_by_key()
    assert e[("K", "read")] == 2 * 8 * 8
    assert e[("Q", "read")] == 4 * 2 * 8


def test_hand_sectors_contiguous():
    # Hq = Hkv = 1, d = 8 fp16 (16-byte rows), L = 10, Bc = 4.  Q (16 bytes) sits at 0, K at 256:
    # block rows 0-3 = bytes 0..63 (2 sectors), 4-7 = 64..127 (2), 8-9 = 128..159 (1): 5 sectors.
    w = Workload(batch=1, heads=1, seq_len_q=1, seq_len_k=10, head_dim=8, dtype="fp16")
    r = check(w, 4)
    assert r.io.breakdown[("K", "read")].sectors == 5
    # paged, Hkv = 1, P = 2 (32-byte pages, each one sector): 5 pages, each read once -> 5
    assert check(w, 4, page_size=2).io.breakdown[("K", "read")].sectors == 5


def test_hand_length_reads():
    # B = 2, Hkv = 2, S = 2 (L = 10, Bc = 4: 3 blocks, bps 2): 2·2·2 = 8 programs, each one load of
    # 4 bytes of Lens (8 bytes, one sector): 8 elements, 32 bytes, 8 sectors, as the kernel's
    # thread 0 of each block loads its length (one sector per block).
    r = check(w_(batch=2), 4, num_splits=2)
    t = r.io.breakdown[("Lens", "read")]
    assert (t.elements, t.bytes, t.sectors) == (8, 32, 8)


def test_paged_sectors_rows_not_contiguous():
    # Hkv = 2, d = 4 fp16: an 8-byte row per head, rows 16 bytes apart -> one sector per row per
    # head, where the contiguous layout packs four rows of a head in a sector.
    w = Workload(batch=1, heads=2, kv_heads=2, seq_len_q=1, seq_len_k=16, head_dim=4, dtype="fp16")
    contiguous = check(w, 16).io.breakdown[("K", "read")].sectors
    paged = check(w, 16, page_size=16).io.breakdown[("K", "read")].sectors
    assert contiguous == 2 * 16 * 8 // 32  # two heads of 16 rows of 8 bytes, 32-byte aligned
    assert paged == 2 * 16


# ---------------------------------------------------------------------------------------------
# Bad inputs


@pytest.mark.parametrize("opts, field", [
    (dict(num_splits=4), "num_splits"),                    # 3 key blocks
    (dict(page_size=3), "page_size"),                      # does not divide 10
    (dict(page_size=5, block_table=[[0, 2]]), "block_table"),      # page 2 of 0..1
    (dict(page_size=5, block_table=[[0]]), "block_table.shape"),
    (dict(page_size=5, block_table=[[0, -1]]), "block_table"),
    (dict(block_table=[[0, 1]]), "block_table"),           # without page_size
    (dict(lengths=[4, 5]), "lengths"),                     # batch 1
    (dict(lengths=[11]), "lengths"),                       # above Nk
    (dict(lengths=[0]), "lengths"),
    (dict(lengths="4,x"), "lengths"),
    (dict(cu_seqlens=[0]), "cu_seqlens"),
    (dict(cu_seqlens=[1, 4]), "cu_seqlens[0]"),
    (dict(cu_seqlens=[0, 11]), "cu_seqlens"),
    (dict(lengths=[4], cu_seqlens=[0, 4]), "lengths and cu_seqlens"),
    (dict(window=(-1, 0)), "window"),
    (dict(window="3"), "window"),
    (dict(num_splits=0), "num_splits"),
    (dict(num_splits=1.0), "num_splits"),
    (dict(splits=2), "options"),
])
def test_bad_inputs(opts, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        simulate(w_(), "decode", "fwd", tiling=Tiling(1, 4), **opts)


def test_bad_workload():
    with pytest.raises(ValueError, match="kv_heads"):
        Workload(batch=1, heads=4, kv_heads=3, seq_len_q=1, seq_len_k=10, head_dim=8)
    with pytest.raises(ValueError, match="lengths"):  # a sequence shorter than its Nq query rows
        simulate(w_(seq_len_q=4), "decode", "fwd", tiling=Tiling(1, 4), lengths=[3])
    with pytest.raises(ValueError, match="pass_"):
        simulate(w_(), "decode", "bwd", tiling=Tiling(1, 4))


def test_large_cache_is_fast():
    # Nk = 2^20 keys for 8 sequences, paged (P = 16), 8 kv heads, 16 splits: the grouped walker
    w = Workload(batch=8, heads=64, kv_heads=8, seq_len_q=1, seq_len_k=2**20, head_dim=128, dtype="bf16")
    r = simulate(w, "decode", "fwd", tiling=Tiling(1, 256), num_splits=16, page_size=16)
    assert r.agrees
    assert r.io.elements_by_key()[("K", "read")] == 8 * 128 * 8 * 2**20


# ---------------------------------------------------------------------------------------------
# The thread-block model (Launch.blocks) for the L2 model


@settings(max_examples=40, deadline=None)
@given(decode_cases())
def test_blocks_request_what_the_walker_counts(case):
    # Every launch's thread blocks, run through the L2 model, request exactly the walker's
    # sectors: the block model lists the same transfers, grid block by grid block.
    from flashsim.l2 import dram_traffic

    w, bc, opts = case
    sched = build_schedule(w, "decode", "fwd", tiling=Tiling(1, bc), **opts)
    io = walk(sched)
    d = dram_traffic(sched, "h100")
    for launch in d.launches:
        c = io.per_launch[launch.name]
        assert launch.requested_read_bytes == 32 * c.read_sectors
        assert launch.requested_write_bytes == 32 * c.write_sectors
    assert [x.grid[0] * x.grid[1] * x.grid[2] for x in d.launches] == list(sched.meta["grids"].values())


JUNK = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=6),
                 st.integers(-3, 40), st.lists(st.integers(-2, 40), max_size=4),
                 st.lists(st.lists(st.integers(-1, 9), max_size=3), max_size=3),
                 st.sampled_from([np.int64(2), np.float64(2.0), np.array([3, 4]), np.array([[0, 1]]), "3,2", "@",
                                  "1;2", (1, 2), (np.int32(1), 0)]))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["num_splits", "page_size", "window", "lengths", "cu_seqlens", "block_table"]), JUNK,
       st.sampled_from([None, 2, 5]))
def test_junk_options_give_value_errors(name, value, page):
    # any value of any option: a result that agrees with the walker, or a ValueError with a message
    opts = {name: value}
    if page is not None and name != "page_size":
        opts["page_size"] = page
    try:
        r = simulate(w_(), "decode", "fwd", tiling=Tiling(1, 4), **opts)
    except ValueError as e:
        assert str(e)
        return
    assert r.agrees
