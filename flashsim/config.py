"""Workload, tiling and hardware descriptions shared by the simulator, the kernels and the analysis.

Every class here is a frozen dataclass that checks its fields on construction and raises
``ValueError`` with a message that names the offending field (``f"{field=}"`` style), so that
the CLI can print one clear line and the API user knows what to fix.

Conventions used throughout flashsim:

* Tensors are laid out (B, H, N, d), row-major, each (batch, head) slice contiguous.
* ``seq_len_q`` (Nq) and ``seq_len_k`` (Nk) may differ; K and V have ``kv_heads`` heads, which
  must divide ``heads`` (grouped-query attention; ``kv_heads == 1`` is multi-query attention).
* Causal masking is aligned to the bottom-right corner of the Nq x Nk score matrix, as in
  flash-attention >= 2.1: query row ``i`` sees key column ``j`` iff ``j <= i + (Nk - Nq)``.
  PyTorch's ``is_causal=True`` aligns to the top-left corner instead (``j <= i``); the two agree
  only when Nq == Nk.  Rows that see no key at all (possible when Nq > Nk) produce O = 0 and a
  logsumexp of -inf.
* The statistics m, l (the paper's ℓ), the logsumexp L and the backward's D = rowsum(dO ∘ O) are
  stored in float32 whatever the input precision; Q, K, V, O, S, P and gradients use the input
  precision.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import numpy as np

#: Bytes per element of each supported storage precision.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
#: Bytes per element of the float32 row statistics (m, l, L, D).
STAT_BYTES = 4


#: The largest size (batch, heads, sequence length, head dimension, block size, M) a description
#: accepts: 2**31 - 1.  Products of such sizes stay exact (the simulator counts in Python ints or
#: int64 with overflow checks); larger values are refused with a ValueError naming the field.
MAX_SIZE = 2**31 - 1


def as_size(name: str, value: object, limit: int = MAX_SIZE) -> int:
    """``value`` as a Python int in [1, limit], or a ValueError naming ``name``.

    Accepts Python and numpy integers (normalised with ``operator.index``, so np.int32 sizes
    cannot overflow later).  Refuses bools, floats (even integral ones such as 64.0: a float
    size is never silently truncated), strings, None and anything else.
    """
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r}: must be an integer, not a bool")
    if isinstance(value, (float, np.floating)):
        raise ValueError(f"{name}={value!r}: must be an integer, not a float (sizes are never truncated)")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r}: must be an integer") from None
    if n <= 0:
        raise ValueError(f"{name}={n}: must be a positive integer")
    if n > limit:
        raise ValueError(f"{name}={n}: must be at most {limit:,} (flashsim's size limit)")
    return int(n)


def _check_positive_int(name: str, value: object) -> None:
    as_size(name, value, limit=2**62)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def _bool_matrix(mask: object) -> np.ndarray:
    """A 2-D boolean array from ``mask``, refusing what would not convert faithfully: entries
    must be bools, or integers / floats equal to 0 or 1 (NaN, 0.5, 2 or a string are refused,
    where ``bool(x)`` would have made them True)."""
    if not isinstance(mask, np.ndarray):
        try:
            widths = sorted({len(r) for r in mask})  # type: ignore[union-attr]
        except TypeError:
            widths = []
        if len(widths) > 1:
            raise ValueError(f"mask row lengths={widths}: rows must have equal length")
    try:
        arr = np.asarray(mask)
    except (ValueError, TypeError) as e:
        raise ValueError(f"mask: must be a 2-D array of bools ({e})") from None
    if arr.size == 0:
        raise ValueError(f"mask shape={arr.shape}: must be non-empty")
    if arr.ndim != 2:
        raise ValueError(f"mask.ndim={arr.ndim}: must be 2 (query blocks x key blocks)")
    if arr.dtype == bool:
        return arr.copy()
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"mask.dtype={arr.dtype}: entries must be bools (or 0/1 numbers)")
    bad = ~((arr == 0) | (arr == 1))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"mask[{i}][{j}]={arr[i, j]!r}: entries must be bools, 0 or 1")
    return arr == 1


@dataclass(frozen=True)
class BlockMask:
    """Block-sparsity mask for block-sparse FlashAttention (Proposition 4 of the paper).

    ``mask[i][j]`` is True when query block ``i`` (rows ``i*block_m .. (i+1)*block_m - 1``) may
    attend key block ``j`` (columns ``j*block_n ..``).  The mask only has meaning together with
    the same block sizes in the algorithm's tiling; the simulator rejects a mismatch.
    """

    block_m: int
    block_n: int
    mask: tuple[tuple[bool, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_m", as_size("block_m", self.block_m))
        object.__setattr__(self, "block_n", as_size("block_n", self.block_n))
        arr = _bool_matrix(self.mask)
        object.__setattr__(self, "mask", tuple(map(tuple, arr.tolist())))
        arr.setflags(write=False)
        object.__setattr__(self, "_array", arr)

    @classmethod
    def from_array(cls, mask: np.ndarray, block_m: int, block_n: int) -> BlockMask:
        return cls(block_m, block_n, mask)

    @property
    def array(self) -> np.ndarray:
        """The mask as a (read-only) boolean numpy array."""
        return self._array  # type: ignore[attr-defined]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.mask), len(self.mask[0])

    @property
    def density(self) -> float:
        """Fraction s of nonzero blocks (the paper's sparsity s in Proposition 4)."""
        a = self.array
        return float(a.sum()) / a.size


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One attention call: shapes, precision and masking.

    ``seq_len_k`` defaults to ``seq_len_q`` and ``kv_heads`` to ``heads``.
    """

    batch: int
    heads: int
    seq_len_q: int
    head_dim: int
    seq_len_k: int | None = None
    kv_heads: int | None = None
    dtype: str = "fp16"
    causal: bool = False
    block_mask: BlockMask | None = None

    def __post_init__(self) -> None:
        if self.seq_len_k is None:
            object.__setattr__(self, "seq_len_k", self.seq_len_q)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("batch", "heads", "kv_heads", "seq_len_q", "seq_len_k", "head_dim"):
            object.__setattr__(self, name, as_size(name, getattr(self, name)))
        if self.heads % self.kv_heads:
            raise ValueError(
                f"kv_heads={self.kv_heads}: must divide heads={self.heads} (grouped-query attention)"
            )
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype={self.dtype!r}: must be one of {sorted(DTYPE_BYTES)}")
        if not isinstance(self.causal, (bool, np.bool_)):
            raise ValueError(f"causal={self.causal!r}: must be a bool")
        object.__setattr__(self, "causal", bool(self.causal))
        if self.block_mask is not None:
            if not isinstance(self.block_mask, BlockMask):
                raise ValueError(f"block_mask={type(self.block_mask).__name__}: must be a BlockMask")
            want = (cdiv(self.seq_len_q, self.block_mask.block_m), cdiv(self.seq_len_k, self.block_mask.block_n))
            if self.block_mask.shape != want:
                raise ValueError(
                    f"block_mask.shape={self.block_mask.shape}: must be {want} for "
                    f"seq_len_q={self.seq_len_q}, seq_len_k={self.seq_len_k} and blocks "
                    f"{self.block_mask.block_m}x{self.block_mask.block_n}"
                )

    # Short names in the paper's notation.
    @property
    def nq(self) -> int:
        return self.seq_len_q

    @property
    def nk(self) -> int:
        return self.seq_len_k  # type: ignore[return-value]

    @property
    def d(self) -> int:
        return self.head_dim

    @property
    def hkv(self) -> int:
        return self.kv_heads  # type: ignore[return-value]

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.hkv

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bh(self) -> int:
        """Number of (batch, query head) pairs: the independent attention problems."""
        return self.batch * self.heads


@dataclass(frozen=True)
class Tiling:
    """Block sizes: ``block_m`` = Br rows of Q per tile, ``block_n`` = Bc rows of K/V per tile."""

    block_m: int
    block_n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_m", as_size("block_m", self.block_m))
        object.__setattr__(self, "block_n", as_size("block_n", self.block_n))

    @classmethod
    def from_sram(cls, sram_elems: int, head_dim: int) -> Tiling:
        """The paper's rule (Algorithm 1, line 1): Bc = ⌈M/4d⌉, Br = min(⌈M/4d⌉, d).

        ``sram_elems`` is M, the on-chip memory in *elements*.  The rule assumes M >= 4d, i.e. at
        least one row each of Q_i, K_j, V_j and O_i fits on chip; smaller M is rejected.
        """
        head_dim = as_size("head_dim", head_dim)
        sram_elems = as_size("sram_elems", sram_elems)
        if sram_elems < 4 * head_dim:
            raise ValueError(
                f"sram_elems={sram_elems}: FlashAttention needs M >= 4*d = {4 * head_dim} elements "
                f"(one row each of Q, K, V and O on chip)"
            )
        bc = cdiv(sram_elems, 4 * head_dim)
        return cls(block_m=min(bc, head_dim), block_n=bc)

    @classmethod
    def from_sram_bytes(cls, sram_bytes: int, head_dim: int, elem_bytes: int) -> Tiling:
        sram_bytes = as_size("sram_bytes", sram_bytes, limit=2**62)
        elem_bytes = as_size("elem_bytes", elem_bytes)
        return cls.from_sram(sram_bytes // elem_bytes, head_dim)

    def t_r(self, nq: int) -> int:
        """Tr = ⌈Nq/Br⌉, the number of query blocks."""
        return cdiv(nq, self.block_m)

    def t_c(self, nk: int) -> int:
        """Tc = ⌈Nk/Bc⌉, the number of key/value blocks."""
        return cdiv(nk, self.block_n)


def split_merge_points(value, field: str) -> list[tuple[int, float]]:
    """A merge table ((bytes, share), ...) as [(int, float)], or ValueError naming ``field``:
    bytes ascending integers >= 0, shares in [0, 1] (see Hardware.l2_split_merge)."""
    try:
        pts = [(b, p) for b, p in value]
        ok = all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 0
                 and isinstance(p, (int, float, np.floating)) and not isinstance(p, bool) and 0 <= p <= 1
                 for b, p in pts)
    except (TypeError, ValueError):
        ok = False
    if not ok or any(b1 <= b0 for (b0, _), (b1, _) in zip(pts, pts[1:])):
        raise ValueError(f"{field}={value!r}: must be ((bytes, share), ...) with bytes ascending integers >= 0 "
                         "and shares in [0, 1]")
    return [(int(b), float(p)) for b, p in pts]


def split_cost_value(value, field: str) -> float:
    """A split cost (see Hardware.l2_split_cost) as a float in [0, 1], or ValueError naming
    ``field``: numbers and numpy scalars, not booleans or NaN."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
            or not 0 <= value <= 1):
        raise ValueError(f"{field}={value!r}: must be a number in [0, 1]")
    return float(value)


