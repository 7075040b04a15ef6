"""Hugging Face Transformers ``Trainer`` integration: every optimizer step is one
``DropComputeStep.run`` over the rank's M micro-batches.

Owns: ``DropComputeTrainerMixin`` (put it first in the bases of any ``Trainer`` subclass, e.g.
``class MyGaudiTrainer(DropComputeTrainerMixin, GaudiTrainer)``), ``DropComputeTrainer``
(the mixin over ``transformers.Trainer``, built on first use), ``DropComputeConfig`` (the
knobs), ``StepBatch`` (one step's micro-batches, what the train dataloader yields). Must not
touch: the step's decisions, the divisor, the collectives (``DropComputeStep``), the dealing
order (``DropComputeSampler``), or the Trainer's own loop: this module overrides only public
``Trainer`` methods (``train``, ``get_train_dataloader``, ``training_step``,
``floating_point_ops``, ``get_total_train_batch_size``, ``log``) plus
``_track_num_input_tokens``, adds a checkpoint callback, and gates the ``step`` of the
Trainer's optimizer and LR scheduler instances.

How it fits the Trainer's loop. ``M = args.gradient_accumulation_steps`` as the user set it;
the mixin hands the Trainer a copy of ``args`` with ``gradient_accumulation_steps = 1`` (the
Trainer's own accumulation boundary is replaced: one dataloader item is one optimizer step)
and ``ddp_broadcast_buffers = False`` (ranks run different numbers of forwards; refused if the
user set it True). The train dataloader yields one ``StepBatch`` per step: this rank's
micro-batches as dealt by ``DropComputeSampler`` (``per_device_train_batch_size`` samples each,
collated lazily: a micro-batch not started is never collated), ``len()`` = the steps an epoch
takes without drops. ``training_step`` runs ``DropComputeStep.run`` over them (backward through
``accelerator.backward``: a ``GradScaler`` scales the loss as without DropCompute), settles the
sampler (the not-started micro-batches are dealt again, first, next step) and leaves the
rescaled mean gradient in ``.grad``; the Trainer then clips (``args.max_grad_norm``), steps
the optimizer and the LR scheduler, zeroes, counts ``global_step`` and logs as usual. The
optimizer's and the scheduler's ``step`` are skipped when ``StepResult.optimizer_may_step``
says so (no rank computed anything; or, without a scaler, a non-finite gradient; with a
scaler the scaler skips and backs off, and the Trainer skips the scheduler on its signal).

The loss. ``Trainer.compute_loss`` returns the model's MEAN loss over a micro-batch; the step
needs a SUM (its divisor makes the mean over every rank's computed items). The loss given to
the step is ``mean * count_fn(micro_batch)``: ``count_fn`` defaults to the micro-batch's
sample count (``batch_size``: right for sequence classification and any per-sample mean); for
a token-mean loss (causal LM) pass ``count_fn`` counting the label tokens the mean is over
(e.g. ``(mb["labels"][..., 1:] != -100).sum()``). The loss ``training_step`` returns (and
the Trainer logs, averaged over ranks) is ``rank_sum * world_size / divisor``: its rank mean
is the step's mean loss over the computed items. NaN for a step no rank computed anything in
(``args.logging_nan_inf_filter``, on by default, then logs the running average).

Epochs and samples. The sampler is one stream over the run (the crate's dealer, seeded by
``args.data_seed`` or ``args.seed``); each Trainer epoch takes ``len(dataloader)`` steps from
it. Without drops, an epoch is the dealer's epoch when ``N * M`` divides the epoch's
micro-batches (``ceil(len(dataset) / b)``). A dropped micro-batch is dealt again at the front
of the next step, so every sample is computed once per dealer epoch and the dealer's epoch
boundary moves later by the micro-batches dropped; the ones still queued when the Trainer's
step budget (``max_steps``) ends are not computed (``trainer.dropcompute_sampler`` holds the
state). The Trainer's ``global_step``, ``epoch`` fraction and LR schedule count its own steps.

Checkpoints. Each rank writes ``dropcompute_rank{r}.json`` (the sampler's and the step's
``state_dict``) into every Trainer checkpoint directory (a callback's ``on_save``);
``train(resume_from_checkpoint=...)`` reads it back, so the run continues with the same data
stream, warm-up count and loss scale as if never stopped (the mixin positions the stream
itself: the Trainer's batch skipping is turned off for that call; the resumed epoch's
``state.epoch`` fraction counts from the resume). A checkpoint without the file is refused
unless ``args.ignore_data_skip`` (then the stream restarts at epoch 0).

Not covered: ``IterableDataset`` train sets,
DeepSpeed / FSDP (their engines own the gradient reduce), data-loader worker processes (the
micro-batches are collated in the training process, when launched; ``dataloader_num_workers``
is not used), optimum-habana's ``GaudiTrainer`` itself (its loop is expected to call
``training_step`` once per item and ``optimizer.step()`` / ``lr_scheduler.step()`` as the
Trainer does; not installed here, so not tested).
"""

