#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root, with .whl carried: the L2
# microbenchmarks of analysis/calibrate.py (re-read windows of 4-128 MiB, strided reads, a 512 MiB
# stream, writes of 2-256 MiB, write then read back; 68 launches, each under Nsight Compute with
# --cache-control all --clock-control none) and the bandwidth ceiling (1 GiB device-to-device copy,
# CUDA events).  Leaves under $OUT, as <gpu>_l2calib.*: .csv (one row per case), .meta.json
# (provenance), .ncu-raw.csv (ncu's export), .bandwidth.csv, .summary.txt, .log; prints the
# summary table last.
#   usage: FLASHSIM_GIT_COMMIT=<sha> [FLASHSIM_GIT_DIRTY=0|1] bash scripts/device/l2_calib.sh [--quick] [--force]
set -euo pipefail
: "${OUT:?OUT must name the output folder}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -n "${FLASHSIM_GIT_COMMIT:-}" ] || echo "l2_calib: FLASHSIM_GIT_COMMIT is not set; the record's git_commit will be empty" >&2
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | awk 'NR == 1 {print tolower($2)}')
gpu=${gpu:-gpu}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >&2
ncu --version >&2
python3 -m analysis.calibrate l2 --out "$OUT" --name "${gpu}_l2calib" "$@" 2>&1 | tee "$OUT/${gpu}_l2calib.log"
