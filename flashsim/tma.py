"""The sectors the SMs receive from the TMA unit's tensor copies, a box row at a time: what Nsight
Compute counts as ``l1tex__m_xbar2l1tex_read_sectors_mem_global_op_tma_ld`` (and, for the unit's
stores, how the L2 write sectors count; last bullet below).

A TMA copy moves a box (``width`` bytes of a row, for each of its rows) of a tensor in global
memory into shared memory; where the box runs past the tensor's edge (columns past the row's
length, or rows past the last) the unit fills in zeros.  Measured on an H200 by two probes
(``scripts/device/tma_box_sweep.sh``, record ``analysis/data/h200/tma_box_sweep/``; and
``scripts/device/tma_mc_probe.sh``, record ``analysis/data/h200/tma_mc_probe/``), both read by
``python -m analysis.tma_boxes``:

* **a copy to one CTA** (no multicast): each box row brings the 32-byte sectors its in-bounds
  bytes span, where they lie, plus one sector for each 32 bytes (rounded up) of it that lie past
  the edge: the zeros count as sectors received.  :func:`box_row_sectors`.  This held to the
  sector on every non-multicast operand of the record: ``fwd_fp16_v7``'s K and V at 13 head dims
  from 64 to 256 (boxes of 32 or 64 columns, rows of 128 to 512 bytes, 16 bytes into a sector on
  every other row at d = 72, 88, 104, 120, 136 and 200) and the operand copied to one CTA in 81 of
  120 cuBLAS GEMMs (d = 8 to 256, N = 1,000 to 2,000; the other 39 multicast both operands);
* **a copy multicast to a cluster's CTAs** (each CTA copies a piece of the box, a slice of its rows
  or of its columns, and every CTA of the cluster receives every piece): each piece's row brings
  the sectors from its first byte rounded down to 64 bytes to its last in-bounds byte, at least
  two, and, where it runs past the edge, max(3, ⌈zero bytes / 32⌉) sectors for the zeros.
  :func:`multicast_row_sectors`.  Read off ``scripts/device/tma_mc_probe.cu`` (record
  ``analysis/data/h200/tma_mc_probe/``: 265 launches, d = 16 to 160, boxes of 32 and 64
  columns, pieces of 8 to 64 columns, clusters of 2 and 4, slices by rows and by columns: 212
  multicast launches, and 53 plain copies that :func:`box_row_sectors` counts; every one to
  the sector) and then held, to the sector, on the multicast operands of all 120 GEMMs
  of the box sweep, each box row taken whole (as a slice of the box's rows is: cuBLAS's slices
  are of rows, or count as such).  Where the box rows are whole 64-byte granules inside the
  tensor this equals :func:`box_row_sectors`.
* **a store** (``cp.async.bulk.tensor`` from shared memory): each box row in pieces of 128 bytes
  (one swizzle row), each piece writing the L2 sectors its bytes span, rows apart: the L2 write
  sectors of all 120 GEMMs of the box sweep, to the sector.  The walker counts every bulk copy's
  rows apart (:mod:`flashsim.traffic`); torch_naive cuts its GEMMs' band rows and C's tile rows
  into those pieces, and fwd_fp16_v7's schedule its K and V rows into swizzle atoms.
"""
from __future__ import annotations

import operator

import numpy as np

SECTOR = 32
#: Bytes of a TMA box row at most (one 128-byte swizzle row); wider rows come as pieces of it
BOX_ROW_BYTES = 128
#: Multicast pieces start on this many bytes (their first byte rounded down to it)
GRANULE = 64


def _span(start: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """32-byte sectors that ``nbytes`` bytes from byte address ``start`` touch (0 for none)."""
    return np.where(nbytes > 0, (start + np.maximum(nbytes, 1) - 1) // SECTOR - start // SECTOR + 1, 0)


def _ints(name: str, x) -> np.ndarray:
    """``x`` as an int64 array of non-negative integers (ValueError naming ``name`` otherwise)."""
    a = np.asarray(x)
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}: integers (byte counts or addresses), not {a.dtype}")
    if (a.min() < 0 or (a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max)):
        raise ValueError(f"{name}: must be non-negative int64 values")
    return a.astype(np.int64)


def _checked(start, inbounds, width) -> tuple[np.ndarray, np.ndarray, int]:
    """The rules' inputs checked and broadcast together (ValueError naming the field)."""
    try:
        w = operator.index(width)
    except TypeError:
        w = None
    if w is None or isinstance(width, bool):
        raise ValueError(f"width={width!r}: an integer number of bytes")
    if w < 1:
        raise ValueError(f"width={width!r}: at least 1 byte")
    st, inb = _ints("start", start), _ints("inbounds", inbounds)
    try:
        st, inb = np.broadcast_arrays(st, inb)
    except ValueError:
        raise ValueError(f"start {st.shape} and inbounds {inb.shape}: shapes that do not broadcast together") from None
    if inb.size and inb.max() > w:
        raise ValueError(f"inbounds up to {inb.max()}: at most width={w}")
    return st, inb, w


def box_row_sectors(start, inbounds, width: int) -> np.ndarray:
    """Sectors a CTA receives for box rows of ``width`` bytes whose in-bounds part is
    ``inbounds`` bytes (0 to width) from byte address ``start``: the sectors those bytes span,
    plus ⌈(width - inbounds) / 32⌉ for the zeros past the edge."""
    start, inb, width = _checked(start, inbounds, width)
    return _span(start, inb) + -(-(width - inb) // SECTOR)


def multicast_row_sectors(start, inbounds, width: int) -> np.ndarray:
    """Sectors each receiving CTA gets for pieces of box rows multicast to a cluster: ``width``
    bytes a piece, ``inbounds`` (0 to width) of them in the tensor from byte address ``start``:
    the sectors from ``start`` rounded down to 64 bytes to the last in-bounds byte, at least 2
    (none without in-bounds bytes), plus max(3, ⌈(width - inbounds) / 32⌉) where the piece runs
    past the edge."""
    start, inb, width = _checked(start, inbounds, width)
    first = start // GRANULE * GRANULE
    data = np.where(inb > 0, np.maximum(2, (start + np.maximum(inb, 1) - 1) // SECTOR - first // SECTOR + 1), 0)
    return data + np.where(inb < width, np.maximum(3, -(-(width - inb) // SECTOR)), 0)


__all__ = ["SECTOR", "GRANULE", "BOX_ROW_BYTES", "box_row_sectors", "multicast_row_sectors"]
