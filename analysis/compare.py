"""Simulated against measured: every measured kernel launch beside the simulator's prediction.

Levels compared (see analysis/ncu.py for the metrics):

* **LSU** (what the IO model counts): the walker's 32-byte sectors for the same launch, reads
  and writes, times 32.  A kernel that loads each tile once with coalesced accesses requests
  exactly these bytes; the tolerance is 1 %.  The measured bytes less the walker's are reported
  per launch (``lsu_ld_residual_bytes``, ``lsu_st_residual_bytes``) and, for the decode kernels,
  how many launches agree to the byte (the decode schedule counts every load of the reference
  kernel, its sequence-length reads included, tensor ``Lens``).
* **DRAM** (what reaches HBM after the L2): the trace-driven L2 model of :mod:`flashsim.l2` with
  the GPU preset given (or the data's own, from its provenance), reported with its error per
  launch rather than tuned to fit.  Every launch starts with an empty L2 (ncu flushes the caches
  before each replay pass, ``--cache-control all``); a launch's DRAM reads are the sectors its
  misses fetch, its DRAM writes the dirty sectors evicted or written back under the preset's
  dirty limit while it runs.  The dirty lines left at its end are written back by ncu's next
  flush, outside the measured range, so they are not predicted as the launch's writes
  (``sim_dirty_end_bytes`` reports them).  DRAM errors are relative to
  max(prediction, DRAM_ERR_FLOOR).  Launches whose distinct footprint exceeds the preset's
  effective L2 (the model's capacity) are flagged ``l2_pressure``.  Beside the model's writes,
  ``sim_dram_write_timed_bytes`` adds the DRAM writes the H100 makes over time while any kernel
  runs (a rate from the fill_wait probes, times the launch's measured duration; see
  WRITEBACK_RECORDS): a diagnosis of the launches outside, not a prediction.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from flashsim.api import build_schedule
from flashsim.config import DTYPE_BYTES, get_gpu
from flashsim.config import preset_of as gpu_preset_of
from flashsim.l2 import dram_traffic
from flashsim.output import check_overwrite, staged
from flashsim.traffic import SECTOR_BYTES, walk

from .configs import FAST_FIELDS, KERNELS, sim_options, tiling_of, workload_of
from .fast_set import FAST_KERNELS, predict_lsu_loads
from .measure import CONFIG_FIELDS, METRIC_FIELDS
from .ncu import EXTRA_METRICS, METRICS, OPTIONAL_METRICS
from .torch_set import TORCH_KERNELS
from .torch_set import records as torch_records
from .torch_set import summary as torch_summary

LSU_TOLERANCE = 0.01
#: Set sampling of the L2 model in comparisons: one set in 16 is simulated (every count x 16).
#: benchmarks/bench_l2.py measures what it costs: on its launches (FlashAttention-2 forward at
#: N = 16,384 and standard attention's forward at N = 4,096, H100 preset) at most 0.25 % of a
#: launch's DRAM reads or writes.
DRAM_SET_SAMPLE = 16

_INT = ("batch", "heads", "kv_heads", "seq_len_q", "seq_len_k", "head_dim", "block_m", "block_n", "sram_bytes",
        "gemm_block", "num_splits", "page_size", "launch_index", "lsu_ld_bytes", "lsu_st_bytes", "l2_read_sectors",
        "l2_write_sectors", "dram_read_bytes", "dram_write_bytes", "lsu_red_bytes", "lsu_atom_bytes",
        "lsu_ldgsts_access_bytes")


#: Columns a measured CSV must have: those ``flashsim measure`` writes, but the kernel's name,
#: grid and block, which nothing here reads.
REQUIRED_COLUMNS = ("config_id", "launch_index", *CONFIG_FIELDS, *METRIC_FIELDS)

#: The spellings a boolean cell may have (surrounding blanks stripped); anything else is refused.
BOOLEANS = {"True": True, "true": True, "1": True, "False": False, "false": False, "0": False}


#: The measured counts of bytes and sectors (never negative): the metrics every record has and the
#: optional ones (:data:`analysis.ncu.OPTIONAL_METRICS`), by their short names.
COUNT_COLUMNS = frozenset((*(f for f in METRIC_FIELDS if f != "time_ns"), *OPTIONAL_METRICS.values()))


def _bad(path: Path, what: str) -> ValueError:
    return ValueError(f"data={str(path)!r}: {what}")


def _bool(path: Path, line: int, k: str, value: str) -> bool:
    v = value.strip()
    if v not in BOOLEANS:
        raise _bad(path, f"line {line}: {k}={value!r} is not a boolean (one of {', '.join(BOOLEANS)})")
    return BOOLEANS[v]


def read_measured(path: str | Path) -> tuple[list[dict], dict]:
    """Rows of a measured CSV (typed) and its provenance (the ``.meta.json`` beside it).

    Anything that is not a measured CSV is refused with a ``ValueError`` that names the file, and
    the line and column (``column=value``) where it goes wrong: a missing file or a folder, a name
    not ending in ``.csv``, a missing column, an empty or header-only file, a row of the wrong
    length, a number that does not parse, a negative number (the measured byte and sector counts,
    :data:`COUNT_COLUMNS`, every integer column, ``time_ns``), a boolean not spelled as in :data:`BOOLEANS`, an
    unknown kernel, pass or dtype, a workload or tiling the simulator refuses, a launch without
    the tiling its kernel needs, launches of one configuration (``config_id``) that repeat a
    ``launch_index`` or whose configuration columns differ, a provenance that is not JSON.
    :func:`compare` then holds each configuration's ``launch_index`` within its launches in the
    simulator (0 to n - 1), naming the line (the rows are a :class:`MeasuredRows`).
    """
    path = Path(path)
    if path.suffix != ".csv":
        raise _bad(path, "not a .csv file (a measured CSV, e.g. analysis/data/h200/h200.csv)")
    if path.is_dir():
        raise _bad(path, "is a folder, not a file (a measured CSV, e.g. analysis/data/h200/h200.csv)")
    if not path.is_file():
        raise _bad(path, "no such file (a measured CSV, e.g. analysis/data/h200/h200.csv)")
    rows, lines = [], []
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise _bad(path, "the file is empty: no measured launch")
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise _bad(path, f"column {missing[0]!r} missing{more}: not a measured CSV")
            for fields in reader:
                if not fields:  # a blank line, as csv.DictReader skips it
                    continue
                if len(fields) != len(header):
                    raise _bad(path, f"line {reader.line_num} has {len(fields)} fields, the header {len(header)}")
                rows.append(_typed(path, reader.line_num, dict(zip(header, fields))))
                lines.append(reader.line_num)
    except UnicodeDecodeError as e:
        raise _bad(path, f"not a text file ({e.reason})") from None
    except csv.Error as e:
        raise _bad(path, f"not a readable CSV ({e})") from None
    except OSError as e:
        raise _bad(path, e.strerror or str(e)) from None
    if not rows:
        raise _bad(path, "the header only: no measured launch")
    _check_launches(path, rows, lines)
    rows = MeasuredRows(rows, lines)
    meta_path = path.with_name(path.name[:-len(".csv")] + ".meta.json")
    meta = {}
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise _bad(path, f"its provenance {meta_path.name} is not valid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise _bad(path, f"its provenance {meta_path.name} is not a JSON object")
    return rows, meta


class MeasuredRows(list):
    """:func:`read_measured`'s rows: a list of them that also knows the file line of each, so that
    :func:`compare` can name the line of a launch it refuses."""

    def __init__(self, rows: list[dict], lines: list[int]):
        super().__init__(rows)
        self._lines = {id(r): line for r, line in zip(rows, lines)}

    def line_of(self, row: dict) -> int | None:
        return self._lines.get(id(row))


def _check_launches(path: Path, rows: list[dict], lines: list[int]) -> None:
    """Each configuration's launches: every ``launch_index`` once (:func:`compare` then holds them
    within the simulator's launches of the configuration: 0 to n - 1 for its n launches), and the
    same configuration columns on every row (the first row is the one simulated)."""
    by_cfg: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for line, r in zip(lines, rows):
        by_cfg[r["config_id"]].append((line, r))
    for cid, launches in by_cfg.items():
        first_line, first = launches[0]
        seen: dict[int, int] = {}
        for line, r in launches:
            i = r["launch_index"]
            if i in seen:
                raise _bad(path, f"line {line}: launch_index={i} repeats line {seen[i]}'s in configuration {cid!r}")
            seen[i] = line
            for k in CONFIG_FIELDS:
                if r[k] != first[k]:
                    raise _bad(path, f"line {line}: {k}={r[k]!r} differs from line {first_line}'s {first[k]!r} "
                                     f"in configuration {cid!r}")


def _typed(path: Path, line: int, r: dict) -> dict:
    """One row with its numbers parsed and its kernel, pass, dtype, workload and tiling checked."""
    for k in _INT:
        if k in r:
            v = r[k].strip()
            try:
                r[k] = int(v) if v not in ("", "None") else None
            except ValueError:
                raise _bad(path, f"line {line}: {k}={r[k]!r} is not an integer") from None
            if r[k] is not None and r[k] < 0:
                raise _bad(path, f"line {line}: {k}={v} is negative")
    for k, v in r.items():  # the counts not typed here (kept as text; read where they are used)
        if k in COUNT_COLUMNS and k not in _INT and v.strip() not in ("", "None"):
            if not v.strip().isdigit():
                raise _bad(path, f"line {line}: {k}={v!r} is not a count (a non-negative integer)")
    r["causal"] = _bool(path, line, "causal", r["causal"])
    for k in FAST_FIELDS:  # the fast set's knobs (empty: not recorded)
        if k in r:
            r[k] = _bool(path, line, k, r[k]) if r[k].strip() else None
    try:
        r["time_ns"] = float(r["time_ns"])
    except ValueError:
        raise _bad(path, f"line {line}: time_ns={r['time_ns']!r} is not a number") from None
    if not math.isfinite(r["time_ns"]) or r["time_ns"] < 0:
        raise _bad(path, f"line {line}: time_ns={r['time_ns']!r} is not a finite non-negative number")
    for k in ("batch", "heads", "seq_len_q", "head_dim", "launch_index", *(f for f in METRIC_FIELDS if f != "time_ns")):
        if r[k] is None:
            raise _bad(path, f"line {line}: {k} is empty")
    if r["kernel"] not in KERNELS:
        raise _bad(path, f"line {line}: kernel={r['kernel']!r} is not one of {list(KERNELS)}")
    if r["pass"] not in ("fwd", "bwd"):
        raise _bad(path, f"line {line}: pass={r['pass']!r} is not 'fwd' or 'bwd'")
    if r["dtype"] not in DTYPE_BYTES:
        raise _bad(path, f"line {line}: dtype={r['dtype']!r} is not one of {list(DTYPE_BYTES)}")
    if r["kernel"] == "standard":
        if r["gemm_block"] is None:
            raise _bad(path, f"line {line}: kernel 'standard' needs gemm_block")
    elif r["kernel"] == "decode":
        for k in ("kv_heads", "seq_len_k", "block_n", "num_splits"):
            if r.get(k) is None:
                raise _bad(path, f"line {line}: kernel 'decode' needs {k}")
        if r["pass"] != "fwd":
            raise _bad(path, f"line {line}: kernel 'decode' has a forward pass only (pass={r['pass']!r})")
    elif r["kernel"] in TORCH_KERNELS:  # the kernel's own tiles (analysis/torch_set.py)
        pass
    elif not r["sram_bytes"] and (r["block_m"] is None or r["block_n"] is None):
        raise _bad(path, f"line {line}: kernel {r['kernel']!r} needs sram_bytes or block_m and block_n")
    try:  # the workload and tiling the simulator will be given (its own checks, named by column here)
        workload_of(r)
        if r["kernel"] not in TORCH_KERNELS:
            tiling_of(r)
    except ValueError as e:
        msg = " ".join(str(e).split())
        head = msg.split("=", 1)[0].split(":", 1)[0].strip()
        if head == "sram_elems":  # Tiling.from_sram's field: the record's column is sram_bytes
            msg = f"sram_bytes={r['sram_bytes']}: {msg}"
        elif head not in r:
            msg = f"{msg} (columns {', '.join(f'{k}={r[k]}' for k in CONFIG_FIELDS if r.get(k) is not None)})"
        raise _bad(path, f"line {line}: {msg}") from None
    return r


def _algo(kernel: str) -> str:
    if kernel in FAST_KERNELS:  # kernels/perf's variants: flashsim.algorithms.fast, option kernel
        return "fast"
    return {"flash2": "flash2", "flash1": "flash1", "standard": "standard", "decode": "decode"}[kernel]


def _footprint_bytes(schedule, launch) -> tuple[int, int]:
    """Distinct bytes a launch reads and writes: whole tensors (every launch here touches every
    row of each tensor it uses), counted at 32-byte sector granularity."""
    reads, writes = set(), set()
    for a in launch.accesses():
        (writes if a.write else reads).add(a.tensor)

    def size(names):
        return sum(-(-schedule.tensors[n].slices * schedule.tensors[n].slice_bytes // SECTOR_BYTES) * SECTOR_BYTES
                   for n in names)
    return size(reads), size(writes)


def schedule_of(cfg: dict):
    """The simulator's schedule of a measured configuration (its launches have their thread blocks)."""
    return build_schedule(workload_of(cfg), _algo(cfg["kernel"]), cfg["pass"], tiling_of(cfg), **sim_options(cfg))


