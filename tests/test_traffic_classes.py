"""Traffic classes (load, store, reduction, bulk) and per-thread-rows accesses in the walker:
hand-derived counts, a brute force of the per-thread pattern, and the property that loads and
stores count exactly as before whatever other classes a schedule holds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.compare import predict_lsu
from flashsim.traffic import (
    TRAFFIC_CLASSES,
    Access,
    Launch,
    Schedule,
    TensorLayout,
    Traffic,
    bulk_read,
    bulk_write,
    read,
    reduction,
    walk,
    write,
)


def one_launch(tensors: dict, accesses: list, programs: int = 1, ordered: bool = False):
    slice_of = {n: np.arange(programs) % t.slices for n, t in tensors.items()}
    return walk(Schedule("t", tensors, [Launch("l", programs, slice_of, lambda: accesses)]), ordered=ordered)


# --------------------------------------------------------------------------------------------
# Per-thread rows: the one-thread-per-row kernel


@pytest.mark.parametrize(("eb", "coalesced_per_row", "ratio"), [(2, 4, 16), (4, 8, 8)])
def test_one_thread_per_row_d64(eb, coalesced_per_row, ratio):
    # 64 rows of d = 64 elements.  Coalesced, a row is 64·E bytes: fp16 128 B = 4 sectors, fp32
    # 256 B = 8 sectors.  One thread per row, one element per step: 64 steps, and in each step
    # every row's element lies in its own sector (rows are >= 32 bytes apart): 64 sectors per
    # row, whatever E.  So fp16 moves 64/4 = 16x the sectors its rows hold, fp32 64/8 = 8x (the
    # issue's "8x" is the fp32 case; in general 32/E when rows are whole sectors).
    t = {"X": TensorLayout("X", 64, 64, eb, 2)}
    coal = one_launch(t, [read("X", 0, 64)], programs=2)
    per = one_launch(t, [read("X", 0, 64, per_thread_rows=True)], programs=2)
    assert coal.sectors == 2 * 64 * coalesced_per_row
    assert per.sectors == 2 * 64 * 64
    assert per.sectors == ratio * coal.sectors
    # elements and bytes are the tile's, as for any access
    assert (per.elements, per.bytes) == (coal.elements, coal.bytes) == (2 * 64 * 64, 2 * 64 * 64 * eb)
    assert per.by_class()["load"] == Traffic(2 * 64 * 64, 2 * 64 * 64 * eb, 2 * 64 * 64)


def test_per_thread_rows_closer_than_a_sector():
    # fp16, d = 4: 8-byte rows.  Rows 2..35 (34 threads: a warp of rows 2..33, one of rows 34..35),
    # 4 column steps.  Step j, warp 1: elements at 16 + 8k + 2j (k < 32), bytes 16+2j .. 265+2j:
    # sectors 0..8 = 9.  Warp 2: 272 + 2j and 280 + 2j, both in sector 8: 1 (a second request,
    # so sector 8 counts again).  10 sectors a step, 40 in all; coalesced the 272 bytes from
    # byte 16 to 287 are 9 sectors.
    t = {"X": TensorLayout("X", 40, 4, 2, 1)}
    per = one_launch(t, [read("X", 2, 34, per_thread_rows=True)])
    assert (per.elements, per.bytes, per.sectors) == (136, 272, 40)
    assert one_launch(t, [read("X", 2, 34)]).sectors == 9


def brute_per_thread(layout, slice_id, row0, nrows, col0, ncols):
    total = 0
    for j in range(ncols):
        for w0 in range(row0, row0 + nrows, 32):
            seen = set()
            for r in range(w0, min(w0 + 32, row0 + nrows)):
                start = slice_id * layout.slice_bytes + (r * layout.cols + col0 + j) * layout.elem_bytes
                seen.update(b // 32 for b in range(start, start + layout.elem_bytes))
            total += len(seen)
    return total


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 70), cols=st.integers(1, 24), eb=st.sampled_from([1, 2, 4, 8]),
       slices=st.integers(1, 3), data=st.data())
def test_per_thread_rows_match_brute_force(rows, cols, eb, slices, data):
    t = TensorLayout("X", rows, cols, eb, slices)
    row0 = data.draw(st.integers(0, rows - 1))
    nrows = data.draw(st.integers(0, rows - row0))
    col0 = data.draw(st.integers(0, cols - 1))
    ncols = data.draw(st.integers(0, cols - col0))
    progs = data.draw(st.integers(1, slices))
    io = one_launch({"X": t}, [write("X", row0, nrows, col0, ncols, per_thread_rows=True)], programs=progs)
    want = sum(brute_per_thread(t, p % slices, row0, nrows, col0, ncols) for p in range(progs))
    print(rows, cols, eb, row0, nrows, col0, ncols, progs, io.write_sectors, want)
    assert (io.write_sectors or 0) == want
    assert (io.write_elements or 0) == nrows * ncols * progs


# --------------------------------------------------------------------------------------------
# Reductions and bulk copies


def test_reduction_counted_apart():
    # dQ: fp32, 8 rows x d = 8 (32-byte rows).  Two programs each load Q rows 0..3 (4 sectors),
    # store O rows 0..3, and reduce into dQ rows 2..7 (6 rows = 192 B = 6 sectors) twice.
    t = {n: TensorLayout(n, 8, 8, 4, 2) for n in ("Q", "O", "dQ")}
    acc = [read("Q", 0, 4), write("O", 0, 4), reduction("dQ", 2, 6, repeat=2)]
    io = one_launch(t, acc, programs=2)
    assert io.breakdown[("dQ", "reduction")] == Traffic(2 * 2 * 48, 2 * 2 * 192, 2 * 2 * 6)
    cls = io.by_class()
    assert cls["reduction"] == Traffic(192, 768, 24)
    assert cls["load"] == Traffic(64, 256, 8) and cls["store"] == Traffic(64, 256, 8)
    assert cls["bulk"] == Traffic(0, 0, 0)
    # the totals are loads and stores only
    assert (io.read_bytes, io.write_bytes, io.bytes, io.sectors) == (256, 256, 512, 16)
    assert (io.read_elements, io.write_elements, io.elements) == (64, 64, 128)
    d = io.to_dict()
    assert d["hbm_bytes"] == 512 and d["hbm_sectors"] == 16
    assert d["breakdown"]["dQ"] == {"reduction": {"elements": 192, "bytes": 768, "sectors": 24}}
    assert d["classes"]["reduction"] == {"elements": 192, "bytes": 768, "sectors": 24}
    assert list(d["classes"]) == list(TRAFFIC_CLASSES)


def test_bulk_not_in_lsu_totals():
    # K: fp16, 16 rows x d = 64 (128-byte rows).  One program: a TMA load of rows 0..15
    # (2048 B = 64 sectors), an LSU load of rows 0..1 (8 sectors), a TMA store of O rows 0..7
    # (32 sectors) and a reduction of fp32 rows 0..3 of dQ (4 x 64 x 4 = 1024 B = 32 sectors).
    t = {"K": TensorLayout("K", 16, 64, 2, 1), "O": TensorLayout("O", 16, 64, 2, 1),
         "dQ": TensorLayout("dQ", 16, 64, 4, 1)}
    acc = [bulk_read("K", 0, 16), read("K", 0, 2), bulk_write("O", 0, 8), reduction("dQ", 0, 4)]
    io = one_launch(t, acc)
    assert io.breakdown[("K", "bulk_read")] == Traffic(1024, 2048, 64)
    assert io.breakdown[("O", "bulk_write")] == Traffic(512, 1024, 32)
    assert io.by_class()["bulk"] == Traffic(1536, 3072, 96)
    assert io.by_class()["reduction"] == Traffic(256, 1024, 32)
    assert (io.read_sectors, io.write_sectors, io.sectors, io.bytes) == (8, 0, 8, 256)
    # compare's LSU level: loads and stores only (no bulk, no reductions)
    (p,) = predict_lsu({}, Schedule("t", t, [Launch("l", 1, {n: np.zeros(1, int) for n in t}, lambda: acc)]))
    assert (p["sim_lsu_ld_bytes"], p["sim_lsu_st_bytes"]) == (8 * 32, 0)
    assert (p["sim_read_bytes_exact"], p["sim_write_bytes_exact"]) == (256, 0)


def test_class_validation():
    assert read("X", 0, 1).traffic_class == "load" and write("X", 0, 1).traffic_class == "store"
    assert Access("X", False, 0, 1, traffic="load").key == "read"
    assert reduction("X", 0, 1).key == "reduction" and bulk_read("X", 0, 1).key == "bulk_read"
    assert bulk_write("X", 0, 1).key == "bulk_write"
    with pytest.raises(ValueError, match="traffic"):
        Access("X", False, 0, 1, traffic="atomic")
    with pytest.raises(ValueError, match="traffic"):
        Access("X", True, 0, 1, traffic="load")
    with pytest.raises(ValueError, match="traffic"):
        Access("X", False, 0, 1, traffic="reduction")
    with pytest.raises(ValueError, match="per_thread_rows"):
        Access("X", False, 0, 1, traffic="bulk", per_thread_rows=True)
    with pytest.raises(ValueError, match="per_thread_rows"):
        Access("X", False, 0, 1, per_thread_rows=1)


# --------------------------------------------------------------------------------------------
# Loads and stores count as before


tiles = st.tuples(st.integers(0, 9), st.integers(0, 10), st.integers(0, 7), st.integers(0, 8), st.booleans(),
                  st.booleans())


def make(t, tile, cls):
    row0, nrows, col0, ncols, whole, wr = tile
    col0 = min(col0, t.cols - 1)
    nrows, ncols = min(nrows, t.rows - row0), min(ncols, t.cols - col0)
    if whole:
        col0, ncols = 0, None
    if cls is None:
        return (write if wr else read)(t.name, row0, nrows, col0, ncols)
    if cls == "explicit":
        return Access(t.name, wr, row0, nrows, col0, ncols, traffic="store" if wr else "load")
    if cls == "reduction":
        return reduction(t.name, row0, nrows, col0, ncols)
    return (bulk_write if wr else bulk_read)(t.name, row0, nrows, col0, ncols)


@settings(max_examples=80, deadline=None)
@given(eb=st.sampled_from([2, 4]), cols=st.integers(1, 8), progs=st.integers(1, 3),
       plain=st.lists(tiles, max_size=5), extra=st.lists(st.tuples(tiles, st.sampled_from(["reduction", "bulk"])),
                                                         max_size=4), ordered=st.booleans())
def test_load_store_unchanged(eb, cols, progs, plain, extra, ordered):
    t = {"A": TensorLayout("A", 10, cols, eb, 3)}
    base = [make(t["A"], x, None) for x in plain]
    old = one_launch(t, base, progs, ordered)
    # the same transfers with their classes named: the same result
    named = one_launch(t, [make(t["A"], x, "explicit") for x in plain], progs, ordered)
    assert named.breakdown == old.breakdown and named.to_dict() == old.to_dict()
    # load + store classes are the old read and write totals
    cls = old.by_class()
    assert cls["load"] == Traffic(old.read_elements, old.read_bytes, old.read_sectors)
    assert cls["store"] == Traffic(old.write_elements, old.write_bytes, old.write_sectors)
    assert cls["reduction"] == cls["bulk"] == Traffic(0, 0, 0)
    # adding reductions and bulk copies leaves loads and stores, and every total, as they were
    ext = [make(t["A"], x, c) for x, c in extra]
    mixed = one_launch(t, base + ext, progs, ordered)
    assert {k: v for k, v in mixed.breakdown.items() if k[1] in ("read", "write")} == old.breakdown
    for f in ("read_bytes", "write_bytes", "bytes", "elements", "sectors", "read_sectors", "write_sectors"):
        assert getattr(mixed, f) == getattr(old, f)
    # and the new classes count exactly what the same tiles count as plain loads and stores;
    # a bulk copy its rows apart (the TMA unit asks for a box row at a time): as plain loads
    # and stores of one row each
    alone = one_launch(t, [make(t["A"], x, None) for x, c_ in extra if c_ == "reduction"], progs, ordered)
    assert mixed.by_class()["reduction"] == Traffic(alone.elements, alone.bytes, alone.sectors)
    rows = [(r, 1, x[2], x[3], x[4], x[5]) for x, c_ in extra if c_ == "bulk"
            for r in range(x[0], x[0] + min(x[1], t["A"].rows - x[0]))]
    alone = one_launch(t, [make(t["A"], x, None) for x in rows], progs, ordered)
    assert mixed.by_class()["bulk"] == Traffic(alone.elements, alone.bytes, alone.sectors)
