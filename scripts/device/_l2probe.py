"""What the L2 probe scripts (l2_policy.py, l2_writeback.py, l2_readwrite.py, l2_background.py,
l2_dirty_probe.py, l2_halfline_probe.py, l2_quarter_probe.py, l2_evict_probe.py) share: their
command line (``--out DIR``; ``--worker``, the program Nsight Compute profiles), the GPU's name
and driver, the worker run under ``ncu --cache-control all`` with its launches paired with the
probes, records written under a temporary name first, then renamed; for the store probes, the
fill kernel and the list of launches repeated in alternating order after an uncounted one."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from numba import cuda, float32

#: the columns every probe row takes from its launch (analysis.ncu.parse_raw_csv's names)
MEASURED = ("dram_read_bytes", "dram_write_bytes", "lsu_ld_bytes", "lsu_st_bytes", "time_ns")


def args(doc: str, argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def gpu_name() -> str:
    """nvidia-smi's "name, driver version" of the GPU."""
    return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def profile(script: str, stem: str, out: Path, probes: list[dict],
            metrics=None) -> tuple[list[tuple[dict, dict]], str] | None:
    """Run ``script --worker`` under ncu (every launch cold; ``metrics``: analysis.ncu's METRICS
    unless given), its raw export ``out/STEM.ncu-raw.csv``: ([(probe, measured launch)], the
    command), or None after one line on stderr."""
    from analysis.ncu import METRICS, ncu_command, parse_raw_csv

    raw = out / f"{stem}.ncu-raw.csv"
    cmd = ncu_command([sys.executable, str(Path(script).resolve()), "--worker"], export=str(raw),
                      metrics=metrics or METRICS, cache_control="all", profile_from_start=False)
    print("running:", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        print(f"{stem}: ncu failed", file=sys.stderr)
        return None
    launches = parse_raw_csv(raw.read_text())
    if len(launches) != len(probes):
        print(f"{stem}: {len(launches)} launches for {len(probes)} probes", file=sys.stderr)
        return None
    return list(zip(probes, launches)), " ".join(cmd)


def write_csv(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def write_meta(path: Path, gpu: str, **extra) -> None:
    """A probe record's provenance: the GPU, what ``extra`` names (the ncu commands), the date
    and flashsim.provenance.git_state's commit and dirty flag."""
    import datetime

    from flashsim.provenance import git_state

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_json(path, {"gpu": gpu, **extra, "date": now, **git_state()})


def start(doc: str, worker, argv=None) -> int | Path:
    """A probe script's start: the worker's exit status when run as ``--worker``, else the output
    folder (``--out``, created)."""
    a = args(doc, argv)
    if a.worker:
        return worker()
    out = Path(a.out or ".")
    out.mkdir(parents=True, exist_ok=True)
    return out


def measure(doc: str, script: str, stem: str, probes, worker, argv=None):
    """A probe script's main up to its records: the worker's exit status when run as ``--worker``,
    1 when ncu fails; else (the output folder, [(probe, launch)], the ncu command, the GPU)."""
    out = start(doc, worker, argv)
    if isinstance(out, int):
        return out
    got = profile(script, stem, out, probes())
    if got is None:
        return 1
    return (out, *got, gpu_name())


def repeated(cases, repeats: int, first_shape: tuple) -> list[dict]:
    """The launches of a probe in the order profiled: one fill of ``first_shape`` floats that is
    not counted (the first launch a worker profiles leaves less dirty than its repeats), then the
    list ``cases()`` ``repeats`` times, every second time in reverse order, each marked ``rep``."""
    out = [{"probe": "first", "shape": first_shape}]
    for r in range(repeats):
        out += [dict(c, rep=r) for c in (cases() if r % 2 == 0 else cases()[::-1])]
    return out


@cuda.jit
def fill(buf):
    """A grid-stride store of 1 to every element of a 1-D array (each line stored whole)."""
    for k in range(cuda.grid(1), buf.size, cuda.gridsize(1)):
        buf[k] = float32(1)


def row(fields: dict, launch: dict, gpu: str, dirty_left: bool = False) -> dict:
    """One record row: the probe's ``fields``, the launch's MEASURED columns, with
    ``dirty_left``, the bytes it left dirty (stores - DRAM writes), and the GPU."""
    extra = {"dirty_left_bytes": launch["lsu_st_bytes"] - launch["dram_write_bytes"]} if dirty_left else {}
    return {**fields, **{k: launch[k] for k in MEASURED}, **extra, "gpu": gpu}


def save(out: Path, stem: str, rows: list[dict], line, gpu: str, **meta) -> int:
    """A probe's record: ``out/STEM.csv`` (``rows``), one printed ``line(row)`` a row, then
    ``out/STEM.meta.json`` (:func:`write_meta` with ``meta``); 0, the probe's exit status."""
    write_csv(out / f"{stem}.csv", rows)
    for r in rows:
        print(line(r))
    write_meta(out / f"{stem}.meta.json", gpu, **meta)
    return 0
