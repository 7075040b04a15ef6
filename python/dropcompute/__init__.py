"""DropCompute (Giladi et al., NeurIPS 2023) for PyTorch and NumPy: the Python face of the
Rust crate ``dropcompute``.

The core (``dropcompute._core``, a pyo3 extension) holds the one implementation of the deadline
policy, the threshold recommendation, the trace replay, the gradient divisor, the retuner, the
straggler tracker and the compute-log writer. ``dropcompute.torch`` (plain Python, imported on
demand) runs one DDP gradient-accumulation step under a deadline.

Units: nanoseconds for times, samples (or tokens) for counts. Errors: ``ValueError`` naming the
field for bad input or malformed traces, ``OSError`` for files.
"""

from ._core import (
    MIN_STEPS,
    ComputeLogWriter,
    LatencyEstimator,
    Policy,
    Retuner,
    StepWalk,
    StragglerTracker,
    Verdict,
    divisor,
    read_trace,
    recommend,
    simulate,
)

__all__ = [
    "MIN_STEPS",
    "ComputeLogWriter",
    "LatencyEstimator",
    "Policy",
    "Retuner",
    "StepWalk",
    "StragglerTracker",
    "Verdict",
    "divisor",
    "read_trace",
    "recommend",
    "simulate",
]
