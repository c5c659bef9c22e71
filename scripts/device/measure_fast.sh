#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the `fast` set (issue 15: the
# kernels users get by default, kernels.perf.BEST, every launch of each; 25 configurations, 55
# launches) measured under Nsight Compute and compared with the simulator's `fast` schedules,
# after the cp.async counting probe (scripts/device/ldgsts_probe.sh).  The forward
# configurations and the backward ones are two records (so that a time-out of one keeps the
# other): $OUT/fast_fwd/fast.csv and $OUT/fast_bwd/fast.csv, each compared into
# $OUT/compare_fast_{fwd,bwd}/.  Everything lands under $OUT (log included).
#   usage: FLASHSIM_GIT_COMMIT=<sha> FLASHSIM_GIT_DIRTY=0 bash scripts/device/measure_fast.sh [STAGES]
#   STAGES: any of probe, fwd, bwd, smoke (default "probe fwd bwd"; smoke: the fast_smoke set,
#   one small configuration per variant, about a minute)
set -u
stages="${*:-probe fwd bwd}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/measure_fast.log"
measure() {  # measure SET ONLY DIR LIMIT
    echo "+ flashsim measure --set $1 --only '$2' --out $OUT/$3 (limit $4 s)"
    start=$(date +%s)
    timeout "$4" python3 -m flashsim measure --set "$1" --only="$2" --out "$OUT/$3"
    echo "exit $? after $(( $(date +%s) - start )) s"
    if [ -f "$OUT/$3/$1.csv" ]; then
        echo "+ flashsim compare $OUT/$3/$1.csv --out $OUT/compare_$3 --no-plots"
        python3 -m flashsim compare "$OUT/$3/$1.csv" --out "$OUT/compare_$3" --no-plots
        echo "exit $?"
    fi
}
{
    for s in $stages; do
        case "$s" in
            probe) echo "+ ldgsts probe"; timeout 90 bash scripts/device/ldgsts_probe.sh; echo "exit $?" ;;
            fwd) measure fast "-fwd-" fast_fwd 150 ;;
            bwd) measure fast "-bwd-" fast_bwd 330 ;;
            smoke) measure fast_smoke "-" fast_smoke 300 ;;
            *) echo "unknown stage $s" ;;
        esac
    done
} > "$log" 2>&1
grep -E '^(\+|exit|probe|flashsim: error|LSU level|wrote|unknown)' "$log"
