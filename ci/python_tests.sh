#!/usr/bin/env bash
# The Python side (issue 15): a cached virtual environment (ci/python_venv.sh: torch CPU,
# maturin, pytest, numpy, mypy), the package built and installed with `maturin develop` (dev
# profile, reusing the workspace's target/; `pip install ./python` builds the same package in
# release mode for users), the
# `dropcompute` binary (the compute-log test runs `dropcompute tune`), then pytest (real torch,
# gloo, 2 and 4 processes under torch.distributed.run) and mypy --strict on the typed example.
# Local use: bash ci/python_tests.sh   (DROPCOMPUTE_VENV overrides the venv location)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash ci/python_venv.sh)
PY="$VENV/bin/python"
cargo build --locked --bin dropcompute
VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop --locked -q -m python/Cargo.toml
"$PY" -m pytest -q python/tests
"$PY" -m mypy --strict examples/python_api.py
"$PY" examples/pytorch_ddp.py --help >/dev/null
