#!/usr/bin/env bash
# On the GPU machine: build scripts/device/ldgsts_probe.cu and count, under Nsight Compute, the
# LSU bytes of each way of loading 64 MiB (plain loads, cp.async .cg/.ca with and without the
# src-size operand, src-size 0, into plain or padded shared rows).  Writes $OUT/ldgsts_probe.csv (ncu's raw CSV) and prints one
# line per kernel: its mode and the metrics.  Metrics the installed ncu does not list are left out.
set -u
out="${OUT:-.}"
nvcc -O2 -arch=sm_90 -o /tmp/ldgsts_probe scripts/device/ldgsts_probe.cu || exit 1
want="l1tex__t_bytes_pipe_lsu_mem_global_op_ld l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts_cache_access
l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts_cache_bypass l1tex__t_sectors_pipe_lsu_mem_global_op_ld
l1tex__t_requests_pipe_lsu_mem_global_op_ld l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access
l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts
smsp__inst_executed_op_ldgsts lts__t_sectors_srcunit_tex_op_read dram__bytes_read"
listed=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=""
for m in $want; do
    if grep -qx "$m" <<<"$listed"; then metrics="$metrics${metrics:+,}$m.sum"; fi
done
echo "probe metrics: $metrics"
ncu --clock-control none --cache-control all --metrics "$metrics" --csv --page raw --print-units base \
    /tmp/ldgsts_probe > "$out/ldgsts_probe.csv" || exit 1
python3 - "$out/ldgsts_probe.csv" <<'EOF'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
rows = list(csv.reader(lines[start:]))
head, data = rows[0], rows[2:]
modes = ["ldg128", "cp_cg", "cp_cg_size", "cp_cg_zero", "cp_ca", "cp_ca_size", "pad_cg_size", "pad_cg", "pad_ldg128"]
cols = [c for c in head if "__" in c]
for i, r in enumerate(data):
    print("probe", modes[i] if i < len(modes) else i, " ".join(f"{c.split('__', 1)[1]}={r[head.index(c)]}" for c in cols))
EOF
