#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: what fwd_fp32_v2 (the fp32
# forward as 3xTF32, issue 18) needs run on a GPU, written under $OUT.  Stages (default: all; on
# the device tool, whose commands stop at 10 minutes, run "tests regs sanitize" (at most 9
# minutes, each stage under its own time limit) and "time" (at most 9) as two commands):
#   tests     FLASHSIM_GPU=1 pytest -m gpu tests/test_perf_fwd_fp32_v2.py  -> $OUT/fwd_fp32_v2_pytest_gpu.log
#   regs      registers and local memory of the default kernels, d = 64 and 128 (scripts/device/regs.py)
#   sanitize  compute-sanitizer memcheck and racecheck (python -m kernels.sanitize --only fwd_fp32_v2)
#   time      naive fp32, fwd_fp32_v1 and fwd_fp32_v2 at N = 4,096 and 16,384 (scripts/device/fwd_fp32_v2_time.py
#             --sweep: v2's other block shapes at N = 4,096 too)   -> $OUT/fwd_fp32_v2_time.csv, .log
#   usage: bash scripts/device/fwd_fp32_v2.sh [tests] [regs] [sanitize] [time]
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
stages=" $* "
if ! echo "$stages" | grep -qE " (tests|regs|sanitize|time) "; then stages=" tests regs sanitize time "; fi

if [[ "$stages" == *" tests "* ]]; then
  t0=$(date +%s)
  timeout 240 env FLASHSIM_GPU=1 python3 -m pytest -m gpu -p no:cacheprovider -s -rA tests/test_perf_fwd_fp32_v2.py \
      > "$OUT/fwd_fp32_v2_pytest_gpu.log" 2>&1
  echo "pytest -m gpu tests/test_perf_fwd_fp32_v2.py: exit $? in $(( $(date +%s) - t0 )) s"
  grep -E "^gpu fwd_fp32_v2" "$OUT/fwd_fp32_v2_pytest_gpu.log"
  tail -2 "$OUT/fwd_fp32_v2_pytest_gpu.log"
fi
if [[ "$stages" == *" regs "* ]]; then
  timeout 60 python3 scripts/device/regs.py fwd_fp32_v2 64 2>&1 | tail -3
  timeout 60 python3 scripts/device/regs.py fwd_fp32_v2 128 2>&1 | tail -3
fi
if [[ "$stages" == *" sanitize "* ]]; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize --only fwd_fp32_v2 \
        > "$OUT/sanitize-fwd_fp32_v2-$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? in $(( $(date +%s) - t0 )) s;" \
         "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-fwd_fp32_v2-$tool.log" | tail -1)"
  done
fi
if [[ "$stages" == *" time "* ]]; then
  timeout 540 python3 scripts/device/fwd_fp32_v2_time.py --sweep --budget 420 --out "$OUT" 2>&1 \
      | grep -v Warning | tee "$OUT/fwd_fp32_v2_time.log"
fi
