"""Calibration kernels whose global-memory traffic is known exactly: the metrics' check, and the
L2 that one kernel effectively gets.

    ncu --profile-from-start off ... python -m analysis.calibrate       # copy and gather8
    python -m analysis.calibrate l2 --out DIR [--name NAME] [--force]  # the L2 microbenchmarks
    python -m analysis.calibrate l2-summary DIR/NAME.csv               # their summary (CPU only)
    python -m analysis.calibrate l2-readwrite CSV [--calib NAME.csv]  # scripts/device/l2_readwrite.py vs the model

* ``copy``: n float32 values read and written once, coalesced: LSU load and store bytes are both
  exactly 4n, in 4n/32 sectors.
* ``gather8``: thread t reads element 8t (n/8 threads): 4 useful bytes per 32-byte sector, so
  the LSU moves 8x the useful bytes (n/8 sectors) and stores 4n/8 bytes coalesced.

Each call is profiled on its own and followed by the marker kernel, like the worker's.

**The L2 microbenchmarks** (``l2``) run one kernel, ``l2_sweep``, over a window of W bytes of
one float32 buffer, once per case of :func:`l2_plan`, each launch profiled on its own under
Nsight Compute (``--cache-control all``: L2 flushed before every replay pass, so each launch
starts from a clean L2; ``--clock-control none``) and followed by the marker kernel.  The grid
is persistent (as many 256-thread blocks as the GPU holds at once, from the occupancy API,
unless a case names its number of blocks), and each pass walks the window in grid-stride
order, so the whole grid sweeps the window from its start to its end, and an element is
touched again one whole window later.  Loads are ``ld.global.cg`` (cached in L2, not in L1),
so every load reaches the L2 and the LSU, L2 and DRAM levels count the same requests.  A pass
either reads or writes every ``stride``-th float of the window (``mode``: read, write, or
write in the first pass and read in the others); pass p starts each thread at a rotated
place, so a re-read comes from another block.  The LSU bytes are exact (:func:`expected_lsu`:
each warp touches whole sectors) and every row records whether the measurement equals them.
The patterns:

* ``reread``: W from 4 to 128 MiB read 2 times (and 4 times at a few W, once at 64 MiB): DRAM
  reads / W - 1 is the fraction of re-reads that missed, and where it rises is the capacity one
  kernel gets; a cliff means LRU-like replacement, a ramp something else.
* ``reread_1sm``: the same with one block (one SM) for W from 8 to 64 MiB: does one SM see the
  capacity the whole grid sees (H100 and H200 split their L2 in two partitions)?
* ``stride``: one float per 8 to 256 bytes of a 64 MiB window, once (what DRAM fetches per
  touched sector: 32, 64 or 128 bytes), and one per 128-byte line re-read at a few W (does the
  capacity count lines or sectors?).
* ``stream``: 512 MiB read once: should never hit.
* ``write``: W from 2 to 256 MiB written once (twice at two W; one float per line at 64 MiB):
  the DRAM writes inside the launch against W tell how much of what it wrote is left dirty in
  L2 when it ends, and whether ncu's flush before a replay pass is counted.
* ``write_read``: W written, then read back in the same launch one window later (a kernel's
  output read by the next one, without a launch boundary in between).

Beside them it times a 1 GiB device-to-device copy and the sweep's own read and write passes
with CUDA events (no profiler): the bandwidth ceiling.  It writes ``NAME.csv`` (one row per
case), ``NAME.meta.json`` (provenance), ``NAME.ncu-raw.csv``, ``NAME.bandwidth.csv`` and
``NAME.summary.txt`` (:func:`summarize`), each under a temporary name first, then renamed; it
refuses to overwrite without ``--force``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import config, cuda, float32

from .worker import flashsim_marker

N = 1 << 22  # 4 Mi float32 = 16 MiB


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@cuda.jit
def gather8(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[8 * i]


EXPECTED = {
    "copy": {"lsu_ld_bytes": 4 * N, "lsu_st_bytes": 4 * N},
    "gather8": {"lsu_ld_bytes": 32 * (N // 8), "lsu_st_bytes": 4 * (N // 8)},
}


def run_basic() -> int:
    """copy and gather8, each profiled on its own and followed by the marker kernel."""
    src = cuda.to_device(np.arange(N, dtype=np.float32))
    dst = cuda.device_array(N, dtype=np.float32)
    dst8 = cuda.device_array(N // 8, dtype=np.float32)
    mark = cuda.to_device(np.zeros(1, dtype=np.int32))
    copy[N // 256, 256](src, dst)  # compile outside the profiled region
    gather8[N // 8 // 256, 256](src, dst8)
    cuda.synchronize()
    for i, (kern, out) in enumerate(((copy, dst), (gather8, dst8))):
        cuda.profile_start()
        kern[out.size // 256, 256](src, out)
        cuda.synchronize()
        flashsim_marker[1, 1](mark, i)
        cuda.synchronize()
        cuda.profile_stop()
    assert np.array_equal(dst8.copy_to_host(), np.arange(0, N, 8, dtype=np.float32))
    return 0


# ---------------------------------------------------------------------------------------------
# The L2 microbenchmark kernel

if config.ENABLE_CUDASIM:  # the simulator has no inline PTX: a plain load, same indices
    def _load(a, i):
        return a[i]

    LOAD = "plain load (CUDA simulator)"
else:
    from numba.cuda.cache_hints import ldcg_intrinsic as _load

    LOAD = "ld.global.cg"

READ, WRITE, WRITE_READ = 0, 1, 2
MODES = {READ: "read", WRITE: "write", WRITE_READ: "write_read"}
THREADS = 256
MiB = 1 << 20


@cuda.jit
def l2_sweep(buf, n, stride, passes, mode, shift, keep, out):
    """Walk every ``stride``-th float32 of ``buf[:n]`` ``passes`` times in grid-stride order.

    mode 0 reads in every pass, 1 writes in every pass, 2 writes in pass 0 and reads after.
    Pass p starts thread g at (g + p * shift) mod gridsize.  The reads' sum is stored in
    ``out[g]`` when ``keep`` (the tests) or if negative (never, on the non-negative data the
    benchmark writes: the store keeps the loads alive without moving any bytes)."""
    g = cuda.grid(1)
    t = cuda.gridsize(1)
    m = n // stride
    acc = float32(0.0)
    for p in range(passes):
        gp = (g + p * shift) % t
        write = mode == 1 or (mode == 2 and p == 0)
        for k in range(gp, m, t):
            if write:
                buf[k * stride] = float32(k + p)
            else:
                acc += _load(buf, k * stride)
    if keep != 0 or acc < 0:
        out[g] = acc


def _check_case(case: dict) -> None:
    for f in ("pattern", "mode", "window_bytes", "stride", "passes"):
        if f not in case:
            raise ValueError(f"case {case!r}: field {f!r} missing")
    s, w, p, mode = case["stride"], case["window_bytes"], case["passes"], case["mode"]
    if mode not in MODES:
        raise ValueError(f"{mode=}: must be one of {sorted(MODES)}")
    if s < 1 or s & (s - 1):
        raise ValueError(f"stride={s}: must be a power of two (floats)")
    if w <= 0 or w % (4 * 32 * s):
        raise ValueError(f"window_bytes={w}: must be a positive multiple of 128 * stride ({128 * s})")
    if p < 1 or (mode == WRITE_READ and p < 2):
        raise ValueError(f"passes={p}: must be >= 1 (>= 2 for write_read)")
    blocks = case.get("blocks", 0)
    if not isinstance(blocks, (int, np.integer)) or blocks < 0:
        raise ValueError(f"{blocks=}: must be 0 (the persistent grid) or a number of blocks")


def expected_lsu(case: dict) -> tuple[int, int]:
    """(load bytes, store bytes) the LSU moves for ``case``: each pass touches n / stride floats,
    a warp's 32 consecutive ones at once, so 4 * min(stride, 8) bytes of whole sectors each."""
    _check_case(case)
    s, p, mode = case["stride"], case["passes"], case["mode"]
    per_pass = (case["window_bytes"] // 4 // s) * 4 * min(s, 8)
    reads = {READ: p, WRITE: 0, WRITE_READ: p - 1}[mode]
    writes = {READ: 0, WRITE: p, WRITE_READ: 1}[mode]
    return reads * per_pass, writes * per_pass


def sweep_indices(n: int, stride: int, passes: int, mode: int, shift: int, nthreads: int):
    """Pure-Python twin of ``l2_sweep``: per pass, per thread, the indices it touches and
    whether it writes them (for the tests)."""
    out = []
    for p in range(passes):
        write = mode == WRITE or (mode == WRITE_READ and p == 0)
        per = [[k * stride for k in range((g + p * shift) % nthreads, n // stride, nthreads)]
               for g in range(nthreads)]
        out.append((write, per))
    return out


def lsu_bytes_of_twin(n, stride, passes, mode, shift, nthreads, warp=32) -> tuple[int, int]:
    """LSU bytes of the twin's accesses: per warp and loop iteration, 32 bytes per distinct sector."""
    ld = st = 0
    for write, per in sweep_indices(n, stride, passes, mode, shift, nthreads):
        for w0 in range(0, nthreads, warp):
            lanes = per[w0:w0 + warp]
            for it in range(max(len(x) for x in lanes)):
                sectors = {x[it] * 4 // 32 for x in lanes if it < len(x)}
                if write:
                    st += 32 * len(sectors)
                else:
                    ld += 32 * len(sectors)
    return ld, st


def l2_plan(quick: bool = False) -> list[dict]:
    """The cases, in the order they run (W in MiB below; strides in floats)."""
    cases = []

    def add(pattern, mode, mib, stride=1, passes=1, blocks=0):
        cases.append({"pattern": pattern, "mode": mode, "window_bytes": int(mib * MiB), "stride": stride,
                      "passes": passes, "blocks": blocks})

    if quick:
        for w in (4, 32, 64):
            add("reread", READ, w, passes=2)
        add("stride", READ, 16, stride=32)
        add("stream", READ, 64)
        for w in (4, 64):
            add("write", WRITE, w)
        add("write_read", WRITE_READ, 16, passes=2)
        return cases
    for w in (4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80, 96, 128):
        add("reread", READ, w, passes=2)
    for w in (16, 32, 48, 64, 96):
        add("reread", READ, w, passes=4)
    add("reread", READ, 64, passes=1)
    for w in (8, 16, 24, 32, 40, 48, 64):  # one block, so one SM: does it see the capacity the grid sees?
        add("reread_1sm", READ, w, passes=2, blocks=1)
    for s in (2, 4, 8, 16, 32, 64):
        add("stride", READ, 64, stride=s)
    for w in (16, 32, 48, 64, 96):
        add("stride", READ, w, stride=32, passes=2)
    add("stream", READ, 512)
    for w in (2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128, 256):
        add("write", WRITE, w)
    for w in (16, 64):
        add("write", WRITE, w, passes=2)
    add("write", WRITE, 64, stride=32)
    for w in (8, 16, 24, 32, 40, 48, 64, 96):
        add("write_read", WRITE_READ, w, passes=2)
    return cases


def _sm_count() -> int:
    """The GPU's SM count (2 under the CUDA simulator, which has no such attribute)."""
    return int(getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 2))


def shift_of(blocks: int, threads: int = THREADS) -> int:
    """Pass p starts thread g at g + p * shift: about half the grid and one block further on, so a
    re-read comes from another block (and most likely another SM)."""
    return (threads * (blocks // 2 + 1)) % (blocks * threads)


def _grid(threads: int = THREADS) -> dict:
    """The persistent grid: blocks per SM from the occupancy API (``l2_sweep`` compiled first)."""
    sms = _sm_count()
    try:
        kern = next(iter(l2_sweep.overloads.values()))
        per_sm = int(kern.max_cooperative_grid_blocks(threads)) // sms
        how = "occupancy API"
    except Exception as e:  # keep measuring: 2 blocks of 256 threads always fit on an SM
        per_sm, how = 2, f"fallback (occupancy API failed: {e})"
    per_sm = max(1, min(per_sm, 2048 // threads))
    blocks = sms * per_sm
    shift = shift_of(blocks, threads)
    return {"sm_count": sms, "blocks_per_sm": per_sm, "blocks": blocks, "threads": threads, "shift": shift,
            "grid_from": how, "load": LOAD}


def l2_worker(plan_path: str, manifest_path: str) -> int:
    """The program ncu profiles: each case's launch, then the marker, each in its own range."""
    cases = json.loads(Path(plan_path).read_text())
    for c in cases:
        _check_case(c)
    buf = cuda.device_array(max(c["window_bytes"] for c in cases) // 4, dtype=np.float32)
    mark = cuda.to_device(np.zeros(1, dtype=np.int32))
    sms = _sm_count()
    out = cuda.device_array(sms * 2048, dtype=np.float32)
    # compile, then fill the buffer with non-negative values, outside the profiled ranges
    l2_sweep[sms, THREADS](buf, buf.size, 1, 1, WRITE, 0, 0, out)
    cuda.synchronize()
    grid = _grid()
    l2_sweep[grid["blocks"], THREADS](buf, buf.size, 1, 1, WRITE, 0, 0, out)
    flashsim_marker[1, 1](mark, 0)  # compiled here too, outside the profiled ranges
    cuda.synchronize()
    t0 = time.perf_counter()
    for i, c in enumerate(cases):
        nb = c.get("blocks") or grid["blocks"]
        c["blocks_launched"] = nb
        cuda.profile_start()
        l2_sweep[nb, THREADS](buf, c["window_bytes"] // 4, c["stride"], c["passes"], c["mode"], shift_of(nb), 0, out)
        cuda.synchronize()
        cuda.profile_stop()
        cuda.profile_start()
        flashsim_marker[1, 1](mark, i)
        cuda.synchronize()
        cuda.profile_stop()
        print(f"[{i + 1}/{len(cases)}] {case_label(c)}, {nb} blocks ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr, flush=True)
    Path(manifest_path).write_text(json.dumps({"grid": grid, "cases": cases}, indent=1))
    return 0


def case_label(c: dict) -> str:
    return f"{c['pattern']} W={c['window_bytes'] / MiB:g} MiB stride={4 * c['stride']} B passes={c['passes']}"


# ---------------------------------------------------------------------------------------------
# Records: the ncu export to one row per case

L2_FIELDS = ("pattern", "mode", "window_bytes", "stride_bytes", "passes", "blocks", "lsu_ld_expected",
             "lsu_st_expected", "lsu_exact", "lsu_ld_bytes", "lsu_st_bytes", "l2_read_sectors", "l2_write_sectors",
             "dram_read_bytes", "dram_write_bytes", "time_ns", "kernel_name", "grid", "block")
_INT_FIELDS = ("window_bytes", "stride_bytes", "passes", "blocks", "lsu_ld_expected", "lsu_st_expected", "lsu_ld_bytes",
               "lsu_st_bytes", "l2_read_sectors", "l2_write_sectors", "dram_read_bytes", "dram_write_bytes")


def l2_rows(cases: list[dict], launches: list[dict]) -> list[dict]:
    """One row per case from the parsed ncu launches (``analysis.ncu.parse_raw_csv``): the k-th
    group before a marker is the k-th case, and it must be one ``l2_sweep`` launch."""
    from .ncu import split_by_marker

    groups = split_by_marker(launches)
    if len(groups) != len(cases):
        raise ValueError(f"{len(groups)} launch groups in the ncu data for {len(cases)} cases")
    rows = []
    for c, g in zip(cases, groups):
        if len(g) != 1 or "l2_sweep" not in g[0]["kernel"]:
            raise ValueError(f"case {case_label(c)}: expected one l2_sweep launch, got {[r['kernel'] for r in g]}")
        rec = g[0]
        ld, st = expected_lsu(c)
        row = {"pattern": c["pattern"], "mode": MODES[c["mode"]], "window_bytes": c["window_bytes"],
               "stride_bytes": 4 * c["stride"], "passes": c["passes"], "blocks": c.get("blocks_launched", ""),
               "lsu_ld_expected": ld, "lsu_st_expected": st,
               "lsu_exact": rec["lsu_ld_bytes"] == ld and rec["lsu_st_bytes"] == st}
        for f in ("lsu_ld_bytes", "lsu_st_bytes", "l2_read_sectors", "l2_write_sectors", "dram_read_bytes",
                  "dram_write_bytes", "time_ns"):
            row[f] = rec[f]
        row.update(kernel_name=rec["kernel"], grid=rec["grid"], block=rec["block"])
        rows.append(row)
    return rows


def rows_to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(L2_FIELDS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def read_l2_csv(path) -> list[dict]:
    """The rows of an ``l2`` record (``NAME.csv``), numbers typed."""
    return read_l2_csv_text(Path(path).read_text(), str(path))


def read_l2_csv_text(text: str, path: str = "l2 record") -> list[dict]:
    reader = csv.DictReader(io.StringIO(text))
    need = ("pattern", "mode", "window_bytes", "stride_bytes", "passes", "dram_read_bytes", "dram_write_bytes")
    missing = [f for f in need if f not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: columns missing: {missing}")
    rows = []
    for r in reader:
        for f in _INT_FIELDS:
            if f in r and r[f] not in ("", None):
                r[f] = int(float(r[f]))
        if r.get("time_ns") not in ("", None):
            r["time_ns"] = float(r["time_ns"])
        r["lsu_exact"] = str(r.get("lsu_exact", "")).lower() == "true"
        if r["window_bytes"] <= 0:
            raise ValueError(f"{path}: window_bytes={r['window_bytes']}: must be positive")
        rows.append(r)
    return rows


# ---------------------------------------------------------------------------------------------
# The fit: what the rows say about the L2

def _crossing(points: list[tuple[float, float]], level: float):
    """The first W where the piecewise-linear f(W) reaches ``level`` (None if it never does)."""
    for (w0, f0), (w1, f1) in zip(points, points[1:]):
        if f0 < level <= f1:
            return w0 + (level - f0) * (w1 - w0) / (f1 - f0)
    if points and points[0][1] >= level:
        return points[0][0]
    return None


def transition(points: list[tuple[float, float]], cliff_width: float = 0.25) -> dict:
    """Where a miss fraction f(W) (0 = every re-use hits, 1 = every one misses) rises: the W at
    f = 0.5 (the effective capacity), at 0.1 and 0.9, and the shape: "cliff" when 0.1 to 0.9
    spans at most ``cliff_width`` of the capacity or no sample lies inside the rise (LRU-like),
    else "ramp"; and the samples that bracket the rise (last W that hits, first W that misses)."""
    pts = sorted(points)
    if len(pts) < 2:
        raise ValueError(f"points={pts}: a transition needs at least two window sizes")
    c, lo, hi = _crossing(pts, 0.5), _crossing(pts, 0.1), _crossing(pts, 0.9)
    # the samples that bracket the rise: the last W with f <= 0.1 before it, the first with f >= 0.9
    below = [w for w, f in pts if f <= 0.1 and (hi is None or w < hi)]
    above = [w for w, f in pts if f >= 0.9 and (lo is None or w > lo)]
    out = {"capacity_bytes": c, "w10_bytes": lo, "w90_bytes": hi, "last_hit_bytes": max(below, default=None),
           "first_miss_bytes": min(above, default=None), "points": pts}
    between = [f for w, f in pts if 0.1 < f < 0.9]
    if c is None:
        out["shape"] = f"no transition: f <= 0.5 up to W = {pts[-1][0] / MiB:g} MiB"
    elif hi is None:
        out["shape"] = f"ramp (f reaches {max(f for _, f in pts):.2f} at most)"
    else:  # no sample inside the rise: as sharp as the sampling can tell
        out["shape"] = "cliff" if not between or (hi - lo) <= cliff_width * c else "ramp"
    return out


def _sel(rows, pattern, stride_bytes=None, passes=None, mode=None):
    return [r for r in rows if r["pattern"] == pattern and (stride_bytes is None or r["stride_bytes"] == stride_bytes)
            and (passes is None or r["passes"] == passes) and (mode is None or r["mode"] == mode)]


def fetch_granularity(rows: list[dict]):
    """The DRAM fetch unit G (32, 64 or 128 bytes) that best predicts the single-pass strided
    reads: a read of one float per ``s`` bytes fetches W / max(s, G) * G bytes."""
    strided = [r for r in _sel(rows, "stride", passes=1) if r["stride_bytes"] >= 32]
    if not strided:
        return None, None
    best = None
    for g in (32, 64, 128):
        err = max(abs(r["dram_read_bytes"] / (r["window_bytes"] // max(r["stride_bytes"], g) * g) - 1)
                  for r in strided)
        if best is None or err < best[1]:
            best = (g, err)
    return best


def summarize(rows: list[dict]) -> dict:
    """What an ``l2`` record says: effective capacity and replacement shape (re-reads), fetch
    granularity (strided reads), dirty bytes left at a launch's end (writes), read-after-write
    hits, streaming."""
    s: dict = {"lsu_exact": f"{sum(bool(r['lsu_exact']) for r in rows)}/{len(rows)}"}
    for pattern in ("reread", "reread_1sm"):
        for passes in sorted({r["passes"] for r in _sel(rows, pattern, 4, mode="read")} - {1}):
            pts = [(r["window_bytes"], (r["dram_read_bytes"] / r["window_bytes"] - 1) / (passes - 1))
                   for r in _sel(rows, pattern, 4, passes, "read")]
            if len(pts) >= 2:
                s[f"{pattern}_x{passes}"] = transition(pts)
    g, err = fetch_granularity(rows)
    s["fetch_granularity_bytes"], s["fetch_granularity_max_rel_err"] = g, err
    line_rows = [r for r in _sel(rows, "stride", passes=2) if r["stride_bytes"] >= 32]
    if g and len(line_rows) >= 2:  # first pass fetches W / max(s, G) * G; the re-read the same if it misses
        pts = []
        for r in line_rows:
            first = r["window_bytes"] // max(r["stride_bytes"], g) * g
            pts.append((r["window_bytes"], (r["dram_read_bytes"] - first) / first))
        s["stride_reread"] = transition(pts)
    writes = sorted(_sel(rows, "write", 4, 1), key=lambda r: r["window_bytes"])
    if writes:
        dirty = [(r["window_bytes"], max(0, r["window_bytes"] - r["dram_write_bytes"])) for r in writes]
        s["dirty_at_end"] = dirty
        s["dirty_max_bytes"] = max(d for _, d in dirty)
        small = writes[0]
        s["flush_counted"] = small["dram_write_bytes"] > 0.5 * small["window_bytes"]
        s["write_evict"] = transition([(w, r["dram_write_bytes"] / w) for (w, _), r in zip(dirty, writes)])
    wr = _sel(rows, "write_read", 4, 2)
    if len(wr) >= 2:
        s["read_after_write"] = transition([(r["window_bytes"], r["dram_read_bytes"] / r["window_bytes"]) for r in wr])
    st = _sel(rows, "stream")
    if st:
        s["stream_read_ratio"] = [(r["window_bytes"], r["dram_read_bytes"] / r["window_bytes"]) for r in st]
    return s


#: The patterns :func:`model_case` replays (``reread_1sm`` is not: one SM sees one partition's
#: half of the L2 and the model has no partitions).
MODELLED = ("reread", "stride", "stream", "write", "write_read")


def model_case(row: dict, capacity: float, dirty: float | None, fetch: int, policy: str = "nru", ways: int = 16,
               scale: int = 1, random_share: float = 0.0) -> tuple[float, float]:
    """(DRAM read bytes, DRAM write bytes) that flashsim.l2's cache predicts for one case of an
    ``l2`` record: the case's passes over its window in address order (the grid-stride sweep
    moves through the window from start to end, a grid-width at a time), from an empty L2, the
    dirty lines left at the end not counted (ncu's flush writes them outside the launch).
    ``scale`` > 1 shrinks the window, the capacity and the dirty limit by that factor (faster;
    the counts are scaled back)."""
    from flashsim.l2 import L2

    if row["pattern"] not in MODELLED:
        raise ValueError(f"pattern={row['pattern']!r}: not one the model replays ({', '.join(MODELLED)})")
    w = row["window_bytes"] // scale
    cache = L2(int(capacity / scale), 128, 32, ways, policy=policy,
               dirty_limit=None if dirty is None else int(dirty / scale), fetch_bytes=fetch, random_share=random_share)
    ctr = np.zeros(4, dtype=np.int64)
    s = row["stride_bytes"]
    for p in range(row["passes"]):
        wr = row["mode"] == "write" or (row["mode"] == "write_read" and p == 0)
        if s <= 32:  # every sector of the window: whole ranges
            for a in range(0, w, 1 << 20):
                cache.access(a, min(1 << 20, w - a), wr, ctr)
        else:  # one float per s bytes
            for a in range(0, w, s):
                cache.access(a, 4, wr, ctr)
    return float(ctr[2] * 32 * scale), float(ctr[3] * 32 * scale)


def _reread_points(rows: list[dict]) -> list[tuple[int, float]]:
    return [(r["window_bytes"], r["dram_read_bytes"] / r["window_bytes"] - 1)
            for r in _sel(rows, "reread", 4, 2, "read")]


#: The hot_stream probe's grid of scripts/device/l2_policy.py (4 x 132 blocks of 256 threads on
#: the H100): each step streams, and re-reads of the hot buffer, one grid-width of floats.
HOT_STREAM_STEP = 4 * 132 * 256 * 4


def hot_stream_misses(rows: list[dict]) -> list[tuple[str, int, float]]:
    """(mode, hot MiB, fraction of the hot buffer's re-reads that miss) of the ``hot_stream``
    probes of a scripts/device/l2_policy.py record (rows as csv.DictReader gives them): DRAM
    reads beyond the stream (when it is read) and the hot buffer's first reading, over the
    256 MiB of hot re-reads."""
    out = []
    for r in rows:
        if r.get("probe") != "hot_stream":
            continue
        s, h = int(r["mib"]), int(r["hot_mib"])
        extra = int(r["dram_read_bytes"]) / MiB - (s if r["mode"] == "read" else 0) - h
        out.append((r["mode"], h, extra / s))
    return out


def model_hot_stream(mode: str, hot_mib: int, capacity: float, dirty: float | None, fetch: int,
                     policy: str = "nru", random_share: float = 0.0, scale: int = 4, stream_mib: int = 256) -> float:
    """The hot_stream probe through flashsim.l2's cache at 1/``scale`` size: the fraction of the
    hot buffer's re-reads that miss (see :func:`hot_stream_misses`)."""
    from flashsim.l2 import L2

    cache = L2(int(capacity / scale), 128, 32, 16, policy=policy,
               dirty_limit=None if dirty is None else int(dirty / scale), fetch_bytes=fetch, random_share=random_share)
    ctr = np.zeros(4, dtype=np.int64)
    s, h, t = stream_mib * MiB // scale, hot_mib * MiB // scale, HOT_STREAM_STEP // scale
    hot0, j = 1 << 40, 0
    for a in range(0, s, t):
        cache.access(a, t, mode == "write", ctr)
        n = min(t, h - j)
        cache.access(hot0 + j, n, False, ctr)
        if n < t:
            cache.access(hot0, t - n, False, ctr)
        j = (j + t) % h
    reads = ctr[2] * 32 * scale / MiB
    return (reads - (stream_mib if mode == "read" else 0) - hot_mib) / stream_mib


#: The shares :func:`fit_random_share` tries.
SHARES = tuple(round(0.05 * k, 2) for k in range(13))


def fit_random_share(policy_rows: list[dict], capacity: float, dirty: float | None, fetch: int,
                     shares=SHARES) -> tuple[float, float]:
    """(share, rms): the share of NRU's victims drawn among all the ways for which the model's
    cache loses the hot buffer's re-reads as the hot_stream probes measure, in least squares
    over ``shares``."""
    pts = hot_stream_misses(policy_rows)
    if not pts:
        raise ValueError("policy_rows: no hot_stream probe")
    best = None
    for q in shares:
        e = sum((model_hot_stream(m, h, capacity, dirty, fetch, "nru", float(q)) - f) ** 2 for m, h, f in pts)
        if best is None or e < best[1]:
            best = (float(q), e)
    return round(best[0], 2), float(np.sqrt(best[1] / len(pts)))


def reread_rms(rows: list[dict], capacity: float, dirty: float | None, fetch: int, policy: str = "nru",
               random_share: float = 0.0, scale: int = 16) -> float:
    """The rms, over the grid's 2-pass re-reads of an ``l2`` record (``reread``, 4-byte stride), of
    the model's miss fraction (:func:`model_case`) less the measured one."""
    pts = _reread_points(rows)
    case = {r["window_bytes"]: r for r in _sel(rows, "reread", 4, 2, "read")}
    e = 0.0
    for w, f in pts:
        rd, _ = model_case(case[w], capacity, dirty, fetch, policy, scale=scale, random_share=random_share)
        e += (rd / w - 1 - f) ** 2
    return float(np.sqrt(e / len(pts))) if pts else float("nan")


#: scripts/device/l2_readwrite.py's grid-width step in bytes on an H100 or H200 (4 blocks of 256
#: threads on each of 132 SMs, one float32 a thread)
READWRITE_STEP = 4 * 132 * 256 * 4


def readwrite_steps(probe: str, nr: int, nw: int, w: int):
    """The order of a ``scripts/device/l2_readwrite.py`` probe's accesses, a grid-width step (``w``
    units) at a time, over ``nr`` units read and ``nw`` stored (whole steps): (stores?, the step's
    first unit in its buffer).  ``interleaved``: a step of the read buffer, and one of the stored
    buffer every nr/nw steps (the stores alone when nothing is read); ``read_write``: the reads,
    then the stores; ``write_read``: the stores, then the reads."""
    if probe not in ("interleaved", "read_write", "write_read"):
        raise ValueError(f"probe={probe!r}: one of interleaved, read_write, write_read")
    reads = [(False, a) for a in range(0, nr, w)]
    stores = [(True, a) for a in range(0, nw, w)]
    if probe == "read_write":
        return reads + stores
    if probe == "write_read" or nr == 0:
        return stores + reads
    ratio = max(1, nr // max(nw, 1))
    out = []
    for i, r in enumerate(reads):
        out.append(r)
        if i % ratio == 0 and (i // ratio) * w < nw:
            out.append((True, (i // ratio) * w))
    return out


def model_readwrite(row: dict, capacity: float, dirty: float | None, fetch: int, policy: str = "nru",
                    random_share: float = 0.0, scale: int = 8, step: int = READWRITE_STEP) -> float:
    """DRAM write bytes that flashsim.l2's cache predicts for one probe of
    ``scripts/device/l2_readwrite.py`` (a row of its CSV): R MiB read and W MiB stored, each
    rounded down to whole grid-width steps as the probe does, in its order
    (:func:`readwrite_steps`), from an empty L2, the dirty lines left at the end not counted.  ``scale`` > 1
    shrinks buffers, capacity and dirty limit by that factor."""
    from flashsim.l2 import L2

    cache = L2(int(capacity / scale), 128, 32, 16, policy=policy,
               dirty_limit=None if dirty is None else int(dirty / scale), fetch_bytes=fetch, random_share=random_share)
    ctr = np.zeros(4, dtype=np.int64)
    w = step // scale
    wbase = 1 << 40  # the stored buffer, far from the read one
    for store, a in readwrite_steps(row["probe"], int(row["read_mib"]) * MiB // step * w,
                                    int(row["write_mib"]) * MiB // step * w, w):
        cache.access(wbase + a if store else a, w, store, ctr)
    return float(ctr[3] * 32 * scale)


def readwrite_table(rows: list[dict], capacity: float, dirty: float | None, fetch: int, policy: str = "nru",
                    random_share: float = 0.0, scale: int = 8) -> tuple[list[tuple[dict, float, float]], float]:
    """([(row, measured DRAM write bytes, model's)], rms of their difference in bytes) over the
    probes of a ``scripts/device/l2_readwrite.py`` record (rows as csv.DictReader gives them)."""
    out = [(r, float(r["dram_write_bytes"]), model_readwrite(r, capacity, dirty, fetch, policy, random_share, scale))
           for r in rows]
    rms = float(np.sqrt(np.mean([(m - p) ** 2 for _, m, p in out]))) if out else float("nan")
    return out, rms


def l2_model_parameters(rows: list[dict], l2_bytes: int, policy: str = "nru", scale: int = 16,
                        random_share: float = 0.0) -> dict:
    """The L2 model's parameters (flashsim.l2) from an ``l2`` record, for a GPU whose L2 holds
    ``l2_bytes``:

    * ``dirty_bytes``: the median of W - DRAM writes over the single-pass ``write`` cases with W
      at least 1.25 x the most left dirty (the plateau: what one launch leaves dirty at most);
    * ``fetch_bytes``: :func:`fetch_granularity`;
    * ``capacity_bytes``: the capacity C for which the model's cache (``policy`` with
      ``random_share``, 16 ways, that dirty limit and fetch unit; :func:`model_case` at
      1/``scale`` size) predicts the grid's
      2-pass re-reads (``reread``, 4-byte stride) best, in least squares of the re-reads' miss
      fraction; C searched from 8 to 128 MiB by golden section, to 1/16 MiB;
    * the two sizes as fractions of ``l2_bytes`` (what the presets record), and the fit's rms.
    """
    pts = _reread_points(rows)
    if len(pts) < 3:
        raise ValueError(f"rows: {len(pts)} two-pass re-read cases; the capacity fit needs at least 3")
    writes = _sel(rows, "write", 4, 1, "write")
    if not writes:
        raise ValueError("rows: no single-pass write case; the dirty limit needs them")
    dmax = max(r["window_bytes"] - r["dram_write_bytes"] for r in writes)
    plateau = [r["window_bytes"] - r["dram_write_bytes"] for r in writes if r["window_bytes"] >= 1.25 * dmax]
    if not plateau:
        raise ValueError("rows: no write case at least 1.25 x the dirty bytes left; the dirty limit is not measured")
    dirty = float(np.median(plateau))
    g, _ = fetch_granularity(rows)

    def err(c):
        return len(pts) * reread_rms(rows, c, dirty, g or 32, policy, random_share, scale) ** 2

    lo, hi = 8.0 * MiB, 128.0 * MiB
    phi = (5 ** 0.5 - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    ea, eb = err(a), err(b)
    while hi - lo > MiB / 16:
        if ea <= eb:
            hi, b, eb = b, a, ea
            a = hi - phi * (hi - lo)
            ea = err(a)
        else:
            lo, a, ea = a, b, eb
            b = lo + phi * (hi - lo)
            eb = err(b)
    cap = round((lo + hi) / 2 / (MiB / 16)) * (MiB / 16)
    return {"capacity_bytes": cap, "dirty_bytes": dirty, "fetch_bytes": g, "policy": policy,
            "capacity_fraction": cap / l2_bytes, "dirty_fraction": dirty / l2_bytes,
            "fit_rms": float(np.sqrt(err(cap) / len(pts)))}


def timed_writeback_rate(*paths) -> float:
    """Bytes per second that reach DRAM as writes while a kernel runs, whatever it stores: the
    least-squares slope through the origin of DRAM writes against the kernel's duration over
    the ``fill_wait`` probes (W MiB stored, then the kernel kept alive T ms) of the records at
    ``paths`` (scripts/device/l2_writeback.py, T = 0-64 ms; scripts/device/l2_policy.py, T =
    128-512 ms).  On the H100 about 19 MB/s, independent of W (8, 16 or 20 MiB: 4.7-5.2 MB at
    256 ms) and more than was stored at 512 ms (9.7 MB for 8 MiB): a background rate, not the
    cleaning of the kernel's own dirty lines."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("probe") == "fill_wait"]
    if len(rows) < 2:
        raise ValueError(f"{paths}: {len(rows)} fill_wait probes; the rate needs at least 2")
    t = np.array([float(r["time_ns"]) * 1e-9 for r in rows])
    w = np.array([float(r["dram_write_bytes"]) for r in rows])
    return float(t @ w / (t @ t))


def replay_dirty_bytes(path) -> dict:
    """What Nsight Compute's replay leaves dirty in the L2 when a launch is measured with more
    metrics than the calibration's 7, from the store and read probes of
    scripts/device/l2_dirty_probe.py at ``path``: each metric set's store streams leave
    ``left`` bytes dirty (the median over the fill and zero-fill cases), and ``start_dirty``, for
    each wider set, the difference between the narrowest set's median and its own: the other data
    that set finds dirty when its launch starts (the fast set's 10 metrics on the H200: 2.06
    MiB; analysis.measure's 17, 2.00 MiB; a launch that only reads 64 MiB writes 2.0-2.4 MiB
    with them and 0.06-0.39 MiB with the 7).  Returns {"metrics": the sets' names, narrowest
    first ("m7", "m10", ...), "left": {set: bytes}, "read_writes": {set: the median DRAM writes
    of the read probes}, "start_dirty": {wider set: bytes}}."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    sets = sorted({r["metrics"] for r in rows}, key=lambda m: int(m.lstrip("m")))
    if len(sets) < 2:
        raise ValueError(f"{path}: metric sets {sets}; the probe needs at least two")
    left = {m: float(np.median([float(r["dirty_left_bytes"]) for r in rows if r["metrics"] == m
                                and r["probe"].startswith(("fill", "zero"))])) for m in sets}
    reads = {m: float(np.median([float(r["dram_write_bytes"]) for r in rows if r["metrics"] == m
                                 and r["probe"].startswith("read")])) for m in sets}
    start = {m: max(0, round(left[sets[0]] - left[m])) for m in sets[1:]}
    return {"metrics": sets, "left": left, "read_writes": reads, "start_dirty": start}


#: the lags of the half-line cases (scripts/device/l2_halfline_probe.py's and l2_quarter_probe.py's
#: 128 MiB ``lag`` cases with two parts) that the merge table takes (0 to 1 MiB); beyond, the
#: model holds the last share (0).  Not taken: 8 MiB and 64 MiB, half the buffer (see
#: split_merge_curve)
SPLIT_MERGE_LAGS = (0, 1, 16, 128, 1024, 8192)


def split_merge_curve(*paths) -> dict:
    """The L2's rule for lines stored in parts (flashsim.config.Hardware.l2_split_merge and
    l2_split_cost) from the half-line cases of the probe records at ``paths``
    (scripts/device/l2_halfline_probe.py and l2_quarter_probe.py, lags in lines; a row without
    ``parts`` has two): ``full``, what a stream of whole lines leaves dirty (the median over the
    fill32 and tile32 cases of 128 MiB or more), ``left`` {lag: the median over the 128 MiB
    half-line cases, both orders}, ``cost`` and ``points``.

    The model: a line whose two halves join takes 1 + c lines of the dirty limit, one whose
    first half was orphaned (written back at the next passing of the limit) one line holding 64
    bytes.  At lag 0 every half joins (the quarter probe: lines stored in quarters at once leave
    what halves leave, so what is lost there is not one orphaning per join), hence c = full /
    left[0] - 1.  Beyond, a share s of the lines join: left / full = h = (s + (1 - s) / 2) /
    (s (1 + c) + 1 - s), so s = (h - 1/2) / (1/2 - h c), held in [0, 1] and rounded to 0.001;
    ``points``: (bytes stored between the halves, 128 x lag; s) for each lag of
    SPLIT_MERGE_LAGS.  Below the limit (2-16 MiB) nothing is written back: orphans wait for the
    limit."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("lag_lines") is not None]
    full = [float(r["dirty_left_bytes"]) for r in rows if r["probe"] in ("fill32", "tile32")
            and float(r["lsu_st_bytes"]) >= 128 * MiB]
    if not full:
        raise ValueError(f"{paths}: no fill32 or tile32 case of 128 MiB or more; the full-line level is not measured")
    full_left = float(np.median(full))
    left = {}
    for lag in SPLIT_MERGE_LAGS:
        d = [float(r["dirty_left_bytes"]) for r in rows if r["probe"] == "lag" and r["lag_lines"] == str(lag)
             and r.get("parts", "2") in ("", "2") and float(r["lsu_st_bytes"]) == 128 * MiB]
        if not d:
            raise ValueError(f"{paths}: no 128 MiB half-line case of lag {lag} lines")
        left[lag] = float(np.median(d))
    cost = round(max(0.0, full_left / left[0] - 1), 3)

    def share(h):
        return round(min(1.0, max(0.0, (h - 0.5) / (0.5 - h * cost))), 3)

    points = tuple((128 * lag, share(left[lag] / full_left)) for lag in SPLIT_MERGE_LAGS)
    return {"full": full_left, "left": left, "cost": cost, "points": points}


def _mib(x) -> str:
    return "-" if x is None else f"{x / MiB:.1f} MiB"


def format_summary(s: dict, rows: list[dict] | None = None, bandwidth: list[dict] | None = None) -> str:
    """The summary as text: the per-case table (if ``rows``), then the derived numbers."""
    out = []
    if rows:
        out.append(f"{'pattern':<11}{'W MiB':>8}{'stride':>7}{'pass':>5}{'DRAM rd/W':>10}{'DRAM wr/W':>10}"
                   f"{'L2 rd sect':>12}{'lsu ok':>7}{'us':>9}")
        for r in rows:
            w = r["window_bytes"]
            t = r.get("time_ns")
            out.append(f"{r['pattern']:<11}{w / MiB:>8.1f}{r['stride_bytes']:>7}{r['passes']:>5}"
                       f"{r['dram_read_bytes'] / w:>10.3f}{r['dram_write_bytes'] / w:>10.3f}"
                       f"{r.get('l2_read_sectors', ''):>12}{'yes' if r['lsu_exact'] else 'NO':>7}"
                       f"{(t / 1e3 if isinstance(t, float) else float('nan')):>9.1f}")
        out.append("")
    out.append(f"LSU bytes equal to the expected: {s['lsu_exact']} cases")
    for k in sorted(k for k in s if k.startswith("reread")):
        t, (what, x) = s[k], k.rsplit("_x", 1)
        who = "one block" if what == "reread_1sm" else "the grid"
        out.append(f"re-read {x}x by {who}, miss fraction of re-reads: 0.5 at W = {_mib(t['capacity_bytes'])} "
                   f"(0.1 at {_mib(t['w10_bytes'])}, 0.9 at {_mib(t['w90_bytes'])}; hits up to "
                   f"{_mib(t['last_hit_bytes'])}, misses from {_mib(t['first_miss_bytes'])}): {t['shape']}")
    if s.get("fetch_granularity_bytes"):
        out.append(f"DRAM fetch granularity (strided reads): {s['fetch_granularity_bytes']} B "
                   f"(max rel. error {s['fetch_granularity_max_rel_err']:.3f})")
    if "stride_reread" in s:
        t = s["stride_reread"]
        out.append(f"one sector per line re-read: 0.5 at W = {_mib(t['capacity_bytes'])}: {t['shape']}")
    if "dirty_at_end" in s:
        out.append("dirty at the launch's end (W - DRAM writes): "
                   + ", ".join(f"{w / MiB:g}:{d / MiB:.1f}" for w, d in s["dirty_at_end"]) + " (MiB)")
        out.append(f"most left dirty: {_mib(s['dirty_max_bytes'])}; ncu's flush counted in the launch: "
                   f"{'yes' if s['flush_counted'] else 'no'}; write-backs reach half of W at "
                   f"{_mib(s['write_evict']['capacity_bytes'])}")
    if "read_after_write" in s:
        t = s["read_after_write"]
        out.append(f"read after write (same launch, one window later): misses reach half at "
                   f"W = {_mib(t['capacity_bytes'])}: {t['shape']}")
    for w, ratio in s.get("stream_read_ratio", []):
        out.append(f"stream {w / MiB:g} MiB read once: DRAM reads / W = {ratio:.4f}")
    for b in bandwidth or []:
        out.append(f"bandwidth {b['what']}: {float(b['gb_per_s']):.0f} GB/s ({int(b['bytes_moved']) / 1e9:.2f} GB "
                   f"in {float(b['ms']):.3f} ms)")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The bandwidth ceiling (CUDA events, no profiler)

def measure_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> list[dict]:
    n = nbytes // 4
    src = cuda.device_array(n, dtype=np.float32)
    dst = cuda.device_array(n, dtype=np.float32)
    sms = _sm_count()
    out = cuda.device_array(sms * 2048, dtype=np.float32)
    l2_sweep[sms, THREADS](src, n, 1, 1, WRITE, 0, 0, out)
    cuda.synchronize()
    grid = _grid()
    b = grid["blocks"]
    calls = (("d2d_copy", 2 * nbytes, lambda: dst.copy_to_device(src)),
             ("sweep_read", nbytes, lambda: l2_sweep[b, THREADS](src, n, 1, 1, READ, 0, 0, out)),
             ("sweep_write", nbytes, lambda: l2_sweep[b, THREADS](dst, n, 1, 1, WRITE, 0, 0, out)))
    rows = []
    for what, moved, fn in calls:
        fn()
        cuda.synchronize()
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        ms = cuda.event_elapsed_time(e0, e1) / reps
        rows.append({"what": what, "bytes_moved": moved, "ms": ms, "gb_per_s": moved / ms / 1e6})
    return rows


# ---------------------------------------------------------------------------------------------
# The run: ncu over the worker, then the records

def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


SUFFIXES = (".csv", ".meta.json", ".ncu-raw.csv", ".bandwidth.csv", ".summary.txt")


def run_l2(out_dir: Path, name: str, force: bool = False, quick: bool = False, bandwidth: bool = True,
           timeout_s: float = 480) -> int:
    from .measure import MissingTool, check_environment, provenance
    from .ncu import METRICS, ncu_command, parse_raw_csv

    paths = {sfx: out_dir / f"{name}{sfx}" for sfx in SUFFIXES}
    there = [str(p) for p in paths.values() if p.exists()]
    if there and not force:
        print(f"flashsim: error: {there[0]} exists (use --force to overwrite)", file=sys.stderr)
        return 2
    try:
        check_environment()
    except MissingTool as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = l2_plan(quick)
    raw_tmp = out_dir / f".{name}.ncu-raw.tmp.csv"
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, man_path = Path(tmp, "plan.json"), Path(tmp, "manifest.json")
        plan_path.write_text(json.dumps(cases))
        cmd = ncu_command([sys.executable, "-m", "analysis.calibrate", "l2-worker", str(plan_path), str(man_path)],
                          export=str(raw_tmp), profile_from_start=False)
        print("running:", " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"flashsim: error: ncu still running after {timeout_s} s: stopped (its log: {raw_tmp})",
                  file=sys.stderr)
            return 1
        print(f"ncu: exit status {proc.returncode} after {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if proc.returncode != 0 or not man_path.exists():
            print(f"flashsim: error: ncu exited with status {proc.returncode} (its log: {raw_tmp})", file=sys.stderr)
            return 1
        manifest = json.loads(man_path.read_text())
    raw = raw_tmp.read_text()
    os.replace(raw_tmp, paths[".ncu-raw.csv"])  # kept whatever follows
    try:
        rows = l2_rows(manifest["cases"], parse_raw_csv(raw))
    except ValueError as e:
        print(f"flashsim: error: {paths['.ncu-raw.csv']}: {e}", file=sys.stderr)
        return 1
    _write_atomic(paths[".csv"], rows_to_csv(rows))
    meta = provenance(cmd, "all")
    meta.update(metrics=list(METRICS), grid=manifest["grid"], cases=len(rows),
                plan="quick" if quick else "full", kernel="analysis.calibrate.l2_sweep")
    bw = []
    if bandwidth:
        try:
            bw = measure_bandwidth()
        except Exception as e:  # the ncu records stand without it
            meta["bandwidth_error"] = f"{type(e).__name__}: {e}"
            print(f"bandwidth: failed ({meta['bandwidth_error']})", file=sys.stderr)
    bw_buf = io.StringIO()
    wr = csv.DictWriter(bw_buf, fieldnames=["what", "bytes_moved", "ms", "gb_per_s"], lineterminator="\n")
    wr.writeheader()
    wr.writerows(bw)
    _write_atomic(paths[".bandwidth.csv"], bw_buf.getvalue())
    summary = summarize(rows)
    text = format_summary(summary, rows, bw)
    meta["summary"] = {k: v for k, v in summary.items() if k != "dirty_at_end"}
    meta["bandwidth"] = bw
    _write_atomic(paths[".meta.json"], json.dumps(meta, indent=1, default=str))
    _write_atomic(paths[".summary.txt"], text + "\n")
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr, flush=True)
    print(text, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # the basic probes, the program ncu runs: they need a GPU
        from kernels.gpucheck import require_gpu

        try:
            require_gpu("python -m analysis.calibrate (the basic L2 probes, run under ncu)")
        except ValueError as e:
            print(f"flashsim: error: {e}", file=sys.stderr)
            return 2
        return run_basic()
    from flashsim.cmdline import ToolParser  # argparse's complaints as the one error line, exit 2

    ap = ToolParser(prog="python -m analysis.calibrate", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("l2", help="run the L2 microbenchmarks under ncu and write the records")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--name", default="l2calib", help="file name stem (default l2calib)")
    p.add_argument("--force", action="store_true", help="overwrite existing records")
    p.add_argument("--quick", action="store_true", help="a few small cases (a dry run)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth timing")
    p.add_argument("--timeout", type=float, default=480, help="stop ncu after this many seconds (default 480)")
    w = sub.add_parser("l2-worker", help="(internal) the program ncu profiles")
    w.add_argument("plan")
    w.add_argument("manifest")
    s = sub.add_parser("l2-summary", help="summarize an l2 record (CPU)")
    s.add_argument("csv")
    r = sub.add_parser("l2-readwrite", help="a scripts/device/l2_readwrite.py record against the L2 model (CPU)")
    r.add_argument("csv")
    r.add_argument("--gpu", default="h200", help="the preset whose L2 model predicts (default h200)")
    r.add_argument("--capacity-mib", type=float, default=None, help="the model's capacity instead of the preset's")
    r.add_argument("--calib", default=None, help="an l2 record (NAME.csv) whose re-reads the same cache is held to")
    args = ap.parse_args(argv)
    if args.cmd == "l2":
        if not args.name or "/" in args.name:
            print(f"flashsim: error: --name {args.name!r}: a file name stem without '/'", file=sys.stderr)
            return 2
        if not args.timeout > 0:
            print(f"flashsim: error: --timeout {args.timeout}: must be positive", file=sys.stderr)
            return 2
        return run_l2(Path(args.out), args.name, args.force, args.quick, not args.no_bandwidth, args.timeout)
    if args.cmd == "l2-worker":
        return l2_worker(args.plan, args.manifest)
    if args.cmd == "l2-readwrite":
        return _readwrite_cli(args)
    try:
        rows = read_l2_csv(args.csv)
        print(format_summary(summarize(rows), rows))
    except (OSError, ValueError) as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    return 0


def _readwrite_cli(args) -> int:
    from flashsim.config import get_gpu

    try:
        gpu = get_gpu(args.gpu)
        if args.capacity_mib is not None and not 0 < args.capacity_mib <= 1024:
            raise ValueError(f"--capacity-mib {args.capacity_mib}: must be above 0 and at most 1024")
        with open(args.csv, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows or "probe" not in rows[0]:
            raise ValueError(f"{args.csv}: not a scripts/device/l2_readwrite.py record (no probe column)")
        cal = read_l2_csv(args.calib) if args.calib else None
    except (OSError, ValueError) as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    cap = gpu.l2_effective_bytes if args.capacity_mib is None else args.capacity_mib * MiB
    dirty = None if gpu.l2_dirty_fraction is None else gpu.l2_dirty_fraction * gpu.l2_bytes
    kw = dict(policy=gpu.l2_replacement, random_share=gpu.l2_random_share)
    table, rms = readwrite_table(rows, cap, dirty, gpu.l2_fetch_bytes, **kw)
    print(f"{args.gpu} L2 model, capacity {cap / MiB:.1f} MiB, dirty limit "
          f"{'none' if dirty is None else f'{dirty / MiB:.1f} MiB'}, {gpu.l2_replacement} "
          f"(random share {gpu.l2_random_share}), at 1/8 size")
    for r, m, p in table:
        print(f"{r['probe']:<12} R {int(r['read_mib']):3d} W {int(r['write_mib']):3d} MiB  DRAM writes measured "
              f"{m / MiB:6.2f}  model {p / MiB:6.2f} MiB")
    print(f"rms of the writes' difference: {rms / MiB:.2f} MiB over {len(table)} probes")
    if cal is not None:
        print(f"the same cache on {args.calib}'s re-reads: rms of the miss fraction "
              f"{reread_rms(cal, cap, dirty, gpu.l2_fetch_bytes, scale=8, **kw):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
