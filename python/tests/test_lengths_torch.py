"""Length buckets and tokens in ``DropComputeStep`` (issue 26 on the torch face), 2 processes
under ``torch.distributed.run`` (CPU, gloo): rank 1's last two micro-batches are of the long
bucket (20 ms against 1 ms). The worker (lengths_worker.py) computes the f64 reference gradient
of every rank's started micro-batches divided by the global started tokens."""

from pathlib import Path
from typing import Any, Dict, List

import pytest

import launch  # python/tests/launch.py: the one worker launcher

M, WARMUP = 4, 1
THRESHOLD_MS = 40.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> List[Dict[str, Any]]:
    return launch.torchrun("lengths_worker.py", "length-predictive", tmp_path_factory.mktemp("lengths"), 2)


def test_length_predictive_drops_the_long_micro_batch_on_its_rank_and_divides_by_tokens(
        runs: List[Dict[str, Any]]) -> None:
    r0, r1 = runs[0]["length-predictive"], runs[1]["length-predictive"]
    for a, b in zip(r0["rows"], r1["rows"]):
        for k in ("started", "counts", "divisor", "ref_tokens"):
            assert a[k] == b[k], (k, a, b)
        assert a["same"] and b["same"], "the gradient differs between ranks"
        # The counts are each rank's started tokens; the divisor their exact global sum.
        assert a["counts"] == [a["my_tokens"], b["my_tokens"]], (a, b)
        assert a["divisor"] == float(a["ref_tokens"]) == float(sum(a["counts"])), a
        assert a["grad_rel_err"] <= 1e-10 and b["grad_rel_err"] <= 1e-10, (a, b)
        if a["step"] < WARMUP:
            assert a["started"] == [M, M], a
        else:
            # Rank 0 (short micro-batches) computes all; rank 1 starts its first long one
            # (elapsed ~2 ms + its bucket's ~20 ms estimate <= 40 ms) and stops before the
            # second (~22 ms + ~20 ms > 40 ms), as its bucket's estimate, not a rank-wide
            # one, says.
            assert a["started"] == [M, M - 1], a
    # Rank 1's estimator learned both buckets apart: the long one's estimate near 20 ms.
    short, long = r1["estimates"]
    assert short is not None and long is not None and long > 10 * short, r1["estimates"]
    assert 20e6 <= long < THRESHOLD_MS * 1e6 / 2 + 10e6, long
    # The rank-wide (blind) median is a short micro-batch's: with it, the second long one
    # (elapsed ~22 ms + it) would have started; the stop above is the bucket's doing.
    assert r1["blind"] is not None and 22e6 + r1["blind"] <= THRESHOLD_MS * 1e6 - 10e6, r1["blind"]


def test_cost_balance_deals_every_sample_exactly_once_per_epoch(tmp_path: Any) -> None:
    runs = launch.torchrun("lengths_worker.py", "cost-balance", tmp_path / "cost", 2)
    r0, r1 = runs[0]["cost-balance"], runs[1]["cost-balance"]
    assert r0["rows"] == r1["rows"], "the replicas dealt differently"
    # Every sample computed exactly once in the epoch, whatever was dealt and dropped.
    assert r0["computed"] == r1["computed"] == list(range(r0["samples"])), r0["computed"]
    for row in r0["rows"]:
        # Each step's micro-batches are dealt to the ranks disjointly.
        a, b = row["dealt"]
        assert not set(a) & set(b), row
        assert row["divisor"] == float(sum(row["counts"])), row
    # The deal follows the cost: some step deals the ranks unequal counts (a long micro-batch
    # against several short ones), and something was dropped and re-dealt.
    assert any(r["dealt_counts"][0] != r["dealt_counts"][1] for r in r0["rows"]), r0["rows"]
    assert any(s < d for r in r0["rows"] for s, d in zip(r["started"], r["dealt_counts"])), r0["rows"]
