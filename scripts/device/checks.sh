#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the exactness record of every
# kernel at realistic sizes, then compute-sanitizer's memcheck and racecheck on every kernel at a
# small ragged size.  Writes logs and the JSON record under $OUT.
#   usage: bash scripts/device/checks.sh [--quick]
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
start=$(date +%s)
python3 -m kernels.gpucheck --out "$OUT/${gpu}_exactness.json" "$@" 2>&1 | tee "$OUT/gpucheck.log"
echo "gpucheck: $(( $(date +%s) - start )) s"
for tool in memcheck racecheck; do
  t0=$(date +%s)
  compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize > "$OUT/sanitize-$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? in $(( $(date +%s) - t0 )) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | tail -1)"
done
