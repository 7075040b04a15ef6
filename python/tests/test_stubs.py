"""The stubs type-check an example under `mypy --strict`, and every stubbed name exists."""

import subprocess
import sys
from pathlib import Path

import dropcompute
import dropcompute._core as core

REPO = Path(__file__).resolve().parent.parent.parent


def test_example_passes_mypy_strict() -> None:
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", str(REPO / "examples" / "python_api.py")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Success" in p.stdout


def test_example_runs() -> None:
    p = subprocess.run([sys.executable, str(REPO / "examples" / "python_api.py")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "replayed: drop rate" in p.stdout


def test_every_stubbed_name_is_exported() -> None:
    stub = (Path(core.__file__).parent / "_core.pyi").read_text()
    for name in dropcompute.__all__:
        assert (f"class {name}" in stub) or (f"def {name}(" in stub) or (f"{name}:" in stub), name
        assert hasattr(core, name), name
