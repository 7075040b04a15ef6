"""The step-policy bindings (``StepPolicy``, ``Assigner``, ``backup_aggregated``) and
``DropComputeStep``'s refusals of combinations that cannot work (single process, no
collective). The expected assignments are the crate's own unit-test values
(core/src/policy/assign.rs), so the binding forwards to the one rule."""

import math
import pickle
from typing import Any, Dict

import pytest
import torch

import dropcompute
from dropcompute import Assigner, Policy, StepPolicy, backup_aggregated
from dropcompute.torch import DropComputeStep

KINDS = ["synchronous", "drop-before", "drop-predictive", "backup-workers", "compute-budget", "rebalance",
         "rebalance-drop", "length-predictive", "cost-balance"]


@pytest.mark.parametrize("kind", KINDS)
def test_step_policy_pickles_compares_and_prints(kind: str) -> None:
    p = StepPolicy(kind, backup_workers=2, budget_ns=7_000_001, budget_max_micro_batches=5,
                   rebalance_hysteresis=0.1, rebalance_min_micro_batches=2)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and repr(q) == repr(p)
    assert (q.kind, q.backup_workers, q.budget_ns, q.budget_max_micro_batches) == (kind, 2, 7_000_001, 5)
    other: object = "x"
    assert p != StepPolicy(kind) and p != other
    assert f'"{kind}"' in p.to_json()


@pytest.mark.parametrize("kwargs,arg", [
    (dict(kind="drop"), "kind"),
    (dict(kind="rebalance", tail_split=0), "tail_split"),
    (dict(kind="rebalance", tail_split=65), "tail_split"),
    (dict(kind="rebalance", tail_cost=0.5), "tail_cost"),
    (dict(kind="rebalance", tail_split=2, tail_cost=1.5), "tail_cost"),
    (dict(kind="compute-budget", budget_ns=0), "budget_ns"),
    (dict(kind="rebalance", rebalance_hysteresis=-0.1), "rebalance_hysteresis"),
])
def test_step_policy_refuses_bad_parameters(kwargs: Dict[str, Any], arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        StepPolicy(**kwargs)


def test_deadline_is_the_crate_rule() -> None:
    before = Policy(5_000_000, check="before", warmup_steps=2, min_micro_batches=1)
    pred = Policy(5_000_000, check="predictive", warmup_steps=2)
    assert StepPolicy("drop-before").deadline(before) == before
    assert StepPolicy("drop-predictive").deadline(pred) == pred
    assert StepPolicy("rebalance-drop").deadline(pred) == pred
    for kind in ("synchronous", "backup-workers", "rebalance"):
        d = StepPolicy(kind).deadline(before)
        assert d.threshold_ns is None and d.warmup_steps == 2, kind
    assert StepPolicy("compute-budget", budget_ns=9).deadline(pred).threshold_ns == 9
    with pytest.raises(ValueError, match="policy.check"):
        StepPolicy("drop-predictive").deadline(before)
    with pytest.raises(ValueError, match="policy.check"):
        StepPolicy("drop-before").deadline(pred)
    with pytest.raises(ValueError, match="budget_ns"):
        StepPolicy("compute-budget").deadline(before)


def test_assigner_gives_the_crate_assignments() -> None:
    # backup workers (assign.rs: backup_workers_skip_the_rank_predicted_last_after_warm_up)
    a = Assigner(StepPolicy("backup-workers", backup_workers=1), 3, 3, warmup_steps=1)
    assert a.assignment() == [3, 3, 3]
    a.observe(0, [1.0, 5.0, math.nan])
    assert a.assignment() == [3, 3, 3]
    a.observe(1, [1.0, 5.0, 2.0])
    assert a.assignment() == [3, 0, 3]
    # rebalance (rebalancing_moves_work_within_the_slots): 2·M slots
    r = Assigner(StepPolicy("rebalance"), 4, 8, warmup_steps=3)
    r.observe(0, [1.0, 2.0, 1.0, 1.0])
    assert r.assignment() == [9, 5, 9, 9]
    # compute budget: M in warm-up, then the cap 2·M (or budget_max_micro_batches)
    c = Assigner(StepPolicy("compute-budget", budget_ns=1_000_000), 2, 4, warmup_steps=2)
    seen = [c.assignment()]
    for s in range(3):
        c.observe(s, [1.0, 1.0])
        seen.append(c.assignment())
    assert seen == [[4, 4], [4, 4], [8, 8], [8, 8]]
    capped = Assigner(StepPolicy("compute-budget", budget_ns=1, budget_max_micro_batches=6), 2, 4, warmup_steps=0)
    assert capped.assignment() == [6, 6]
    # the state round-trips (a checkpoint)
    back = Assigner.from_state(r.state())
    assert back.assignment() == r.assignment() and back.step_policy == r.step_policy
    back.observe(1, [1.0, 2.0, 1.0, 1.0])
    r.observe(1, [1.0, 2.0, 1.0, 1.0])
    assert back.assignment() == r.assignment()
    with pytest.raises(ValueError, match="per_rank_micro_batch_ns"):
        r.observe(2, [1.0])
    with pytest.raises(ValueError, match="state"):
        Assigner.from_state("{}")
    with pytest.raises(ValueError, match="world_size"):
        Assigner(StepPolicy("rebalance"), 0, 4)


def test_backup_aggregated_is_the_crate_rule() -> None:
    assert backup_aggregated([5.0, 9.0, 1.0, 7.0], 2) == [True, False, True, False]
    assert backup_aggregated([5.0, 5.0, 5.0], 1) == [True, True, False]
    assert backup_aggregated([math.nan, 1.0, 2.0], 1) == [False, True, True]
    assert backup_aggregated([3.0, 1.0, 2.0], 9) == [False, True, False]


def _net() -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


@pytest.mark.parametrize("kwargs,arg", [
    (dict(step_policy=StepPolicy("rebalance", tail_split=2)), "tail_split"),
    (dict(step_policy=StepPolicy("rebalance"), micro_batches_per_step=None), "micro_batches_per_step"),
    (dict(retuner=dropcompute.Retuner(1, 4, period=20, probe_steps=10), step_policy=StepPolicy("rebalance")),
     "retuner"),
    (dict(retuner=dropcompute.Retuner(1, 4, period=20, probe_steps=10), step_policy=StepPolicy("compute-budget",
                                                                                               budget_ns=5)),
     "retuner"),
    (dict(retuner=dropcompute.Retuner(2, 4, period=20, probe_steps=10)), "retuner"),
    # A replayed check other than the step's (the policy's "before", the CPU's sync lag 0).
    (dict(retuner=dropcompute.Retuner(1, 4, period=20, probe_steps=10, check="predictive")), "retuner"),
    (dict(retuner=dropcompute.Retuner(1, 4, period=20, probe_steps=10, check="before", sync_lag=1)), "retuner"),
    # A retuner scoring another floor than the policy's (1 against 1 by default: here 2).
    (dict(retuner=dropcompute.Retuner(1, 4, period=20, probe_steps=10, min_micro_batches=2)), "retuner"),
    (dict(stragglers=dropcompute.StragglerTracker(3)), "stragglers"),
    (dict(step_policy=StepPolicy("compute-budget")), "budget_ns"),
    (dict(step_policy=StepPolicy("drop-predictive")), "policy.check"),
])
def test_drop_compute_step_refuses_combinations_that_cannot_work(kwargs: Dict[str, Any], arg: str) -> None:
    kw: Dict[str, Any] = dict(micro_batches_per_step=4)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=arg):
        DropComputeStep(_net(), Policy(1_000_000, check="before"), **kw)