def predict_lsu(cfg: dict, sched=None) -> list[dict]:
    """The LSU level alone, launch by launch (cheap: the walker, no L2 model): the walker's load
    and store sectors x 32 (``sim_lsu_ld_bytes``, ``sim_lsu_st_bytes``) and its exact bytes;
    for the fast kernels also the loads as the LSU counts their cp.async tiles
    (``sim_lsu_ld_ldgsts_bytes``: :func:`analysis.fast_set.predict_lsu_loads`), which is what
    :func:`compare` holds their measured loads against."""
    sched = schedule_of(cfg) if sched is None else sched
    io = walk(sched)
    # the fast kernels: their loads also as the LSU counts cp.async (by its shared destination)
    fast_k = cfg.get("kernel") in FAST_KERNELS
    lsu_ld = (predict_lsu_loads(cfg, sched, io, sim_options(cfg).get("config")) if fast_k
              else [None] * len(io.per_launch))
    out = []
    for name, c in io.per_launch.items():
        red = c.by_class()["reduction"]
        out.append({"sim_launch": name, "sim_lsu_ld_bytes": (c.read_sectors or 0) * SECTOR_BYTES,
                    "sim_lsu_st_bytes": (c.write_sectors or 0) * SECTOR_BYTES,
                    "sim_read_bytes_exact": c.read_bytes, "sim_write_bytes_exact": c.write_bytes,
                    "sim_lsu_red_bytes": (red.sectors or 0) * SECTOR_BYTES})
        if fast_k:  # the LSU's count of the loads (cp.async by its shared destination)
            out[-1]["sim_lsu_ld_ldgsts_bytes"] = lsu_ld[len(out) - 1]
    return out


