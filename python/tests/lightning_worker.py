"""One rank of a Lightning scenario, run by test_lightning.py under torch.distributed.run (CPU,
gloo; the real ``lightning.Trainer`` with ``strategy="ddp"``, which reads torchrun's
environment and initializes the process group). Writes ``rank<r>.json`` to the output folder.

Scenarios (``all``: both, in one launch; the output has one entry per scenario):
- ``off``: threshold off, three fits in one process from the same initial weights:
  (1) plain Lightning, automatic optimization, ``accumulate_grad_batches`` = M, mean loss, over
  the SAME micro-batches in the same steps that ``DropComputeSampler`` deals at threshold off
  (a replica of the sampler, every micro-batch settled as started; each rank its own list);
  (2) ``DropComputeModule`` on ``dropcompute_steps``; (3) the unguarded control: the mixin
  running its step over the LightningModule instead of the strategy's DDP module. Every fit's DDP module gets a counting comm hook that
  performs DDP's own all-reduce (``allreduce_hook``): the calls say whether DDP's reducer ran.
- ``slow``: float64 (``precision="64-true"``), rank 1 sleeps in its loss past the deadline; in
  ``on_dropcompute_step`` the gradient is compared with a float64 reference of the
  micro-batches actually started on every rank divided by their global count.
"""

import copy
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset

import lightning as L

import dropcompute
from dropcompute.torch import DropComputeSampler, StepResult
from dropcompute.torch.lightning import DropComputeModule, dropcompute_steps

import launch  # python/tests/launch.py: the workers' one ending

D_IN, D_H, D_OUT = 8, 16, 3
B, M = 4, 3  # micro-batch size, micro-batches per rank and step


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_H), torch.nn.Tanh(), torch.nn.Linear(D_H, D_OUT))


def make_data(samples: int, dtype: torch.dtype = torch.float32) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(samples, D_IN, generator=g, dtype=torch.float64).to(dtype),
                         torch.randint(0, D_OUT, (samples,), generator=g))


def collate(rows: List[Tuple[torch.Tensor, ...]]) -> Tuple[torch.Tensor, ...]:
    return tuple(torch.stack(c) for c in zip(*rows))


class Counted(L.LightningModule):
    """Registers a counting comm hook (DDP's own all-reduce) on the strategy's DDP module."""

    hook_calls = 0

    def on_fit_start(self) -> None:
        ddp = self.trainer.strategy.model

        def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            self.hook_calls += 1
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)  # type: ignore[operator]

    def make_optim(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)
        sch = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return opt, sch


class Plain(Counted):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = copy.deepcopy(net)
        self.sums: List[Tuple[float, int]] = []  # per micro-batch

    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        per_sample = F.cross_entropy(self.net(batch[0]), batch[1], reduction="none")
        self.sums.append((float(per_sample.detach().sum()), int(per_sample.shape[0])))
        return per_sample.mean()

    def configure_optimizers(self) -> Any:
        opt, sch = self.make_optim()
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sch, "interval": "step"}}


class WithDropCompute(DropComputeModule, Counted):
    def __init__(self, net: torch.nn.Module, policy: dropcompute.Policy, sleep_rank: int = -1) -> None:
        super().__init__()
        self.net = copy.deepcopy(net)
        self.dropcompute_policy = policy
        self.dropcompute_step_kwargs = {"micro_batches_per_step": M}
        self.sleep_rank = sleep_rank
        self.sums: List[Tuple[float, int]] = []  # per step
        self._acc = [0.0, 0]
        self.results: List[StepResult] = []
        self.dealt: List[List[List[int]]] = []
        self.computed: List[List[int]] = []
        self.grad_errs: List[float] = []
        self.totals: List[int] = []
        self.stepped: List[bool] = []

    def dropcompute_loss(self, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if self.global_rank == self.sleep_rank:
            time.sleep(0.3)  # past the 250 ms deadline after its first micro-batch
        per_sample = F.cross_entropy(self.net(mb[0]), mb[1], reduction="none")
        self._acc[0] += float(per_sample.detach().sum())
        self._acc[1] += int(per_sample.shape[0])
        return per_sample

    def training_step(self, batch: Any, batch_idx: int = 0) -> None:
        self._before = copy.deepcopy(self.net)
        self._pending = batch
        res = self.dropcompute_training_step(batch)
        if res is not None:
            self.results.append(res)
            self.sums.append((self._acc[0], int(self._acc[1])))
            self.dealt.append(batch.micro_batches.ids)
            self.computed.extend(batch.micro_batches.ids[: res.computed_micro_batches])
        self._acc = [0.0, 0]

    def on_dropcompute_step(self, result: StepResult) -> None:
        if self.sleep_rank < 0:
            return
        # The gradient vs a float64 reference over every rank's started samples.
        mine = self._pending.micro_batches.ids[: result.computed_micro_batches]
        everyone: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        ids = [i for r in everyone for mb in r for i in mb]
        ref = copy.deepcopy(self._before).double()
        x, y = self._data[ids]
        F.cross_entropy(ref(x.double()), y, reduction="sum").backward()
        errs = [float((p.grad - r.grad / len(ids)).abs().max() / (r.grad / len(ids)).abs().max())  # type: ignore[operator]
                for p, r in zip(self.net.parameters(), ref.parameters())]
        self.grad_errs.append(max(errs))
        self.totals.append(len(ids))

    def configure_optimizers(self) -> Any:
        opt, sch = self.make_optim()
        return {"optimizer": opt, "lr_scheduler": sch}


class Overlapped(WithDropCompute):
    """``mode="overlap"``: the last micro-batch's ``manual_backward`` runs with the DDP module's
    sync on, so Lightning's ``pre_backward`` arms DDP's reducer and its bucketed all-reduce runs
    (DDP's own: the step registers no hook of its own), counted by ``Counted``'s hook, a
    DDP-style hook (the mean over ranks) the step's rescale composes with as it is."""

    def __init__(self, net: torch.nn.Module, policy: dropcompute.Policy) -> None:
        super().__init__(net, policy)
        self.dropcompute_step_kwargs = {"micro_batches_per_step": M, "mode": "overlap"}


class Unguarded(WithDropCompute):
    """The control: the step over the LightningModule instead of the strategy's DDP module (no
    ``no_sync``): ``manual_backward`` arms DDP's reducer at every micro-batch."""

    def _dropcompute_model(self) -> Any:
        return self


def trainer(**kw: Any) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), strategy="ddp", num_nodes=1,
                     max_epochs=1, enable_checkpointing=False, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, use_distributed_sampler=False, num_sanity_val_steps=0, **kw)


