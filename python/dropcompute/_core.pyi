"""Typed stubs of the extension module ``dropcompute._core`` (python/src/lib.rs).

Errors of every function: ``ValueError`` naming the argument and its value (a size above its
``MAX_*`` cap is refused before anything is allocated), ``OverflowError`` for an integer that
is negative or wider than its argument, ``FileNotFoundError`` / ``IsADirectoryError`` /
``PermissionError`` (else ``OSError``) for a file. Nothing is printed to stderr."""

import os
from types import TracebackType
from typing import Callable, Dict, List, Literal, Optional, Sequence, Tuple, Type, TypedDict, Union

import numpy as np
import numpy.typing as npt

#: Fewest complete steps (and 2 ranks) a trace needs for ``recommend``.
MIN_STEPS: int
#: Most ranks: ``divisor``'s counts, ``StragglerTracker``, ``Retuner``, a latency array's N (2**20).
MAX_WORLD_SIZE: int
#: Most micro-batches per rank and step: ``StepWalk``, ``Retuner`` (2**20).
MAX_MICRO_BATCHES: int
#: Largest ``LatencyEstimator`` window (2**20).
MAX_ESTIMATOR_WINDOW: int
#: Most cells N*M*steps of a latency array (2**28, the trace readers' cap).
MAX_TRACE_CELLS: int
#: Most samples a ``Dealer``'s epoch holds (2**28: its shuffle holds every id, 8 bytes each).
MAX_DEALER_SAMPLES: int
#: The package's version (the crate's).
__version__: str

CheckMode = Literal["before", "predictive"]
#: A trace file, every rank's compute log of one job (a list), or an (N, M, steps) array.
Source = Union[str, "os.PathLike[str]", List[Union[str, "os.PathLike[str]"]], npt.NDArray[np.float64]]

class Policy:
    """The deadline policy of a job (``policy::decide``).

    ``threshold_ns`` None = off; ``check`` "before" (start iff elapsed < threshold, the
    reference) or "predictive" (start iff elapsed + estimate <= threshold); steps
    ``0..warmup_steps`` never drop; the first ``min_micro_batches`` of a step always start.
    ``kind``: "drop-before", "drop-predictive", "length-predictive" or "cost-balance" (the
    check mode is then the kind's; ``check`` must be left or agree); ``bucket_lengths``: the
    declared padded lengths (tokens, strictly ascending, at most 16) whose indices
    ``StepWalk.set_micro_batches`` takes as buckets. ``drop_guard``: the run-time drop-rate
    guard's bound (a fraction in (0, 1], ``DropGuard``): ``DropComputeStep`` and ``simulate``
    run a step with the threshold off when enforcing it could take the run's cumulative drop
    rate above it. Raises ValueError naming ``check``, ``kind``, ``bucket_lengths`` (with the
    index) or ``drop_guard`` for a bad value."""

    def __init__(
        self,
        threshold_ns: Optional[int] = None,
        check: CheckMode = "before",
        warmup_steps: int = 3,
        min_micro_batches: int = 1,
        kind: Optional[str] = None,
        bucket_lengths: Optional[List[int]] = None,
        drop_guard: Optional[float] = None,
    ) -> None: ...
    def should_start(
        self, elapsed_ns: int, estimate_ns: Optional[int] = None, *, step: int, started: int
    ) -> bool:
        """Whether to start micro-batch ``started`` (0-based) of step ``step`` after
        ``elapsed_ns`` of compute since the previous optimizer step ended."""
    @property
    def threshold_ns(self) -> Optional[int]: ...
    @property
    def check(self) -> CheckMode: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def min_micro_batches(self) -> int: ...
    @property
    def kind(self) -> Optional[str]: ...
    @property
    def bucket_lengths(self) -> List[int]: ...
    @property
    def drop_guard(self) -> Optional[float]: ...
    def __reduce__(
        self,
    ) -> Tuple[type, Tuple[Optional[int], str, int, int, Optional[str], List[int], Optional[float]]]:
        """Pickling: the constructor's arguments (a policy travels to workers and checkpoints)."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class DropGuard:
    """The run-time drop-rate guard (``policy::DropGuard``): the run's cumulative global counts
    in its drop unit (micro-batches) and the rule ``dropped + reserve <= bound * (handed +
    handed_this_step)`` (``reserve``: the largest drop of an enforced step so far). Raises
    ValueError for a ``bound`` not in (0, 1]."""

    def __init__(self, bound: float) -> None: ...
    def enforces(self, handed: int) -> bool:
        """Whether a step handing out ``handed`` (over every rank) runs with the threshold."""
    def record(self, handed: int, started: int, enforced: bool) -> None:
        """A step's global counts and whether it ran with the threshold."""
    @property
    def bound(self) -> float: ...
    @property
    def counts(self) -> Tuple[int, int, int]:
        """(handed, dropped, reserve)."""
    @property
    def drop_rate(self) -> float: ...
    @staticmethod
    def from_counts(bound: float, counts: Tuple[int, int, int]) -> "DropGuard":
        """A guard restored from ``counts`` (a checkpoint)."""

