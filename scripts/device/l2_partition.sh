#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root: build and run
# scripts/device/l2_partition_probe.cu (which half of the L2 each SM is near, which half each line
# lives in) twice with 64 KiB between set 1's lines and two blocks an SM, once with 4 KiB and one
# block an SM, and once with set 1 written instead of read (are written lines near their
# writer?) ("partition"); then scripts/device/l2_reread_probe.cu (which lines one SM's
# re-read of W = 16-64 MiB loses, near or far ones) twice ("reread"),
# and ("full") the same probe's second pass over every line, in address order and reversed, and
# its cold lines (no first pass: a DRAM read's cycles), and ("written") lines the grid wrote,
# read back by one SM; the records
# gzip-compressed under $OUT/<gpu>_l2_partition/ with a meta.json (GPU, driver, nvcc, date,
# commit), then analysis.l2_partition's summaries.  Here: copy that folder to analysis/data/l2calib/.
#   usage: FLASHSIM_GIT_COMMIT=<sha> [FLASHSIM_GIT_DIRTY=0] [PARTS="partition reread"] bash scripts/device/l2_partition.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
dir="$OUT/${gpu}_l2_partition"
mkdir -p "$dir"
parts=${PARTS:-partition reread}
if [[ $parts == *partition* ]]; then
  nvcc -O2 -arch=sm_90 -o /tmp/l2_partition_probe scripts/device/l2_partition_probe.cu || exit 1
  for run in "l2pp_1 2 65536 read" "l2pp_2 2 65536 read" "l2pp_s4k 1 4096 read" "l2pp_w 2 65536 write"; do
    set -- $run
    timeout 120 /tmp/l2_partition_probe "$dir/$1.bin" "$2" "$3" "$4" || exit 1
    gzip -9 -f "$dir/$1.bin"
  done
fi
if [[ $parts == *full* || $parts == *written* || $parts == *reread* ]]; then
  # built afresh each time (a binary left on a warm machine may be an older probe's)
  nvcc -O2 -arch=sm_90 -o /tmp/l2_reread_probe scripts/device/l2_reread_probe.cu || exit 1
fi
rr() {  # rr NAME ARGS...: one run of the re-read probe into $dir/reread_NAME.csv.gz
  local name=$1; shift
  timeout 120 /tmp/l2_reread_probe "$@" > "$dir/reread_$name.csv" || exit 1
  gzip -9 -f "$dir/reread_$name.csv"
}
if [[ $parts == *full* ]]; then  # the second pass over every line, in order and reversed; cold lines
  for mode in full full-reverse; do rr $mode $mode 32 40 48 64; done
  rr cold cold 16
fi
if [[ $parts == *written* ]]; then  # the grid writes W MiB, one SM reads it back (write_read)
  for mode in written written-same; do rr $mode $mode 8 16 24; done
fi
if [[ $parts == *reread* ]]; then
  for run in 1 2; do rr $run 16 24 28 32 40 48 64; done
fi
PARTS=$parts python3 - "$dir/meta.json" <<'PY'
import datetime, json, os, subprocess, sys
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().split(", ")
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
meta = dict(gpu=smi[0], driver=smi[1], max_sm_clock=smi[2], nvcc=nvcc,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            git_commit=os.environ.get("FLASHSIM_GIT_COMMIT", "unknown"),
            git_dirty=os.environ.get("FLASHSIM_GIT_DIRTY", "unknown") not in ("0", "false"),
            parts=os.environ.get("PARTS", "partition reread"),
            runs={"l2pp_1": "2 blocks an SM, set 1 lines 65536 B apart", "l2pp_2": "the same again",
                  "l2pp_s4k": "1 block an SM, set 1 lines 4096 B apart",
                  "l2pp_w": "as l2pp_1, set 1 written (not read) by the first block, after set 0",
                  "reread_1": "one SM re-reads W = 16, 24, 28, 32, 40, 48, 64 MiB", "reread_2": "the same again",
                  "reread_full": "one SM reads W = 32, 40, 48, 64 MiB, then again every line in address order (every 4th timed)",
                  "reread_full-reverse": "the same, the second pass in reverse address order",
                  "reread_cold": "no first pass: W = 16 MiB's timed lines all DRAM reads",
                  "reread_written": "the grid (264 blocks) writes W = 8, 16, 24 MiB, then one SM times every 16th line",
                  "reread_written-same": "the same in one launch: block 0 times the lines once every block has written"},
            programs="scripts/device/l2_partition_probe.cu, l2_reread_probe.cu (nvcc -O2 -arch=sm_90)")
json.dump(meta, open(sys.argv[1], "w"), indent=1)
PY
ls "$dir"/*.bin.gz > /dev/null 2>&1 && PYTHONPATH=$PWD python3 -m analysis.l2_partition "$dir"/*.bin.gz
ls "$dir"/reread_*.csv.gz > /dev/null 2>&1 && PYTHONPATH=$PWD python3 -m analysis.l2_partition --reread "$dir"/reread_*.csv.gz | grep -v "  W .*SM"
