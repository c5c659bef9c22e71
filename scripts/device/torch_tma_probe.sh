#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the torch_tma probe set under
# Nsight Compute (`flashsim measure --set torch_tma`: naive attention's and SDPA cuDNN's forwards
# at B·H = 1, 2, 4, 16, N = 1,024, d = 64, fp16; 14 configurations, about a minute) and its
# comparison.  Do the persistent nvjet GEMMs and cuDNN's forward read as many L2 sectors as the
# schedules when each CTA runs one tile (B·H <= 4)?  See the README, "PyTorch's attention,
# modelled and measured".  PY: the python that has torch (the torch record used
# /opt/torch/.venv/bin/python3).  Everything lands under $OUT.
#   usage: PY=/opt/torch/.venv/bin/python3 bash scripts/device/torch_tma_probe.sh
set -u
PY=${PY:-python3}
"$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/torch_tma.log"
{
    echo "+ flashsim measure --set torch_tma --out $OUT/torch_tma"
    "$PY" -m flashsim measure --set torch_tma --out "$OUT/torch_tma"
    echo "exit $?"
    echo "+ flashsim compare $OUT/torch_tma/torch_tma.csv --out $OUT/torch_tma/compare"
    "$PY" -m flashsim compare "$OUT/torch_tma/torch_tma.csv" --out "$OUT/torch_tma/compare"
    echo "exit $?"
    "$PY" -m analysis.torch_set "$OUT/torch_tma/compare/compare_launches.csv"
} > "$log" 2>&1
tail -40 "$log"