class LatencyEstimator:
    """Nearest-rank ``quantile`` of the last ``window`` micro-batch latencies (ns), per length
    bucket (``policy::BucketEstimator``: a bucket's own window, else the blind window over every
    latency; given no bucket it is the blind estimator). Raises ValueError for ``window`` 0 or
    above ``MAX_ESTIMATOR_WINDOW``, a quantile outside [0, 1]."""

    def __init__(self, window: int = 32, quantile: float = 0.9) -> None: ...
    def observe(self, latency_ns: int, bucket: Optional[int] = None) -> None: ...
    def estimate(self, bucket: Optional[int] = None) -> Optional[int]: ...
    def __len__(self) -> int: ...

class StepWalk:
    """One rank's walk through one step: the Rust scheduler's own walker, so a Python loop
    decides exactly as the scheduler does. Drive it with ``next``: ``("wait", upto)`` report
    the ends of launches ``reported()..upto`` with ``ended`` (compute time from the clock start
    to each end, and its duration, ns; ``upto`` 0: pass the clock's reading to ``clock_at``); ``("launch", i)`` run micro-batch ``i``;
    ``("done", stopped)`` the step is over (``stopped`` 1: the deadline stopped it). Raises
    ValueError for ``micro_batches`` above ``MAX_MICRO_BATCHES``."""

    def __init__(self, policy: Policy, *, step: int, micro_batches: int, sync_lag: int = 0) -> None: ...
    def set_micro_batches(self, buckets: Optional[List[int]], tokens: List[int]) -> None:
        """Each micro-batch's bucket (an index into ``policy.bucket_lengths``; None: not known)
        and tokens, before the first launch. Raises ValueError naming the index and value for a
        bucket not declared, lengths not one per micro-batch, or a walk already launched."""
    def tokens_started(self) -> int:
        """Tokens of the micro-batches started so far (0 when not told)."""
    def next(self, estimator: Optional[LatencyEstimator] = None) -> Tuple[str, int]: ...
    def ended(
        self, launch: int, end_ns: int, duration_ns: int, estimator: Optional[LatencyEstimator] = None
    ) -> bool: ...
    def peek(self, estimator: Optional[LatencyEstimator] = None) -> Tuple[str, int]:
        """Whether another launch follows the one ``next`` last returned, asked before it runs:
        ``("again", 0)``, ``("last", 0)`` or ``("wait", upto)`` (report those ends, ask again).
        With ``sync_lag`` >= 1 it never needs the end of the launch about to run."""
    def clock_at(self, elapsed_ns: int) -> None: ...
    def reported(self) -> int: ...
    def started(self) -> int: ...

