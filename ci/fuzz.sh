#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS seconds each (default 60). Optional in
# CI: needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`); without them it
# prints "skipped: ..." and exits 0. Crashes are left in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "skipped: nightly toolchain not installed"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "skipped: cargo-fuzz not installed (cargo install cargo-fuzz)"
  exit 0
fi
targets=$(cargo +nightly fuzz list --fuzz-dir fuzz)
for t in $targets; do
  echo "== fuzz $t for ${SECONDS_PER_TARGET}s"
  cargo +nightly fuzz run --fuzz-dir fuzz "$t" -- -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048
done
echo "fuzz: all targets ran ${SECONDS_PER_TARGET}s without a crash"
