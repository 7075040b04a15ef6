"""Length buckets and tokens through the Python face (issue 26 on the faces): the walk told each
micro-batch's bucket and tokens, the per-bucket estimator, the tokens divisor and the
cost-balanced deal, each against a Python f64 reference written here (the deadline rule of
``../shared/reference/dropcompute.md`` §2 with the bucket's nearest-rank quantile)."""

import math
import pickle
import random
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import dropcompute as dc

LENS = [64, 128, 512]


class RefEstimator:
    """Reference per-bucket estimator: nearest-rank quantile ceil(q n) - 1 of the last
    ``window`` latencies of the bucket, else of every bucket (the blind window)."""

    def __init__(self, window: int, q: float) -> None:
        self.window, self.q = window, q
        self.blind: List[int] = []
        self.buckets: Dict[int, List[int]] = {}

    def _quantile(self, xs: List[int]) -> Optional[int]:
        if not xs:
            return None
        s = sorted(xs)
        return s[min(max(math.ceil(self.q * len(s)), 1), len(s)) - 1]

    def observe(self, lat: int, bucket: Optional[int]) -> None:
        self.blind = (self.blind + [lat])[-self.window:]
        if bucket is not None:
            self.buckets[bucket] = (self.buckets.get(bucket, []) + [lat])[-self.window:]

    def estimate(self, bucket: Optional[int]) -> Optional[int]:
        own = self._quantile(self.buckets.get(bucket, [])) if bucket is not None else None
        return own if own is not None else self._quantile(self.blind)


def ref_step(threshold: float, buckets: List[int], lat: List[int], est: RefEstimator,
             min_micro_batches: int = 1) -> List[int]:
    """The predictive deadline, sync lag 0: micro-batch k starts iff k < min_micro_batches or
    elapsed + estimate(bucket_k) <= threshold (no estimate: elapsed < threshold); the step ends
    at the first refusal. Returns the micro-batches started (and feeds ``est``)."""
    elapsed = 0.0
    started: List[int] = []
    for k, b in enumerate(buckets):
        e = est.estimate(b)
        ok = k < min_micro_batches or (elapsed + e <= threshold if e is not None else elapsed < threshold)
        if not ok:
            break
        started.append(k)
        elapsed += lat[k]
        est.observe(lat[k], b)
    return started


def drive(walk: dc.StepWalk, lat: List[int], est: dc.LatencyEstimator) -> List[int]:
    launched: List[int] = []
    ends: List[int] = []
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


