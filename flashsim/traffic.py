"""HBM transfers: what a tile schedule moves, and the walker that adds it up.

An algorithm is described as a :class:`Schedule`: a list of kernel :class:`Launch`\\ es, each run by
``programs`` independent thread-block programs (typically one per (batch, head) or per
(batch, kv head)).  A launch's ``accesses()`` yields, in loop order, the tile transfers of *one*
program; every program of the launch makes the same transfers on its own slice of each tensor
(``slice_of[tensor][p]`` says which).  Each :class:`Access` may carry numpy arrays in its
row/column fields: then it stands for one transfer per array element, in array order, each
made ``repeat`` times.  A launch may also have ``counts()``: the same transfers grouped, each
distinct one (by size and start address mod 32) once with its multiplicity.  The walker uses
``counts()`` where it exists, which makes its cost O(Tr + Tc) rather than O(Tr·Tc): any
N <= 2^20 in well under a second, even with 1 x 1 blocks; ``walk(schedule, ordered=True)``
walks the loop-order ``accesses()`` instead, with the same result.

The walker (:func:`walk`) never uses a formula for a whole algorithm: it sums, transfer by
transfer, the elements, bytes and 32-byte sectors of each access.  The closed forms live beside
each schedule and are checked against the walker exactly.

Sector counting.  Global memory is served in 32-byte sectors.  A transfer of ``n`` bytes that
starts ``o`` bytes into a sector touches ``⌈(o + n)/32⌉`` sectors.  A tile of whole rows
(``ncols`` equal to the row length) is one contiguous byte range; a tile of partial rows (a
Br x Bc block of the N x N matrix S, say) is ``nrows`` separate ranges, one per row, and counts
the distinct sectors of their union (neighbouring rows may share one).  Start
offsets are computed from the tensor's real layout ((B, H, rows, cols) row-major, each tensor
starting at a 256-byte-aligned address, as cudaMalloc guarantees), so ragged sizes (d = 59 in
fp16: 118-byte rows) are counted exactly.  Sector counts are an upper bound on what a kernel
requests only if it reads each transfer with coalesced accesses; the analysis package models
kernels that do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from math import gcd

import numpy as np

SECTOR_BYTES = 32

Direction = str  # "read" or "write"


@dataclass(frozen=True)
class TensorLayout:
    """A tensor in HBM: ``slices`` row-major matrices of ``rows`` x ``cols`` elements, back to back."""

    name: str
    rows: int
    cols: int
    elem_bytes: int
    slices: int

    @property
    def slice_bytes(self) -> int:
        return self.rows * self.cols * self.elem_bytes

    @property
    def row_bytes(self) -> int:
        return self.cols * self.elem_bytes


IntLike = int | np.ndarray


@dataclass(frozen=True)
class Access:
    """A transfer of a tile ``[row0, row0+nrows) x [col0, col0+ncols)`` of one slice of a tensor.

    ``ncols=None`` means whole rows.  ``slice_offset`` is added to the program's own slice index
    (a program that loops over several heads, e.g. the query heads of one kv head in a
    grouped-query backward pass, uses it).  Any of ``row0``, ``nrows``, ``col0``, ``ncols``
    and ``slice_offset`` may be arrays; they broadcast together and the access then stands for
    one transfer per element.  Zero-sized transfers are allowed and count nothing.
    """

    tensor: str
    write: bool
    row0: IntLike
    nrows: IntLike
    col0: IntLike = 0
    ncols: IntLike | None = None
    slice_offset: IntLike = 0
    #: how many times the transfer is made (broadcasts with the other fields; 0 allowed): lets a
    #: launch's ``counts`` list a regular loop by distinct transfers with multiplicities.
    repeat: IntLike = 1

    @property
    def direction(self) -> Direction:
        return "write" if self.write else "read"


def read(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
         slice_offset: IntLike = 0, repeat: IntLike = 1) -> Access:
    return Access(tensor, False, row0, nrows, col0, ncols, slice_offset, repeat)


def write(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
          slice_offset: IntLike = 0, repeat: IntLike = 1) -> Access:
    return Access(tensor, True, row0, nrows, col0, ncols, slice_offset, repeat)


@dataclass
class Launch:
    """One kernel launch: ``programs`` programs, each making the transfers ``accesses()`` yields.

    ``counts``, when given, yields the same transfers as ``accesses()`` in any order and grouped:
    each distinct transfer once, with its multiplicity in ``Access.repeat`` (and transfers that
    differ only where no count can tell them apart, e.g. by a whole multiple of 32 bytes in
    their start address, merged).  :func:`walk` uses it; ``accesses()`` stays the loop-order
    stream for :func:`iter_transfers`.  It is what lets the walker count N = 2^20 with 1 x 1
    blocks (10^12 block pairs) in milliseconds; ``walk(schedule, ordered=True)`` walks
    ``accesses()`` instead, and the tests hold the two equal.
    """

    name: str
    programs: int
    slice_of: dict[str, np.ndarray]
    accesses: Callable[[], Iterable[Access]]
    counts: Callable[[], Iterable[Access]] | None = None
    #: Optional: the launch's thread blocks as the GPU runs them (a flashsim.blocks.BlockSpec:
    #: grid, threads, shared memory, each block's accesses in order), for the L2 model
    #: (flashsim.l2).  The walker does not use it.
    blocks: object | None = None


@dataclass
class Schedule:
    """An algorithm's HBM traffic: tensor layouts and the launches, in order."""

    algorithm: str
    tensors: dict[str, TensorLayout]
    launches: list[Launch]
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Traffic:
    """Elements, bytes and 32-byte sectors moved for one (tensor, direction)."""

    elements: int
    bytes: int
    sectors: int | None = None

    def __add__(self, other: Traffic) -> Traffic:
        sec = None if self.sectors is None or other.sectors is None else self.sectors + other.sectors
        return Traffic(self.elements + other.elements, self.bytes + other.bytes, sec)


