python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHSIM_GIT_COMMIT=$(cat .commit) FLASHSIM_GIT_DIRTY=0
s=$(date +%s); el(){ echo "[$(( $(date +%s) - s )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/r
# correctness first, in parallel (no timing yet)
(FLASHSIM_GPU=1 timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -q -rA -n 6 --dist load \
   tests/test_perf_bwd_fp16_v3.py -k one_q_buffer > $OUT/r/pytest_qbuf.log 2>&1; echo "pytest rc $?" >> $OUT/r/pytest_qbuf.log) &
for c in '{"qbuf": 1, "bulkq": true}' '{"qbuf": 1}'; do
  for tool in memcheck racecheck; do
    (timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize --only bwd_fp16_v3 --d 224 256 --config "$c" \
       > "$OUT/r/san_${tool}_$(echo $c | tr -dc a-z0-9).log" 2>&1; echo "rc $?" >> "$OUT/r/san_${tool}_$(echo $c | tr -dc a-z0-9).log") &
  done
done
wait
el correctness; tail -2 $OUT/r/pytest_qbuf.log; for f in $OUT/r/san_*; do echo "$f: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | tail -1) $(tail -1 $f)"; done
C=('{}' '{"qbuf": 1, "bulkq": true}' '{"qbuf": 1}')
timeout 150 python3 -m kernels.perf.tune bwd_fp16_v3 --d 256 224 192 --n 4096 16384 --configs "${C[@]}" --peers sdpa_flash --repeat 10 --out $OUT/r/fp16 2>&1 | grep -v Warn; el fp16
timeout 100 python3 -m kernels.perf.tune bwd_fp16_v3 --dtype bf16 --d 256 224 --n 4096 16384 --configs "${C[@]}" --peers sdpa_flash --repeat 10 --out $OUT/r/bf16 2>&1 | grep -v Warn; el bf16
timeout 80 python3 -m kernels.perf.tune bwd_fp16_v3 --causal --d 256 --n 4096 16384 --configs "${C[@]}" --peers sdpa_flash --repeat 10 --out $OUT/r/causal 2>&1 | grep -v Warn; el causal
cd $OUT && tar czf r.tgz r && rm -rf r
