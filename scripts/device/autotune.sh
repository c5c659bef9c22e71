#!/usr/bin/env bash
# Adaptive tiling (python -m kernels.perf.autotune) on the GPU machine, from the repository root,
# within one device call (at most 10 minutes):
#
#   all   forward and backward (default)
#   fwd   the forward alone; bwd the backward alone (two calls, if `all` lists keys not run)
#
# fp16 and bf16, d = 64 and 128, N = 1,024, 4,096 and 16,384 (B·H = 16·16,384/N, H = 16), causal
# and not: 24 keys a pass.  Per key the model's top 4 configs (and the default, if the model left
# it out) are checked against float64 and timed, 10 calls each (the median), L2 flushed.  Most of
# the time is numba compiling each new config (each (dtype, d, causal) compiles its own kernels;
# the three N reuse them).  No key starts after BUDGET_S seconds (default 330; the .meta.json and
# the log list what was not run) and the process is killed at BUDGET_S + 200.  Writes
# $OUT/autotune_<part>/autotune.csv, .meta.json, tune.json (the cache entries) and autotune.log.
# Then, here: `python -m kernels.perf.autotune --merge autotune_fwd/tune.json autotune_bwd/tune.json
# --cache FILE` joins the parts' caches.
#   usage: FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/autotune.sh [all|fwd|bwd] [BUDGET_S]
set -u
part=${1:-all}
budget=${2:-330}
case $part in
  all) passes=fwd,bwd ;;
  fwd|bwd) passes=$part ;;
  *) echo "autotune: part=$part: one of all, fwd, bwd"; exit 2 ;;
esac
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export FLASHSIM_TUNE_CACHE=/tmp/flashsim_tune.json  # the run's own cache; DIR/tune.json comes back
dir="$OUT/autotune_$part"
mkdir -p "$dir"
set -o pipefail
start=$(date +%s)
timeout $(( budget + 200 )) python3 -m kernels.perf.autotune --dtypes fp16,bf16 --ds 64 128 \
    --ns 1024 4096 16384 --causal both --passes "$passes" --top 4 --repeat 10 --budget "$budget" \
    --out "$dir" 2>&1 | tee "$dir/autotune.log"
echo "autotune $part: exit $? (124: killed at the time limit) in $(( $(date +%s) - start )) s" | tee -a "$dir/autotune.log"
