"""The fast kernels (``kernels/perf``, what ``kernels.flash_attention(impl="auto")`` runs): one
schedule per variant, launch by launch, read from the kernels' code (flashsim never imports
``kernels``; ``tests/test_fast_schedule.py`` holds the block shapes and the selection below equal
to theirs).  bf16 runs the fp16 kernels compiled for bf16 (same tiles, loads and stores): the
fp16 schedules with the workload's dtype "bf16".

Variants (the names the records use) and their launches, in launch order:

* ``fwd_fp16_v4`` (fp16/bf16 forward; block Br = 16·nw·mt = 128 query rows, Bc = 64 keys at
  d <= 64, 16 at d = 113-128, 32 elsewhere), ``fwd_fp16_v5`` (the same loop on Hopper's
  warpgroup products, any d % 8 == 0 up to 256; Br = 16·nw = 128, Bc = 64 at d <= 64 and above
  192, Br = 64, Bc = 64 at 64 < d <= 96, 48 at 96 < d <= 128 and 160 < d <= 192, 32 at
  128 < d <= 160; the
  same loads and stores as v4's;
  ``fwd_fp16_v7`` v5 with K_j and V_j copied by the TMA unit, traffic class "bulk", not LSU
  loads, the same rows; Br = 128, Bc = 64 but at d = 96, 112 and 128, where it takes v5's
  blocks; causal, its blocks run longest first across sections of heads, ``lpt``: :func:`lpt_heads`;
  v5 and v7 with ``splits`` = S > 1, split-KV, two launches: :func:`_forward_split`),
  ``fwd_fp32_v1`` (fp32 forward, FFMA; what BEST runs at d not a multiple
  of 8 and above 128; Br = 4·rm·nw = 64, Bc = 64 at d <= 64, 32 above) and ``fwd_fp32_v2`` (fp32
  forward as 3xTF32 on the tensor cores, d % 8 == 0 up to 128, padded on chip with zero columns to
  a multiple of 32, which no global access touches; Br = 16·nw·mt = 128 at d <= 64, 64 above,
  Bc = 32): one launch,
  FlashAttention-2's loop: Q_i once, K_j and V_j once per visible key block (the causal prefix,
  exactly flash2's visibility for these tiles), O_i and L_i once.  The copies move the d
  columns of each row (d is padded to a multiple of 16 only in shared memory, by
  ``f16_zero_pad``; no global load reads the padding).
* ``bwd_fp16_v1``: D = rowsum(dO ∘ O) (the reference preprocess kernel, Br = 64:
  ``kernels.perf._launch.row_dots``), then the dK/dV kernel (Bc = 16·nw·mt keys a block, bq query
  rows a step over every query head of the group), then the dQ kernel (Br = 16·nw·mt query rows,
  bk keys a step): flash2's three launches with these tiles.
* ``bwd_fp16_v3`` (d = 32 ... 256 in steps of 8 by default; also 16 and 24; d % 16 = 8 as d + 8 in
  shared memory), ``bwd_fp32_v1``, ``bwd_fp32_v2``: D, the
  zero fill of the float32 dQ accumulator ``dQacc`` (``zero_fill``: B·H·Nq·d float32 stores), one
  key-block kernel (K_j, V_j once; per step Q_i, dO_i, L_i, D_i; dQ_i by ``red.global.add``
  into ``dQacc``, traffic class "reduction", or with bwd_fp16_v3's ``bulkq`` by the TMA unit's
  bulk reductions, the same rows in class "bulk"; dK_j, dV_j stored once), and for fp16 the
  conversion ``dq_to_f16`` (dQacc read, dQ written in fp16).  The fp32 backwards reduce into
  dQ itself (fp32: no conversion launch).

Every launch carries its thread blocks (``Launch.blocks``, :mod:`flashsim.blocks`): the grid the
launchers use, threads and shared memory per block (:func:`block_resources`), each block's
tiles in the order its loop issues them; the L2 model (:mod:`flashsim.l2`) replays them.

What is assumed, and where it is exact:

* A copy of a row past the end (``cp.async`` with src-size 0: the zero fill of a ragged last
  block) is counted as no global request; rows that exist are loaded whole.
* Row statistics (L, D) are read, and L is written, by groups of consecutive rows per warp
  instruction (the kernel's thread mapping): 8 rows for fwd_fp16_v4's and fwd_fp32_v2's L store
  (lanes t = 0 of rows g) and bwd_fp16_v1's dQ kernel, 4 for fwd_fp32_v1's L store, 32 for the
  fp16 key-block kernels' L and D; each group is one request whose sectors are counted apart
  (rows past Nq are not touched).  The fp32 backwards' L and D are read by
  every warp along the keys of their first product (:func:`key_warps`), bwd_fp32_v1's 4
  consecutive rows a request, bwd_fp32_v2's 4 rows 2 apart (stated as the 16 bytes of the
  sector they fall in: exact when Nq % 8 == 0).
* fwd_fp32_v1 writes O, and bwd_fp32_v1 dK and dV, from registers by scalar stores: a warp's
  store covers 4 rows x 8 columns 4 apart, so the four stores of a row's 32 columns each touch
  the same 4 sectors (4x the sectors of the bytes).  fwd_fp32_v2 (with ``qsplit``, its default)
  reads Q the same way: a lane's 16-byte chunk (chunk e = tid + u·threads, row e // (d/4)) by
  4 scalar ``ld.global.f32`` (split into tf32 hi and lo on the way to shared memory), so each of
  the 4 loads of a warp touches the 16 sectors of its 32 chunks with 2 elements each (rows past
  Nq are not read); without ``qsplit`` Q is copied by cp.async as K and V are.  (The sm_90 SASS
  of its default shapes, d = 64 and 128, has these as 32-bit LDG.E and its L stores as
  32-bit STG.E: no access is widened by the compiler.)  The schedule states each such
  instruction as a pair of adjacent columns in the sector the kernel touches
  (:func:`_scalar_pairs`): elements and bytes exact, sectors exact for d % 8 == 0 (rows 32-byte
  aligned).  bwd_fp32_v2 stores dK and dV, and fwd_fp32_v2 without ``ostage`` O, an element
  per sector: one sector per element (fwd_fp32_v2: the store of (u, jj, f) by lane (g, t) is row
  g (+8) of an m-tile, column 32u + 8t + 4f + jj, so the 32 lanes write 8 rows x 4 sectors, one
  element each; bwd_fp32_v2: a lane's columns are 8 apart).  fwd_fp32_v2 with ``ostage`` (its
  default since 88f4ef8, kernels/data/fwd_fp32_v2_ostage_h200_88f4ef8/) stores O through shared
  memory, 16 bytes a thread a store: whole rows, as the fp16 forwards do.
* Reductions: bwd_fp16_v3's ``red.v2`` cover a row's 32 bytes per lane quad (whole rows in all);
  bwd_fp32_v1's ``red.v4`` a row's 32-column chunk per request (rows 4 apart: counted row by
  row); bwd_fp32_v2's ``red.v4`` 16 bytes in each of 4 sectors, two requests a sector (at d %
  8 == 4, rows 16-byte aligned, each request still within one sector).
* The elementwise launches (``zero_fill``, ``dq_to_f16``: grid-stride loops, a warp 32
  consecutive elements) are stated per query head: exact when a head's slice is a whole number
  of sectors (Nq·d·4 bytes a multiple of 32), else a sector two heads share counts twice.
* Loads are counted by their global addresses: the bytes the kernels copy, what HBM sees.  The
  kernels load tiles by cp.async (LDGSTS) into padded shared rows (fp16: d + 8 halves;
  fwd_fp32_v2's Q with ``qsplit`` is the exception, plain loads), which the LSU counts by the
  shared destination's sectors, 8 lanes at a time (measured by scripts/device/ldgsts_probe.sh:
  9/8 of these sectors for the fp16 kernels at d = 64 and 128); that count is
  ``analysis.fast_set.predict_lsu_loads`` (README, "The fast kernels"), not this schedule's.
* The scale <= 0 path (an extra elementwise pass over Q and over dQ) is not modelled.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..blocks import attach
from ..config import STAT_BYTES, Tiling, Workload, cdiv
from ..masking import visible_counts
from ..traffic import Launch, Schedule, TensorLayout, bulk_read, bulk_write, read, reduction, write
from ._common import (
    block_rows,
    classes,
    head_classes,
    layouts,
    per_kv_head_slices,
    per_query_head_slices,
    strip_reads,
)

PASSES = ("fwd", "bwd")
NEEDS_TILING = False
TILING_TEXT = "Br = {block_m}, Bc = {block_n} (the kernel's block shape)"
DESCRIPTION = ("the fast kernels of kernels/perf (--kernel VARIANT, default the one impl='auto' runs): "
               "their launches, tiles, re-loads and dQ atomics")
OPTIONS: dict[str, tuple[object, str]] = {
    "kernel": (None, "fast kernel variant (fwd_fp16_v4, fwd_fp16_v5, fwd_fp16_v7, fwd_fp32_v1, "
                     "fwd_fp32_v2, "
                     "bwd_fp16_v1, bwd_fp16_v3, bwd_fp32_v1, bwd_fp32_v2; the fp16 ones also take bf16); "
                     "default: the one kernels.flash_attention(impl='auto') runs for the pass, dtype and d"),
    "config": (None, "block-shape overrides of the kernel's default_config, as the kernels take them "
                     "(e.g. 'nw=1,mt=1,bc=16' or a dict): the tiles follow"),
    "sms": (None, "SM count of the GPU the kernel runs on (e.g. 132 on an H100): the fp16 forwards then "
                  "change their blocks for small grids as the kernel launchers do (fit_to_grid); "
                  "default: the default block shape"),
}

#: variant -> (pass, dtype): the first of the workload dtypes it takes (:data:`DTYPES`)
VARIANTS = {"fwd_fp16_v4": ("fwd", "fp16"), "fwd_fp16_v5": ("fwd", "fp16"), "fwd_fp16_v7": ("fwd", "fp16"),
            "fwd_fp32_v1": ("fwd", "fp32"),
            "fwd_fp32_v2": ("fwd", "fp32"),
            "bwd_fp16_v1": ("bwd", "fp16"), "bwd_fp16_v3": ("bwd", "fp16"),
            "bwd_fp32_v1": ("bwd", "fp32"), "bwd_fp32_v2": ("bwd", "fp32")}

#: variant -> the workload dtypes it takes: the fp16 kernels compile for bf16 too (same tiles,
#: loads and stores: the same schedule, 2-byte elements)
DTYPES = {name: ("fp16", "bf16") if dtype == "fp16" else (dtype,) for name, (_, dtype) in VARIANTS.items()}

#: Variants whose every access is stated with the kernel's request pattern (LSU sectors exact;
#: the fp32 kernels' scalar stores for d % 8 == 0, the fp32 L/D requests for Nq % 8 == 0).
LSU_EXACT = dict.fromkeys(VARIANTS, True)


# ---------------------------------------------------------------------------------------------
# The kernels' block shapes and selection, restated (kernels.perf's default_config and BEST)


def fwd_fp32_v2_dim(d: int) -> int:
    """The head dim fwd_fp32_v2 computes with (``kernels.perf.fwd_fp32.compute_dim_v2``): d rounded
    up to a multiple of 32, the columns past d zeros in shared memory that no global access touches."""
    return cdiv(d, 32) * 32


def bwd_fp32_v2_dim(d: int) -> int:
    """The head dim bwd_fp32_v2 computes with (``kernels.perf.bwd_fp32.padded_dim_v2``): d rounded
    up to 32, 64 or 128, the columns past d zeros in shared memory that no global access touches."""
    return 32 if d <= 32 else 64 if d <= 64 else 128


def default_config(name: str, d: int) -> dict:
    """The block-shape keys of ``kernels.perf.variant(name).default_config(d)`` (the tests hold
    them equal)."""
    if name == "fwd_fp16_v4":
        if d > 128:
            return dict(bc=32, nw=8, mt=1, qreg=True) if d > 192 else dict(bc=32, nw=8, mt=2, qreg=False)
        return dict(bc=64 if d <= 64 else 16 if 112 < d <= 128 else 32, nw=4, mt=2, qreg=True)
    if name == "fwd_fp16_v5":  # lpt: causal blocks longest first across heads (lpt_heads); splits: split-KV
        if d <= 64 or d > 192:
            return dict(bc=64, nw=8, mt=1, qreg=False, lpt=False, splits=1)
        return dict(bc=32 if 128 < d <= 160 else 64 if d <= 96 else 48, nw=4, mt=1, qreg=False, lpt=False,
                    splits=1)
    if name == "fwd_fp16_v7":
        return dict(default_config("fwd_fp16_v5", d), lpt=True) if d in (96, 112, 128) else dict(
            bc=64, nw=8, mt=1, qreg=False, lpt=True, splits=1)
    if name == "fwd_fp32_v1":
        return dict(bc=64, nw=4, rm=4, unroll=2, minb=2) if d <= 64 else dict(bc=32, nw=4, rm=4, unroll=2, minb=1)
    if name == "fwd_fp32_v2":
        return dict(bc=32, nw=4, mt=2 if d <= 64 else 1, ak=cdiv(d, 32), minb=1, qsplit=True, ostage=True,
                    qfrag=True)
    if name == "bwd_fp16_v1":
        return dict(bq=64, bk=64, nw=4, mt=1, reg=True) if d <= 64 else dict(bq=32, bk=32, nw=4, mt=1, reg=False)
    if name == "bwd_fp16_v3":
        pad = d % 16 != 0
        d = cdiv(d, 16) * 16  # d % 16 = 8 runs as d + 8
        if d in (32, 48, 64, 80):  # dQ by bulk reductions at d = 64
            return dict(bq=128, bk=128, nw=8, ma=4, mb=2, mc=2, minb=1, bulkq=d == 64, longest_first=True, qbuf=2)
        if d > 128:
            # phases B and C on two m-tiles where d % 32 == 0; one Q and dO buffer, which makes
            # room for dQ's tile (64 rows of d + 8 floats) in 227 KB: dQ by bulk reductions; but
            # at d = 232 and 248 (padded to 240, 256) dQ by red.v2 and two buffers (with bulkq
            # the block spills there: kernels.perf.bwd_fp16._wide_v3)
            two = d % 32 == 0
            spills = pad and d >= 240
            return dict(bq=64, bk=64, nw=8, ma=2, mb=2 if two else 1, mc=2 if two else 1, minb=1, bulkq=not spills,
                        longest_first=True, qbuf=2 if spills else 1)
        # d = 112 and 128: dQ by bulk reductions (their tile fits beside two Q/dO buffers)
        return dict(bq=64, bk=128, nw=8, ma=2, mb=4 if d == 128 else 2, mc=2 if d in (64, 128) else 1, minb=1,
                    bulkq=d >= 112, longest_first=True, qbuf=2)
    if name == "bwd_fp32_v1":
        nw = 4 if d <= 64 or 68 <= d <= 96 else 8
        return dict(bc=64, br=64, nw=nw, unroll=2, minb=1, vred=True)
    if name == "bwd_fp32_v2":  # d computed padded to 32, 64 or 128 (bwd_fp32.padded_dim_v2)
        dp = bwd_fp32_v2_dim(d)
        bc, br, nw = (64, 64, 8) if dp in (64, 128) else (32, 32, 2)
        return dict(bc=bc, br=br, nw=nw, minb=1, ak=dp // 32, swz=True, unr=True)
    raise ValueError(f"kernel={name!r}: one of {', '.join(VARIANTS)}")


def supports(name: str, dtype: str, d: int) -> bool:
    """``kernels.perf.variant(name).supports`` for a workload dtype ("fp16", "fp32", "bf16")."""
    if name not in VARIANTS:
        raise ValueError(f"kernel={name!r}: one of {', '.join(VARIANTS)}")
    if dtype not in DTYPES[name]:
        return False
    if name in ("fwd_fp16_v4", "bwd_fp16_v1"):
        return d % 8 == 0 and 8 <= d <= 256
    if name in ("fwd_fp16_v5", "fwd_fp16_v7"):
        return d % 8 == 0 and 8 <= d <= 256
    if name == "bwd_fp16_v3":
        return d % 8 == 0 and 16 <= d <= 256
    if name in ("fwd_fp32_v1", "bwd_fp32_v1", "bwd_fp32_v2"):  # bwd_fp32_v2 padded (bwd_fp32_v2_dim)
        return d % 4 == 0 and 4 <= d <= 128
    # fwd_fp32_v2: d padded on chip with zero columns (fwd_fp32_v2_dim)
    return d % 8 == 0 and 8 <= d <= 128


#: kernels.perf.BEST: (pass, dtype) -> (variant, smallest d, largest d) in order of preference
#: (bf16 runs the fp16 kernels, in the fp16 order).
BEST = {("fwd", "fp16"): (("fwd_fp16_v7", 64, 256), ("fwd_fp16_v4", 1, 1 << 30)),
        ("bwd", "fp16"): (("bwd_fp16_v3", 32, 256), ("bwd_fp16_v1", 1, 1 << 30)),
        ("fwd", "bf16"): (("fwd_fp16_v7", 64, 256), ("fwd_fp16_v4", 1, 1 << 30)),
        ("bwd", "bf16"): (("bwd_fp16_v3", 32, 256), ("bwd_fp16_v1", 1, 1 << 30)),
        ("fwd", "fp32"): (("fwd_fp32_v2", 8, 128), ("fwd_fp32_v1", 1, 1 << 30)),
        ("bwd", "fp32"): (("bwd_fp32_v2", 16, 128),
                           ("bwd_fp32_v1", 1, 1 << 30))}


def best(pass_: str, dtype: str, d: int) -> str | None:
    """The variant ``impl="auto"`` runs for this pass, dtype and head dim, or None."""
    for name, lo, hi in BEST.get((pass_, dtype), ()):
        if lo <= d <= hi and supports(name, dtype, d):
            return name
    return None


def variant_for(w: Workload, pass_: str, kernel: str | None = None) -> str:
    """The variant a pass runs: ``kernel`` (checked against the pass and the workload), or
    :func:`best`'s when it is None (ValueError when none applies)."""
    if kernel is not None:
        if not isinstance(kernel, str) or kernel not in VARIANTS:
            raise ValueError(f"kernel={kernel!r}: one of {', '.join(VARIANTS)}")
        if VARIANTS[kernel][0] != pass_:
            raise ValueError(f"kernel={kernel!r}: a {VARIANTS[kernel][0]} kernel, not a {pass_} one "
                             f"(pass_={VARIANTS[kernel][0]!r}, or no kernel for the default)")
        if not supports(kernel, w.dtype, w.d):
            raise ValueError(f"kernel={kernel!r}: does not take dtype={w.dtype!r} with head_dim={w.d}")
        return kernel
    name = best(pass_, w.dtype, w.d)
    if name is None:
        raise ValueError(f"dtype={w.dtype!r}, head_dim={w.d}: no fast {pass_} kernel takes it "
                         "(fp16 and bf16: d % 8 == 0 up to 256; fp32: d % 4 == 0 up to 128)")
    return name