class Dealer:
    """One rank's replica of the job's one global epoch stream (the crate's
    ``deal::RunData::global``, what ``dropcompute train`` deals by): each epoch the sample ids
    ``0..samples`` shuffled by (seed, epoch), cut into micro-batches of ``micro_batch_size``,
    dealt per step by an assignment (micro-batches per rank), every rank's not-started
    micro-batches back at the front in rank order. ``epochs`` None: the stream never ends.
    Raises ValueError for ``samples`` 0 or above ``MAX_DEALER_SAMPLES``, ``micro_batch_size``
    0 or above ``samples``, ``rank`` not below ``world_size``, ``world_size`` 0 or above
    ``MAX_WORLD_SIZE``, ``epochs`` 0."""

    def __init__(
        self, samples: int, micro_batch_size: int, *, rank: int, world_size: int, seed: int = 0,
        epochs: Optional[int] = None,
    ) -> None: ...
    def take(self, assignment: List[int]) -> List[List[int]]:
        """This rank's micro-batches of the next step (sample-id lists). Raises ValueError for an
        assignment without one entry per rank, RuntimeError when the last step is not settled."""
    def take_by_cost(
        self, micro_batches: int, bucket_of: Callable[[List[int]], int], estimator: LatencyEstimator, *,
        bucket_lengths: Optional[List[int]] = None,
    ) -> Tuple[List[List[int]], List[int]]:
        """This rank's micro-batches of the next step and their buckets, the step's N *
        ``micro_batches`` dealt by predicted cost (``deal_by_cost`` with cap 2 *
        ``micro_batches``; ``bucket_of(sample_ids)`` names each one's bucket; ``estimator``
        identical on every rank); at an epoch's end dealt as ``take``. Raises ValueError for a
        bucket not declared, RuntimeError when the last step is not settled, and what
        ``bucket_of`` raises (nothing is dealt then)."""
    def settle(self, started: List[int]) -> None:
        """Ends the step with every rank's started micro-batches. Raises ValueError for a wrong
        length or more started than dealt to this rank, RuntimeError without a pending take."""
    @property
    def dealt_total(self) -> int:
        """Micro-batches the pending ``take`` dealt to all ranks together; 0 between steps."""
    @property
    def ended(self) -> bool:
        """Whether the last ``take`` dealt nothing to any rank: the stream has ended (known to
        every replica at the same step). Such a take needs no ``settle``."""
    @property
    def epoch(self) -> int: ...
    def state(self) -> str:
        """The replica's state as JSON (between steps)."""
    @staticmethod
    def from_state(state: str) -> "Dealer":
        """A replica from ``state()``'s JSON. Raises ValueError for a malformed one."""

class Verdict:
    """The tuner's decision. ``predicted_*`` come from the scoring named by ``scoring``
    ("oracle": oracle truncation; "before"/"predictive": the policy replayed on the trace, i.e.
    realizable); ``ideal_speedup``/``ideal_threshold_ns`` are the oracle's best candidate within
    the guardrails. ``refusal`` names the guardrail that declined ("min_gain",
    "max_drop_rate", "min_batch_fraction"), ``reason`` gives the numbers."""

    enabled: bool
    #: Whole ns, as ``Policy(threshold_ns=...)`` takes it; None when not enabled.
    threshold_ns: Optional[int]
    predicted_drop_rate: float
    predicted_speedup: float
    ideal_speedup: float
    ideal_threshold_ns: float
    scoring: str
    refusal: Optional[str]
    reason: Optional[str]

def recommend(
    source: Source,
    *,
    check: Literal["oracle", "before", "predictive"] = "oracle",
    max_drop_rate: float = 0.10,
    min_batch_fraction: float = 0.75,
    min_gain: float = 0.02,
    min_micro_batches: int = 1,
    overhead_ns: float = 0.0,
    drop_guard: bool = False,
    jitter_ns: float = 0.0,
) -> Verdict:
    """Recommend a threshold from a trace file or an (N, M, steps) float64 array of latencies
    (ns); ``overhead_ns`` per step for arrays and the reference's logs. Raises ValueError
    (bad field, malformed or empty trace, fewer than MIN_STEPS steps or 2 ranks,
    ``min_micro_batches`` above the trace's micro-batches per step: the validation of
    ``dropcompute tune``, an array above ``MAX_WORLD_SIZE`` ranks or ``MAX_TRACE_CELLS`` cells),
    FileNotFoundError / IsADirectoryError / PermissionError / OSError (file). ``drop_guard``:
    when True every candidate is replayed with the drop-rate guard at ``max_drop_rate``
    (``Policy(drop_guard=max_drop_rate)``, as the run will execute it), so the guardrail judges
    the guarded drop rate; needs a replayed ``check`` ("before" or "predictive"), not "oracle"
    (ValueError). ``jitter_ns`` (>= 0, finite; ValueError otherwise, or above 0 with "oracle"):
    the timing jitter the threshold must tolerate: a candidate is judged by the worst replay
    within +- ``jitter_ns`` of it, every one within the guardrails (``dropcompute tune
    --jitter-ms``); 0: the point replay."""

