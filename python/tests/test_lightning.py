"""dropcompute.torch.lightning with the real Lightning Trainer (``strategy="ddp"``, CPU, gloo)
under ``python -m torch.distributed.run``, 2 processes (issue 25, "Integrations")."""

from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

import pytest

import launch  # python/tests/launch.py: the one worker launcher

pytest.importorskip("lightning")


def torchrun(scenario: str, outdir: Path, nproc: int = 2) -> List[Dict[str, Any]]:
    """Runs the Lightning worker's ``scenario`` on ``nproc`` ranks; every rank's output."""
    return launch.torchrun("lightning_worker.py", scenario, outdir, nproc)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    """Both scenarios in one launch (the imports and process start dominate on a loaded CPU)."""
    return torchrun("all", tmp_path_factory.mktemp("lightning"))


def global_means(steps_by_rank: List[List[List[float]]]) -> List[float]:
    return [sum(s[i][0] for s in steps_by_rank) / sum(s[i][1] for s in steps_by_rank)
            for i in range(len(steps_by_rank[0]))]


def test_threshold_off_equals_plain_lightning_accumulation_and_ddp_reducer_never_runs(runs: List[Dict[str, Any]]) -> None:
    """Paired with plain Lightning (automatic optimization, accumulate_grad_batches=M, mean loss)
    over the same dealt micro-batches: the same loss curve, parameters and LR; DDP's reducer
    never ran under DropComputeModule. The control (the step over the LightningModule, not the
    strategy's DDP module) shows the hazard the mixin avoids: ``manual_backward`` armed DDP's
    reducer at every micro-batch (its values still agree here only because averaging is linear
    and every rank ran the same micro-batches; ranks computing different counts would issue
    different numbers of those all-reduces)."""
    res = [run["off"] for run in runs]
    plain = global_means([r["plain_steps"] for r in res])
    dc = global_means([r["dc"]["steps"] for r in res])
    assert len(plain) == len(dc) == 4, (plain, dc)
    assert max(abs(a - b) for a, b in zip(plain, dc)) <= 1e-6, (plain, dc)
    for r in res:
        assert r["dc"]["same_deal"], r
        assert r["dc"]["max_param_diff"] <= 1e-6, r
        assert r["moved"] > 1e-2, r
        assert r["dc"]["lr"] == r["plain_lr"] < 0.2, r
        assert r["dc"]["started"] == [[3, 3]] * 4, r
        assert r["plain_hook_calls"] >= 4, r  # the counting hook sees plain DDP's reducer
        assert r["dc"]["hook_calls"] == 0, r  # DropCompute's step: DDP's reducer never ran
        assert r["unguarded"]["hook_calls"] == 4 * 3, r  # one DDP all-reduce per micro-batch
    # mode="overlap": DDP's bucketed all-reduce once per step (the last micro-batch's backward),
    # through DropCompute's rescaling hook; the same curve and parameters as plain Lightning.
    ov = global_means([r["overlap"]["steps"] for r in res])
    assert max(abs(a - b) for a, b in zip(plain, ov)) <= 1e-6, (plain, ov)
    for r in res:
        o = r["overlap"]
        assert o["same_deal"] and o["started"] == [[3, 3]] * 4 and o["lr"] == r["plain_lr"], o
        assert o["max_param_diff"] <= 1e-6, o
        # one DDP bucket (this MLP is under its 1 MiB cap) in each of 4 steps, through the counting
        # DDP-style hook registered on the module by hand: the rescale composes with it as it is
        assert o["hook_calls"] == 4, o


def test_slowed_rank_drops_with_exact_normalization_and_every_sample_once(runs: List[Dict[str, Any]]) -> None:
    res = [run["slow"] for run in runs]
    for r in res:
        assert r["grad_rel_err"] <= 1e-10, r
        assert r["divisors"] == [float(t) for t in r["totals"]], r
        assert r["started"] == res[0]["started"], r
        assert r["hook_calls"] == 0, r
    started = res[0]["started"]
    assert started[0] == [3, 1], started  # rank 1: one micro-batch (0.3 s) passes the 0.25 s deadline
    dealt = [r["dealt"] for r in res]
    assert all(s[0] == d for s, d in zip(started, dealt[0])), (started, dealt)  # rank 0 never dropped
    assert sum(d - s[1] for s, d in zip(started, dealt[1])) >= len(started) - 1, (started, dealt)
    seen = Counter(i for r in res for mb in r["computed"] for i in mb)
    assert sorted(seen) == list(range(res[0]["samples"])) and set(seen.values()) == {1}, seen
