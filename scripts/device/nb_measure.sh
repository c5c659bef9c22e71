#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root with .whl carried: the
# measurements behind notebooks 02, 04, 05 and 06 (issue 22), analysis/nb_measure.py's four
# steps, each under its own time limit so that one overrunning step cannot take the others' data:
#   gpt2    GPT-2-medium attention alone (B 64, H 16, N 1,024, d 64, fp16), fwd+bwd and fwd,
#           naive / SDPA flash, cuDNN, mem-eff / ours, 5 runs x 20 calls   -> kernels/data/gpt2_medium_attention_<gpu>.*
#   exact   FlashAttention-2 forward against float64: 4 distributions x 4 seeds, fp32 and fp16,
#           N 1,024-16,384 all rows; fp32 N 32,768; memory of one call at N 16k-131k -> kernels/data/<gpu>_exactness_spread.*
#   fig2    Figure 2 (middle) at the GPT-2-medium shape: FA1 over M, FA2 over Br x Bc, ncu
#           (LSU, L2, DRAM bytes, time) + CUDA-event times                   -> analysis/data/<gpu>/fig2/
#   dsweep  d = 32..256 at fixed N under ncu: FA1 (M 32 KB, 64 KB), FA2     -> analysis/data/<gpu>/dsweep/
#   long    (not run by default) the memory per call at N 16k-131k, every row checked from 65,536 on,
#           alone (exact runs it last, where its limit may cut it short)      -> kernels/data/<gpu>_exactness_long.*
# Everything lands under $OUT at its repository path (copy with `cp -r $OUT/. .`), with a log per
# step in $OUT/nb_measure_logs/.  At most 8 minutes on an H100 (the four limits add up to 480 s).
#   usage: FLASHSIM_GIT_COMMIT=<sha> FLASHSIM_GIT_DIRTY=0 bash scripts/device/nb_measure.sh [STEP ...]
set -u
: "${OUT:?OUT must name the output folder}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -n "${FLASHSIM_GIT_COMMIT:-}" ] || echo "nb_measure: FLASHSIM_GIT_COMMIT is not set; the records' git_commit will be empty" >&2
mkdir -p "$OUT/nb_measure_logs"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gpt2 exact fig2 dsweep)
declare -A limit=([gpt2]=80 [exact]=160 [fig2]=120 [dsweep]=120 [long]=240)
for s in "${steps[@]}"; do
    t0=$(date +%s)
    timeout "${limit[$s]:-120}" python3 -m analysis.nb_measure "$s" --out "$OUT" > "$OUT/nb_measure_logs/$s.log" 2>&1
    rc=$?
    echo "== $s: exit $rc after $(( $(date +%s) - t0 )) s (124 = hit its ${limit[$s]:-120} s limit)"
    grep -vE '^\s*$' "$OUT/nb_measure_logs/$s.log" | grep -vE '==PROF==|^\[[0-9]+/' | tail -n 25
done
find "$OUT" -type f -not -path '*/nb_measure_logs/*' | sort
