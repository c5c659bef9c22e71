python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHSIM_GIT_COMMIT=$(cat .commit) FLASHSIM_GIT_DIRTY=0
mkdir -p $OUT/r; s=$(date +%s)
FLASHSIM_GPU=1 timeout 260 python3 -m pytest -m gpu -p no:cacheprovider -v -rA -n 11 --dist load $(cat .tests4) > $OUT/r/pytest_bf16_rest.log 2>&1; echo "pytest rc $?" >> $OUT/r/pytest_bf16_rest.log
echo "[$(( $(date +%s) - s )) s]"; grep -cE "PASSED" $OUT/r/pytest_bf16_rest.log; grep -E "FAILED|ERROR" $OUT/r/pytest_bf16_rest.log | head; tail -3 $OUT/r/pytest_bf16_rest.log