@dataclass(frozen=True)
class Hardware:
    """A GPU preset.  Rates are dense (no sparsity), per second; sizes in bytes."""

    name: str
    sram_bytes_per_sm: int  # combined L1 / shared memory per SM
    max_shared_bytes_per_block: int  # largest shared memory one thread block may opt in to
    num_sms: int
    l2_bytes: int
    hbm_bytes_per_s: float
    #: matrix-multiply rate per input precision: tensor cores for fp16/bf16/tf32; "fp32" is the
    #: strict fp32 rate (no TF32), i.e. the CUDA cores, as with torch's TF32 switched off.
    matmul_flops: dict[str, float] = field(default_factory=dict)
    nonmatmul_flops: float = 0.0  # fp32 CUDA-core rate (FMA counted as 2)
    source: str = ""
    #: L2 geometry for the trace-driven DRAM model (flashsim.l2).  ``l2_partitions``: the L2 is
    #: split into this many halves (the H100/H200 and A100 L2 is two).  What the model uses is
    #: measured, not these halves: ``l2_capacity_fraction`` of ``l2_bytes`` is the capacity of
    #: the modelled cache (:attr:`l2_effective_bytes`; None: one partition's share),
    #: ``l2_dirty_fraction`` of it the most that one launch leaves dirty (None: no limit, dirty
    #: lines reach DRAM only when evicted), ``l2_replacement`` its policy ("lru" or "random"),
    #: ``l2_fetch_bytes`` what a read miss fetches; ``l2_ways``: associativity.
    l2_line_bytes: int = 128
    l2_sector_bytes: int = 32
    l2_ways: int = 16
    l2_partitions: int = 1
    l2_capacity_fraction: float | None = None
    l2_dirty_fraction: float | None = None
    l2_replacement: str = "lru"
    l2_fetch_bytes: int = 32
    #: with "nru": the share of victims drawn among all the ways (hot lines are kept, not always)
    l2_random_share: float = 0.0
    #: ((bytes stored since, share), ...): the share of the lines whose stores to them, already
    #: dirty, join their dirty part, by the bytes stored since the line's last store (one draw a
    #: line); for the others the line's older sectors are orphaned, written back the next time
    #: the dirty limit is passed (flashsim.l2.L2's ``split_merge``; empty: all join)
    l2_split_merge: tuple = ()
    #: what a line whose dirty part joined more than one store takes of the dirty limit beyond
    #: one line (flashsim.l2.L2's ``split_cost``)
    l2_split_cost: float = 0.0
    #: occupancy limits of one SM (CUDA programming guide, compute capability table)
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    l2_source: str = ""
    #: The GPU-to-GPU interconnect (NVLink) for context parallelism (flashsim.parallel):
    #: ``link_bytes_per_s`` is one GPU's bandwidth per direction (None: no interconnect modelled);
    #: ``link_topology`` is "switch" (every GPU's links go to an NVSwitch: a GPU's sends, to any
    #: peers, share its per-direction bandwidth) or "ring" (each GPU is linked to its two ring
    #: neighbours, ``link_bytes_per_s`` per direction on each link).
    link_bytes_per_s: float | None = None
    link_topology: str = "switch"
    link_source: str = ""

    def __post_init__(self) -> None:
        for name in ("sram_bytes_per_sm", "max_shared_bytes_per_block", "num_sms", "l2_bytes", "l2_line_bytes",
                     "l2_sector_bytes", "l2_ways", "l2_partitions", "max_threads_per_sm", "max_blocks_per_sm"):
            _check_positive_int(name, getattr(self, name))
        if self.l2_line_bytes % self.l2_sector_bytes or self.l2_line_bytes // self.l2_sector_bytes > 8:
            raise ValueError(f"l2_line_bytes={self.l2_line_bytes}: must be 1 to 8 sectors of "
                             f"l2_sector_bytes={self.l2_sector_bytes}")
        for name in ("l2_capacity_fraction", "l2_dirty_fraction"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
                raise ValueError(f"{name}={v!r}: must be None or a fraction in (0, 1]")
        v = self.l2_random_share
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"l2_random_share={v!r}: must be a fraction in [0, 1]")
        if self.l2_replacement not in ("lru", "random", "nru"):
            raise ValueError(f"l2_replacement={self.l2_replacement!r}: must be 'lru', 'random' or 'nru'")
        split_merge_points(self.l2_split_merge, "l2_split_merge")
        split_cost_value(self.l2_split_cost, "l2_split_cost")
        f = self.l2_fetch_bytes
        if (isinstance(f, bool) or not isinstance(f, int) or f < self.l2_sector_bytes or f > self.l2_line_bytes
                or f & (f - 1)):
            raise ValueError(f"l2_fetch_bytes={f!r}: must be a power of two from l2_sector_bytes to l2_line_bytes")
        if self.l2_effective_bytes < self.l2_line_bytes * self.l2_ways:
            raise ValueError(f"l2_bytes={self.l2_bytes}: the effective L2 ({self.l2_effective_bytes} bytes over "
                             f"{self.l2_partitions} partitions) must hold at least one set of {self.l2_ways} lines")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name={self.name!r}: must be a non-empty string")
        for name in ("hbm_bytes_per_s", "nonmatmul_flops"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}={v!r}: must be a positive finite number")
        v = self.link_bytes_per_s
        if v is not None and (isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)):
            raise ValueError(f"link_bytes_per_s={v!r}: must be None or a positive finite number")
        if self.link_topology not in LINK_TOPOLOGIES:
            raise ValueError(f"link_topology={self.link_topology!r}: must be one of {list(LINK_TOPOLOGIES)}")
        if not isinstance(self.matmul_flops, dict):
            raise ValueError(f"matmul_flops={self.matmul_flops!r}: must be a dict of precision -> FLOP/s")
        for key, v in self.matmul_flops.items():
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"matmul_flops[{key!r}]={v!r}: must be a positive finite number")

    @property
    def l2_effective_bytes(self) -> int:
        """The capacity of the modelled cache: ``l2_capacity_fraction`` of the L2 (measured by the
        calibration microbenchmarks), or one partition's share where no fraction is given."""
        if self.l2_capacity_fraction is None:
            return self.l2_bytes // self.l2_partitions
        return int(self.l2_bytes * self.l2_capacity_fraction)

    @property
    def l2_dirty_bytes(self) -> int | None:
        """The most dirty bytes the modelled L2 holds (None: no limit); ``l2_dirty_fraction`` of the L2."""
        return None if self.l2_dirty_fraction is None else int(self.l2_bytes * self.l2_dirty_fraction)

    def sram_elems(self, elem_bytes: int) -> int:
        """M in elements: the shared memory one thread block can use."""
        return self.max_shared_bytes_per_block // as_size("elem_bytes", elem_bytes, limit=8)


