"""The sectors the SMs receive from the TMA unit's tensor copies, a box row at a time: what Nsight
Compute counts as ``l1tex__m_xbar2l1tex_read_sectors_mem_global_op_tma_ld``.

A TMA copy moves a box (``width`` bytes of a row, for each of its rows) of a tensor in global
memory into shared memory; where the box runs past the tensor's edge (columns past the row's
length, or rows past the last) the unit fills in zeros.  Measured on an H200
(``scripts/device/tma_box_sweep.sh``, record ``analysis/data/h200/tma_box_sweep/``):

* **a copy to one CTA** (no multicast): each box row brings the 32-byte sectors its in-bounds
  bytes span, where they lie, plus one sector for each 32 bytes (rounded up) of it that lie past
  the edge: the zeros count as sectors received.  :func:`box_row_sectors`.  This held to the
  sector on every non-multicast operand of the record: ``fwd_fp16_v7``'s K and V at 13 head dims
  from 64 to 256 (boxes of 32 or 64 columns, rows of 128 to 512 bytes, 16 bytes into a sector on
  every other row at d = 72, 88, 104, 120, 136 and 200) and the operand copied to one CTA in 81 of
  120 cuBLAS GEMMs (d = 8 to 256, N = 1,000 to 2,000; the other 39 multicast both operands);
* **a copy multicast to a cluster's CTAs**: each receiving CTA gets the whole box.  Where the box's
  rows are whole sectors inside the tensor, that is :func:`box_row_sectors` again (24 of the 120
  GEMMs' multicast operands, and the torch_tma probe's 1 x 4 clusters, to the sector).  Where
  they are not, the SMs receive more: 0-150% more than the box rows' bytes where they would lie
  if the tensor went on (:func:`whole_row_sectors`, which stands for them here), +17% at the
  median; no rule of the box's width, split or alignment that was tried fits them, so their error
  is stated where they are compared (``python -m analysis.tma_boxes``).
"""
from __future__ import annotations

import numpy as np

SECTOR = 32


def _span(start: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """32-byte sectors that ``nbytes`` bytes from byte address ``start`` touch (0 for none)."""
    return np.where(nbytes > 0, (start + np.maximum(nbytes, 1) - 1) // SECTOR - start // SECTOR + 1, 0)


def box_row_sectors(start, inbounds, width: int) -> np.ndarray:
    """Sectors a CTA receives for box rows of ``width`` bytes whose in-bounds part is
    ``inbounds`` bytes (0 to width) from byte address ``start``: the sectors those bytes span,
    plus ⌈(width - inbounds) / 32⌉ for the zeros past the edge."""
    start = np.asarray(start, dtype=np.int64)
    inb = np.asarray(inbounds, dtype=np.int64)
    if width < 1 or np.any(inb < 0) or np.any(inb > width):
        raise ValueError(f"{width=}, inbounds in [{inb.min()}, {inb.max()}]: need 0 <= inbounds <= width, width >= 1")
    return _span(start, inb) + -(-(width - inb) // SECTOR)


def whole_row_sectors(start, width: int) -> np.ndarray:
    """Sectors of ``width`` bytes from ``start``, as if the tensor went on past its edge (the
    stand-in for multicast copies; equal to :func:`box_row_sectors` wherever the box row lies in
    the tensor)."""
    start = np.asarray(start, dtype=np.int64)
    return _span(start, np.full_like(start, width))


__all__ = ["SECTOR", "box_row_sectors", "whole_row_sectors"]
