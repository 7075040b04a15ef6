#!/usr/bin/env bash
# Creates (or reuses) the virtual environment the Python tests need and prints its path.
# Location: $DROPCOMPUTE_VENV, default ~/.cache/dropcompute-venv (cached across runs).
# torch: the CPU wheel from download.pytorch.org when reachable, else plain PyPI `torch`;
# accelerate and lightning for the integration tests (test_accelerate.py, test_lightning.py).
# Says what it is doing on stderr, one line per phase (stdout carries only the path).
set -euo pipefail
VENV=${DROPCOMPUTE_VENV:-$HOME/.cache/dropcompute-venv}
say() { echo "python_venv: $*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv at $VENV..."
  python3 -m venv "$VENV" >&2
else
  say "reusing venv at $VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c 'import torch, numpy, pytest, maturin, mypy, transformers, accelerate, lightning' >/dev/null 2>&1; then
  say "upgrading pip..."
  "$PY" -m pip install -q --upgrade pip >&2
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    say "installing torch, CPU wheel (about 2.5 minutes)..."
    "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu >&2 \
      || { say "CPU wheel index unreachable; installing torch from PyPI (several minutes)..."; "$PY" -m pip install -q torch >&2; }
  fi
  say "installing maturin, pytest, numpy, mypy, transformers, accelerate, lightning..."
  "$PY" -m pip install -q 'maturin>=1.5,<2' pytest numpy mypy 'transformers>=5,<6' 'accelerate>=1,<2' 'lightning>=2,<3' >&2
else
  say "torch, numpy, pytest, maturin, mypy, transformers, accelerate and lightning already installed"
fi
echo "$VENV"
