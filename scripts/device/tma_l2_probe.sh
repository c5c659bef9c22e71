#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: L2's sector counts by source for
# launches whose operands come by the TMA unit, beside one whose operands come by cp.async
# (scripts/device/tma_l2_probe.py).  Every lts__t_{sectors,requests} metric of a source unit or
# node with op_read that this ncu knows (ncu --query-metrics), the sectors the SMs receive from L2
# (l1tex__m_xbar2l1tex_read_sectors, by kind), the L2 request coalescer's counts (lrc__) and DRAM
# bytes, for every launch of each workload (both calls).  Output under $OUT/tma_l2: one raw CSV a
# workload and the metric list.  PY: the python that has torch.
#   usage: PY=python3 bash scripts/device/tma_l2_probe.sh
set -u
PY=${PY:-python3}
"$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
o="$OUT/tma_l2"; mkdir -p "$o"
ncu --query-metrics > "$o/query.txt" 2>&1
{ grep -oE '^lts__t_(sectors|requests)_(srcunit|srcnode)_[a-z0-9]+(_op_read)?\b' "$o/query.txt"
  echo lts__t_sectors_op_read; echo lts__t_requests_op_read; echo dram__bytes_read
  # the SM side: sectors received from L2 by kind; Hopper's L2 request coalescer (lrc)
  grep -oE '^(l1tex__m_xbar2l1tex_read_sectors(_mem_global_op_(tma_ld(_dest_[a-z]+)?|ldgsts_cache_access)|_mem_lg_op_ld)?|lrc__(xbar2lrc_requests_op_read|lts2lrc_sectors_op_read|lrc2xbar_sectors_op_read|xbar2gpc_sectors_op_read|xbar2gpc_sectors_op_read_coalescing_achieved|request_sectors_op_read_coalescable))\b' "$o/query.txt"
} | sort -u > "$o/metrics.txt"
m=$(sed 's/$/.sum/' "$o/metrics.txt" | paste -sd, -)
echo "metrics: $(wc -l < "$o/metrics.txt")"
for w in "v7 4096 16" "v7 16384 16" "v5 4096 16" "cudnn 1024 1" "cudnn 1024 16" "gemm 1024 1" "gemm 4096 16"; do
  set -- $w
  # every launch (randn's, both calls'): the analysis takes the workload's kernel of the second call
  ncu --clock-control none --metrics "$m" --launch-count 20 --csv --page raw \
      "$PY" scripts/device/tma_l2_probe.py "$@" > "$o/raw_$1_$2_$3.csv" 2> "$o/err_$1_$2_$3.txt"
  echo "$w: exit $? $(wc -l < "$o/raw_$1_$2_$3.csv") lines"
done
