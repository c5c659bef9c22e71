#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: what issue 19's decode kernels
# need run on a GPU, written under $OUT.  Stages (default: all three, at most 15 minutes; on the
# device tool, whose commands stop at 10 minutes, run "tests sanitize" (at most 9.7 minutes) and
# "bench" (at most 5) as two commands):
#   tests     FLASHSIM_GPU=1 pytest -m gpu tests/test_decode_kernel.py     -> $OUT/decode_pytest_gpu.log
#   sanitize  compute-sanitizer memcheck and racecheck on the decode kernels
#             (python -m kernels.sanitize --only decode)                   -> $OUT/sanitize-decode-{memcheck,racecheck}.log
#   bench     python -m kernels.bench_decode (at most 5 minutes; "quick" for the short set)
#                                                                          -> $OUT/bench_decode_<gpu>.csv, .meta.json, .log
#   measure   flashsim measure --set decode (Nsight Compute; alone)        -> $OUT/measure-decode/
#   usage: FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/decode_gpu.sh [tests] [sanitize] [bench] [quick] | measure
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
stages=" $* "
quick=""
case "$stages" in *" quick "*) quick="--quick" ;; esac
if ! echo "$stages" | grep -qE " (tests|sanitize|bench|measure) "; then stages="$stages tests sanitize bench "; fi

if [[ "$stages" == *" measure "* ]]; then
  t0=$(date +%s)
  python3 -m flashsim measure --set decode --out "$OUT/measure-decode" > "$OUT/measure-decode.log" 2>&1
  echo "flashsim measure --set decode: exit $? in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/measure-decode.log"
fi
if [[ "$stages" == *" tests "* ]]; then
  t0=$(date +%s)
  timeout 300 env FLASHSIM_GPU=1 python3 -m pytest -m gpu -p no:cacheprovider -s -rA tests/test_decode_kernel.py \
      > "$OUT/decode_pytest_gpu.log" 2>&1
  echo "pytest -m gpu tests/test_decode_kernel.py: exit $? in $(( $(date +%s) - t0 )) s"
  tail -2 "$OUT/decode_pytest_gpu.log"
fi
if [[ "$stages" == *" sanitize "* ]]; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 140 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize --only decode \
        > "$OUT/sanitize-decode-$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? in $(( $(date +%s) - t0 )) s;" \
         "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-decode-$tool.log" | tail -1)"
  done
fi
if [[ "$stages" == *" bench "* ]]; then
  t0=$(date +%s)
  timeout 300 python3 -m kernels.bench_decode $quick --out "$OUT/bench_decode_${gpu}.csv" \
      > "$OUT/bench_decode_${gpu}.log" 2>&1
  echo "bench_decode: exit $? in $(( $(date +%s) - t0 )) s"
  grep -E "^(ours_fast\S*|copy|sdpa\S*) +main" "$OUT/bench_decode_${gpu}.log" | head -100
fi
