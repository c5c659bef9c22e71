#!/usr/bin/env bash
# On the GPU machine, from the repository root, with an older tree carried in .ab/old (git-ignored;
# `git archive OLD | tar -x -C .ab/old`): kernels.bench of the shipped variants at N = 4,096 (fwd and
# bwd, fp16 and fp32, d 64 and 128, causal or not) with SDPA's flash backend and naive attention
# timed in the same run, four runs interleaved old, new, old, new in one machine session, so that
# the same-run ratios of the two trees compare under the same conditions and the old tree's own
# run-to-run spread is measured beside them.  Writes $OUT/ab/{old,new}_{1,2}.csv and
# $OUT/ab/summary.txt (per row: x_sdpa_flash of each run; new/old of the medians; the old
# tree's run-to-run spread).   usage: bash scripts/device/ab_bench.sh [BUDGET_S]
set -u
start=$(date +%s)
budget=${1:-560}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
mkdir -p "$OUT/ab"
variants="naive sdpa_flash ours_fwd_fp16_v4 ours_fwd_fp32_v1 ours_bwd_fp16_v1 ours_bwd_fp16_v3 ours_bwd_fp32_v1 ours_bwd_fp32_v2"
for run in 1 2; do
  for tree in old new; do
    t=$(( budget - ($(date +%s) - start) ))
    if [ "$t" -lt 60 ]; then echo "$tree run $run: skipped ($t s left)"; continue; fi
    dir=.; [ $tree = old ] && dir=.ab/old
    (cd $dir && PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 timeout "$t" python3 -m kernels.bench --ns 4096 \
        --repeat 20 --variants $variants --out "$OUT/ab/${tree}_$run.csv" > "/tmp/ab_${tree}_$run.log" 2>&1)
    echo "$tree run $run: exit $? at $(( $(date +%s) - start )) s"
  done
done
PYTHONPATH=/tmp/site:$PWD python3 - "$OUT/ab" <<'PY' | tee "$OUT/ab/summary.txt"
import csv, os, statistics as st, sys
out = sys.argv[1]
runs = {}
for tree in ("old", "new"):
    for i in (1, 2):
        p = os.path.join(out, f"{tree}_{i}.csv")
        if os.path.exists(p):
            runs.setdefault(tree, []).append({(r["config"], r["variant"]): r for r in csv.DictReader(open(p))})
keys = sorted({k for rs in runs.values() for r in rs for k in r if k[1].startswith("ours")})
def x(r, k):
    v = r.get(k, {}).get("x_sdpa_flash")
    return float(v) if v else None
print(f"{'config':28s} {'variant':16s} {'old runs':>15s} {'new runs':>15s}  new/old  old spread")
ratios, spreads = [], []
for k in keys:
    o = [v for v in (x(r, k) for r in runs.get("old", [])) if v]
    n = [v for v in (x(r, k) for r in runs.get("new", [])) if v]
    if not o or not n:
        continue
    rel = st.median(n) / st.median(o)
    sp = (max(o) - min(o)) / st.median(o)
    ratios.append(rel), spreads.append(sp)
    print(f"{k[0]:28s} {k[1]:16s} {' '.join(f'{v:7.3f}' for v in o):>15s} {' '.join(f'{v:7.3f}' for v in n):>15s}"
          f"  {rel:6.3f}  {sp:6.3f}")
if ratios:
    print(f"new/old of x_sdpa_flash over {len(ratios)} rows: median {st.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}; old run-to-run spread median {st.median(spreads):.3f}, "
          f"max {max(spreads):.3f}")
PY
echo "total: $(( $(date +%s) - start )) s"
