#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: does the kernels/perf
# restructuring (issue 17: one module per op and precision, tc split into tc_gpu/tc_sim) leave
# the GPU behaviour as it was?  One command, about 8 minutes on an H100, in three stages:
#
#   1. FLASHSIM_GPU=1 pytest -m gpu (about 6 min on the H100 at d58f3a9) and, beside it on the
#      same GPU, compute-sanitizer memcheck then racecheck on `python -m kernels.sanitize`
#      (every kernel at a small ragged size; nothing is timed in either);
#   2. alone on the GPU, kernels.bench of the shipped variants at N = 4,096 (fwd and bwd, fp16
#      and fp32, d 64 and 128, causal or not: 16 of bench_h100.csv's configurations) with their
#      peers in the same run, so that the ratios compare with the record's; --repeat 20 gives
#      each row's spread (ms_std); a second run is made if time is left, for the run-to-run spread.
#   3. a summary: pass/fail counts, sanitizer summaries, and per row the ratio to naive of this
#      run against kernels/data/bench_h100.csv.
#
# The bench stops where the budget (VERIFY_BUDGET_S, default 510 s from the start) runs out; it
# rewrites its CSV after every configuration, so what it measured is kept.  Writes under $OUT
# (at most 8 files): pytest_gpu.log, pytest_gpu.json, sanitize-memcheck.log,
# sanitize-racecheck.log, bench_n4096.csv (+ .meta.json), bench_n4096_2.csv, summary.txt.
#   usage: FLASHSIM_GIT_COMMIT=<sha> bash scripts/device/verify_restructure.sh
set -u
start=$(date +%s)
budget=${VERIFY_BUDGET_S:-510}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
left() { echo $(( budget - ($(date +%s) - start) )); }

# Stage 1: the GPU tests and the sanitizers, side by side (nothing timed).
(FLASHSIM_GPU=1 python3 -m pytest -m gpu -p no:cacheprovider -s -rA --ignore=tests/test_notebooks.py \
    --junitxml=/tmp/verify_junit.xml tests/ > "$OUT/pytest_gpu.log" 2>&1; echo $? > /tmp/verify_pytest_rc) &
pytest_pid=$!
command -v compute-sanitizer > /dev/null || echo "compute-sanitizer: not on PATH (the sanitizer logs will say so)"
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kernels.sanitize > "$OUT/sanitize-$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? at $(( $(date +%s) - start )) s"
done
wait $pytest_pid
echo "pytest -m gpu: exit $(cat /tmp/verify_pytest_rc) at $(( $(date +%s) - start )) s"

# Stage 2: the bench, alone on the GPU, within what is left of the budget.
for run in 1 2; do
  name=bench_n4096; [ $run = 2 ] && name=bench_n4096_2
  t=$(left)
  if [ "$t" -lt 60 ]; then echo "bench run $run: skipped ($t s left)"; continue; fi
  timeout "$t" python3 -m kernels.bench --ns 4096 --repeat 20 --out "$OUT/$name.csv" > /tmp/verify_$name.log 2>&1
  echo "bench run $run: exit $? at $(( $(date +%s) - start )) s (124: stopped by the budget)"
  tail -2 /tmp/verify_$name.log
  [ $run = 2 ] && rm -f "$OUT/$name.meta.json"
done

# Stage 3: the summary.
python3 - "$OUT" /tmp/verify_junit.xml "$(cat /tmp/verify_pytest_rc)" <<'PY' | tee "$OUT/summary.txt"
import csv, json, os, re, sys, xml.etree.ElementTree as ET
from kernels.gpucheck import provenance
out, junit, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(json.dumps(provenance()))
cases = []
if os.path.exists(junit):
    for c in ET.parse(junit).getroot().iter("testcase"):
        state = "failed" if c.find("failure") is not None or c.find("error") is not None else (
            "skipped" if c.find("skipped") is not None else "passed")
        cases.append({"test": f"{c.get('classname')}::{c.get('name')}", "state": state,
                      "seconds": float(c.get("time", 0))})
summary = {"command": "FLASHSIM_GPU=1 pytest -m gpu", "exit_status": rc, "provenance": provenance(),
           **{s: sum(c["state"] == s for c in cases) for s in ("passed", "failed", "skipped")}, "tests": cases}
json.dump(summary, open(os.path.join(out, "pytest_gpu.json"), "w"), indent=1)
print(f"pytest -m gpu: exit {rc}, " + ", ".join(f"{summary[s]} {s}" for s in ("passed", "failed", "skipped")))
for tool in ("memcheck", "racecheck"):
    text = open(os.path.join(out, f"sanitize-{tool}.log")).read()
    m = re.findall(r"(ERROR SUMMARY.*|RACECHECK SUMMARY.*)", text)
    print(f"sanitize {tool}: {m[-1] if m else 'no summary (see the log)'}; ran: {text.count('ran all kernels')} of 4")
record = {(r["config"], r["variant"]): r for r in csv.DictReader(open("kernels/data/bench_h100.csv"))}
runs = [os.path.join(out, f) for f in ("bench_n4096.csv", "bench_n4096_2.csv") if os.path.exists(os.path.join(out, f))]
rows = [list(csv.DictReader(open(p))) for p in runs]
print(f"bench: {len(runs)} run(s); x_naive of the shipped variants, this run(s) against bench_h100.csv:")
print(f"{'config':32s} {'variant':18s} {'record':>7s} " + " ".join(f"{'run' + str(i + 1):>7s}" for i in range(len(runs)))
      + "  ms_std/ms")
for r in rows[0] if rows else []:
    if not r["variant"].startswith("ours"):
        continue
    key = (r["config"], r["variant"])
    rec = record.get(key, {}).get("x_naive") or "-"
    now = [next((x["x_naive"] for x in rr if (x["config"], x["variant"]) == key), "") or "-" for rr in rows]
    fmt = lambda s: f"{float(s):7.2f}" if s not in ("-", "") else f"{s:>7s}"  # noqa: E731
    spread = f"{float(r['ms_std']) / float(r['ms']):.3f}" if r.get("ms") and r.get("ms_std") else "-"
    err = f"  {r['error']}" if r.get("error") else ""
    print(f"{r['config']:32s} {r['variant']:18s} {fmt(rec)} " + " ".join(fmt(x) for x in now) + f"  {spread}{err}")
PY
echo "total: $(( $(date +%s) - start )) s"
