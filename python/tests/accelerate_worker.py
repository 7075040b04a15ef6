"""One rank of an Accelerate scenario, run by test_accelerate.py under torch.distributed.run (CPU,
gloo, the real ``accelerate.Accelerator``). Writes ``rank<r>.json`` to the output folder.

Scenarios (``all``: both, in one launch; the output has one entry per scenario):
- ``off``: threshold off, in both reduce paths (``mode="overlap"`` under ``off.overlap``). The
  reference is the plain Accelerate loop with its own accumulation
  (``gradient_accumulation_steps`` = M, ``accumulate()``, mean loss, ``accelerator.backward``,
  prepared optimizer and scheduler) over the SAME micro-batches, step by step, that
  ``DropComputeSampler`` deals at threshold off (a second sampler replica, every micro-batch
  settled as started). Then the same model, optimizer and scheduler from the same initial
  state run under ``AcceleratedDropCompute`` (``gradient_accumulation_steps`` 1). Per-step
  global mean loss, final parameters and learning rate are recorded for both.
- ``slow``: rank 1 sleeps in its loss past the deadline: per step, the gradient after ``run`` is
  compared with a float64 reference of the micro-batches actually started on every rank
  divided by their global sample count; every computed sample index is recorded.
"""

import copy
import datetime
import sys
import time
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import dropcompute
from dropcompute.torch import DropComputeSampler
from dropcompute.torch.accelerate import AcceleratedDropCompute
from dropcompute.torch.loader import DropComputeLoader
import dropcompute.torch.lightning  # noqa: F401 (imported for the lazy-import check)

import launch  # python/tests/launch.py: the workers' one ending

#: Integration packages loaded by importing dropcompute.torch and both integration modules.
LAZY = sorted(m for m in ("accelerate", "lightning", "pytorch_lightning") if m in sys.modules)

D_IN, D_H, D_OUT = 8, 16, 3
B, M = 4, 3  # micro-batch size, micro-batches per rank and step


def make_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_H), torch.nn.Tanh(), torch.nn.Linear(D_H, D_OUT)).to(dtype)


def make_data(samples: int, dtype: torch.dtype) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(samples, D_IN, generator=g, dtype=torch.float64).to(dtype),
                         torch.randint(0, D_OUT, (samples,), generator=g))


def global_mean(loss_sum: float, count: int) -> float:
    t = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[1])


def scenario_off(accelerator: Any, rank: int, n: int, out: Dict[str, Any]) -> None:
    samples = 2 * n * M * B * 2  # 4 steps
    data = make_data(samples, torch.float32)
    net0 = make_model(torch.float32)

    def parts(net: torch.nn.Module) -> Tuple[torch.nn.Module, Any, Any]:
        model = copy.deepcopy(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
        sch = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return model, opt, sch

    # Plain Accelerate, its own accumulation over the micro-batches the sampler deals at threshold off.
    replica = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=11, epochs=1)
    steps_ids: List[List[List[int]]] = []
    while (ids := replica.take()) is not None:
        steps_ids.append(ids)
        replica.settle([M] * n)
    accelerator.gradient_accumulation_steps = M
    model, opt, sch = accelerator.prepare(*parts(net0))
    plain_losses = []
    for ids in steps_ids:
        total, count = 0.0, 0
        for mb in ids:
            x, y = data[mb]
            with accelerator.accumulate(model):
                per_sample = F.cross_entropy(model(x), y, reduction="none")
                total += float(per_sample.detach().sum())
                count += len(mb)
                accelerator.backward(per_sample.mean())
                opt.step()
                sch.step()
                opt.zero_grad()
        plain_losses.append(global_mean(total, count))
    plain_params = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    plain_lr = opt.param_groups[0]["lr"]

    # The same stack under DropCompute, in each reduce path (overlap: DDP's own bucketed
    # all-reduce in the last micro-batch's backward, rescaled after it).
    for mode in ("flat", "overlap"):
        dropcompute_off(accelerator, rank, n, net0, parts, data, samples, steps_ids, plain_params, plain_lr,
                        plain_losses, mode, out if mode == "flat" else out.setdefault("overlap", {}))


