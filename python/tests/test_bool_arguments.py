"""Every numeric parameter of the extension module refuses a bool (``True`` is an ``int`` to
Python, so pyo3 alone took ``recommend(jitter_ns=True)`` as a 1 ns window).

The parameters come from the typed stubs (``dropcompute/_core.pyi``: every parameter annotated
with ``int`` or ``float``, alone, optional or in a list or tuple; NumPy arrays are typed arrays and
refuse a bool array themselves); ``CALLS`` gives each callable a valid call, and the test
checks that the table covers every such parameter, that the valid call succeeds, and that the
same call with the parameter (or one element of it) replaced by ``True`` raises ``TypeError``
naming the parameter."""

import ast
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import dropcompute as dc

STUBS = Path(dc.__file__).parent / "_core.pyi"


def stub_numeric_params() -> List[Tuple[str, str]]:
    """(callable, parameter) for every stub parameter typed int or float (not arrays)."""
    found: List[Tuple[str, str]] = []

    def walk(nodes: List[ast.stmt], prefix: str) -> None:
        for n in nodes:
            if isinstance(n, ast.ClassDef):
                walk(n.body, n.name + ".")
            elif isinstance(n, ast.FunctionDef):
                a = n.args
                for x in a.posonlyargs + a.args + a.kwonlyargs:
                    ann = ast.unparse(x.annotation) if x.annotation is not None else ""
                    if x.arg != "self" and ("int" in ann or "float" in ann) and "NDArray" not in ann \
                            and "Callable" not in ann:
                        found.append((prefix + n.name, x.arg))

    walk(ast.parse(STUBS.read_text()).body, "")
    return found


LAT = np.full((2, 4, 12), 1e6)


def log_path(tmp: Path) -> Path:
    path = tmp / "log.csv"
    with dc.ComputeLogWriter(path) as w:
        for s in range(2):
            for r in range(2):
                w.write(global_step=s, local_step=0, world_size=2, batch=4, computed_batch=4, compute_dropped=False,
                        rank=r, start_ns=0, duration_ns=1000)
    return path


def policy() -> "dc.Policy":
    return dc.Policy(100, warmup_steps=0)


def walk() -> "dc.StepWalk":
    return dc.StepWalk(policy(), step=0, micro_batches=4)


def dealer() -> "dc.Dealer":
    return dc.Dealer(64, 4, rank=0, world_size=2)


def assigner() -> "dc.Assigner":
    return dc.Assigner(dc.StepPolicy("rebalance"), 2, 4)


