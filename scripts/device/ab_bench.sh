#!/usr/bin/env bash
# A/B of two trees' kernels on the GPU machine, from the repository root, with the older tree
# carried in .ab/old (git-ignored through .git/info/exclude; made with
# `mkdir -p .ab/old && git archive OLD | tar -x -C .ab/old && git rev-parse OLD > .ab/old/COMMIT`,
# and carried to the device with the run's `carry: [".ab"]`).  The new tree is the working tree.
#
# Both trees run the working tree's kernels/bench.py (copied over .ab/old/kernels/bench.py: only
# the kernels differ), alternated old, new, old, new, ... in one machine session while the budget
# lasts: a pair of runs (old, then new) starts only if the last pair's time still fits, so both
# trees get as many runs (a verdict needs two each).  Each process:
# `kernels.bench --shapes grid --ns 4096 16384 --causal no --dtypes fp16,fp32 --rounds 3 --repeat 5
# --variants sdpa_flash sdpa_mem_eff best`: the shipped variant (kernels.perf.BEST) for each
# pass, dtype and d (64, 128), timed in 3 rounds interleaved with SDPA's flash backend (fp16) and
# memory-efficient backend (fp32, which flash does not take).  `python -m kernels.bench_ab` then
# prints, per row, new/old of the same-run ratio and whether it is outside the two trees' own
# run-to-run spread.
#
# The runs are written under /tmp/ab ({old,new}_<i>.csv, .meta.json, .log) and, after every run,
# packed into four files (a device call returns at most eight): $OUT/ab/runs.csv (every run's
# rows, columns tree and run added), $OUT/ab/runs.meta.json (their provenance), $OUT/ab/log.txt
# (their output) and $OUT/ab/summary.txt.
# AB_NS (default "4096 16384") sets the N of the runs and AB_ONLY, if set, keeps the configurations
# whose names hold it (kernels.bench --only; e.g. AB_ONLY=fwd-fp16 for the fp16 forward alone).
#   usage: FLASHSIM_GIT_COMMIT=<new sha> [AB_NS=...] [AB_ONLY=...] bash scripts/device/ab_bench.sh [BUDGET_S (default 340)]
set -u
start=$(date +%s)
budget=${1:-340}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
if [ ! -d .ab/old/kernels ]; then echo "ab_bench: no old tree in .ab/old (see the header)"; exit 2; fi
mkdir -p "$OUT/ab" /tmp/ab
cp kernels/bench.py .ab/old/kernels/bench.py
old_commit=$(cat .ab/old/COMMIT 2>/dev/null || echo unknown)
new_commit=${FLASHSIM_GIT_COMMIT:-unknown}
args="--shapes grid --ns ${AB_NS:-4096 16384} --ds 64 128 --causal no --dtypes fp16,fp32 --rounds 3 --repeat 5
      --variants sdpa_flash sdpa_mem_eff best${AB_ONLY:+ --only $AB_ONLY}"
declare -A took=([old]=0 [new]=0)
for run in 1 2 3 4 5 6 7 8; do
  # a pair (old, then new) starts only if both runs would fit, so that the trees get as many runs
  left=$(( budget - ($(date +%s) - start) ))
  need=$(( (took[old] + took[new]) * 11 / 10 ))
  if [ "$run" -gt 1 ] && [ "$left" -lt "$need" ]; then
    echo "pair $run: not started ($left s left, the last pair took $(( took[old] + took[new] )) s)"; break
  fi
  for tree in old new; do
    left=$(( budget - ($(date +%s) - start) ))
    if [ "$run" = 1 ] && [ "$left" -lt 30 ]; then echo "$tree run 1: not started ($left s left)"; break 2; fi
    dir=$PWD; commit=$new_commit
    [ $tree = old ] && dir=$PWD/.ab/old && commit=$old_commit
    t0=$(date +%s)
    # shellcheck disable=SC2086
    (cd "$dir" && FLASHSIM_GIT_COMMIT=$commit PYTHONPATH=/tmp/site:$dir timeout "$left" python3 -m kernels.bench \
        $args --out "/tmp/ab/${tree}_$run.csv" > "/tmp/ab/${tree}_$run.log" 2>&1)
    rc=$?
    took[$tree]=$(( $(date +%s) - t0 ))
    echo "$tree run $run: exit $rc (124: stopped by the budget) in ${took[$tree]} s, at $(( $(date +%s) - start )) s"
    for f in /tmp/ab/*_*.log; do echo "=== $f"; cat "$f"; done > "$OUT/ab/log.txt"
    PYTHONPATH=/tmp/site:$PWD python3 -m kernels.bench_ab --pack /tmp/ab "$OUT/ab/runs.csv"
  done
done
PYTHONPATH=/tmp/site:$PWD python3 -m kernels.bench_ab "$OUT/ab/runs.csv" | tee "$OUT/ab/summary.txt"
echo "total: $(( $(date +%s) - start )) s"
