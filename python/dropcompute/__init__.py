"""DropCompute (Giladi et al., NeurIPS 2023) for PyTorch and NumPy: the Python face of the
Rust crate ``dropcompute``.

The core (``dropcompute._core``, a pyo3 extension) holds the one implementation of the deadline
policy, the threshold recommendation, the trace replay, the gradient divisor, the retuner, the
straggler tracker, the compute-log writer and the step policies (``StepPolicy``, ``Assigner``,
``backup_aggregated``). ``dropcompute.torch`` (plain Python, imported on
demand) runs one DDP gradient-accumulation step under a deadline.

Units: nanoseconds for times, samples (or tokens) for counts. Errors: ``ValueError`` naming the
field and value for bad input (a size above its ``MAX_*`` cap too) or malformed traces,
``OverflowError`` for a negative or too wide integer, ``OSError`` (``FileNotFoundError``,
``IsADirectoryError``, ``PermissionError``) for files.
"""

from ._core import (
    MAX_ESTIMATOR_WINDOW,
    MAX_MICRO_BATCHES,
    MAX_TRACE_CELLS,
    MAX_WORLD_SIZE,
    MIN_STEPS,
    MAX_DEALER_SAMPLES,
    Assigner,
    ComputeLogWriter,
    Dealer,
    DropGuard,
    LatencyEstimator,
    Policy,
    Retuner,
    StepPolicy,
    StepWalk,
    StragglerTracker,
    Verdict,
    backup_aggregated,
    deal_by_cost,
    divisor,
    read_trace,
    recommend,
    simulate,
    __version__,
)

__all__ = [
    "MAX_ESTIMATOR_WINDOW",
    "MAX_MICRO_BATCHES",
    "MAX_TRACE_CELLS",
    "MAX_WORLD_SIZE",
    "MIN_STEPS",
    "MAX_DEALER_SAMPLES",
    "Assigner",
    "ComputeLogWriter",
    "Dealer",
    "DropGuard",
    "LatencyEstimator",
    "Policy",
    "Retuner",
    "StepPolicy",
    "StepWalk",
    "StragglerTracker",
    "Verdict",
    "backup_aggregated",
    "deal_by_cost",
    "divisor",
    "read_trace",
    "recommend",
    "simulate",
    "__version__",
]
