"""examples/pytorch_ddp.py end to end (2 processes, gloo, two epochs; with 2 ranks a 10 % drop rate buys little, so the
guardrail is 30 %): the paired comparison it
prints is made of what it claims. Its speed numbers are measured in README's table on a quiet
machine, not asserted here (timing goals live in benchmarks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_the_ddp_example_computes_every_sample_once_per_epoch_in_both_runs(tmp_path: Path) -> None:
    out = tmp_path / "example.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "examples" / "pytorch_ddp.py"), "--epochs", "2", "--max-drop-rate", "0.3", "--out", str(out)]
    p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd}:\n{p.stdout}\n{p.stderr}"
    r = json.loads(out.read_text())
    train_rows, epochs = 1437, 2
    for run in ("baseline", "dropcompute"):
        # The dealer re-queues every micro-batch not started: both runs compute each sample once
        # per epoch (the last micro-batch of an epoch may be short).
        assert r[run]["samples"] == train_rows * epochs, (run, r)
    assert r["baseline"]["drop_rate"] == 0.0, r
    assert r["threshold_ns"] is not None and r["threshold_ns"] > 0, r
    # A run that drops needs more steps for the same samples.
    assert r["dropcompute"]["drop_rate"] > 0.0, r
    assert r["dropcompute"]["steps"] > r["baseline"]["steps"], r
    assert 0.0 < r["predicted"]["drop_rate"] <= 0.3, r  # within the guardrail given
    assert "predicted: ratio" in p.stdout, p.stdout
