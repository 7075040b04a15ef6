"""The extension module against values computed here by hand or by a second route."""

import os
from typing import Any, Dict, List
from pathlib import Path

import numpy as np
import pytest

import dropcompute
import dropcompute as dc


def test_policy_wraps_decide_boundaries() -> None:
    p = dc.Policy(100, "before", warmup_steps=1, min_micro_batches=1)
    assert p.should_start(99, step=5, started=3)
    assert not p.should_start(100, step=5, started=3)
    assert p.should_start(10_000, step=0, started=3)  # warm-up
    assert p.should_start(10_000, step=5, started=0)  # minimum micro-batches
    q = dc.Policy(100, "predictive", warmup_steps=0, min_micro_batches=0)
    assert q.should_start(60, 40, step=5, started=3)
    assert not q.should_start(60, 41, step=5, started=3)
    assert q.should_start(60, None, step=5, started=3)
    assert dc.Policy().should_start(2**63, step=99, started=99)  # off
    with pytest.raises(ValueError, match="check"):
        dc.Policy(1, "after")  # type: ignore[arg-type]


def _drive(walk: "dc.StepWalk", lat: "list[int]", est: "dc.LatencyEstimator | None") -> "list[int]":
    """Runs micro-batches of latencies ``lat`` as ``walk`` says; returns the indices launched."""
    launched: "list[int]" = []
    ends: "list[int]" = []
    while True:
        kind, v = walk.next(est)
        if kind == "done":
            return launched
        if kind == "wait":
            for i in range(walk.reported(), v):
                assert walk.ended(i, ends[i], lat[launched[i]], est)
        else:
            launched.append(v)
            ends.append((ends[-1] if ends else 0) + lat[v])


def test_step_walk_is_the_schedulers_walk() -> None:
    # Before-check at 25 ns, latencies 10: ends 10, 20, 30; the check before the 4th sees 30.
    p = dc.Policy(25, "before", warmup_steps=1, min_micro_batches=1)
    w = dc.StepWalk(p, step=5, micro_batches=4)
    assert _drive(w, [10, 10, 10, 10], None) == [0, 1, 2]
    assert w.next() == ("done", 1) and w.started() == 3
    # Warm-up: every micro-batch starts, the assignment runs out.
    w = dc.StepWalk(p, step=0, micro_batches=4)
    assert _drive(w, [10, 10, 10, 10], None) == [0, 1, 2, 3]
    assert w.next() == ("done", 0)
    # Sync lag 1: the check before micro-batch i sees the end of i-2: 4 start (ends 10..40;
    # before the 5th it sees 30 >= 25).
    w = dc.StepWalk(p, step=5, micro_batches=6, sync_lag=1)
    assert _drive(w, [10] * 6, None) == [0, 1, 2, 3]
    # Predictive at 35 with an estimate of 10 after one observation: 3 start (30 + 10 > 35).
    q = dc.Policy(35, "predictive", warmup_steps=0, min_micro_batches=1)
    e = dc.LatencyEstimator(32, 0.9)
    w = dc.StepWalk(q, step=5, micro_batches=4)
    assert _drive(w, [10, 10, 10, 10], e) == [0, 1, 2]
    assert len(e) == 3, "the walker fed the estimator every reported micro-batch"
    # Time before the first micro-batch counts: 30 ns already elapsed stops it (no minimum).
    z = dc.Policy(25, "before", warmup_steps=0, min_micro_batches=0)
    w = dc.StepWalk(z, step=5, micro_batches=4)
    assert w.next() == ("wait", 0)
    w.clock_at(30)
    assert w.next() == ("done", 1) and w.started() == 0
    # Reports out of order are refused.
    w = dc.StepWalk(p, step=5, micro_batches=2)
    assert w.next() == ("wait", 0)
    assert w.next() == ("launch", 0)
    assert not w.ended(1, 10, 10)
    assert w.next() == ("wait", 1)


def test_estimator_nearest_rank_quantile() -> None:
    e = dc.LatencyEstimator(10, 0.9)
    assert e.estimate() is None
    for v in range(1, 11):
        e.observe(v * 10)
    assert e.estimate() == 90 and len(e) == 10
    with pytest.raises(ValueError, match="quantile"):
        dc.LatencyEstimator(4, 1.5)


