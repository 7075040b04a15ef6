#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS seconds each (default 60). Optional in
# CI. With a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`) the targets are
# coverage-guided (sanitizer coverage). Without them the fuzz crate is built on the stable
# toolchain (libfuzzer-sys builds there) and each target runs uninstrumented: libFuzzer then
# mutates random inputs without coverage feedback (it says "Is the code instrumented for
# coverage?"), which still finds panics, aborts and hangs, only less deeply. Crashes are left
# in fuzz/artifacts/<target>/ (nightly) or ./crash-* (stable).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^dropcompute-fuzz$')
if cargo +nightly --version >/dev/null 2>&1 && cargo +nightly fuzz --version >/dev/null 2>&1; then
  for t in $targets; do
    echo "== fuzz $t for ${SECONDS_PER_TARGET}s (coverage-guided)"
    cargo +nightly fuzz run --fuzz-dir fuzz "$t" -- -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048
  done
else
  echo "no nightly cargo-fuzz: building fuzz/ on stable, targets run uninstrumented"
  cargo build --manifest-path fuzz/Cargo.toml --target-dir target
  for t in $targets; do
    corpus=$(mktemp -d)
    echo "== fuzz $t for ${SECONDS_PER_TARGET}s (uninstrumented)"
    "target/debug/$t" "$corpus" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -max_len=4096
    rm -rf "$corpus"
  done
fi
echo "fuzz: all targets ran ${SECONDS_PER_TARGET}s without a crash"
