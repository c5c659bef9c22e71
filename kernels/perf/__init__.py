"""The fast kernels: one module per pass and precision (``fwd_fp16``, ``bwd_fp16``, ``fwd_fp32``,
``bwd_fp32``), llm.c style: each holds that op's numbered versions, sharing device code and
differing by what each changed, its header saying what changed and what it measured.
``kernels/perf/NOTES.md`` keeps the predictions and outcomes in order, and the versions that
have left the tree with the commit where each is read.

A variant keeps the name the records use (``fwd_fp16_v4``, ``bwd_fp32_v2``: ``kernels/data``,
:data:`BEST`): :func:`variant` (or ``from kernels.perf import fwd_fp16_v4``) gives its interface,
``forward`` or ``backward`` and ``saved_forward``, ``supports``, ``default_config``, ``kernel``
and ``SOURCES`` (for :mod:`kernels.perf.inspect`).

:func:`best` names the variant the public API (``kernels.flash_attention(impl="auto")``) uses for
a pass and dtype; the readable reference kernels (``kernels/flash2.py``) stay the ones whose
traffic counters are held against the simulator.
"""

from __future__ import annotations

import importlib

#: (pass, dtype) -> the fastest variants that passed the exactness suite, as (variant, smallest d,
#: largest d) in order of preference: the first whose range holds d and whose ``supports`` accepts
#: it runs.  The fp16/bf16 forward takes fwd_fp16_v7 (v5, Hopper's warpgroup products, with K
#: and V copied by the TMA unit) at d = 64 to 256: on the H100 at N = 4,096, B·H = 64 1.10-1.69x
#: fwd_fp16_v5 in the same runs at every d from 64 to 256 in steps of 8, 1.19-2.32x SDPA flash
#: (kernels/data/fwd_fp16_v7_h100: ``sweep_2wg.csv``, and ``grid_final.csv`` at d = 96, 112, 128,
#: where v7 takes v5's blocks), and on the bench grid (N 1,024-16,384, d = 64 and 128, fp16 and
#: bf16, causal or not: kernels/data/bench_fwd_v7_2eb1598) 1.02-1.23x v5 and 1.21-1.57x SDPA
#: flash on all 40 rows, before ``lpt`` (since aa2c859 its causal blocks run longest first across
#: heads: 0.86-0.96x the time at d = 64 and 128 on an H200, 0.99-1.02x at N = 16,384, B·H = 64;
#: NOTES.md);
#: v5 had taken it from fwd_fp16_v4 (at
#: d = 64 and 128 1.06-1.47x v4 on each of the 49 shapes of the H100 bench:
#: kernels/data/bench_fwd_v5_20cf9ec).  v4 below d = 64
#: (at d = 40 v4 1.48x flash, v5 1.44x: a tie; v7 not timed there).  The fp16
#: backward takes bwd_fp16_v3 at d = 32 to 256 in steps of 8 (d % 16 = 8 as d + 8 in shared memory: d = 72
#: and 200 1.09x and 1.07x SDPA flash where v1 ran 0.79x and 0.61x; 1.4x bwd_fp16_v1 at d = 128 on the H100,
#: at d = 64 faster since its loop stopped dividing by the block count, at d = 48-112 0.97-1.9x and
#: at 160-256 1.27-2.55x by their ratios to SDPA flash: NOTES.md; at d = 32 and 40 1.03x and 1.21x
#: flash where v1 ran 0.75x and 0.91x: kernels/data/hdim_sweep_h100_17772c5; it runs at d = 16 and 24
#: too, not timed against v1), v1
#: elsewhere and where the caller asks for a deterministic backward (v3's dQ is summed by
#: atomics: :data:`ATOMIC`).  The fp32 backward takes bwd_fp32_v2 (3xTF32 on the tensor cores, as
#: accurate as v1's FFMA) at every d % 4 == 0 from 16 to 128 (padded on chip to 32, 64 or 128;
#: with its loops two k-steps an iteration, H200 at N = 4,096: 1.04x naive fp32 at d = 128, 1.23x
#: at 64, 0.99x and 1.02x at 80 and 112 where v1 runs 0.74-0.75x, 1.77x and 1.19x at 16 and 40
#: where v1 runs 1.60x and 1.14x; kernels/data/bwd_fp32_v2_unr_h200_250bb44; at d % 8 == 4 1.18x
#: and 0.99x at d = 44 and 100 where v1 runs 1.10x and 0.76x: kernels/data/bwd_fp32_v2_d4_h200_f840550),
#: v1 at d = 4, 8 and 12: at d = 8 v1 1.77x naive, v2 1.73x; the fp32 forward
#: takes fwd_fp32_v2 (3xTF32, 1.55-2.1x naive fp32 and 1.33-1.69x v1 on the H100, as accurate)
#: at every d % 8 == 0 up to 128 (padded on chip to a multiple of 32: 1.09-1.57x v1 at d = 40, 80
#: and 112 on the H200, kernels/data/fwd_fp32_v2_pad_h200_f93c02a), v1 elsewhere.  bf16 runs the
#: fp16 kernels compiled for bf16 (``bf16=True``), in the fp16 order (timed on the H100 beside fp16:
#: kernels/data/bench_h100.csv).
BEST = {("fwd", "float16"): (("fwd_fp16_v7", 64, 256), ("fwd_fp16_v4", 1, 1 << 30)),
        ("bwd", "float16"): (("bwd_fp16_v3", 32, 256), ("bwd_fp16_v1", 1, 1 << 30)),
        ("fwd", "bfloat16"): (("fwd_fp16_v7", 64, 256), ("fwd_fp16_v4", 1, 1 << 30)),
        ("bwd", "bfloat16"): (("bwd_fp16_v3", 32, 256), ("bwd_fp16_v1", 1, 1 << 30)),
        ("fwd", "float32"): (("fwd_fp32_v2", 8, 128), ("fwd_fp32_v1", 1, 1 << 30)),
        ("bwd", "float32"): (("bwd_fp32_v2", 16, 128),
                              ("bwd_fp32_v1", 1, 1 << 30))}