from __future__ import annotations

import copy
import json
import math
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist

from .. import Policy
from .args import count, opt_count
from .data import DropComputeSampler, batch_size
from .step import DropComputeStep, StepResult, check_mode

__all__ = ["DropComputeConfig", "DropComputeTrainerMixin", "StepBatch", "DropComputeTrainer"]


@dataclass
class DropComputeConfig:
    """The DropCompute knobs of a Trainer (pass as ``dropcompute=`` to the trainer's
    constructor, or as a ``dropcompute`` attribute of its ``TrainingArguments``).

    ``policy``: the job's ``dropcompute.Policy`` (default: threshold off), identical on every
    rank. ``mode``: "auto" (default), "flat" or "overlap" (``DropComputeStep``). ``compute_log``: this
    rank's compute log path (``{rank}`` is replaced by the rank; without it, ``.rank{r}`` is
    appended when the world has more than one rank). ``sync_lag``: micro-batches the deadline
    check reads behind (default: the step's, 0 on the CPU in flat mode). ``count_fn(mb) -> int``:
    the items the model's mean loss of micro-batch ``mb`` is over (default: its sample count).
    ``seed``: the dealer's shuffle seed (default ``args.data_seed``, else ``args.seed``)."""

    policy: Optional[Policy] = None
    mode: str = "auto"
    compute_log: Optional[str] = None
    sync_lag: Optional[int] = None
    count_fn: Optional[Callable[[Any], int]] = None
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        if self.policy is not None and not isinstance(self.policy, Policy):
            raise TypeError(f"policy: {type(self.policy).__name__}: must be a dropcompute.Policy")
        check_mode(self.mode)
        opt_count("sync_lag", self.sync_lag, 0)
        opt_count("seed", self.seed, 0)
        if self.count_fn is not None and not callable(self.count_fn):
            raise TypeError(f"count_fn: {self.count_fn!r}: must be callable")


class StepBatch:
    """One optimizer step's micro-batches for this rank: ``ids[i]`` the dataset indices of
    micro-batch i (``per_device_train_batch_size`` of them; fewer at the end of a dataset
    epoch). Iterating collates lazily (``collate([dataset[j] for j in ids[i]])``); ``len()`` is
    the micro-batch count, dealt to this rank (0 allowed: the rank still joins the step).
    ``computed`` holds the micro-batches the step started (as given to the model), after
    ``training_step``. ``in`` is always False (the Trainer's item counting does not apply)."""

    def __init__(self, ids: List[List[int]], dataset: Any, collate: Callable[[List[Any]], Any]) -> None:
        self.ids = ids
        self.dataset = dataset
        self.collate = collate
        self.computed: List[Any] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Any]:
        for ids in self.ids:
            yield self.collate([self.dataset[j] for j in ids])

    def __contains__(self, key: object) -> bool:
        return False

    def __repr__(self) -> str:
        return f"StepBatch(micro_batches={len(self.ids)})"