def params(mod: torch.nn.Module) -> List[torch.Tensor]:
    return [p.detach().clone().double() for p in mod.parameters()]


def scenario_off(rank: int, n: int, out: Dict[str, Any]) -> None:
    samples = 2 * n * M * B * 2  # 4 steps
    data = make_data(samples)
    net0 = make_net()
    replica = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=11, epochs=1)
    steps_ids: List[List[List[int]]] = []
    while (ids := replica.take()) is not None:
        steps_ids.append(ids)
        replica.settle([M] * n)
    plain = Plain(net0)
    mbs = [data[mb] for step in steps_ids for mb in step]
    trainer(accumulate_grad_batches=M).fit(plain, train_dataloaders=DataLoader(mbs, batch_size=None))
    plain_steps = [(sum(s for s, _ in plain.sums[i : i + M]), sum(c for _, c in plain.sums[i : i + M]))
                   for i in range(0, len(plain.sums), M)]
    got: Dict[str, Any] = {}
    for name, cls in (("dc", WithDropCompute), ("overlap", Overlapped), ("unguarded", Unguarded)):
        mod = cls(net0, dropcompute.Policy())
        sampler = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=11, epochs=1)
        trainer().fit(mod, train_dataloaders=dropcompute_steps(data, sampler, collate_fn=collate))
        got[name] = dict(
            steps=mod.sums, hook_calls=mod.hook_calls, same_deal=mod.dealt == steps_ids,
            max_param_diff=max(float((a - b).abs().max()) for a, b in zip(params(plain.net), params(mod.net))),
            lr=mod.optimizers().param_groups[0]["lr"], started=[r.started for r in mod.results],
        )
    out.update(
        plain_steps=plain_steps, plain_hook_calls=plain.hook_calls, plain_lr=plain.optimizers().param_groups[0]["lr"],
        moved=max(float((a - b).abs().max()) for a, b in zip(params(plain.net), params(net0))), **got,
    )


def scenario_slow(rank: int, n: int, out: Dict[str, Any]) -> None:
    samples = n * M * B * 2
    data = make_data(samples, torch.float64)
    mod = WithDropCompute(make_net(), dropcompute.Policy(250_000_000, warmup_steps=0, min_micro_batches=1),
                          sleep_rank=1)
    mod._data = data
    sampler = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=5, epochs=1)
    mod.dropcompute_step_kwargs["sampler"] = sampler  # the dealing joins the first step's check
    trainer(precision="64-true").fit(mod, train_dataloaders=dropcompute_steps(data, sampler, collate_fn=collate))
    out.update(computed=mod.computed, grad_rel_err=max(mod.grad_errs), divisors=[r.divisor for r in mod.results],
               totals=mod.totals, started=[r.started for r in mod.results], samples=samples,
               dealt=[len(d) for d in mod.dealt],
               hook_calls=mod.hook_calls)


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    scenarios = {"off": scenario_off, "slow": scenario_slow}
    out: Dict[str, Any] = {}
    for name in scenarios if scenario == "all" else [scenario]:  # "all": one launch, one import
        out[name] = {"rank": rank, "world_size": n}
        scenarios[name](rank, n, out[name])
    launch.finish(outdir, rank, out)


if __name__ == "__main__":
    main()
