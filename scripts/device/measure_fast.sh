#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the `fast` set (issue 15: the
# kernels users get by default, kernels.perf.BEST, every launch of each; 29 configurations, 66
# launches) measured under Nsight Compute and compared with the simulator's `fast` schedules,
# after the cp.async counting probe (scripts/device/ldgsts_probe.sh).  Three records (so that a
# time-out or a failure of one keeps the others): the fp16/fp32 forward configurations
# ($OUT/fast_fwd/fast.csv, 14), the fp16/fp32 backward ones ($OUT/fast_bwd/fast.csv, 13), and the
# bf16 forward and backward ($OUT/fast_bf16/fast.csv, 2: the bf16 kernels' first GPU run, last),
# each compared into $OUT/compare_fast_{fwd,bwd,bf16}/.  Everything lands under $OUT (log included).
#   usage: FLASHSIM_GIT_COMMIT=<sha> FLASHSIM_GIT_DIRTY=0 bash scripts/device/measure_fast.sh [STAGES]
#   STAGES: any of probe, fwd, bwd, bf16, smoke (default "probe fwd bwd bf16"; smoke: the fast_smoke
#   set, one small configuration per variant and a bf16 forward and backward, about a minute)
set -u
stages="${*:-probe fwd bwd bf16}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/measure_fast.log"
measure() {  # measure SET ONLY DIR LIMIT [SKIP]
    skip=${5:+--skip=$5}
    echo "+ flashsim measure --set $1 --only '$2' $skip --out $OUT/$3 (limit $4 s)"
    start=$(date +%s)
    timeout "$4" python3 -m flashsim measure --set "$1" --only="$2" $skip --out "$OUT/$3"
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
            fwd) measure fast "-fwd-" fast_fwd 150 -bf16- ;;
            bwd) measure fast "-bwd-" fast_bwd 330 -bf16- ;;
            bf16) measure fast "-bf16-" fast_bf16 120 ;;
            smoke) measure fast_smoke "-" fast_smoke 300 ;;
            *) echo "unknown stage $s" ;;
        esac
    done
} > "$log" 2>&1
grep -E '^(\+|exit|probe|flashsim: error|LSU level|wrote|unknown)' "$log"
