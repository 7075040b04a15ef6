"""DropCompute for one PyTorch DDP gradient-accumulation step (plain Python over the core).

``DropComputeStep.run`` runs the step's micro-batches inside ``DistributedDataParallel.no_sync()``
as the crate's one step walker says (``dropcompute.StepWalk``, i.e. ``policy::walk::RankWalk``,
which the Rust scheduler and the simulator drive too: the deadline of ``dropcompute.Policy``
checked before each micro-batch against the device time at the end of the previous one, the
warm-up, the minimum micro-batches, the predictive estimate), counts the samples computed, then all-reduces the gradients and the
counts in ONE collective: every parameter's gradient flattened into one buffer with 2·N slots
appended (this rank's sample count in slot ``rank``, a non-finite flag in slot ``N + rank``;
every other rank writes zeros there). After the all-reduce every rank holds every rank's
count, calls ``dropcompute.divisor`` (the crate's ``schedule::divisor``) exactly as the Rust
scheduler does, and writes ``sum / divisor`` back into ``p.grad``; the caller then runs its
optimizer. When the global count is zero or some rank's gradient is non-finite, every rank
skips the step (gradients zeroed, ``StepResult.skipped`` True). A rank that computed nothing
issues the same collective with zero gradients, so nobody hangs.

Device time (the event protocol): ``torch.hpu.Event`` on Gaudi, ``torch.cuda.Event`` on CUDA
(a start event recorded when the step's clock starts, an end event recorded and synchronized
at the end of each micro-batch: one host-device synchronization per micro-batch; a micro-batch's
latency is the time from the previous one's end), the host clock (``time.perf_counter_ns``) on CPU, where execution is
synchronous.

Errors: the all-reduce timing out (the process group's timeout: a rank died or never reached
the step) raises ``TimeoutError`` naming the rank and step; other collective errors propagate.

Precision: the fused buffer has the gradients' dtype, so counts are exact up to 2^24 samples
per step with float32 gradients (2^53 with float64).

Requirements: the DDP module must not broadcast buffers in forward
(``broadcast_buffers=False`` or no buffers), because a rank that drops micro-batches runs
fewer forwards than the others and DDP's forward broadcast would then mismatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from . import ComputeLogWriter, LatencyEstimator, Policy, StepWalk, divisor

__all__ = ["DeviceClock", "DropComputeStep", "StepResult", "batch_size"]


class DeviceClock:
    """Compute time since ``start()`` in ns, on the device's timeline.

    ``device`` "cpu" uses the host clock (synchronous execution); "cuda" ``torch.cuda.Event``;
    "hpu" ``torch.hpu.Event`` (Intel Gaudi's PyTorch bridge; not verified here)."""

    def __init__(self, device: torch.device) -> None:
        self.kind = device.type
        self._t0 = 0
        self._start: Any = None
        if self.kind in ("cuda", "hpu"):
            mod = getattr(torch, self.kind)
            self._event_cls = mod.Event
        elif self.kind != "cpu":
            raise ValueError(f"device: {device}: no event protocol (cpu, cuda, hpu)")

    def start(self) -> None:
        """Start the step's compute clock (call right after the previous optimizer step)."""
        if self.kind == "cpu":
            self._t0 = time.perf_counter_ns()
        else:
            self._start = self._event_cls(enable_timing=True)
            self._start.record()

    def elapsed_ns(self) -> int:
        """Compute time since ``start()`` (ns); waits for the device's queued work."""
        if self.kind == "cpu":
            return time.perf_counter_ns() - self._t0
        end = self._event_cls(enable_timing=True)
        end.record()
        end.synchronize()
        return int(self._start.elapsed_time(end) * 1e6)


@dataclass
class StepResult:
    """What one step did. Counts are samples (or what ``count_fn`` returns)."""

    step: int
    computed_micro_batches: int
    dropped_micro_batches: int
    samples: int
    #: Every rank's computed count, by rank.
    counts: List[int]
    #: What the summed gradient was divided by; None when skipped.
    divisor: Optional[float]
    skipped: bool
    #: This rank's compute phase (ns).
    compute_ns: int
    latencies_ns: List[int] = field(default_factory=list)


class DropComputeStep:
    """Runs DDP gradient-accumulation steps under a compute deadline (see the module doc).

    ``model``: a ``DistributedDataParallel`` module (or a plain module when the process group
    has one rank); ``policy``: the job's ``dropcompute.Policy`` (identical on every rank);
    ``normalization``: "realized" (divide by the global computed count) or "nominal"
    (N·M·b, ``micro_batch_size`` needed); ``compute_log``: optional path of this rank's
    compute log (read by ``dropcompute tune``); ``estimator``: for the predictive check.
    Raises ValueError naming the field for bad arguments."""

    def __init__(
        self,
        model: torch.nn.Module,
        policy: Policy,
        *,
        normalization: str = "realized",
        micro_batch_size: int = 0,
        device: Optional[torch.device] = None,
        group: Optional[dist.ProcessGroup] = None,
        compute_log: Optional[str] = None,
        estimator: Optional[LatencyEstimator] = None,
    ) -> None:
        if normalization not in ("realized", "nominal"):
            raise ValueError(f"normalization: {normalization!r}: must be 'realized' or 'nominal'")
        if normalization == "nominal" and micro_batch_size <= 0:
            raise ValueError("micro_batch_size: must be > 0 with normalization='nominal'")
        inner = getattr(model, "module", model)
        if getattr(model, "broadcast_buffers", False) and any(True for _ in inner.buffers()):
            raise ValueError("model.broadcast_buffers: must be False (ranks run different numbers of forwards)")
        self.model = model
        self.params = [p for p in inner.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model: no parameter requires a gradient")
        self.policy = policy
        self.normalization = normalization
        self.micro_batch_size = micro_batch_size
        self.group = group
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.clock = DeviceClock(device if device is not None else self.params[0].device)
        self.estimator = estimator
        self.step = 0
        self._clock_started = False
        self._log = ComputeLogWriter(compute_log) if compute_log else None

    def start_clock(self) -> None:
        """Start the compute clock now (call right after ``optimizer.step()``); otherwise
        ``run`` starts it on entry."""
        self.clock.start()
        self._clock_started = True

    def _no_sync(self) -> Any:
        ns = getattr(self.model, "no_sync", None)
        return ns() if ns is not None else _Null()

    def run(
        self,
        micro_batches: Sequence[Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        count_fn: Optional[Callable[[Any], int]] = None,
    ) -> StepResult:
        """One step: ``loss_fn(model, micro_batch)`` must return the SUM of per-sample losses
        (the divisor turns the summed gradient into the mean over computed samples);
        ``count_fn(micro_batch)`` its sample (or token) count (default: the leading dimension of
        the micro-batch's tensor, or of its first element for a tuple/list, or first value for
        a dict). Returns the step's counts; the
        parameters' ``.grad`` then hold the rescaled gradient (zeros when skipped)."""
        count = count_fn if count_fn is not None else batch_size
        if not self._clock_started:
            self.clock.start()
        self._clock_started = False
        for p in self.params:
            p.grad = None
        m = len(micro_batches)
        samples = 0
        computed = 0
        latencies: List[int] = []
        ends: List[int] = []
        prev = 0
        # The Rust scheduler's own walker decides (the check before micro-batch i sees the end
        # of micro-batch i-1, the warm-up, the minimum, the predictive estimate); the device is
        # synchronized once per micro-batch, at its end.
        walk = StepWalk(self.policy, step=self.step, micro_batches=m)
        with self._no_sync():
            while True:
                kind, value = walk.next(self.estimator)
                if kind == "done":
                    break
                if kind == "wait":
                    if value == 0:
                        # Time before the first micro-batch counts (the clock started at the
                        # previous optimizer step).
                        prev = self.clock.elapsed_ns()
                        walk.clock_at(prev)
                    for i in range(walk.reported(), value):
                        walk.ended(i, ends[i], latencies[i], self.estimator)
                    continue
                mb = micro_batches[value]
                loss = loss_fn(self.model, mb)
                loss.backward()
                samples += int(count(mb))
                computed += 1
                now = self.clock.elapsed_ns()
                lat = max(now - prev, 0)
                latencies.append(lat)
                ends.append(now)
                if self._log is not None:
                    self._log.write(global_step=self.step, local_step=value, world_size=self.world_size,
                                    batch=int(count(mb)), computed_batch=samples, compute_dropped=False,
                                    rank=self.rank, start_ns=prev, duration_ns=lat)
                prev = now
        if self._log is not None:
            for j in range(computed, m):
                self._log.write(global_step=self.step, local_step=j, world_size=self.world_size,
                                batch=int(count(micro_batches[j])), computed_batch=samples,
                                compute_dropped=True, rank=self.rank, start_ns=0, duration_ns=0)
            self._log.flush()
        compute_ns = ends[-1] if ends else 0
        result = self._reduce_and_rescale(samples, m)
        result.computed_micro_batches = computed
        result.dropped_micro_batches = m - computed
        result.compute_ns = compute_ns
        result.latencies_ns = latencies
        self.step += 1
        return result

    def _reduce_and_rescale(self, samples: int, m: int) -> StepResult:
        n = self.world_size
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        dtype = grads[0].dtype
        flat_grads = torch.cat([g.reshape(-1).to(dtype) for g in grads])
        tail = torch.zeros(2 * n, dtype=dtype, device=flat_grads.device)
        tail[self.rank] = float(samples)
        tail[n + self.rank] = 0.0 if bool(torch.isfinite(flat_grads).all()) else 1.0
        flat = torch.cat([flat_grads, tail])
        if n > 1:
            try:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)  # the one collective
            except RuntimeError as e:
                if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                    raise TimeoutError(
                        f"rank {self.rank}: step {self.step}: the gradient + count all-reduce timed out "
                        f"(process group timeout): {e}"
                    ) from e
                raise
        counts = [int(round(float(c))) for c in flat[-2 * n : -n].tolist()]
        nonfinite = [r for r, f in enumerate(flat[-n:].tolist()) if f != 0.0]
        d = None if nonfinite else divisor(
            np.asarray(counts, dtype=np.uint64), self.normalization,  # type: ignore[arg-type]
            micro_batches=m, micro_batch_size=max(self.micro_batch_size, 1),
        )
        offset = 0
        for p in self.params:
            k = p.numel()
            if d is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad = (flat[offset : offset + k] / d).view_as(p).to(p.dtype)
            offset += k
        return StepResult(step=self.step, computed_micro_batches=0, dropped_micro_batches=0, samples=samples,
                          counts=counts, divisor=d, skipped=d is None, compute_ns=0)

    def close(self) -> None:
        """Flush and close the compute log."""
        if self._log is not None:
            self._log.close()
            self._log = None


def batch_size(mb: Any) -> int:
    """Samples in a micro-batch: a tensor's leading dimension, that of the first element of a
    tuple/list or the first value of a dict; else ``len(mb)``."""
    if isinstance(mb, torch.Tensor):
        return int(mb.shape[0])
    if isinstance(mb, (tuple, list)) and mb:
        return batch_size(mb[0])
    if isinstance(mb, dict) and mb:
        return batch_size(next(iter(mb.values())))
    return len(mb)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None

