#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: `flashsim measure` end to end
# with the real Nsight Compute on the smoke set (5 small configurations), its record written all
# or nothing, then refused a second time without --force (the record unchanged), and
# `flashsim compare` on it.  Everything lands under $OUT (log, record, comparison, checksums).
#   usage: FLASHSIM_GIT_COMMIT=<sha> FLASHSIM_GIT_DIRTY=0 bash scripts/device/measure_smoke.sh
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/measure_smoke.log"
{
    echo "+ flashsim measure --set smoke --out $OUT/smoke"
    python3 -m flashsim measure --set smoke --out "$OUT/smoke"
    echo "exit $?"
    ls -la "$OUT/smoke"
    (cd "$OUT/smoke" && sha256sum ./*) > "$OUT/before.sha256"
    echo "+ the same again, without --force (must exit 2 and leave the record as it is)"
    python3 -m flashsim measure --set smoke --out "$OUT/smoke"
    echo "exit $?"
    (cd "$OUT/smoke" && sha256sum ./*) | diff "$OUT/before.sha256" - && echo "record unchanged"
    echo "+ flashsim compare $OUT/smoke/smoke.csv --out $OUT/compare"
    python3 -m flashsim compare "$OUT/smoke/smoke.csv" --out "$OUT/compare"
    echo "exit $?"
} > "$log" 2>&1
grep -E '^(\+|exit|record unchanged|flashsim: error|LSU level)' "$log"
