#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: everything issue 19's decode
# kernels need measured, written under $OUT:
#   1. FLASHSIM_GPU=1 pytest -m gpu tests/test_decode_kernel.py   -> $OUT/decode_pytest_gpu.log
#   2. compute-sanitizer memcheck and racecheck on the decode kernels (python -m kernels.sanitize
#      --only decode)                                             -> $OUT/sanitize-decode-{memcheck,racecheck}.log
#   3. the decode bench (python -m kernels.bench_decode, about 2-4 minutes)
#                                                                 -> $OUT/bench_decode_<gpu>.csv, .meta.json, .log
#   usage: FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/decode_gpu.sh [quick]
#          FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/decode_gpu.sh measure   (flashsim measure --set decode)
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
if [ "${1:-}" = "measure" ]; then
  t0=$(date +%s)
  python3 -m flashsim measure --set decode --out "$OUT/measure-decode" > "$OUT/measure-decode.log" 2>&1
  echo "flashsim measure --set decode: exit $? in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/measure-decode.log"
  exit 0
fi
t0=$(date +%s)
FLASHSIM_GPU=1 python3 -m pytest -m gpu -p no:cacheprovider -s -rA tests/test_decode_kernel.py \
    > "$OUT/decode_pytest_gpu.log" 2>&1
echo "pytest -m gpu tests/test_decode_kernel.py: exit $? in $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/decode_pytest_gpu.log"
for tool in memcheck racecheck; do
  t0=$(date +%s)
  compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize --only decode \
      > "$OUT/sanitize-decode-$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? in $(( $(date +%s) - t0 )) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-decode-$tool.log" | tail -1)"
done
t0=$(date +%s)
q=""; [ "${1:-}" = "quick" ] && q="--quick"
timeout 300 python3 -m kernels.bench_decode $q --out "$OUT/bench_decode_${gpu}.csv" > "$OUT/bench_decode_${gpu}.log" 2>&1
echo "bench_decode: exit $? in $(( $(date +%s) - t0 )) s"
grep -E "^(ours_fast\S*|copy|sdpa\S*) +main" "$OUT/bench_decode_${gpu}.log" | head -90
