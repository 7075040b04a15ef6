"""Gaudi readiness with a recording stand-in of the bridge (python/tests/standin): the step
marker at micro-batch boundaries in lazy mode only, and no host wait on the micro-batch just
launched with sync lag 1 (issue 25's target: 0 per micro-batch)."""

import importlib
import sys
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import torch

import dropcompute

STANDIN = Path(__file__).resolve().parent / "standin"
M = 6


@pytest.fixture()
def bridge(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in [k for k in sys.modules if k.startswith("habana_frameworks")]:
        monkeypatch.delitem(sys.modules, name)
    core = importlib.import_module("habana_frameworks.torch.core")
    core.LOG.clear()
    return core


def run_steps(core: Any, lazy: bool, sync_lag: int, monkeypatch: pytest.MonkeyPatch) -> List[Tuple[Any, ...]]:
    from dropcompute.torch import DropComputeStep

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1" if lazy else "0")
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    # The parameters stay on the CPU; the clock and the bridge are the hpu device's.
    ctl = DropComputeStep(net, dropcompute.Policy(10**12, warmup_steps=0), device=torch.device("hpu"),
                          sync_lag=sync_lag)
    mbs = [(torch.randn(3, 4), torch.randn(3, 2)) for _ in range(M)]
    for _ in range(3):
        core.LOG.append(("step",))
        res = ctl.run(mbs, lambda mod, mb: torch.nn.functional.mse_loss(mod(mb[0]), mb[1], reduction="sum"))
        assert res.computed_micro_batches == M
        core.LOG.append(("apply",))
        assert res.apply(opt)
    return list(core.LOG)


def blocking_on_the_newest(log: List[Tuple[Any, ...]]) -> int:
    """Synchronizations of the newest recorded event while a later micro-batch of the same step
    is still to be launched (the host waiting for the micro-batch it just launched)."""
    count = 0
    for i, e in enumerate(log):
        if e[0] != "synchronize":
            continue
        recorded = [x[1] for x in log[:i] if x[0] == "record"]
        later = log[i + 1 :]
        launches_follow = any(x[0] == "record" for x in later[: next((j for j, x in enumerate(later) if x[0] == "step"),
                                                                    len(later))])
        if recorded and e[1] == recorded[-1] and launches_follow:
            count += 1
    return count


def test_lazy_mode_marks_every_micro_batch_and_the_optimizer_step(bridge: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = run_steps(bridge, lazy=True, sync_lag=1, monkeypatch=monkeypatch)
    assert sum(1 for e in log if e[0] == "mark_step") == 3 * (M + 1)
    # Each micro-batch's end event is recorded right after its step marker.
    for i, e in enumerate(log):
        if e[0] == "mark_step" and i + 1 < len(log) and log[i + 1][0] != "apply":
            assert log[i + 1][0] in ("record", "step"), log[i : i + 2]


def test_eager_mode_never_marks(bridge: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = run_steps(bridge, lazy=False, sync_lag=1, monkeypatch=monkeypatch)
    assert not any(e[0] == "mark_step" for e in log)


@pytest.mark.parametrize("sync_lag, expected", [(1, 0), (2, 0), (0, 3 * (M - 1))])
def test_host_never_waits_for_the_micro_batch_just_launched_with_a_lag(
    bridge: Any, monkeypatch: pytest.MonkeyPatch, sync_lag: int, expected: int
) -> None:
    log = run_steps(bridge, lazy=True, sync_lag=sync_lag, monkeypatch=monkeypatch)
    # Lag 0 (the counter's control): the check before each launch after the first waits for the
    # previous, newest, micro-batch.
    assert blocking_on_the_newest(log) == expected
    assert sum(1 for e in log if e[0] == "synchronize") >= 3 * M  # every end is read once
