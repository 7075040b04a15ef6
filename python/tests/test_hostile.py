"""Hostile input to every function of ``dropcompute._core``: a wrong size raises ValueError
(above a ``MAX_*`` cap, checked before anything is allocated) or OverflowError (negative, wider
than the argument), a file error raises its OSError subclass, and nothing is ever printed to
stderr (no panic message, no backtrace) or aborts the interpreter. ``capfd`` reads the real
file descriptor 2, so a write by the Rust side would be seen."""

import math
from pathlib import Path
from typing import Any, Callable, List, Tuple, Type

import numpy as np
import pytest

import dropcompute as dc
import dropcompute._core as core

HUGE = 2**63
U64_OVER = 2**64


def _trace() -> "np.ndarray":
    lat = np.full((2, 4, 12), 1e6)
    lat[1, 3, ::2] = 6e6
    return lat


def _write_log(path: Path, lat: "np.ndarray") -> None:
    n, m, s = lat.shape
    with dc.ComputeLogWriter(path) as w:
        for step in range(s):
            for r in range(n):
                start = 0
                for mb in range(m):
                    d = int(lat[r, mb, step])
                    w.write(global_step=step, local_step=mb, world_size=n, batch=8, computed_batch=8 * (mb + 1),
                            compute_dropped=False, rank=r, start_ns=start, duration_ns=d)
                    start += d


def _cases(tmp: Path) -> List[Tuple[str, Callable[[], Any], Type[BaseException], str]]:
    trace = tmp / "compute_log.csv"
    _write_log(trace, _trace())
    empty = tmp / "empty.csv"
    empty.write_text("")
    sub = tmp / "a_directory.csv"
    sub.mkdir()
    missing = tmp / "missing.csv"
    p = dc.Policy(100, "before", warmup_steps=0)
    huge3 = np.broadcast_to(np.float64(1e6), (2**16, 2**16, 2**16))  # 2**48 cells, no memory behind them
    max_ws = core.MAX_WORLD_SIZE
    return [
        # divisor
        ("divisor length above MAX_WORLD_SIZE", lambda: dc.divisor(np.ones(max_ws + 1, dtype=np.uint64)),
         ValueError, f"world_size {max_ws + 1}: exceeds"),
        ("divisor nominal micro_batches 0", lambda: dc.divisor(np.array([3, 4], dtype=np.uint64), "nominal", 0, 3),
         ValueError, "micro_batches 0"),
        ("divisor nominal micro_batch_size 0",
         lambda: dc.divisor(np.array([3, 4], dtype=np.uint64), "nominal", 4, 0), ValueError, "micro_batch_size 0"),
        ("divisor negative micro_batches", lambda: dc.divisor(np.array([3], dtype=np.uint64), "nominal", -1, 3),
         OverflowError, ""),
        ("divisor 2**64 micro_batch_size",
         lambda: dc.divisor(np.array([3], dtype=np.uint64), "nominal", 1, U64_OVER), OverflowError, ""),
        ("divisor broadcast counts", lambda: dc.divisor(np.broadcast_to(np.uint64(1), (2**40,))),
         ValueError, "counts"),
        # LatencyEstimator
        ("estimator window 0", lambda: dc.LatencyEstimator(0), ValueError, "window 0"),
        ("estimator window 2**63", lambda: dc.LatencyEstimator(HUGE), ValueError,
         f"window {HUGE}: exceeds DC_MAX_ESTIMATOR_WINDOW"),
        ("estimator window -1", lambda: dc.LatencyEstimator(-1), OverflowError, ""),
        ("estimator quantile NaN", lambda: dc.LatencyEstimator(4, math.nan), ValueError, "quantile NaN"),
        # StepWalk
        ("walk micro_batches 2**64-1", lambda: dc.StepWalk(p, step=0, micro_batches=U64_OVER - 1), ValueError,
         f"micro_batches {U64_OVER - 1}: exceeds DC_MAX_MICRO_BATCHES"),
        ("walk micro_batches -1", lambda: dc.StepWalk(p, step=0, micro_batches=-1), OverflowError, ""),
        # StragglerTracker
        ("tracker world_size 2**63", lambda: dc.StragglerTracker(HUGE), ValueError,
         f"world_size {HUGE}: exceeds MAX_WORLD_SIZE"),
        ("tracker alpha NaN", lambda: dc.StragglerTracker(2, alpha=math.nan), ValueError, "alpha"),
        # Retuner
        ("retuner world_size 2**40", lambda: dc.Retuner(2**40, 4), ValueError, "world_size"),
        ("retuner micro_batches 2**40", lambda: dc.Retuner(2, 2**40), ValueError, "micro_batches"),
        ("retuner hysteresis NaN", lambda: dc.Retuner(2, 4, hysteresis=math.nan), ValueError, "hysteresis NaN"),
        ("retuner check unknown", lambda: dc.Retuner(2, 4, check="after"), ValueError,
         'check: "after": must be "oracle", "before" or "predictive"'),
        ("retuner oracle sync_lag", lambda: dc.Retuner(2, 4, sync_lag=1), ValueError, "sync_lag"),
        ("retuner oracle jitter", lambda: dc.Retuner(2, 4, jitter_ns=1e6), ValueError, "jitter_ns"),
        ("retuner jitter NaN", lambda: dc.Retuner(2, 4, check="before", jitter_ns=math.nan), ValueError, "jitter_ns"),
        ("retuner jitter negative", lambda: dc.Retuner(2, 4, check="before", jitter_ns=-1.0), ValueError,
         "jitter_ns"),
        ("retuner on_step broadcast", lambda: dc.Retuner(2, 4).on_step(
            np.broadcast_to(np.float64(1.0), (2**20, 2**20)), 1.0), ValueError, "latencies_ns: shape"),
        ("retuner on_step transposed", lambda: dc.Retuner(2, 4).on_step(np.ones((4, 2)), 1.0), ValueError,
         "must be (world_size, micro_batches) = (2, 4)"),
        # recommend / simulate / read_trace on arrays
        ("recommend broadcast array", lambda: dc.recommend(huge3), ValueError, "latencies_ns N*M*steps"),
        ("simulate broadcast array", lambda: dc.simulate(huge3, p), ValueError, "exceeds MAX_TRACE_CELLS"),
        ("recommend min_micro_batches above M", lambda: dc.recommend(trace, min_micro_batches=5), ValueError,
         "min_micro_batches 5: must be <= the micro-batches of"),
        ("recommend min_micro_batches above M (array)", lambda: dc.recommend(_trace(), min_micro_batches=5),
         ValueError, "min_micro_batches 5"),
        ("recommend min_micro_batches 2**32", lambda: dc.recommend(trace, min_micro_batches=2**32), OverflowError,
         ""),
        # files
        ("recommend directory", lambda: dc.recommend(sub), IsADirectoryError, "is a directory"),
        ("recommend missing", lambda: dc.recommend(missing), FileNotFoundError, "missing.csv"),
        ("recommend empty", lambda: dc.recommend(empty), ValueError, "unrecognised header"),
        ("recommend NUL in path", lambda: dc.recommend(str(tmp / "a\0b")), ValueError, "NUL byte"),
        ("read_trace directory", lambda: dc.read_trace(tmp), IsADirectoryError, "is a directory"),
        ("read_trace missing", lambda: dc.read_trace(missing), FileNotFoundError, "missing.csv"),
        ("read_trace empty", lambda: dc.read_trace(empty), ValueError, "unrecognised header"),
        ("simulate directory", lambda: dc.simulate(sub, p), IsADirectoryError, "is a directory"),
        ("writer on a directory", lambda: dc.ComputeLogWriter(sub), IsADirectoryError, "a_directory.csv"),
        ("writer in a missing directory", lambda: dc.ComputeLogWriter(tmp / "no" / "x.csv"), FileNotFoundError,
         "x.csv"),
    ]


