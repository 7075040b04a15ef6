"""DropCompute in a Hugging Face Accelerate training loop (``accelerate`` >= 1.0, imported lazily:
``dropcompute.torch`` imports without it).

Owns: ``AcceleratedDropCompute``, the glue between ``accelerator.prepare``'s objects and
``DropComputeStep``: the backward of every micro-batch goes through ``accelerator.backward``
(Accelerate's GradScaler for fp16 applies; its autocast is already on the prepared model's
forward), the optimizer steps through the prepared ``AcceleratedOptimizer`` (which runs the
scaler itself, so the scaler backs off on an overflow exactly as in a plain Accelerate loop),
the prepared LR scheduler only when the optimizer stepped. Must not touch: the step loop, its
decisions, the divisor and the collectives (``DropComputeStep``), the dealing
(``DropComputeSampler`` through ``loader.DropComputeLoader``).

DropCompute owns the accumulation boundary: a step is all of a rank's micro-batches, reduced
once. So the Accelerator's ``gradient_accumulation_steps`` must be 1 and ``accumulate()`` must
not wrap the step (refused with ValueError / RuntimeError): Accelerate would otherwise divide
each loss by its step count and skip ``optimizer.step()`` on its own schedule. Supported
distributed types: NO, MULTI_CPU and the MULTI_<device> DDP ones (not DeepSpeed, FSDP,
Megatron-LM or XLA, whose gradient reduce is not DDP's).

A plain Accelerate loop and its DropCompute form (the data: a ``DropComputeSampler`` instead
of ``accelerator.prepare(dataloader)``, which would shard the data a second time)::

    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    sampler = DropComputeSampler(len(dataset), b, M, rank=accelerator.process_index,
                                 world_size=accelerator.num_processes, epochs=3)
    dc = AcceleratedDropCompute(accelerator, model, Policy(threshold_ns, warmup_steps=5), sampler=sampler)
    for micro_batches in (loader := DropComputeLoader(dataset, sampler, device=accelerator.device)):
        result = dc.run(micro_batches, lambda m, mb: F.cross_entropy(m(mb[0]), mb[1], reduction="sum"))
        loader.settle(result)
        dc.apply(result, optimizer, scheduler)

(the loss is the per-sample SUM or vector, not the mean: the divisor makes the mean over the
computed samples; ``optimizer.zero_grad()`` is not needed: every step starts from zeroed
gradients).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from .. import Policy
from .step import DropComputeStep, StepResult

#: Distributed types whose gradient reduce is DDP's (or none): DropCompute's flat path applies.
_SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_NPU", "MULTI_XPU",
              "MULTI_HPU", "MULTI_NEURON")


class AcceleratedDropCompute:
    """``DropComputeStep`` over an Accelerate-prepared model.

    ``accelerator``: the ``accelerate.Accelerator`` (``gradient_accumulation_steps`` 1).
    ``model``: what ``accelerator.prepare`` returned for the model (a DDP module when
    ``accelerator.num_processes`` > 1). ``policy``: the job's ``dropcompute.Policy``.
    ``step_kwargs``: passed to ``DropComputeStep`` (``mode``: "auto", "flat", or "overlap" with the
    prepared DDP module: DDP's bucketed all-reduce during the last micro-batch's backward,
    tested against the plain Accelerate loop; ``normalization``,
    ``micro_batch_size``, ``micro_batches_per_step``, ``sync_lag``, ``compute_log``, ...; not
    ``backward_fn`` or ``device``, set here from the accelerator).

    Raises TypeError when ``accelerator`` is not an ``accelerate.Accelerator``; ValueError
    naming the argument for ``gradient_accumulation_steps`` != 1, an unsupported
    ``distributed_type``, or a model that is not the prepared one (and DropComputeStep's own
    refusals, e.g. DDP's ``broadcast_buffers`` with a model that has buffers: pass
    ``DistributedDataParallelKwargs(broadcast_buffers=False)`` to the Accelerator)."""

    def __init__(self, accelerator: Any, model: torch.nn.Module, policy: Policy, **step_kwargs: Any) -> None:
        try:
            accelerator_cls = importlib.import_module("accelerate").Accelerator  # lazy; untyped package
        except ImportError as e:  # pragma: no cover (the tests run with accelerate)
            raise ImportError("dropcompute.torch.accelerate needs the accelerate package (pip install accelerate)") from e
        if not isinstance(accelerator, accelerator_cls):
            raise TypeError(f"accelerator: {type(accelerator).__name__}: must be an accelerate.Accelerator")
        for k in ("backward_fn", "device"):
            if k in step_kwargs:
                raise ValueError(f"{k}: set by AcceleratedDropCompute from the accelerator; do not pass it")
        dtype = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
        if dtype not in _SUPPORTED:
            raise ValueError(
                f"accelerator.distributed_type: {dtype}: not supported (its gradient reduce is not DDP's); "
                f"supported: {', '.join(_SUPPORTED)}"
            )
        if accelerator.num_processes > 1 and not hasattr(model, "no_sync"):
            raise ValueError(
                f"model: {type(model).__name__}: with {accelerator.num_processes} processes pass the model "
                "accelerator.prepare returned (a DistributedDataParallel module)"
            )
        self.accelerator = accelerator
        self._check_accumulation("construction")
        self.step = DropComputeStep(model, policy, backward_fn=accelerator.backward, device=accelerator.device,
                                    **step_kwargs)

    def _check_accumulation(self, when: str) -> None:
        gas = self.accelerator.gradient_accumulation_steps
        if gas != 1:
            raise ValueError(
                f"accelerator.gradient_accumulation_steps: {gas}: must be 1 (at {when}): DropCompute owns the "
                "accumulation boundary (one step = all of a rank's micro-batches); set it to 1 and give the "
                "micro-batches of a step to run()"
            )

    def run(
        self,
        micro_batches: Iterable[Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        count_fn: Optional[Callable[[Any], int]] = None,
    ) -> StepResult:
        """One step (``DropComputeStep.run``): each launched micro-batch's loss (``loss_fn(module,
        mb)``, per-sample losses or their sum; ``module``: the prepared model's inner module, its
        forward under Accelerate's autocast) goes backward through ``accelerator.backward``.

        Raises ValueError when ``gradient_accumulation_steps`` was changed from 1, RuntimeError
        (rank and step) when called inside ``accelerator.accumulate()`` on a non-syncing
        micro-step; otherwise as ``DropComputeStep.run``."""
        self._check_accumulation(f"step {self.step.step}")
        if not self.accelerator.sync_gradients:
            raise RuntimeError(
                f"rank {self.step.rank}: step {self.step.step}: accelerator.sync_gradients is False (inside "
                "accelerator.accumulate()?): the prepared optimizer would skip its step; run DropCompute steps "
                "outside accumulate()"
            )
        return self.step.run(micro_batches, loss_fn, count_fn)

    def apply(self, result: StepResult, optimizer: Any, scheduler: Any = None) -> bool:
        """Steps the prepared ``optimizer`` (its ``AcceleratedOptimizer.step`` runs the
        accelerator's GradScaler, when there is one) and then the prepared ``scheduler`` only
        when the optimizer stepped (``StepResult.apply``). Returns whether it stepped: False when
        no rank computed anything, the gradient is not finite (the scaler backed off), or the
        scaler skipped the step."""
        scaler = getattr(self.accelerator, "scaler", None)
        return result.apply(optimizer, scaler=scaler, scheduler=scheduler, optimizer_owns_scaler=scaler is not None)

    def state_dict(self) -> Dict[str, Any]:
        """The step's state (``DropComputeStep.state_dict``), for a checkpoint."""
        return self.step.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores ``state_dict()``'s state (``DropComputeStep.load_state_dict``)."""
        self.step.load_state_dict(state)

    def close(self) -> None:
        """Closes the step (its compute log, its gradient hooks)."""
        self.step.close()
