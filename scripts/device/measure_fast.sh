#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the `fast` set (issue 15: the
# kernels users get by default, kernels.perf.BEST, every launch of each; 25 configurations, 55
# launches) measured under Nsight Compute, compared with the simulator's `fast` schedules, and
# the cp.async counting probe (scripts/device/ldgsts_probe.sh).  Everything lands under $OUT.
#   usage: FLASHSIM_GIT_COMMIT=<sha> FLASHSIM_GIT_DIRTY=0 bash scripts/device/measure_fast.sh [SET]
#   SET: fast (default) or fast_smoke (one small configuration per variant, a minute)
set -u
set_name="${1:-fast}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/measure_$set_name.log"
{
    echo "+ ldgsts probe"
    timeout 120 bash scripts/device/ldgsts_probe.sh
    echo "exit $?"
    echo "+ flashsim measure --set $set_name --out $OUT/$set_name"
    start=$(date +%s)
    timeout 480 python3 -m flashsim measure --set "$set_name" --out "$OUT/$set_name"
    echo "exit $? after $(( $(date +%s) - start )) s"
    echo "+ flashsim compare $OUT/$set_name/$set_name.csv --out $OUT/compare_$set_name --no-plots"
    python3 -m flashsim compare "$OUT/$set_name/$set_name.csv" --out "$OUT/compare_$set_name" --no-plots
    echo "exit $?"
} > "$log" 2>&1
grep -E '^(\+|exit|probe|flashsim: error|LSU level|wrote)' "$log"