def test_every_hostile_case_raises_its_exception_and_prints_nothing(tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    cases = _cases(tmp_path)
    assert len(cases) >= 30
    for name, call, exc, match in cases:
        with pytest.raises(exc) as info:
            call()
        assert match in str(info.value), f"{name}: {info.value}"
    out, err = capfd.readouterr()
    assert err == "", err
    assert out == ""


def test_sizes_at_the_caps_and_zero_lengths_work(capfd: pytest.CaptureFixture[str]) -> None:
    assert dc.divisor(np.array([], dtype=np.uint64)) is None  # zero length: every rank skips
    assert dc.divisor(np.array([3, 4], dtype=np.uint64), "nominal", 4, 3) == 24.0
    assert dc.divisor(np.ones(core.MAX_WORLD_SIZE, dtype=np.uint64)) == float(core.MAX_WORLD_SIZE)
    assert len(dc.LatencyEstimator(core.MAX_ESTIMATOR_WINDOW)) == 0
    w = dc.StepWalk(dc.Policy(100), step=0, micro_batches=0)
    assert w.next() == ("done", 0)
    # At the cap the walk starts: it first asks for the step's compute clock.
    assert dc.StepWalk(dc.Policy(100), step=0, micro_batches=core.MAX_MICRO_BATCHES).next() == ("wait", 0)
    assert dc.recommend(_trace(), min_micro_batches=4).refusal == "min_gain"  # M itself: nothing to drop
    assert capfd.readouterr().err == ""
