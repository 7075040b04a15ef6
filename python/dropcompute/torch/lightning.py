"""DropCompute in PyTorch Lightning (``lightning`` >= 2.0; this module is imported only by its
users: ``dropcompute.torch`` imports without Lightning).

Owns: ``DropComputeModule``, a ``LightningModule`` mixin whose ``training_step`` runs one
DropCompute step with manual optimization, and ``dropcompute_steps`` (the training
"dataloader": one lazy step token per Lightning batch, dealt by ``DropComputeSampler``). Must
not touch: the step loop, its decisions, the divisor and the collectives
(``DropComputeStep``), the dealing (``DropComputeSampler`` through ``loader``).

How a fit runs (``Trainer(strategy="ddp", ...)``, the module ``class Net(DropComputeModule,
L.LightningModule)``):

- ``automatic_optimization`` is False (manual optimization): Lightning calls ``training_step``
  once per step with a ``loader.PendingStep``; the mixin deals it (``take``), runs
  ``DropComputeStep.run`` over the step's micro-batches with ``self.dropcompute_loss(mb)``,
  settles the sampler (not-started micro-batches are dealt again), calls
  ``on_dropcompute_step(result)``, then steps ``self.optimizers()`` and ``self.lr_schedulers()``
  through ``StepResult.apply`` (the scheduler only when the optimizer stepped). Each
  micro-batch's backward goes through ``self.manual_backward`` (the precision plugin's scaler).
- With the DDP strategy, Lightning runs ``training_step`` INSIDE the DDP module's forward, and
  ``manual_backward`` arms DDP's reducer (Lightning's ``prepare_for_backward`` in
  ``DDPStrategy.pre_backward``) whenever the DDP module's ``require_backward_grad_sync`` is on:
  every micro-batch's backward would then run DDP's own bucket all-reduce, and DropCompute's
  reduce would sum the gradients a second time (measured: ``test_lightning.py``'s control, a
  step over the LightningModule instead of the DDP module). So ``DropComputeStep``'s model is
  the strategy's DDP module: its flat path runs every backward under that module's
  ``no_sync`` (the switch ``pre_backward`` reads), and DDP's reducer never runs (the test counts
  DDP's comm-hook calls: 0). DDP's post-forward does not arm it either: Lightning turns the sync
  off between ``training_step``'s return and DDP's post-forward under manual optimization
  (``_DDPForwardRedirection``, lightning 2.x).
- ``mode="overlap"`` (in ``dropcompute_step_kwargs``): every micro-batch but the last still runs
  under that ``no_sync``; the last one's ``manual_backward`` runs with the sync on, so
  Lightning's ``pre_backward`` arms DDP's reducer (``prepare_for_backward``) and DDP's bucketed
  all-reduce runs during that backward through the step's rescaling comm hook, once per step
  (tested: one bucket per step, the same parameters as plain Lightning). The hook is registered
  on the strategy's DDP module at the first step: DDP takes one comm hook, so pass yours as
  ``comm_hook`` in ``dropcompute_step_kwargs`` instead of registering it (or Lightning's
  ``ddp_comm_hook``) yourself.
- One Lightning epoch runs the sampler's whole stream (a step may straddle a data epoch's
  end): use ``max_epochs=1`` and the sampler's ``epochs``. Lightning fetches one batch ahead,
  so it sees one empty token after the stream ends (no step, no optimizer step).

Trainer settings: ``use_distributed_sampler=False`` (the sampler deals), the DDP strategy
with ``broadcast_buffers=False`` for a model with buffers (ranks run different numbers of
forwards), ``accumulate_grad_batches`` 1 and no ``gradient_clip_val`` (Lightning refuses
both under manual optimization; clip in ``on_dropcompute_step``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from .. import Policy
from .data import DropComputeSampler
from .loader import DropComputeLoader, PendingStep
from .step import DropComputeStep, StepResult


def dropcompute_steps(
    dataset: Any,
    sampler: DropComputeSampler,
    *,
    collate_fn: Optional[Callable[[List[Any]], Any]] = None,
) -> Any:
    """The training "dataloader" for ``trainer.fit(module, train_dataloaders=...)``: lazy step
    tokens (``loader.PendingStep``) over ``dataset`` (map-style) as ``sampler`` deals it;
    ``collate_fn`` as in ``loader.DropComputeLoader`` (the module's device is applied when a
    step is dealt). Raises TypeError for a ``sampler`` that is not a ``DropComputeSampler``."""
    return DropComputeLoader(dataset, sampler, collate_fn=collate_fn).pending_steps()


class DropComputeModule:
    """Mixin for a ``LightningModule`` (list it first: ``class Net(DropComputeModule,
    L.LightningModule)``). Set ``self.dropcompute_policy`` (a ``dropcompute.Policy``, identical
    on every rank) in ``__init__``; optionally ``self.dropcompute_step_kwargs`` (passed to
    ``DropComputeStep``: ``micro_batches_per_step``, ``normalization``, ``sync_lag``,
    ``compute_log``, ``mode`` ("auto" by default, "flat" or "overlap": module doc), ``comm_hook``,
    ``sampler`` (the ``DropComputeSampler`` given to ``dropcompute_steps``: its dealing joins the
    first step's configuration check), ...; not ``backward_fn``, ``device``). Implement
    ``dropcompute_loss(micro_batch)``: the micro-batch's per-sample losses (shape ``(b,)``) or
    their SUM (not the mean). ``configure_optimizers`` as usual (one optimizer; a scheduler is
    stepped once per optimizer step, whatever its ``interval``).

    ``training_step`` raises TypeError when the batch is not a ``PendingStep`` (use
    ``dropcompute_steps``), ValueError when the policy is missing or Lightning is set to
    accumulate, and what ``DropComputeStep.run`` raises."""

    dropcompute_policy: Optional[Policy] = None
    dropcompute_step_kwargs: Dict[str, Any] = {}
    _dropcompute: Optional[DropComputeStep] = None

    @property
    def automatic_optimization(self) -> bool:
        """Always False: DropCompute steps the optimizer (manual optimization)."""
        return False

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        if value:
            raise ValueError("automatic_optimization: True: DropComputeModule runs manual optimization")

    def dropcompute_loss(self, micro_batch: Any) -> torch.Tensor:
        """This micro-batch's per-sample losses or their sum (implement it)."""
        raise NotImplementedError("DropComputeModule: implement dropcompute_loss(micro_batch)")

    def on_dropcompute_step(self, result: StepResult) -> None:
        """Called after the step's reduce, before the optimizer step (``.grad`` holds the mean
        gradient over the computed samples): log, clip. Default: nothing."""

    def _dropcompute_model(self) -> Any:
        """The model ``DropComputeStep`` runs: the strategy's DDP module (its ``no_sync`` keeps
        ``manual_backward`` from arming DDP's reducer; see the module doc), else this module."""
        model = getattr(self, "trainer").strategy.model
        return model if model is not None and hasattr(model, "no_sync") else self

    def _dropcompute_step(self) -> DropComputeStep:
        if self._dropcompute is not None:
            return self._dropcompute
        if self.dropcompute_policy is None:
            raise ValueError("dropcompute_policy: None: set self.dropcompute_policy = dropcompute.Policy(...) in __init__")
        kw = dict(self.dropcompute_step_kwargs)
        for k in ("backward_fn", "device"):
            if k in kw:
                raise ValueError(f"dropcompute_step_kwargs[{k!r}]: set by DropComputeModule; do not pass it")
        trainer: Any = getattr(self, "trainer")
        accumulate = getattr(trainer, "accumulate_grad_batches", 1)
        if accumulate != 1:
            raise ValueError(f"trainer.accumulate_grad_batches: {accumulate}: must be 1 (DropCompute owns the step)")
        self._dropcompute = DropComputeStep(self._dropcompute_model(), self.dropcompute_policy, backward_fn=self.manual_backward,  # type: ignore[attr-defined]
                                            device=self.device, **kw)  # type: ignore[attr-defined]
        return self._dropcompute

    def training_step(self, batch: Any, batch_idx: int = 0) -> None:
        """One DropCompute step over the token ``batch`` (see the class doc)."""
        self.dropcompute_training_step(batch)

    def dropcompute_training_step(self, pending: Any) -> Optional[StepResult]:
        """Deals ``pending`` (a ``loader.PendingStep``), runs the step, settles the sampler,
        calls ``on_dropcompute_step`` and steps the optimizer and scheduler. Returns the step's
        result, or None for the token after the stream's end."""
        if not isinstance(pending, PendingStep):
            raise TypeError(f"batch: {type(pending).__name__}: must be a PendingStep (train on dropcompute_steps(...))")
        step = self._dropcompute_step()
        pending._loader.device = self.device  # type: ignore[attr-defined]
        micro_batches = pending.take()
        if micro_batches is None:
            return None
        result = step.run(micro_batches, lambda _module, mb: self.dropcompute_loss(mb))
        pending.settle(result)
        self.on_dropcompute_step(result)
        opt: Any = self.optimizers()  # type: ignore[attr-defined]
        if isinstance(opt, list):
            raise ValueError(f"configure_optimizers: {len(opt)} optimizers: DropComputeModule steps one")
        sched: Any = self.lr_schedulers()  # type: ignore[attr-defined]
        if isinstance(sched, list):
            raise ValueError(f"configure_optimizers: {len(sched)} schedulers: DropComputeModule steps one")
        scaler = getattr(getattr(self, "trainer").precision_plugin, "scaler", None)
        result.apply(opt, scaler=scaler, scheduler=sched, optimizer_owns_scaler=scaler is not None)
        return result

    def on_train_end(self) -> None:
        """Closes the DropCompute step (its compute log, its gradient hooks)."""
        if self._dropcompute is not None:
            self._dropcompute.close()
            self._dropcompute = None
