#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: the test suite's GPU-marked
# tests (FLASHSIM_GPU=1 pytest -m gpu: exactness at N up to 16,384, d 64 and 128, fp32 and fp16,
# reference and fast kernels; counters; N = 131,072) with their printed errors, and a JSON
# summary with the GPU's provenance, written under $OUT.
# The 243 GPU tests take longer than one device call (10 minutes) run one at a time: they run
# on JOBS processes (default 14, by file: pytest-xdist), and PATHS (default tests/) picks a part,
# e.g. the first half of the files in one call and the rest in the next.
#   usage: FLASHSIM_GIT_COMMIT=<sha> [JOBS=14] bash scripts/device/pytest_gpu.sh [PATHS...]
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
start=$(date +%s)
# test_notebooks needs the notebook tools, which the GPU image lacks; nothing there is GPU-marked.
paths=("$@"); [ ${#paths[@]} -eq 0 ] && paths=(tests/)
# -v names each test as it ends, so that a run stopped by the device call's limit (junit.xml is
# written only at the end) still says which tests passed; --durations names the slow ones.
FLASHSIM_GPU=1 python3 -m pytest -m gpu -p no:cacheprovider -s -v -rA --durations=25 --ignore=tests/test_notebooks.py \
    -n "${JOBS:-14}" --dist loadfile --junitxml="$OUT/junit.xml" "${paths[@]}" > "$OUT/${gpu}_pytest_gpu.log" 2>&1
rc=$?
echo "pytest -m gpu: exit $rc in $(( $(date +%s) - start )) s"
tail -3 "$OUT/${gpu}_pytest_gpu.log"
python3 - "$OUT/junit.xml" "$OUT/${gpu}_pytest_gpu.json" "$rc" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from kernels.gpucheck import provenance
suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
cases = []
for c in suite.iter("testcase"):
    state = "failed" if c.find("failure") is not None or c.find("error") is not None else (
        "skipped" if c.find("skipped") is not None else "passed")
    cases.append({"test": f"{c.get('classname')}::{c.get('name')}", "state": state, "seconds": float(c.get("time", 0))})
summary = {"provenance": provenance(), "command": "FLASHSIM_GPU=1 pytest -m gpu",
           "exit_status": int(sys.argv[3]), "passed": sum(c["state"] == "passed" for c in cases),
           "failed": sum(c["state"] == "failed" for c in cases), "skipped": sum(c["state"] == "skipped" for c in cases),
           "seconds": float(suite.get("time", 0)), "tests": cases}
json.dump(summary, open(sys.argv[2], "w"), indent=1)
print({k: summary[k] for k in ("passed", "failed", "skipped", "seconds")})
PY