KIB = 1024
MIB = 1024 * 1024

#: Interconnect topologies the context-parallel model knows (see Hardware.link_topology).
LINK_TOPOLOGIES = ("switch", "ring")
_NVLINK_H100 = ("H100 SXM5 datasheet / whitepaper 2022: NVLink 4, 18 links, 900 GB/s bidirectional per GPU "
                "= 450 GB/s per direction, through NVSwitch in HGX H100 8-GPU boards")
_NVLINK_H200 = "H200 SXM datasheet: NVLink 900 GB/s bidirectional per GPU (450 GB/s per direction), NVSwitch (HGX)"
_NVLINK_A100 = ("A100 whitepaper 2020: NVLink 3, 12 links, 600 GB/s bidirectional per GPU = 300 GB/s per "
                "direction, through NVSwitch in HGX A100 8-GPU boards")

#: GPU presets.  Sources: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), table 1
#: and "A100 SM architecture" (192 KB combined L1/shared per SM, up to 164 KB shared per block,
#: 40 MB L2, 108 SMs, 312 TFLOP/s fp16/bf16 dense tensor, 156 tf32, 19.5 fp32 non-tensor);
#: A100 80GB datasheet (2,039 GB/s HBM2e SXM; 1,555 GB/s for the 40 GB part); NVIDIA H100 Tensor
#: Core GPU Architecture whitepaper (2022) and H100 datasheet (SXM5: 132 SMs, 256 KB combined
#: L1/shared per SM, up to 227 KB shared per block, 50 MB L2, 3.35 TB/s HBM3, 989.4 TFLOP/s
#: fp16/bf16 dense tensor, 494.7 tf32, 66.9 fp32 non-tensor); H200 datasheet (same SM and compute
#: as H100 SXM, 141 GB HBM3e at 4.8 TB/s).
#: Where each preset's L2 geometry comes from (flashsim.l2 models it).  The capacity, dirty
#: limit, fetch unit and replacement of the H100 and H200 presets are measured by the calibration
#: microbenchmarks (``python -m analysis.calibrate l2``), records analysis/data/l2calib/
#: {h100,h200}_l2calib.csv; ``analysis.calibrate.l2_model_parameters`` derives the numbers from
#: them and tests/test_l2_calibration.py checks that the presets hold what it derives.
_L2_A100 = ("A100 whitepaper 2020: 40 MB L2 in two partitions; 128-byte lines of four 32-byte sectors; 16 ways "
            "assumed.  No A100 calibration: capacity fraction 0.649, dirty fraction 0.473, NRU replacement with "
            "a 0.3 share of random victims and 64-byte fetches ASSUMED as measured on the H100 "
            "(analysis/data/l2calib/h100_l2calib.csv, h100_l2_policy.csv), lines stored in parts as on the H200")
