#!/usr/bin/env bash
# One part of the bench record (kernels.bench with rounds) on the GPU machine, from the
# repository root, within one device call (at most 10 minutes):
#
#   grid          --shapes grid, N 1,024-16,384, d 64 and 128, causal or not, fwd and bwd
#   grid-fwd      the grid's forward alone; grid-bwd its backward (if grid does not fit)
#   offgrid-fwd   --shapes offgrid (the fixed list and 6 sampled shapes, seed 0), forward
#   offgrid-bwd   the same shapes, backward
#
# every part in fp16, bf16 and fp32, 5 rounds of 5 timed calls per variant: every shipped variant of
# ours (kernels.perf.BEST) beside the peers, or only the variants BENCH_VARIANTS names (as
# kernels.bench --variants, e.g. "naive sdpa_flash sdpa_mem_eff sdpa_cudnn best": the peers and the
# one impl="auto" runs).  It stops starting
# configurations after BUDGET_S seconds (default 480; the .meta.json lists what was not run,
# for a later `--only`), and is killed at BUDGET_S + 60.  Writes $OUT/bench_<part>.csv,
# .meta.json and .log.  Then, here, each record extended in place (the record itself the first
# part, so that its other parts stay): `python -m kernels.bench_table --force --merge
# kernels/data/bench_h100.csv kernels/data/bench_h100.csv bench_grid.csv` (or the grid's two
# parts) and the same for kernels/data/bench_offgrid_h100.csv with bench_offgrid-fwd.csv and
# bench_offgrid-bwd.csv, and
# `python -m kernels.bench_table kernels/data/bench_h100.csv kernels/data/bench_offgrid_h100.csv
# --readme README.md`.
#   usage: FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/bench_record.sh PART [BUDGET_S]
set -u
part=${1:?usage: bench_record.sh grid|grid-fwd|grid-bwd|offgrid-fwd|offgrid-bwd [BUDGET_S]}
budget=${2:-480}
case $part in
  grid) flags="--shapes grid --ns 1024 4096 8192 16384" ;;
  grid-fwd) flags="--shapes grid --ns 1024 4096 8192 16384 --only fwd-" ;;
  grid-bwd) flags="--shapes grid --ns 1024 4096 8192 16384 --only bwd-" ;;
  offgrid-fwd) flags="--shapes offgrid --sample 6 --seed 0 --only fwd-" ;;
  offgrid-bwd) flags="--shapes offgrid --sample 6 --seed 0 --only bwd-" ;;
  *) echo "bench_record: part=$part: one of grid, grid-fwd, grid-bwd, offgrid-fwd, offgrid-bwd"; exit 2 ;;
esac
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
set -o pipefail
start=$(date +%s)
vflags=${BENCH_VARIANTS:+--variants $BENCH_VARIANTS}
# shellcheck disable=SC2086
timeout $(( budget + 60 )) python3 -m kernels.bench $flags $vflags --dtypes fp16,bf16,fp32 --rounds 5 --repeat 5 \
    --budget "$budget" --out "$OUT/bench_$part.csv" 2>&1 | tee "$OUT/bench_$part.log"
echo "bench $part: exit $? (124: killed at the time limit) in $(( $(date +%s) - start )) s" | tee -a "$OUT/bench_$part.log"
