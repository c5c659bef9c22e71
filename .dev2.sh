python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHSIM_GIT_COMMIT=$(cat .commit) FLASHSIM_GIT_DIRTY=0
s=$(date +%s); el(){ echo "[$(( $(date +%s) - s )) s] $*"; }
mkdir -p $OUT/r
(FLASHSIM_GPU=1 timeout 280 python3 -m pytest -m gpu -p no:cacheprovider -q -rA -n 8 --dist load \
   tests/test_perf_bwd_fp16_v3.py tests/test_bf16.py > $OUT/r/pytest_bwd_v3.log 2>&1; echo "pytest rc $?" >> $OUT/r/pytest_bwd_v3.log) &
for tool in memcheck racecheck; do
  (timeout 280 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize --only bwd_fp16_v3 --d 136 184 200 \
     > "$OUT/r/san_${tool}.log" 2>&1; echo "rc $?" >> "$OUT/r/san_${tool}.log") &
done
wait
el correctness; grep -E "passed|failed" $OUT/r/pytest_bwd_v3.log | tail -2; tail -1 $OUT/r/pytest_bwd_v3.log
for f in $OUT/r/san_*; do echo "$f: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | tail -1) $(tail -1 $f)"; done
T="python3 -m kernels.perf.tune bwd_fp16_v3 --peers sdpa_flash --repeat 10 --n 4096 16384"
timeout 110 $T --d 144 160 176 --configs '{}' '{"qbuf": 2}' --out $OUT/r/mid 2>&1 | grep -v Warn; el mid
timeout 70 $T --d 208 240 --configs '{}' '{"qbuf": 2, "bulkq": false}' --out $OUT/r/odd 2>&1 | grep -v Warn; el odd
timeout 60 $T --dtype bf16 --d 192 --configs '{}' '{"qbuf": 2}' --out $OUT/r/bf16 2>&1 | grep -v Warn; el bf16
timeout 60 $T --causal --d 192 224 --configs '{}' '{"qbuf": 2}' --out $OUT/r/causal 2>&1 | grep -v Warn; el causal
timeout 60 $T --d 128 96 --configs '{}' '{"qbuf": 1}' --out $OUT/r/low 2>&1 | grep -v Warn; el low
cd $OUT && tar czf r.tgz r && rm -rf r
