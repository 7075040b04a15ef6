"""dropcompute.torch.accelerate with the real Accelerate (``Accelerator(cpu=True)``, DDP over
gloo) under ``python -m torch.distributed.run``, 2 processes (issue 25, "Integrations")."""

from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

import pytest

import launch  # python/tests/launch.py: the one worker launcher

pytest.importorskip("accelerate")


def torchrun(scenario: str, outdir: Path, nproc: int = 2) -> List[Dict[str, Any]]:
    """Runs the Accelerate worker's ``scenario`` on ``nproc`` ranks; every rank's output."""
    return launch.torchrun("accelerate_worker.py", scenario, outdir, nproc)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    """Both scenarios in one launch (the imports and process start dominate on a loaded CPU)."""
    return torchrun("all", tmp_path_factory.mktemp("accelerate"))


@pytest.mark.parametrize("mode", ["flat", "overlap"])
def test_threshold_off_equals_the_plain_accelerate_accumulation_loop(runs: List[Dict[str, Any]], mode: str) -> None:
    """Paired with Accelerate's own accumulation (gradient_accumulation_steps=M, accumulate(),
    mean loss) over the same dealt micro-batches: the same loss curve, parameters and LR, in both
    reduce paths (``AcceleratedDropCompute(..., mode="overlap")``: DDP's bucketed all-reduce
    during the last micro-batch's backward, through the prepared DDP module)."""
    for r in [run["off"] if mode == "flat" else run["off"]["overlap"] for run in runs]:
        assert r["distributed_type"] == "MULTI_CPU" and r["model_type"] == "DistributedDataParallel", r
        assert r["same_deal"], r  # DropCompute ran the micro-batches the plain loop ran, step by step
        assert len(r["dc_losses"]) == len(r["plain_losses"]) == 4, r
        assert max(abs(a - b) for a, b in zip(r["dc_losses"], r["plain_losses"])) <= 1e-6, r
        assert r["max_param_diff"] <= 1e-6, r
        assert r["moved"] > 1e-2, r
        assert r["dc_lr"] == r["plain_lr"] < 0.2, r  # the prepared scheduler stepped alike
        assert r["stepped"] == [True] * 4, r
        # every micro-batch's backward went through accelerator.backward
        assert r["backward_calls"] == r["micro_batches"] == 4 * 3, r
        assert "gradient_accumulation_steps: 2" in r["refusal"], r
        # Overlap ran DDP's own bucketed all-reduce through the hook; flat never ran DDP's reducer.
        assert (r["hook_buckets"] >= 1) if mode == "overlap" else (r["hook_buckets"] == 0), r


def test_slowed_rank_drops_with_exact_normalization_and_every_sample_once(runs: List[Dict[str, Any]]) -> None:
    res = [run["slow"] for run in runs]
    for r in res:
        assert r["grad_rel_err"] <= 1e-10, r  # float64: the started micro-batches / global count
        assert r["divisors"] == [float(t) for t in r["totals"]], r
        assert r["started"] == res[0]["started"], r
    started = res[0]["started"]
    assert started[0] == [3, 1], started  # rank 1: one micro-batch (0.3 s) passes the 0.25 s deadline
    dealt = [r["dealt"] for r in res]
    assert all(s[0] == d for s, d in zip(started, dealt[0])), (started, dealt)  # rank 0 never dropped
    assert sum(d - s[1] for s, d in zip(started, dealt[1])) >= len(started) - 1, (started, dealt)
    seen = Counter(i for r in res for mb in r["computed"] for i in mb)
    assert sorted(seen) == list(range(res[0]["samples"])) and set(seen.values()) == {1}, seen


def test_dropcompute_torch_imports_neither_accelerate_nor_lightning(runs: List[Dict[str, Any]]) -> None:
    """The integrations import their package lazily: ``dropcompute.torch`` and both integration
    modules imported (the worker, before it imports accelerate) loaded neither package."""
    for r in runs:
        assert r["lazy_imports"] == [], r["lazy_imports"]


@pytest.mark.parametrize("grad, stepped", [(1.0, True), (float("inf"), False)])
def test_apply_lets_the_accelerated_optimizer_run_its_scaler(grad: float, stepped: bool) -> None:
    """``StepResult.apply(optimizer_owns_scaler=True)`` with Accelerate's own AcceleratedOptimizer
    and AcceleratedScheduler holding a real GradScaler (what ``AcceleratedDropCompute.apply`` does
    under fp16; Accelerate gives no scaler on the CPU, so they are built directly, in one
    process): a finite gradient is unscaled and stepped once, the scheduler follows; an inf one
    is skipped, the scale backs off, the scheduler does not step."""
    import torch
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

    from dropcompute.torch import StepResult

    Accelerator(cpu=True)  # the process's AcceleratorState
    p = torch.nn.Parameter(torch.zeros(3))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = AcceleratedOptimizer(torch.optim.SGD([p], lr=0.5), device_placement=False, scaler=scaler)
    sched = AcceleratedScheduler(torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=1, gamma=0.1), opt,
                                 step_with_optimizer=True, split_batches=True)
    scaler.scale((p * torch.full((3,), grad)).sum()).backward()  # the gradient, scaled by 1024
    res = StepResult(step=0, computed_micro_batches=1, dropped_micro_batches=0, samples=1, counts=[1], started=[1],
                     divisor=1.0, compute_ns=0, _buffers=[p.grad])  # type: ignore[list-item]
    assert res.apply(opt, scaler=scaler, scheduler=sched, optimizer_owns_scaler=True) is stepped
    assert p.detach().tolist() == ([-0.5] * 3 if stepped else [0.0] * 3)
    assert scaler.get_scale() == (1024.0 if stepped else 512.0)
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 if stepped else 0.5)
    with pytest.raises(ValueError, match="scaler: None"):
        res.apply(opt, optimizer_owns_scaler=True)
