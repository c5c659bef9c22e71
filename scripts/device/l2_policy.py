"""L2 probes for what flashsim.l2's calibration leaves open (replacement of hot lines, write-back
with time, dirty limit with few SMs), under Nsight Compute.

On the GPU machine, from the repository root::

    python3 scripts/device/l2_policy.py --out "$OUT"

runs itself under ``ncu --cache-control all`` (each probe one launch, cold) and writes
``$OUT/l2_policy.csv`` (probe, parameters, DRAM bytes read and written, time),
``$OUT/l2_policy.ncu-raw.csv`` and ``$OUT/l2_policy.meta.json``, and prints the table.  The probes:

* ``hot_stream H S mode``: a grid-stride pass over S MiB (read, or written when mode = write)
  that, at every step, also reads the next grid-width of an H MiB hot buffer, cyclically: each
  hot line is read again after about 2H MiB of traffic (H of the stream).  LRU keeps the hot
  buffer (DRAM reads S + H, or H); random replacement in a cache of C loses about
  1 - exp(-H / C) of each re-read.  The standard-attention GEMMs re-use their operand tiles
  this way while they stream S out.
* ``fill_wait W T``: W MiB of coalesced stores, then the kernel stays alive T ms (one extra
  block sleeping): the dirty lines written back with time (long kernels: FlashAttention-1 runs
  250-1100 ms).
* ``rewrite W P T``: W MiB stored P times, T ms apart (FlashAttention-1's O, rewritten while it
  sits in L2, over as long as its kernel runs).
* ``fill_sms W B``: W MiB of stores by B blocks of 256 threads only (B = 16: FlashAttention-1's
  grid; is the dirty limit the same with 16 SMs as with all of them?).

Then it runs the attention worker (analysis.worker) on the configurations of :data:`KERNEL_CONFIGS`
(those of the H100 record whose DRAM writes the model misses most) under ncu with the record's
metrics plus the local-memory (register spill) traffic, ``l1tex__t_bytes_pipe_lsu_mem_local_op_ld/st``,
and every L2 write (``lts__t_sectors_op_write``): ``$OUT/l2_policy_kernels.csv``, one row per launch.
DRAM writes above the global stores' bytes come from somewhere the model does not see (spills).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _l2probe import MEASURED, measure, write_csv, write_json  # noqa: E402
from numba import cuda, float32, uint32  # noqa: E402

MIB = 1 << 20
THREADS = 256
#: config ids of analysis/data/h100/h100.csv
KERNEL_CONFIGS = ("flash2-fwd-b1h16-n16384-d128-fp16-br32bc32", "flash2-fwd-b1h16-n16384-d64-fp16-br64bc32",
                  "flash2-fwd-b1h16-n4096-d64-fp16-br32bc32", "flash1-fwd-b1h16-n4096-d64-fp16-M32k",
                  "flash1-fwd-b1h16-n2048-d128-fp16-M64k", "flash1-fwd-b1h16-n2048-d64-fp32-M64k")
LOCAL = ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
         "lts__t_sectors_op_write.sum")


def probes() -> list[dict]:
    out = []
    for mode in ("read", "write"):
        for h in (1, 4, 8, 16):
            out.append({"probe": "hot_stream", "mib": 256, "hot_mib": h, "mode": mode})
    for w, t in ((8, 128), (8, 256), (8, 512), (16, 256), (20, 256)):
        out.append({"probe": "fill_wait", "mib": w, "ms": t})
    for w, p, t in ((16, 64, 4), (16, 16, 16), (8, 64, 4)):
        out.append({"probe": "rewrite", "mib": w, "passes": p, "ms": t})
    for w in (8, 16, 24, 32, 48):
        out.append({"probe": "fill_sms", "mib": w, "blocks": 16})
    return out


@cuda.jit
def hot_stream(buf, n, hot, nh, write, out):
    g = cuda.grid(1)
    t = cuda.gridsize(1)
    acc = float32(0)
    j = g
    for k in range(g, n, t):
        if write:
            buf[k] = float32(1)
        else:
            acc += buf[k]
        acc += hot[j]
        j += t
        if j >= nh:
            j -= nh
    if acc == float32(-1):  # never true: keeps the loads
        out[0] = acc


@cuda.jit
def fill_wait(buf, n, sleep_ms):
    # the last block only sleeps; the others store
    if cuda.blockIdx.x == cuda.gridDim.x - 1:
        if cuda.threadIdx.x == 0:
            for _ in range(sleep_ms):
                for _ in range(1000):
                    cuda.nanosleep(uint32(1000))
        return
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    stride = (cuda.gridDim.x - 1) * cuda.blockDim.x
    for k in range(i, n, stride):
        buf[k] = float32(1)


@cuda.jit
def fill(buf, n, passes, sleep_ms):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(passes):
        for k in range(i, n, stride):
            buf[k] = float32(p + 1)
        if p + 1 < passes:
            for _ in range(sleep_ms):
                for _ in range(1000):
                    cuda.nanosleep(uint32(1000))


def worker() -> int:
    import numpy as np

    sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    grid = 4 * sms
    big = cuda.to_device(np.zeros(256 * MIB // 4, dtype=np.float32))
    hot = cuda.to_device(np.zeros(16 * MIB // 4, dtype=np.float32))
    sink = cuda.device_array(1, dtype=np.float32)
    # compile outside the profiled region
    hot_stream[grid, THREADS](big, 1024, hot, 1024, 0, sink)
    fill_wait[grid + 1, THREADS](big, 1024, 0)
    fill[grid, THREADS](big, 1024, 1, 0)
    cuda.synchronize()
    for p in probes():
        n = p["mib"] * MIB // 4
        cuda.profile_start()
        if p["probe"] == "hot_stream":
            hot_stream[grid, THREADS](big, n, hot, p["hot_mib"] * MIB // 4, int(p["mode"] == "write"), sink)
        elif p["probe"] == "fill_wait":
            fill_wait[grid + 1, THREADS](big, n, p["ms"])
        elif p["probe"] == "rewrite":
            fill[grid, THREADS](big, n, p["passes"], p["ms"])
        else:
            fill[p["blocks"], THREADS](big, n, 1, 0)
        cuda.synchronize()
        cuda.profile_stop()
    return 0


def main(argv=None) -> int:
    got = measure(__doc__, __file__, "l2_policy", probes, worker, argv)
    if isinstance(got, int):
        return got
    out, pairs, cmd, smi = got
    keys = ("probe", "mib", "hot_mib", "mode", "ms", "passes", "blocks")
    rows = [{**{k: p.get(k, "") for k in keys}, **{k: ln[k] for k in MEASURED}, "gpu": smi} for p, ln in pairs]
    write_csv(out / "l2_policy.csv", rows)
    for r in rows:
        what = " ".join(f"{k}={r[k]}" for k in keys[1:] if r[k] != "")
        print(f"{r['probe']:<11} {what:<40} DRAM read {r['dram_read_bytes'] / MIB:9.2f} MiB  "
              f"write {r['dram_write_bytes'] / MIB:9.2f} MiB  {r['time_ns'] / 1e6:9.3f} ms")
    write_json(out / "l2_policy.meta.json", {"gpu": smi, "command": cmd})
    return kernels(out, smi)


def kernels(out: Path, smi: str) -> int:
    """The attention configurations of KERNEL_CONFIGS under ncu with the local-memory metrics."""
    import io

    from analysis.compare import read_measured
    from analysis.measure import CONFIG_FIELDS
    from analysis.ncu import METRICS, ncu_command, parse_raw_csv, split_by_marker

    rows, _ = read_measured(Path(__file__).resolve().parents[2] / "analysis" / "data" / "h100" / "h100.csv")
    cfgs = {}
    for r in rows:
        if r["config_id"] in KERNEL_CONFIGS:
            cfgs.setdefault(r["config_id"], {k: r[k] for k in CONFIG_FIELDS})
    order = [c for c in KERNEL_CONFIGS if c in cfgs]
    cfg_path, man_path = out / ".kernels.json", out / ".kernels.manifest.json"
    cfg_path.write_text(json.dumps([cfgs[c] for c in order]))
    raw = out / "l2_policy_kernels.ncu-raw.csv"
    cmd = ncu_command([sys.executable, "-m", "analysis.worker", str(cfg_path), str(man_path)], export=str(raw),
                      metrics=METRICS + LOCAL, cache_control="all", profile_from_start=False)
    print("running:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2]).returncode != 0:
        print("l2_policy: ncu failed on the attention worker", file=sys.stderr)
        return 1
    text = raw.read_text()
    launches = parse_raw_csv(text)
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    table = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    col = {n: i for i, n in enumerate(table[0])}
    extra = {int(r[col["ID"]]): {m: r[col[m]] for m in LOCAL} for r in table[2:]
             if len(r) == len(table[0]) and r[col["ID"]].strip()}
    out_rows = []
    for cid, group in zip(order, split_by_marker(launches)):
        for k, ln in enumerate(group):
            e = extra.get(ln["launch_id"], {})
            out_rows.append({"config_id": cid, "launch_index": k, "dram_read_bytes": ln["dram_read_bytes"],
                             "dram_write_bytes": ln["dram_write_bytes"], "lsu_ld_bytes": ln["lsu_ld_bytes"],
                             "lsu_st_bytes": ln["lsu_st_bytes"], "local_ld_bytes": e.get(LOCAL[0], ""),
                             "local_st_bytes": e.get(LOCAL[1], ""), "l2_write_sectors_all": e.get(LOCAL[2], ""),
                             "l2_write_sectors_global": ln["l2_write_sectors"], "time_ns": ln["time_ns"], "gpu": smi})
    with open(out / "l2_policy_kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out_rows[0]))
        w.writeheader()
        w.writerows(out_rows)
    for r in out_rows:
        print(f"{r['config_id']:<46} {r['launch_index']} DRAM write {r['dram_write_bytes'] / 1e6:8.2f} MB  "
              f"global st {r['lsu_st_bytes'] / 1e6:9.2f} MB  "
              f"local ld/st {r['local_ld_bytes']}/{r['local_st_bytes']} B  "
              f"L2 write sectors all/global {r['l2_write_sectors_all']}/{r['l2_write_sectors_global']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
