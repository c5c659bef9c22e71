"""How much a store stream leaves dirty in the L2, and what else decides it (issue 14).

The calibration's ``write`` cases (analysis.calibrate.l2_sweep, 1,056 blocks) and
``l2_writeback.py``'s ``fill`` leave 28.2 MiB dirty on the H200 (23.7 on the H100) after a long
stream of float32 stores; the fast kernels' zero fill (kernels.perf._launch._zero, 1,024 blocks)
and standard attention's fp16 S = QKᵀ leave 25.2-25.7 MiB (21.4-21.7 on the H100), fp32 S 28.0.
The probe varies one thing at a time, each case one launch under ``ncu --cache-control all``:

* ``fill W grid``: one pass of float32 stores over W MiB, grid-stride, ``grid`` blocks of 256;
* ``zero W``: the fast kernels' own zero fill on a fresh W MiB array;
* ``read W``: one pass of loads over W MiB (the control: whatever it writes was not stored by it);
* ``pace``: the full-line stream of 128 MiB paced (``PACE_NS``): the dirty lines a slow writer leaves;
* ``half W`` and ``sector W``: stores to the first 64 or 32 bytes of every 128-byte line of W MiB
  (W/2 or W/4 stored): a dirty limit counted in lines leaves 1/2 or 1/4 of the bytes a full-line
  stream leaves, one counted in sectors the same bytes;
* ``*_idle``: the same after 1 GiB of other data was written by an earlier (unprofiled) kernel
  and left allocated (Nsight Compute's kernel replay saves and restores the device memory);

and the whole list is profiled three times: with analysis.ncu's METRICS (the calibration's and
the attention record's 7), with the fast set's 10 (METRICS and EXTRA_METRICS), and with what
``analysis.measure`` asks for by default (METRICS and every optional metric the installed ncu
knows: 17 with ncu 2025.3, the torch and parts sets' records), which ncu may collect over more
replay passes.  On the GPU machine, from the repository root::

    python3 scripts/device/l2_dirty_probe.py --out "$OUT"

writes ``$OUT/l2_dirty.csv`` (case, metric set, DRAM bytes read and written, stores, dirty bytes
left = stores - DRAM writes) and the two raw exports, and prints the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import gpu_name, profile, row, save, start  # noqa: E402
from numba import cuda, float32, uint32  # noqa: E402

MIB = 1 << 20
#: ``pace``: the full-line stream with a pause of this many ns after each grid-wide step (1 MiB), so
#: that 128 MiB is stored at about 1 TB/s down to about 15 GB/s: does a slow writer leave fewer
#: dirty lines (standard attention's fp16 S = QKᵀ, stored at 33-57 GB/s, leaves 25.2-25.5 MiB where
#: its fp32 twin at 113 GB/s and the fills at 3.7 TB/s leave 27.8-28.2)?
PACE_NS = (1000, 4000, 16000, 32000, 64000)


def probes() -> list[dict]:
    out = []
    for idle in ("", "_idle"):
        out += [{"probe": "fill" + idle, "mib": w, "grid": g} for w in (64, 128) for g in (1056, 1024)]
        out += [{"probe": "zero" + idle, "mib": w, "grid": 1024} for w in (64, 128)]
        out += [{"probe": "read" + idle, "mib": 64, "grid": 1056}]
    out += [{"probe": p, "mib": w, "grid": 1056} for p in ("half", "sector") for w in (64, 128)]
    out += [{"probe": "pace", "mib": 128, "grid": 1056, "ns": t} for t in PACE_NS]
    return out


@cuda.jit
def fill(buf, n):
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        buf[k] = float32(1)


@cuda.jit
def fill_paced(buf, n, ns):
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        buf[k] = float32(1)
        cuda.nanosleep(ns)


@cuda.jit
def fill_part(buf, n, keep):
    # the first ``keep`` floats of every 32 (a 128-byte line), coalesced: index i -> line i // keep
    for i in range(cuda.grid(1), n // 32 * keep, cuda.gridsize(1)):
        buf[i // keep * 32 + i % keep] = float32(1)


@cuda.jit
def read(buf, n, out):
    acc = float32(0)
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        acc += buf[k]
    if acc == float32(-1):  # never true: keeps the loads
        out[0] = acc


def worker() -> int:
    import numpy as np

    from kernels.perf._launch import zero_fill

    big = cuda.device_array(128 * MIB // 4, dtype=np.float32)
    sink = cuda.device_array(1, dtype=np.float32)
    fill[4, 256](big, 1024)  # compile outside the profiled region
    read[4, 256](big, 1024, sink)
    fill_part[4, 256](big, 1024, 16)
    fill_paced[4, 256](big, 1024, uint32(1))
    zero_fill(cuda.device_array(1024, dtype=np.float32))
    fill[1056, 256](big, big.size)
    cuda.synchronize()
    idle = None
    for p in probes():
        if p["probe"].endswith("_idle") and idle is None:
            idle = cuda.device_array(1024 * MIB // 4, dtype=np.float32)
            fill[1056, 256](idle, idle.size)
            cuda.synchronize()
        n = p["mib"] * MIB // 4
        fresh = cuda.device_array(n, dtype=np.float32) if p["probe"].startswith("zero") else None
        cuda.profile_start()
        if p["probe"].startswith("fill"):
            fill[p["grid"], 256](big, n)
        elif p["probe"].startswith("zero"):
            zero_fill(fresh)
        elif p["probe"] == "pace":
            fill_paced[p["grid"], 256](big, n, uint32(p["ns"]))
        elif p["probe"] in ("half", "sector"):
            fill_part[p["grid"], 256](big, n, 16 if p["probe"] == "half" else 8)
        else:
            read[p["grid"], 256](big, n, sink)
        cuda.synchronize()
        cuda.profile_stop()
        del fresh
    return 0


def main(argv=None) -> int:
    from analysis.ncu import EXTRA_METRICS, METRICS, available_metrics

    out = start(__doc__, worker, argv)
    if isinstance(out, int):
        return out
    smi, rows, cmds = gpu_name(), [], {}
    wide = (*METRICS, *available_metrics())  # what analysis.measure asks for by default
    sets = [("m7", METRICS), ("m10", (*METRICS, *EXTRA_METRICS)), (f"m{len(wide)}", wide)]
    for name, metrics in sets:
        got = profile(__file__, f"l2_dirty_{name}", out, probes(), metrics=metrics)
        if got is None:
            return 1
        pairs, cmds[name] = got
        for p, ln in pairs:
            rows.append(row({"probe": p["probe"], "mib": p["mib"], "grid": p["grid"], "ns": p.get("ns", ""),
                             "metrics": name}, ln, smi, dirty_left=True))
    return save(out, "l2_dirty", rows, lambda r: (
        f"{r['metrics']:<4} {r['probe']:<10} {r['mib']:>4} MiB grid {r['grid']:>5}  DRAM read "
        f"{r['dram_read_bytes'] / MIB:8.2f} MiB  write {r['dram_write_bytes'] / MIB:8.2f} MiB  left dirty "
        f"{r['dirty_left_bytes'] / MIB:7.2f} MiB  {r['time_ns'] / 1e3:8.1f} us"),
        smi, commands=cmds, metric_sets={n: list(m) for n, m in sets})


if __name__ == "__main__":
    raise SystemExit(main())