class SimulateResult(TypedDict):
    baseline_step_ns: float
    policy_step_ns: float
    drop_rate: float
    effective_speedup: float
    baseline_per_step_ns: npt.NDArray[np.float64]
    policy_per_step_ns: npt.NDArray[np.float64]
    started_per_step: npt.NDArray[np.uint64]
    #: Per step: whether the threshold was in force (False: the policy's drop guard held it off).
    enforced_per_step: List[bool]

def simulate(source: Source, policy: Policy, *, overhead_ns: float = 0.0) -> SimulateResult:
    """Replay a trace under ``policy`` (``sim::replay``), with its ``drop_guard`` when it has one."""

class TraceArrays(TypedDict):
    latencies_ns: npt.NDArray[np.float64]
    overhead_ns: npt.NDArray[np.float64]
    ranks: npt.NDArray[np.uint32]
    steps: npt.NDArray[np.uint64]
    source: str

def read_trace(path: Union[str, "os.PathLike[str]"], *, overhead_ns: float = 0.0) -> TraceArrays:
    """A trace file as arrays: latencies_ns of shape (N, M, steps) (a transposed view, no
    copy), overhead_ns (steps,), rank and step ids."""

def divisor(
    counts: npt.NDArray[np.uint64],
    normalization: Literal["realized", "nominal"] = "realized",
    micro_batches: int = 1,
    micro_batch_size: int = 1,
    weighting: Literal["samples", "tokens"] = "samples",
) -> Optional[float]:
    """What the summed gradient is divided by: the global computed count ("realized"; samples
    or, with ``weighting="tokens"``, tokens) or N*M*b ("nominal"); None when the global count
    is zero (every rank skips the step, also for no counts). Raises ValueError for more than
    ``MAX_WORLD_SIZE`` counts, a non-contiguous array, an unknown weighting, or
    ``micro_batches`` / ``micro_batch_size`` 0 under "nominal"."""

def deal_by_cost(
    estimator: LatencyEstimator, buckets: List[int], *, ranks: int, cap: int,
    bucket_lengths: Optional[List[int]] = None,
) -> List[List[int]]:
    """The cost-balanced deal of a step's micro-batches of buckets ``buckets`` to ``ranks``
    ranks, at most ``cap`` each (raised to ceil(len / ranks)): longest predicted cost first
    (the estimator's per-bucket estimate; the declared ``bucket_lengths`` price the buckets not
    measured yet), each rank's indices into ``buckets`` ascending. Raises ValueError for a
    bucket not declared, bad lengths, ``ranks`` above ``MAX_WORLD_SIZE``."""

