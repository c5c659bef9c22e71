#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: build and run
# scripts/device/tma_mc_probe.cu (what a cluster's SMs receive when its CTAs multicast slices of
# a TMA box) under Nsight Compute.  Output under $OUT/tma_mc: raw.csv (ncu's raw page, one row a
# launch), manifest.txt (d W col0 c split index, a line a launch, in the same order), meta.json.
#   usage: FLASHSIM_GIT_COMMIT=<sha> [FLASHSIM_GIT_DIRTY=0] bash scripts/device/tma_mc_probe.sh
set -u
o="$OUT/tma_mc"; mkdir -p "$o"
nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/tma_mc_probe scripts/device/tma_mc_probe.cu -lcuda || exit 1
m=l1tex__m_xbar2l1tex_read_sectors.sum
for x in _mem_global_op_tma_ld _mem_global_op_tma_ld_dest_multicast _mem_global_op_tma_ld_dest_self; do
  m="$m,l1tex__m_xbar2l1tex_read_sectors$x.sum"
done
m="$m,lts__t_sectors_srcunit_tex_op_read.sum"
ncu --clock-control none --kernel-name probe --metrics "$m" --csv --page raw --log-file "$o/raw.csv" \
    /tmp/tma_mc_probe > "$o/manifest.txt" 2> "$o/err.txt"
echo "exit $? launches $(wc -l < "$o/manifest.txt")"
tail -3 "$o/err.txt"
python3 - "$o/meta.json" <<'PY'
import datetime, json, os, subprocess, sys
run = lambda c: subprocess.run(c, capture_output=True, text=True).stdout.strip()
smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).split(", ")
meta = dict(gpu=smi[0], driver=smi[1], nvcc=run(["nvcc", "--version"]).splitlines()[-1],
            ncu=run(["ncu", "--version"]).splitlines()[-1],
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            git_commit=os.environ.get("FLASHSIM_GIT_COMMIT", "unknown"),
            git_dirty=os.environ.get("FLASHSIM_GIT_DIRTY", "unknown") not in ("0", "false"))
open(sys.argv[1], "w").write(json.dumps(meta, indent=1) + "\n")
PY
