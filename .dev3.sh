python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHSIM_GIT_COMMIT=$(cat .commit) FLASHSIM_GIT_DIRTY=0
s=$(date +%s); el(){ echo "[$(( $(date +%s) - s )) s] $*"; }
mkdir -p $OUT/r
FLASHSIM_GPU=1 timeout 230 python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n 14 --dist load \
   tests/test_perf_bwd_fp16_v3.py tests/test_bf16.py > $OUT/r/pytest_bwd_v3_bf16.log 2>&1; echo "pytest rc $?" >> $OUT/r/pytest_bwd_v3_bf16.log
el tests; grep -cE "PASSED" $OUT/r/pytest_bwd_v3_bf16.log; grep -E "FAILED|ERROR" $OUT/r/pytest_bwd_v3_bf16.log | head; tail -2 $OUT/r/pytest_bwd_v3_bf16.log
O=""; for t in fp16 bf16; do for d in 160 176 192 200 224 256; do O="$O bwd-$t-d$d-"; done; done
timeout $(( 560 - ($(date +%s) - s) )) python3 -m kernels.bench --shapes offgrid --sample 6 --seed 0 --dtypes fp16,bf16 --rounds 3 --repeat 5 \
  --variants best sdpa_flash sdpa_cudnn --only $O --budget $(( 480 - ($(date +%s) - s) )) --out $OUT/r/offgrid_bwd_wide.csv 2>&1 | grep -v Warn | tee $OUT/r/offgrid_bwd_wide.log
el bench
cd $OUT && tar czf r.tgz r && rm -rf r