def test_divisor_both_normalizations_and_skip() -> None:
    c = np.array([12, 0, 5], dtype=np.uint64)
    assert dc.divisor(c) == 17.0
    assert dc.divisor(c, "nominal", micro_batches=4, micro_batch_size=3) == 36.0
    assert dc.divisor(np.zeros(3, dtype=np.uint64)) is None
    with pytest.raises(ValueError, match="normalization"):
        dc.divisor(c, "mean")  # type: ignore[arg-type]


def _straggler_trace() -> "np.ndarray":
    """(N=2, M=4, steps=12) of 1 ms, rank 1's last micro-batch 6 ms on even steps."""
    lat = np.full((2, 4, 12), 1e6)
    lat[1, 3, ::2] = 6e6
    return lat


def test_compute_log_round_trip_and_recommend_agree(tmp_path: Path) -> None:
    lat = _straggler_trace()
    path = tmp_path / "compute_log.csv"
    with dc.ComputeLogWriter(path) as w:
        for s in range(12):
            for r in range(2):
                start = 0
                for m in range(4):
                    d = int(lat[r, m, s])
                    w.write(global_step=s, local_step=m, world_size=2, batch=8, computed_batch=8 * (m + 1),
                            compute_dropped=False, rank=r, start_ns=start, duration_ns=d)
                    start += d
    t = dc.read_trace(path)
    assert t["latencies_ns"].shape == (2, 4, 12)
    np.testing.assert_array_equal(t["latencies_ns"], lat)
    assert list(t["ranks"]) == [0, 1] and list(t["steps"]) == list(range(12))
    from_file = dc.recommend(path)
    from_array = dc.recommend(lat)
    assert from_file.enabled and from_array.enabled
    assert from_file.threshold_ns == from_array.threshold_ns
    assert from_file.predicted_speedup == from_array.predicted_speedup
    # Oracle at 4 ms: on even steps the straggler's 4th micro-batch (completing at 9 ms) goes:
    # 1 of 8 cells in half of the steps (drop rate 1/16); even steps 9 ms -> 4 ms, so the
    # effective speedup is the mean of (7/8)/(4/9) - 1 and 0 = 0.484375.
    assert from_file.threshold_ns == 4e6
    assert from_file.predicted_drop_rate == pytest.approx(1 / 16, abs=1e-12)
    assert from_file.predicted_speedup == pytest.approx(0.484375, abs=1e-12)
    strict = dc.recommend(path, max_drop_rate=0.0)
    assert not strict.enabled and strict.refusal == "max_drop_rate" and strict.reason
    # Checked before each micro-batch, 3 ms stops every rank's 4th micro-batch (elapsed 3 ms is
    # not below 3 ms): drop rate 1/4, every step 3 ms; recorded 9 ms (even) and 4 ms (odd).
    sim = dc.simulate(lat, dc.Policy(3_000_000, warmup_steps=0, min_micro_batches=1))
    assert sim["drop_rate"] == 0.25
    np.testing.assert_array_equal(sim["policy_per_step_ns"], np.full(12, 3e6))
    np.testing.assert_array_equal(sim["baseline_per_step_ns"][:2], [9e6, 4e6])


def test_errors_are_python_exceptions(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="nope.csv"):
        dc.recommend(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match="min_gain"):
        dc.recommend(_straggler_trace(), min_gain=-1.0)
    with pytest.raises(ValueError, match="insufficient data"):
        dc.recommend(_straggler_trace()[:, :, :3])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unrecognised header"):
        dc.read_trace(bad)
    with pytest.raises(OSError):
        dc.ComputeLogWriter(tmp_path / "no" / "dir.csv")


def test_straggler_tracker_and_retuner() -> None:
    t = dc.StragglerTracker(3, alpha=1.0, chronic_fraction=0.5)
    for _ in range(dc.MIN_STEPS):
        t.observe(np.array([0, 2, 0], dtype=np.uint32), np.array([100, 300, 100], dtype=np.uint64))
    assert t.steps == dc.MIN_STEPS and t.hits == [0, dc.MIN_STEPS, 0]
    assert t.chronic() == [1] and t.labels()[1] == "chronic"
    with pytest.raises(ValueError, match="dropped"):
        t.observe(np.zeros(2, dtype=np.uint32), np.zeros(3, dtype=np.uint64))
    rt = dc.Retuner(2, 4, period=20, probe_steps=12)
    lat = _straggler_trace()
    assert rt.threshold_ns is None
    ev = None
    for s in range(12):
        ev = rt.on_step(np.ascontiguousarray(lat[:, :, s]), float(lat[:, :, s].sum(axis=1).max()))
    assert ev is not None and ev["event"] == "tuned"
    assert rt.threshold_ns == 4_000_000