def dropcompute_off(accelerator: Any, rank: int, n: int, net0: torch.nn.Module, parts: Any, data: TensorDataset,
                    samples: int, steps_ids: List[List[List[int]]], plain_params: List[torch.Tensor], plain_lr: float,
                    plain_losses: List[float], mode: str, out: Dict[str, Any]) -> None:
    """``scenario_off``'s DropCompute run in ``mode`` from the same initial state as the plain loop."""
    accelerator.gradient_accumulation_steps = 1
    model, opt, sch = accelerator.prepare(*parts(net0))
    backward_calls = [0]
    original_backward = accelerator.backward

    def counted_backward(loss: torch.Tensor, **kw: Any) -> None:
        backward_calls[0] += 1
        original_backward(loss, **kw)

    accelerator.backward = counted_backward
    dc = AcceleratedDropCompute(accelerator, model, dropcompute.Policy(), mode=mode)
    sampler = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=11, epochs=1)
    loader = DropComputeLoader(data, sampler, collate_fn=lambda rows: tuple(torch.stack(c) for c in zip(*rows)),
                               device=accelerator.device)
    dc_losses, dealt, stepped = [], [], []
    for mbs in loader:
        acc = [0.0, 0]

        def loss_fn(mod: torch.nn.Module, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            per_sample = F.cross_entropy(mod(mb[0]), mb[1], reduction="none")
            acc[0] += float(per_sample.detach().sum())
            acc[1] += per_sample.shape[0]
            return per_sample

        dealt.append(mbs.ids)
        res = dc.run(mbs, loss_fn)
        loader.settle(res)
        stepped.append(dc.apply(res, opt, sch))
        dc_losses.append(global_mean(acc[0], int(acc[1])))
    dc_params = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    # A changed accumulation is refused at the next step.
    accelerator.gradient_accumulation_steps = 2
    try:
        dc.run([], loss_fn)
        refusal = ""
    except ValueError as e:
        refusal = str(e)
    accelerator.gradient_accumulation_steps = 1
    out.update(
        distributed_type=str(accelerator.distributed_type.value),
        model_type=type(model).__name__,
        plain_losses=plain_losses, dc_losses=dc_losses,
        max_param_diff=max(float((a - b).abs().max()) for a, b in zip(plain_params, dc_params)),
        moved=max(float((a - b).abs().max()) for a, b in zip(plain_params, net0.parameters())),
        plain_lr=plain_lr, dc_lr=opt.param_groups[0]["lr"],
        same_deal=dealt == steps_ids, stepped=stepped, backward_calls=backward_calls[0],
        micro_batches=sum(len(d) for d in dealt), refusal=refusal,
        # Buckets DDP's own reducer all-reduced in its latest recorded synced backward (0: it
        # never ran); DDP's logging data, recorded in each of its first 10 iterations.
        hook_buckets=int(model._get_ddp_logging_data().get("num_buckets_reduced", 0)),
    )
    accelerator.backward = original_backward
    dc.close()


def reference_grad(net: torch.nn.Module, data: TensorDataset, started: List[List[int]]) -> List[torch.Tensor]:
    """float64: the gradient of the sum of per-sample losses over every rank's started samples,
    divided by their count."""
    ref = copy.deepcopy(net).double()
    ids = [i for mb in started for i in mb]
    x, y = data[ids]
    ref.zero_grad()
    F.cross_entropy(ref(x.double()), y, reduction="sum").backward()
    return [p.grad / len(ids) for p in ref.parameters()]  # type: ignore[operator]


def scenario_slow(accelerator: Any, rank: int, n: int, out: Dict[str, Any]) -> None:
    samples = n * M * B * 2
    data = make_data(samples, torch.float64)
    model = make_model(torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    inner = accelerator.unwrap_model(model)
    sampler = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=5, epochs=1)
    dc = AcceleratedDropCompute(accelerator, model, dropcompute.Policy(250_000_000, warmup_steps=0, min_micro_batches=1),
                                micro_batches_per_step=M, sampler=sampler)  # the dealing joins the check
    loader = DropComputeLoader(data, sampler, collate_fn=lambda rows: tuple(torch.stack(c) for c in zip(*rows)))
    computed: List[List[int]] = []
    errs, divisors, totals, started_by_step, dealt = [], [], [], [], []
    for mbs in loader:
        def loss_fn(mod: torch.nn.Module, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            if rank == 1:
                time.sleep(0.3)  # past the 250 ms deadline after its first micro-batch
            return F.cross_entropy(mod(mb[0]), mb[1], reduction="sum")

        before = copy.deepcopy(inner)
        dealt.append(len(mbs))
        res = dc.run(mbs, loss_fn)
        mine = mbs.ids[: res.computed_micro_batches]
        everyone: List[Any] = [None] * n
        dist.all_gather_object(everyone, mine)
        started = [mb for r in everyone for mb in r]
        ref = reference_grad(before, data, started)
        got = [p.grad for p in inner.parameters()]
        errs.append(max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref)))  # type: ignore[operator]
        divisors.append(res.divisor)
        totals.append(sum(len(mb) for mb in started))
        started_by_step.append(res.started)
        computed.extend(mine)
        loader.settle(res)
        dc.apply(res, opt)
    out.update(computed=computed, grad_rel_err=max(errs), divisors=divisors, totals=totals, started=started_by_step,
               samples=samples, dealt=dealt)


def main() -> None:
    from accelerate import Accelerator

    scenario, outdir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    accelerator = Accelerator(cpu=True)
    rank, n = accelerator.process_index, accelerator.num_processes
    scenarios = {"off": scenario_off, "slow": scenario_slow}
    out: Dict[str, Any] = {"lazy_imports": LAZY}
    for name in scenarios if scenario == "all" else [scenario]:  # "all": one launch, one import
        out[name] = {"rank": rank, "world_size": n}
        scenarios[name](accelerator, rank, n, out[name])
    launch.finish(outdir, rank, out)


if __name__ == "__main__":
    main()
