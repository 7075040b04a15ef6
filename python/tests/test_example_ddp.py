"""examples/pytorch_ddp.py end to end (2 processes, gloo, two epochs, a fixed 15 ms threshold:
the tuner's own choice depends on the machine's timing): the paired comparison it prints is
made of what it claims. Its speed numbers are measured in README's table on a quiet
machine, not asserted here (timing goals live in benchmarks)."""

import json
from pathlib import Path

import dropcompute

import launch  # python/tests/launch.py: the one worker launcher

REPO = Path(__file__).resolve().parent.parent.parent


def test_the_ddp_example_computes_every_sample_once_per_epoch_in_both_runs(tmp_path: Path) -> None:
    out = tmp_path / "example.json"
    p = launch.run_workers(REPO / "examples" / "pytorch_ddp.py",
                           ["--epochs", "2", "--threshold-ms", "15", "--log-dir", str(tmp_path / "logs"), "--out", str(out)])
    assert p.returncode == 0, f"{p.args}:\n{p.stdout}\n{p.stderr}"
    r = json.loads(out.read_text())
    train_rows, epochs = 1437, 2
    for run in ("baseline", "dropcompute"):
        # The dealer re-queues every micro-batch not started: both runs compute each sample once
        # per epoch (the last micro-batch of an epoch may be short).
        assert r[run]["samples"] == train_rows * epochs, (run, r)
    assert r["baseline"]["drop_rate"] == 0.0, r
    assert r["threshold_ns"] == 15_000_000, r
    # A run that drops needs more steps for the same samples.
    assert r["dropcompute"]["drop_rate"] > 0.0, r
    assert r["dropcompute"]["steps"] > r["baseline"]["steps"], r
    # Rank 1 of 2 sleeps 20 ms in a quarter of its micro-batches: past a 15 ms deadline it drops
    # the rest of its step, so the replay of its compute logs predicts drops too.
    assert 0.0 < r["predicted"]["drop_rate"] < 0.5, r
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"rank0.csv", "rank1.csv", "dropcompute_rank0.csv",
                                                              "dropcompute_rank1.csv"}
    # The DropCompute run's own logs: its steps and its drops (every rank's rows of a step).
    dc = dropcompute.simulate([str(tmp_path / "logs" / f"dropcompute_rank{r}.csv") for r in range(2)],
                              dropcompute.Policy())
    assert len(dc["baseline_per_step_ns"]) == r["dropcompute"]["steps"], (len(dc["baseline_per_step_ns"]), r)
    assert "predicted: ratio" in p.stdout, p.stdout