def script(seed: int, steps: int, m: int) -> List[Tuple[List[int], List[int], List[int]]]:
    g = random.Random(seed)
    out = []
    for _ in range(steps):
        b = [g.randrange(len(LENS)) for _ in range(m)]
        t = [LENS[k] * 4 - g.randrange(30) for k in b]
        lat = [LENS[k] // 4 + g.randrange(7) for k in b]
        out.append((b, t, lat))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_length_predictive_walk_equals_the_reference_deadline_with_bucket_estimates(seed: int) -> None:
    threshold = 400
    p = dc.Policy(threshold, warmup_steps=0, min_micro_batches=1, kind="length-predictive", bucket_lengths=LENS)
    assert p.check == "predictive"
    est, ref = dc.LatencyEstimator(32, 0.9), RefEstimator(32, 0.9)
    stops = 0
    for step, (b, t, lat) in enumerate(script(seed, 12, 8)):
        w = dc.StepWalk(p, step=step, micro_batches=8)
        w.set_micro_batches(b, t)
        got = drive(w, lat, est)
        want = ref_step(threshold, b, lat, ref)
        assert got == want, (step, b, lat)
        assert w.tokens_started() == sum(t[k] for k in want)
        stops += len(want) < 8
    for k in range(len(LENS)):
        assert est.estimate(k) == ref.estimate(k)
    assert stops > 0, "the script exercises the deadline"


def test_buckets_change_the_decision_a_blind_walk_makes() -> None:
    """A long bucket measured at 128 ns and a short one at 16 ns: at elapsed 48 of 100 a short
    micro-batch starts by its own estimate; the blind estimate (q 1: 128) stops it."""
    p = dc.Policy(100, warmup_steps=0, kind="length-predictive", bucket_lengths=LENS)
    est = dc.LatencyEstimator(8, 1.0)
    est.observe(16, bucket=0)
    est.observe(128, bucket=2)
    assert (est.estimate(0), est.estimate(2), est.estimate(1), est.estimate()) == (16, 128, 128, 128)
    assert len(est) == 2
    lat = [16, 16, 16, 16, 128]
    w = dc.StepWalk(p, step=0, micro_batches=5)
    w.set_micro_batches([0, 0, 0, 0, 2], [256, 256, 256, 256, 2048])
    blind = dc.StepWalk(p, step=0, micro_batches=5)
    est2 = dc.LatencyEstimator(8, 1.0)
    est2.observe(16, bucket=0)
    est2.observe(128, bucket=2)
    # Buckets: 0, 16, 32, 48 + 16 <= 100 start; 64 + 128 > 100 stops the long one.
    assert drive(w, lat, est) == [0, 1, 2, 3]
    assert w.tokens_started() == 1024
    # Blind: 0 + 128 > 100 stops after the minimum one.
    assert drive(blind, lat, est2) == [0]
    assert blind.tokens_started() == 0


def test_bad_micro_batches_are_refused_naming_index_and_value() -> None:
    p = dc.Policy(100, kind="cost-balance", bucket_lengths=LENS)
    w = dc.StepWalk(p, step=0, micro_batches=3)
    with pytest.raises(ValueError, match=r"buckets \[2\] 3: must be a bucket index below 3"):
        w.set_micro_batches([0, 1, 3], [1, 2, 3])
    with pytest.raises(ValueError, match="tokens of length 2: must hold one value per micro-batch"):
        w.set_micro_batches(None, [1, 2])
    with pytest.raises(ValueError, match="buckets of length 2: must be as long as tokens"):
        w.set_micro_batches([0, 1], [1, 2, 3])
    with pytest.raises(ValueError, match=r"bucket_lengths \[1\] 64: must be above"):
        dc.Policy(100, kind="length-predictive", bucket_lengths=[64, 64])
    with pytest.raises(ValueError, match="kind"):
        dc.Policy(100, kind="rebalance")
    with pytest.raises(ValueError, match="check"):
        dc.Policy(100, "predictive", kind="drop-before")
    with pytest.raises(ValueError, match="bucket_lengths"):
        dc.Policy(100, bucket_lengths=[64])
    # Without declared lengths only tokens can be told.
    q = dc.StepWalk(dc.Policy(100, "predictive"), step=0, micro_batches=2)
    with pytest.raises(ValueError, match="no bucket lengths were declared"):
        q.set_micro_batches([0, 0], [1, 1])
    q.set_micro_batches(None, [5, 7])


def test_policy_kind_pickles_and_compares() -> None:
    p = dc.Policy(100, warmup_steps=2, kind="cost-balance", bucket_lengths=LENS)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p)
    assert (q.kind, q.bucket_lengths, q.check) == ("cost-balance", LENS, "predictive")
    assert p != dc.Policy(100, warmup_steps=2, kind="cost-balance", bucket_lengths=[64, 128])
    assert p != dc.Policy(100, "predictive", warmup_steps=2)
    assert "bucket_lengths=[64, 128, 512]" in repr(p)
    old = dc.Policy(100, "before")
    assert old.kind is None and old.bucket_lengths == [] and pickle.loads(pickle.dumps(old)) == old


def test_tokens_divisor_is_the_exact_global_token_count() -> None:
    counts = np.asarray([2**40 + 1, 3, 0], dtype=np.uint64)
    assert dc.divisor(counts, weighting="tokens") == float(2**40 + 4)
    assert dc.divisor(counts, "nominal", 4, 2, weighting="tokens") == 24.0
    assert dc.divisor(np.zeros(2, dtype=np.uint64), weighting="tokens") is None
    with pytest.raises(ValueError, match="weighting"):
        dc.divisor(counts, weighting="bytes")  # type: ignore[arg-type]


def test_deal_by_cost_deals_every_micro_batch_once_within_graham_bound() -> None:
    g = random.Random(7)
    est = dc.LatencyEstimator(16, 0.5)
    for _ in range(20):
        k = g.randrange(3)
        est.observe(LENS[k] // 4 + g.randrange(5), bucket=k)
    for ranks in (2, 3, 4):
        buckets = [g.randrange(3) for _ in range(ranks * 5)]
        d = dc.deal_by_cost(est, buckets, ranks=ranks, cap=10, bucket_lengths=LENS)
        assert sorted(i for r in d for i in r) == list(range(len(buckets)))
        assert all(r == sorted(r) and len(r) <= 10 for r in d)
        cost = [float(est.estimate(b) or 0) for b in buckets]
        loads = [sum(cost[i] for i in r) for r in d]
        assert max(loads) <= sum(cost) / ranks + max(cost) + 1e-9
    # Before any measurement the declared lengths price the buckets: the two long ones apart.
    d = dc.deal_by_cost(dc.LatencyEstimator(), [2, 2, 0, 0, 0, 0], ranks=2, cap=6, bucket_lengths=LENS)
    assert [sum(LENS[[2, 2, 0, 0, 0, 0][i]] for i in r) for r in d] == [512 + 128, 512 + 128]
    with pytest.raises(ValueError, match=r"buckets \[0\] 5"):
        dc.deal_by_cost(est, [5], ranks=2, cap=1, bucket_lengths=LENS)
