"""One rank of the HF Trainer tests (run by test_transformers.py under `python -m torch.distributed.run`).

usage: hf_worker.py SCENARIO[,SCENARIO...] OUTDIR. Writes OUTDIR/rank{r}.json: {scenario: what it
measured}. The model is a tiny BertForSequenceClassification built from a config (2 layers, hidden
32, no dropout, float64) on synthetic token data; the real transformers.Trainer, accelerate, DDP on
gloo.
"""

import copy
import os
import sys
import time
import warnings
from typing import Any, Dict, List

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import transformers  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402

import dropcompute  # noqa: E402
from dropcompute.torch.transformers import DropComputeConfig, DropComputeTrainerMixin, StepBatch  # noqa: E402

import launch  # python/tests/launch.py: the workers' one ending

SAMPLES, SEQ, VOCAB, B = 64, 8, 64, 4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=SEQ, num_labels=2, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg).double()


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Synthetic token sequences with a learnable label (the parity of the first token)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(5)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)
        self.labels = self.ids[:, 0] % 2

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i],
                "index": i}


def collate(items: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Stacks the features; keeps the sample indices aside (the tests record them; the model never sees them)."""
    out: Dict[str, Any] = {k: torch.stack([it[k] for it in items]) for k in ("input_ids", "attention_mask", "labels")}
    out["index"] = [it["index"] for it in items]
    return out


def strip_index(inputs: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in inputs.items() if k != "index"}


def targs(out: str, m: int, epochs: int, **kw: Any) -> TrainingArguments:
    base: Dict[str, Any] = dict(output_dir=out, per_device_train_batch_size=B, gradient_accumulation_steps=m,
                                num_train_epochs=epochs, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                                report_to=[], use_cpu=True, seed=3, remove_unused_columns=False, disable_tqdm=True,
                                ddp_timeout=300)
    return TrainingArguments(**{**base, **kw})


class Recording(DropComputeTrainerMixin, Trainer):  # type: ignore[misc]
    """The DropCompute trainer plus what the tests read: the pre-step parameters, the reduced
    gradient before clipping, the micro-batches dealt and started. Strips the index column."""

    def __init__(self, *a: Any, delay_rank: int = -1, delay_s: float = 0.0, **k: Any) -> None:
        super().__init__(*a, **k)
        self.delay_rank, self.delay_s = delay_rank, delay_s
        self.steps: List[Dict[str, Any]] = []

    def compute_loss(self, model: Any, inputs: Dict[str, Any], *a: Any, **k: Any) -> Any:
        if self.args.process_index == self.delay_rank:
            time.sleep(self.delay_s)  # the straggler
        self.started_ids.append(inputs["index"])
        return super().compute_loss(model, strip_index(inputs), *a, **k)

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        assert isinstance(inputs, StepBatch)
        before = [p.detach().clone() for p in self.model.parameters()]
        self.started_ids: List[List[int]] = []
        loss = super().training_step(model, inputs, num_items_in_batch)
        h = self.dropcompute_history[-1]
        self.steps.append({"dealt": inputs.ids, "started_ids": self.started_ids, "started": h["started"],
                           "counts": h["counts"], "divisor": h["divisor"], "loss": float(loss),
                           "grad": [None if p.grad is None else p.grad.detach().clone()
                                    for p in self.model.parameters()],
                           "before": before})
        return loss


def reference_grad(net0: torch.nn.Module, before: List[torch.Tensor], ids: List[int],
                   data: Tokens) -> List[torch.Tensor]:
    """The mean over the samples ``ids`` of the per-sample loss gradient at parameters ``before`` (f64, one pass)."""
    ref = copy.deepcopy(net0)
    with torch.no_grad():
        for p, b in zip(ref.parameters(), before):
            p.copy_(b)
    ref.zero_grad()
    x = data.ids[ids]
    loss = ref(input_ids=x, attention_mask=torch.ones_like(x), labels=data.labels[ids]).loss  # mean over ids
    loss.backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad for p in ref.parameters()]


def gather(obj: Any) -> List[Any]:
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def scenario_off(rank: int, n: int, outdir: str, res: Dict[str, Any]) -> None:
    """Threshold off: the DropCompute trainer against the plain Trainer fed exactly the
    micro-batches the sampler dealt, rank by rank, in the same order, with the same
    gradient_accumulation_steps (M), optimizer, LR schedule, clipping and DDP."""
    m, epochs = 2, 2
    data = Tokens()
    mode = os.path.basename(outdir).split("-")[1] if "-" in os.path.basename(outdir) else "flat"
    dc = Recording(model=make_model(), args=targs(os.path.join(outdir, "dc"), m, epochs), train_dataset=data,
                   data_collator=collate, dropcompute=DropComputeConfig(policy=dropcompute.Policy(None), mode=mode))
    dc.train()
    dealt = [s["dealt"] for s in dc.steps]  # per step: this rank's micro-batches (index lists)
    per_epoch = len(dealt) // epochs

    class Batches:
        """The plain Trainer's batch sampler: epoch e's micro-batches, as DropCompute dealt them to this rank."""

        def __init__(self) -> None:
            self.epoch = 0

        def __len__(self) -> int:
            return per_epoch * m

        def __iter__(self) -> Any:
            e, self.epoch = self.epoch, self.epoch + 1
            for step in dealt[e * per_epoch:(e + 1) * per_epoch]:
                yield from step

    class Plain(Trainer):  # type: ignore[misc]
        def get_train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(data, batch_sampler=Batches(), collate_fn=collate)

        def compute_loss(self, model: Any, inputs: Dict[str, Any], *a: Any, **k: Any) -> Any:
            return super().compute_loss(model, strip_index(inputs), *a, **k)

    plain = Plain(model=make_model(), args=targs(os.path.join(outdir, "plain"), m, epochs), train_dataset=data,
                  data_collator=collate)
    # BertForSequenceClassification.forward takes **kwargs but ignores num_items_in_batch: the
    # plain Trainer's default would not divide its mean loss by M (gradient M·N times the mean);
    # this is the plain Trainer's own setting for a per-batch mean loss.
    plain.model_accepts_loss_kwargs = False
    plain.train()
    dc_loss = [h["loss"] for h in dc.state.log_history if "loss" in h]
    plain_loss = [h["loss"] for h in plain.state.log_history if "loss" in h]
    diff = max(float((a - b).abs().max()) for a, b in zip(dc.model.parameters(), plain.model.parameters()))
    moved = max(float((a - b).abs().max()) for a, b in zip(dc.model.parameters(), make_model().parameters()))
    dc_logs = [h for h in dc.state.log_history if "loss" in h]
    res.update(dc_loss=dc_loss, plain_loss=plain_loss, max_param_diff=diff, moved=moved,
               global_step=[dc.state.global_step, plain.state.global_step], epoch=[dc.state.epoch, plain.state.epoch],
               lr=[dc.lr_scheduler.get_last_lr()[0], plain.lr_scheduler.get_last_lr()[0]],
               drop_rate=[h["dropcompute/drop_rate"] for h in dc_logs],
               computed=[h["dropcompute/computed_micro_batches"] for h in dc_logs],
               grad_norm=[[h.get("grad_norm") for h in dc_logs], [h.get("grad_norm") for h in plain.state.log_history
                                                                  if "loss" in h]],
               steps=len(dealt), dealt_sizes=[[len(mb) for mb in s] for s in dealt], mode=dc.dropcompute_step.mode,
               total_batch=[dc.get_total_train_batch_size(dc.args), plain.get_total_train_batch_size(plain.args)])


def scenario_slow(rank: int, n: int, outdir: str, res: Dict[str, Any]) -> None:
    """Rank 1 sleeps before each micro-batch's forward, past the deadline: it drops; the step's
    divisor is every rank's computed count; the gradient equals the f64 mean over exactly the
    micro-batches started (every rank); the dealer deals the dropped ones again."""
    m, epochs = 4, 3
    data = Tokens()
    delay = float(os.environ.get("DC_DELAY_S", "0.3"))
    threshold_ns = int(float(os.environ.get("DC_THRESHOLD_S", "0.45")) * 1e9)
    policy = dropcompute.Policy(threshold_ns, warmup_steps=0, min_micro_batches=1)
    dc = Recording(model=make_model(), args=targs(os.path.join(outdir, "dc"), m, epochs), train_dataset=data,
                   data_collator=collate, delay_rank=1, delay_s=delay,
                   dropcompute=DropComputeConfig(policy=policy, compute_log=os.path.join(outdir, "log_{rank}.csv")))
    dc.train()
    net0 = make_model()
    errs: List[float] = []
    for s in dc.steps:
        every = gather(s["started_ids"])  # every rank's started micro-batches
        ids = [i for r in every for mb in r for i in mb]
        ref = reference_grad(net0, s["before"], ids, data)
        got = [torch.zeros_like(r) if g is None else g for g, r in zip(s["grad"], ref)]
        scale = max(float(r.abs().max()) for r in ref)
        errs.append(max(float((g - r).abs().max()) for g, r in zip(got, ref)) / scale)
    # Drain what the dealer still holds of its current epoch, one micro-batch at a time (this
    # rank's replica; every replica is equal): with what was computed, every sample must be
    # there exactly once per dealer epoch.
    sampler = dc.dropcompute_sampler
    assert sampler is not None
    state = sampler.state_dict()["dealer"]
    end_epoch = sampler.epoch
    drained: List[int] = []
    one = [1] + [0] * (n - 1)  # one micro-batch a step, to rank 0
    while True:
        got = sampler.take(one)
        assert got is not None
        if sampler.epoch != end_epoch:
            break  # the next epoch's first micro-batch: the current epoch is drained
        drained.extend(i for mb in got for i in mb)
        sampler.settle(one)
    logs = [h for h in dc.state.log_history if "loss" in h]
    keep = ("dealt", "started_ids", "started", "counts", "divisor", "loss")
    res.update(steps=[{k: v for k, v in s.items() if k in keep}
                      for s in dc.steps],
               grad_rel_err=errs, end_epoch=end_epoch, drained=drained, state=state,
               drop_rate=[h["dropcompute/drop_rate"] for h in logs],
               computed=[h["dropcompute/computed_micro_batches"] for h in logs],
               global_step=dc.state.global_step, epoch=dc.state.epoch, logged_loss=[h["loss"] for h in logs],
               log=dc.dropcompute_log_path)


class Subclassed(Trainer):  # type: ignore[misc]
    """Stands in for a Trainer subclass such as optimum-habana's GaudiTrainer: overrides the
    dataloader-independent hooks a subclass typically overrides (its own compute_loss and
    optimizer creation, an extra log field)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.own_loss_calls = 0

    def create_optimizer(self, *a: Any, **k: Any) -> Any:
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        return self.optimizer

    def compute_loss(self, model: Any, inputs: Dict[str, Any], *a: Any, **k: Any) -> Any:
        self.own_loss_calls += 1
        return super().compute_loss(model, strip_index(inputs), *a, **k)

    def log(self, logs: Dict[str, float], *a: Any, **k: Any) -> None:
        super().log({**logs, "subclass": 1.0}, *a, **k)


def scenario_compose(rank: int, n: int, outdir: str, res: Dict[str, Any]) -> None:
    """The mixin over another Trainer subclass: its overrides still run, DropCompute owns the step."""

    class DC(DropComputeTrainerMixin, Subclassed):  # type: ignore[misc]
        pass

    data = Tokens()
    args = targs(os.path.join(outdir, "c"), 2, 1, max_grad_norm=0.5)
    args.dropcompute = DropComputeConfig(policy=dropcompute.Policy(None))  # the knobs from the args
    t = DC(model=make_model(), args=args, train_dataset=data, data_collator=collate)
    t.train()
    errors: Dict[str, str] = {}
    for name, kw in {"broadcast": {"args": targs(os.path.join(outdir, "x"), 2, 1, ddp_broadcast_buffers=True)},
                     "config": {"args": targs(os.path.join(outdir, "x"), 2, 1),
                                "dropcompute": {"mode": "flat"}}}.items():
        try:
            DC(model=make_model(), train_dataset=data, data_collator=collate, **kw)
        except (ValueError, TypeError) as e:
            errors[name] = f"{type(e).__name__}: {e}"
    try:
        t.train(resume_from_checkpoint=os.path.join(outdir, "nowhere"))
    except ValueError as e:
        errors["resume"] = str(e).split(":")[0]
    logs = [h for h in t.state.log_history if "loss" in h]
    res.update(errors=errors, mro=[c.__name__ for c in type(t).__mro__][:4], own_loss_calls=t.own_loss_calls,
               optimizer=type(t.optimizer.optimizer).__name__, subclass_field=[h.get("subclass") for h in logs],
               dc_fields=["dropcompute/drop_rate" in h for h in logs], global_step=t.state.global_step,
               steps=len(t.dropcompute_history), args_ga=t.args.gradient_accumulation_steps,
               m=t.dropcompute_micro_batches, grad_norm=[h.get("grad_norm") for h in logs],
               user_args_ga=args.gradient_accumulation_steps, config_from_args=t.dropcompute_config is args.dropcompute)


def scenario_skip(rank: int, n: int, outdir: str, res: Dict[str, Any]) -> None:
    """Steps the optimizer must not take, and the Trainer's loop around them: (a) a non-finite
    gradient at step 1 (no GradScaler): that step's optimizer and LR scheduler are skipped, the
    others run; (b) a policy under which no rank starts anything: every step skipped, the
    parameters untouched. The Trainer still counts and logs each step."""

    class NaNAtStep1(DropComputeTrainerMixin, Trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Dict[str, Any], *a: Any, **k: Any) -> Any:
            loss = super().compute_loss(model, strip_index(inputs), *a, **k)
            return loss * float("nan") if self.state.global_step == 1 else loss

    class Plain(DropComputeTrainerMixin, Trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Dict[str, Any], *a: Any, **k: Any) -> Any:
            return super().compute_loss(model, strip_index(inputs), *a, **k)

    def summary(t: Any) -> Dict[str, Any]:
        opt = t.optimizer.optimizer
        adam_steps = sorted({int(st["step"]) for st in opt.state.values()}) if opt.state else []
        logs = [h for h in t.state.log_history if "loss" in h]
        return {"global_step": t.state.global_step, "adam_steps": adam_steps,
                "sched_steps": t.lr_scheduler.last_epoch, "skipped": [h["dropcompute/skipped_steps"] for h in logs],
                "finite": all(bool(torch.isfinite(p).all()) for p in t.model.parameters()),
                "stepped": [h["stepped"] for h in t.dropcompute_history],
                "unchanged": max(float((a - b).abs().max()) for a, b in zip(t.model.parameters(),
                                                                            make_model().parameters()))}

    data = Tokens()
    a = NaNAtStep1(model=make_model(), args=targs(os.path.join(outdir, "nan"), 2, 1, max_steps=3), train_dataset=data,
                   data_collator=collate, dropcompute=DropComputeConfig(policy=dropcompute.Policy(None)))
    a.train()
    nothing = dropcompute.Policy(1, warmup_steps=0, min_micro_batches=0)  # 1 ns: no micro-batch starts
    b = Plain(model=make_model(), args=targs(os.path.join(outdir, "none"), 2, 1, max_steps=2), train_dataset=data,
              data_collator=collate, dropcompute=DropComputeConfig(policy=nothing))
    b.train()
    res.update(nan=summary(a), none=summary(b), none_started=[h["started"] for h in b.dropcompute_history])
    # (c) A per-rank dealing seed (a common pattern for augmentation, wrong for the dealing: the
    # replicas would deal different samples): refused at the first step on every rank.
    c = Plain(model=make_model(), args=targs(os.path.join(outdir, "seed"), 2, 1, max_steps=1), train_dataset=data,
              data_collator=collate, dropcompute=DropComputeConfig(policy=dropcompute.Policy(None), seed=rank))
    try:
        c.train()
        res["seed"] = None
    except ValueError as e:
        res["seed"] = str(e)


def scenario_resume(rank: int, n: int, outdir: str, res: Dict[str, Any]) -> None:
    """A run checkpointed at step 3 and resumed from there equals the uninterrupted run: the
    sampler's stream (drops re-queued), the step's warm-up count and the optimizer / scheduler
    come back. Drops without timing: a 1 ns deadline with min_micro_batches 1 starts exactly 1
    of M = 2 micro-batches per rank after the 2 warm-up steps."""
    m, epochs = 2, 2
    data = Tokens()
    cfg = DropComputeConfig(policy=dropcompute.Policy(1, warmup_steps=2, min_micro_batches=1))
    full = Recording(model=make_model(), args=targs(os.path.join(outdir, "full"), m, epochs, save_strategy="steps",
                                                    save_steps=3), train_dataset=data, data_collator=collate,
                     dropcompute=cfg)
    full.train()
    ckpt = os.path.join(outdir, "full", "checkpoint-3")
    again = Recording(model=make_model(), args=targs(os.path.join(outdir, "again"), m, epochs), train_dataset=data,
                      data_collator=collate, dropcompute=cfg)
    again.train(resume_from_checkpoint=ckpt)
    diff = max(float((a - b).abs().max()) for a, b in zip(full.model.parameters(), again.model.parameters()))
    res.update(full_started=[s["started_ids"] for s in full.steps],
               again_started=[s["started_ids"] for s in again.steps],
               full_loss=[h["loss"] for h in full.state.log_history if "loss" in h],
               again_loss=[h["loss"] for h in again.state.log_history if "loss" in h],
               full_counts=[s["started"] for s in full.steps], max_param_diff=diff,
               global_step=[full.state.global_step, again.state.global_step],
               files=sorted(f for f in os.listdir(ckpt) if f.startswith("dropcompute")))


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    transformers.logging.set_verbosity_error()
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    res: Dict[str, Any] = {}
    for name in scenario.split(","):  # several scenarios in one launch: one process start-up
        res[name] = {}
        {"off": scenario_off, "off-overlap": scenario_off, "slow": scenario_slow, "compose": scenario_compose,
         "skip": scenario_skip, "resume": scenario_resume}[name](
            rank, n, os.path.join(outdir, name), res[name])
    launch.finish(outdir, rank, res)


if __name__ == "__main__":
    main()
