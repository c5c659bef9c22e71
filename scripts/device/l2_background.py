"""Where the DRAM writes that no store explains come from: the kernel, or the measurement?

The attention records show DRAM writes that the L2 model cannot produce: launches whose stores
all fit in the L2 write 0.26-1.9 MB, and long launches write about 19 MB/s more than they store
(``scripts/device/l2_writeback.py``, ``l2_policy.py``).  This probe tells the candidate causes
apart.  On the GPU machine, from the repository root::

    python3 scripts/device/l2_background.py --out "$OUT"

runs one small program (``--worker``) several times under Nsight Compute, each time with other
profiler settings, and writes ``$OUT/l2_background.csv`` (one row per (mode, probe): DRAM bytes
read and written, time, the number of replay passes ncu reported) and the raw ncu output.

Probes (each one launch):

* ``sleep T``: one block of one thread sleeps T ms and stores nothing.  DRAM writes here are not
  the kernel's.
* ``fill W``: one coalesced pass of stores over W MiB (8: fits in the L2; 64: does not).
* ``fill_wait W T``: the 8 MiB of stores, then one block sleeps T ms.

Modes (the profiler settings; the attention records were taken as ``full``):

* ``full``: the records' seven metrics (``analysis.ncu.METRICS``), kernel replay (ncu saves the
  memory a launch may write and restores it before each further pass), ``--cache-control all``;
* ``dram``: only DRAM bytes and the duration;
* ``app``: the seven metrics, ``--replay-mode application`` (the whole program is run again for
  each pass: no save and restore of memory between passes);
* ``nocache``: the seven metrics, kernel replay, ``--cache-control none``.

ncu's ``profiler__replayer_passes`` (the ``passes`` column) says whether a launch was replayed.
If ``sleep`` writes in every mode, the GPU writes whatever the kernel does; if it writes only
when a launch is replayed, the writes are the profiler's restore of memory reaching DRAM during
the measured launch.  (On the H100, at 580.159.04 and ncu 2025.3.1, every mode took one pass,
and ``sleep`` wrote in every mode: ``analysis/data/l2calib/h100_l2_background.csv``; the H200
alike: ``analysis/data/l2calib/h200_l2_background/``.)
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _l2probe import gpu_name, start  # noqa: E402
from numba import cuda, uint32  # noqa: E402

MIB = 1 << 20
PROBES = ([{"probe": "sleep", "mib": 0, "ms": t} for t in (0, 16, 64, 256)]
          + [{"probe": "fill", "mib": w, "ms": 0} for w in (8, 64)]
          + [{"probe": "fill_wait", "mib": 8, "ms": t} for t in (64, 256)])
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


@cuda.jit
def sleep(ms):
    if cuda.threadIdx.x == 0:
        for _ in range(ms):
            for _ in range(1000):
                cuda.nanosleep(uint32(1000))


def worker() -> int:
    import numpy as np
    from l2_writeback import fill, fill_wait

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    grid, threads = 4 * sms, 256
    big = cuda.to_device(np.zeros(64 * MIB // 4, dtype=np.float32))
    fill[grid, threads](big, 1024, 1, 0)  # compile outside the profiled region
    fill_wait[grid + 1, threads](big, 1024, 0)
    sleep[1, 1](0)
    cuda.synchronize()
    for p in PROBES:
        n = p["mib"] * MIB // 4
        cuda.profile_start()
        if p["probe"] == "sleep":
            sleep[1, 1](p["ms"])
        elif p["probe"] == "fill":
            fill[grid, threads](big, n, 1, 0)
        else:
            fill_wait[grid + 1, threads](big, n, p["ms"])
        cuda.synchronize()
        cuda.profile_stop()
    return 0


def _table(text: str) -> list[dict]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, data = rows[0], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    out = []
    for r in data:
        if len(r) == len(header) and r[col["ID"]].strip():
            rec = {m: float(r[col[m]].replace(",", "")) for m in DRAM_METRICS}
            rec["passes"] = r[col["profiler__replayer_passes"]] if "profiler__replayer_passes" in col else ""
            out.append(rec)
    return out


def main(argv=None) -> int:
    out = start(__doc__, worker, argv)
    if isinstance(out, int):
        return out
    from analysis.ncu import METRICS

    modes = {"full": (METRICS, ["--cache-control", "all"]),
             "dram": (DRAM_METRICS, ["--cache-control", "all"]),
             "app": (METRICS, ["--cache-control", "all", "--replay-mode", "application"]),
             "nocache": (METRICS, ["--cache-control", "none"])}
    smi = gpu_name()
    ver = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    rows = []
    for mode, (metrics, flags) in modes.items():
        cmd = (["ncu", "--clock-control", "none", *flags, "--profile-from-start", "off", "--metrics",
                ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base"]
               + [sys.executable, str(Path(__file__).resolve()), "--worker"])
        print("running:", " ".join(cmd), flush=True)
        res = subprocess.run(cmd, capture_output=True, text=True)
        (out / f"l2_background.{mode}.ncu-raw.csv").write_text(res.stdout + "\n" + res.stderr)
        if res.returncode != 0:
            print(f"l2_background: ncu failed in mode {mode}:\n{res.stderr[-2000:]}", file=sys.stderr)
            continue
        launches = _table(res.stdout)
        if len(launches) != len(PROBES):
            print(f"l2_background: {mode}: {len(launches)} launches for {len(PROBES)} probes", file=sys.stderr)
            continue
        for p, ln in zip(PROBES, launches):
            rows.append({"mode": mode, **p, "passes": ln["passes"],
                         "dram_read_bytes": int(ln["dram__bytes_read.sum"]),
                         "dram_write_bytes": int(ln["dram__bytes_write.sum"]),
                         "time_ns": ln["gpu__time_duration.sum"], "gpu": smi})
    if not rows:
        return 1
    tmp = out / "l2_background.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    tmp.rename(out / "l2_background.csv")
    for r in rows:
        print(f"{r['mode']:<8} {r['probe']:<10} {r['mib']:>3} MiB {r['ms']:>4} ms passes={r['passes']!s:<3}"
              f" DRAM read {r['dram_read_bytes'] / 1e6:8.3f} MB write {r['dram_write_bytes'] / 1e6:8.3f} MB"
              f" {r['time_ns'] / 1e6:9.3f} ms")
    (out / "l2_background.meta.json").write_text(json.dumps({"gpu": smi, "ncu": ver, "modes": {
        m: {"metrics": list(v[0]), "flags": v[1]} for m, v in modes.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
