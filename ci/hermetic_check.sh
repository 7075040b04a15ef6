#!/usr/bin/env bash
# Hermeticity matrix (issue 17): the test suite must give the same verdict whatever the calling
# shell exports, whether /nonexistent exists, on one CPU, and must leave no temporary
# directories behind.
#
# Runs the suite once per row below (each row: variables exported in the calling shell), once
# with a directory /nonexistent present (needs root or sudo; skipped otherwise; removed after)
# and once under `taskset -c 0`, then counts new /tmp/dropcompute-* and /tmp/dc-* entries.
#
# Usage: ci/hermetic_check.sh [cargo test arguments...]
#   default: --workspace --no-fail-fast; e.g. `ci/hermetic_check.sh --test resume` for one file.
# Run time (measured 2026-11-30, 2 shared cores, already built): 11 suite runs of 16-33 s each,
# about 4.5 minutes in all; add a build (up to ~9 minutes from a cold target/). Set
# CARGO_INCREMENTAL the same way as the build you have, or cargo rebuilds everything. Not wired
# into default CI (this branch adds no CI job): run it before changing tests/support/hermetic.rs,
# a test that starts a process, or code that reads the environment; or nightly. Exit status:
# non-zero if any row failed or new entries were left in /tmp.
# Caveat: /tmp is shared, so a concurrent test run of another checkout shows up as leftovers.
# Every test, unit tests in src/ and the mock's and habana-sys's included, takes its directories
# from the `tempfile` crate (removed on drop).
set -u
cd "$(dirname "$0")/.."

args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--workspace --no-fail-fast)

rows=(
  "DROPCOMPUTE_MOCK_DEVICES=2"
  "DROPCOMPUTE_BACKEND=mock"
  'DROPCOMPUTE_MOCK_CONFIG={"devices":16}'
  "DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS=60000"
  "HLS_MODULE_ID=1"
  "RANK=1 WORLD_SIZE=2"
  "MASTER_ADDR=127.0.0.1 MASTER_PORT=1"
  # The rest of the product's variables, together (valid values, none the default).
  "DROPCOMPUTE_LAUNCHER=slurm SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 DROPCOMPUTE_RENDEZVOUS=127.0.0.1:1 DROPCOMPUTE_JOB_SECRET=00112233445566778899aabbccddeeff HCCL_COMM_ID=127.0.0.1:1 HABANA_VISIBLE_MODULES=1,2 DROPCOMPUTE_MOCK_VERSION=1.21.0 DROPCOMPUTE_MOCK_LOCK_DIR=/tmp DROPCOMPUTE_TEST_SIGKILL_AT=1000000 RUST_LOG=debug"
)

log_dir=$(mktemp -d "${TMPDIR:-/tmp}/hermetic-check-logs.XXXXXX")
leftovers() { ls -d /tmp/dropcompute-* /tmp/dc-* 2>/dev/null | sort; }
leftovers > "$log_dir/before.txt"
status=0
results=()

# Builds first so the rows time only the tests.
cargo test --no-run "${args[@]}" > "$log_dir/build.log" 2>&1 || { echo "build failed: $log_dir/build.log"; exit 1; }

run_row() { # name, command...
  local name=$1; shift
  local log="$log_dir/$(echo "$name" | tr -c 'A-Za-z0-9_' '_' | cut -c1-100).log"
  local t0=$SECONDS
  if "$@" > "$log" 2>&1; then
    results+=("PASS  $name  ($((SECONDS - t0)) s)")
  else
    results+=("FAIL  $name  ($((SECONDS - t0)) s)  $log: $(grep -E '^test .* FAILED$' "$log" | sed 's/^test //; s/ \.\.\. FAILED$//' | sort -u | tr '\n' ' ')")
    status=1
  fi
}

run_row "baseline (clean shell)" cargo test "${args[@]}"
for row in "${rows[@]}"; do
  # shellcheck disable=SC2086 # one row = several NAME=VALUE words (the JSON row has no spaces)
  run_row "$row" env $row cargo test "${args[@]}"
done

if [ -e /nonexistent ]; then
  run_row "/nonexistent present (already)" cargo test "${args[@]}"
elif mkdir -p /nonexistent 2>/dev/null || sudo -n mkdir -p /nonexistent 2>/dev/null; then
  run_row "/nonexistent present" cargo test "${args[@]}"
  rmdir /nonexistent 2>/dev/null || sudo -n rmdir /nonexistent
else
  results+=("SKIP  /nonexistent present (cannot create it)")
fi

if command -v taskset > /dev/null; then
  run_row "taskset -c 0" taskset -c 0 cargo test "${args[@]}"
else
  results+=("SKIP  taskset -c 0 (no taskset)")
fi

leftovers > "$log_dir/after.txt"
new=$(comm -13 "$log_dir/before.txt" "$log_dir/after.txt")
printf '%s\n' "${results[@]}"
if [ -n "$new" ]; then
  echo "LEFTOVER temporary entries ($(echo "$new" | wc -l)):"
  echo "$new"
  status=1
else
  echo "no new /tmp/dropcompute-* or /tmp/dc-* entries"
fi
echo "logs: $log_dir"
exit $status
