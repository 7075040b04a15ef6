"""dropcompute.torch.transformers with the real Hugging Face Trainer (transformers, accelerate,
DDP on gloo, CPU, 2 processes under `python -m torch.distributed.run`; issue 25, HF Trainer).
The model: a BertForSequenceClassification built from a 2-layer, 32-hidden config (no download)."""

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import dropcompute

import launch  # python/tests/launch.py: the one worker launcher

SAMPLES, B = 64, 4


def torchrun(scenario: str, outdir: Path, nproc: int = 2, **env_extra: str) -> List[Dict[str, Any]]:
    """Runs the Trainer worker's ``scenario`` on ``nproc`` ranks; every rank's output."""
    return launch.torchrun("hf_worker.py", scenario, outdir, nproc, **env_extra)


@pytest.fixture(scope="module")
def off_and_compose(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    """The threshold-off (both modes), composition, skip and resume scenarios in one launch (one
    start-up of two processes)."""
    return torchrun("off,off-overlap,compose,skip,resume", tmp_path_factory.mktemp("hf"))


@pytest.mark.parametrize("mode", ["flat", "overlap"])
def test_threshold_off_equals_the_plain_trainer_on_the_same_micro_batches(
    mode: str, off_and_compose: List[Dict[str, Any]]
) -> None:
    """The plain Trainer (gradient_accumulation_steps = M = 2, DDP no_sync accumulation, clipping
    at 1.0, AdamW, linear LR schedule) fed exactly the micro-batches the DropCompute sampler dealt
    to each rank, in the same order: the same loss curve and the same final parameters."""
    res = [r["off" if mode == "flat" else "off-overlap"] for r in off_and_compose]
    for r in res:
        assert r["mode"] == mode, r
        assert r["steps"] == 8 and r["global_step"] == [8, 8], r  # 64 samples / (2 ranks x 2 x 4), 2 epochs
        assert r["epoch"] == [2.0, 2.0], r
        assert r["total_batch"] == [16, 16], r  # samples per step: 2 ranks x M 2 x 4
        assert r["dealt_sizes"] == [[B, B]] * 8, r
        assert len(r["dc_loss"]) == len(r["plain_loss"]) == 8, r
        assert max(abs(a - b) for a, b in zip(r["dc_loss"], r["plain_loss"])) <= 1e-6, r
        assert r["dc_loss"][0] != r["dc_loss"][-1], r  # it learned something: the curve is not flat
        assert r["max_param_diff"] <= 1e-6, r
        assert r["moved"] > 1e-3, r
        assert abs(r["lr"][0] - r["lr"][1]) <= 1e-15, r
        # The clipping saw the same gradient norm (logged by the Trainer).
        assert max(abs(a - b) for a, b in zip(*r["grad_norm"])) <= 1e-6, r
        assert r["drop_rate"] == [0.0] * 8 and r["computed"] == [4.0] * 8, r
    # Both ranks logged the same (rank-averaged) loss; the ranks saw different data.
    assert res[0]["dc_loss"] == res[1]["dc_loss"]


def test_slowed_rank_drops_with_exact_counts_and_every_sample_once_per_epoch(tmp_path: Path) -> None:
    res = [r["slow"] for r in torchrun("slow", tmp_path)]
    r0, r1 = res
    steps0, steps1 = r0["steps"], r1["steps"]
    assert len(steps0) == len(steps1) == r0["global_step"] == 6, r0["global_step"]  # 2 steps/epoch x 3
    for s0, s1 in zip(steps0, steps1):
        assert s0["started"] == s1["started"] and s0["counts"] == s1["counts"], (s0, s1)
        started = s0["started"]
        # Each rank started what it says, from the front of what it was dealt.
        for r, s in enumerate((s0, s1)):
            assert len(s["started_ids"]) == started[r], s
            assert s["started_ids"] == s["dealt"][: started[r]], s
        # Exact normalization: the divisor is every rank's computed samples.
        assert s0["counts"] == [B * k for k in started], s0
        assert s0["divisor"] == s1["divisor"] == float(B * sum(started)), s0
        assert s0["loss"] + s1["loss"] > 0
    assert all(s["started"][1] < 4 for s in steps1), steps1  # the slowed rank dropped every step
    assert sum(4 - s["started"][1] for s in steps1) > 0
    # The gradient of every step is the f64 mean over exactly the started micro-batches.
    for r in res:
        assert max(r["grad_rel_err"]) <= 1e-9, r["grad_rel_err"]
    # Logged: the drop rate (every rank, since the last log) and the computed micro-batches.
    for i, s in enumerate(steps0):
        assert r0["computed"][i] == sum(s["started"]), (r0["computed"], s)
        assert abs(r0["drop_rate"][i] - (8 - sum(s["started"])) / 8) <= 1e-12, (r0["drop_rate"], s)
    # No sample lost: what every rank computed plus what the dealer still holds of its current
    # epoch is every sample exactly once per dealer epoch (0..end_epoch).
    seen: Dict[int, int] = {}
    for steps in (steps0, steps1):
        for s in steps:
            for mb in s["started_ids"]:
                for i in mb:
                    seen[i] = seen.get(i, 0) + 1
    for i in r0["drained"]:
        seen[i] = seen.get(i, 0) + 1
    want = r0["end_epoch"] + 1
    assert sorted(seen) == list(range(SAMPLES)), sorted(seen)
    assert set(seen.values()) == {want}, (want, seen)
    assert len(r0["drained"]) > 0  # the drops moved the dealer's epoch boundary later
    assert json.loads(r0["state"])[0] == json.loads(r1["state"])[0]  # the replicas agree
    # Each rank's compute log (config compute_log "log_{rank}.csv"), as dropcompute tune reads it.
    for r, res_r in enumerate(res):
        assert res_r["log"].endswith(f"log_{r}.csv"), res_r["log"]
        t = dropcompute.read_trace(res_r["log"])
        assert t["latencies_ns"].shape == (1, 4, 6), t["latencies_ns"].shape  # rank, M, steps


def test_the_mixin_composes_with_another_trainer_subclass(off_and_compose: List[Dict[str, Any]]) -> None:
    """``class DC(DropComputeTrainerMixin, Subclassed)`` where ``Subclassed(Trainer)`` overrides
    compute_loss, create_optimizer and log (GaudiTrainer's shape): its overrides run, the step is
    DropCompute's."""
    for r in (x["compose"] for x in off_and_compose):
        assert r["mro"] == ["DC", "DropComputeTrainerMixin", "Subclassed", "Trainer"], r
        assert r["optimizer"] == "SGD", r
        assert r["own_loss_calls"] == 8, r  # 32 samples per rank / 4: every micro-batch through its compute_loss
        assert r["steps"] == r["global_step"] == 4, r
        assert r["args_ga"] == 1 and r["m"] == 2 and r["user_args_ga"] == 2, r  # the user's args untouched
        assert r["config_from_args"], r
        assert r["errors"] == {
            "broadcast": "ValueError: args.ddp_broadcast_buffers: True: must be False or None (ranks run different "
                         "numbers of forwards, DDP's buffer broadcast would desynchronize them)",
            "config": "TypeError: dropcompute: dict: must be a DropComputeConfig",
            "resume": "resume_from_checkpoint"}, r
        assert r["subclass_field"] == [1.0] * 4 and r["dc_fields"] == [True] * 4, r
        assert all(g is not None and g > 0 for g in r["grad_norm"]), r


def test_steps_the_optimizer_must_not_take_are_skipped_with_the_scheduler(
    off_and_compose: List[Dict[str, Any]]
) -> None:
    """A non-finite gradient (no GradScaler) at step 1 of 3, and a policy under which no rank
    starts anything (2 steps): the optimizer (AdamW's per-parameter step count) and the LR
    scheduler skip exactly those steps; the Trainer still counts and logs every step. A per-rank
    dealing seed is refused at the first step on every rank (the sampler joins the check)."""
    for rank, r in enumerate(x["skip"] for x in off_and_compose):  # by rank
        nan, none = r["nan"], r["none"]
        assert nan["stepped"] == [True, False, True] and nan["skipped"] == [0.0, 1.0, 0.0], nan
        assert nan["global_step"] == 3 and nan["adam_steps"] == [2] and nan["sched_steps"] == 2, nan
        assert nan["finite"] and nan["unchanged"] > 0, nan  # no NaN reached the parameters
        assert r["none_started"] == [[0, 0], [0, 0]], r
        assert none["stepped"] == [False, False] and none["skipped"] == [1.0, 1.0], none
        assert none["global_step"] == 2 and none["adam_steps"] == [] and none["sched_steps"] == 0, none
        assert none["unchanged"] == 0.0, none
        other = [k for k in range(len(off_and_compose)) if k != rank]
        assert r["seed"] is not None and "the ranks run different step configurations" in r["seed"] and \
            f"rank(s) {other} differ" in r["seed"], r["seed"]


def test_a_resumed_run_equals_the_uninterrupted_one(off_and_compose: List[Dict[str, Any]]) -> None:
    """Checkpoint at step 3 of 8 (drops from step 2 on: 1 of M = 2 started per rank, re-queued),
    resume a fresh trainer from it: the same micro-batches started at steps 4..8, the same loss
    curve, the same final parameters (the sampler's stream, the step's warm-up count, the
    optimizer and the gated scheduler all come back)."""
    for r in (x["resume"] for x in off_and_compose):
        assert r["files"] == ["dropcompute_rank0.json", "dropcompute_rank1.json"], r
        assert r["full_counts"] == [[2, 2]] * 2 + [[1, 1]] * 6, r  # warm-up 2 steps, then 1 of 2
        assert r["again_started"] == r["full_started"][3:], r
        assert r["again_loss"] == r["full_loss"] and len(r["full_loss"]) == 8, r
        assert r["global_step"] == [8, 8] and r["max_param_diff"] == 0.0, r


def test_the_module_imports_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the module needs no transformers; DropComputeTrainer needs it (ImportError)."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # "not installed"
    monkeypatch.delitem(sys.modules, "dropcompute.torch.transformers", raising=False)
    mod = importlib.import_module("dropcompute.torch.transformers")
    assert mod.DropComputeConfig().mode == "auto"
    with pytest.raises(ImportError):
        mod.DropComputeTrainer
    monkeypatch.delitem(sys.modules, "dropcompute.torch.transformers")


@pytest.mark.parametrize("kw,error,message", [
    ({"mode": "x"}, ValueError, "mode: 'x': must be one of 'auto', 'flat', 'overlap'"),
    ({"sync_lag": -1}, ValueError, "sync_lag: -1: must be an int >= 0"),
    ({"sync_lag": True}, TypeError, "sync_lag: True: a bool where an integer belongs"),
    ({"seed": True}, TypeError, "seed: True: a bool where an integer belongs"),
    ({"seed": 2.5}, TypeError, "seed: 2.5: must be an integer"),
    ({"policy": 5}, TypeError, "policy: int: must be a dropcompute.Policy"),
    ({"count_fn": 3}, TypeError, "count_fn: 3: must be callable"),
])
def test_config_refuses_bad_values_naming_them(kw: Dict[str, Any], error: type, message: str) -> None:
    from dropcompute.torch.transformers import DropComputeConfig

    with pytest.raises(error, match=re.escape(message)):
        DropComputeConfig(**kw)


@pytest.mark.parametrize("divisor,value,scaler,want", [
    (None, 1.0, False, False),  # no rank computed anything: never, scaler or not
    (None, 1.0, True, False),
    (8.0, 1.0, False, True),
    (8.0, float("nan"), False, False),  # non-finite, no scaler: skipped here
    (8.0, float("inf"), False, False),
    (8.0, float("nan"), True, True),  # with a scaler, the scaler decides (it skips and backs off)
])
def test_optimizer_may_step_is_what_the_trainer_gates_on(divisor: Any, value: float, scaler: bool, want: bool) -> None:
    import torch

    from dropcompute.torch import StepResult

    res = StepResult(step=0, computed_micro_batches=1, dropped_micro_batches=0, samples=4, counts=[4, 4],
                     started=[1, 1], divisor=divisor, compute_ns=0,
                     _buffers=[torch.tensor([1.0, value]), torch.ones(3, dtype=torch.bfloat16)])
    assert res.optimizer_may_step(object() if scaler else None) is want
