#!/usr/bin/env bash
# Creates (or reuses) the virtual environment the Python tests need and prints its path.
# Location: $DROPCOMPUTE_VENV, default ~/.cache/dropcompute-venv (cached across runs).
# torch: the CPU wheel from download.pytorch.org when reachable, else plain PyPI `torch`.
set -euo pipefail
VENV=${DROPCOMPUTE_VENV:-$HOME/.cache/dropcompute-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" >&2
fi
PY="$VENV/bin/python"
if ! "$PY" -c 'import torch, numpy, pytest, maturin, mypy' >/dev/null 2>&1; then
  "$PY" -m pip install -q --upgrade pip >&2
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu >&2 \
      || "$PY" -m pip install -q torch >&2
  fi
  "$PY" -m pip install -q 'maturin>=1.5,<2' pytest numpy mypy >&2
fi
echo "$VENV"
