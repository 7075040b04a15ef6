"""The overlap path: DDP's own bucketed all-reduce runs during the backward of the rank's last
micro-batch, and the step rescales the reduced gradient by the global count.

Owns: ``OverlapReduce`` (the step's pending rescale on one DDP module, and the comm hook that
composes it with the user's), overlap's preconditions (``overlap_refusal``) and when it pays
(``overlap_pays``, ``mode="auto"``'s rule), ``zero_grads``. Must not touch: the decision of which
micro-batch is the last (the crate's walker, ``StepWalk.peek``), the divisor's rule.

How a step runs (``step.DropComputeStep`` with ``mode="overlap"``): every micro-batch but the
last runs under ``no_sync``; before launching one, ``StepWalk.peek`` says whether another will
follow (with ``sync_lag`` >= 1 this never needs the end of the micro-batch about to run). The
last runs with DDP's sync on: before its forward the rank issues the count collective
(``reduce.Counts``), whose latency then hides behind the forward and the backward, and its
backward fires DDP's bucket all-reduces. DDP's forward may run one collective of its own, the
bucket rebuild after the first synced backward: ``rebuild_buckets`` runs it at the start of
every step, the same point on every rank, so no forward inside a step runs it. Every rank
issues the same sequence (counts, then DDP's buckets) whatever it computed: a rank whose walk
launches nothing runs a backward of its most recent micro-batch with its gradients replaced by
zeros (one micro-batch of compute; only with ``min_micro_batches`` 0 or a rank dealt nothing).

Where the rescale runs. The reduced bucket holds the mean over the N ranks of their
loss-scaled gradients, so the factor is N / (loss_scale x divisor), and it is 1 exactly when
every rank computed its nominal micro-batches (the threshold off).
- Without a user hook, DDP's built-in all-reduce runs (C++, dividing by N while it copies the
  gradients into its buckets): no Python runs on the gradient path. After the backward the
  step waits for the counts (long done) and, when the factor is not 1, rescales every
  gradient in one fused pass that also checks them for non-finite values
  (``reduce.scale_checked_``); at factor 1 the check waits until ``StepResult.finite`` asks.
  Measured against a Python comm hook that summed and rescaled each bucket (2026-12-03, 1 M
  parameters, 2 processes on 2 cores, paired steps): +5.8 % over plain DDP against +10.1 %;
  at 50 M +0.2 % against −0.0 % (the pass after the backward does not show in a 1.4 s step).
- With the user's comm hook (``comm_hook``, e.g. ``bf16_compress_hook``, ``powerSGD_hook``),
  DDP runs it through ``OverlapReduce.hook``, which rescales each bucket its future returns
  (DDP-style hooks return the mean over N) in the same fused pass, while the backward of the
  other buckets runs.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from .reduce import CollectiveError, CollectiveTimeout, Counts, Reduced, collective, failure, found_flag, rescale_factor, scale_checked_


def overlap_refusal(model: torch.nn.Module, sync_lag: Optional[int],
                    latencies_for: Optional[Tuple[str, str]]) -> Optional[str]:
    """Why ``mode="overlap"`` cannot run, as the ValueError's message naming the argument; None
    when it can. ``model``: the step's model; ``sync_lag``: the step's (None: its default, 1 in
    overlap mode); ``latencies_for``: (argument, name) of what needs every rank's micro-batch
    latencies (a step policy that learns, the retuner, the straggler tracker), or None. The one
    list of overlap's preconditions: ``step.DropComputeStep`` refuses ``mode="overlap"`` with
    it and ``mode="auto"`` runs the flat path when it says no."""
    if not hasattr(model, "register_comm_hook"):
        return "model: mode='overlap' needs a DistributedDataParallel module (its reducer overlaps)"
    if getattr(model, "static_graph", False):
        # DDP's own no_sync accumulation asserts under static_graph (pytorch #143580; the test
        # shows plain DDP failing the same way): the flat path never runs DDP's reducer.
        return ("model.static_graph: True: DDP cannot accumulate under no_sync with a static graph "
                "(pytorch #143580); use mode='flat'")
    if sync_lag == 0:
        return "sync_lag: 0: mode='overlap' must know the last micro-batch before launching it (>= 1)"
    if latencies_for is not None:
        return (f"{latencies_for[0]}: {latencies_for[1]!r} needs every rank's micro-batch latencies, which "
                "mode='overlap' cannot measure (the last micro-batch's time includes DDP's all-reduce, which "
                "waits for the slowest rank); use mode='flat'")
    return None


def overlap_pays(model: torch.nn.Module, params: List[torch.nn.Parameter]) -> bool:
    """``mode="auto"``'s rule: whether the gradients (``params``' bytes) exceed one DDP bucket
    (``model.bucket_bytes_cap``, DDP's ``bucket_cap_mb``, 25 MiB by default). Overlap hides the
    all-reduce of every bucket but the last one ready behind the backward, and costs one
    collective more than the flat path (the counts travel beside DDP's buckets instead of
    beside one flat all-reduce). Measured at threshold off against plain DDP ``no_sync``
    accumulation (2026-12-04, 2 processes on 2 cores, gloo, paired steps,
    ``bench_torch_overhead.py --mode paired``): 1.0 M parameters (3.8 MiB) flat −0.8 %, overlap
    +6.4 %; 7.0 M (26.7 MiB, just above the cap) flat −0.4 %, overlap +0.3 %; 15 M (57 MiB) flat
    +4.7 %, overlap −0.2 %; 50 M overlap −0.3 % (README's Python section)."""
    cap = getattr(model, "bucket_bytes_cap", 25 * 2**20)
    return sum(p.numel() * p.element_size() for p in params) > cap


class OverlapReduce:
    """The overlap path's state on one DDP module: the step's pending rescale, and the comm
    hook that composes it with ``user_hook`` (registered once on the module; no hook of ours
    without one: DDP's built-in all-reduce runs). ``user_state``: the user hook's state.
    Raises ValueError when the model cannot run it (``overlap_refusal``)."""

    def __init__(self, ddp: torch.nn.Module, user_hook: Optional[Callable[..., Any]], user_state: Any,
                 group: Optional[dist.ProcessGroup]) -> None:
        refused = overlap_refusal(ddp, 1, None)
        if refused is not None:
            raise ValueError(refused)
        self.ddp = ddp
        self.user_hook = user_hook
        self.user_state = user_state
        # DDP divides by its own process group's size (built-in all-reduce and DDP's hooks).
        pg = getattr(ddp, "process_group", None)
        pg = group if pg is None else pg
        self.world_size = dist.get_world_size(pg) if dist.is_initialized() else 1
        #: The step's non-finite flag (``reduce.found_flag``), checked by every bucket's rescale
        #: in the hook; None when no hook of ours runs.
        self.found: Optional[torch.Tensor] = None
        self.counts: Optional[Counts] = None
        self.divisor_of: Any = None
        self.loss_scale = 1.0
        self.timeout: Optional[datetime.timedelta] = None
        self.error: Optional[BaseException] = None
        #: Buckets the hook rescaled in the current step (0 without a user hook).
        self.buckets = 0
        self.armed_at = 0.0
        #: Between ``arm`` and ``finish``: the step's synced backward may run DDP's all-reduce.
        self.armed = False
        if user_hook is not None:
            # A lambda: DDP checks a hook's annotations against its own types, and this
            # module's annotations are strings (``from __future__ import annotations``).
            ddp.register_comm_hook(self, lambda state, bucket: OverlapReduce.hook(state, bucket))  # type: ignore[operator]

    def arm(self, counts: Counts, divisor_of: Any, loss_scale: float, timeout: Optional[datetime.timedelta]) -> None:
        """The step's pending rescale (before the last micro-batch's backward)."""
        self.counts, self.divisor_of, self.loss_scale, self.timeout = counts, divisor_of, loss_scale, timeout
        self.error, self.buckets, self.armed = None, 0, True
        self.found = found_flag(counts.tensor.device) if self.user_hook is not None else None
        self.armed_at = time.monotonic()

    def finish(self, grads: List[torch.Tensor]) -> Tuple[Reduced, Optional[float], Optional[torch.Tensor]]:
        """After the last backward: the reduced counts, the divisor (None: no rank computed
        anything) and the non-finite flag of the rescale (None: nothing checked yet). Without a
        user hook, rescales ``grads`` (the parameters' gradients) here, in one fused pass when
        the factor is not 1. Raises as ``Counts.result``; ValueError when DDP's reducer did not
        finish the backward (a parameter that got no gradient under DDP without
        ``find_unused_parameters=True``: DDP's own error, chained, would otherwise surface in the
        next step's bucket rebuild), on every rank that saw it, after the counts."""
        assert self.counts is not None, "finish() before arm()"
        self.armed = False  # the synced backward is over: later backward errors are not its
        reduced = self.counts.result(self.timeout)
        try:
            ddp: Any = self.ddp
            ddp._check_reducer_finalized()  # local: DDP's reducer's own record, no collective
        except RuntimeError as e:
            raise ValueError(
                f"rank {self.counts.rank}: step {self.counts.step}: model: DDP did not finish reducing the "
                "gradients in the synced backward: a parameter got no gradient there (unused in the last "
                "micro-batch's forward). "
                "Pass find_unused_parameters=True to DistributedDataParallel, or use mode='flat' (it tracks "
                "unused parameters itself)") from e
        d = self.divisor_of(reduced.samples)
        if d is None or self.user_hook is not None:
            return reduced, d, self.found if d is not None else None
        factor = rescale_factor(1.0 / self.world_size, self.loss_scale, d)
        assert factor is not None  # d is not None
        if factor == 1.0:
            return reduced, d, None
        found = found_flag(self.counts.tensor.device)
        scale_checked_(grads, factor, found)
        return reduced, d, found

    def rebuild_buckets(self, rank: int, step: int, timeout: Optional[datetime.timedelta]) -> None:
        """DDP's one bucket rebuild, if pending, now: called at the start of every step, the same
        point on every rank. After its first synced backward DDP rebuilds its buckets in the
        next grad-enabled forward, with a collective; inside a step that forward could come
        after one rank's count collective and before another's (a deadlock). A no-op once
        rebuilt, before any synced backward, and with ``find_unused_parameters``. Raises
        CollectiveTimeout when a rank never joins it, CollectiveError when it fails sooner
        (``reduce.collective``)."""
        ddp: Any = self.ddp
        with collective(rank, step, "DDP's bucket rebuild (a broadcast)", timeout):
            if ddp.reducer._rebuild_buckets():
                ddp._has_rebuilt_buckets = True  # what DDP's own forward records after a rebuild

    def bucket_error(self, e: BaseException) -> Optional[BaseException]:
        """The step's synced backward raised ``e``: its typed error when it is DDP's all-reduce's
        (``reduce.failure``, timed from the step's count collective), else None (the caller
        re-raises ``e``). The backward also raises autograd's own errors and the user's comm
        hook's, and gloo raises a plain RuntimeError for a peer that died (no message text is
        parsed): ``e`` is the collective's when it is a ``torch.distributed.DistError``, came
        after 90 % of the timeout, or the step's count collective (issued before this backward
        on every rank) failed too. A peer that dies after its counts completed is not told
        apart from an error of the backward itself: ``e`` is re-raised unchanged. None outside
        the step's synced backward (between ``arm`` and ``finish``)."""
        if self.counts is None or not self.armed:
            return None
        err = failure(e, self.armed_at, self.timeout, self.counts.rank, self.counts.step,
                      "a DDP bucket's gradient all-reduce")
        if isinstance(err, CollectiveTimeout) or isinstance(e, dist.DistError):
            return err
        try:
            self.counts.result(self.timeout)
        except (CollectiveError, CollectiveTimeout):
            return err
        except ValueError:  # the ranks' configurations differ: not a broken connection
            return None
        return None

    @staticmethod
    def hook(state: "OverlapReduce", bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """DDP's comm hook: the user's hook, then the rescale of the bucket it returns."""
        state.buckets += 1
        assert state.user_hook is not None
        fut: torch.futures.Future[Any] = state.user_hook(state.user_state, bucket)

        def rescale(f: torch.futures.Future[Any]) -> torch.Tensor:
            # An error of the user's hook or its collective propagates to the backward, where
            # ``DropComputeStep._backward`` judges it (``bucket_error``).
            v = f.value()
            t: torch.Tensor = v[0] if isinstance(v, list) else v
            try:
                assert state.counts is not None, "a bucket was reduced outside a DropCompute step"
                factor = rescale_factor(1.0 / state.world_size, state.loss_scale,
                                        state.divisor_of(state.counts.result(state.timeout).samples))
            except BaseException as e:  # noqa: BLE001 (re-raised by the step after backward)
                state.error = e
                raise
            if factor is None:
                t.zero_()
            else:
                assert state.found is not None
                scale_checked_(t, factor, state.found)
            return t

        return fut.then(rescale)


def zero_grads(params: List[torch.nn.Parameter], ddp: torch.nn.Module) -> None:
    """Clears the gradients at a step's start as plain DDP's ``optimizer.zero_grad()`` does: set
    to None (the first backward then takes its gradient without a copy), or zeroed in place when
    ``ddp.gradient_as_bucket_view`` is True (the ``.grad`` are views of DDP's buckets, which must
    stay valid)."""
    as_view = bool(getattr(ddp, "gradient_as_bucket_view", False))
    for p in params:
        if p.grad is not None:
            if as_view:
                p.grad.zero_()
            else:
                p.grad = None
