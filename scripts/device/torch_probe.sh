#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: a torch probe set under Nsight
# Compute (`flashsim measure --set SET`) and its comparison, everything under $OUT/SET.
#   torch_tma   naive attention's and SDPA cuDNN's forwards at B·H = 1, 2, 4, 16, N = 1,024,
#               d = 64, fp16 (14 configurations, about a minute): do the persistent nvjet GEMMs
#               and cuDNN's forward read as many L2 sectors as the schedules when each CTA runs
#               one tile (B·H <= 4)?
#   torch_edge  naive attention where cuBLAS's tiles do not divide the matrices (N = 1,000,
#               2,000, d = 80, 1-12 heads, fp16 and bf16, forward and backward): do the TMA
#               GEMMs' SMs receive whole boxes on a cluster-padded grid?
# See the README, "PyTorch's attention, modelled and measured".  PY: the python that has torch
# (the torch records used /opt/torch/.venv/bin/python3).
#   usage: PY=/opt/torch/.venv/bin/python3 bash scripts/device/torch_probe.sh [SET]
set -u
set_=${1:-torch_tma}
PY=${PY:-python3}
"$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/$set_.log"
{
    echo "+ flashsim measure --set $set_ --out $OUT/$set_"
    "$PY" -m flashsim measure --set "$set_" --out "$OUT/$set_"
    echo "exit $?"
    echo "+ flashsim compare $OUT/$set_/$set_.csv --out $OUT/$set_/compare"
    "$PY" -m flashsim compare "$OUT/$set_/$set_.csv" --out "$OUT/$set_/compare"
    echo "exit $?"
    "$PY" -m analysis.torch_set "$OUT/$set_/compare/compare_launches.csv"
} > "$log" 2>&1
tail -40 "$log"
