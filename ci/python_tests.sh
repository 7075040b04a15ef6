#!/usr/bin/env bash
# The Python side (issue 15): a cached virtual environment (ci/python_venv.sh: torch CPU,
# maturin, pytest, numpy, mypy, transformers, accelerate, lightning), the package built and
# installed with `maturin develop` (dev profile, reusing the workspace's target/; `pip install
# ./python` builds the same package in release mode for users), the
# `dropcompute` binary (the compute-log test runs `dropcompute tune`), then pytest (real torch,
# gloo, 2 and 4 processes under torch.distributed.run) and mypy --strict on the typed example
# and the whole package.
# Local use: bash ci/python_tests.sh   (DROPCOMPUTE_VENV overrides the venv location)
# Each phase says what it is doing on stderr, one line, before it starts (the first run spends
# minutes installing torch and building the module with nothing else on screen).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "python_tests: $*" >&2; }
say "preparing the virtual environment (ci/python_venv.sh)..."
VENV=$(bash ci/python_venv.sh)
PY="$VENV/bin/python"
say "building the dropcompute binary (cargo build --bin dropcompute)..."
cargo build --locked --bin dropcompute
say "building the module (maturin develop, dev profile)..."
VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop --locked -q -m python/Cargo.toml
say "running pytest (python/tests)..."
"$PY" -m pytest -q python/tests
say "type-checking examples/python_api.py (mypy --strict)..."
"$PY" -m mypy --strict examples/python_api.py
# The whole package as sources: an imported module found through the venv's editable install
# counts as installed and mypy would not report its errors.
say "type-checking the dropcompute package (mypy --strict python/dropcompute)..."
"$PY" -m mypy --strict python/dropcompute
say "checking examples/pytorch_ddp.py --help..."
"$PY" examples/pytorch_ddp.py --help >/dev/null
say "done"