def predict(cfg: dict, gpu: str = "h100", start_dirty: int = 0) -> list[dict]:
    """The simulator's per-launch prediction for a measured configuration, in launch order.

    LSU level: the walker's sectors.  DRAM level: the trace-driven L2 model of ``gpu``'s preset
    (:func:`flashsim.l2.dram_traffic`) with every launch starting cold, as ncu measures with
    ``--cache-control all``; a launch's dirty lines at its end are written back by ncu's flush,
    outside the measurement, so they are reported (``sim_dirty_end_bytes``) but not predicted
    as the launch's DRAM writes.  ``start_dirty``: the bytes of other data each launch finds
    dirty in the L2 (:func:`replay_dirty`).  A pure function of its arguments: the last 512
    answers are kept for the process (the same record compared twice is simulated once)."""
    try:
        key = (tuple(sorted(cfg.items())), gpu, start_dirty)
        hash(key)
    except TypeError:  # a value that cannot be a key: no memo
        return _predict(cfg, gpu, start_dirty)
    return [dict(r) for r in _predict_memo(key)]


@lru_cache(maxsize=512)
def _predict_memo(key: tuple) -> tuple:
    items, gpu, start_dirty = key
    return tuple(_predict(dict(items), gpu, start_dirty))


def _predict(cfg: dict, gpu: str, start_dirty: int = 0) -> list[dict]:
    hw = get_gpu(gpu)
    sched = schedule_of(cfg)  # every schedule built here has its thread blocks (flashsim.blocks)
    dram = dram_traffic(sched, hw, cold_launches=True, sample=DRAM_SET_SAMPLE, start_dirty=start_dirty)
    out = []
    for launch, lsu, d in zip(sched.launches, predict_lsu(cfg, sched), dram.launches):
        fr, fw = _footprint_bytes(sched, launch)
        out.append({**lsu, "sim_dram_read_bytes": d.read_bytes, "sim_dram_write_bytes": d.write_bytes,
                    "sim_dirty_end_bytes": d.dirty_end_bytes, "sim_grid": "(" + ", ".join(map(str, d.grid)) + ")",
                    "sim_blocks_per_sm": d.blocks_per_sm, "footprint_bytes": fr + fw,
                    "l2_pressure": fr + fw > hw.l2_effective_bytes})
    return out


