"""Run a configuration set under Nsight Compute and record the data with its provenance.

    flashsim measure --set h200 --out DIR          (the same as: python -m analysis.measure ...)

writes a *record* of three files into ``DIR``: ``<set>.csv`` (one row per kernel launch:
configuration, kernel, the ncu metrics), ``<set>.meta.json`` (GPU, driver, CUDA, ncu, numba-cuda,
numpy and torch versions, date, the git commit of this package's repository and whether its
tracked files had uncommitted changes, the exact ncu command and cache policy) and
``<set>.ncu-raw.csv`` (ncu's own CSV).

A record is never damaged.  ncu exports into a staging folder inside ``DIR`` and the three files
are moved into place together only once the measurement is complete (:mod:`flashsim.output`):
if ncu fails, or the worker, or the reader, ``DIR`` keeps the record it had, byte for byte.  A
folder that already holds a record of the set is refused unless ``force``, and the default
``DIR`` is ``out/measure-<set>`` (ignored by git), never the committed ``analysis/data/``.

On a machine without a GPU or without ncu it stops with one line saying what is missing.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from flashsim.output import check_overwrite, staged
from flashsim.provenance import git_state

from .configs import DECODE_FIELDS, FAST_FIELDS
from .ncu import METRICS, OPTIONAL_METRICS, available_metrics, ncu_command, parse_raw_csv, split_by_marker

CONFIG_FIELDS = ("kernel", "pass", "batch", "heads", "kv_heads", "seq_len_q", "seq_len_k", "head_dim", "dtype",
                 "causal", "block_m", "block_n", "sram_bytes", "gemm_block")
METRIC_FIELDS = ("lsu_ld_bytes", "lsu_st_bytes", "l2_read_sectors", "l2_write_sectors", "dram_read_bytes",
                 "dram_write_bytes", "time_ns")

#: Where a measurement goes unless told: a scratch folder that git ignores, never the record in
#: analysis/data/ (copy a checked record there by hand).
DEFAULT_OUT = "out/measure-{set}"

#: The root of the repository this package was loaded from: its commit is the code that ran,
#: whatever the current folder is when ``measure`` runs.


class MeasureError(RuntimeError):
    """A measurement that could not be made or completed (nothing was written)."""


class MissingTool(MeasureError):
    """This machine cannot measure: no ncu, or no NVIDIA GPU."""


def record_files(name: str) -> tuple[str, str, str]:
    """The files of the record of set ``name``: the data, its provenance, ncu's raw export."""
    return f"{name}.csv", f"{name}.meta.json", f"{name}.ncu-raw.csv"


def check_environment() -> None:
    """Raise MissingTool with one line if this machine cannot measure."""
    if shutil.which("ncu") is None:
        raise MissingTool("Nsight Compute (ncu) is not on PATH: measure on a GPU machine with CUDA's profilers")
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        if out.returncode != 0 or "GPU" not in out.stdout:
            raise MissingTool("no NVIDIA GPU visible (nvidia-smi -L lists none)")
    except FileNotFoundError as e:
        raise MissingTool("no NVIDIA GPU visible (nvidia-smi not found)") from e


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def provenance(ncu_cmd: list[str], cache_control: str, git: dict | None = None, metrics=METRICS) -> dict:
    """The record's ``.meta.json``.  ``git``: :func:`git_state` as taken when the run began
    (default: now)."""
    def version(mod):
        try:
            return __import__(mod).__version__
        except Exception:
            return None

    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    nvcc = _run(["nvcc", "--version"]).splitlines()
    ncu_v = _run(["ncu", "--version"]).splitlines()
    return {
        "gpu": smi.split(",")[0].strip() if smi else None,
        "driver": smi.split(",")[1].strip() if smi.count(",") >= 1 else None,
        "gpu_memory": smi.split(",")[2].strip() if smi.count(",") >= 2 else None,
        "cuda": nvcc[-1] if nvcc else None,
        "ncu": ncu_v[-1] if ncu_v else None,
        "numba": version("numba"),
        "numba_cuda": version("numba_cuda"),
        "numpy": version("numpy"),
        "torch": version("torch"),
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **(git if git is not None else git_state()),
        "ncu_command": " ".join(ncu_cmd),
        "cache_control": cache_control,
        "clock_control": "none",
        "metrics": list(metrics),
    }


