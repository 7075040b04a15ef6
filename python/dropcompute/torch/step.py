"""One data-parallel gradient-accumulation step under a compute deadline.

Owns: the micro-batch loop (``DropComputeStep.run``) and what a step's result offers the
caller (``StepResult.apply``: the optimizer, ``GradScaler`` and LR-scheduler step). Must not
touch: decisions (the crate's step walker decides every launch: ``dropcompute.StepWalk``, the
same ``policy::walk::RankWalk`` the Rust scheduler and the simulator drive), the divisor
(``dropcompute.divisor``) or the collectives (``reduce``).

A step: the gradients are zeroed views of flat buffers (``reduce.FlatGradients``); the walker
says which micro-batch to launch or which ends to report (with ``sync_lag`` L it asks for the
end of micro-batch i-L before launching i: the host never waits for the micro-batch just
launched); each launched micro-batch runs ``loss_fn`` and ``backward`` under DDP's
``no_sync`` (when the model is a DDP module); then the count collective and the gradient
all-reduces (``reduce.reduce_step``) and the rescale. Micro-batches are pulled from the
iterable only when launched: the ones not started were never taken (with
``DropComputeSampler`` they are dealt again next step).

The loss: ``loss_fn(module, micro_batch)`` (``module``: the DDP module's inner module; use it, not a
closure over the DDP wrapper) returns per-sample losses (shape ``(b,)`` or
``(b, ...)``: summed here, the count defaults to ``b``) or their SUM as a scalar. A scalar
mean (``.mean()``, or a loss module with ``reduction="mean"``) is refused with ValueError: the
divisor already turns the summed gradient into the mean over computed samples.
"""

from __future__ import annotations

import datetime
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .. import ComputeLogWriter, LatencyEstimator, Policy, StepWalk, divisor
from .clock import DeviceClock
from .data import batch_size
from .reduce import FlatGradients, group_timeout, reduce_step


@dataclass
class StepResult:
    """What one step did. Counts are samples (or what ``count_fn`` returns)."""

    step: int
    #: Micro-batches this rank started / did not start.
    computed_micro_batches: int
    dropped_micro_batches: int
    #: Samples this rank computed.
    samples: int
    #: Every rank's computed samples, by rank (exact: int64).
    counts: List[int]
    #: Every rank's started micro-batches, by rank.
    started: List[int]
    #: What the summed gradient was divided by; None when no rank computed anything.
    divisor: Optional[float]
    #: This rank's compute phase (ns from the clock start to the end of its last micro-batch).
    compute_ns: int
    latencies_ns: List[int] = field(default_factory=list)
    #: The flat gradient buffers (for the finiteness check of ``apply``).
    _buffers: List[torch.Tensor] = field(default_factory=list, repr=False)

    @property
    def skipped(self) -> bool:
        """True when no rank computed anything: there is no gradient to step with."""
        return self.divisor is None

    def finite(self) -> bool:
        """Whether the reduced gradient is finite (identical on every rank: the all-reduce sums
        every rank's gradient). One pass over the gradients."""
        return all(bool(torch.isfinite(b).all()) for b in self._buffers)

    def apply(self, optimizer: torch.optim.Optimizer, scaler: Any = None, scheduler: Any = None) -> bool:
        """Steps ``optimizer`` (through ``scaler``, a ``torch.amp.GradScaler``, when given) and
        then ``scheduler`` only when the optimizer stepped. Returns whether it stepped.

        Not stepped: when no rank computed anything (the scaler is left untouched: it saw no
        gradient), or when the gradient is not finite (with a scaler: the scaler skips the
        optimizer and backs off its scale exactly as under plain DDP; without one: checked
        here). With a scaler, "stepped" is read as the scale not decreasing across
        ``update()`` (the scaler's own signal; Hugging Face's Trainer reads it the same way)."""
        if self.skipped:
            return False
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            stepped = bool(scaler.get_scale() >= before)
        else:
            stepped = self.finite()
            if stepped:
                optimizer.step()
        if stepped and scheduler is not None:
            scheduler.step()
        return stepped


