"""Decoding against a KV cache: split-KV (flash-decoding), paged KV, variable lengths, windows.

The workload's ``seq_len_q`` is Nq, the query rows per sequence (1 for plain decoding, a few for
speculative decoding), ``seq_len_k`` is Nk, the longest cache the batch may hold, and
``heads``/``kv_heads`` are Hq and Hkv (g = Hq/Hkv query heads share a kv head).  Sequence b
holds L_b cached keys (``lengths``, or ``cu_seqlens`` as flash-attention's cumulative
``cu_seqlens_k``; default all Nk), 1 <= Nq <= L_b <= Nk.  Query row i of sequence b sits at
position L_b - Nq + i and sees the keys j <= L_b - Nq + i (causal, bottom-right aligned,
whatever the workload's ``causal`` says), and with ``window=(left, right)`` also
j >= pos - left (right is capped by causality: it is accepted, checked >= 0 and changes nothing).

Schedule (one launch, plus a combine launch when split), per (b, kv head h, split s), GQA packed
(one program handles the g query heads of h and all Nq rows, g·Nq query rows)::

    visible keys lo_b .. L_b - 1, lo_b = max(0, L_b - Nq - left) (0 without a window)
    key blocks j = lo_b // Bc .. (L_b - 1) // Bc: nblk_b of them, bps_b = ⌈nblk_b / S⌉ per split;
    split s takes blocks s·bps_b .. min(nblk_b, (s + 1)·bps_b) - 1 of that list (maybe none)
    load L_b (one int32 of Lens: every program, an empty split too, needs it to find its range)
    if it has a block: load Q (g·Nq x d)
    for each of its blocks j:
        paged: load the block-table entries of the pages holding rows j·Bc .. min((j+1)·Bc, L_b) - 1
        load K, V rows j·Bc .. min((j+1)·Bc, L_b) - 1 (rows before lo_b in the first block are
        read and masked, not skipped); online softmax on chip
    S = 1: write O (g·Nq x d) and L (g·Nq, fp32)
    S > 1: write Op (g·Nq x d, fp32) and Lp (g·Nq, fp32), zeros and -inf for an empty split
    combine (S > 1), per (b, query head, query row): read Lp and Op of all S splits, write O, L

Element counts (what the closed form gives and the kernels' counters must equal), with
jf_b = lo_b // Bc, jl_b = (L_b - 1) // Bc, nblk_b = jl_b - jf_b + 1, bps_b = ⌈nblk_b / S⌉,
ne_b = ⌈nblk_b / bps_b⌉ the splits with a block::

    Lens read   B·Hkv·S
    Q read   Hq·Nq·d · Σ_b ne_b
    K read = V read   Hkv·d · Σ_b (L_b - jf_b·Bc)
    BT read  Hkv · Σ_b Σ_{j=jf_b..jl_b} ((min((j+1)·Bc, L_b) - 1) // P - (j·Bc) // P + 1)   (paged)
    S = 1:   O write B·Hq·Nq·d, L write B·Hq·Nq
    S > 1:   Op write = Op read = S·B·Hq·Nq·d, Lp write = Lp read = S·B·Hq·Nq,
             O write B·Hq·Nq·d, L write B·Hq·Nq

Layouts (for the sectors): Lens (B,) int32 (the lengths, as the kernels' ``cache_seqlens``); Q,
O (B, Hq, Nq, d); L (B, Hq, Nq); Op (S, B, Hq, Nq, d), Lp (S, B, Hq, Nq); K, V contiguous (B, Hkv,
Nk, d); paged (num_pages, P, Hkv, d) as vLLM's and flash-attention's ``k_cache``, num_pages =
B·Nk/P, with the block table BT (B, Nk/P) int32 (default
``numpy.random.default_rng(0).permutation(num_pages)`` reshaped: a sequence's pages are not
contiguous).  In the paged layout a head's consecutive rows are Hkv·d elements apart: with
Hkv > 1 each row is one transfer (its own sectors); with Hkv = 1 the rows of a key block inside
one page are one contiguous transfer.  A block's block-table entries are one transfer.

The walker's representation: the main launch is walked as Hkv programs (one per kv head; the
batch and the splits are in the accesses' slice offsets, since the sequences differ; each of the
Hkv programs reads L_b once per split s of every sequence b, the element its real programs
(s, b, h) read, the same for every kv head h), the combine launch (which reads no length) as
B·Hkv programs each standing for its g·Nq real ones; ``Schedule.meta["grids"]`` gives the real
grids.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..blocks import attach
from ..config import STAT_BYTES, Tiling, Workload, as_size, cdiv
from ..masking import check_window
from ..traffic import SECTOR_BYTES, Launch, Schedule, TensorLayout, read, write
from ._common import MAX_BLOCKS, check_programs, paper_rule_plan, require_tiling, tiling_blocks

PASSES = ("fwd",)
NEEDS_TILING = True
#: The M rule: a given tiling (only its block_n, Bc, is used), else Bc = ⌈M/4d⌉ as the paper's.
plan = paper_rule_plan
blocks = tiling_blocks
TILING_TEXT = "Bc = {block_n} (key rows per block; Br = {block_m} unused: a program holds g·Nq query rows)"
DESCRIPTION = ("decoding against a KV cache: GQA-packed programs per (batch, kv head, split), split-KV with a "
               "combine launch, paged cache through a block table, variable lengths, sliding window")
OPTIONS: dict[str, tuple[object, str]] = {
    "num_splits": (1, "split-KV: each (batch, kv head)'s key blocks cut into S parts, each writing a partial "
                      "O and logsumexp (fp32) that a combine launch reduces"),
    "page_size": (None, "paged KV cache: pages of P rows (P must divide Nk), addressed through a block table"),
    "window": (None, "sliding window LEFT,RIGHT: query row at position pos sees keys pos - LEFT .. pos "
                     "(RIGHT is capped by causality)"),
    "lengths": (None, "per-sequence cache lengths L_1,...,L_B (1 <= Nq <= L_b <= Nk; default all Nk), or @FILE "
                      "holding them"),
    "cu_seqlens": (None, "cumulative cache lengths 0,c_1,...,c_B (B + 1 values, as flash-attention's "
                         "cu_seqlens_k), or @FILE, instead of --lengths"),
    "block_table": (None, "the paged cache's block table: B rows of Nk/P physical pages, rows separated by "
                          "';' and entries by ',' (default a fixed permutation of the B·Nk/P pages)"),
}

#: The most key blocks (over the whole batch) and page segments the walker lists.
MAX_SEGMENTS = 2**23


# ---------------------------------------------------------------------------------------------
# Options


def _int_list(name: str, value) -> list[int]:
    """A 1-D list of ints from a list/tuple/array, the text "a,b,c", or "@FILE": the integers of
    a text file, separated by commas, spaces or newlines."""
    if isinstance(value, str):
        text = value
        if value.startswith("@"):
            try:
                with open(value[1:]) as f:
                    text = f.read()
            except OSError as e:
                raise ValueError(f"{name}={value!r}: cannot read {value[1:]!r} ({e.strerror or e})") from None
        try:
            out = [int(x) for x in text.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"{name}={value!r}: must be integers separated by commas (or a file of them, @FILE)") \
                from None
        if not out:
            raise ValueError(f"{name}={value!r}: holds no integer")
        return out
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = [value]  # one sequence (the command line reads "--lengths 100" as the int 100)
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: must be a non-empty 1-D list of integers (got shape {arr.shape})")
    out = []
    for i, v in enumerate(arr.tolist() if arr.dtype != object else list(value)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name}[{i}]={v!r}: must be an integer")
        out.append(int(v))
    return out


def _lengths(w: Workload, lengths, cu_seqlens) -> np.ndarray:
    if lengths is not None and cu_seqlens is not None:
        raise ValueError("lengths and cu_seqlens: give one of them, not both")
    if cu_seqlens is not None:
        cu = _int_list("cu_seqlens", cu_seqlens)
        if len(cu) != w.batch + 1:
            raise ValueError(f"cu_seqlens: {len(cu)} values for batch={w.batch}; must be batch + 1 = {w.batch + 1} "
                             f"(cumulative lengths starting at 0)")
        if cu[0] != 0:
            raise ValueError(f"cu_seqlens[0]={cu[0]}: must be 0")
        out = []
        for b in range(w.batch):
            if cu[b + 1] <= cu[b]:
                raise ValueError(f"cu_seqlens[{b + 1}]={cu[b + 1]}: must exceed cu_seqlens[{b}]={cu[b]} "
                                 f"(each sequence holds at least one key)")
            out.append(cu[b + 1] - cu[b])
        what = "cu_seqlens"
    elif lengths is not None:
        out = _int_list("lengths", lengths)
        if len(out) != w.batch:
            raise ValueError(f"lengths: {len(out)} values for batch={w.batch}; must be one per sequence")
        what = "lengths"
    else:
        return np.full(w.batch, w.nk, dtype=np.int64)
    for b, n in enumerate(out):
        if n < 1 or n > w.nk:
            raise ValueError(f"{what}: sequence {b} has length {n}; must be 1 .. seq_len_k={w.nk} (the cache size)")
        if n < w.nq:
            raise ValueError(f"{what}: sequence {b} has length {n} < seq_len_q={w.nq}: its Nq query rows must be "
                             f"in the cache")
    return np.asarray(out, dtype=np.int64)


def _block_table(w: Workload, page: int, table) -> np.ndarray | None:
    max_pages = w.nk // page
    num_pages = w.batch * max_pages
    if table is None:
        return None
    if isinstance(table, str):
        rows = [r for r in table.replace(" ", "").split(";") if r != ""]
        table = [_int_list(f"block_table[{b}]", r) for b, r in enumerate(rows)]
    elif isinstance(table, (int, np.integer)) and not isinstance(table, (bool, np.bool_)):
        table = [[table]]  # one sequence of one page (the command line reads "--block-table 3" as 3)
    try:
        arr = np.asarray(table)
    except (ValueError, TypeError):
        raise ValueError("block_table: must be a B x Nk/P array of integers (rows of equal length)") from None
    if arr.shape != (w.batch, max_pages):
        raise ValueError(f"block_table.shape={arr.shape}: must be (batch, seq_len_k // page_size) = "
                         f"({w.batch}, {max_pages})")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"block_table.dtype={arr.dtype}: entries must be integers")
    arr = arr.astype(np.int64)
    bad = (arr < 0) | (arr >= num_pages)
    if bad.any():
        b, k = np.argwhere(bad)[0]
        raise ValueError(f"block_table[{b}][{k}]={arr[b, k]}: out of range; physical pages are 0 .. "
                         f"{num_pages - 1} (num_pages = batch·seq_len_k/page_size)")
    return arr


@dataclass(frozen=True)
class DecodePlan:
    """Everything the decode schedule and closed form are computed from (``decode_plan``)."""

    batch: int
    hq: int
    hkv: int
    group: int
    nq: int
    d: int
    nk: int
    bc: int
    splits: int
    page: int | None
    window: tuple[int, int] | None
    lengths: np.ndarray   # L_b
    lo: np.ndarray        # first visible key of each sequence
    jf: np.ndarray        # first key block
    jl: np.ndarray        # last key block
    nblk: np.ndarray      # key blocks per sequence
    bps: np.ndarray       # key blocks per split
    nonempty: np.ndarray  # splits with at least one key block
    table_given: np.ndarray | None  # the block table given (checked), None: the default

    @cached_property
    def block_table(self) -> np.ndarray | None:
        """The block table (B x Nk/P physical pages; None without paging): the one given, else
        ``numpy.random.default_rng(0).permutation(num_pages)`` reshaped (made when first asked for:
        the closed form does not need it)."""
        if self.page is None:
            return None
        if self.table_given is not None:
            return self.table_given
        return np.random.default_rng(0).permutation(self.num_pages).astype(np.int64).reshape(self.batch,
                                                                                              self.max_pages)

    @property
    def max_pages(self) -> int:
        return 0 if self.page is None else self.nk // self.page

    @property
    def num_pages(self) -> int:
        return self.batch * self.max_pages


def decode_plan(w: Workload, tiling: Tiling | None, **options) -> DecodePlan:
    """Check the options against the workload and resolve them (every bad input: a ValueError
    naming the field)."""
    t = require_tiling(tiling, "decode")
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: decode takes only {sorted(OPTIONS)}")
    if not isinstance(w, Workload):
        raise ValueError(f"workload={type(w).__name__}: must be a flashsim.Workload")
    if w.block_mask is not None:
        raise ValueError("block_mask: decode takes no block mask (use window= for local attention)")
    splits = as_size("num_splits", options.get("num_splits", 1))
    page = options.get("page_size")
    if page is not None:
        page = as_size("page_size", page)
        if w.nk % page:
            raise ValueError(f"page_size={page}: must divide seq_len_k={w.nk} (each sequence's cache is "
                             f"seq_len_k/page_size whole pages)")
    elif options.get("block_table") is not None:
        raise ValueError("block_table: given without page_size (a block table addresses a paged cache)")
    window = check_window(options.get("window"))
    lengths = _lengths(w, options.get("lengths"), options.get("cu_seqlens"))
    bc = t.block_n
    lo = np.zeros_like(lengths) if window is None else np.maximum(0, lengths - w.nq - window[0])
    jf, jl = lo // bc, (lengths - 1) // bc
    nblk = jl - jf + 1
    if splits > int(nblk.max()):
        raise ValueError(f"num_splits={splits}: more than the {int(nblk.max())} key blocks of the longest sequence "
                         f"(block_n={bc}); each split needs a block")
    total = int(nblk.sum())
    if total > MAX_BLOCKS:
        raise ValueError(f"seq_len_k={w.nk:,}: with blocks of {bc:,} the batch holds {total:,} key blocks; the "
                         f"simulator walks at most {MAX_BLOCKS:,} (larger blocks, or the closed form)")
    check_programs(w.batch * w.hkv * splits, "batch*kv_heads*num_splits")
    bps = -(-nblk // splits)
    nonempty = -(-nblk // bps)
    table = None if page is None else _block_table(w, page, options.get("block_table"))
    return DecodePlan(w.batch, w.heads, w.hkv, w.group, w.nq, w.d, w.nk, bc, splits, page, window, lengths,
                      lo, jf, jl, nblk, bps, nonempty, table)


# ---------------------------------------------------------------------------------------------
# Per-block and per-segment arrays


def _blocks(p: DecodePlan) -> dict[str, np.ndarray]:
    """Every (sequence, key block) in loop order: b, j, split s, rows r0 .. r0 + n - 1."""
    b = np.repeat(np.arange(p.batch, dtype=np.int64), p.nblk)
    first = np.cumsum(p.nblk) - p.nblk
    k = np.arange(int(p.nblk.sum()), dtype=np.int64) - np.repeat(first, p.nblk)
    j = p.jf[b] + k
    r0 = j * p.bc
    n = np.minimum(r0 + p.bc, p.lengths[b]) - r0
    return {"b": b, "j": j, "s": k // p.bps[b], "r0": r0, "n": n}


def _pages_of(p: DecodePlan, r0: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First logical page and page count of each row range."""
    first = r0 // p.page
    return first, (r0 + n - 1) // p.page - first + 1


