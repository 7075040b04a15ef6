#!/usr/bin/env bash
# Soak test of checkpoint/resume (issue 7; NOT part of CI): trains for about SOAK_SECONDS
# (default 600) in real time mode while killing the job at random moments (SIGKILL: no
# handler, or SIGTERM: coordinated stop + checkpoint), restarting it with --resume each time,
# then checks that the drop ledger computed every sample exactly EPOCHS times (none lost, none
# twice) and that held-out accuracy is within 1 point of an uninterrupted run.
#
#   bash ci/soak.sh            # 10 minutes
#   SOAK_SECONDS=120 bash ci/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SOAK_SECONDS=${SOAK_SECONDS:-600}
EPOCHS=${EPOCHS:-2500}
cargo build --release --quiet
bin=target/release/dropcompute
work=$(mktemp -d)
common=(train --ranks 8 --micro-batches 8 --micro-batch-size 8 --epochs "$EPOCHS" --no-compare
        --threshold 40 --base-latency-ms 4 --checkpoint-every 5)
args=("${common[@]}" --checkpoint-dir "$work/ck")
start=$(date +%s)
faults=0; restarts=0; sigkills=0; sigterms=0
resume=()
while true; do
  rm -rf "$work/out"
  "$bin" "${args[@]}" ${resume[@]+"${resume[@]}"} --out "$work/out" >"$work/run.log" 2>&1 &
  pid=$!
  now=$(date +%s)
  if (( now - start < SOAK_SECONDS )); then
    sleep "$(( (RANDOM % 20) + 3 ))"
  fi
  if kill -0 "$pid" 2>/dev/null && (( $(date +%s) - start < SOAK_SECONDS )); then
    if (( RANDOM % 2 )); then kill -KILL "$pid"; sigkills=$((sigkills + 1)); else kill -TERM "$pid"; sigterms=$((sigterms + 1)); fi
    faults=$((faults + 1))
    wait "$pid" || true
    resume=(--resume "$work/ck")
    restarts=$((restarts + 1))
    continue
  fi
  if wait "$pid"; then break; fi
  # Died on its own or was killed right at the deadline: resume.
  resume=(--resume "$work/ck"); restarts=$((restarts + 1))
done
"$bin" "${common[@]}" --checkpoint-dir "$work/ck-ref" --out "$work/ref" >"$work/ref.log" 2>&1
python3 - "$work" "$EPOCHS" "$faults" "$restarts" "$sigkills" "$sigterms" <<'PY'
import json, sys, collections
work, epochs, faults, restarts, kills, terms = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])
led = json.load(open(f"{work}/out/ledger_dropcompute.json"))
counts = collections.Counter(i for r in led for i in r["computed"])
samples = len(counts)
bad = {i: c for i, c in counts.items() if c != epochs}
acc = json.load(open(f"{work}/out/report.json"))["dropcompute"]["accuracy"]
ref = json.load(open(f"{work}/ref/report.json"))["dropcompute"]["accuracy"]
steps = json.load(open(f"{work}/out/report.json"))["dropcompute"]["steps"]
print(f"faults injected {faults} ({kills} SIGKILL, {terms} SIGTERM), restarts {restarts}, "
      f"steps in the final segment {steps}, samples checked {samples} x {epochs} epochs")
print(f"ledger: {len(bad)} samples not computed exactly {epochs} times")
print(f"accuracy: soaked {acc*100:.2f} %, uninterrupted {ref*100:.2f} %")
sys.exit(0 if not bad and abs(acc - ref) <= 0.01 else 1)
PY