class DropComputeStep:
    """Runs gradient-accumulation steps under a compute deadline (see the module doc).

    ``model``: a ``DistributedDataParallel`` module, or the plain module (the flat path needs
    no DDP reducer; DDP is only run under ``no_sync``). Its trainable parameters must be
    contiguous. ``policy``: the job's ``dropcompute.Policy``, identical on every rank (checked
    at every step through the count collective). ``normalization``: "realized" (divide by the
    global computed count) or "nominal" (N·M·b; ``micro_batch_size`` needed).
    ``micro_batches_per_step``: M, the micro-batches per rank and step (needed when ``run`` is
    given an iterable without ``len()``; the "nominal" divisor uses it, else this rank's count).
    ``sync_lag``: how many micro-batches the deadline check reads behind (default 0 on the CPU,
    whose execution is synchronous, 1 on a device). ``compute_log``: this rank's compute log
    (read by ``dropcompute tune``). ``estimator``: the latency estimate of the predictive check.
    ``timeout``: how long a collective may wait (default: the process group's own).

    Raises ValueError naming the argument for a bad value."""

    def __init__(
        self,
        model: torch.nn.Module,
        policy: Policy,
        *,
        normalization: str = "realized",
        micro_batch_size: int = 0,
        micro_batches_per_step: Optional[int] = None,
        device: Optional[torch.device] = None,
        group: Optional[dist.ProcessGroup] = None,
        sync_lag: Optional[int] = None,
        compute_log: Optional[str] = None,
        estimator: Optional[LatencyEstimator] = None,
        timeout: Optional[datetime.timedelta] = None,
    ) -> None:
        if normalization not in ("realized", "nominal"):
            raise ValueError(f"normalization: {normalization!r}: must be 'realized' or 'nominal'")
        if normalization == "nominal" and micro_batch_size <= 0:
            raise ValueError("micro_batch_size: must be > 0 with normalization='nominal'")
        if micro_batches_per_step is not None and micro_batches_per_step < 1:
            raise ValueError(f"micro_batches_per_step: {micro_batches_per_step}: must be >= 1")
        if sync_lag is not None and sync_lag < 0:
            raise ValueError(f"sync_lag: {sync_lag}: must be >= 0")
        inner = getattr(model, "module", model)
        if getattr(model, "broadcast_buffers", False) and any(True for _ in inner.buffers()):
            raise ValueError("model.broadcast_buffers: must be False (ranks run different numbers of forwards)")
        self.model = model
        self.grads = FlatGradients([p for p in inner.parameters() if p.requires_grad])
        self.policy = policy
        self.normalization = normalization
        self.micro_batch_size = micro_batch_size
        self.micro_batches_per_step = micro_batches_per_step
        self.group = group
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        dev = device if device is not None else self.grads.params[0].device
        self.clock = DeviceClock(dev)
        self.sync_lag = sync_lag if sync_lag is not None else (0 if dev.type == "cpu" else 1)
        self.estimator = estimator
        self.timeout = timeout if timeout is not None else group_timeout(group)
        self.step = 0
        self._observed_b = 0.0
        self._clock_started = False
        self._log = ComputeLogWriter(compute_log) if compute_log else None

    def start_clock(self) -> None:
        """Starts the compute clock now (right after ``optimizer.step()``); otherwise ``run``
        starts it on entry."""
        self.clock.start()
        self._clock_started = True

    def state_dict(self) -> Dict[str, Any]:
        """The step counter (the warm-up counts steps) and the observed micro-batch count (the
        loss scale's b) for a checkpoint."""
        return {"step": self.step, "observed_micro_batch_count": self._observed_b}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores ``state_dict()``'s state. Raises ValueError for a malformed one."""
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"state['step']: {step!r}: must be an int >= 0")
        b = state.get("observed_micro_batch_count", 0.0)
        if not isinstance(b, (int, float)) or not b >= 0:
            raise ValueError(f"state['observed_micro_batch_count']: {b!r}: must be a number >= 0")
        self.step = step
        self._observed_b = float(b)

    def _fingerprint(self) -> int:
        """What every rank must share: the policy, the normalization, b, M and N (a rank's own
        micro-batch count may differ, e.g. at the end of an epoch)."""
        key = (f"{self.policy!r}|{self.normalization}|{self.micro_batch_size}|{self.micro_batches_per_step}|"
               f"{self.world_size}")
        return zlib.crc32(key.encode()) & 0x7FFFFFFF

    def _no_sync(self) -> Any:
        ns = getattr(self.model, "no_sync", None)
        return ns() if ns is not None else _Null()

    def run(
        self,
        micro_batches: Iterable[Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        count_fn: Optional[Callable[[Any], int]] = None,
    ) -> StepResult:
        """One step over ``micro_batches`` (a sequence, or any iterable with
        ``micro_batches_per_step`` set); see the module doc for ``loss_fn``. ``count_fn(mb)``:
        the micro-batch's sample (or token) count (default: the per-sample loss vector's length,
        else ``batch_size(mb)``). Afterwards the parameters' ``.grad`` hold the rescaled mean
        gradient (``None`` for a parameter no rank used); call ``result.apply(optimizer, ...)``.

        Raises ValueError for an iterable without ``len()`` and no ``micro_batches_per_step``,
        one that ends early, a mean loss, ranks with different configurations;
        ``reduce.CollectiveTimeout`` (a ``TimeoutError``) when a collective times out."""
        if hasattr(micro_batches, "__len__"):
            m = len(micro_batches)  # type: ignore[arg-type]
        elif self.micro_batches_per_step is not None:
            m = self.micro_batches_per_step
        else:
            raise ValueError("micro_batches: an iterable without len(); set micro_batches_per_step")
        if not self._clock_started:
            self.clock.start()
        self._clock_started = False
        self.grads.attach()
        # Backward of loss * loss_scale, identical on every rank: 1 / (N·M·b) with b the
        # nominal micro-batch count (micro_batch_size, else the mean of the last step that
        # computed anything: both known to every rank), so the accumulated gradients have DDP's
        # magnitude (mean loss / M, averaged over N).
        b_nominal = self.micro_batch_size or self._observed_b or 1.0
        loss_scale = 1.0 / (self.world_size * (self.micro_batches_per_step or m) * b_nominal)
        # The flat path runs the inner module: DDP's reducer never runs (under static_graph it
        # asserts when backward passes run under no_sync only).
        module = getattr(self.model, "module", self.model)
        source = iter(micro_batches)
        samples = 0
        marks: List[Any] = []
        ends: List[int] = []
        batch: List[int] = []
        walk = StepWalk(self.policy, step=self.step, micro_batches=m, sync_lag=self.sync_lag)
        with self._no_sync():
            while True:
                kind, value = walk.next(self.estimator)
                if kind == "done":
                    break
                if kind == "wait":
                    if value == 0:
                        # Time before the first micro-batch counts against the deadline.
                        walk.clock_at(self.clock.read(self.clock.mark()))
                    for i in range(walk.reported(), value):
                        self._report(walk, i, marks, ends)
                    continue
                try:
                    mb = next(source)
                except StopIteration:
                    raise ValueError(f"micro_batches: ended after {value} of {m} micro-batches") from None
                loss = loss_fn(module, mb)
                (_sum_checked(loss, self.rank, self.step, value) * loss_scale).backward()  # type: ignore[no-untyped-call]
                c = int(count_fn(mb)) if count_fn is not None else (int(loss.shape[0]) if loss.dim() else batch_size(mb))
                batch.append(c)
                samples += c
                marks.append(self.clock.mark())
        started = len(marks)
        for i in range(len(ends), started):
            ends.append(self.clock.read(marks[i]))
        fp = self._fingerprint()
        reduced, d = reduce_step(
            self.grads, rank=self.rank, world_size=self.world_size, samples=samples, started=started,
            fingerprint=fp, divisor_of=self._divisor(m), loss_scale=loss_scale, group=self.group, timeout=self.timeout, step=self.step,
        )
        if sum(reduced.started) > 0:
            self._observed_b = sum(reduced.samples) / sum(reduced.started)
        latencies = [e - (ends[i - 1] if i else 0) for i, e in enumerate(ends)]
        if self._log is not None:
            rest = micro_batches[started:] if isinstance(micro_batches, Sequence) else []
            dropped = [int(count_fn(x)) if count_fn is not None else batch_size(x) for x in rest]
            self._write_log(m, batch, dropped, ends, latencies)
        result = StepResult(
            step=self.step, computed_micro_batches=started, dropped_micro_batches=m - started, samples=samples,
            counts=reduced.samples, started=reduced.started, divisor=d, compute_ns=ends[-1] if ends else 0,
            latencies_ns=latencies, _buffers=[f for f, _ in self.grads.buffers],
        )
        self.step += 1
        return result

    def _report(self, walk: StepWalk, i: int, marks: List[Any], ends: List[int]) -> None:
        end = self.clock.read(marks[i])
        ends.append(end)
        walk.ended(i, end, max(end - (ends[i - 1] if i else 0), 0), self.estimator)

    def _divisor(self, m: int) -> Callable[[List[int]], Optional[float]]:
        def of(counts: List[int]) -> Optional[float]:
            return divisor(np.asarray(counts, dtype=np.uint64), self.normalization,  # type: ignore[arg-type]
                           micro_batches=self.micro_batches_per_step or m,
                           micro_batch_size=max(self.micro_batch_size, 1))

        return of

    def _write_log(self, m: int, batch: List[int], dropped: List[int], ends: List[int], latencies: List[int]) -> None:
        """This step's rows: one per micro-batch, the not-started ones marked dropped (their size:
        counted when the input is a sequence, else ``micro_batch_size``)."""
        assert self._log is not None
        done = 0
        for i, (e, lat) in enumerate(zip(ends, latencies)):
            done += batch[i]
            self._log.write(global_step=self.step, local_step=i, world_size=self.world_size, batch=batch[i],
                            computed_batch=done, compute_dropped=False, rank=self.rank, start_ns=e - lat,
                            duration_ns=lat)
        for j in range(len(ends), m):
            self._log.write(global_step=self.step, local_step=j, world_size=self.world_size,
                            batch=dropped[j - len(ends)] if j - len(ends) < len(dropped) else max(self.micro_batch_size, 1),
                            computed_batch=done, compute_dropped=True,
                            rank=self.rank, start_ns=0, duration_ns=0)
        self._log.flush()

    def close(self) -> None:
        """Flushes and closes the compute log and removes the gradient hooks."""
        if self._log is not None:
            self._log.close()
            self._log = None
        self.grads.remove_hooks()


def _sum_checked(loss: torch.Tensor, rank: int, step: int, i: int) -> torch.Tensor:
    """The scalar to backward: the sum of per-sample losses; refuses a scalar mean."""
    if loss.dim() > 0:
        return loss.sum()
    fn = loss.grad_fn
    if fn is None:
        raise ValueError(f"rank {rank}: step {step}: micro-batch {i}: loss_fn returned a tensor without a graph")
    name = type(fn).__name__
    if name.startswith("Mean") or getattr(fn, "_saved_reduction", None) == 1:
        raise ValueError(
            f"rank {rank}: step {step}: micro-batch {i}: loss_fn returned a mean ({name}); return the per-sample "
            "losses or their sum (reduction='sum'): the divisor makes the mean over the computed samples"
        )
    return loss


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None
