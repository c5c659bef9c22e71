"""Run a configuration set under Nsight Compute and record the data with its provenance.

    python -m analysis.measure --set h100 --out analysis/data/h100

writes ``OUT/<set>.csv`` (one row per kernel launch: configuration, kernel, the ncu metrics)
and ``OUT/<set>.meta.json`` (GPU, driver, CUDA, ncu, numba-cuda, numpy and torch versions,
date, git commit, the exact ncu command and cache policy), plus the raw ncu CSV.  On a machine
without a GPU or without ncu it stops with one line saying what is missing.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .configs import SETS, config_id
from .ncu import METRICS, ncu_command, parse_raw_csv, split_by_marker

CONFIG_FIELDS = ("kernel", "pass", "batch", "heads", "kv_heads", "seq_len_q", "seq_len_k", "head_dim", "dtype",
                 "causal", "block_m", "block_n", "sram_bytes", "gemm_block")
METRIC_FIELDS = ("lsu_ld_bytes", "lsu_st_bytes", "l2_read_sectors", "l2_write_sectors", "dram_read_bytes",
                 "dram_write_bytes", "time_ns")


class MissingTool(RuntimeError):
    pass


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


def provenance(ncu_cmd: list[str], cache_control: str) -> dict:
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
        "git_commit": os.environ.get("FLASHSIM_GIT_COMMIT") or _run(["git", "rev-parse", "HEAD"]) or None,
        "ncu_command": " ".join(ncu_cmd),
        "cache_control": cache_control,
        "clock_control": "none",
        "metrics": list(METRICS),
    }


def measure(configs: list[dict], out_dir: Path, name: str, cache_control: str = "all") -> Path:
    check_environment()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, man_path = Path(tmp, "configs.json"), Path(tmp, "manifest.json")
        cfg_path.write_text(json.dumps(configs))
        raw_path = out_dir / f"{name}.ncu-raw.csv"
        cmd = ncu_command([sys.executable, "-m", "analysis.worker", str(cfg_path), str(man_path)],
                          export=str(raw_path), cache_control=cache_control, profile_from_start=False)
        print("running:", " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise RuntimeError(f"ncu exited with status {proc.returncode}")
        manifest = json.loads(man_path.read_text())
    launches = parse_raw_csv(raw_path.read_text())
    groups = split_by_marker(launches)
    if len(groups) != len(manifest):
        raise RuntimeError(f"{len(groups)} launch groups for {len(manifest)} configurations")
    rows = []
    for entry, group in zip(manifest, groups):
        for k, rec in enumerate(group):
            row = {"config_id": entry["id"], "launch_index": k}
            row.update({f: entry["config"].get(f) for f in CONFIG_FIELDS})
            row["kernel_name"] = rec["kernel"]
            row["grid"], row["block"] = rec["grid"], rec["block"]
            row.update({f: rec[f] for f in METRIC_FIELDS})
            rows.append(row)
    csv_path = out_dir / f"{name}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    meta = provenance(cmd, cache_control)
    meta["configs"] = len(manifest)
    meta["launches"] = len(rows)
    (out_dir / f"{name}.meta.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {csv_path} ({len(manifest)} configurations, {len(rows)} launches)", file=sys.stderr)
    return csv_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.measure", description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="h100", choices=sorted(SETS))
    ap.add_argument("--out", default="analysis/data/h100")
    ap.add_argument("--cache-control", default="all", choices=["all", "none"])
    ap.add_argument("--only", default=None, help="substring filter on configuration ids")
    args = ap.parse_args(argv)
    configs = SETS[args.set]()
    if args.only:
        configs = [c for c in configs if args.only in config_id(c)]
    try:
        measure(configs, Path(args.out), args.set, args.cache_control)
    except MissingTool as e:
        print(f"flashsim measure: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