def measure(configs: list[dict], out_dir: str | Path, name: str, cache_control: str = "all",
            force: bool = False, metrics=None) -> Path:
    """Measure ``configs`` under ncu and write the record of set ``name`` into ``out_dir`` (see the
    module docstring); returns the path of its CSV.  Raises :class:`MissingTool` on a machine
    that cannot measure, :class:`MeasureError` if the run fails, ``ValueError`` for bad
    arguments or an existing record without ``force`` — in every case before writing anything."""
    if not configs:
        raise ValueError("configs=[]: nothing to measure")
    if cache_control not in ("all", "none"):
        raise ValueError(f"cache_control={cache_control!r}: must be 'all' or 'none'")
    files = record_files(name)
    csv_name, meta_name, raw_name = files
    what = f"a measured record of set {name!r}"
    out_dir = check_overwrite(out_dir, files, force, what)  # refused before the hour of measuring
    check_environment()
    git = git_state()
    with tempfile.TemporaryDirectory() as tmp, staged(out_dir, files, force, what) as stage:
        cfg_path, man_path = Path(tmp, "configs.json"), Path(tmp, "manifest.json")
        cfg_path.write_text(json.dumps(configs))
        program = [sys.executable, "-m", "analysis.worker", str(cfg_path), str(man_path)]
        if metrics is None:  # the records' metrics and the optional ones this ncu knows (red, atom, ldgsts)
            metrics = (*METRICS, *available_metrics())
        cmd = ncu_command(program, export=str(stage / raw_name), metrics=metrics, cache_control=cache_control,
                          profile_from_start=False)
        print("running:", " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise MeasureError(f"ncu exited with status {proc.returncode}; nothing written ({out_dir} unchanged)")
        if not man_path.exists():
            raise MeasureError(f"the worker wrote no manifest; nothing written ({out_dir} unchanged)")
        manifest = json.loads(man_path.read_text())
        try:
            groups = split_by_marker(parse_raw_csv((stage / raw_name).read_text()))
        except (OSError, ValueError) as e:
            raise MeasureError(f"ncu's export could not be read ({e}); nothing written ({out_dir} unchanged)") from e
        if len(groups) != len(manifest):
            raise MeasureError(f"{len(groups)} launch groups for {len(manifest)} configurations; nothing written "
                               f"({out_dir} unchanged)")
        rows = []
        # the decode and fast sets' own fields (splits, page size; bwd_fp16_v3's key-block order) as
        # extra columns, only in records that have them
        extra = [f for f in (*DECODE_FIELDS, *FAST_FIELDS) if any(f in e["config"] for e in manifest)]
        for entry, group in zip(manifest, groups):
            for k, rec in enumerate(group):
                row = {"config_id": entry["id"], "launch_index": k}
                row.update({f: entry["config"].get(f) for f in (*CONFIG_FIELDS, *extra)})
                row["kernel_name"] = rec["kernel"]
                row["grid"], row["block"] = rec["grid"], rec["block"]
                row.update({f: rec[f] for f in METRIC_FIELDS})
                row.update({f: rec[f] for f in OPTIONAL_METRICS.values() if f in rec})  # where ncu had them
                rows.append(row)
        if not rows:
            raise MeasureError(f"no kernel launch was profiled; nothing written ({out_dir} unchanged)")
        with open(stage / csv_name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        # the command as recorded names the export where it ends up, not the staging folder
        recorded = ncu_command(program, export=str(out_dir / raw_name), metrics=metrics, cache_control=cache_control,
                               profile_from_start=False)
        meta = provenance(recorded, cache_control, git, metrics)
        meta["configs"] = len(manifest)
        meta["launches"] = len(rows)
        (stage / meta_name).write_text(json.dumps(meta, indent=1))
    csv_path = out_dir / csv_name
    print(f"wrote {csv_path} ({len(manifest)} configurations, {len(rows)} launches)", file=sys.stderr)
    return csv_path


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.measure ARGS`` is ``flashsim measure ARGS``: one parser, one list of sets."""
    from .cli import main as cli_main  # here, not at the top: analysis.cli imports this module

    return cli_main(["measure", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
