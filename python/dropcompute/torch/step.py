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

Step policies (``step_policy=dropcompute.StepPolicy(...)``: synchronous, drop-before,
drop-predictive, rebalance, rebalance-drop, compute-budget, backup-workers; whole micro-batches
only): each rank holds a replica of the crate's ``Assigner`` (``policy::assign::Assigner``, the
Rust scheduler's and the simulator's) and walks at most its own entry of
``DropComputeStep.assignment()`` with the deadline the policy runs under
(``StepPolicy.deadline``). Pass ``sampler.take(step.assignment())`` so the data follows the
assignment. The replicas are fed every rank's per-micro-batch latencies, gathered exactly in
the count collective, so every rank computes the same next assignment. Policies that learn from
latencies (backup-workers, rebalance, rebalance-drop), the retuner and the straggler tracker
need mode="flat": in overlap mode the last micro-batch's measured time includes DDP's
all-reduce, which waits for the slowest rank (every rank would look as slow as it), so they are
refused there. Backup workers (b) run the crate's rule: the b ranks predicted slowest are assigned
0 micro-batches; they compute nothing, contribute a zero gradient, and their samples are not in
the divisor.

``retuner=dropcompute.Retuner(N, M, ...)`` and ``stragglers=dropcompute.StragglerTracker(N)``
are fed every step from the same gathered latencies (the retuner with the step time as the
slowest rank's compute phase), so the retuned threshold is identical on every rank; it is used
from the next step on (``StepResult.threshold_ns``: the threshold a step ran with).

The drop-rate guard (``Policy(..., drop_guard=0.10)``): the step keeps the crate's
``DropGuard`` (``policy::DropGuard``, the rule the replay and the tuner run), fed after every
step with the step's global micro-batches handed out and started (the count collective carries
both, so every rank holds the same counts). Before a step it is asked with the micro-batches
the step hands out (the sum of ``assignment()``, or N·``micro_batches_per_step``; without
either, the previous step's global count); when it says no the step runs with the threshold off
(``StepResult.guard_enforced`` False, ``threshold_ns`` None), identically on every rank. The
Python face counts micro-batches (a run that counts tokens is guarded in micro-batches); a step
policy whose deadline is no drop threshold (``StepPolicy.drops`` False: compute-budget) runs
unguarded, as in the crate.
"""

from __future__ import annotations

import contextlib
import datetime
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from .. import (Assigner, ComputeLogWriter, DropGuard, LatencyEstimator, Policy, Retuner, StepPolicy, StepWalk,
               StragglerTracker, divisor)
from .args import count, opt_count
from .clock import DeviceClock
from .gaudi import bridge_for
from .data import DropComputeSampler, batch_size
from .overlap import OverlapReduce, overlap_pays, overlap_refusal, zero_grads
from .reduce import Counts, FlatGradients, agree, found_flag, group_timeout, reduce_flat, scale_checked_


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
    #: The deadline this step's walk ran with (ns; None: off; not applied in warm-up steps): the
    #: policy's threshold, the step policy's (its budget, or off), or the retuner's.
    threshold_ns: Optional[int] = None
    #: The micro-batches each rank was assigned this step (by rank); None without a step policy.
    assignment: Optional[List[int]] = None
    #: Every rank's mean latency per computed micro-batch (ns, NaN for none), gathered: what the
    #: assigner, the straggler tracker and the retuner were fed. None when nothing needed it.
    rank_latency_ns: Optional[List[float]] = None
    #: The retuner's event of this step (``Retuner.on_step``'s dict), None otherwise.
    retune: Optional[Dict[str, Any]] = None
    #: Whether the step ran with the threshold in force as far as the drop-rate guard goes
    #: (``Policy.drop_guard``): False when the guard held it off (the step ran with the threshold
    #: off, identically on every rank); True without a guard.
    guard_enforced: bool = True
    #: The gradient buffers (the flat path's buffers, the overlap path's ``.grad``), for the
    #: finiteness check of ``apply`` when ``_found`` is None.
    _buffers: List[torch.Tensor] = field(default_factory=list, repr=False)
    #: The non-finite flag the rescale set while scaling the buffers (``reduce.scale_checked_``):
    #: when present, ``finite`` reads it instead of passing over the buffers again.
    _found: Optional[torch.Tensor] = field(default=None, repr=False)
    #: Intel Gaudi's bridge (lazy mode: a step marker after the optimizer step).
    _bridge: Any = field(default=None, repr=False)

    @property
    def skipped(self) -> bool:
        """True when no rank computed anything: there is no gradient to step with."""
        return self.divisor is None

    def finite(self) -> bool:
        """Whether the reduced gradient is finite (identical on every rank: the all-reduce sums
        every rank's gradient). ``run`` checks the gradient while rescaling it, in the same pass
        (``reduce.scale_checked_``), so this reads one flag. Without the flag (overlap mode at
        factor 1, where nothing is rescaled, or a result built by hand): one fused check of
        every buffer (``reduce.scale_checked_`` with factor 1), one pass. A float64 sum of every
        buffer cost 245 ms per step at 50 M parameters on the CI machine, 16 % of the step; a
        sum in the buffer's dtype 26-40 ms; the flag nothing."""
        if self._found is not None:
            return not bool(self._found.item())
        if not self._buffers:
            return True
        found = found_flag(self._buffers[0].device)
        scale_checked_(self._buffers, 1.0, found)
        return not bool(found.item())

    def optimizer_may_step(self, scaler: Any = None) -> bool:
        """Whether the optimizer may step on this gradient: False when no rank computed anything,
        or, without ``scaler``, when the gradient is not finite; with a scaler True otherwise (the
        scaler then decides: it skips a non-finite gradient and backs off). What ``apply`` and a
        loop that steps the optimizer itself (the Hugging Face ``Trainer``) both go by."""
        if self.skipped:
            return False
        return scaler is not None or self.finite()

    def apply(self, optimizer: torch.optim.Optimizer, scaler: Any = None, scheduler: Any = None, *,
              optimizer_owns_scaler: bool = False) -> bool:
        """Steps ``optimizer`` (through ``scaler``, a ``torch.amp.GradScaler``, when given) and
        then ``scheduler`` only when the optimizer stepped. Returns whether it stepped.
        ``optimizer_owns_scaler``: the optimizer's own ``step()`` runs ``scaler.step`` and
        ``scaler.update`` (Accelerate's ``AcceleratedOptimizer``, Lightning's mixed-precision
        plugin behind ``LightningOptimizer``): only ``optimizer.step()`` is called here, and
        "stepped" is read from ``scaler``'s scale as below. Raises ValueError when it is set
        without a ``scaler``.

        Not stepped: when no rank computed anything (the scaler is left untouched: it saw no
        gradient), or when the gradient is not finite (with a scaler: the scaler skips the
        optimizer and backs off its scale exactly as under plain DDP; without one: checked
        here). With a scaler, "stepped" is read as the scale not decreasing across
        ``update()`` (the scaler's own signal; Hugging Face's Trainer reads it the same way)."""
        if optimizer_owns_scaler and scaler is None:
            raise ValueError("scaler: None: optimizer_owns_scaler=True reads the scaler's scale; pass it")
        if self.skipped:
            return False
        if scaler is not None:
            before = scaler.get_scale()
            if optimizer_owns_scaler:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            stepped = bool(scaler.get_scale() >= before)
        else:
            stepped = self.optimizer_may_step()
            if stepped:
                optimizer.step()
        if stepped and scheduler is not None:
            scheduler.step()
        if self._bridge is not None:
            self._bridge.boundary()  # lazy mode: the optimizer step's graph ends here
        return stepped


#: The reduce paths ``DropComputeStep(mode=...)`` takes.
MODES = ("auto", "flat", "overlap")


def check_mode(mode: Any) -> None:
    """Raises ValueError unless ``mode`` is one of ``MODES`` (the step's check, also run by the
    integrations' configurations when they are made)."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r}: must be one of {', '.join(repr(m) for m in MODES)}")


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
    ``mode``: "flat" (one in-place all-reduce per gradient dtype after the compute phase;
    ``reduce``), "overlap" (DDP's own bucketed all-reduce during the last micro-batch's
    backward, the gradient rescaled by the global count afterwards: ``overlap``; needs a DDP
    module, ``sync_lag`` >= 1, its default there, and no step policy, retuner or tracker that
    learns from latencies: ``overlap.overlap_refusal``) or "auto" (the default: overlap when it
    can run and the gradients exceed one DDP bucket, ``overlap.overlap_pays``, or a
    ``comm_hook`` is given; else flat; ``self.mode`` says which). ``comm_hook``/``comm_state``:
    the user's DDP comm hook in overlap mode (e.g. ``bf16_compress_hook``), composed with the
    rescale (without one DDP's built-in all-reduce runs).
    ``backward_fn(scaled_loss)``: runs the backward of each micro-batch's scaled loss (default
    ``scaled_loss.backward()``); an integration passes its stack's own, e.g.
    ``accelerator.backward`` (its GradScaler) or Lightning's ``manual_backward``. It must call
    backward exactly once on the tensor it is given (scaling it by a constant, e.g. a
    GradScaler's scale, is fine: ``apply`` unscales through the scaler).
    ``step_policy``: a ``dropcompute.StepPolicy`` (module doc; needs ``micro_batches_per_step``,
    whole micro-batches: ``tail_split`` 1). ``retuner``: a ``dropcompute.Retuner(N, M)``
    re-tuning the drop threshold in the step (only without a step policy or with drop-before /
    drop-predictive). ``stragglers``: a ``dropcompute.StragglerTracker(N)`` fed every step.
    ``sampler``: the ``DropComputeSampler`` that deals this step's micro-batches: its
    configuration (samples, micro-batch size, world size, seed, epochs) joins the one-time
    configuration check, so ranks dealing differently (e.g. ``seed=rank``: samples computed
    twice, others never) are refused at the first step.

    Raises ValueError naming the argument for a bad value or a combination that cannot work."""

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
        mode: str = "auto",
        comm_hook: Optional[Callable[..., Any]] = None,
        comm_state: Any = None,
        backward_fn: Optional[Callable[[torch.Tensor], Any]] = None,
        step_policy: Optional[StepPolicy] = None,
        retuner: Optional[Retuner] = None,
        stragglers: Optional[StragglerTracker] = None,
        sampler: Optional[DropComputeSampler] = None,
    ) -> None:
        if normalization not in ("realized", "nominal"):
            raise ValueError(f"normalization: {normalization!r}: must be 'realized' or 'nominal'")
        micro_batch_size = count("micro_batch_size", micro_batch_size, 0)
        if normalization == "nominal" and micro_batch_size <= 0:
            raise ValueError("micro_batch_size: must be > 0 with normalization='nominal'")
        micro_batches_per_step = opt_count("micro_batches_per_step", micro_batches_per_step, 1)
        sync_lag = opt_count("sync_lag", sync_lag, 0)
        check_mode(mode)
        inner = getattr(model, "module", model)
        if getattr(model, "broadcast_buffers", False) and any(True for _ in inner.buffers()):
            raise ValueError("model.broadcast_buffers: must be False (ranks run different numbers of forwards)")
        self.model = model
        self.params = [p for p in inner.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model: no parameter requires a gradient")
        if backward_fn is not None and not callable(backward_fn):
            raise TypeError(f"backward_fn: {backward_fn!r}: must be callable")
        self.backward_fn = backward_fn
        self._recent: Any = None
        self.policy = policy
        self.step_policy = step_policy
        self.retuner = retuner
        self.stragglers = stragglers
        if sampler is not None and not isinstance(sampler, DropComputeSampler):
            raise TypeError(f"sampler: {type(sampler).__name__}: must be a DropComputeSampler")
        self._sampler_configuration = sampler.configuration if sampler is not None else None
        self.normalization = normalization
        self.micro_batch_size = micro_batch_size
        self.micro_batches_per_step = micro_batches_per_step
        self.group = group
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self._check_policies()
        refused = overlap_refusal(model, sync_lag, self._latencies_for())
        if mode == "auto" and comm_hook is not None and refused is not None:
            # The hook asked for overlap, which cannot run: name what the user wrote.
            raise ValueError(f"comm_hook: a DDP comm hook runs only in overlap mode, which cannot run here ({refused}); "
                             "drop comm_hook to run the flat path")
        if mode == "auto":
            mode = "overlap" if comm_hook is not None or (refused is None and overlap_pays(model, self.params)) \
                else "flat"
        if mode == "overlap" and refused is not None:
            raise ValueError(refused)
        if mode == "flat" and comm_hook is not None:
            raise ValueError("comm_hook: only mode='overlap' runs DDP's reducer (the flat path has its own "
                             "all-reduce); drop comm_hook or use mode='overlap'")
        #: The reduce path this step runs: "flat" or "overlap" (``mode="auto"`` resolved).
        self.mode = mode
        self.grads = FlatGradients(self.params) if mode == "flat" else None
        self.overlap = OverlapReduce(model, comm_hook, comm_state, group) if mode == "overlap" else None
        #: The deadline the walks run under (the step policy's, ``StepPolicy.deadline``).
        self._walk_policy = step_policy.deadline(policy) if step_policy is not None else policy
        if retuner is not None:
            self._walk_policy = self._retuned()  # the retuner's threshold from the first step
        m_nom = micro_batches_per_step or 1
        self.assigner = (Assigner(step_policy, self.world_size, m_nom, warmup_steps=policy.warmup_steps)
                         if step_policy is not None else None)
        #: Latency slots per rank in the gathered row (the assigner's most micro-batches per rank).
        self._slots = step_policy.slots(m_nom) if step_policy is not None else m_nom
        self._gather = (step_policy is not None and step_policy.learns) or retuner is not None \
            or stragglers is not None
        dev = device if device is not None else self.params[0].device
        self.bridge = bridge_for(dev)
        self.clock = DeviceClock(dev)
        self.sync_lag = sync_lag if sync_lag is not None else (0 if dev.type == "cpu" and mode == "flat" else 1)
        if retuner is not None and retuner.min_micro_batches != self._walk_policy.min_micro_batches:
            raise ValueError(f"retuner: min_micro_batches {retuner.min_micro_batches}: must be the policy's "
                             f"({self._walk_policy.min_micro_batches}): the retuner scores the walk the step runs")
        if retuner is not None and retuner.check != "oracle" and \
                (retuner.check, retuner.sync_lag) != (self._walk_policy.check, self.sync_lag):
            raise ValueError(f"retuner: check {retuner.check!r}, sync_lag {retuner.sync_lag}: must be the step's "
                             f"({self._walk_policy.check!r}, {self.sync_lag}): the retuner replays the check the "
                             "step runs")
        self.estimator = estimator
        self.timeout = timeout if timeout is not None else group_timeout(group)
        self.step = 0
        self._observed_b = 0.0
        self._observed_m = 0
        self._clock_started = False
        self._agreed = False  # whether ``reduce.agree`` compared the configurations (once)
        self._log = ComputeLogWriter(compute_log) if compute_log else None
        #: The drop-rate guard (the crate's rule; module doc), None without ``policy.drop_guard``
        #: or with a step policy whose deadline is no drop threshold (``StepPolicy.drops``).
        bound = policy.drop_guard if step_policy is None or step_policy.drops else None
        self.guard = DropGuard(bound) if bound is not None else None
        #: The previous step's global micro-batches handed out (the guard's estimate without M).
        self._last_handed = 0

    def _check_policies(self) -> None:
        """Refuses the step policy / retuner / tracker combinations that cannot work."""
        sp, rt, n, m = self.step_policy, self.retuner, self.world_size, self.micro_batches_per_step
        if sp is not None:
            if not isinstance(sp, StepPolicy):
                raise TypeError(f"step_policy: {sp!r}: must be a dropcompute.StepPolicy")
            if sp.tail_split != 1:
                raise ValueError(f"step_policy.tail_split: {sp.tail_split}: dropcompute.torch runs whole micro-batches "
                                 "only (tail_split 1)")
        if (sp is not None or rt is not None or self.stragglers is not None) and m is None:
            raise ValueError("micro_batches_per_step: None: a step policy, retuner or straggler tracker needs M")
        if rt is not None:
            if not isinstance(rt, Retuner):
                raise TypeError(f"retuner: {rt!r}: must be a dropcompute.Retuner")
            if sp is not None and sp.kind not in ("drop-before", "drop-predictive"):
                raise ValueError(f"retuner: step policy {sp.kind!r} does not run the DropCompute threshold the retuner "
                                 "tunes (use drop-before, drop-predictive or no step policy)")
            if (rt.world_size, rt.micro_batches) != (n, m):
                raise ValueError(f"retuner: shape ({rt.world_size}, {rt.micro_batches}): must be (world_size, "
                                 f"micro_batches_per_step) = ({n}, {m})")
        st = self.stragglers
        if st is not None:
            if not isinstance(st, StragglerTracker):
                raise TypeError(f"stragglers: {st!r}: must be a dropcompute.StragglerTracker")
            if len(st.hits) != n:
                raise ValueError(f"stragglers: world_size {len(st.hits)}: must be {n}")

    def _latencies_for(self) -> Optional[Tuple[str, str]]:
        """(argument, name) of what needs every rank's micro-batch latencies, or None (what
        ``overlap_refusal`` refuses overlap mode for)."""
        sp = self.step_policy
        return ("step_policy", sp.kind) if sp is not None and sp.learns else \
            ("retuner", "Retuner") if self.retuner is not None else \
            ("stragglers", "StragglerTracker") if self.stragglers is not None else None

    def assignment(self) -> List[int]:
        """Micro-batches each rank runs in the next step (by rank; identical on every rank):
        the assigner's with a step policy, else ``micro_batches_per_step`` each (0 each when
        unset: the caller's list decides). Pass it to ``DropComputeSampler.take``."""
        if self.assigner is not None:
            return list(self.assigner.assignment())
        return [self.micro_batches_per_step or 0] * self.world_size

    def start_clock(self) -> None:
        """Starts the compute clock now (right after ``optimizer.step()``); otherwise ``run``
        starts it on entry. The step object's one-time configuration check (``reduce.agree``)
        runs before the clock starts, here or in the first ``run``: its wait for the peers is no
        compute."""
        self._agree_once()
        self.clock.start()
        self._clock_started = True

    def _agree_once(self) -> None:
        """``reduce.agree`` on this step's configuration fingerprint, once per step object,
        before its first collective (every rank reaches it at the same point)."""
        if not self._agreed:
            agree(rank=self.rank, world_size=self.world_size, fingerprint=self._fingerprint(),
                  device=self.params[0].device, group=self.group, step=self.step, timeout=self.timeout)
            self._agreed = True

    def state_dict(self) -> Dict[str, Any]:
        """The step counter (the warm-up counts steps) and the observed micro-batch count (the
        loss scale's b) for a checkpoint."""
        state: Dict[str, Any] = {"step": self.step, "observed_micro_batch_count": self._observed_b,
                                 "observed_micro_batches": self._observed_m}
        if self.assigner is not None:
            state["assigner"] = self.assigner.state()
        if self.guard is not None:
            state["drop_guard"] = [*self.guard.counts, self._last_handed]
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores ``state_dict()``'s state. Raises ValueError naming the entry for a malformed
        one (a count not an int in [0, 2**63), a micro-batch size not 0 or in [2**-32, inf): the
        observed mean of whole counts over at most 2**32 micro-batches), or one this step's
        configuration could not have written (an assigner checkpoint of another N, M, warm-up
        or step policy, or edited: ``Assigner.restore_conflict``); nothing is restored then
        (every entry is checked before any is applied)."""

        def count(entry: str, x: Any) -> int:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**63:
                raise ValueError(f"{entry}: {x!r}: must be an int in [0, 2**63)")
            return x

        step = count("state['step']", state.get("step"))
        b = state.get("observed_micro_batch_count", 0.0)
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not (b == 0 or 2.0**-32 <= b < float("inf")):
            raise ValueError(f"state['observed_micro_batch_count']: {b!r}: must be 0 or a finite number >= 2**-32")
        mm = count("state['observed_micro_batches']", state.get("observed_micro_batches", 0))
        a = state.get("assigner")
        if (a is None) != (self.assigner is None):
            raise ValueError(f"state['assigner']: {'absent' if a is None else 'present'}: this step "
                             f"{'has' if self.assigner is not None else 'has no'} step policy")
        assigner = self.assigner
        if a is not None:
            try:
                assigner = Assigner.from_state(a)
            except ValueError as e:
                raise ValueError(f"state['assigner']: {e}") from None
            assert self.assigner is not None
            conflict = self.assigner.restore_conflict(assigner)
            if conflict is not None:  # a checkpoint of another configuration (N, M, policy, ...) or edited
                raise ValueError(f"state['assigner']: {conflict}")
        g = state.get("drop_guard")
        if (g is None) != (self.guard is None):
            raise ValueError(f"state['drop_guard']: {'absent' if g is None else 'present'}: this step's policy "
                             f"{'has' if self.guard is not None else 'has no'} drop_guard")
        guard, last_handed = self.guard, self._last_handed
        if g is not None:
            if not (isinstance(g, (list, tuple)) and len(g) == 4):
                raise ValueError(f"state['drop_guard']: {g!r}: must be 4 ints (handed, dropped, reserve, last "
                                 "handed)")
            for i, x in enumerate(g):
                count(f"state['drop_guard'][{i}]", x)
            assert self.guard is not None
            try:
                guard = DropGuard.from_counts(self.guard.bound, (g[0], g[1], g[2]))
            except ValueError as e:
                raise ValueError(f"state['drop_guard']: {g!r}: {e}") from None
            last_handed = g[3]
        self.assigner, self.guard, self._last_handed = assigner, guard, last_handed
        self.step = step
        self._observed_b = float(b)
        self._observed_m = mm

    def _fingerprint(self) -> int:
        """What every rank must share (``reduce.agree`` compares it once): the policy, the
        normalization, b, M and N (a rank's own micro-batch count may differ, e.g. at the end of
        an epoch), the step policy, the resolved mode, the retuner, the tracker, and the count
        collective's layout (the gathered values per rank, the flat path's parameter count) and the
        flat path's gradient buffers (dtype and length: the gradient all-reduces' lengths)."""
        rt = self.retuner
        flat = [] if self.grads is None else [(str(f.dtype), f.numel()) for f, _ in self.grads.buffers]
        layout = (2 + self._slots if self._gather else 0, len(self.grads.used) if self.grads is not None else 0, flat)
        key = (f"{self.policy!r}|{self.normalization}|{self.micro_batch_size}|{self.micro_batches_per_step}|"
               f"{self.world_size}|{self.step_policy!r}|{self.mode}|"
               f"{None if rt is None else (rt.world_size, rt.micro_batches, rt.config)}|{self.stragglers is not None}|"
               f"{layout}|{self._sampler_configuration}")
        return zlib.crc32(key.encode()) & 0x7FFFFFFF

    def _state_fingerprint(self) -> int:
        """What every rank must hold alike between steps (fed the same global numbers): the step
        index, the observed micro-batch size and count, the drop guard's counts and the
        micro-batches last handed out, the threshold in force, the step policy's assigner
        (``Assigner.state``: its next assignment and what it learned): what ``state_dict``
        restores. Differing values mean ranks resumed from different checkpoints; the count
        collective compares them."""
        g = self.guard.counts if self.guard is not None else None
        a = self.assigner.state() if self.assigner is not None else None
        # The micro-batches last handed are the guard's (``_guard_enforces``): state only with it.
        handed = self._last_handed if self.guard is not None else None
        key = (f"{self.step}|{self._observed_b!r}|{self._observed_m}|{g}|{handed}|"
               f"{self._walk_policy.threshold_ns}|{a}")
        return zlib.crc32(key.encode()) & 0x7FFFFFFF

    def _no_sync(self) -> Any:
        ns = getattr(self.model, "no_sync", None)
        return ns() if ns is not None else _Null()

    def run(
        self,
        micro_batches: Iterable[Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        count_fn: Optional[Callable[[Any], int]] = None,
        *,
        buckets: Optional[Sequence[int]] = None,
        tokens: Optional[Sequence[int]] = None,
    ) -> StepResult:
        """One step over ``micro_batches`` (a sequence, or any iterable with
        ``micro_batches_per_step`` set); see the module doc for ``loss_fn``. ``count_fn(mb)``:
        the micro-batch's sample (or token) count (default: ``batch_size(mb)``; per-sample losses
        must then be one per sample). Afterwards the parameters' ``.grad`` hold the rescaled mean
        gradient (``None`` for a parameter no rank used); call ``result.apply(optimizer, ...)``.

        Length buckets (``Policy(kind="length-predictive" or "cost-balance", bucket_lengths=...)``):
        ``buckets[j]``, micro-batch j's bucket (an index into ``policy.bucket_lengths``), and
        ``tokens[j]``, its real tokens, one per micro-batch this rank runs (at least its cap),
        told to the walk before it starts (``StepWalk.set_micro_batches``): the predictive check
        prices each next micro-batch by its bucket's estimate (``estimator`` learns per bucket),
        and with ``tokens`` the counts are tokens (``count_fn`` unused), so the gradient is divided
        by the global started tokens (exact integer count collective).

        Raises ValueError for an iterable without ``len()`` and no ``micro_batches_per_step``,
        one that ends early, a mean loss, ranks with different configurations;
        ``CollectiveTimeout`` (a ``TimeoutError``) when a collective times out, ``CollectiveError``
        (a ``RuntimeError``) when one fails sooner (a rank died), each naming the rank, the step
        and the collective (``reduce.collective``)."""
        mine = self.assignment()[self.rank] if self.assigner is not None else None
        if hasattr(micro_batches, "__len__"):
            m = len(micro_batches)  # type: ignore[arg-type]
        elif mine is not None:
            m = mine
        elif self.micro_batches_per_step is not None:
            m = self.micro_batches_per_step
        else:
            raise ValueError("micro_batches: an iterable without len(); set micro_batches_per_step")
        self._agree_once()  # before the clock (unless ``start_clock`` ran it already)
        if not self._clock_started:
            self.clock.start()
        self._clock_started = False
        overlap = self.overlap is not None
        # Backward of loss * loss_scale, identical on every rank, so the accumulated gradients
        # have DDP's magnitude (mean loss / M, averaged over N): 1 / (N·M·b) on the flat path,
        # 1 / (M·b) in overlap mode (DDP's all-reduce divides by N itself). b and M are the nominal
        # ones (micro_batch_size and micro_batches_per_step; else the previous step's mean
        # micro-batch count and most micro-batches started by a rank, from its count collective:
        # known to every rank alike; 1 before the first step).
        b_nominal = self.micro_batch_size or self._observed_b or 1.0
        m_nominal = self.micro_batches_per_step or self._observed_m or 1
        loss_scale = 1.0 / ((1 if overlap else self.world_size) * m_nominal * b_nominal)
        if overlap:
            assert self.overlap is not None
            self.overlap.rebuild_buckets(self.rank, self.step, self.timeout)
            zero_grads(self.params, self.model)
        else:
            assert self.grads is not None
            self.grads.attach()
        # The flat path runs the inner module: DDP's reducer never runs (under static_graph it
        # asserts when backward passes run under no_sync only). Overlap runs the DDP module.
        module = self.model if overlap else getattr(self.model, "module", self.model)
        source = iter(micro_batches)
        samples = 0
        marks: List[Any] = []
        ends: List[int] = []
        batch: List[int] = []
        counts: Optional[Counts] = None
        divisor_of = self._divisor(m)
        # The rank's cap: its assignment (fewer when the data ran out).
        cap = m if mine is None else min(m, mine)
        if self._gather and cap > self._slots:
            raise ValueError(f"micro_batches: {cap}: at most {self._slots} per rank (the gathered latency slots)")
        enforced = self._guard_enforces()
        walk_policy = self._walk_policy if enforced else _threshold_off(self._walk_policy)
        walk = StepWalk(walk_policy, step=self.step, micro_batches=cap, sync_lag=self.sync_lag)
        if buckets is not None and tokens is None:
            raise ValueError("tokens: None: buckets need each micro-batch's tokens (the divisor counts tokens)")
        all_toks = [_int(f"tokens[{j}]", t) for j, t in enumerate(tokens)] if tokens is not None else None
        toks = all_toks[:cap] if all_toks is not None else None
        if toks is not None:
            walk.set_micro_batches([_int(f"buckets[{j}]", x) for j, x in enumerate(buckets)][:cap]
                                   if buckets is not None else None, toks)
        with contextlib.ExitStack() as flat_no_sync:
            if not overlap:
                flat_no_sync.enter_context(self._no_sync())
            while True:
                kind, value = walk.next(self.estimator)
                if kind == "done":
                    break
                if kind == "wait":
                    if value == 0:
                        # Time before the first micro-batch counts against the deadline.
                        walk.clock_at(self.clock.elapsed_at_start())
                    for i in range(walk.reported(), value):
                        self._report(walk, i, marks, ends)
                    continue
                last = overlap and self._peek_last(walk, marks, ends)
                try:
                    mb = next(source)
                except StopIteration:
                    raise ValueError(f"micro_batches: ended after {value} of {cap} micro-batches") from None
                if overlap:
                    self._recent = mb
                c = toks[value] if toks is not None else _count(mb, count_fn, self.rank, self.step, value)
                batch.append(c)
                samples += c
                with self._no_sync() if overlap and not last else contextlib.nullcontext():
                    if last:
                        # Before the forward: its latency hides behind the forward and the
                        # backward. DDP's forward runs no collective of its own here (the
                        # bucket rebuild, its only one with broadcast_buffers False, runs at
                        # the step's start: ``OverlapReduce.rebuild_buckets``), so every rank
                        # issues the counts, then DDP's buckets, whatever it computed.
                        counts = self._arm(samples, len(marks) + 1, divisor_of, loss_scale, cap)
                    loss = loss_fn(module, mb)
                    _check_length(loss, c if toks is None and count_fn is None else None, self.rank, self.step, value)
                    scaled = _sum_checked(loss, self.rank, self.step, value) * loss_scale
                    self._backward(scaled)
                if self.bridge is not None:
                    self.bridge.boundary()
                marks.append(self.clock.mark())
        started = len(marks)
        assert toks is None or samples == walk.tokens_started(), (samples, walk.tokens_started())
        if overlap and started == 0:
            # Every rank issues DDP's bucket all-reduces: a zero-weighted backward.
            if self._recent is None:
                raise RuntimeError(
                    f"rank {self.rank}: step {self.step}: mode='overlap': this rank launched no micro-batch and has "
                    "none from an earlier step for the zero-weighted backward that joins DDP's all-reduce "
                    "(use min_micro_batches >= 1, or mode='flat')"
                )
            # The same order as a computing rank: the count collective, DDP's forward, the backward.
            counts = self._arm(0, 0, divisor_of, loss_scale, cap)
            zero = _sum_checked(loss_fn(module, self._recent), self.rank, self.step, 0) * 0.0
            # 0 x a non-finite loss is NaN, and so is every gradient it reaches: each
            # parameter's gradient is replaced by exact zeros before DDP reads it.
            handles = [p.register_hook(lambda g: torch.zeros_like(g)) for p in self.params]
            try:
                self._backward(zero)
            finally:
                for h in handles:
                    h.remove()
        if overlap:
            assert counts is not None and self.overlap is not None
            buffers = [p.grad for p in self.params if p.grad is not None]
            reduced, d, found = self.overlap.finish(buffers)
            if d is None:
                for p in self.params:
                    p.grad = None
                buffers = []
        else:
            assert self.grads is not None
            extra: List[int] = []
            if self._gather:
                # Every end read before the counts leave: they carry the latencies.
                for i in range(len(ends), started):
                    ends.append(self.clock.read(marks[i]))
                extra = self._extra(cap, ends)
            counts = Counts(rank=self.rank, world_size=self.world_size, samples=samples, started=started,
                            state=self._state_fingerprint(), used=self.grads.used,
                            device=self.params[0].device,
                            group=self.group, step=self.step, extra=extra, handed=cap)
            found = found_flag(self.params[0].device)
            reduced, d = reduce_flat(self.grads, counts, divisor_of=divisor_of, loss_scale=loss_scale,
                                     group=self.group, timeout=self.timeout, found=found)
            buffers = [f for f, _ in self.grads.buffers]
        # The ends not yet read, after the collectives are issued: the host waits for the last
        # micro-batch only at the step's end.
        for i in range(len(ends), started):
            ends.append(self.clock.read(marks[i]))
        if sum(reduced.started) > 0:
            self._observed_b = sum(reduced.samples) / sum(reduced.started)
            self._observed_m = max(reduced.started)
        if self.guard is not None:
            self.guard.record(reduced.handed, sum(reduced.started), enforced)
        self._last_handed = reduced.handed
        latencies = [e - (ends[i - 1] if i else 0) for i, e in enumerate(ends)]
        if self._log is not None:
            rest = micro_batches[started:] if isinstance(micro_batches, Sequence) else []
            dropped = [_count(x, count_fn, self.rank, self.step, started + j) for j, x in enumerate(rest)] \
                if all_toks is None else all_toks[started:m]
            self._write_log(m, batch, dropped, ends, latencies, walk_policy)
        assignment = self.assignment() if self.assigner is not None else None
        rank_latency, event = self._observe(reduced) if self._gather else (None, None)
        if rank_latency is None and self.assigner is not None:
            self._observe_fixed(reduced)
        result = StepResult(
            step=self.step, computed_micro_batches=started, dropped_micro_batches=m - started, samples=samples,
            counts=reduced.samples, started=reduced.started, divisor=d, compute_ns=ends[-1] if ends else 0,
            latencies_ns=latencies, threshold_ns=walk_policy.threshold_ns, assignment=assignment,
            rank_latency_ns=rank_latency, retune=event, guard_enforced=enforced, _buffers=buffers, _found=found,
            _bridge=self.bridge,
        )
        self.step += 1
        return result

    def _guard_enforces(self) -> bool:
        """The drop-rate guard's decision for this step (True without a guard), asked with the
        micro-batches the step hands out to all ranks, a number every rank knows alike (module
        doc)."""
        if self.guard is None:
            return True
        handed = sum(self.assignment()) if (self.assigner is not None or self.micro_batches_per_step) \
            else self._last_handed
        return bool(self.guard.enforces(handed))

    def _extra(self, cap: int, ends: List[int]) -> List[int]:
        """This rank's gathered values: ``[handed, compute_ns, latency_0 .. latency_{W-1}]``
        (ns; -1 for a slot not started; W the latency slots)."""
        row = [cap, ends[-1] if ends else 0] + [-1] * self._slots
        for i, e in enumerate(ends):
            row[2 + i] = max(e - (ends[i - 1] if i else 0), 0)
        return row

    def _observe(self, reduced: Any) -> Tuple[List[float], Optional[Dict[str, Any]]]:
        """Feeds the gathered latencies (identical on every rank) to the assigner, the straggler
        tracker and the retuner; returns each rank's mean latency per computed micro-batch (NaN
        for none) and the retuner's event. A step in which no rank was handed anything (the end
        of the data) is no step of their statistics, as in the Rust scheduler."""
        rows = reduced.extra
        n = self.world_size
        lat = np.full((n, self._slots), np.nan)
        for r, row in enumerate(rows):
            for j, v in enumerate(row[2:]):
                if v >= 0:
                    lat[r, j] = float(v)
        per_mb = [float(np.nanmean(x)) if np.isfinite(x).any() else float("nan") for x in lat]
        handed = [row[0] for row in rows]
        compute = [row[1] for row in rows]
        if sum(handed) == 0:
            return per_mb, None
        if self.assigner is not None:
            self.assigner.observe(self.step, per_mb)
        if self.stragglers is not None:
            dropped = np.asarray([max(h - s, 0) for h, s in zip(handed, reduced.started)], dtype=np.uint32)
            self.stragglers.observe(dropped, np.asarray(compute, dtype=np.uint64), np.asarray(per_mb, dtype=np.float64))
        event = None
        if self.retuner is not None:
            m = self.micro_batches_per_step or 1
            event = self.retuner.on_step(np.ascontiguousarray(lat[:, :m]), float(max(compute)))
            self._walk_policy = self._retuned()
        return per_mb, event

    def _retuned(self) -> Policy:
        """The deadline for the next step with the retuner's threshold (identical on every
        rank: every replica was fed the same gathered latencies)."""
        assert self.retuner is not None
        p = self.policy
        # Every field of the policy but the threshold (a length policy keeps its kind and buckets).
        tuned = Policy(threshold_ns=self.retuner.threshold_ns, check=p.check, warmup_steps=p.warmup_steps,
                       min_micro_batches=p.min_micro_batches, kind=p.kind, bucket_lengths=p.bucket_lengths or None,
                       drop_guard=p.drop_guard)
        return self.step_policy.deadline(tuned) if self.step_policy is not None else tuned

    def _observe_fixed(self, reduced: Any) -> None:
        """Moves a policy whose assignment does not learn from latencies (synchronous, drop-*,
        compute-budget: a function of the step index and warm-up) to the next step; the NaN
        latencies are not read by these policies."""
        assert self.assigner is not None
        self.assigner.observe(self.step, [float("nan")] * self.world_size)

    def _peek_last(self, walk: StepWalk, marks: List[Any], ends: List[int]) -> bool:
        """Whether the launch the walker just returned is this rank's last (``StepWalk.peek``,
        reporting the older ends it needs; never the launch about to run: sync lag >= 1)."""
        while True:
            kind, upto = walk.peek(self.estimator)
            if kind != "wait":
                return kind == "last"
            if upto == 0:
                walk.clock_at(self.clock.elapsed_at_start())
            for i in range(walk.reported(), upto):
                self._report(walk, i, marks, ends)

    def _arm(self, samples: int, started: int, divisor_of: Any, loss_scale: float, handed: int) -> Counts:
        """Issues the count collective before the last backward and arms the rescale."""
        assert self.overlap is not None
        counts = Counts(rank=self.rank, world_size=self.world_size, samples=samples, started=started,
                        state=self._state_fingerprint(), used=[],
                        device=self.params[0].device, group=self.group,
                        step=self.step, handed=handed)
        self.overlap.arm(counts, divisor_of, loss_scale, self.timeout)
        return counts

    def _backward(self, scaled: torch.Tensor) -> None:
        """``scaled.backward()`` (or ``backward_fn(scaled)``); an error raised in the comm hook (a
        timeout, differing configurations) is re-raised as itself, and in overlap mode a failed
        DDP all-reduce of the step's synced backward as ``CollectiveTimeout`` or
        ``CollectiveError`` (``OverlapReduce.bucket_error``)."""
        try:
            if self.backward_fn is not None:
                self.backward_fn(scaled)
            else:
                scaled.backward()  # type: ignore[no-untyped-call]
        except Exception as e:
            if self.overlap is not None:
                error = self.overlap.error or self.overlap.bucket_error(e)
                if error is not None:
                    raise error from e
            raise

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

    def _write_log(self, m: int, batch: List[int], dropped: List[int], ends: List[int], latencies: List[int],
                   walk_policy: Policy) -> None:
        """This step's rows: one per micro-batch, the not-started ones marked dropped (their size:
        counted when the input is a sequence, else ``micro_batch_size``). Times are on the
        host's monotonic clock (the clock start's host time plus device offsets), with the
        step's clock start and deadline, so ``dropcompute tune`` derives the step overhead."""
        assert self._log is not None
        origin = self.clock.origin_ns
        th = walk_policy.threshold_ns
        deadline = origin + th if th is not None and self.step >= self.policy.warmup_steps else 0
        common = dict(global_step=self.step, world_size=self.world_size, rank=self.rank,
                      micro_batches=self.micro_batches_per_step or m, clock_start_ns=origin, deadline_ns=deadline)
        done = 0
        for i, (e, lat) in enumerate(zip(ends, latencies)):
            done += batch[i]
            self._log.write(local_step=i, batch=batch[i], computed_batch=done, compute_dropped=False,
                            start_ns=origin + e - lat, duration_ns=lat, **common)
        at = origin + (ends[-1] if ends else 0)
        for j in range(len(ends), m):
            b = dropped[j - len(ends)] if j - len(ends) < len(dropped) else max(self.micro_batch_size, 1)
            self._log.write(local_step=j, batch=b, computed_batch=done, compute_dropped=True, start_ns=at,
                            duration_ns=0, **common)
        self._log.flush()

    def close(self) -> None:
        """Flushes and closes the compute log and removes the gradient hooks."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.grads is not None:
            self.grads.remove_hooks()


def _count(mb: Any, count_fn: Optional[Callable[[Any], int]], rank: int, step: int, i: int) -> int:
    """Micro-batch ``i``'s count: ``count_fn(mb)``, else ``batch_size(mb)``. Raises ValueError
    when neither gives a count."""
    if count_fn is not None:
        c = count_fn(mb)
        try:
            return _int("count_fn(micro_batch)", c)
        except (TypeError, ValueError) as e:
            raise type(e)(f"rank {rank}: step {step}: micro-batch {i}: {e}") from None
    try:
        return batch_size(mb)
    except TypeError as e:
        raise ValueError(
            f"rank {rank}: step {step}: micro-batch {i}: its samples cannot be counted ({e}); pass count_fn"
        ) from None


def _int(name: str, value: Any) -> int:
    """``value`` as an integer >= 0 (``args.count``: never a bool, never a truncated float)."""
    return count(name, value, 0)


def _check_length(loss: torch.Tensor, samples: Optional[int], rank: int, step: int, i: int) -> None:
    """Per-sample losses must be one per counted sample (``samples``, from ``batch_size``; None
    when ``count_fn`` or tokens count): a loss of another length (per token, flattened) would
    be divided by a count it does not sum over. Raises ValueError naming ``count_fn``."""
    if samples is not None and loss.dim() > 0 and int(loss.shape[0]) != samples:
        raise ValueError(
            f"rank {rank}: step {step}: micro-batch {i}: loss_fn returned {int(loss.shape[0])} per-sample losses "
            f"for a micro-batch of {samples} samples; return one loss per sample (or their sum), or pass count_fn"
        )


def _threshold_off(p: Policy) -> Policy:
    """``p`` with the threshold off: the deadline of a step the drop-rate guard holds off."""
    return Policy(threshold_ns=None, check=p.check, warmup_steps=p.warmup_steps,
                  min_micro_batches=p.min_micro_batches, kind=p.kind, bucket_lengths=p.bucket_lengths or None,
                  drop_guard=p.drop_guard)


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
