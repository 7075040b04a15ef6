"""dropcompute.torch with real PyTorch on the CPU and gloo, 2 and 4 processes under
`python -m torch.distributed.run` (issue 15, items 3a-3d)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import dropcompute

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def torchrun(scenario: str, nproc: int, outdir: Path) -> List[Dict[str, Any]]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / "ddp_worker.py"), scenario, str(outdir)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout}\n{p.stderr}"
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.parametrize("nproc", [2, 4])
def test_threshold_off_equals_plain_ddp_accumulation(nproc: int, tmp_path: Path) -> None:
    for r in torchrun("off", nproc, tmp_path):
        assert r["max_param_diff"] <= 1e-6, r
        assert r["moved"] > 1e-3, r  # the parameters did change
        assert r["all_reduce_calls"] == [1, 1, 1], r  # ONE collective per step
        assert r["ddp_hook_calls"] == 0, r  # DDP's own all-reduce never ran


@pytest.mark.parametrize("nproc", [2, 4])
def test_slowed_rank_gradient_is_the_mean_over_computed_samples(nproc: int, tmp_path: Path) -> None:
    res = torchrun("slow", nproc, tmp_path)
    counts = res[0]["counts"]
    assert all(r["counts"] == counts for r in res)
    assert res[1]["dropped"] > 0 and res[1]["computed"] >= 1, res[1]
    assert counts[1] == 4 * res[1]["computed"]
    for r in res:
        assert not r["skipped"]
        assert r["divisor"] == float(sum(counts))
        assert r["grad_rel_err"] <= 1e-10, r
        assert r["all_reduce_calls"] == [1] and r["ddp_hook_calls"] == 0


@pytest.mark.parametrize("nproc", [2, 4])
def test_rank_computing_nothing_does_not_hang(nproc: int, tmp_path: Path) -> None:
    res = torchrun("idle", nproc, tmp_path)
    counts = res[0]["counts"]
    assert counts[1] == 0 and res[1]["computed"] == 0 and res[1]["dropped"] == 8
    assert sum(counts) > 0
    for r in res:
        assert not r["skipped"] and r["divisor"] == float(sum(counts))
        assert r["grad_rel_err"] <= 1e-10, r
        assert r["all_reduce_calls"] == [1]


def test_every_rank_computing_nothing_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    res = torchrun("allidle", 2, tmp_path)
    for r in res:
        assert r["counts"] == [0, 0] and r["skipped"] and r["divisor"] is None
        assert r["grad_rel_err"] == 0.0  # gradients zeroed
    assert dropcompute.divisor(np.zeros(2, dtype=np.uint64)) is None


def test_collective_timeout_is_a_python_timeout_error(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HERE / "ddp_worker.py"), "timeout", str(tmp_path)]
    subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    r = json.loads((tmp_path / "rank0.json").read_text())
    assert r["raised"] == "TimeoutError", r
    assert r["message"].startswith("rank 0: step 0: the gradient + count all-reduce timed out"), r
    assert r["waited_s"] < 14.0, r  # the process group's 5 s timeout, not the peer's 15 s sleep


def dropcompute_bin() -> Path:
    p = Path(os.environ.get("DROPCOMPUTE_BIN", REPO / "target" / "debug" / "dropcompute"))
    if not p.exists():
        pytest.fail(f"{p} not built: run `cargo build --bin dropcompute` or set DROPCOMPUTE_BIN")
    return p


def test_controller_compute_log_loads_with_dropcompute_tune(tmp_path: Path) -> None:
    res = torchrun("log", 2, tmp_path)
    logs = [r["log"] for r in res]
    for path in logs:
        t = dropcompute.read_trace(path)
        assert t["latencies_ns"].shape == (1, 4, 12)
        assert (t["latencies_ns"] > 0).all()
    p = subprocess.run([str(dropcompute_bin()), "tune", "--trace", *logs], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "shape: 2 ranks x 4 micro-batches x 12 steps" in p.stdout, p.stdout
