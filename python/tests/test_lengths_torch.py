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
