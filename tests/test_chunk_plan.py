"""``kernels.perf._tiles.chunk_plan``: the order in which fwd_fp16_v5's copy slots take a swizzled
tile's 16-byte chunks where d % 16 = 8 (pure host code: no GPU, no simulator)."""

import pytest

from kernels.perf._tiles import _swizzled, chunk_plan
from kernels.perf.fwd_fp16 import swizzle_bytes


def _plan(rows, d, nt):
    soff = _swizzled(rows, d, swizzle_bytes(d))[1]
    bg = lambda r, c: soff(r, c) // 8 % 8  # noqa: E731
    return chunk_plan(rows, d, nt, bg), bg


@pytest.mark.parametrize("d", range(24, 257, 16))
@pytest.mark.parametrize("rows,nt", [(16, 128), (48, 128), (64, 256)])
def test_every_chunk_once_and_quarters_conflict_free(d, rows, nt):
    plan, bg = _plan(rows, d, nt)
    ch = d // 8
    taken = sorted(int(e) for e in plan if e >= 0)
    assert taken == list(range(rows * ch)), f"{d=} {rows=}: a chunk missing or twice"
    assert len(plan) % nt == 0
    split = 0
    for q in range(0, len(plan), 8):  # each quarter-warp: distinct bank groups, whole sectors
        quarter = [int(e) for e in plan[q:q + 8] if e >= 0]
        groups = [bg(e // ch, e % ch) for e in quarter]
        assert len(set(groups)) == len(groups), f"{d=} {rows=}: quarter {q // 8} {quarter} banks {groups}"
        split += sum(1 for e in quarter if e ^ 1 not in quarter and e ^ 1 < rows * ch)
    # a sector's two chunks share a quarter unless both take one bank group (then they cannot)
    same = sum(1 for s in range(0, rows * ch, 2) if bg(s // ch, s % ch) == bg((s + 1) // ch, (s + 1) % ch))
    print(f"d={d} rows={rows}: {len(plan) // nt} passes, {split} chunks apart from their sector's other half "
          f"({2 * same} must be)")
    assert split == 2 * same


def test_even_chunk_counts_keep_the_plain_order():
    assert _plan(48, 128, 128)[0] is None
    assert _plan(64, 96, 128)[0] is None


def test_d120_48_rows_exact():
    """d = 120, Bc = 48 (v5's default at 96 < d <= 128), 128 threads: 720 chunks in 90 full quarters,
    6 passes as in the plain order; the first quarter is row 0's first 128 bytes."""
    plan, _ = _plan(48, 120, 128)
    assert len(plan) == 6 * 128 and int((plan >= 0).sum()) == 720
    assert [int(e) for e in plan[:8]] == list(range(8))