def _segments(p: DecodePlan, blk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each key block cut at page boundaries: block index, physical page, in-page row a, rows n."""
    first, npg = _pages_of(p, blk["r0"], blk["n"])
    total = int(npg.sum())
    if total > MAX_SEGMENTS:
        raise ValueError(f"page_size={p.page}: the key blocks cross {total:,} pages; the simulator walks at most "
                         f"{MAX_SEGMENTS:,} (a larger page size, or the closed form)")
    idx = np.repeat(np.arange(npg.size, dtype=np.int64), npg)
    logical = first[idx] + np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(npg) - npg, npg)
    start = np.maximum(blk["r0"][idx], logical * p.page)
    end = np.minimum(blk["r0"][idx] + blk["n"][idx], (logical + 1) * p.page)
    return {"blk": idx, "phys": p.block_table[blk["b"][idx], logical], "a": start - logical * p.page,
            "n": end - start}


def _group(weight: np.ndarray, **fields: np.ndarray) -> dict[str, np.ndarray]:
    """Transfers merged where no count can tell them apart: the row and slice offsets are reduced
    mod 32 (all a sector count sees of them; a residue is never above the value, so the
    representative stays in bounds) and equal (offsets, sizes) summed into one weight."""
    weight = np.asarray(weight, dtype=np.int64)
    if weight.size == 0:
        return {**{n: np.zeros(0, dtype=np.int64) for n in fields}, "repeat": np.zeros(0, dtype=np.int64)}
    key = np.zeros(weight.shape, dtype=np.int64)
    values = {}
    for name, v in fields.items():
        v = np.broadcast_to(np.asarray(v, dtype=np.int64), weight.shape)
        if name in ("row0", "soff"):
            code, radix = v % SECTOR_BYTES, SECTOR_BYTES
            values[name] = np.arange(SECTOR_BYTES, dtype=np.int64)
        else:
            values[name], code = np.unique(v, return_inverse=True)
            radix = values[name].size
        key = key * radix + code.reshape(weight.shape)  # mixed radix: < 32·32·(distinct sizes)
    uniq, inv = np.unique(key, return_inverse=True)
    # float64 sums are exact: a total is at most the number of transfers times B (< 2^53)
    tot = np.rint(np.bincount(inv.ravel(), weights=weight.ravel().astype(np.float64))).astype(np.int64)
    out = {}
    rest = uniq
    for name in reversed(list(fields)):
        radix = values[name].size
        out[name] = values[name][rest % radix]
        rest = rest // radix
    out = {n: out[n] for n in fields}
    out["repeat"] = tot
    return out


def _residue_rows(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """For ranges [start, start + length), how many of all their integers are ≡ c (mod 32), c = 0..31."""
    hist = np.full(SECTOR_BYTES, int((length // SECTOR_BYTES).sum()), dtype=np.int64)
    s, rem = start % SECTOR_BYTES, length % SECTOR_BYTES
    diff = (np.bincount(s, minlength=2 * SECTOR_BYTES + 1)
            - np.bincount(s + rem, minlength=2 * SECTOR_BYTES + 1)).astype(np.int64)
    cum = np.cumsum(diff)[:2 * SECTOR_BYTES]
    return hist + cum[:SECTOR_BYTES] + cum[SECTOR_BYTES:]


# ---------------------------------------------------------------------------------------------
# Schedule


def _layouts(w: Workload, p: DecodePlan) -> dict[str, TensorLayout]:
    eb, gq, bk = w.elem_bytes, p.group * p.nq, p.batch * p.hkv
    out = {"Q": TensorLayout("Q", gq, p.d, eb, bk)}
    for name in ("K", "V"):
        if p.page is None:
            out[name] = TensorLayout(name, p.nk, p.d, eb, bk)
        elif p.hkv == 1:
            out[name] = TensorLayout(name, p.page, p.d, eb, p.num_pages)
        else:  # one slice per (page row, kv head): a head's rows are Hkv·d apart
            out[name] = TensorLayout(name, 1, p.d, eb, p.num_pages * p.page * p.hkv)
    if p.page is not None:
        out["BT"] = TensorLayout("BT", p.max_pages, 1, 4, p.batch)
    out["Lens"] = TensorLayout("Lens", p.batch, 1, 4, 1)
    out["O"] = TensorLayout("O", gq, p.d, eb, bk)
    out["L"] = TensorLayout("L", gq, 1, STAT_BYTES, bk)
    if p.splits > 1:
        out["Op"] = TensorLayout("Op", gq, p.d, STAT_BYTES, p.splits * bk)
        out["Lp"] = TensorLayout("Lp", gq, 1, STAT_BYTES, p.splits * bk)
    return out


def _kv_access(p: DecodePlan, name: str, segs: dict | None, blk: dict, lo: int, hi: int):
    """Loop-order K or V transfers of the key blocks lo .. hi - 1 (indices into ``blk``)."""
    if p.page is None:
        return read(name, blk["r0"][lo:hi], blk["n"][lo:hi], slice_offset=blk["b"][lo:hi] * p.hkv)
    s0, s1 = np.searchsorted(segs["blk"], [lo, hi], "left")
    phys, a, n = segs["phys"][s0:s1], segs["a"][s0:s1], segs["n"][s0:s1]
    if p.hkv == 1:
        return read(name, a, n, slice_offset=phys)
    rows = np.repeat(phys * p.page + a, n) + np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return read(name, 0, 1, slice_offset=rows * p.hkv)


def _main_launch(w: Workload, p: DecodePlan) -> Launch:
    blk = _blocks(p)
    segs = None if p.page is None else _segments(p, blk)
    heads = np.arange(p.hkv, dtype=np.int64)
    zeros = np.zeros(p.hkv, dtype=np.int64)
    slice_of = {"Q": heads, "O": heads, "L": heads, "Op": heads, "Lp": heads, "BT": zeros, "Lens": zeros,
                "K": zeros if (p.page is not None and p.hkv == 1) else heads}
    slice_of["V"] = slice_of["K"]
    gq = p.group * p.nq

    key_of = blk["b"] * p.splits + blk["s"]  # nondecreasing: blocks listed by (b, j), s = k // bps

    def accesses():
        # per sequence b, per split s: the length L_b (every split, empty ones too); Q; its key
        # blocks' block-table entries, K rows and V rows (each tensor's transfers of the split one
        # array, in loop order: only the interleaving of the tensors inside a split is not kept,
        # which changes no count); then O, L or Op, Lp
        bounds = np.searchsorted(key_of, np.arange(p.batch * p.splits + 1, dtype=np.int64), "left")
        for b in range(p.batch):
            for s in range(p.splits):
                lo, hi = int(bounds[b * p.splits + s]), int(bounds[b * p.splits + s + 1])
                yield read("Lens", b, 1)
                if hi > lo:
                    yield read("Q", 0, gq, slice_offset=b * p.hkv)
                    if p.page is not None:
                        pg0, npg = _pages_of(p, blk["r0"][lo:hi], blk["n"][lo:hi])
                        yield read("BT", pg0, npg, slice_offset=b)
                    yield _kv_access(p, "K", segs, blk, lo, hi)
                    yield _kv_access(p, "V", segs, blk, lo, hi)
                if p.splits == 1:
                    yield write("O", 0, gq, slice_offset=b * p.hkv)
                    yield write("L", 0, gq, slice_offset=b * p.hkv)
                else:
                    yield write("Op", 0, gq, slice_offset=(s * p.batch + b) * p.hkv)
                    yield write("Lp", 0, gq, slice_offset=(s * p.batch + b) * p.hkv)

    def counts():
        bb = np.arange(p.batch, dtype=np.int64)
        ln = _group(np.full(p.batch, p.splits, dtype=np.int64), row0=bb)
        yield read("Lens", ln["row0"], 1, repeat=ln["repeat"])
        q = _group(p.nonempty, soff=bb * p.hkv)
        yield read("Q", 0, gq, slice_offset=q["soff"], repeat=q["repeat"])
        ones = np.ones(blk["b"].size, dtype=np.int64)
        if p.page is None:
            kv = _group(ones, row0=blk["r0"], nrows=blk["n"], soff=blk["b"] * p.hkv)
            for name in ("K", "V"):
                yield read(name, kv["row0"], kv["nrows"], slice_offset=kv["soff"], repeat=kv["repeat"])
        else:
            pg0, npg = _pages_of(p, blk["r0"], blk["n"])
            bt = _group(ones, row0=pg0, nrows=npg, soff=blk["b"])
            yield read("BT", bt["row0"], bt["nrows"], slice_offset=bt["soff"], repeat=bt["repeat"])
            if p.hkv == 1:
                kv = _group(np.ones(segs["a"].size, dtype=np.int64), row0=segs["a"], nrows=segs["n"],
                            soff=segs["phys"])
                for name in ("K", "V"):
                    yield read(name, kv["row0"], kv["nrows"], slice_offset=kv["soff"], repeat=kv["repeat"])
            else:
                # one transfer per row x = phys·P + a .. ; its slice x·Hkv + h: only x mod 32 matters
                hist = _residue_rows(segs["phys"] * p.page + segs["a"], segs["n"])
                c = np.flatnonzero(hist)
                for name in ("K", "V"):
                    yield read(name, 0, 1, slice_offset=c * p.hkv, repeat=hist[c])
        if p.splits == 1:
            o = _group(np.ones(p.batch, dtype=np.int64), soff=bb * p.hkv)
            yield write("O", 0, gq, slice_offset=o["soff"], repeat=o["repeat"])
            yield write("L", 0, gq, slice_offset=o["soff"], repeat=o["repeat"])
        else:
            sb = np.arange(p.splits * p.batch, dtype=np.int64)
            o = _group(np.ones(sb.size, dtype=np.int64), soff=sb * p.hkv)
            yield write("Op", 0, gq, slice_offset=o["soff"], repeat=o["repeat"])
            yield write("Lp", 0, gq, slice_offset=o["soff"], repeat=o["repeat"])

    return Launch("decode_split" if p.splits > 1 else "decode", p.hkv, slice_of, accesses, counts)


def _combine_launch(w: Workload, p: DecodePlan) -> Launch:
    bk, gq = p.batch * p.hkv, p.group * p.nq
    progs = np.arange(bk, dtype=np.int64)
    slice_of = {n: progs for n in ("Op", "Lp", "O", "L")}
    split_off = (np.arange(p.splits, dtype=np.int64) * bk)[:, None]

    def accesses():
        # each of the program's g·Nq rows r stands for one real program (b, query head, row)
        for r in range(gq):
            yield read("Lp", r, 1, slice_offset=split_off[:, 0])
            yield read("Op", r, 1, slice_offset=split_off[:, 0])
            yield write("O", r, 1)
            yield write("L", r, 1)

    def counts():
        rows = np.arange(gq, dtype=np.int64)[None, :]
        ones = np.ones((p.splits, gq), dtype=np.int64)
        c = _group(ones.ravel(), row0=np.broadcast_to(rows, ones.shape).ravel(),
                   soff=np.broadcast_to(split_off, ones.shape).ravel())
        yield read("Lp", c["row0"], 1, slice_offset=c["soff"], repeat=c["repeat"])
        yield read("Op", c["row0"], 1, slice_offset=c["soff"], repeat=c["repeat"])
        r = _group(np.ones(gq, dtype=np.int64), row0=rows[0])
        yield write("O", r["row0"], 1, repeat=r["repeat"])
        yield write("L", r["row0"], 1, repeat=r["repeat"])

    return Launch("decode_combine", bk, slice_of, accesses, counts)


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: decode models only {list(PASSES)}")
    p = decode_plan(w, tiling, **options)
    launches = [_main_launch(w, p)]
    grids = {launches[0].name: p.batch * p.hkv * p.splits}
    if p.splits > 1:
        launches.append(_combine_launch(w, p))
        grids["decode_combine"] = p.batch * p.hq * p.nq
    meta = {"pass": "fwd", "block_n": p.bc, "num_splits": p.splits, "page_size": p.page, "window": p.window,
            "lengths": p.lengths.tolist(), "grids": grids}
    sched = Schedule("decode", _layouts(w, p), launches, meta)
    return attach(sched, "decode", w, tiling, plan=p)


# ---------------------------------------------------------------------------------------------
# Closed form


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Σ_{i=0}^{n-1} ⌊(a·i + b)/m⌋ for n >= 0, m >= 1, a, b >= 0, in O(log m) steps (the
    Euclid-like reduction: take out ⌊a/m⌋ and ⌊b/m⌋, then swap the roles of a and m)."""
    total = 0
    while n > 0:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y = a * n + b
        if y < m:
            break
        n, b = y // m, y % m
        m, a = a, m
    return total


def block_table_reads(p: DecodePlan) -> int:
    """Σ_b Σ_j (pages holding key block j's rows), by formula: with s_j = j·Bc and e_j the block's
    last row ((j+1)·Bc - 1, or L_b - 1 for the last block), Σ_j (⌊e_j/P⌋ - ⌊s_j/P⌋ + 1), each
    sum of floors over the arithmetic progression of j a :func:`floor_sum`."""
    if p.page is None:
        return 0
    total = 0
    for b in range(p.batch):
        jf, n, length = int(p.jf[b]), int(p.nblk[b]), int(p.lengths[b])
        starts = floor_sum(n, p.page, p.bc, jf * p.bc)
        ends = floor_sum(n - 1, p.page, p.bc, (jf + 1) * p.bc - 1) + (length - 1) // p.page
        total += ends - starts + n
    return total


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: decode models only {list(PASSES)}")
    p = decode_plan(w, tiling, **options)
    rows = p.hq * p.nq * p.batch  # query rows of the batch, all heads
    kv_rows = int((p.lengths - p.jf * p.bc).sum())
    out = {
        ("Lens", "read"): p.batch * p.hkv * p.splits,  # every main-launch program reads its length
        ("Q", "read"): p.hq * p.nq * p.d * int(p.nonempty.sum()),
        ("K", "read"): p.hkv * p.d * kv_rows,
        ("V", "read"): p.hkv * p.d * kv_rows,
        ("O", "write"): rows * p.d,
        ("L", "write"): rows,
    }
    if p.page is not None:
        out[("BT", "read")] = p.hkv * block_table_reads(p)
    if p.splits > 1:
        out[("Op", "write")] = out[("Op", "read")] = p.splits * rows * p.d
        out[("Lp", "write")] = out[("Lp", "read")] = p.splits * rows
    return out


def computed_entries(w: Workload, tiling: Tiling | None, **options) -> int:
    """Score entries the main launch computes, over the whole batch and all query heads: each
    program computes its g·Nq rows against every key row it loads (masked ones included)."""
    p = decode_plan(w, tiling, **options)
    return p.hq * p.nq * int((p.lengths - p.jf * p.bc).sum())


def summary(w: Workload, tiling: Tiling | None, gpu, **options) -> dict:
    """What ``flashsim simulate`` adds for this algorithm (``flashsim.report.simulate_summary``
    calls a module's ``summary`` where it has one, in place of the paper's forward-attention IO
    bounds, which do not describe a decode step): the decoding bounds and the proposed split count."""
    from ..decode_splits import decode_bounds, propose

    pr = propose(w, gpu, tiling, **options)
    return {"decode_bounds": decode_bounds(w, tiling, **options),
            "proposed_splits": {"num_splits": pr.num_splits, "fa2_choice": pr.fa2_choice,
                                "programs_per_split": pr.programs_per_split, "slots": pr.slots}}


__all__ = ["summary", "schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "PASSES", "NEEDS_TILING",
           "DESCRIPTION", "OPTIONS", "DecodePlan", "decode_plan", "floor_sum", "block_table_reads", "computed_entries",
           "cdiv"]