class ComputeLogWriter:
    """Writes the compute log (CSV, the reference's columns plus rank/start_ns/duration_ns);
    ``dropcompute tune`` reads it. Raises OSError for file errors (FileNotFoundError for a
    missing directory, IsADirectoryError for a directory)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None: ...
    def write(
        self,
        *,
        global_step: int,
        local_step: int,
        world_size: int,
        batch: int,
        computed_batch: int,
        compute_dropped: bool,
        rank: int,
        start_ns: int,
        duration_ns: int,
        sentence_length: int = 0,
        micro_batches: int = 0,
        clock_start_ns: Optional[int] = None,
        deadline_ns: int = 0,
    ) -> None:
        """One micro-batch row. Times are ns on one monotonic clock per rank: ``start_ns``, the
        step's compute clock start ``clock_start_ns`` (the reader derives the step overhead
        from it; None: not recorded) and its deadline ``deadline_ns`` (0: none). ``micro_batches``:
        the run's M (0: not recorded)."""
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "ComputeLogWriter": ...
    def __exit__(
        self,
        t: Optional[Type[BaseException]],
        v: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class StragglerTracker:
    """Per-rank straggler statistics (``schedule::StragglerTracker``). Raises ValueError for
    ``world_size`` 0 or above ``MAX_WORLD_SIZE``."""

    def __init__(self, world_size: int, alpha: float = 0.1, chronic_fraction: float = 0.5) -> None: ...
    def observe(
        self,
        dropped: npt.NDArray[np.uint32],
        compute_ns: npt.NDArray[np.uint64],
        latency_ns: Optional[npt.NDArray[np.float64]] = None,
    ) -> None: ...
    def chronic(self) -> List[int]: ...
    def labels(self) -> List[str]: ...
    @property
    def steps(self) -> int: ...
    @property
    def hits(self) -> List[int]: ...
    @property
    def ewma_compute_ns(self) -> List[float]: ...

class Retuner:
    """Closed-loop re-tuning: probe windows with the threshold off, enforce windows with the
    tuned threshold (``tune::retune::Retuner``). ``check``: what a threshold is scored under:
    "oracle" (the exact search over the probe window) or the check the step runs, "before" or
    "predictive", replayed with ``sync_lag`` (as ``recommend`` replays it); ``jitter_ns``: the
    timing jitter the threshold must tolerate (``recommend``'s; replayed checks only).
    ``DropComputeStep`` refuses a replayed check other than its policy's or a sync lag other
    than its own. Raises ValueError for ``world_size`` above ``MAX_WORLD_SIZE``,
    ``micro_batches`` above ``MAX_MICRO_BATCHES``, a negative or non-finite ``hysteresis``, an
    unknown ``check``, ``sync_lag`` or ``jitter_ns`` above 0 with "oracle", a negative or
    non-finite ``jitter_ns``; ``on_step`` for a matrix not of shape (world_size,
    micro_batches)."""

    def __init__(
        self,
        world_size: int,
        micro_batches: int,
        *,
        period: int = 200,
        probe_steps: int = 20,
        hysteresis: float = 0.01,
        max_drop_rate: float = 0.10,
        min_batch_fraction: float = 0.75,
        min_gain: float = 0.02,
        min_micro_batches: int = 1,
        check: str = "oracle",
        sync_lag: int = 0,
        jitter_ns: float = 0.0,
    ) -> None: ...
    def on_step(
        self, latencies_ns: npt.NDArray[np.float64], step_time_ns: float
    ) -> Optional[Dict[str, Union[str, bool, float, int, None]]]: ...
    @property
    def threshold_ns(self) -> Optional[int]: ...
    @property
    def world_size(self) -> int: ...
    @property
    def micro_batches(self) -> int: ...
    @property
    def config(self) -> str:
        """The configuration as text (equal on ranks that retune alike)."""
        ...
    @property
    def check(self) -> str:
        """The check it scores thresholds under: "oracle", "before" or "predictive"."""
        ...
    @property
    def sync_lag(self) -> int: ...
    @property
    def min_micro_batches(self) -> int:
        """The scored walk's fewest micro-batches per rank (``DropComputeStep`` refuses a
        retuner whose value is not its policy's)."""
        ...

class StepPolicy:
    """A step policy and its parameters (``policy::StepPolicy``), identical on every rank.

    ``kind``: "synchronous", "drop-before", "drop-predictive", "backup-workers",
    "compute-budget", "rebalance", "rebalance-drop", "length-predictive" or "cost-balance"
    (the last two need length buckets, which this face does not pass yet: they run as
    "drop-predictive"). ``backup_workers``: b, the ranks
    predicted slowest that compute nothing in a step (clamped to N - 1). ``budget_ns``: the
    compute budget per step (ns, compute-budget; None: unset). ``budget_max_micro_batches``: the
    most micro-batches a rank starts under the budget (None: 2·M). ``rebalance_hysteresis``,
    ``rebalance_min_micro_batches``: the rebalancer's limits. ``tail_split``/``tail_cost``: the
    tail shape (1/None: whole micro-batches only). Validated by the crate (``TailShape::checked``);
    raises ValueError naming the argument. Picklable; equal when every parameter is."""

    def __init__(
        self,
        kind: str,
        *,
        backup_workers: int = 1,
        budget_ns: Optional[int] = None,
        budget_max_micro_batches: Optional[int] = None,
        rebalance_hysteresis: float = 0.05,
        rebalance_min_micro_batches: int = 1,
        tail_split: int = 1,
        tail_cost: Optional[float] = None,
    ) -> None: ...
    @property
    def kind(self) -> str: ...
    @property
    def backup_workers(self) -> int: ...
    @property
    def budget_ns(self) -> Optional[int]: ...
    @property
    def budget_max_micro_batches(self) -> Optional[int]: ...
    @property
    def rebalance_hysteresis(self) -> float: ...
    @property
    def rebalance_min_micro_batches(self) -> int: ...
    @property
    def tail_split(self) -> int: ...
    @property
    def tail_cost(self) -> Optional[float]: ...
    @property
    def drops(self) -> bool:
        """Whether the DropCompute threshold applies."""
        ...
    @property
    def learns(self) -> bool:
        """Whether the assignment learns from per-rank latencies (backup workers, rebalancing)."""
        ...
    def slots(self, micro_batches: int) -> int:
        """The most micro-batches per rank the assigner hands out for M = ``micro_batches``."""
        ...
    def deadline(self, policy: Policy) -> Policy:
        """The deadline the walk runs under: ``policy`` with the step policy's check mode and
        threshold (the budget for compute-budget, off for synchronous / backup-workers /
        rebalance). Raises ValueError for a contradicting ``policy.check`` (drop-before runs
        "before", drop-predictive "predictive") or compute-budget without ``budget_ns``."""
        ...
    def to_json(self) -> str:
        """The crate's JSON of the parameters (the budget in ms)."""
        ...

class Assigner:
    """Each rank's micro-batch count of the next step (``policy::assign::Assigner``: the Rust
    scheduler's and the simulator's rule). Every rank holds a replica fed the same gathered
    latencies, so the replicas agree without communicating. ``warmup_steps``: the job's
    (the nominal batch runs in warm-up); ``first_step``: the index of the first step. Raises
    ValueError for ``world_size`` or ``micro_batches`` 0 or above their caps."""

    def __init__(
        self, step_policy: StepPolicy, world_size: int, micro_batches: int, *, warmup_steps: int = 3,
        first_step: int = 0,
    ) -> None: ...
    def assignment(self) -> List[int]:
        """Micro-batches per rank for the next step (one per rank)."""
        ...
    def observe(self, step: int, per_rank_micro_batch_ns: Sequence[float]) -> bool:
        """Feeds step ``step``'s per-rank mean latency per micro-batch (ns; NaN: none computed)
        and moves to the next step's assignment. True when a rebalanced assignment needed more
        than the slots (the previous one stays). Raises ValueError for a length other than N."""
        ...
    @property
    def step_policy(self) -> StepPolicy: ...
    def state(self) -> str:
        """The replica's state as JSON (a checkpoint)."""
        ...
    def restore_conflict(self, restored: "Assigner") -> Optional[str]:
        """Why ``restored`` (e.g. ``from_state`` of a checkpoint) cannot replace this replica:
        the first of the step policy, micro_batches, tail parts, slots, warmup_steps, budget and
        world_size that differs ("<field>: <checkpoint's> in the checkpoint, <this> in this
        step"), or an assigned part count above the slots; None when it can."""
        ...
    @staticmethod
    def from_state(state: str) -> "Assigner":
        """A replica from ``state()``. Raises ValueError for a malformed state."""
        ...

def backup_aggregated(finish_ns: Sequence[float], b: int) -> List[bool]:
    """Backup workers' aggregation (``policy::backup_aggregated``): per rank, whether it is
    among the first N - min(b, N - 1) to finish (ties: lower rank first; NaN last)."""
    ...