class _StepLoader:
    """The train "dataloader": ``len()`` steps per Trainer epoch, each a ``StepBatch`` taken
    from the sampler (settled by ``training_step``). Ends early only when the stream ends."""

    def __init__(self, sampler: DropComputeSampler, dataset: Any, collate: Callable[[List[Any]], Any],
                 steps_per_epoch: int, batch_size: int, done_in_first_epoch: int = 0) -> None:
        self.sampler = sampler
        self.dataset = dataset
        self.collate = collate
        self.steps_per_epoch = steps_per_epoch
        self.batch_size = batch_size
        #: Steps of the first epoch iterated already done (a resumed run: the checkpoint's).
        self.done_in_first_epoch = done_in_first_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[StepBatch]:
        skip, self.done_in_first_epoch = self.done_in_first_epoch, 0
        for _ in range(self.steps_per_epoch - skip):
            ids = self.sampler.take()
            if ids is None:
                return
            yield StepBatch(ids, self.dataset, self.collate)


def _state_file(rank: int) -> str:
    """The name of a rank's DropCompute state in a Trainer checkpoint directory."""
    return f"dropcompute_rank{rank}.json"


#: The trainer gating each optimizer / scheduler (weakly held: nothing is kept alive).
_GATED: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_GATED_CLASSES: Dict[type, type] = {}


def _gate(obj: Any, trainer: Any) -> None:
    """Makes ``obj.step`` do nothing while ``trainer._dc_skip`` is True. Idempotent.

    The optimizer (an ``AcceleratedOptimizer``) gets an instance-level wrapper over its current
    ``step`` (an LR scheduler has already wrapped that attribute to count calls). A scheduler's
    class is swapped for a subclass overriding ``step``: nothing is added to its ``__dict__``,
    which its ``state_dict()`` (saved in checkpoints) returns."""
    if obj is None or _GATED.get(obj) is trainer:
        return
    first = obj not in _GATED
    _GATED[obj] = trainer
    if not first:
        return
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        cls = type(obj)
        if cls not in _GATED_CLASSES:
            base_step = cls.step

            def gated_step(self: Any, *a: Any, **k: Any) -> Any:
                t = _GATED.get(self)
                if t is not None and t._dc_skip:
                    return None
                return base_step(self, *a, **k)

            _GATED_CLASSES[cls] = type(cls.__name__, (cls,), {"step": gated_step, "__module__": cls.__module__,
                                                              "__qualname__": cls.__qualname__})
        obj.__class__ = _GATED_CLASSES[cls]
        return
    original = obj.step

    def step(*a: Any, **k: Any) -> Any:
        t = _GATED.get(obj)
        if t is not None and t._dc_skip:
            return None
        return original(*a, **k)

    obj.step = step


