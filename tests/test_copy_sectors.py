"""``analysis.copy_sectors``: the sectors L2 sends for the fast kernels' cp.async copies, held to
the sector against Nsight Compute on the H100 (committed record) and to hand counts."""

import csv
import io
from pathlib import Path

import numpy as np
import pytest

from analysis.copy_sectors import padded_offset, tile_sectors, v5_forward_sectors
from kernels.perf._tiles import swizzled_offset

REC = Path(__file__).resolve().parents[1] / "kernels/data/fwd_fp16_v5_sector_h100_17772c5/ncu_ecad5ed"


def _ncu(path: Path, metric: str) -> int:
    text = path.read_text()
    rows = csv.DictReader(io.StringIO(text[text.index('"ID"'):]))
    return int(next(r for r in rows if r["Metric Name"] == metric)["Metric Value"].replace(",", ""))


@pytest.mark.parametrize("d", [88, 96, 120, 128])
def test_v5_forward_sectors_equal_nsight_compute(d):
    """fwd_fp16_v5, N = 4,096, B·H = 64, its default block: l1tex__m_xbar2l1tex_read_sectors.sum."""
    want = _ncu(REC / f"v5_d{d}.csv", "l1tex__m_xbar2l1tex_read_sectors.sum")
    got = v5_forward_sectors(d, 4096, 64)
    print(d, got, want)
    assert got["sent"] == want
    assert got["ratio"] == {88: 17 / 11, 96: 1, 120: 23 / 15, 128: 1}[d]


def test_two_rows_by_hand():
    """d = 120, 128-byte swizzle: two rows are 30 chunks, 15 sectors.  Row 0 (aligned): its seven
    in-row sectors land as chunk pairs (2m, 2m + 1) of an atom row, one unit each; the sector of
    row 0's last chunk and row 1's first lands in two rows: 2; row 1's seven sectors (chunks 2m + 1,
    2m + 2) each in two units: 14.  23 in all."""
    assert tile_sectors(2, 120, swizzled_offset(48, 128)) == (23, 15)
    assert tile_sectors(2, 128, swizzled_offset(48, 128)) == (16, 16)
    # the padded layout (row stride d + 8 rounded to 16, + 8): only the row-crossing sector twice
    assert tile_sectors(2, 40, padded_offset(56)) == (6, 5)
    # a tile 16 bytes into a sector (odd N: every other head's tiles) splits every sector
    assert tile_sectors(2, 40, padded_offset(56), base=16) == (10, 6)


def test_bad_input():
    with pytest.raises(ValueError, match="d="):
        tile_sectors(4, 12, padded_offset(24))
    with pytest.raises(ValueError, match="n="):
        v5_forward_sectors(120, 4095, 1)
    for bad in (dict(n=0), dict(bh=None), dict(d=12), dict(d=264), dict(n=True)):
        args = dict(dict(d=120, n=4096, bh=1), **bad)
        with pytest.raises(ValueError, match=f"{next(iter(bad))}="):
            v5_forward_sectors(**args)
    assert v5_forward_sectors(np.int64(128), np.int32(4096), np.int16(64))["sent"] == 270532608
