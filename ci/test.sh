#!/usr/bin/env bash
# Every test, Rust and Python, as one command: README's test command; .ci/run calls it.
# 1. The Rust workspace (includes the C API's header check and C programs).
# 2. The Python package (ci/python_tests.sh): a cached venv with torch for the CPU, maturin,
#    pytest, numpy and mypy; pytest with real torch under torch.distributed.run (gloo, 2-4
#    processes); mypy --strict on an example.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
bash ci/python_tests.sh
