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
the distinct sectors of their union (neighbouring rows may share one).  A bulk (TMA) copy counts
each row it is given apart, whole rows too, its in-bounds bytes only: the TMA unit asks for a
box row at a time, and a box row is at most 128 bytes (one swizzle row), so a schedule passes
wider rows as pieces of 128 bytes (torch_naive's GEMM bands and C stores, fwd_fp16_v7's K and
V; measured on an H200 for stores, the TMA box sweep's L2 write sectors,
analysis/data/h200/tma_box_sweep).  What the SMs receive from
TMA loads, zeros past the tensor's edge and multicast included, is :mod:`flashsim.tma`'s, not
this count.  Start
offsets are computed from the tensor's real layout ((B, H, rows, cols) row-major, each tensor
starting at a 256-byte-aligned address, as cudaMalloc guarantees), so ragged sizes (d = 59 in
fp16: 118-byte rows) are counted exactly.  Sector counts are an upper bound on what a kernel
requests only if it reads each transfer with coalesced accesses; an access marked
``per_thread_rows`` states the uncoalesced case (each thread reads its own row, column by
column) and is counted per request (see :class:`Access`).

Traffic classes.  Each access has a class (``Access.traffic_class``): ``"load"`` and ``"store"``
(global loads and stores through the LSU; the default, from ``Access.write``), ``"reduction"``
(global atomics / ``red``: a read-modify-write made in L2) and ``"bulk"`` (TMA / bulk copies,
which reach L2 without passing the LSU; ``write`` tells a bulk store from a bulk load).  The
breakdown keys loads ``(tensor, "read")`` and stores ``(tensor, "write")`` as always,
reductions ``(tensor, "reduction")`` and bulk copies ``(tensor, "bulk_read" | "bulk_write")``.
The totals ``read_*``, ``write_*``, ``bytes``, ``elements`` and ``sectors`` (and the
``hbm_*`` keys of :meth:`IOCount.to_dict`) count loads and stores only, the LSU level;
:meth:`IOCount.by_class` gives every class's elements, bytes and sectors apart.  The schedules of
PyTorch's kernels use them: reductions (``torch_flash``'s dQ atomics), bulk copies (``torch_naive``'s
fp16 GEMMs, ``torch_cudnn``) and per-thread rows (``torch_naive``'s ``tril``); so do the fast
kernels (:mod:`flashsim.algorithms.fast`: the backwards' dQ reductions, ``bwd_fp16_v3``'s
``bulkq`` dQ by bulk reductions, ``fwd_fp16_v7``'s K and V by bulk loads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from math import gcd

import numpy as np

SECTOR_BYTES = 32

Direction = str  # "read" or "write" (and, in a breakdown, "reduction", "bulk_read", "bulk_write")

#: The traffic classes of an access (see the module docstring).
TRAFFIC_CLASSES = ("load", "store", "reduction", "bulk")

#: The breakdown's second key for each (class, write); loads and stores keep "read" and "write".
_CLASS_KEY = {("load", False): "read", ("store", True): "write", ("reduction", True): "reduction",
              ("bulk", False): "bulk_read", ("bulk", True): "bulk_write"}
_KEY_CLASS = {k: c for (c, _), k in _CLASS_KEY.items()}

#: Threads per warp: a per-thread-rows access makes one request per warp and column step.
WARP_THREADS = 32


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

    ``traffic``: the traffic class, one of :data:`TRAFFIC_CLASSES`; ``None`` (the default) is
    ``"load"`` for a read and ``"store"`` for a write.  ``"load"`` needs ``write=False``,
    ``"store"`` and ``"reduction"`` need ``write=True``; ``"bulk"`` takes either (a TMA load
    or store).  A reduction counts the elements it sends once, like a store.

    ``per_thread_rows=True``: the tile is read (or written) by ``nrows`` threads, thread k owning
    row ``row0 + k``, in ``ncols`` column steps: at step j every thread accesses its element
    ``(row0 + k, col0 + j)`` (one element each).  Threads are grouped in order into warps of
    :data:`WARP_THREADS` (rows ``row0 .. row0+31`` in the first); each warp makes one request per
    step, and a request touches the distinct 32-byte sectors of its threads' elements.  The
    access's sectors are the sum over steps and warps, with no reuse between requests; elements
    and bytes are counted as for any tile.  So an R x C tile of E-byte elements with rows at
    least 32 bytes apart costs R·C sectors (one per element) where a coalesced read of its rows
    costs about R·⌈C·E/32⌉; rows closer than 32 bytes share sectors inside a request.
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
    #: the traffic class (None: "load" or "store", from ``write``)
    traffic: str | None = None
    #: one thread per row, column by column (an uncoalesced pattern; see above)
    per_thread_rows: bool = False

    def __post_init__(self) -> None:
        if self.traffic is None and self.per_thread_rows is False:  # the common case, kept cheap
            return
        if self.traffic is not None and (self.traffic, bool(self.write)) not in _CLASS_KEY:
            if self.traffic not in TRAFFIC_CLASSES:
                raise ValueError(f"Access.traffic must be one of {TRAFFIC_CLASSES} or None, got {self.traffic=}")
            raise ValueError(f"Access.traffic={self.traffic!r} does not go with {self.write=} "
                             "(load: write=False; store, reduction: write=True)")
        if not isinstance(self.per_thread_rows, bool | np.bool_):
            raise ValueError(f"Access.per_thread_rows must be a bool, got {self.per_thread_rows=}")
        if self.per_thread_rows and self.traffic == "bulk":
            raise ValueError(f"Access.per_thread_rows: a bulk copy has no per-thread pattern ({self.traffic=})")

    @property
    def direction(self) -> Direction:
        return "write" if self.write else "read"

    @property
    def traffic_class(self) -> str:
        """``traffic``, or ``"load"`` / ``"store"`` from ``write`` when it is None."""
        if self.traffic is None:
            return "store" if self.write else "load"
        return self.traffic

    @property
    def key(self) -> Direction:
        """The breakdown's second key: "read", "write", "reduction", "bulk_read" or "bulk_write"."""
        return _CLASS_KEY[(self.traffic_class, bool(self.write))]


def read(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
         slice_offset: IntLike = 0, repeat: IntLike = 1, *, per_thread_rows: bool = False) -> Access:
    return Access(tensor, False, row0, nrows, col0, ncols, slice_offset, repeat,
                  per_thread_rows=per_thread_rows)


def write(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
          slice_offset: IntLike = 0, repeat: IntLike = 1, *, per_thread_rows: bool = False) -> Access:
    return Access(tensor, True, row0, nrows, col0, ncols, slice_offset, repeat,
                  per_thread_rows=per_thread_rows)


def reduction(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
              slice_offset: IntLike = 0, repeat: IntLike = 1, *, per_thread_rows: bool = False) -> Access:
    """A reduction (global atomics / ``red``) into the tile: class ``"reduction"``."""
    return Access(tensor, True, row0, nrows, col0, ncols, slice_offset, repeat, traffic="reduction",
                  per_thread_rows=per_thread_rows)


def bulk_read(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
              slice_offset: IntLike = 0, repeat: IntLike = 1) -> Access:
    """A bulk (TMA) load of the tile: class ``"bulk"``, not an LSU load."""
    return Access(tensor, False, row0, nrows, col0, ncols, slice_offset, repeat, traffic="bulk")


def bulk_write(tensor: str, row0: IntLike, nrows: IntLike, col0: IntLike = 0, ncols: IntLike | None = None,
               slice_offset: IntLike = 0, repeat: IntLike = 1) -> Access:
    """A bulk (TMA) store of the tile: class ``"bulk"``, not an LSU store."""
    return Access(tensor, True, row0, nrows, col0, ncols, slice_offset, repeat, traffic="bulk")


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

    ``breakdown[(tensor, "read" | "write")]`` holds a :class:`Traffic` of loads or stores (and
    ``(tensor, "reduction" | "bulk_read" | "bulk_write")`` the other traffic classes);
    ``per_launch`` maps a launch name to its own IOCount (only filled by the walker).  Sector
    counts are ``None`` where they were not computed (closed forms count elements and bytes).
    The totals (``read_*``, ``write_*``, ``bytes``, ``elements``, ``sectors``) are of loads and
    stores only (the LSU level); :meth:`by_class` has every class apart.
    """

    breakdown: dict[tuple[str, Direction], Traffic]
    per_launch: dict[str, IOCount] = field(default_factory=dict)

    def _sum(self, attr: str, direction: Direction | None) -> int | None:
        dirs = ("read", "write") if direction is None else (direction,)
        vals = [getattr(t, attr) for (_, dr), t in self.breakdown.items() if dr in dirs]
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

    def by_class(self) -> dict[str, Traffic]:
        """Elements, bytes and sectors of each traffic class (:data:`TRAFFIC_CLASSES`, every one
        present, zero where unused): "load" and "store" are the totals' reads and writes,
        "reduction" the reductions, "bulk" the bulk (TMA) loads and stores together.  Sectors
        are ``None`` where any entry of the class has none."""
        out = {c: ZERO for c in TRAFFIC_CLASSES}
        for (_, key), t in self.breakdown.items():
            c = _KEY_CLASS.get(key)
            if c is None:
                raise ValueError(f"IOCount.breakdown: unknown direction {key=}")
            out[c] = out[c] + t
        return out

    def elements_by_key(self) -> dict[tuple[str, Direction], int]:
        """The breakdown as plain element counts, zero entries dropped (for exact comparisons)."""
        return {k: t.elements for k, t in sorted(self.breakdown.items()) if t.elements}

    def bytes_by_key(self) -> dict[tuple[str, Direction], int]:
        return {k: t.bytes for k, t in sorted(self.breakdown.items()) if t.bytes}

    def to_dict(self) -> dict:
        """JSON-ready summary: the totals (loads and stores), ``breakdown`` as
        {"Q": {"read": {...}, ...}, ...} and ``classes``, :meth:`by_class` as
        {"load": {"elements": ..., "bytes": ..., "sectors": ...}, ...}."""
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
            "classes": {c: {"elements": t.elements, "bytes": t.bytes, "sectors": t.sectors}
                        for c, t in self.by_class().items()},
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


def _sectors_of_rows(start_mod: np.ndarray, stride: int, nrows: np.ndarray, nbytes: np.ndarray,
                     shared: bool = True) -> np.ndarray:
    """Distinct sectors touched by ``nrows`` byte ranges of ``nbytes`` each (``nbytes <= stride``),
    the k-th starting at ``a_k = start_mod + k*stride`` (``shared=False``: each range's sectors
    counted apart, a sector two rows touch twice).

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
        if shared:  # rows k' >= 1 in this phase class share their first sector with the row before
            total -= np.where(off >= gap, count - (1 if k == 0 else 0) * (nrows > 0), 0)
    return np.where(nbytes > 0, total, 0)


def _per_thread_sectors(start_mod: np.ndarray, stride: int, elem_bytes: int, nrows: np.ndarray,
                        ncols: np.ndarray) -> np.ndarray:
    """Sectors requested by a per-thread-rows tile (``Access.per_thread_rows``): ``nrows`` rows
    ``stride`` bytes apart, the first starting at ``start_mod`` (mod 32), read one element per
    thread in ``ncols`` column steps by warps of 32 consecutive rows.

    Step j's request from one warp touches the distinct sectors of its rows' elements, which
    start at ``start_mod + j*elem_bytes + k*stride``: :func:`_sectors_of_rows` with ranges of
    ``elem_bytes``.  Every warp starts 32·stride bytes (≡ 0 mod 32) after the one before, so all
    full warps count alike and the last holds ``nrows mod 32`` rows; the phase of step j has
    period 32/gcd(elem_bytes, 32) in j, so the sum is exact with at most 32 terms.
    """
    full, part = nrows // WARP_THREADS, nrows % WARP_THREADS
    period = SECTOR_BYTES // gcd(elem_bytes, SECTOR_BYTES)
    total = np.zeros(np.broadcast(start_mod, nrows, ncols).shape, dtype=np.int64)
    for j in range(period):
        steps = np.where(ncols > j, (ncols - j + period - 1) // period, 0)
        st = (start_mod + j * elem_bytes) % SECTOR_BYTES
        per_step = (full * _sectors_of_rows(st, stride, np.int64(WARP_THREADS), elem_bytes)
                    + _sectors_of_rows(st, stride, part, elem_bytes))
        total += steps * per_step
    return total


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
        key = (a.tensor, a.key)
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
            if a.per_thread_rows:
                per = _per_thread_sectors(start, t.row_bytes, t.elem_bytes, nrows, ncols)
            elif a.traffic == "bulk":  # the TMA unit's requests are per row: no sector shared
                per = _sectors_of_rows(start, t.row_bytes, nrows, nbytes_part, shared=False)
            elif whole.all():
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