_L2_H100 = ("H100 whitepaper 2022: L2 in two partitions, 128-byte lines of four 32-byte sectors; 16 ways assumed.  "
            "Measured (analysis/data/l2calib/, analysis.calibrate.l2_model_parameters and fit_random_share): "
            "a hot buffer re-read under a 256 MiB stream ('hot_stream', h100_l2_policy.csv) fits NRU with 0.3 "
            "of the victims drawn at random; with it, the grid's two-pass re-reads ('reread', W = 4..128 MiB, "
            "h100_l2calib.csv) fit 32.4 MiB (0.649 of the L2); single-pass 'write' cases W >= 32 MiB leave 23.7 "
            "MiB dirty (0.473); 'stride' reads fetch 64 bytes per touched 64-byte granule; lines stored in parts "
            "ASSUMED to merge as on the H200 (no H100 half-line probe)")
_L2_H200 = ("H200: L2 in two partitions as on the H100, 128-byte lines of four 32-byte sectors; 16 ways assumed.  "
            "Measured (analysis/data/l2calib/h200_l2calib.csv, analysis.calibrate.l2_model_parameters): "
            "'reread' x2 fits 42.6 MiB (0.710 of the L2) with NRU and a 0.3 share of random victims (the share "
            "ASSUMED as measured on the H100: no H200 hot_stream probe); 'write' W >= 40 MiB leaves 28.2 MiB "
            "dirty (0.470); 'stride' reads fetch 64 bytes; a line's later stores join its dirty part, which "
            "then takes 1.093 lines of the limit, with the share analysis.calibrate.split_merge_curve derives "
            "from h200_l2_halfline and h200_l2_quarter (all at once, 0.71 128 KiB of stores after the line's "
            "last, none from 1 MiB)")