@pytest.mark.parametrize("kind", ["length-predictive", "cost-balance"])
def test_the_retuner_keeps_a_length_policys_kind_and_buckets(kind: str) -> None:
    """The retuned deadline replaces the threshold only: a length policy's kind and declared
    buckets stay, so the steps after the first keep taking ``buckets=``/``tokens=``."""
    p = Policy(10**9, kind=kind, bucket_lengths=[8, 16], warmup_steps=0)
    step = DropComputeStep(_net(), p, micro_batches_per_step=4, retuner=dropcompute.Retuner(1, 4, period=5,
                                                                                          probe_steps=2))
    mbs = [(torch.randn(3, 2), torch.randn(3, 2)) for _ in range(4)]

    def loss(mod: torch.nn.Module, mb: Any) -> torch.Tensor:
        out: torch.Tensor = ((mod(mb[0]) - mb[1]) ** 2).sum(dim=1)
        return out

    for _ in range(3):
        r = step.run(mbs, loss, buckets=[0, 1, 0, 1], tokens=[8, 16, 8, 16])
        assert r.computed_micro_batches == 4
        w = step._walk_policy
        assert (w.kind, w.bucket_lengths, w.check, w.warmup_steps) == (kind, [8, 16], p.check, 0), w


def test_single_process_step_follows_the_assignment() -> None:
    """N = 1: compute-budget hands 2·M after warm-up; the walk's cap is the assignment."""
    net = torch.nn.Linear(2, 1)
    sp = StepPolicy("compute-budget", budget_ns=10**12)
    step = DropComputeStep(net, Policy(None, warmup_steps=1), micro_batches_per_step=2, step_policy=sp)
    mbs = [(torch.randn(3, 2), torch.randn(3, 1)) for _ in range(4)]

    def loss(mod: torch.nn.Module, mb: Any) -> torch.Tensor:
        out: torch.Tensor = ((mod(mb[0]) - mb[1]) ** 2).sum(dim=1)
        return out

    got = []
    for _ in range(3):
        a = step.assignment()
        r = step.run(mbs[: a[0]], loss)
        got.append((a, r.started, r.threshold_ns, r.assignment))
    assert got == [([2], [2], 10**12, [2]), ([4], [4], 10**12, [4]), ([4], [4], 10**12, [4])]
    state = step.state_dict()
    assert Assigner.from_state(state["assigner"]).assignment() == [4]
    step.load_state_dict(state)
    with pytest.raises(ValueError, match="assigner"):
        DropComputeStep(torch.nn.Linear(2, 1), Policy(None), micro_batches_per_step=2).load_state_dict(state)