def _rel(measured: float, predicted: float) -> float:
    if predicted == 0:
        return 0.0 if measured == 0 else math.inf
    return measured / predicted - 1.0


#: DRAM errors are relative to max(prediction, 1 MB): a launch that moves a few kilobytes (the
#: flash1 init kernel, whose ~20 KB of DRAM reads are its own code and parameters) would
#: otherwise show an infinite error for a difference that means nothing.
DRAM_ERR_FLOOR = 10**6


def _rel_dram(measured: float, predicted: float) -> float:
    return (measured - predicted) / max(predicted, DRAM_ERR_FLOOR)


#: The H100's DRAM writes over time while a kernel runs, whatever it stores (the fill_wait
#: probes of scripts/device/l2_writeback.py and scripts/device/l2_policy.py: about 19 MB/s, more
#: than the data stored when the kernel is kept alive long enough): not part of the L2 model,
#: which has no timing.  ``compare`` reports, beside the model's writes, the writes with
#: rate x the launch's MEASURED duration added (``sim_dram_write_timed_bytes``): what this
#: background accounts for, given the duration; a diagnosis of the launches outside, not a
#: prediction.  The rate is the H100's; the H200 is assumed to write at the same rate.
WRITEBACK_RECORDS = tuple(Path(__file__).resolve().parent / "data" / "l2calib" / f"h100_{n}.csv"
                          for n in ("l2_writeback", "l2_policy"))


def _timed_rate() -> float:
    from .calibrate import timed_writeback_rate

    return timed_writeback_rate(*WRITEBACK_RECORDS)


#: scripts/device/l2_dirty_probe.py's records: what Nsight Compute's replay leaves dirty in the L2
#: when a launch is measured with more metrics than the calibration's 7: the fast set's 10
#: (h200_l2_dirty, 011cd4f) and analysis.measure's default 17 (h200_l2_dirty_m17, 428cac7,
#: which measured the 10 again: 2.00 MiB, and the 17 alike)
REPLAY_DIRTY_RECORDS = tuple(Path(__file__).resolve().parent / "data" / "l2calib" / d / "l2_dirty.csv"
                             for d in ("h200_l2_dirty", "h200_l2_dirty_m17"))


def _probe_metric_sets(path: Path) -> dict:
    """{set name: its metrics} of an l2_dirty_probe record (its meta.json; the first record,
    which predates that field, profiled METRICS as m7 and METRICS with EXTRA_METRICS as m10)."""
    meta = json.loads(path.with_name("l2_dirty.meta.json").read_text())
    return meta.get("metric_sets") or {"m7": list(METRICS), "m10": [*METRICS, *EXTRA_METRICS]}


def replay_dirty_source(meta: dict) -> tuple[int, str | None]:
    """(:func:`replay_dirty`, the name of the probe record that measured it, or None)."""
    from .calibrate import replay_dirty_bytes

    want = set(meta.get("metrics") or ())
    for path in REPLAY_DIRTY_RECORDS:
        for name, metrics in _probe_metric_sets(path).items():
            if set(metrics) == want:
                return replay_dirty_bytes(path)["start_dirty"].get(name, 0), path.parent.name
    return 0, None


def replay_dirty(meta: dict) -> int:
    """Bytes of other data a launch of this record finds dirty in the L2 when ncu measures it: 0
    for the calibration's metric set (its dirty limit holds that state); for a wider set, the
    ``start_dirty`` that the first probe record to have profiled exactly that set gives it
    (analysis.calibrate.replay_dirty_bytes: the fast set's 10 metrics and analysis.measure's
    17; measured on the H200, assumed for the other GPUs); 0 for a set no probe measured."""
    return replay_dirty_source(meta)[0]