class DropComputeTrainerMixin:
    """Makes a ``transformers.Trainer`` subclass run every optimizer step as one
    ``DropComputeStep.run`` over the rank's ``args.gradient_accumulation_steps`` micro-batches
    (see the module doc). Put it first: ``class T(DropComputeTrainerMixin, Trainer)``.

    Constructor: the Trainer's own arguments plus ``dropcompute`` (a ``DropComputeConfig``;
    default: ``args.dropcompute`` if present, else ``DropComputeConfig()``). Attributes after
    ``train()``: ``dropcompute_step`` (the ``DropComputeStep``), ``dropcompute_sampler``,
    ``dropcompute_history`` (one dict per step: ``started``, ``counts``, ``divisor``,
    ``dealt``, ``stepped``), ``dropcompute_micro_batches`` (M), ``dropcompute_log_path`` (this
    rank's compute log, when one is written). Logged with each training
    loss: ``dropcompute/drop_rate`` (not-started / dealt micro-batches, every rank, since the
    last log), ``dropcompute/computed_micro_batches`` (started per step, every rank summed,
    averaged since the last log), ``dropcompute/skipped_steps``.

    Raises TypeError for a wrong ``dropcompute`` type or a train set without ``len()``;
    ValueError for ``args.ddp_broadcast_buffers`` True or a per-device batch size < 1."""

    def __init__(self, *args: Any, dropcompute: Optional[DropComputeConfig] = None, **kwargs: Any) -> None:
        pos = list(args)
        targs = kwargs.get("args", pos[1] if len(pos) > 1 else None)
        if targs is None:
            from transformers import TrainingArguments

            targs = TrainingArguments(output_dir="tmp_trainer")
        cfg = dropcompute if dropcompute is not None else getattr(targs, "dropcompute", None)
        if cfg is None:
            cfg = DropComputeConfig()
        if not isinstance(cfg, DropComputeConfig):
            raise TypeError(f"dropcompute: {type(cfg).__name__}: must be a DropComputeConfig")
        if getattr(targs, "ddp_broadcast_buffers", None):
            raise ValueError("args.ddp_broadcast_buffers: True: must be False or None (ranks run different numbers "
                             "of forwards, DDP's buffer broadcast would desynchronize them)")
        m = int(targs.gradient_accumulation_steps)
        if m < 1:
            raise ValueError(f"args.gradient_accumulation_steps: {m}: must be >= 1")
        targs = copy.copy(targs)
        targs.gradient_accumulation_steps = 1
        targs.ddp_broadcast_buffers = False
        if len(pos) > 1:
            pos[1] = targs
        else:
            kwargs["args"] = targs
        super().__init__(*pos, **kwargs)
        self.dropcompute_config = cfg
        self.dropcompute_micro_batches = m
        self.dropcompute_step: Optional[DropComputeStep] = None
        self.dropcompute_sampler: Optional[DropComputeSampler] = None
        self.dropcompute_history: List[Dict[str, Any]] = []
        self.dropcompute_log_path: Optional[str] = None
        self._dc_skip = False
        self._dc_model: Any = None
        self._dc_window: List[Dict[str, Any]] = []
        self._dc_flops = 0.0
        self._dc_resume: Optional[Dict[str, Any]] = None
        from transformers import TrainerCallback

        mixin = self

        class _SaveDropComputeState(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                mixin._dropcompute_save(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"),
                                        int(state.global_step))

        getattr(self, "add_callback")(_SaveDropComputeState())

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's ``train``, resuming the DropCompute state from ``resume_from_checkpoint``
        (module doc); afterwards the optimizer's and scheduler's ``step`` are no longer gated
        (a last skipped step does not leave them disabled). Raises ValueError for a checkpoint
        without this rank's DropCompute state unless ``args.ignore_data_skip``."""
        t: Any = self
        pos = list(args)
        resume = kwargs.get("resume_from_checkpoint", pos[0] if pos else None)
        ignore = t.args.ignore_data_skip
        self._dc_resume = None
        if resume is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume = get_last_checkpoint(t.args.output_dir)  # type: ignore[no-untyped-call]
            if resume is None:
                raise ValueError(f"resume_from_checkpoint: True: no checkpoint in {t.args.output_dir!r}")
        if resume and not ignore:
            path = os.path.join(str(resume), _state_file(self._dc_rank()))
            if not os.path.isfile(path):
                raise ValueError(f"resume_from_checkpoint: {resume!r}: no {_state_file(self._dc_rank())} (a "
                                 "checkpoint written without DropCompute); set args.ignore_data_skip=True to "
                                 "restart the data stream at epoch 0")
            with open(path) as f:
                self._dc_resume = json.load(f)
            if pos:
                pos[0] = resume
            else:
                kwargs["resume_from_checkpoint"] = resume
            # The mixin positions the data stream itself: the Trainer must not skip batches.
            t.args.ignore_data_skip = True
        try:
            return super().train(*pos, **kwargs)  # type: ignore[misc]
        finally:
            self._dc_skip = False
            self._dc_resume = None
            t.args.ignore_data_skip = ignore

    def _dc_rank(self) -> int:
        return int(getattr(self, "args").process_index)

    def _dropcompute_save(self, checkpoint_dir: str, global_step: int) -> None:
        """Writes this rank's sampler and step state into a Trainer checkpoint directory."""
        if self.dropcompute_sampler is None:
            return
        os.makedirs(checkpoint_dir, exist_ok=True)
        state = {"global_step": global_step, "sampler": self.dropcompute_sampler.state_dict(),
                 "step": self.dropcompute_step.state_dict() if self.dropcompute_step is not None else None}
        with open(os.path.join(checkpoint_dir, _state_file(self._dc_rank())), "w") as f:
            json.dump(state, f)

    # -- data -------------------------------------------------------------------------------

    def get_train_dataloader(self) -> Any:
        """The step loader: ``len()`` = steps per epoch without drops, items ``StepBatch``
        (see the module doc). Raises ValueError without a train set, TypeError for a train set
        without ``len()``."""
        t: Any = self
        ds = t.train_dataset
        if ds is None:
            raise ValueError("train_dataset: None: training requires a train_dataset")
        if not hasattr(ds, "__len__") or isinstance(ds, torch.utils.data.IterableDataset):
            raise TypeError(f"train_dataset: {type(ds).__name__}: must be a map-style dataset with len() "
                            "(the sampler deals its indices)")
        collate = t.data_collator
        try:
            import datasets  # type: ignore[import-not-found]

            if isinstance(ds, datasets.Dataset):
                ds = t._remove_unused_columns(ds, description="Training")
            else:
                collate = t._get_collator_with_removed_columns(collate, description="Training")
        except ImportError:
            collate = t._get_collator_with_removed_columns(collate, description="Training")
        args = t.args
        b = int(args.per_device_train_batch_size)
        if b < 1:
            raise ValueError(f"args.per_device_train_batch_size: {b}: must be >= 1")
        n = int(args.world_size)
        cfg = self.dropcompute_config
        seed = cfg.seed if cfg.seed is not None else (args.data_seed if args.data_seed is not None else args.seed)
        m = self.dropcompute_micro_batches
        self.dropcompute_sampler = DropComputeSampler(len(ds), b, m, rank=int(args.process_index), world_size=n,
                                                      seed=count("seed", seed, 0))
        steps = max(math.ceil(math.ceil(len(ds) / b) / (n * m)), 1)
        done = 0
        if self._dc_resume is not None:
            self.dropcompute_sampler.load_state_dict(self._dc_resume["sampler"])
            done = int(self._dc_resume["global_step"]) % steps
        return _StepLoader(self.dropcompute_sampler, ds, collate, steps, b, done)

    # -- the step ----------------------------------------------------------------------------

    def _dropcompute_step_for(self, model: torch.nn.Module) -> DropComputeStep:
        """The ``DropComputeStep`` over the Trainer's (wrapped) model, made on first use and
        again when the Trainer wraps a new model (a second ``train()``)."""
        if self.dropcompute_step is None or self._dc_model is not model:
            if self.dropcompute_step is not None:
                self.dropcompute_step.close()
            cfg = self.dropcompute_config
            t: Any = self
            log = cfg.compute_log
            rank = dist.get_rank() if dist.is_initialized() else 0
            if log is not None:
                if "{rank}" in log:
                    log = log.replace("{rank}", str(rank))
                elif int(t.args.world_size) > 1:
                    log = f"{log}.rank{rank}"
            self.dropcompute_log_path = log
            self.dropcompute_step = DropComputeStep(
                model, cfg.policy if cfg.policy is not None else Policy(None),
                micro_batches_per_step=self.dropcompute_micro_batches,
                micro_batch_size=int(t.args.per_device_train_batch_size) if cfg.count_fn is None else 0,
                sync_lag=cfg.sync_lag, compute_log=log,
                mode=cfg.mode, backward_fn=t.accelerator.backward,
                sampler=self.dropcompute_sampler,
            )
            self._dc_model = model
            if self._dc_resume is not None and self._dc_resume.get("step") is not None:
                self.dropcompute_step.load_state_dict(self._dc_resume["step"])
        return self.dropcompute_step

    def training_step(self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """One whole optimizer step's compute: ``DropComputeStep.run`` over ``inputs`` (a
        ``StepBatch``), the sampler settled, the optimizer / scheduler gated. Returns the loss
        to log (module doc; a 0-d tensor on ``args.device``). Raises TypeError when ``inputs``
        is not a ``StepBatch`` (the train dataloader is not this mixin's)."""
        if not isinstance(inputs, StepBatch):
            raise TypeError(f"inputs: {type(inputs).__name__}: must be a StepBatch (the mixin's train dataloader); "
                            "put DropComputeTrainerMixin first in the class bases")
        t: Any = self
        step = self._dropcompute_step_for(model)
        model.train()
        if hasattr(t.optimizer, "train") and callable(t.optimizer.train):
            t.optimizer.train()
        _gate(t.optimizer, self)
        _gate(t.lr_scheduler, self)
        count_of = self.dropcompute_config.count_fn or batch_size
        # (micro-batch, its loss sum) per loss_fn call; the first computed_micro_batches are this
        # step's (overlap mode may call loss_fn once more for a zero-weighted backward).
        calls: List[Any] = []

        def loss_fn(module: torch.nn.Module, mb: Any) -> torch.Tensor:
            mb = t._prepare_inputs(mb)
            with t.compute_loss_context_manager():
                loss = t.compute_loss(module, mb)
            if loss.dim() != 0:
                raise ValueError(f"rank {step.rank}: step {step.step}: compute_loss returned shape "
                                 f"{tuple(loss.shape)}: must be the model's scalar mean loss")
            total: torch.Tensor = loss * int(count_of(mb))
            calls.append((mb, total.detach()))
            return total

        def count_fn(mb: Any) -> int:
            return int(count_of(t._prepare_inputs(mb)))

        dealt = self.dropcompute_sampler._dealer.dealt_total if self.dropcompute_sampler is not None else 0
        res = step.run(inputs, loss_fn, count_fn)
        if self.dropcompute_sampler is not None:
            self.dropcompute_sampler.settle(res.started)
        done = calls[: res.computed_micro_batches]
        inputs.computed = [mb for mb, _ in done]
        base: Any = super(DropComputeTrainerMixin, self)
        self._dc_flops = sum(float(base.floating_point_ops(mb)) for mb in inputs.computed)
        scaler = getattr(t.accelerator, "scaler", None)
        may_step = res.optimizer_may_step(scaler)
        self._dc_skip = not may_step
        rec = {"step": res.step, "started": list(res.started), "counts": list(res.counts), "divisor": res.divisor,
               "dealt": int(dealt), "stepped": may_step, "computed_micro_batches": res.computed_micro_batches}
        self.dropcompute_history.append(rec)
        self._dc_window.append(rec)
        dev = t.args.device
        if res.divisor is None:
            return torch.tensor(float("nan"), device=dev)
        local = torch.stack([x for _, x in done]).sum().double() if done else torch.zeros((), dtype=torch.float64)
        return (local * step.world_size / res.divisor).to(device=dev, dtype=torch.float32)

    def get_total_train_batch_size(self, args: Any) -> int:
        """Samples per optimizer step without drops: the Trainer's count (its accumulation is 1
        here) times M."""
        return int(super().get_total_train_batch_size(args)) * self.dropcompute_micro_batches  # type: ignore[misc]

    def floating_point_ops(self, inputs: Any) -> float:
        """The step's floating point operations: the Trainer's estimate summed over the
        micro-batches this rank computed (recorded by the last ``training_step``)."""
        if isinstance(inputs, StepBatch):
            return self._dc_flops
        return float(super().floating_point_ops(inputs))  # type: ignore[misc]

    def _track_num_input_tokens(self, inputs: Any) -> None:
        if isinstance(inputs, StepBatch):
            for mb in inputs.computed:
                super()._track_num_input_tokens(mb)  # type: ignore[misc]
            return
        super()._track_num_input_tokens(inputs)  # type: ignore[misc]

    def log(self, logs: Dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's ``log``; a training log (one with ``loss``) gets the DropCompute
        numbers since the previous one (class doc)."""
        if "loss" in logs and self._dc_window:
            w = self._dc_window
            dealt = sum(r["dealt"] for r in w)
            started = sum(sum(r["started"]) for r in w)
            logs = dict(logs)
            logs["dropcompute/drop_rate"] = (dealt - started) / dealt if dealt else 0.0
            logs["dropcompute/computed_micro_batches"] = started / len(w)
            logs["dropcompute/skipped_steps"] = float(sum(1 for r in w if not r["stepped"]))
            self._dc_window = []
        super().log(logs, *args, **kwargs)  # type: ignore[misc]


_TRAINER: Optional[type] = None


def _make_trainer() -> type:
    from transformers import Trainer

    class DropComputeTrainer(DropComputeTrainerMixin, Trainer):  # type: ignore[misc]
        """``transformers.Trainer`` with ``DropComputeTrainerMixin`` (see it)."""

    DropComputeTrainer.__module__ = __name__
    return DropComputeTrainer


def __getattr__(name: str) -> Any:
    # DropComputeTrainer is built on first access: importing this module needs no transformers.
    global _TRAINER
    if name == "DropComputeTrainer":
        if _TRAINER is None:
            _TRAINER = _make_trainer()
        return _TRAINER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