#: Every variant in the tree -> the module that holds it.
VARIANTS = {"fwd_fp16_v3": "fwd_fp16", "fwd_fp16_v4": "fwd_fp16", "fwd_fp16_v5": "fwd_fp16",
            "fwd_fp16_v7": "fwd_fp16",
            "fwd_fp32_v1": "fwd_fp32",
            "fwd_fp32_v2": "fwd_fp32",
            "bwd_fp16_v1": "bwd_fp16", "bwd_fp16_v3": "bwd_fp16",
            "bwd_fp32_v1": "bwd_fp32", "bwd_fp32_v2": "bwd_fp32"}


def variant(name: str):
    """The interface of the variant the records call ``name`` (ValueError for an unknown one)."""
    if name not in VARIANTS:
        raise ValueError(f"variant={name!r}: one of {', '.join(sorted(VARIANTS))}")
    mod = importlib.import_module(f"{__name__}.{VARIANTS[name]}")
    return mod.VERSIONS[name]


def __getattr__(name: str):
    if name in VARIANTS:
        return variant(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_BEST: dict = {}


#: The variants that sum dQ by float32 atomic adds (in no fixed order: its last bits may differ from
#: run to run); ``best(..., deterministic=True)`` passes them over.
ATOMIC = frozenset({"bwd_fp16_v3", "bwd_fp32_v1", "bwd_fp32_v2"})


def best(pass_: str, dtype, d: int, deterministic: bool = False):
    """The fastest variant for this pass, dtype and head dim (its :func:`variant`), or None if
    none applies (``deterministic``: none of :data:`ATOMIC`); remembered per (pass, dtype, d,
    deterministic), as every attention call asks."""
    from .._arrays import dtype_name

    key = (pass_, dtype_name(dtype), d, bool(deterministic))
    if key in _BEST:
        return _BEST[key]
    found = None
    for name, lo, hi in BEST.get(key[:2], ()):
        if deterministic and name in ATOMIC:
            continue
        if lo <= d <= hi:
            v = variant(name)
            if v.supports(dtype, d):
                found = v
                break
    if len(_BEST) < 4096:
        _BEST[key] = found
    return found
