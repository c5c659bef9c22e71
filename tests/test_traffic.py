"""The walker's sector counting against a byte-by-byte brute force, and its basic bookkeeping."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim.traffic import Launch, Schedule, TensorLayout, read, walk, write


def brute_sectors(layout, base, slice_id, row0, nrows, col0, ncols):
    seen = set()
    for r in range(row0, row0 + nrows):
        for c in range(col0, col0 + ncols):
            start = base + slice_id * layout.slice_bytes + (r * layout.cols + c) * layout.elem_bytes
            for b in range(start, start + layout.elem_bytes):
                seen.add(b // 32)
    return len(seen)


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 12), cols=st.integers(1, 40), eb=st.sampled_from([2, 4]), slices=st.integers(1, 4),
       data=st.data())
def test_sectors_match_brute_force(rows, cols, eb, slices, data):
    t = TensorLayout("X", rows, cols, eb, slices)
    row0 = data.draw(st.integers(0, rows - 1))
    nrows = data.draw(st.integers(0, rows - row0))
    col0 = data.draw(st.integers(0, cols - 1))
    ncols = data.draw(st.integers(0, cols - col0))
    whole = data.draw(st.booleans())
    if whole:
        col0, ncols = 0, cols
    progs = data.draw(st.integers(1, slices))
    slice_of = np.array(data.draw(st.lists(st.integers(0, slices - 1), min_size=progs, max_size=progs)))
    acc = read("X", row0, nrows, col0, None if whole else ncols)
    sched = Schedule("t", {"X": t}, [Launch("l", progs, {"X": slice_of}, lambda: [acc])])
    io = walk(sched)
    want = sum(brute_sectors(t, 0, int(s), row0, nrows, col0, ncols) for s in slice_of)
    got = io.breakdown.get(("X", "read"))
    assert (got.sectors if got else 0) == want
    assert (got.elements if got else 0) == nrows * ncols * progs


def test_arrays_broadcast_and_breakdown():
    t = TensorLayout("A", 10, 8, 2, 1)
    acc = [read("A", np.array([0, 4, 8]), np.array([4, 4, 2])), write("A", 0, 10)]
    io = walk(Schedule("t", {"A": t}, [Launch("l", 3, {"A": np.zeros(3, int)}, lambda: acc)]))
    assert io.breakdown[("A", "read")].elements == 3 * 80
    assert io.breakdown[("A", "write")].bytes == 3 * 160
    assert io.read_bytes == 480 and io.write_bytes == 480 and io.bytes == 960
    # 8 fp16 = 16 bytes per row: 4 rows = 64 bytes = 2 sectors, 2 rows = 1 sector
    assert io.breakdown[("A", "read")].sectors == 3 * (2 + 2 + 1)