#: Stores to a line already dirty: the share of lines whose later stores join its dirty part, by
#: the bytes stored since the line's last store, and what a line so joined takes of the dirty
#: limit beyond one line (analysis.calibrate.split_merge_curve over every H200 probe record with
#: lines stored in halves 0 B to 1 MiB apart: analysis/data/l2calib/h200_l2_halfline/7fbc0b2 and
#: 389c542, h200_l2_quarter/343dffd and a7a314e); the H100 preset borrows them (no H100 probe)
_SPLIT_MERGE_H200 = ((0, 1.0), (128, 1.0), (2048, 0.965), (16384, 0.886), (131072, 0.707), (1048576, 0.0))
_SPLIT_COST_H200 = 0.093
#: The H100's calibrated L2 model (see _L2_H100), which the A100 presets borrow for want of an
#: A100 calibration (see _L2_A100): one dict, so the borrowed numbers cannot drift from the measured.
_L2_H100_MEASURED = dict(l2_partitions=2, l2_capacity_fraction=0.649, l2_dirty_fraction=0.473, l2_replacement="nru",
                         l2_random_share=0.3, l2_fetch_bytes=64, l2_split_merge=_SPLIT_MERGE_H200,
                         l2_split_cost=_SPLIT_COST_H200)
#: What the two A100 presets share (they differ in HBM: size, bandwidth, datasheet).
_A100 = dict(sram_bytes_per_sm=192 * KIB, max_shared_bytes_per_block=164 * KIB, num_sms=108, l2_bytes=40 * MIB,
             matmul_flops={"fp16": 312e12, "bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
             nonmatmul_flops=19.5e12, **_L2_H100_MEASURED, l2_source=_L2_A100, link_bytes_per_s=300e9,
             link_topology="switch", link_source=_NVLINK_A100)
GPUS: dict[str, Hardware] = {
    "a100-40gb": Hardware(name="A100-SXM4-40GB", hbm_bytes_per_s=1.555e12,
                          source="A100 whitepaper 2020; A100 40GB datasheet", **_A100),
    "a100-80gb": Hardware(name="A100-SXM4-80GB", hbm_bytes_per_s=2.039e12,
                          source="A100 whitepaper 2020; A100 80GB datasheet", **_A100),
    "h100": Hardware(
        name="H100-SXM5-80GB",
        sram_bytes_per_sm=256 * KIB,
        max_shared_bytes_per_block=227 * KIB,
        num_sms=132,
        l2_bytes=50 * MIB,
        hbm_bytes_per_s=3.35e12,
        matmul_flops={"fp16": 989.4e12, "bf16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
        nonmatmul_flops=66.9e12,
        source="H100 whitepaper 2022; H100 SXM5 datasheet",
        **_L2_H100_MEASURED,
        l2_source=_L2_H100,
        link_bytes_per_s=450e9,
        link_topology="switch",
        link_source=_NVLINK_H100,
    ),
    "h200": Hardware(
        name="H200-SXM-141GB",
        sram_bytes_per_sm=256 * KIB,
        max_shared_bytes_per_block=227 * KIB,
        num_sms=132,
        l2_bytes=60 * MIB,  # 62,914,560 bytes as torch reports it on the H200 we measured on
        hbm_bytes_per_s=4.8e12,
        matmul_flops={"fp16": 989.4e12, "bf16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
        nonmatmul_flops=66.9e12,
        source="H200 datasheet (H100 SXM compute, HBM3e)",
        l2_partitions=2,
        l2_capacity_fraction=0.710,
        l2_dirty_fraction=0.470,
        l2_replacement="nru",
        l2_random_share=0.3,
        l2_fetch_bytes=64,
        l2_split_merge=_SPLIT_MERGE_H200,
        l2_split_cost=_SPLIT_COST_H200,
        l2_source=_L2_H200,
        link_bytes_per_s=450e9,
        link_topology="switch",
        link_source=_NVLINK_H200,
    ),
}
#: Aliases accepted by :func:`get_gpu`.
GPU_ALIASES = {"a100": "a100-40gb", "h100-sxm": "h100", "h100-80gb": "h100", "h200-sxm": "h200"}


def preset_of(gpu_name) -> str | None:
    """The preset of a GPU as nvidia-smi and the records' provenance name it ("NVIDIA H200" ->
    "h200", "NVIDIA A100-SXM4-80GB" -> "a100-80gb"), or None for a GPU without one (or no name)."""
    name = str(gpu_name or "").lower()
    for model in ("h200", "h100", "a100"):
        if model in name:
            return "a100-80gb" if model == "a100" and "80gb" in name else model
    return None


def get_gpu(name: str) -> Hardware:
    if not isinstance(name, str):
        raise ValueError(f"gpu={name!r}: must be a preset name; choose one of {sorted(GPUS)}")
    key = name.lower()
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise ValueError(f"gpu={name!r}: unknown GPU preset; choose one of {sorted(GPUS)}")
    return GPUS[key]
