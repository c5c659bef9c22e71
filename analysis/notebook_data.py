"""Where the notebooks find committed measurements, and whether they have landed yet.

Every path can be overridden by an environment variable, so a notebook can be run against a
scratch copy of the data before it is committed (``FLASHSIM_H200_CSV=/tmp/h200.csv``).

The H200 files are the primary record of traffic and exactness: the Nsight Compute measurement
of the current kernels (``h200``) and the kernels' exactness at realistic sizes
(``exactness``).  ``h100`` is an earlier traffic measurement at an older commit, kept for its
DRAM level on a GPU with a smaller L2 (analysis/data/README.md says what differs).  The timings
beside torch's attention (``bench``) are the H100's, the GPU the performance targets name
(``kernels/data/bench_h200.csv`` keeps an earlier run on an H200).  The GPT-2 end-to-end training
record (``gpt2``, ``gpt2_losses``: ``benchmarks/gpt2_train.py``) is the H100's too.
``h200_compare`` and ``h100_compare`` are the committed per-launch comparisons of the two traffic
records with the simulator (``flashsim compare DATA --out analysis/data/GPU/compare --force``),
which notebook 04 reads instead of recomputing the L2 model (about 40 s a record).
``fig2_h100`` (with ``fig2_h100_timing``), ``dsweep_h100``, ``exactness_spread`` (and
``exactness_long``) and ``gpt2_medium`` are the H100 measurements of ``scripts/device/nb_measure.sh`` (notebooks 02, 04,
05 and 06), ``fig2_fast_h100`` that of ``scripts/device/fig2_fast.py`` (notebook 02); until they land the
notebooks say "not yet measured" and draw nothing from them.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from flashsim import config

ROOT = Path(__file__).resolve().parent.parent

#: name -> (environment variable, path relative to the repository root)
DATA = {
    "h200": ("FLASHSIM_H200_CSV", "analysis/data/h200/h200.csv"),
    "h100": ("FLASHSIM_H100_CSV", "analysis/data/h100/h100.csv"),
    "exactness": ("FLASHSIM_EXACTNESS_JSON", "kernels/data/h200_exactness.json"),
    "bench": ("FLASHSIM_BENCH_CSV", "kernels/data/bench_h100.csv"),
    "v7_sweep": ("FLASHSIM_V7_SWEEP_CSV", "kernels/data/fwd_fp16_v7_h100/sweep_2wg.csv"),
    "v7_sweep_v5blocks": ("FLASHSIM_V7_SWEEP_V5BLOCKS_CSV", "kernels/data/fwd_fp16_v7_h100/sweep_v5blocks.csv"),
    "v7_grid": ("FLASHSIM_V7_GRID_CSV", "kernels/data/fwd_fp16_v7_h100/grid_final.csv"),
    "gpt2": ("FLASHSIM_GPT2_CSV", "kernels/data/gpt2_train_h100.csv"),
    "gpt2_losses": ("FLASHSIM_GPT2_LOSSES_CSV", "kernels/data/gpt2_train_h100_losses.csv"),
    "calibration": ("FLASHSIM_CALIBRATION_CSV", "tests/data/ncu_raw_calibrate.csv"),
    "h200_compare": ("FLASHSIM_H200_COMPARE_CSV", "analysis/data/h200/compare/compare_launches.csv"),
    "h100_compare": ("FLASHSIM_H100_COMPARE_CSV", "analysis/data/h100/compare/compare_launches.csv"),
    # the measurements of issue 22 (scripts/device/nb_measure.sh, analysis/nb_measure.py), on an H100
    "fig2_h100": ("FLASHSIM_FIG2_CSV", "analysis/data/h100/fig2/fig2_h100.csv"),
    "fig2_h100_timing": ("FLASHSIM_FIG2_TIMING_CSV", "analysis/data/h100/fig2/fig2_h100.timing.csv"),
    # the same figure on the fast forward (scripts/device/fig2_fast.py)
    "fig2_fast_h100": ("FLASHSIM_FIG2_FAST_CSV", "analysis/data/h100/fig2/fig2_fast_h100.csv"),
    "dsweep_h100": ("FLASHSIM_DSWEEP_CSV", "analysis/data/h100/dsweep/dsweep_h100.csv"),
    "exactness_spread": ("FLASHSIM_EXACTNESS_SPREAD_CSV", "kernels/data/h100_exactness_spread.csv"),
    "exactness_long": ("FLASHSIM_EXACTNESS_LONG_CSV", "kernels/data/h100_exactness_long.csv"),
    "gpt2_medium": ("FLASHSIM_GPT2_MEDIUM_CSV", "kernels/data/gpt2_medium_attention_h100.csv"),
    # decoding (issue 19, notebook 08): python -m kernels.bench_decode, and flashsim measure --set decode
    # with its comparison (flashsim compare analysis/data/h100/decode/decode.csv --out .../compare)
    "bench_decode": ("FLASHSIM_BENCH_DECODE_CSV", "kernels/data/bench_decode_h100.csv"),
    "decode_h100_compare": ("FLASHSIM_DECODE_COMPARE_CSV", "analysis/data/h100/decode/compare/compare_launches.csv"),
}


def data_path(name: str) -> Path:
    """The path of a named data file (whether or not it exists)."""
    if name not in DATA:
        raise ValueError(f"name={name!r}: unknown data file; choose one of {sorted(DATA)}")
    env, rel = DATA[name]
    return Path(os.environ.get(env) or ROOT / rel)


def find(name: str) -> Path | None:
    """The data file if it has been recorded, else None (and one line saying so is printed)."""
    p = data_path(name)
    if p.exists():
        return p
    print(f"{name}: not yet recorded ({p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} is absent)")
    return None


def load_json(name: str) -> dict | None:
    p = find(name)
    return None if p is None else json.loads(p.read_text())


def _typed(value: str):
    """A CSV field as the value ``analysis.compare`` wrote: bool, int, float, None ("") or str."""
    if value in ("True", "False"):
        return value == "True"
    if value == "":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def load_csv(name: str) -> list[dict] | None:
    """The rows of a committed CSV, typed as :func:`load_compare` types them, or None (and one
    line saying so) if it has not been recorded."""
    p = find(name)
    if p is None:
        return None
    with open(p, newline="") as f:
        return [{k: _typed(v) for k, v in row.items()} for row in csv.DictReader(f)]


def load_compare(name: str) -> list[dict] | None:
    """The per-launch records of a committed comparison (``flashsim compare DATA --out DIR``
    writes ``DIR/compare_launches.csv``), typed as :func:`analysis.compare.compare` returns them,
    or None if it has not been written."""
    p = find(name)
    if p is None:
        return None
    with open(p, newline="") as f:
        return [{k: _typed(v) for k, v in row.items()} for row in csv.DictReader(f)]


def preset_of(gpu_name: str) -> str:
    """The flashsim GPU preset (``flashsim.config.GPUS``) of a GPU as a data file's provenance
    names it, e.g. "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100-80gb"."""
    preset = config.preset_of(gpu_name)
    if preset is None:
        raise ValueError(f"{gpu_name!r}: no flashsim GPU preset for this GPU")
    return preset


def load_meta(name: str) -> dict:
    """The provenance recorded beside a data file (``NAME.meta.json`` next to ``NAME.csv``), or
    the JSON file's own ``provenance`` entry; {} if there is none."""
    p = data_path(name)
    if p.suffix == ".json":
        return json.loads(p.read_text()).get("provenance", {}) if p.exists() else {}
    meta = p.with_name(p.stem + ".meta.json")
    return json.loads(meta.read_text()) if meta.exists() else {}


__all__ = ["ROOT", "DATA", "data_path", "find", "load_json", "load_meta", "load_csv", "load_compare", "preset_of"]