#: Split-KV on small grids (:func:`fit_to_grid`): the most splits at d <= 64 and at 64 < d <= 128,
#: and the fewest key blocks a split keeps.
SPLITS_D64, SPLITS_D128, SPLIT_MIN_KEY_BLOCKS = 4, 2, 32
#: Most key splits the split-KV forward takes (``splits``: :func:`check_config_values`, which the
#: kernels' launcher calls too).
MAX_SPLITS = 64


def fit_to_grid(name: str, cfg: dict, given, nq: int, bh: int, num_sms: int, d: int, nk: int | None = None) -> dict:
    """The block shape ``name`` runs for Nq query rows and B·H heads on a GPU of ``num_sms`` SMs:
    ``cfg`` (:func:`default_config` updated by the keys in ``given``), except where a grid of
    128-row blocks would give each SM at most one block: then the fp16/bf16 forwards take 64-row
    blocks (twice the blocks), ``fwd_fp16_v4`` one m-tile a warp (unless ``mt`` is in ``given``),
    ``fwd_fp16_v5`` and ``fwd_fp16_v7`` one warpgroup (unless ``nw`` is).  On the H100: v4
    (kernels/data/fwd_fp16_v4_small_grid_h100_471379f) at B·H = 4, N = 4,096, d = 64 (128 blocks)
    1.9x faster, B·H = 1, N = 8,192, d = 128 (64 blocks) 1.15x, but with 256 blocks (B·H = 16,
    N = 2,048) 0.70x at d = 128, hence the bound at one block an SM; v5 at d = 64
    (kernels/data/fwd_fp16_v5_blocks_h100_532db74) at B·H = 4, N = 4,096 1.21x, while on the
    bench grid (2,048 blocks) two warpgroups stay as fast or faster (0.97-1.16x, median 1.04x).
    And v5 at d = 128 (one warpgroup, Bc = 48: three blocks an SM) takes Bc = 64 (two blocks) where
    its grid has at most four blocks an SM (unless ``bc`` is given): Bc = 48 won on every grid of
    4,096 blocks (``blocks2.csv`` there), but in one run (kernels/data/fwd_fp16_v5_bcrule_h100_460c9a6)
    at B·H = 1, N = 8,192 (128 blocks) it ran 0.89x SDPA flash where Bc = 64 ran 1.00x, and at
    Nq = 512, Nk = 4,096 (512 blocks) 1.09x where Bc = 64 ran 1.21x.  Not above d = 128 (``d``,
    the head dim): Bc = 64 there takes 123 KB of shared memory at d = 192, one block an SM,
    and ran 0.72x Bc = 48 (kernels/data/fwd_fp16_v5_wide_h100_1133a8a).  The kernel launcher
    (``kernels.perf``) calls it with the device's SM count.

    Then v5 and v7 split the keys (``splits``, unless given; ``nk``, the key count, given) where
    the grid of the blocks chosen so far still gives each SM at most one block, d <= 128: S = 4
    at d <= 64 and 2 above (``SPLITS_D64``, ``SPLITS_D128``; at d = 128 three splits
    leave 384 blocks for 264 places, two an SM), fewer where ⌈Tc/S⌉ would be under 32 for the Tc
    key blocks of Nk (``SPLIT_MIN_KEY_BLOCKS``; a causal query block sees fewer, and its splits get
    fewer), none below 2.  On an H200 at 5224174
    (kernels/data/fwd_fp16_v7_split_h200_5224174, ``kernels.perf.tune``, S = 1-4 in one run):
    B·H = 1, N = 8,192 (128 blocks of 64 rows, 128 key blocks each) d = 128 0.128 ms unsplit, S = 2
    0.107 (0.96x -> 1.15x SDPA flash; bf16 0.85x -> 1.16x; causal 0.95x -> 1.18x, S = 3 1.28x), d = 64
    0.095 ms, S = 4 0.071 (0.76x -> 1.01x); at 32 key blocks a block (B·H = 4, N = 2,048, d = 128) S = 2
    ran 0.056 ms for 0.036 (the partials' traffic and the second launch cost more than the split
    saves), hence the least split length.  The rule at d3e3777
    (kernels/data/fwd_fp16_v7_split_h200_d3e3777, unsplit and the rule alternated): B·H = 1, N =
    8,192, 4 pairs of 30 calls, d = 64 0.095-0.099 -> 0.070-0.072 ms, d = 128 0.122-0.136 ->
    0.104-0.126 ms; causal, 2 pairs of 10, d = 64 0.094-0.103 -> 0.064-0.065, d = 128 0.122 -> 0.102-0.103;
    at 64 key blocks (B·H = 2, N = 4,096), 2 pairs of 10, no gain either way (d = 64 0.050 and 0.051
    -> 0.050 and 0.059; d = 128 0.086 and 0.065 -> 0.069 and 0.069).

    And v5 and v7 keep grid order (``lpt`` off, unless given) where B·H exceeds the SM count: on an
    H200 at 994ad49 (kernels/data/fwd_fp16_v7_lpt_rule_h200_994ad49, causal, fp16, lpt off and on
    alternated, three pairs of 20 calls, the median of the pairs) ``lpt`` cost 7% and 9% at N = 512
    with B·H = 512 (d = 64 and 128), 13% at d = 96 (GQA 16:8), 4-5% at d = 96, N = 1,024, B·H = 256
    (GQA) and at d = 224, N = 576, B·H = 448, 1.5% at d = 128, N = 1,024, B·H = 256, and tied at d =
    64 there; with B·H <= 132 it gained 14% at d = 64, N = 1,024, B·H = 64 and 4% at N = 2,048, B·H
    = 128, and tied at d = 96, N = 512, B·H = 128 (as at 8a88e34: 2-15% at B·H = 16 and 64, N =
    1,024-16,384)."""
    given = given or ()

    def grid_blocks(c):  # the blocks of a grid of c's query blocks (Br = 16·nw·mt rows)
        br = 16 * c.get("nw", 0) * c.get("mt", 0)
        return -(-nq // br) * bh if br else 0

    blocks = grid_blocks(cfg)
    wg = name in ("fwd_fp16_v5", "fwd_fp16_v7")  # v7 (v5's loop, TMA copies): v5's rules, not timed apart
    out = cfg
    if wg and "bc" not in given and cfg.get("bc") == 48 and cfg.get("nw") == 4:
        if d <= 128 and blocks <= 4 * num_sms:  # above d = 128 Bc = 64 leaves one block an SM (d = 192: 0.72x)
            out = dict(cfg, bc=64)
    elif name == "fwd_fp16_v4" and "mt" not in given and cfg.get("mt") == 2:
        if blocks <= num_sms:
            out = dict(cfg, mt=1)
    elif wg and "nw" not in given and cfg.get("nw") == 8:
        if blocks <= num_sms:
            out = dict(cfg, nw=4)
    if wg and out.get("lpt") and "lpt" not in given and 0 < num_sms < bh:  # (0: the CUDA simulator)
        out = dict(out, lpt=False)
    if not wg or "splits" in given or nk is None or d > 128 or out.get("splits", 1) != 1:
        return out
    if grid_blocks(out) > num_sms:
        return out
    tc = -(-nk // out["bc"])
    s = SPLITS_D64 if d <= 64 else SPLITS_D128
    while s > 1 and -(-tc // s) < SPLIT_MIN_KEY_BLOCKS:
        s -= 1
    return dict(out, splits=s) if s > 1 else out


def _config_dict(config) -> dict:
    """A ``config`` option as a dict ({} for None; "key=value,..." with int and true/false values
    parsed); ValueError for anything else."""
    if config is None:
        return {}
    if isinstance(config, str):
        items = {}
        for part in filter(None, (x.strip() for x in config.split(","))):
            key, sep, val = part.partition("=")
            if not sep:
                raise ValueError(f"config={config!r}: want key=value pairs separated by commas")
            low = val.strip().lower()
            try:
                items[key.strip()] = {"true": True, "false": False}[low] if low in ("true", "false") else int(val)
            except ValueError:
                raise ValueError(f"config={config!r}: {key.strip()}={val!r} is not an integer or true/false") from None
        return items
    if not isinstance(config, dict):
        raise ValueError(f"config={config!r}: a dict or 'key=value,...'")
    return config


#: The L2 bytes a section of :func:`lpt_heads` may fill with K and V (FlashAttention's LPT tile
#: scheduler takes 50 MiB on every Hopper; kernels.perf._tiles.query_block's default too).
LPT_L2_BYTES = 50 << 20


def lpt_heads(nk: int, d: int, elem_bytes: int, group: int = 1, l2_bytes: int = LPT_L2_BYTES) -> int:
    """The query heads of a section of fwd_fp16_v5's and v7's causal grid with ``lpt``
    (``kernels.perf._tiles.query_block``, the same rule): the largest power of 2 of kv heads whose K
    and V (Nk rows of d elements each) fit in ``l2_bytes``, at least 1, times the ``group`` query
    heads a kv head.  The blocks of a section run longest first (query block Tr − 1 of every head
    of the section, then Tr − 2, ...), so that the longest blocks start in the first wave while the
    blocks in flight share the K and V of at most that many heads through the L2
    (FlashAttention's SingleTileLPTScheduler, whose L2 figure this is; the factor of the group is
    ours: a section holds its kv heads' query heads)."""
    fit = l2_bytes // max(1, nk * 2 * d * elem_bytes)
    big = 1
    while big * 2 <= fit:
        big *= 2
    return big * group


def lpt_order(tr: int, bh: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(query block, head) of each block of a (Tr, B·H) grid in issue order under :func:`lpt_heads`'s
    sections of ``heads`` query heads: block l is in section s = l // (heads·Tr), whose g heads
    (``heads``, fewer in the last) take query blocks Tr − 1, Tr − 2, ... in turn."""
    lin = np.arange(tr * bh, dtype=np.int64)
    sec = lin // (heads * tr)
    g = np.minimum(heads, bh - sec * heads)
    w = lin - sec * heads * tr
    x = w // g
    return tr - 1 - x, sec * heads + w - x * g


def longest_first_runs(bk: int, kv_blocks: int) -> bool:
    """Whether a causal launch of bwd_fp16_v3 with ``longest_first`` takes that order (else grid
    order; the kernels' launcher and this package's thread blocks both call this rule): with
    128 keys a block, or at most 32 kv heads x batch (``kv_blocks``).  In grid order the blocks
    in flight share their head's Q and dO through the L2; in longest-first order each streams its
    own, which a block of 64 keys (2.5·64 FLOPs a byte of Q and dO, under the H200's ridge of about
    200) cannot hide when many heads fill the machine, while with few heads grid order starts the
    longest blocks of the last heads in the last wave.  On an H200 (the same runs,
    kernels/data/bwd_fp16_v3_causal_order_h200_949102e, two rounds each) longest first took
    0.72-0.85x grid order's time at 12-16 kv blocks of 64 keys (d = 176, 192, 200), 0.90-0.97x at
    32-256 kv blocks of 128 keys (d = 64, 96, 128, N = 512-8,192; 0.97-1.02x at N = 1,024, d =
    64 and 128, and at 16,384), and 1.06-1.11x at 112-120 kv blocks of 64 keys (d = 224, N = 576
    and 1,088)."""
    return bk >= 128 or kv_blocks <= 32


def check_config_values(defaults: dict, config: dict) -> None:
    """ValueError naming the first key of ``config`` whose value is not of its default's kind: true
    or false (numpy bools too) for a flag, a positive integer (numpy integers too, not a bool)
    otherwise, ``splits`` at most :data:`MAX_SPLITS` and ``nw`` at most 32 warps.  Shared with the kernels' launchers
    (``kernels.perf._launch``)."""
    for key, val in config.items():
        if isinstance(defaults[key], bool):
            if not isinstance(val, bool | np.bool_):
                raise ValueError(f"config={config!r}: {key} must be true or false")
        elif isinstance(val, bool) or not isinstance(val, int | np.integer) or val < 1:
            raise ValueError(f"config={config!r}: {key} must be a positive integer")
        elif key == "splits" and val > MAX_SPLITS:
            raise ValueError(f"config={config!r}: splits={val} must be 1..{MAX_SPLITS}")
        elif key == "nw" and val > 32:
            raise ValueError(f"config={config!r}: nw={val}: at most 32 warps (1,024 threads) a block")


def parse_config(name: str, d: int, config=None) -> dict:
    """:func:`default_config` updated by ``config`` (a dict, or "key=value,..." with int and
    true/false values); ValueError for a key the variant does not take or a bad value."""
    cfg = default_config(name, d)
    if config is None:
        return cfg
    config = _config_dict(config)
    unknown = sorted(set(config) - set(cfg))
    if unknown:
        raise ValueError(f"config={config!r}: {name} takes {sorted(cfg)}, not {unknown}")
    check_config_values(cfg, config)
    cfg.update(config)
    return cfg


def tiles(name: str, d: int, config=None) -> dict:
    """The tiles of each launch of a variant, from its block shape (:func:`parse_config`): the
    forward's (Br, Bc); the backwards' key-block kernel (query rows a step, keys a block) and
    bwd_fp16_v1's dQ kernel."""
    c = parse_config(name, d, config)
    if name in ("fwd_fp16_v4", "fwd_fp16_v5", "fwd_fp16_v7"):
        return {"fwd": Tiling(16 * c["nw"] * c["mt"], c["bc"])}
    if name == "fwd_fp32_v1":
        return {"fwd": Tiling(4 * c["rm"] * c["nw"], c["bc"])}
    if name == "fwd_fp32_v2":
        return {"fwd": Tiling(16 * c["nw"] * c["mt"], c["bc"])}
    if name == "bwd_fp16_v1":
        rows = 16 * c["nw"] * c["mt"]
        return {"dkdv": Tiling(c["bq"], rows), "dq": Tiling(rows, c["bk"])}
    if name == "bwd_fp16_v3":
        return {"dkdv": Tiling(c["bq"], c["bk"])}
    return {"dkdv": Tiling(c["br"], c["bc"])}  # bwd_fp32_v1, v2


#: Query rows a block of the preprocess kernel (kernels.perf._launch.row_dots: the reference
#: kernel of kernels/flash2.py launched with Br = 64).
PREPROCESS_ROWS = 64


def block_resources(name: str, d: int, config=None) -> dict[str, tuple[int, int]]:
    """(threads, dynamic shared memory bytes) a block of each of the variant's kernels ("fwd"; the
    backwards' "dkdv", the key-block kernel, and bwd_fp16_v1's "dq"): 32 threads a warp, and the
    shared memory kernels.perf's launchers ask for (its ``smem_bytes`` functions, restated; every
    kernel's shared memory is dynamic, none is static; the tests hold them equal)."""
    c = parse_config(name, d, config)
    t = tiles(name, d, config)
    nt = 32 * c["nw"]
    dp = cdiv(d, 16) * 16  # kernels.flash2.padded_head_dim
    if name == "fwd_fp16_v4":
        br, bc = t["fwd"].block_m, t["fwd"].block_n
        return {"fwd": (nt, 2 * (dp + 8) * (br + 4 * bc))}
    if name in ("fwd_fp16_v5", "fwd_fp16_v7"):  # Q, K twice, V twice, unpadded
        # rows of whole swizzle atoms (32 columns where d % 64 is 1..32, else 64), 1 KiB to align
        # them; v7: two mbarriers of 16 bytes
        br, bc = t["fwd"].block_m, t["fwd"].block_n
        aw = atom_columns(d)
        bars = 32 if name == "fwd_fp16_v7" else 0
        return {"fwd": (nt, 2 * cdiv(d, aw) * aw * (br + 4 * bc) + 1024 + bars)}
    if name == "fwd_fp32_v1":  # row strides: Q/K dp + 4, V dp rounded up to 32, P̃ Bc + 8 floats
        br, bc = t["fwd"].block_m, t["fwd"].block_n
        return {"fwd": (nt, 4 * (br * (dp + 4) + bc * (dp + 4) + bc * cdiv(dp, 32) * 32 + br * (bc + 8)))}
    if name == "fwd_fp32_v2":  # Q as hi and lo fragments with qsplit, else rows of dp + 8 (dp: d to 32)
        dp = fwd_fp32_v2_dim(d)
        br, bc = t["fwd"].block_m, t["fwd"].block_n
        q = 2 * br * dp if c["qsplit"] else br * (dp + 8)
        return {"fwd": (nt, 4 * (q + bc * (dp + 8) + bc * (dp + 4)))}
    if name == "bwd_fp16_v1":
        s = dp + 8
        bq, keys = t["dkdv"].block_m, t["dkdv"].block_n
        rows, bk = t["dq"].block_m, t["dq"].block_n
        return {"dkdv": (nt, 2 * s * (2 * keys + 4 * bq) + 16 * bq), "dq": (nt, 2 * s * (2 * rows + 4 * bk) + 8 * rows)}
    bq, bk = t["dkdv"].block_m, t["dkdv"].block_n
    if name == "bwd_fp16_v3":  # rows of d rounded up to 16, plus 8; Q and dO in qbuf buffers each;
        s = dp + 8            # bulkq: dQ's tile, rows of d + 8 floats
        return {"dkdv": (nt, 2 * (2 * bk * s + 2 * c["qbuf"] * bq * s + 2 * bk * (bq + 8)) + 16 * bq
                         + (4 * bq * (d + 8) if c["bulkq"] else 0))}
    if name == "bwd_fp32_v1":  # row strides: dp + 4 floats; Pᵀ, dSᵀ Br rounded up to 32, + 4
        ps = cdiv(bq, 32) * 32 + 4
        return {"dkdv": (nt, 4 * (2 * bk * (dp + 4) + 2 * bq * (dp + 4) + 2 * bk * ps + 32))}
    dp = bwd_fp32_v2_dim(d)  # bwd_fp32_v2: rows of its padded head dim + 8
    return {"dkdv": (nt, 4 * (2 * (bk + bq) * (dp + 8) + 3 * bk * bq))}


# ---------------------------------------------------------------------------------------------
# Access helpers


def _groups(start: np.ndarray, size: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of rows [start, start + size) cut into groups of g rows (one request each):
    (first row, rows) of every group, empty groups dropped."""
    k = np.arange(-(-int(size.max()) // g) if size.size else 0, dtype=np.int64) * g
    s = (start[:, None] + k[None, :]).ravel()
    n = np.clip(size[:, None] - k[None, :], 0, g).ravel()
    keep = n > 0
    return s[keep], n[keep]


def _grouped(fn, name, start, size, g):
    """``fn`` (read or write) of the blocks' rows in requests of g rows, as grouped counts."""
    gs, gn = _groups(start, size, g)
    c = classes(gs, gn)
    return fn(name, c[0], c[1], repeat=c[2])


def _scalar_pairs(fn, name: str, start: np.ndarray, size: np.ndarray, d: int):
    """``fn`` (read or write) of whole rows by 4 scalar instructions a row chunk, a lane's 4
    columns 4 apart or adjacent, so that each instruction touches every 8-float sector of the
    row with 2 of its elements (see the module docstring): fwd_fp32_v1's O store, bwd_fp32_v1's
    dK, dV stores, fwd_fp32_v2's Q loads (qsplit).  Per row, for each instruction f < 4 and
    each sector σ, the n = [8σ+f < d] + [8σ+f+4 < d] elements it moves there, stated as the
    adjacent columns 8σ + 2f .. (+n) of that sector."""
    c = classes(start, size)
    for f in range(4):
        for sig in range(cdiv(d, 8)):
            n = int(8 * sig + f < d) + int(8 * sig + f + 4 < d)
            if n:
                col0 = 8 * sig + (2 * f if n == 2 else f)
                yield fn(name, c[0], c[1], col0, n, repeat=c[2])


def _per_element(fn, name: str, c, d: int):
    """``fn`` of the rows of classes ``c``, each element in a sector of its own (a request's lanes
    8 floats or more apart): column by column."""
    for col in range(d):
        yield fn(name, c[0], c[1], col, 1, repeat=c[2])


# ---------------------------------------------------------------------------------------------
# Schedules


def _meta(name, pass_, t: Tiling, extra=None):
    m = {"pass": pass_, "kernel": name, "block_m": t.block_m, "block_n": t.block_n, "lsu_exact": LSU_EXACT[name]}
    m.update(extra or {})
    return m


def _forward(w: Workload, name: str, config=None) -> Schedule:
    t = tiles(name, w.d, config)["fwd"]
    c = parse_config(name, w.d, config)
    if c.get("splits", 1) > 1:
        return _forward_split(w, name, t, c["splits"])
    qsplit, ostage = (c["qsplit"], c["ostage"]) if name == "fwd_fp32_v2" else (False, False)
    qfrag = qsplit and c["qfrag"]
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)
    lgroup = 4 if name == "fwd_fp32_v1" else 8
    names = ("Q", "K", "V", "O", "L")

    def counts():
        _, seen_by = visible_counts(w, t)
        qc = classes(q0, qn)
        kc = classes(k0, kn, seen_by)
        if qfrag:  # fwd_fp32_v2's split_q_frag: a request 8 rows x dims 2t (or 2t + 1) of one k-step
            for p in range(2):  # (per row, each 8-float sector by two requests, 4 floats each)
                for sig in range(cdiv(w.d, 8)):
                    yield read("Q", qc[0], qc[1], 8 * sig + 4 * p, 4, repeat=qc[2])
        elif qsplit:  # fwd_fp32_v2's split_q: 4 scalar loads of a lane's 16-byte chunk, 32 chunks a warp
            yield from _scalar_pairs(read, "Q", q0, qn, w.d)
        else:
            yield read("Q", qc[0], qc[1], repeat=qc[2])
        yield from _kv_reads(name, w.d, kc)
        if name in ("fwd_fp16_v4", "fwd_fp16_v5", "fwd_fp16_v7") or ostage:  # O through shared memory
            yield write("O", qc[0], qc[1], repeat=qc[2])
        elif name == "fwd_fp32_v1":
            yield from _scalar_pairs(write, "O", q0, qn, w.d)
        else:  # fwd_fp32_v2: lanes (g, t) store rows g (+8), columns 32u + 8t + 4f + jj
            yield from _per_element(write, "O", qc, w.d)
        yield _grouped(write, "L", q0, qn, lgroup)

    launch = Launch(name, w.bh, per_query_head_slices(w, names), counts, counts)
    return Schedule("fast", layouts(w, names), [launch], _meta(name, "fwd", t))


#: Threads of a block of the split-KV forward's combine launch, and the outputs each thread merges
#: (``kernels.perf.fwd_fp16`` takes both): block x holds a head's elements 1,024x .., thread t
#: elements 1,024x + 256k + t (k < 4), so a warp's instruction k moves 32 consecutive elements.
COMBINE_THREADS = 256
COMBINE_ELEMS = 4


def split_smem(d: int, br: int) -> int:
    """Shared memory of the split-KV epilogue (``kernels.perf.fwd_fp16.smem_bytes_split``): Br rows of
    d (to 16) + 8 floats from the 1024-aligned base, then v7's two mbarriers; the launch takes the
    larger of this and v5's or v7's own."""
    return 1024 + 4 * br * (cdiv(d, 16) * 16 + 8) + 32


def split_layouts(w: Workload, splits: int) -> dict[str, TensorLayout]:
    """The tensors of the split-KV forward: Q, K, V, L as always, O and the float32 partials Op
    (S·B·H slices, split z of head p in slice z·B·H + p) and Lp flat (Nq·d rows of one element: the
    combine reads and writes runs of 32 consecutive elements, which cross rows where d % 32 != 0;
    the same bytes and addresses as (Nq, d) rows)."""
    out = layouts(w, ("Q", "K", "V", "L"))
    out["O"] = TensorLayout("O", w.nq * w.d, 1, w.elem_bytes, w.bh)
    out["Op"] = TensorLayout("Op", w.nq * w.d, 1, STAT_BYTES, splits * w.bh)
    out["Lp"] = TensorLayout("Lp", w.nq, 1, STAT_BYTES, splits * w.bh)
    return out


def combine_warps(nq: int, d: int) -> dict[str, np.ndarray]:
    """The warp instructions of a head in the combine launch (output e of the head's Nq·d: row
    e // d, column e % d; instruction w moves e = 32w .. 32w + 31, those below Nq·d; a warp issues
    :data:`COMBINE_ELEMS` of them, 256 elements apart): the first flat element and the count of
    each instruction's run (Op reads, O writes), its rows (first, count: every lane reads its
    row's Lp_s, one request a split) and the rows whose column 0 it holds (their L; count 0 where
    none)."""
    n = nq * d
    e0 = np.arange(0, n, 32, dtype=np.int64)
    cnt = np.minimum(32, n - e0)
    ra, rb = e0 // d, (e0 + cnt - 1) // d
    la = -(-e0 // d)
    return {"e0": e0, "n": cnt, "row0": ra, "rows": rb - ra + 1, "l0": la, "ln": np.maximum(0, rb - la + 1)}


def atom_columns(d: int) -> int:
    """Columns of fwd_fp16_v5's and v7's swizzle atom (kernels.perf.fwd_fp16.swizzle_bytes / 2):
    32 where d % 64 is 1..32, else 64."""
    return 32 if 0 < d % 64 <= 32 else 64


def _kv_reads(name: str, d: int, kc) -> Iterator:
    """K_j and V_j of the key-block classes ``kc``: plain loads of whole rows, or for
    fwd_fp16_v7 the TMA unit's copies, one box of a swizzle atom's columns a row (the walker
    counts a bulk copy's rows apart, so a copy is stated at the width the unit copies)."""
    if name != "fwd_fp16_v7":
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        return
    aw = atom_columns(d)
    for t in ("K", "V"):
        for c0 in range(0, d, aw):
            yield bulk_read(t, kc[0], kc[1], c0, min(aw, d - c0), repeat=kc[2])


def _forward_split(w: Workload, name: str, t: Tiling, splits: int) -> Schedule:
    """fwd_fp16_v5 / v7 with ``splits`` = S > 1 (split-KV: ``kernels.perf.fwd_fp16``).  Main launch,
    grid (Tr, B·H, S): block (i, p, z) reads Q_i (every split, an empty one too), walks key blocks
    z·n_i//S .. (z+1)·n_i//S - 1 of the n_i its query block sees (K_j, V_j once per visible pair, as unsplit), and
    writes its float32 partial O_i (whole rows, 32 consecutive floats a warp) into Op slice
    z·B·H + p and L_i into Lp (8 rows a request); no O or L.  Combine launch (``fwd_combine``),
    grid (⌈Nq·d/1,024⌉, B·H): per warp instruction of a head (:func:`combine_warps`) and split, its rows of Lp
    (one request) and its run of Op; then its run of O and the L of the rows it starts."""
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)
    d = w.d
    lay = split_layouts(w, splits)
    names = tuple(lay)
    slices = per_query_head_slices(w, names)

    def main():
        _, seen_by = visible_counts(w, t)
        qc = classes(q0, qn)
        kc = classes(k0, kn, seen_by)
        oc = classes(q0 * d, qn * d)  # O_i's rows, flat
        gs, gn = _groups(q0, qn, 8)
        lc = classes(gs, gn)
        yield read("Q", qc[0], qc[1], repeat=splits * qc[2])
        yield from _kv_reads(name, w.d, kc)
        for z in range(splits):
            yield write("Op", oc[0], oc[1], slice_offset=z * w.bh, repeat=oc[2])
            yield write("Lp", lc[0], lc[1], slice_offset=z * w.bh, repeat=lc[2])

    def combine():
        cw = combine_warps(w.nq, d)
        rc = classes(cw["e0"], cw["n"])
        lpc = classes(cw["row0"], cw["rows"])
        has = cw["ln"] > 0
        lw = classes(cw["l0"][has], cw["ln"][has])
        for z in range(splits):
            yield read("Lp", lpc[0], lpc[1], slice_offset=z * w.bh, repeat=lpc[2])
            yield read("Op", rc[0], rc[1], slice_offset=z * w.bh, repeat=rc[2])
        yield write("O", rc[0], rc[1], repeat=rc[2])
        yield write("L", lw[0], lw[1], repeat=lw[2])

    launches = [Launch(name, w.bh, slices, main, main), Launch("fwd_combine", w.bh, slices, combine, combine)]
    return Schedule("fast", lay, launches, _meta(name, "fwd", t, {"splits": splits}))


def _preprocess(w: Workload, slices) -> Launch:
    """row_dots: the reference preprocess kernel (kernels/flash2.py, Br = 64): O_i, dO_i in, D_i out."""
    q0, qn = block_rows(w.nq, PREPROCESS_ROWS)

    def counts():
        qc = classes(q0, qn)
        yield from strip_reads("O", qc[0], qc[1], w.d, repeat=qc[2])
        yield from strip_reads("dO", qc[0], qc[1], w.d, repeat=qc[2])
        yield write("D", qc[0], qc[1], repeat=qc[2])

    return Launch("flash2_bwd_preprocess", w.bh, slices, counts, counts)


def _warp_grid(nw: int, rows: int, ur: int, cols: int, uc: int, cost, cap: int | None = None) -> tuple[int, int, int]:
    """kernels/perf/bwd_fp32.py's ``_warp_grid``: nw warps as wr x wc over a rows x cols tile in
    units ur x uc, the (wr, mr, mc) of lowest ``cost(mr, mc)`` (mr·mc <= cap)."""
    best_ = None
    for wr in range(1, nw + 1):
        if nw % wr or rows % (ur * wr) or cols % (uc * (nw // wr)):
            continue
        mr, mc = rows // (ur * wr), cols // (uc * (nw // wr))
        if cap is not None and mr * mc > cap:
            continue
        c = cost(mr, mc)
        if best_ is None or c < best_[0]:
            best_ = (c, wr, mr, mc)
    if best_ is None:
        raise ValueError(f"config: no tiling of a {rows} x {cols} tile by nw={nw} warps (units {ur} x {uc})")
    return best_[1:]


def key_warps(name: str, d: int, config=None) -> int:
    """Warps of the fp32 backwards' first product (Sᵀ, dPᵀ) along the keys: each of them reads
    the step's L and D (bwd_fp32_v1's ``WK1``, bwd_fp32_v2's ``WA``); 1 for the others."""
    c = parse_config(name, d, config)
    if name == "bwd_fp32_v1":
        return _warp_grid(c["nw"], c["bc"], 8, c["br"], 4, lambda x, y: (x + y) / (x * y))[0]
    if name == "bwd_fp32_v2":
        return _warp_grid(c["nw"], c["bc"], 16, c["br"], 8, lambda m, n: (4 * m + 2 * n) / (m * n), 4)[0]
    return 1


def _stat_requests(name: str, q0: np.ndarray, qn: np.ndarray):
    """(first row, rows, block) of the requests in which a key-block kernel reads a step's L (or
    D): the fp16 kernels' threads tid < Br read rows r0 + tid (requests of 32 rows); bwd_fp32_v1's
    lanes 4 consecutive rows (ly) a request; bwd_fp32_v2's lanes rows r0 + 8k + 2t + f (t < 4) a
    request, stated as rows 8k + 4f .. (as many as exist): the half of the 32-byte sector its 4
    elements fall in.  Rows past Nq are not read; empty requests are left out."""
    if name == "bwd_fp32_v2":
        k = np.arange(-(-int(qn.max()) // 8), dtype=np.int64) * 8
        blk = np.repeat(np.arange(len(q0)), len(k))
        starts, sizes, blocks = [], [], []
        for f in (0, 1):
            n = sum(((k[None, :] + f + 2 * i) < qn[:, None]).astype(np.int64) for i in range(4))
            # a block's last, partial group: its rows stated inside the block (within one sector
            # only when Nq % 8 == 0)
            starts.append(np.minimum(q0[:, None] + k[None, :] + 4 * f, (q0 + qn)[:, None] - n).ravel())
            sizes.append(n.ravel())
            blocks.append(blk)
        gs, gn, gb = np.concatenate(starts), np.concatenate(sizes), np.concatenate(blocks)
    else:
        g = 4 if name == "bwd_fp32_v1" else 32
        k = np.arange(-(-int(qn.max()) // g), dtype=np.int64) * g
        gs = (q0[:, None] + k[None, :]).ravel()
        gn = np.clip(qn[:, None] - k[None, :], 0, g).ravel()
        gb = np.repeat(np.arange(len(q0)), len(k))
    keep = gn > 0
    return gs[keep], gn[keep], gb[keep]


def _key_block(w: Workload, name: str, t: Tiling, slices, dq_red: str | None, config=None) -> Launch:
    """A key-block kernel (grid (Tc, B·Hkv)): K_j, V_j once; per query head of the group and query
    block i that sees j: Q_i, dO_i (whole rows), L_i, D_i (:func:`_stat_requests`, by each of
    :func:`key_warps` warps), and, with ``dq_red``, dQ_i reduced into that tensor; dK_j, dV_j
    once.  The fp32 kernels' reductions and dK/dV stores are stated per request: bwd_fp32_v1's
    red.v4 covers a row's 32-column chunk, its stores :func:`_scalar_pairs`'s pattern;
    bwd_fp32_v2's red.v4 16 bytes in each of 4 sectors (two requests a sector), its stores one
    element a sector."""
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)
    heads, per_head = head_classes(w.group)
    rep = key_warps(name, w.d, config)

    def per_step(fn, tensor, start, size, weight, col0=0, ncols=None):
        c = classes(start, size, weight)
        return fn(tensor, c[0][None, :], c[1][None, :], col0, ncols, slice_offset=heads,
                  repeat=per_head * c[2][None, :])

    def counts():
        sees, _ = visible_counts(w, t)
        kc = classes(k0, kn)
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        for tensor in ("Q", "dO"):
            yield per_step(read, tensor, q0, qn, sees)
        gs, gn, gb = _stat_requests(name, q0, qn)
        for tensor in ("L", "D"):
            yield per_step(read, tensor, gs, gn, rep * sees[gb])
        if dq_red is not None:
            if name == "bwd_fp16_v3":  # red.v2: a row's 32 bytes a lane quad, whole rows in all
                # (bulkq: the TMA unit's reduction of the same rows, one a row: class "bulk")
                bulkq = parse_config(name, w.d, config)["bulkq"]
                yield per_step(bulk_write if bulkq else reduction, dq_red, q0, qn, sees)
            elif name == "bwd_fp32_v1":  # red.v4: a row's 32-column chunk a request (rows 4 apart)
                rs = np.arange(w.nq, dtype=np.int64)  # the blocks cover rows 0 .. Nq-1 in order
                rw = sees[rs // t.block_m]
                for u in range(cdiv(w.d, 32)):
                    yield per_step(reduction, dq_red, rs, np.ones_like(rs), rw, 32 * u, min(32, w.d - 32 * u))
            else:  # bwd_fp32_v2: 16 bytes at 8t + 4h of each 32 columns, each its own sector
                for col in range(0, w.d, 4):
                    yield per_step(reduction, dq_red, q0, qn, sees, col, 4)
        if name == "bwd_fp32_v1":
            for tensor in ("dK", "dV"):
                yield from _scalar_pairs(write, tensor, k0, kn, w.d)
        elif name == "bwd_fp32_v2":
            for tensor in ("dK", "dV"):
                yield from _per_element(write, tensor, kc, w.d)
        else:
            yield write("dK", kc[0], kc[1], repeat=kc[2])
            yield write("dV", kc[0], kc[1], repeat=kc[2])

    return Launch(name if dq_red is not None else f"{name}_dkdv", w.batch * w.hkv, slices, counts, counts)


def _dq_v1(w: Workload, t: Tiling, slices) -> Launch:
    """bwd_fp16_v1's dQ kernel: Q_i, dO_i once; L_i, D_i by the lanes' rows (requests of 8 rows);
    K_j, V_j per visible key block; dQ_i (fp16) once."""
    q0, qn = block_rows(w.nq, t.block_m)
    k0, kn = block_rows(w.nk, t.block_n)

    def counts():
        _, seen_by = visible_counts(w, t)
        qc = classes(q0, qn)
        kc = classes(k0, kn, seen_by)
        yield read("Q", qc[0], qc[1], repeat=qc[2])
        yield read("dO", qc[0], qc[1], repeat=qc[2])
        yield _grouped(read, "L", q0, qn, 8)
        yield _grouped(read, "D", q0, qn, 8)
        yield read("K", kc[0], kc[1], repeat=kc[2])
        yield read("V", kc[0], kc[1], repeat=kc[2])
        yield write("dQ", qc[0], qc[1], repeat=qc[2])

    return Launch("bwd_fp16_v1_dq", w.bh, slices, counts, counts)


def _elementwise(name: str, w: Workload, slices, reads: tuple[str, ...], writes: tuple[str, ...]) -> Launch:
    """A grid-stride elementwise kernel over B·H·Nq·d elements (zero fill, fp32 -> fp16): each
    element read and/or written once, a warp 32 consecutive elements; stated per query head."""

    def counts():
        for tensor in reads:
            yield read(tensor, 0, w.nq)
        for tensor in writes:
            yield write(tensor, 0, w.nq)

    return Launch(name, w.bh, slices, counts, counts)


_BWD_TENSORS = ("Q", "K", "V", "O", "L", "D", "dO", "dQ", "dK", "dV")


def _backward(w: Workload, name: str, config=None) -> Schedule:
    tl = tiles(name, w.d, config)
    t = tl["dkdv"]
    tensors = layouts(w, _BWD_TENSORS)
    qs = per_query_head_slices(w, _BWD_TENSORS + ("dQacc",))
    ks = per_kv_head_slices(w, _BWD_TENSORS + ("dQacc",))
    launches = [_preprocess(w, qs)]
    extra = {}
    if name == "bwd_fp16_v1":
        launches += [_key_block(w, name, t, ks, None, config), _dq_v1(w, tl["dq"], qs)]
        extra = {"dq_block_m": tl["dq"].block_m, "dq_block_n": tl["dq"].block_n}
    elif name == "bwd_fp16_v3":
        tensors["dQacc"] = TensorLayout("dQacc", w.nq, w.d, STAT_BYTES, w.bh)
        launches += [_elementwise("zero_fill", w, qs, (), ("dQacc",)), _key_block(w, name, t, ks, "dQacc", config),
                     _elementwise("dq_to_f16", w, qs, ("dQacc",), ("dQ",))]
    else:  # fp32: the atomics add into dQ itself
        launches += [_elementwise("zero_fill", w, qs, (), ("dQ",)), _key_block(w, name, t, ks, "dQ", config)]
    return Schedule("fast", tensors, launches, _meta(name, "bwd", t, extra))


def _config(w: Workload, name: str, options: dict):
    """The ``config`` option, narrowed by :func:`fit_to_grid` where the ``sms`` option is given."""
    config = options.get("config")
    sms = options.get("sms")
    if sms is None:
        return config
    if isinstance(sms, bool) or not isinstance(sms, int | np.integer) or sms < 1:
        raise ValueError(f"sms={sms!r}: must be a positive integer")
    if VARIANTS[name][0] != "fwd":
        return config
    return fit_to_grid(name, parse_config(name, w.d, config), _config_dict(config), w.nq, w.bh, int(sms), d=w.d,
                       nk=w.nk)


def schedule(w: Workload, tiling: Tiling | None, pass_: str, **options) -> Schedule:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: not modelled")
    name = variant_for(w, pass_, _kernel(options))
    config = _config(w, name, options)
    sched = _forward(w, name, config) if pass_ == "fwd" else _backward(w, name, config)
    return attach(sched, "fast", w, None, plan=config)


def _kernel(options: dict):
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise ValueError(f"options={extra}: fast takes only {sorted(OPTIONS)}")
    return options.get("kernel")


# ---------------------------------------------------------------------------------------------
# Closed forms (elements; no loop over tiles)


def _q_rows_dkdv(w: Workload, t: Tiling) -> int:
    """Σ over key blocks j of the query rows a query head loads for j (flash2's formula)."""
    from .flash2 import _q_rows_read_dkdv

    return _q_rows_read_dkdv(w, t)


def _kv_rows_fwd(w: Workload, t: Tiling) -> int:
    from .flash2 import _kv_rows_read_fwd

    return _kv_rows_read_fwd(w, t)


def closed_form(w: Workload, tiling: Tiling | None, pass_: str, **options) -> dict[tuple[str, str], int]:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: not modelled")
    name = variant_for(w, pass_, _kernel(options))
    config = _config(w, name, options)
    bh, d, nq = w.bh, w.d, w.nq
    if pass_ == "fwd":
        t = tiles(name, d, config)["fwd"]
        kv = bh * _kv_rows_fwd(w, t) * d
        how = "bulk_read" if name == "fwd_fp16_v7" else "read"  # v7: the TMA unit's copies
        out = {("Q", "read"): bh * nq * d, ("K", how): kv, ("V", how): kv,
               ("O", "write"): bh * nq * d, ("L", "write"): bh * nq}
        s = parse_config(name, d, config).get("splits", 1)
        if s > 1:  # split-KV: Q read by every split; the partials written, then read by the combine
            cw = combine_warps(nq, d)
            out[("Q", "read")] *= s
            out[("Op", "write")] = out[("Op", "read")] = s * bh * nq * d
            out[("Lp", "write")] = s * bh * nq
            out[("Lp", "read")] = s * bh * int(cw["rows"].sum())
        return out
    tl = tiles(name, d, config)
    q_rows = _q_rows_dkdv(w, tl["dkdv"])  # per query head
    rep = key_warps(name, d, config)  # warps that read each step's L and D
    kv_once = w.batch * w.hkv * w.nk * d
    out = {("O", "read"): bh * nq * d, ("dO", "read"): bh * (nq + q_rows) * d, ("D", "write"): bh * nq,
           ("Q", "read"): bh * q_rows * d, ("L", "read"): bh * q_rows * rep, ("D", "read"): bh * q_rows * rep,
           ("K", "read"): kv_once, ("V", "read"): kv_once, ("dK", "write"): kv_once, ("dV", "write"): kv_once}
    if name == "bwd_fp16_v1":
        kv = bh * _kv_rows_fwd(w, tl["dq"]) * d
        out[("Q", "read")] += bh * nq * d
        out[("dO", "read")] += bh * nq * d
        out[("L", "read")] += bh * nq
        out[("D", "read")] += bh * nq
        out[("K", "read")] += kv
        out[("V", "read")] += kv
        out[("dQ", "write")] = bh * nq * d
    else:
        acc = "dQacc" if name == "bwd_fp16_v3" else "dQ"
        out[(acc, "write")] = bh * nq * d  # the zero fill
        # bwd_fp16_v3's bulkq: the same rows reduced by the TMA unit (a bulk write)
        red = "bulk_write" if name == "bwd_fp16_v3" and parse_config(name, d, config)["bulkq"] else "reduction"
        out[(acc, red)] = bh * q_rows * d
        if name == "bwd_fp16_v3":
            out[("dQacc", "read")] = bh * nq * d
            out[("dQ", "write")] = bh * nq * d
    return out


def flop_tiling(w: Workload, pass_: str, kernel: str | None = None, config=None, sms=None) -> Tiling:
    """The tiles whose computed score entries the pass's FLOPs count (flashsim.flops: flash2's
    model): the forward's, or the backward key-block kernel's (``sms``: the option of that name)."""
    name = variant_for(w, pass_, kernel)
    t = tiles(name, w.d, _config(w, name, {"config": config, "sms": sms}))
    return t.get("fwd", t.get("dkdv"))


# ---------------------------------------------------------------------------------------------
# The registry's hooks


def plan(w: Workload, sram_elems: int | None = None, tiling: Tiling | None = None, **options) -> tuple[None, dict]:
    """The kernels fix their own tiles: no M rule, no tiling."""
    if tiling is not None:
        raise ValueError("tiling: the fast kernels run their own block shapes (kernels.perf default_config); "
                         "give no block sizes")
    return None, dict(options)


def blocks(w: Workload, tiling: Tiling | None, **options) -> tuple[int | None, int | None]:
    """(block_m, block_n) of the forward variant's tiles, else of the backward key-block kernel's."""
    kernel = options.get("kernel")
    pass_ = VARIANTS[kernel][0] if kernel in VARIANTS else "fwd"
    try:
        name = variant_for(w, pass_, kernel)
    except ValueError:
        return None, None
    t = tiles(name, w.d, _config(w, name, options))
    t = t.get("fwd", t.get("dkdv"))
    return t.block_m, t.block_n


__all__ = ["schedule", "closed_form", "plan", "blocks", "TILING_TEXT", "PASSES", "NEEDS_TILING", "DESCRIPTION",
           "OPTIONS", "VARIANTS", "BEST", "best", "default_config", "parse_config", "supports", "tiles",
           "variant_for", "flop_tiling", "block_resources", "PREPROCESS_ROWS", "fit_to_grid"]