ZERO = Traffic(0, 0, 0)


@dataclass(frozen=True)
class IOCount:
    """HBM traffic with its per-tensor, per-direction breakdown.

    ``breakdown[(tensor, "read" | "write")]`` holds a :class:`Traffic`; ``per_launch`` maps a
    launch name to its own IOCount (only filled by the walker).  Sector counts are ``None`` where
    they were not computed (closed forms count elements and bytes).
    """

    breakdown: dict[tuple[str, Direction], Traffic]
    per_launch: dict[str, IOCount] = field(default_factory=dict)

    def _sum(self, attr: str, direction: Direction | None) -> int | None:
        vals = [getattr(t, attr) for (_, dr), t in self.breakdown.items() if direction in (None, dr)]
        if any(v is None for v in vals):
            return None
        return int(sum(vals))

    @property
    def read_bytes(self) -> int:
        return self._sum("bytes", "read")  # type: ignore[return-value]

    @property
    def write_bytes(self) -> int:
        return self._sum("bytes", "write")  # type: ignore[return-value]

    @property
    def bytes(self) -> int:
        return self._sum("bytes", None)  # type: ignore[return-value]

    @property
    def read_elements(self) -> int:
        return self._sum("elements", "read")  # type: ignore[return-value]

    @property
    def write_elements(self) -> int:
        return self._sum("elements", "write")  # type: ignore[return-value]

    @property
    def elements(self) -> int:
        return self._sum("elements", None)  # type: ignore[return-value]

    @property
    def read_sectors(self) -> int | None:
        return self._sum("sectors", "read")

    @property
    def write_sectors(self) -> int | None:
        return self._sum("sectors", "write")

    @property
    def sectors(self) -> int | None:
        return self._sum("sectors", None)

    def elements_by_key(self) -> dict[tuple[str, Direction], int]:
        """The breakdown as plain element counts, zero entries dropped (for exact comparisons)."""
        return {k: t.elements for k, t in sorted(self.breakdown.items()) if t.elements}

    def bytes_by_key(self) -> dict[tuple[str, Direction], int]:
        return {k: t.bytes for k, t in sorted(self.breakdown.items()) if t.bytes}

    def to_dict(self) -> dict:
        """JSON-ready summary: totals and ``breakdown`` as {"Q": {"read": {...}, ...}, ...}."""
        bd: dict[str, dict[str, dict[str, int | None]]] = {}
        for (name, dr), t in sorted(self.breakdown.items()):
            bd.setdefault(name, {})[dr] = {"elements": t.elements, "bytes": t.bytes, "sectors": t.sectors}
        return {
            "hbm_read_bytes": self.read_bytes,
            "hbm_write_bytes": self.write_bytes,
            "hbm_bytes": self.bytes,
            "hbm_read_elements": self.read_elements,
            "hbm_write_elements": self.write_elements,
            "hbm_sectors": self.sectors,
            "breakdown": bd,
        }


