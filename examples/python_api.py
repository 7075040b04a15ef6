"""The dropcompute Python API without PyTorch: recommend a threshold from latencies, replay it,
and decide micro-batch by micro-batch. Type-checked with `mypy --strict` in CI
(python/tests/test_stubs.py).

usage: python examples/python_api.py
"""

from typing import Optional

import numpy as np
import numpy.typing as npt

import dropcompute


def straggler_latencies(seed: int = 0) -> npt.NDArray[np.float64]:
    """(N=8 ranks, M=8 micro-batches, 50 steps) of ~1 ms, rank 3 often 4x slower (ns)."""
    rng = np.random.default_rng(seed)
    lat: npt.NDArray[np.float64] = rng.gamma(20.0, 5e4, size=(8, 8, 50))
    lat[3, :, rng.random(50) < 0.3] *= 4.0
    return lat


def main() -> None:
    lat = straggler_latencies()
    verdict = dropcompute.recommend(lat, check="before", max_drop_rate=0.10)
    threshold: Optional[int] = int(verdict.threshold_ns) if verdict.threshold_ns is not None else None
    print(f"verdict: {verdict}")
    print(f"oracle (ideal) speedup {verdict.ideal_speedup:+.3f}, realizable {verdict.predicted_speedup:+.3f}")
    policy = dropcompute.Policy(threshold, "before", warmup_steps=0, min_micro_batches=1)
    sim = dropcompute.simulate(lat, policy)
    print(f"replayed: drop rate {sim['drop_rate']:.3f}, effective speedup {sim['effective_speedup']:+.3f}")
    elapsed = 0
    started = 0
    for m in range(lat.shape[1]):
        if not policy.should_start(elapsed, None, step=0, started=m):
            break
        elapsed += int(lat[3, m, 0])
        started += 1
    counts = np.array([8 * 4] * 7 + [started * 4], dtype=np.uint64)
    d: Optional[float] = dropcompute.divisor(counts)
    print(f"rank 3 started {started} of {lat.shape[1]} micro-batches; divisor {d}")


if __name__ == "__main__":
    main()