# callable -> (the callable, made fresh; positional arguments; keyword arguments), where every
# numeric parameter of the stubs is given (positionally by its name's index in POSITIONAL).
CALLS: Dict[str, Callable[[Path], Tuple[Callable[..., Any], Dict[str, Any]]]] = {
    "Policy.__init__": lambda t: (dc.Policy, dict(threshold_ns=100, warmup_steps=1, min_micro_batches=1,
                                                  kind="length-predictive", bucket_lengths=[8, 16], drop_guard=0.1)),
    "Policy.should_start": lambda t: (policy().should_start, dict(elapsed_ns=5, estimate_ns=3, step=1, started=1)),
    "DropGuard.__init__": lambda t: (dc.DropGuard, dict(bound=0.1)),
    "DropGuard.enforces": lambda t: (dc.DropGuard(0.1).enforces, dict(handed=4)),
    "DropGuard.record": lambda t: (dc.DropGuard(0.1).record, dict(handed=4, started=4, enforced=True)),
    "DropGuard.from_counts": lambda t: (dc.DropGuard.from_counts, dict(bound=0.1, counts=(8, 0, 0))),
    "LatencyEstimator.__init__": lambda t: (dc.LatencyEstimator, dict(window=8, quantile=0.5)),
    "LatencyEstimator.observe": lambda t: (dc.LatencyEstimator().observe, dict(latency_ns=10, bucket=0)),
    "LatencyEstimator.estimate": lambda t: (dc.LatencyEstimator().estimate, dict(bucket=0)),
    "StepWalk.__init__": lambda t: (dc.StepWalk, dict(policy=policy(), step=0, micro_batches=4, sync_lag=1)),
    "StepWalk.set_micro_batches": lambda t: (length_walk().set_micro_batches, dict(buckets=[0, 0, 0, 0], tokens=[1, 2, 3, 4])),
    "StepWalk.ended": lambda t: (started_walk().ended, dict(launch=0, end_ns=10, duration_ns=10)),
    "StepWalk.clock_at": lambda t: (walk().clock_at, dict(elapsed_ns=0)),
    "Dealer.__init__": lambda t: (dc.Dealer, dict(samples=64, micro_batch_size=4, rank=0, world_size=2, seed=1, epochs=1)),
    "Dealer.take": lambda t: (dealer().take, dict(assignment=[2, 2])),
    "Dealer.take_by_cost": lambda t: (dealer().take_by_cost, dict(micro_batches=2, bucket_of=lambda ids: 0,
                                                                  estimator=dc.LatencyEstimator(), bucket_lengths=[8])),
    "Dealer.settle": lambda t: (taken_dealer().settle, dict(started=[2, 2])),
    "recommend": lambda t: (dc.recommend, dict(source=LAT, check="before", max_drop_rate=0.1, min_batch_fraction=0.75,
                                               min_gain=0.02, min_micro_batches=1, overhead_ns=0.0, jitter_ns=0.0)),
    "simulate": lambda t: (dc.simulate, dict(source=LAT, policy=policy(), overhead_ns=0.0)),
    "read_trace": lambda t: (dc.read_trace, dict(path=log_path(t), overhead_ns=0.0)),
    "divisor": lambda t: (dc.divisor, dict(counts=np.array([4, 4], dtype=np.uint64), micro_batches=1,
                                           micro_batch_size=4)),
    "deal_by_cost": lambda t: (dc.deal_by_cost, dict(estimator=dc.LatencyEstimator(), buckets=[0, 0], ranks=2, cap=2,
                                                     bucket_lengths=[8])),
    "ComputeLogWriter.write": lambda t: (dc.ComputeLogWriter(t / "w.csv").write, dict(
        global_step=0, local_step=0, world_size=1, batch=4, computed_batch=4, compute_dropped=False, rank=0,
        start_ns=0, duration_ns=10, sentence_length=0, micro_batches=1, clock_start_ns=0, deadline_ns=0)),
    "StragglerTracker.__init__": lambda t: (dc.StragglerTracker, dict(world_size=2, alpha=0.5, chronic_fraction=0.5)),
    "Retuner.__init__": lambda t: (dc.Retuner, dict(world_size=2, micro_batches=4, period=10, probe_steps=2,
                                                    hysteresis=0.01, max_drop_rate=0.1, min_batch_fraction=0.75,
                                                    min_gain=0.02, min_micro_batches=1, check="before",
                                                    sync_lag=1, jitter_ns=1e5)),
    "Retuner.on_step": lambda t: (dc.Retuner(2, 4).on_step, dict(latencies_ns=np.full((2, 4), 1e6), step_time_ns=5e6)),
    "StepPolicy.__init__": lambda t: (dc.StepPolicy, dict(kind="compute-budget", backup_workers=1, budget_ns=10,
                                                          budget_max_micro_batches=4, rebalance_hysteresis=0.05,
                                                          rebalance_min_micro_batches=1, tail_split=1, tail_cost=None)),
    "StepPolicy.slots": lambda t: (dc.StepPolicy("rebalance").slots, dict(micro_batches=4)),
    "Assigner.__init__": lambda t: (dc.Assigner, dict(step_policy=dc.StepPolicy("rebalance"), world_size=2,
                                                      micro_batches=4, warmup_steps=0, first_step=0)),
    "Assigner.observe": lambda t: (assigner().observe, dict(step=0, per_rank_micro_batch_ns=[1.0, 2.0])),
    "backup_aggregated": lambda t: (dc.backup_aggregated, dict(finish_ns=[1.0, 2.0], b=1)),
}