def from_elements(elements: dict[tuple[str, Direction], int], tensors: dict[str, TensorLayout]) -> IOCount:
    """An IOCount from per-(tensor, direction) element counts (how closed forms report)."""
    bd = {}
    for (name, dr), n in elements.items():
        n = int(n)
        if n:
            bd[(name, dr)] = Traffic(n, n * tensors[name].elem_bytes, None)
    return IOCount(bd)


# --------------------------------------------------------------------------------------------
# The walker


def _tensor_bases(tensors: dict[str, TensorLayout]) -> dict[str, int]:
    """Byte address of each tensor: allocated one after another, each 256-byte aligned."""
    bases, addr = {}, 0
    for name, t in tensors.items():
        bases[name] = addr
        addr += -(-t.slices * t.slice_bytes // 256) * 256
    return bases


def _sectors_of_rows(start_mod: np.ndarray, stride: int, nrows: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Distinct sectors touched by ``nrows`` byte ranges of ``nbytes`` each (``nbytes <= stride``),
    the k-th starting at ``a_k = start_mod + k*stride``.

    Row k spans sectors ⌊a_k/32⌋ .. ⌊(a_k + n - 1)/32⌋; the ranges are disjoint and increasing,
    so the only sector row k can share with earlier rows is its first with row k-1's last, which
    happens iff a_k mod 32 >= g with g = stride - n + 1.  Both terms depend on k only through
    a_k mod 32, which has period 32/gcd(stride, 32): the sum is exact with at most 32 terms.
    """
    period = SECTOR_BYTES // gcd(stride, SECTOR_BYTES)
    shape = np.broadcast(start_mod, nrows, nbytes).shape
    total = np.zeros(shape, dtype=np.int64)
    gap = stride - nbytes + 1
    for k in range(period):
        count = np.where(nrows > k, (nrows - k + period - 1) // period, 0)
        off = (start_mod + k * stride) % SECTOR_BYTES
        span = (off + nbytes + SECTOR_BYTES - 1) // SECTOR_BYTES  # sectors of one row at this phase
        total += count * span
        # rows k' >= 1 in this phase class share their first sector with the row before
        shared = count - (1 if k == 0 else 0) * (nrows > 0)
        total -= np.where(off >= gap, shared, 0)
    return np.where(nbytes > 0, total, 0)


#: The walker counts in int64 where that is exact; one transfer's bytes must stay below this.
_MAX_SLICE_BYTES = 2**62


def _total(a: np.ndarray, w: np.ndarray | int = 1) -> int:
    """Σ a·w exactly (int64 where the result surely fits, Python ints otherwise)."""
    a, w = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(w, dtype=np.int64))
    if float(np.sum(a.astype(np.float64) * w)) < 2.0**62:
        return int(np.sum(a * w))
    return int(np.sum(a.astype(object) * w.astype(object)))


def _walk_launch(launch: Launch, tensors: dict[str, TensorLayout], bases: dict[str, int],
                 ordered: bool = False, residues: dict | None = None) -> IOCount:
    acc_el: dict[tuple[str, Direction], int] = {}
    acc_sec: dict[tuple[str, Direction], int] = {}
    hists: dict[str, np.ndarray] = {}
    residues = {} if residues is None else residues
    source = launch.accesses if ordered or launch.counts is None else launch.counts
    for a in source():
        t = tensors[a.tensor]
        if t.slice_bytes >= _MAX_SLICE_BYTES:
            raise ValueError(f"tensor {a.tensor}: {t.rows:,} x {t.cols:,} elements per slice "
                             f"({t.slice_bytes:,} bytes) is more than the walker counts (2**62 bytes)")
        ncols = t.cols if a.ncols is None else a.ncols
        row0, nrows, col0, ncols, soff, rep = (
            np.asarray(x, dtype=np.int64)
            for x in np.broadcast_arrays(a.row0, a.nrows, a.col0, ncols, a.slice_offset, a.repeat))
        if row0.size == 0:
            continue
        if nrows.min() < 0 or ncols.min() < 0 or row0.min() < 0 or col0.min() < 0 or rep.min() < 0:
            raise AssertionError(f"negative tile in {launch.name}: {a}")
        if np.any(row0 + nrows > t.rows) or np.any(col0 + ncols > t.cols):
            raise AssertionError(f"tile out of bounds of {a.tensor} {t.rows}x{t.cols} in {launch.name}: {a}")
        key = (a.tensor, a.direction)
        acc_el[key] = acc_el.get(key, 0) + _total(nrows * ncols, rep) * launch.programs
        # Sectors.  Program p's slice starts at A_p = base + slice_p * slice_bytes; a transfer
        # at slice offset so, row r0, column c0 starts (mod 32) at A_p + so*slice_bytes +
        # r0*row_bytes + c0*elem_bytes.  Programs are grouped by A_p mod 32 (<= 32 groups).
        if a.tensor not in hists:
            slices = np.asarray(launch.slice_of[a.tensor], dtype=np.int64)
            if slices.shape != (launch.programs,):
                raise AssertionError(f"slice_of[{a.tensor!r}] has shape {slices.shape}, want ({launch.programs},)")
            key_ = id(launch.slice_of[a.tensor])
            if key_ not in residues:  # programs by slice index mod 32, and the slice range
                residues[key_] = (launch.slice_of[a.tensor],
                                  np.bincount(slices % SECTOR_BYTES, minlength=SECTOR_BYTES).astype(np.int64),
                                  np.array([slices.min(), slices.max()]))
            _, res, rng = residues[key_]
            base_phase = (bases[a.tensor] % SECTOR_BYTES
                          + np.arange(SECTOR_BYTES) * (t.slice_bytes % SECTOR_BYTES)) % SECTOR_BYTES
            hists[a.tensor] = np.bincount(base_phase, weights=res, minlength=SECTOR_BYTES).astype(np.int64)
            hists[a.tensor + "/range"] = rng
        lo, hi = hists[a.tensor + "/range"]
        if lo + soff.min() < 0 or hi + soff.max() >= t.slices:
            raise AssertionError(f"slice out of range for {a.tensor} in {launch.name}")
        off = ((soff % SECTOR_BYTES) * (t.slice_bytes % SECTOR_BYTES) + (row0 % SECTOR_BYTES)
               * (t.row_bytes % SECTOR_BYTES) + (col0 % SECTOR_BYTES) * (t.elem_bytes % SECTOR_BYTES))
        whole = ncols == t.cols
        nbytes_whole = nrows * t.row_bytes
        nbytes_part = ncols * t.elem_bytes
        sec = 0
        hist = hists[a.tensor]
        for ph in np.flatnonzero(hist).tolist():
            start = (ph + off) % SECTOR_BYTES
            s_whole = np.where(nbytes_whole > 0, (start + nbytes_whole + SECTOR_BYTES - 1) // SECTOR_BYTES, 0)
            if whole.all():
                per = s_whole
            else:
                per = np.where(whole, s_whole, _sectors_of_rows(start, t.row_bytes, nrows, nbytes_part))
            sec += _total(per, rep) * int(hist[ph])
        acc_sec[key] = acc_sec.get(key, 0) + sec
    bd = {k: Traffic(v, v * tensors[k[0]].elem_bytes, acc_sec[k]) for k, v in acc_el.items() if v}
    return IOCount(bd)


def walk(schedule: Schedule, ordered: bool = False) -> IOCount:
    """Sum every transfer of every program of every launch of ``schedule``.

    Each launch is walked through its grouped ``counts`` when it has them; ``ordered=True`` walks
    the loop-order ``accesses()`` instead (slower; the same numbers).
    """
    bases = _tensor_bases(schedule.tensors)
    per_launch: dict[str, IOCount] = {}
    total: dict[tuple[str, Direction], Traffic] = {}
    residues: dict = {}  # slice_of arrays shared by launches are histogrammed once
    for launch in schedule.launches:
        c = _walk_launch(launch, schedule.tensors, bases, ordered, residues)
        name = launch.name
        k = 2
        while name in per_launch:
            name, k = f"{launch.name}#{k}", k + 1
        per_launch[name] = c
        for key, t in c.breakdown.items():
            total[key] = total.get(key, ZERO) + t
    return IOCount(total, per_launch)


def iter_transfers(schedule: Schedule) -> Iterator[tuple[str, Access]]:
    """Every access of one program of each launch, in order, with the launch name (for replaying
    a schedule through a cache model).  These are the ``accesses()`` streams (``repeat`` = 1),
    never the grouped ``counts``."""
    for launch in schedule.launches:
        for a in launch.accesses():
            yield launch.name, a