def compare(rows: list[dict], gpu: str = "h100", start_dirty: int = 0) -> list[dict]:
    """One record per measured launch with the prediction and relative errors; ``start_dirty``:
    as :func:`predict` takes it (:func:`replay_dirty` of the record's provenance).  A configuration
    whose measured launches are not as many as the simulator's, or whose ``launch_index`` falls
    outside them (0 to n - 1 for its n launches), is refused (``ValueError``; naming the file's line
    where ``rows`` are :func:`read_measured`'s)."""
    by_cfg: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_cfg[r["config_id"]].append(r)
    line_of = getattr(rows, "line_of", lambda r: None)

    def check_indices(cid: str, launches: list[dict]) -> None:  # their count is the simulator's here
        n = len(launches)
        for r in launches:
            if r["launch_index"] >= n:
                line = line_of(r)
                raise ValueError(f"{f'line {line}: ' if line else ''}launch_index={r['launch_index']} is out of "
                                 f"range: configuration {cid!r} has {n} launch{'es' if n > 1 else ''} in the "
                                 f"simulator, numbered 0 to {n - 1}")

    out = []
    rate = _timed_rate()
    for cid, launches in by_cfg.items():
        launches.sort(key=lambda r: r["launch_index"])
        if launches[0]["kernel"] in TORCH_KERNELS:  # PyTorch's launches, matched by kernel name
            recs = torch_records(cid, launches, gpu, start_dirty)  # refuses a count other than the schedule's
            check_indices(cid, launches)
            out += recs
            continue
        try:
            preds = predict(launches[0], gpu, start_dirty)
        except ValueError as e:  # a configuration the simulator refuses: named, not a bare field's message
            raise ValueError(f"configuration {cid!r}: the simulator refuses it ({' '.join(str(e).split())})") from None
        if len(preds) != len(launches):
            raise ValueError(f"configuration {cid!r}: {len(launches)} measured launches but the simulator models "
                             f"{len(preds)}")
        check_indices(cid, launches)
        for r, p in zip(launches, preds):
            rec = dict(r)
            rec.update(p)
            # the fast kernels' loads at the LSU: cp.async tiles as the LSU counts them (by their
            # shared destination, analysis.fast_set.ldgsts_sectors); the walker's global count apart
            sim_ld = p.get("sim_lsu_ld_ldgsts_bytes", p["sim_lsu_ld_bytes"])
            if "sim_lsu_ld_ldgsts_bytes" in p:
                rec["sim_lsu_compared_bytes"] = sim_ld + p["sim_lsu_st_bytes"]
                rec["lsu_ld_walker_residual_bytes"] = r["lsu_ld_bytes"] - p["sim_lsu_ld_bytes"]
            rec["lsu_ld_err"] = _rel(r["lsu_ld_bytes"], sim_ld)
            rec["lsu_st_err"] = _rel(r["lsu_st_bytes"], p["sim_lsu_st_bytes"])
            rec["lsu_err"] = _rel(r["lsu_ld_bytes"] + r["lsu_st_bytes"], sim_ld + p["sim_lsu_st_bytes"])
            if r.get("lsu_red_bytes") is not None:  # reductions apart (sets measured with them: fast)
                rec["lsu_red_err"] = _rel(r["lsu_red_bytes"], p["sim_lsu_red_bytes"])
                rec["lsu_red_residual_bytes"] = r["lsu_red_bytes"] - p["sim_lsu_red_bytes"]
            rec["lsu_ld_residual_bytes"] = r["lsu_ld_bytes"] - sim_ld
            rec["lsu_st_residual_bytes"] = r["lsu_st_bytes"] - p["sim_lsu_st_bytes"]
            rec["dram_err"] = _rel_dram(r["dram_read_bytes"] + r["dram_write_bytes"],
                                        p["sim_dram_read_bytes"] + p["sim_dram_write_bytes"])
            rec["dram_read_err"] = _rel_dram(r["dram_read_bytes"], p["sim_dram_read_bytes"])
            rec["dram_write_err"] = _rel_dram(r["dram_write_bytes"], p["sim_dram_write_bytes"])
            timed = p["sim_dram_write_bytes"] + rate * r["time_ns"] * 1e-9
            rec["sim_dram_write_timed_bytes"] = round(timed) if math.isfinite(timed) else timed
            rec["dram_write_timed_err"] = _rel_dram(r["dram_write_bytes"], timed)
            rec["grid_matches"] = r.get("grid") in (None, "", p["sim_grid"]) or not p["sim_grid"]
            out.append(rec)
    return out


def per_config(records: list[dict]) -> list[dict]:
    """Launches of one configuration added up (a backward pass is several launches)."""
    agg: dict[str, dict] = {}
    for r in records:
        a = agg.setdefault(r["config_id"], {k: r[k] for k in ("config_id", "kernel", "pass", "batch", "heads",
                                                             "seq_len_q", "seq_len_k", "head_dim", "dtype", "causal",
                                                             "block_m", "block_n", "sram_bytes", "gemm_block",
                                                             "num_splits", "page_size") if k in r})
        for k in ("lsu_ld_bytes", "lsu_st_bytes", "dram_read_bytes", "dram_write_bytes", "time_ns",
                  "sim_lsu_ld_bytes", "sim_lsu_st_bytes", "sim_dram_read_bytes", "sim_dram_write_bytes"):
            a[k] = a.get(k, 0) + r[k]
        # the loads the LSU level compares (the fast kernels: cp.async by its shared destination)
        a["sim_lsu_ld_compared"] = a.get("sim_lsu_ld_compared", 0) + r.get("sim_lsu_ld_ldgsts_bytes",
                                                                             r["sim_lsu_ld_bytes"])
    for a in agg.values():
        a["lsu_bytes"] = a["lsu_ld_bytes"] + a["lsu_st_bytes"]
        a["sim_lsu_bytes"] = a.pop("sim_lsu_ld_compared") + a["sim_lsu_st_bytes"]
        a["lsu_err"] = _rel(a["lsu_bytes"], a["sim_lsu_bytes"])
        a["dram_bytes"] = a["dram_read_bytes"] + a["dram_write_bytes"]
        a["sim_dram_bytes"] = a["sim_dram_read_bytes"] + a["sim_dram_write_bytes"]
        a["dram_err"] = _rel_dram(a["dram_bytes"], a["sim_dram_bytes"])
    return list(agg.values())


