#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the TMA box sweep
# (scripts/device/tma_box_sweep.py) under Nsight Compute, each workload an NVTX range: the sectors
# the SMs receive by TMA (all, multicast, self), L2's read and write sectors, per launch.  Output
# under $OUT/tma_box: raw.csv (ncu's raw page), manifest.json, meta.json (provenance), err.txt.  PY: the python with torch.
#   usage: PY=python3 bash scripts/device/tma_box_sweep.sh
set -u
PY=${PY:-python3}
o="$OUT/tma_box"; mkdir -p "$o"
m=l1tex__m_xbar2l1tex_read_sectors.sum
for x in _mem_global_op_tma_ld _mem_global_op_tma_ld_dest_multicast _mem_global_op_tma_ld_dest_self; do
  m="$m,l1tex__m_xbar2l1tex_read_sectors$x.sum"
done
m="$m,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum"
ncu --clock-control none --nvtx --metrics "$m" --csv --page raw \
    "$PY" scripts/device/tma_box_sweep.py "$o" > "$o/raw.csv" 2> "$o/err.txt"
echo "exit $? $(wc -l < "$o/raw.csv") lines"
tail -3 "$o/err.txt"
# provenance: the GPU, driver, tools and commit (FLASHSIM_GIT_COMMIT where the tree has no .git)
"$PY" - "$o/meta.json" "$m" <<'PY'
import json, subprocess, sys
import torch
from kernels.gpucheck import provenance
meta = provenance()
meta.update(ncu=subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
            torch=torch.__version__, metrics=sys.argv[2].split(","))
open(sys.argv[1], "w").write(json.dumps(meta, indent=1) + "\n")
PY
