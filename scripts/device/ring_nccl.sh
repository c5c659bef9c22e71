#!/usr/bin/env bash
# On a GPU machine (the device tool), from the repository root: ring attention over NCCL on every
# GPU of the host (benchmarks/ring_bench.py under torchrun, one process per GPU): exactness
# against single-GPU attention, the ring's time against the simulator's overlap prediction, strong
# and weak scaling over P = 1, 2, 4, 8 (N up to 1,048,576 at d = 128 on 8 GPUs).  Writes
# ring_nccl.csv, ring_nccl_exactness.csv, ring_nccl.meta.json and the log under $OUT.
#   usage: FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/ring_nccl.sh [--quick]
# On a one-GPU kind it runs P = 1 only (a smoke test of the same code: no transfers).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off (the device notes: a program using it can take the host's GPUs out
# of service); set here too in case the image's defaults are not inherited.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=$(nvidia-smi -L | wc -l)
echo "GPUs: $ngpu"; nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -20
start=$(date +%s)
python3 -m torch.distributed.run --standalone --nproc-per-node "$ngpu" benchmarks/ring_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/ring_nccl.log"
rc=${PIPESTATUS[0]}
echo "ring_bench: exit $rc in $(( $(date +%s) - start )) s"
exit "$rc"