@pytest.mark.parametrize("check,jitter_ns", [("oracle", 0.0), ("before", 0.0), ("predictive", 0.0),
                                             ("before", 1e6), ("predictive", 1e6)])
def test_the_retuner_tunes_as_recommend_on_its_probe_window(check: str, jitter_ns: float) -> None:
    """The retuner's probe window scored under ``check`` (with the jitter window) chooses what
    ``recommend`` chooses on the same window: one tuner, whatever face asks."""
    lat = _straggler_trace()
    lat[0, 2, 1::3] = 3e6  # a second, smaller tail on rank 0: the checks and the window differ
    kw = dict(max_drop_rate=0.25, min_batch_fraction=0.75, min_gain=0.0)
    rt = dc.Retuner(2, 4, period=20, probe_steps=12, check=check, jitter_ns=jitter_ns, **kw)
    assert (rt.check, rt.sync_lag) == (check, 0)
    for s in range(12):
        rt.on_step(np.ascontiguousarray(lat[:, :, s]), float(lat[:, :, s].sum(axis=1).max()))
    v = dc.recommend(lat, check=check, jitter_ns=jitter_ns, **kw)
    assert rt.threshold_ns == (v.threshold_ns if v.enabled else None), (rt.threshold_ns, v)
    assert v.enabled or (check, jitter_ns) == ("predictive", 1e6), v  # the window's one refusal


def test_policy_pickles_and_compares() -> None:
    import pickle

    p = dropcompute.Policy(25_000_000, "predictive", warmup_steps=2, min_micro_batches=3)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and repr(q) == repr(p)
    assert q != dropcompute.Policy(25_000_001, "predictive", warmup_steps=2, min_micro_batches=3)


def test_dealer_deals_every_sample_once_per_epoch_with_drops() -> None:
    n, m, b, samples = 3, 2, 4, 40
    dealers = [dropcompute.Dealer(samples, b, rank=r, world_size=n, seed=5, epochs=1) for r in range(n)]
    seen: List[int] = []
    steps = 0
    while True:
        taken = [d.take([m] * n) for d in dealers]
        if dealers[0].ended:
            assert all(not t for t in taken) and all(d.ended for d in dealers)
            break
        assert dealers[0].dealt_total == sum(len(t) for t in taken) > 0
        started = [len(t) // (2 if r == 1 else 1) for r, t in enumerate(taken)]  # rank 1 drops half
        for r, t in enumerate(taken):
            for ids in t[: started[r]]:
                seen.extend(ids)
        for d in dealers:
            d.settle(started)
        steps += 1
    assert sorted(seen) == list(range(samples)), seen
    assert steps > samples // (n * m * b)  # the drops cost steps, no samples
    state = dealers[2].state()
    assert dropcompute.Dealer.from_state(state).state() == state


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(samples=0, micro_batch_size=1, rank=0, world_size=1), "samples"),
        (dict(samples=2**28 + 1, micro_batch_size=1, rank=0, world_size=1), "samples"),
        (dict(samples=4, micro_batch_size=0, rank=0, world_size=1), "micro_batch_size"),
        (dict(samples=4, micro_batch_size=5, rank=0, world_size=1), "micro_batch_size"),
        (dict(samples=4, micro_batch_size=1, rank=2, world_size=2), "rank"),
        (dict(samples=4, micro_batch_size=1, rank=0, world_size=0), "world_size"),
        (dict(samples=4, micro_batch_size=1, rank=0, world_size=2**21), "world_size"),
        (dict(samples=4, micro_batch_size=1, rank=0, world_size=1, epochs=0), "epochs"),
    ],
)
def test_dealer_refuses_bad_arguments_naming_them(kwargs: Dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        dropcompute.Dealer(**kwargs)


def test_dealer_refuses_misuse() -> None:
    d = dropcompute.Dealer(8, 2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="assignment"):
        d.take([1])
    with pytest.raises(RuntimeError, match="no step was taken"):
        d.settle([0, 0])
    d.take([1, 1])
    with pytest.raises(RuntimeError, match="not settled"):
        d.take([1, 1])
    with pytest.raises(ValueError, match="started"):
        d.settle([2, 0])  # rank 0 was dealt 1
    with pytest.raises(ValueError, match="not a Dealer state"):
        dropcompute.Dealer.from_state("{")


def test_the_drop_guard_is_the_crates_rule_in_policy_simulate_and_recommend() -> None:
    # The Policy validates the bound by the crate's one check, and pickles with it.
    import pickle

    p = dc.Policy(15, "before", warmup_steps=0, drop_guard=0.25)
    assert p.drop_guard == 0.25 and pickle.loads(pickle.dumps(p)) == p and p != dc.Policy(15, "before", warmup_steps=0)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="drop_guard"):
            dc.Policy(drop_guard=bad)
    # 2 ranks x M = 4 x 6 steps, latencies 10 ns, step 3's rank 0 (5, 5, 5, 10); threshold 15 ns
    # checked before: an enforced step drops 4 of 8 (3 in step 3). By `dropped + reserve <= 0.25 *
    # (handed + 8)`: steps 0, 3, 5 enforced; 11 of 48 dropped (the crate's replay test, by hand).
    lat = np.full((2, 4, 6), 10.0)
    lat[0, :, 3] = [5, 5, 5, 10]
    sim = dc.simulate(lat, p)
    assert sim["enforced_per_step"] == [True, False, False, True, False, True]
    assert list(sim["started_per_step"]) == [4, 8, 8, 5, 8, 4]
    assert sim["drop_rate"] == pytest.approx(11 / 48, abs=1e-12)
    g = dc.DropGuard(0.25)
    for started, enforced in zip(sim["started_per_step"], sim["enforced_per_step"]):
        assert g.enforces(8) == enforced
        g.record(8, int(started), enforced)
    assert g.counts == (48, 11, 4) and dc.DropGuard.from_counts(0.25, g.counts).counts == g.counts
    # Counts no run records (reserve <= dropped <= handed) are refused, naming them.
    for bad in [(1, 2, 0), (48, 11, 12), (0, 0, 1)]:
        with pytest.raises(ValueError, match=f"handed {bad[0]}, dropped {bad[1]}, reserve {bad[2]}"):
            dc.DropGuard.from_counts(0.25, bad)
    # recommend(drop_guard=True) scores every candidate with the guard at max_drop_rate: its
    # verdict is the guarded replay of its threshold, within the bound.
    trace = _straggler_trace()
    v = dc.recommend(trace, check="before", max_drop_rate=0.05, drop_guard=True)
    assert v.enabled, v
    guarded = dc.simulate(trace, dc.Policy(v.threshold_ns, "before", warmup_steps=0, drop_guard=0.05))
    assert v.predicted_drop_rate == pytest.approx(guarded["drop_rate"], abs=1e-12) and v.predicted_drop_rate <= 0.05
    assert v.predicted_speedup == pytest.approx(guarded["effective_speedup"], abs=1e-12)
    with pytest.raises(ValueError, match="drop_guard"):
        dc.recommend(trace, drop_guard=True)  # the oracle is not replayed