def fit_loglog(records: list[dict], xs: tuple[str, ...], y: str) -> dict:
    """Least-squares fit of log y = c + Σ e_x log x; returns exponents, standard errors, R².

    Refused (ValueError naming it) when a parameter takes a single value over the records: its
    exponent would be undetermined (numpy would still print one, with a standard error of nan).
    """
    for x in xs:
        values = sorted({float(r[x]) for r in records})
        if len(values) < 2:
            raise ValueError(f"{x}={values[0] if values else None!r}: does not vary over the {len(records)} records; "
                             f"its exponent cannot be fitted")
    if len(records) <= len(xs):
        raise ValueError(f"records={len(records)}: a fit of {len(xs)} exponents and a constant needs more points")
    a = np.array([[1.0] + [math.log(float(r[x])) for x in xs] for r in records])
    b = np.array([math.log(float(r[y])) for r in records])
    coef, _, rank, _ = np.linalg.lstsq(a, b, rcond=None)
    resid = b - a @ coef
    dof = max(1, len(b) - a.shape[1])
    s2 = float(resid @ resid) / dof
    try:
        cov = s2 * np.linalg.inv(a.T @ a)
        se = np.sqrt(np.diag(cov))
    except np.linalg.LinAlgError:
        se = np.full(a.shape[1], math.nan)
    ss_tot = float(((b - b.mean()) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else 1.0
    return {"exponents": {x: float(coef[i + 1]) for i, x in enumerate(xs)},
            "stderr": {x: float(se[i + 1]) for i, x in enumerate(xs)},
            "const": float(coef[0]), "r2": r2, "n": len(records), "rank": int(rank)}


def _fit_into(fits: dict, name: str, records: list[dict], xs: tuple[str, ...], y: str) -> None:
    try:
        fits[name] = fit_loglog(records, xs, y)
    except ValueError:
        pass  # a parameter that does not vary here: no exponent to report


def theorem2_fits(configs: list[dict]) -> dict[str, dict]:
    """Log-log fits of measured LSU bytes.

    * FlashAttention-1 against N, d and M jointly (Theorem 2: exponents 2, 2, -1; the kernel takes
      its blocks from M by the paper's rule, so this is the theorem's own setting);
    * FlashAttention-2 against N at d = 64 with the kernel's default blocks (2: Tr·N·d with Tr ∝ N),
      and against Br in the tile sweep at N = 4,096 (-1: the query-block count Tr = N/Br is what M
      controls through Br = min(M/4d, d));
    * standard attention against N (Nd + N²: 2 once N ≫ d).

    A fit whose parameter does not vary over the selected configurations (fit_loglog refuses
    it) is left out.
    """
    fits = {}
    f1 = [dict(c, M=c["sram_bytes"]) for c in configs
          if c["kernel"] == "flash1" and c["pass"] == "fwd" and not c["causal"] and c["dtype"] == "fp16"]
    if len(f1) >= 4:
        _fit_into(fits, "flash1_fwd_measured", f1, ("seq_len_q", "head_dim", "M"), "lsu_bytes")
        _fit_into(fits, "flash1_fwd_simulated", f1, ("seq_len_q", "head_dim", "M"), "sim_lsu_bytes")
    f2 = [c for c in configs if c["kernel"] == "flash2" and c["pass"] == "fwd" and not c["causal"]
          and c["dtype"] == "fp16" and c["head_dim"] == 64]
    f2n = [c for c in f2 if (c["block_m"], c["block_n"]) == (64, 32)]
    if len(f2n) >= 3:
        _fit_into(fits, "flash2_fwd_measured_vs_N", f2n, ("seq_len_q",), "lsu_bytes")
    f2t = [c for c in f2 if c["seq_len_q"] == 4096]
    if len(f2t) >= 3:
        _fit_into(fits, "flash2_fwd_measured_vs_Br", f2t, ("block_m",), "lsu_bytes")
    st = [c for c in configs if c["kernel"] == "standard" and c["pass"] == "fwd" and not c["causal"]
          and c["dtype"] == "fp16" and c["head_dim"] == 64]
    if len(st) >= 3:
        _fit_into(fits, "standard_fwd_measured_vs_N", st, ("seq_len_q",), "lsu_bytes")
    return fits


# ---------------------------------------------------------------------------------------------
# The `flashsim compare` job


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e6:10.2f}"


def print_table(records: list[dict], file=None) -> None:
    import sys

    f = file or sys.stdout
    head = (f"{'configuration':58s} {'launch':>6s} {'LSU MB':>10s} {'sim MB':>10s} {'err':>8s} "
            f"{'DRAM MB':>10s} {'sim MB':>10s} {'err':>8s} {'ms':>8s}")
    print(head, file=f)
    print("-" * len(head), file=f)
    for r in records:
        lsu = r.get("lsu_compared_bytes", r["lsu_ld_bytes"] + r["lsu_st_bytes"])  # torch: as compared
        sim = r.get("sim_lsu_compared_bytes", r["sim_lsu_ld_bytes"] + r["sim_lsu_st_bytes"])
        dram = r["dram_read_bytes"] + r["dram_write_bytes"]
        sdram = r["sim_dram_read_bytes"] + r["sim_dram_write_bytes"]
        print(f"{r['config_id'][:58]:58s} {r['launch_index']:6d} {_fmt_bytes(lsu)} {_fmt_bytes(sim)} "
              f"{100 * r['lsu_err']:7.2f}% {_fmt_bytes(dram)} {_fmt_bytes(sdram)} {100 * r['dram_err']:7.1f}% "
              f"{r['time_ns'] / 1e6:8.3f}", file=f)


def _abs_stats(values) -> tuple[float, float, float]:
    """(median, 95th percentile, max) of |values|, the non-finite ones left out; nan if none."""
    a = np.abs(np.array([v for v in values if math.isfinite(v)], dtype=float))
    if not a.size:
        return math.nan, math.nan, math.nan
    return float(np.median(a)), float(np.percentile(a, 95)), float(a.max())


def summarize(records: list[dict]) -> dict:
    """LSU: the worst error and the launches within tolerance.  DRAM: median, 95th percentile and
    maximum |error| per launch of the reads, the writes and their sum (errors relative to
    max(prediction, DRAM_ERR_FLOOR))."""
    lsu = np.array([abs(r["lsu_err"]) for r in records])
    out = {"launches": len(records), "lsu_max_abs_err": float(lsu.max()) if lsu.size else math.nan,
           "lsu_within_tolerance": int((lsu <= LSU_TOLERANCE).sum())}
    if any("level" in r for r in records):  # PyTorch's launches (analysis/torch_set.py)
        out.update(torch_summary(records))
    if any(r.get("kernel") == "decode" or r.get("kernel") in FAST_KERNELS for r in records):
        # the decode and fast kernels' launches against the walker's sectors: how many agree to the
        # byte, loads and stores apart (and reductions, where measured)
        out["lsu_ld_exact"] = sum(r["lsu_ld_residual_bytes"] == 0 for r in records)
        out["lsu_st_exact"] = sum(r["lsu_st_residual_bytes"] == 0 for r in records)
        out["lsu_ld_residual_max_abs_bytes"] = max(abs(r["lsu_ld_residual_bytes"]) for r in records)
        out["lsu_st_residual_max_abs_bytes"] = max(abs(r["lsu_st_residual_bytes"]) for r in records)
        walker = [r["lsu_ld_walker_residual_bytes"] for r in records if "lsu_ld_walker_residual_bytes" in r]
        if walker:  # the fast kernels: loads compared with the LDGSTS rule; the walker's global count apart
            out["lsu_ld_walker_exact"] = sum(x == 0 for x in walker)
            out["lsu_ld_walker_launches"] = len(walker)
        red = [r["lsu_red_residual_bytes"] for r in records if "lsu_red_residual_bytes" in r]
        if red:
            out["lsu_red_exact"] = sum(x == 0 for x in red)
            out["lsu_red_residual_max_abs_bytes"] = max(abs(x) for x in red)
    for key, name in (("dram_err", "dram"), ("dram_read_err", "dram_read"), ("dram_write_err", "dram_write"),
                      ("dram_write_timed_err", "dram_write_timed")):
        med, p95, mx = _abs_stats(r[key] for r in records if key in r)
        out[f"{name}_median_abs_err"], out[f"{name}_p95_abs_err"], out[f"{name}_max_abs_err"] = med, p95, mx
    return out


def preset_of(meta: dict) -> str | None:
    """The flashsim GPU preset of a measurement's provenance ("NVIDIA H200" -> "h200"), or None."""
    return gpu_preset_of(meta.get("gpu"))


#: The files ``run`` writes into ``out_dir``: the tables and summary, then the plots.
COMPARE_FILES = ("compare_launches.csv", "compare_configs.csv", "compare_summary.json")
COMPARE_PLOTS = ("theorem2_m_sweep.png", "n_sweep.png", "measured_vs_simulated.png")


def run(data: str | Path, out_dir: str | Path | None = None, gpu: str | None = None, plots: bool = True,
        force: bool = False) -> int:
    """Compare a measured CSV with the simulator; print the table, the summary and the fits;
    write comparison CSVs (and plots) to ``out_dir``, all of them or none, refusing to replace
    an earlier comparison there unless ``force``.  ``gpu``: the preset whose L2 models the DRAM
    level; by default the one named in the data's provenance.  Returns 1 if any launch's
    LSU-level error exceeds the 1 % tolerance, else 0; bad input raises ``ValueError`` before
    anything is written."""
    if gpu is not None:
        get_gpu(gpu)  # an unknown preset is refused first
    if force and out_dir is None:
        raise ValueError("force=True (--force) needs out_dir (--out): without it nothing is written")
    names = COMPARE_FILES + (COMPARE_PLOTS if plots else ())
    if out_dir is not None:
        check_overwrite(out_dir, names, force, "an earlier comparison")
    rows, meta = read_measured(data)
    gpu_from_meta = gpu is None
    if gpu is None:
        gpu = preset_of(meta)
        if gpu is None and not meta:
            raise ValueError(f"gpu=None: the data has no provenance ({Path(data).stem}.meta.json) to name its GPU; "
                             "pass gpu= (--gpu) explicitly")
        if gpu is None:
            raise ValueError(f"gpu=None: the data's provenance names GPU {meta.get('gpu')!r}, which matches no "
                             "preset; pass gpu= (--gpu) explicitly")
    start_dirty, probe = replay_dirty_source(meta)
    try:
        records = compare(rows, gpu, start_dirty)
    except ValueError as e:  # nothing printed yet: an error is the one line
        raise _bad(Path(data), " ".join(str(e).split())) from None
    if gpu_from_meta:
        print(f"GPU preset {gpu} (from the data's provenance)")
    if start_dirty:
        print(f"each launch starts with {start_dirty / 2**20:.2f} MiB of other data dirty in the L2 (what ncu's "
              f"replay leaves with this record's {len(meta['metrics'])} metrics: {probe})")
    if meta:
        print(f"measured on {meta.get('gpu')} (driver {meta.get('driver')}, {meta.get('ncu')}), "
              f"{meta.get('date')}, commit {str(meta.get('git_commit'))[:10]}, "
              f"cache control {meta.get('cache_control')}")
    else:
        print(f"provenance: none ({Path(data).stem}.meta.json is not beside the data)")
    print_table(records)
    s = summarize(records)
    print(f"\nLSU level: {s['lsu_within_tolerance']}/{s['launches']} launches within "
          f"{100 * LSU_TOLERANCE:.0f}% (max |err| {100 * s['lsu_max_abs_err']:.3f}%)")
    if "torch_lsu_launches" in s:
        print(f"PyTorch's launches: LSU level, to the byte (loads, LDGSTS included, stores, reductions apart): "
              f"{s['torch_lsu_exact']}/{s['torch_lsu_launches']}; L2 level (TMA launches), L2's own read count "
              f"(lts__t_sectors, after its request coalescer) within 2%: "
              f"{s['torch_l2_within']}/{s['torch_l2_launches']}")
        if s.get("torch_l2_xbar_launches"):
            print(f"  TMA launches, reads as the SMs receive them (xbar_read_sectors, against every CTA's own tiles, "
                  f"the GEMMs' boxes by flashsim.tma's rules) and L2 writes within 2%: "
                  f"{s['torch_l2_xbar_within']}/{s['torch_l2_xbar_launches']}")
    if "lsu_ld_exact" in s:
        n = s["launches"]
        what = ("the LSU's count (cp.async tiles by their shared destination: analysis.fast_set.ldgsts_sectors)"
                if "lsu_ld_walker_exact" in s else "the walker's")
        print(f"LSU level, to the byte: loads equal {what} on {s['lsu_ld_exact']}/{n} launches "
              f"(max |residual| {s['lsu_ld_residual_max_abs_bytes']:,} B), stores on {s['lsu_st_exact']}/{n} "
              f"(max |residual| {s['lsu_st_residual_max_abs_bytes']:,} B)")
    if "lsu_ld_walker_exact" in s:
        print(f"The walker's loads (the global bytes the kernels copy: the IO model's count) equal the measured "
              f"LSU loads on {s['lsu_ld_walker_exact']}/{s['lsu_ld_walker_launches']} fast launches (the others "
              f"copy cp.async tiles whose shared destinations touch more sectors than their sources)")
    if "lsu_red_exact" in s:
        print(f"LSU level, reductions (red/atom through the LSU, apart from loads and stores): equal the walker's "
              f"reduction class on {s['lsu_red_exact']}/{s['launches']} launches (max |residual| "
              f"{s['lsu_red_residual_max_abs_bytes']:,} B)")
    for key, what in (("dram_read", "reads"), ("dram_write", "writes")):
        print(f"DRAM level (flashsim.l2 model of the {gpu} L2), {what}: |err| median "
              f"{100 * s[key + '_median_abs_err']:.1f}%, p95 {100 * s[key + '_p95_abs_err']:.1f}%, "
              f"max {100 * s[key + '_max_abs_err']:.1f}% (each error relative to max(prediction, "
              f"{DRAM_ERR_FLOOR / 1e6:g} MB))")
    print(f"DRAM writes with the background write rate added ({_timed_rate() / 1e6:.1f} MB/s from the fill_wait "
          f"probes of {', '.join(p.name for p in WRITEBACK_RECORDS)} x the launch's measured duration): |err| median "
          f"{100 * s['dram_write_timed_median_abs_err']:.1f}%, p95 {100 * s['dram_write_timed_p95_abs_err']:.1f}%, "
          f"max {100 * s['dram_write_timed_max_abs_err']:.1f}%")
    configs = per_config(records)
    fits = theorem2_fits(configs)
    for name, fit in fits.items():
        ex = ", ".join(f"{k} {v:+.3f} ± {fit['stderr'][k]:.3f}" for k, v in fit["exponents"].items())
        print(f"fit {name}: {ex}  (R² {fit['r2']:.4f}, n = {fit['n']})")
    if out_dir is not None:
        out = Path(out_dir)
        with staged(out, names, force, "an earlier comparison") as stage:
            for name, recs in (("launches", records), ("configs", configs)):
                with open(stage / f"compare_{name}.csv", "w", newline="") as f:
                    # every record's columns (a set's launches may add some: reductions, fast kernels)
                    w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in recs for k in r)))
                    w.writeheader()
                    w.writerows(recs)
            (stage / "compare_summary.json").write_text(json.dumps({"summary": s, "fits": fits, "provenance": meta},
                                                                   indent=1))
            made = []
            if plots:
                # imported here: analysis.plots loads matplotlib (half a second), which a run without
                # plots never needs
                from .plots import plot_all

                # PyTorch's launches are not in these plots
                ours = [c for c in configs if c["kernel"] not in TORCH_KERNELS]
                made = plot_all(ours, stage) if ours else []
        for p in made:
            print(f"wrote {out / p.name}")
    return 0 if s["lsu_within_tolerance"] == s["launches"] else 1