#: Parameters the stubs declare positional-only in practice (pyo3 methods taking them first).
POSITIONAL = {"recommend": ["source"], "simulate": ["source", "policy"], "read_trace": ["path"],
              "divisor": ["counts"], "deal_by_cost": ["estimator", "buckets"],
              "backup_aggregated": ["finish_ns", "b"], "DropGuard.from_counts": ["bound", "counts"],
              "Retuner.on_step": ["latencies_ns", "step_time_ns"], "StepPolicy.__init__": ["kind"],
              "Assigner.__init__": ["step_policy", "world_size", "micro_batches"],
              "Assigner.observe": ["step", "per_rank_micro_batch_ns"], "StepPolicy.slots": ["micro_batches"],
              "Dealer.__init__": ["samples", "micro_batch_size"], "Dealer.take": ["assignment"],
              "Dealer.settle": ["started"], "Dealer.take_by_cost": ["micro_batches", "bucket_of", "estimator"],
              "StepWalk.__init__": ["policy"], "StepWalk.set_micro_batches": ["buckets", "tokens"],
              "StepWalk.ended": ["launch", "end_ns", "duration_ns"], "StepWalk.clock_at": ["elapsed_ns"],
              "LatencyEstimator.observe": ["latency_ns", "bucket"], "LatencyEstimator.estimate": ["bucket"],
              "DropGuard.enforces": ["handed"], "DropGuard.record": ["handed", "started", "enforced"],
              "DropGuard.__init__": ["bound"], "Policy.should_start": ["elapsed_ns", "estimate_ns"],
              "StragglerTracker.__init__": ["world_size"], "Retuner.__init__": ["world_size", "micro_batches"]}


def started_walk() -> "dc.StepWalk":
    """A walk that launched its first micro-batch (the clock told first)."""
    w = walk()
    assert w.next(None) == ("wait", 0)
    w.clock_at(0)
    assert w.next(None) == ("launch", 0)
    return w


def length_walk() -> "dc.StepWalk":
    return dc.StepWalk(dc.Policy(100, kind="length-predictive", bucket_lengths=[8, 16]), step=0, micro_batches=4)


def taken_dealer() -> "dc.Dealer":
    d = dealer()
    d.take([2, 2])
    return d


def call(name: str, tmp: Path, **override: Any) -> Any:
    fn, kwargs = CALLS[name](tmp)
    kwargs.update(override)
    pos = [kwargs.pop(p) for p in POSITIONAL.get(name, []) if p in kwargs]
    return fn(*pos, **kwargs)


def test_the_table_covers_every_numeric_parameter_of_the_stubs(tmp_path: Path) -> None:
    want = stub_numeric_params()
    assert len(want) >= 60, want  # the stubs parsed
    missing = [(c, p) for c, p in want if c not in CALLS or p not in CALLS[c](tmp_path)[1]]
    assert not missing, missing


def bools() -> List[Any]:
    """Every bool that converts to 1 without complaint: Python's, NumPy's scalar, a 0-d torch
    tensor."""
    import torch

    return [True, np.True_, torch.tensor(True)]


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("name,param", stub_numeric_params())
def test_a_bool_is_refused_where_a_number_belongs(name: str, param: str, which: int, tmp_path: Path) -> None:
    call(name, tmp_path)  # the table's call is valid
    value = CALLS[name](tmp_path)[1][param]
    flag = bools()[which]
    if isinstance(value, (list, tuple)):
        bad: Any = type(value)([flag] + list(value)[1:])  # one element a bool
    else:
        bad = flag
    with pytest.raises(TypeError, match=rf"{param}.*bool"):
        call(name, tmp_path, **{param: bad})


def test_numpy_integers_and_floats_are_numbers(tmp_path: Path) -> None:
    """What the bool check must not refuse: NumPy integer and float scalars, as before."""
    d = dc.Dealer(np.int64(64), np.uint32(4), rank=np.int64(0), world_size=np.int64(2))
    assert len(d.take([np.int64(2), 2])) == 2
    assert dc.Policy(np.uint64(100), drop_guard=np.float32(0.25)).drop_guard == 0.25
    assert dc.divisor(np.array([4, 4], dtype=np.uint64), "nominal", np.int32(2), np.int64(4)) == 2 * 2 * 4  # N·M·b