def _edited(state: str, **fields: Any) -> str:
    """An assigner checkpoint with fields of its replica replaced (a hand-edited file)."""
    import json

    a = json.loads(state)  # [the replica, the world size]
    if "world_size" in fields:
        a[1] = fields.pop("world_size")
    a[0].update(fields)
    return json.dumps(a)


@pytest.mark.parametrize("make,edit,message", [
    # Checkpoints of another configuration: M, warm-up, world size, policy, tail parts.
    (lambda: DropComputeStep(_net(), Policy(None), micro_batches_per_step=8, step_policy=StepPolicy("drop-before")),
     None, "micro_batches: 8 in the checkpoint, 2 in this step"),
    (lambda: DropComputeStep(_net(), Policy(None, warmup_steps=7), micro_batches_per_step=2,
                             step_policy=StepPolicy("drop-before")), None, "warmup_steps: 7 in the checkpoint, 3"),
    (lambda: DropComputeStep(_net(), Policy(None), micro_batches_per_step=2, step_policy=StepPolicy("synchronous")),
     None, "step policy"),
    (lambda: DropComputeStep(_net(), Policy(None), micro_batches_per_step=2,
                             step_policy=StepPolicy("rebalance")), None, "step policy"),
    # The step's own checkpoint, edited: more parts than the slots, another world size.
    (None, dict(assignment=[9]), "assignment[0]: 9 parts: above the"),
    (None, dict(world_size=2, assignment=[2, 2]), "world_size: 2 in the checkpoint, 1 in this step"),
    (None, dict(assignment=[2, 2]), "the assignment's length is not world_size"),
    (None, dict(micro_batches="x"), "not an Assigner state"),
])
def test_a_checkpoint_of_another_configuration_is_refused_at_load(make: Any, edit: Any, message: str) -> None:
    """``load_state_dict`` refuses an assigner checkpoint that the step's own configuration
    could not have written (it would run the checkpoint's M, or parts beyond the slots),
    naming the field and both values, and keeps the step's state."""
    step = DropComputeStep(_net(), Policy(None), micro_batches_per_step=2, step_policy=StepPolicy("drop-before"))
    before = step.state_dict()
    state = (make() if make is not None else step).state_dict()
    if edit is not None:
        state["assigner"] = _edited(state["assigner"], **edit)
    with pytest.raises(ValueError, match=r"state\['assigner'\]: ") as e:
        step.load_state_dict(state)
    assert message in str(e.value), e.value
    assert step.state_dict() == before


@pytest.mark.parametrize("entry,bad,message", [
    (entry, bad, message)
    for entry in ["step", "observed_micro_batches"]
    for bad, message in [(True, "must be an int in [0, 2**63)"), (-1, "must be an int"), (2**63, "must be an int"),
                         (2**70, "must be an int"), (2.0, "must be an int")]
] + [
    ("observed_micro_batch_count", bad, "must be 0 or a finite number >= 2**-32")
    for bad in [True, -1.0, 1e-320, float("inf"), float("nan"), "2"]
] + [
    ("drop_guard", bad, message)
    for bad, message in [([2**64, 0, 0, 0], "state['drop_guard'][0]: 18446744073709551616: must be an int"),
                         ([0, -1, 0, 0], "state['drop_guard'][1]: -1"), ([0, 0, 0, True], "state['drop_guard'][3]"),
                         ([0, 0, 0], "must be 4 ints"), ("0,0,0,0", "must be 4 ints")]
])
def test_a_malformed_checkpoint_entry_is_refused_by_name_and_restores_nothing(entry: str, bad: Any,
                                                                              message: str) -> None:
    """Every entry of ``state_dict`` with a value outside its range: ValueError naming the entry,
    and nothing restored, though the checkpoint's other entries (a later step, another
    assignment) were valid."""
    def make() -> DropComputeStep:
        return DropComputeStep(_net(), Policy(None, drop_guard=0.1), micro_batches_per_step=2,
                               step_policy=StepPolicy("drop-before"))

    mbs = [(torch.randn(3, 2), torch.randn(3, 2)) for _ in range(2)]

    def loss(mod: torch.nn.Module, mb: Any) -> torch.Tensor:
        out: torch.Tensor = ((mod(mb[0]) - mb[1]) ** 2).sum(dim=1)
        return out

    later = make()
    for _ in range(4):
        later.run(mbs, loss)
    state = later.state_dict()
    step = make()
    before = step.state_dict()
    assert state != before  # the valid entries differ: a partial restore would show
    with pytest.raises(ValueError) as e:
        step.load_state_dict({**state, entry: bad})
    assert f"state['{entry}']" in str(e.value) and message in str(e.value), e.value
    assert step.state_dict() == before
    step.load_state_dict(state)  # the unedited checkpoint loads
    assert step.state_dict() == state
