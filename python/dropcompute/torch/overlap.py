"""The overlap path: DDP's own bucketed all-reduce runs during the backward of the rank's last
micro-batch, through a comm hook that rescales each bucket by the global count.

Owns: ``OverlapHook`` (registered once on the DDP module; wraps the user's comm hook, DDP's
default all-reduce when none) and the step's pending rescale. Must not touch: the decision of
which micro-batch is the last (the crate's walker, ``StepWalk.peek``), the divisor's rule.

How a step runs (``step.DropComputeStep`` with ``mode="overlap"``): every micro-batch but the
last runs under ``no_sync``; before launching one, ``StepWalk.peek`` says whether another will
follow (with ``sync_lag`` >= 1 this never needs the end of the micro-batch about to run). The
last runs with DDP's sync on: after its forward the rank issues the count collective
(``reduce.Counts``; never before the forward, which may run DDP's own collective), then its
backward fires DDP's bucket all-reduces; each bucket's future waits for the counts (long done)
and multiplies the bucket by N / (loss_scale x divisor). Every
rank issues the same sequence (counts, then DDP's buckets) whatever it computed: a rank whose
walk launches nothing runs a zero-weighted backward of its most recent micro-batch (one
micro-batch of compute; only with ``min_micro_batches`` 0 or a rank dealt nothing).

Without a user hook the bucket is summed (one in-place all-reduce, no division by N: DDP's
default ``allreduce_hook`` divides first, a pass over the gradients the rescale makes again), and
the factor is 1 / (loss_scale x d). The user's hook sees the bucket as DDP would give it (its
own division by N included, e.g. ``allreduce_hook``, ``bf16_compress_hook``); the rescale
composes after it: DDP's hooks return the mean over N ranks of the loss-scaled gradients, so the
factor is N / (loss_scale x d). The rescale also checks the bucket for non-finite values in the
same pass (``reduce.scale_checked_``): the step's flag ``found`` is what ``StepResult.finite``
reads, so ``apply`` without a GradScaler makes no pass of its own over the gradients.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from .reduce import CollectiveTimeout, Counts, found_flag, rescale_factor, scale_checked_


class OverlapHook:
    """The comm hook state registered on the DDP module (``register_comm_hook(self, self.hook)``).

    ``user_hook``/``user_state``: the user's comm hook (DDP's default all-reduce, dividing by N,
    when None). Raises ValueError when the model is not a DDP module."""

    def __init__(self, ddp: torch.nn.Module, user_hook: Optional[Callable[..., Any]], user_state: Any,
                 group: Optional[dist.ProcessGroup]) -> None:
        if not hasattr(ddp, "register_comm_hook"):
            raise ValueError("model: mode='overlap' needs a DistributedDataParallel module (its reducer overlaps)")
        if getattr(ddp, "static_graph", False):
            # DDP's own no_sync accumulation asserts under static_graph (pytorch #143580; the
            # test shows plain DDP failing the same way): the flat path never runs DDP's reducer.
            raise ValueError(
                "model.static_graph: True: DDP cannot accumulate under no_sync with a static graph "
                "(pytorch #143580); use mode='flat'"
            )
        self.user_hook: Callable[..., Any] = user_hook if user_hook is not None else _allreduce_sum
        self.user_state = user_state if user_hook is not None else group
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        #: What the hook's result holds, times the sum over ranks: 1 for our sum, 1 / N for a
        #: user's DDP-style hook (the mean over ranks).
        self.world_sum_scale = 1.0 if user_hook is None else 1.0 / self.world_size
        #: The step's non-finite flag (``reduce.found_flag``), checked by every bucket's rescale.
        self.found: Optional[torch.Tensor] = None
        self.counts: Optional[Counts] = None
        self.divisor_of: Any = None
        self.loss_scale = 1.0
        self.timeout: Optional[datetime.timedelta] = None
        self.divisor: Optional[float] = None
        self.error: Optional[BaseException] = None
        self.buckets = 0
        self.armed_at = 0.0
        # A lambda: DDP checks a hook's annotations against its own types, and this module's
        # annotations are strings (``from __future__ import annotations``).
        ddp.register_comm_hook(self, lambda state, bucket: OverlapHook.hook(state, bucket))  # type: ignore[operator]

    def arm(self, counts: Counts, divisor_of: Any, loss_scale: float, timeout: Optional[datetime.timedelta]) -> None:
        """The step's pending rescale (before the last micro-batch's backward)."""
        self.counts, self.divisor_of, self.loss_scale, self.timeout = counts, divisor_of, loss_scale, timeout
        self.divisor, self.error, self.buckets = None, None, 0
        self.found = found_flag(counts.tensor.device)
        self.armed_at = time.monotonic()

    def timeout_error(self, e: RuntimeError) -> Optional[BaseException]:
        """A bucket's all-reduce failed: a CollectiveTimeout when it failed after 90 % of the
        timeout since the step's count collective was issued (no backend's text is parsed)."""
        if self.timeout is None or self.counts is None:
            return None
        if time.monotonic() - self.armed_at < 0.9 * self.timeout.total_seconds():
            return None
        return CollectiveTimeout(
            f"rank {self.counts.rank}: step {self.counts.step}: a DDP bucket's gradient all-reduce did not "
            f"finish within the process group's timeout ({self.timeout.total_seconds():g} s): a rank died, stopped "
            f"or never reached the step ({e})"
        )

    def _factor(self) -> Optional[float]:
        assert self.counts is not None, "a bucket was reduced outside a DropCompute step"
        reduced = self.counts.result(self.timeout)
        self.divisor = self.divisor_of(reduced.samples)
        return rescale_factor(self.world_sum_scale, self.loss_scale, self.divisor)

    @staticmethod
    def hook(state: "OverlapHook", bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """DDP's comm hook: the user's hook, then the rescale."""
        state.buckets += 1
        fut: torch.futures.Future[Any] = state.user_hook(state.user_state, bucket)

        def rescale(f: torch.futures.Future[Any]) -> torch.Tensor:
            try:
                v = f.value()
            except RuntimeError as e:
                state.error = state.timeout_error(e)
                raise
            t: torch.Tensor = v[0] if isinstance(v, list) else v
            try:
                factor = state._factor()
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


def _allreduce_sum(group: Optional[dist.ProcessGroup], bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """The default comm hook of the overlap path: the bucket summed over ranks in place (DDP's
    ``allreduce_hook`` without its division by N, which the rescale's factor takes instead)."""
    buf: torch.Tensor = bucket.buffer()
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0])


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