def torch_layer_calls() -> List[Tuple[str, Callable[..., Any], Dict[str, Any], str]]:
    """The torch layer's own numeric arguments (not forwarded to the extension module):
    (what, callable, valid keyword arguments, the parameter to replace)."""
    import torch

    from dropcompute.torch import DropComputeSampler, DropComputeStep

    net = torch.nn.Linear(2, 2)
    step = dict(model=net, policy=dc.Policy(), micro_batch_size=4, micro_batches_per_step=2, sync_lag=1)
    sampler = dict(samples=64, micro_batch_size=4, micro_batches_per_step=2, rank=0, world_size=1)
    return [("DropComputeStep", DropComputeStep, step, p) for p in ("micro_batch_size", "micro_batches_per_step",
                                                                    "sync_lag")] + \
        [("DropComputeSampler", DropComputeSampler, sampler, p) for p in ("micro_batches_per_step",)]


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("index", range(4))
def test_the_torch_layer_refuses_a_bool_where_a_count_belongs(index: int, which: int) -> None:
    what, fn, kwargs, param = torch_layer_calls()[index]
    fn(**kwargs)  # valid
    fn(**{**kwargs, param: np.int64(kwargs[param])})  # a NumPy integer is an integer
    with pytest.raises(TypeError, match=rf"{param}: .*: a bool where an integer belongs"):
        fn(**{**kwargs, param: bools()[which]})
    with pytest.raises(TypeError, match=rf"{param}: 2.5: must be an integer"):
        fn(**{**kwargs, param: 2.5})  # never truncated


def one_rank_step(**kw: Any) -> Any:
    """A flat ``DropComputeStep`` on one process (no process group: world size 1)."""
    import torch

    from dropcompute.torch import DropComputeStep

    torch.manual_seed(0)
    return DropComputeStep(torch.nn.Linear(2, 1), dc.Policy(), **kw), torch


def sum_loss(mod: Any, mb: Any) -> Any:
    return (mod(mb) ** 2).sum(dim=1)


@pytest.mark.parametrize("returned,error,message", [
    (True, TypeError, "count_fn\\(micro_batch\\): True: a bool where an integer belongs"),
    (2.7, TypeError, "count_fn\\(micro_batch\\): 2.7: must be an integer"),
    (-4, ValueError, "count_fn\\(micro_batch\\): -4: must be an int >= 0"),
])
def test_the_counts_a_step_is_given_are_integers(returned: Any, error: type, message: str) -> None:
    """``count_fn``'s return values: never a bool taken as 1, a float truncated or a negative
    count wrapped, each naming the rank, step and micro-batch."""
    step, torch = one_rank_step()
    mbs = [torch.ones(2, 2), torch.ones(2, 2)]
    assert step.run(mbs, sum_loss, count_fn=lambda mb: 2).samples == 4
    with pytest.raises(error, match="rank 0: step 1: micro-batch 0: " + message):
        step.run(mbs, sum_loss, count_fn=lambda mb: returned)


@pytest.mark.parametrize("field", ["tokens", "buckets"])
def test_the_token_and_bucket_lists_are_integers(field: str) -> None:
    """Checked element by element before the walk is told them (a bool would count 1 token)."""
    step, torch = one_rank_step()
    mbs = [torch.ones(2, 2), torch.ones(2, 2)]
    good = {"tokens": [3, 4], "buckets": [0, 0]}
    with pytest.raises(TypeError, match=rf"{field}\[1\]: True: a bool where an integer belongs"):
        step.run(mbs, sum_loss, **{**good, field: [good[field][0], True]})


def test_checkpoints_and_cost_dealing_refuse_bools_and_bad_counts() -> None:
    from dropcompute.torch import DropComputeSampler

    s = DropComputeSampler(64, 4, 2, rank=0, world_size=1)
    state = s.state_dict()
    for bad, error in [(True, TypeError), (2.7, TypeError), (0, ValueError)]:
        with pytest.raises(error, match="micro_batches_per_step"):
            s.load_state_dict({**state, "micro_batches_per_step": bad})
    with pytest.raises(TypeError, match="bool"):  # bucket_of's answer, checked by the crate's face
        s.take_by_cost(lambda ids: True, dc.LatencyEstimator(), bucket_lengths=[8, 16])
    step, _ = one_rank_step()
    st = step.state_dict()
    for key, bad in [("observed_micro_batch_count", float("inf")), ("step", True), ("observed_micro_batches", True)]:
        with pytest.raises(ValueError, match=key):
            step.load_state_dict({**st, key: bad})