def test_recommend_judges_each_threshold_by_its_jitter_window() -> None:
    # 1 ms micro-batches, rank 1's last 6 ms on even steps, checked before: a threshold in
    # [2, 3] ms (2 excluded) starts 3 of 4 on every rank (drop 1/4, the point verdict at max 0.3); above 3 ms
    # nothing is dropped (no gain), at or below 2 ms half is (above 0.3). With a 0.5 ms jitter
    # every window holds one of those: declined (the crate's rule, Guardrails::jitter_ns).
    trace = _straggler_trace()
    point = dc.recommend(trace, check="before", max_drop_rate=0.3)
    assert point.enabled and 2e6 < point.threshold_ns <= 3e6 and point.predicted_drop_rate == 0.25, point
    above = dc.simulate(trace, dc.Policy(int(point.threshold_ns + 5e5), "before", warmup_steps=0))
    assert above["drop_rate"] == 0.0 and above["effective_speedup"] < 0.02
    robust = dc.recommend(trace, check="before", max_drop_rate=0.3, jitter_ns=5e5)
    assert not robust.enabled, robust
    # A jitter shorter than the plateau: the point verdict is the plateau's top, a micro-batch's
    # end, which any jitter crosses; the verdict is that end less the jitter, the same replay.
    short = dc.recommend(trace, check="before", max_drop_rate=0.3, jitter_ns=1e3)
    assert short.threshold_ns == point.threshold_ns - 1000, short
    assert (short.predicted_drop_rate, short.predicted_speedup) == (point.predicted_drop_rate, point.predicted_speedup)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="jitter_ns"):
            dc.recommend(trace, check="before", jitter_ns=bad)
    with pytest.raises(ValueError, match="jitter_ns.*oracle"):
        dc.recommend(trace, jitter_ns=1e6)  # the oracle is not replayed
