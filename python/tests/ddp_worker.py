"""One rank of the DDP tests (run by test_torch_ddp.py under `python -m torch.distributed.run`).

usage: ddp_worker.py SCENARIO OUTDIR. Writes OUTDIR/rank{r}.json with what it measured; asserts
what one rank can check itself (a failed assert exits non-zero and fails the pytest).
"""

import contextlib
import copy
import datetime
import json
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeStep

B = 4  # micro-batch size (samples)
D_IN, D_H, D_OUT = 8, 16, 3


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_H), torch.nn.Tanh(), torch.nn.Linear(D_H, D_OUT)).double()


def data(rank: int, step: int, m: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return [(torch.randn(B, D_IN, generator=g, dtype=torch.float64), torch.randint(0, D_OUT, (B,), generator=g))
            for _ in range(m)]


def sum_loss(mod: torch.nn.Module, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = mb
    return torch.nn.functional.cross_entropy(mod(x), y, reduction="sum")


def reference_grad(params0: torch.nn.Module, counts: List[int], step: int, m: int) -> List[torch.Tensor]:
    """f64 sum of per-sample gradients over every rank's computed micro-batches (the first
    counts[r] / B of rank r's), divided by the global computed count."""
    ref = copy.deepcopy(params0)
    acc = [torch.zeros_like(p) for p in ref.parameters()]
    for r, c in enumerate(counts):
        for x, y in data(r, step, m)[: c // B]:
            for i in range(B):
                ref.zero_grad()
                sum_loss(ref, (x[i : i + 1], y[i : i + 1])).backward()
                for a, p in zip(acc, ref.parameters()):
                    a += p.grad
    total = float(sum(counts))
    return [a / total for a in acc]


class CountCollectives:
    """Counts torch.distributed.all_reduce calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._orig = dist.all_reduce

    def __enter__(self) -> "CountCollectives":
        def counted(*a: Any, **k: Any) -> Any:
            self.calls += 1
            return self._orig(*a, **k)

        dist.all_reduce = counted  # type: ignore[assignment]
        return self

    def __exit__(self, *a: object) -> None:
        dist.all_reduce = self._orig


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    timeout = 5 if scenario == "timeout" else 120
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    out: Dict[str, Any] = {"rank": rank, "world_size": n}
    net = model()
    ddp = DDP(copy.deepcopy(net))
    hook_calls = [0]

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        hook_calls[0] += 1
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, hook)  # DDP's own bucketed all-reduce must never run
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    if scenario == "off":
        m, steps = 4, 3
        ctl = DropComputeStep(ddp, dropcompute.Policy())
        plain = DDP(copy.deepcopy(net))
        popt = torch.optim.SGD(plain.parameters(), lr=0.1)
        calls = []
        for s in range(steps):
            mbs = data(rank, s, m)
            with CountCollectives() as cc:
                res = ctl.run(mbs, sum_loss)
            calls.append(cc.calls)
            opt.step()
            popt.zero_grad()
            for i, (x, y) in enumerate(mbs):
                ctx = plain.no_sync() if i < m - 1 else contextlib.nullcontext()
                with ctx:
                    (torch.nn.functional.cross_entropy(plain(x), y) / m).backward()
            popt.step()
            assert res.counts == [m * B] * n and res.divisor == n * m * B, res
        diff = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), plain.module.parameters()))
        moved = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), net.parameters()))
        out.update(all_reduce_calls=calls, max_param_diff=diff, moved=moved)
    elif scenario in ("slow", "idle", "allidle"):
        m = 8
        if scenario == "slow":
            policy = dropcompute.Policy(200_000_000, warmup_steps=0, min_micro_batches=1)
        else:
            policy = dropcompute.Policy(100_000_000, warmup_steps=0, min_micro_batches=0)
        ctl = DropComputeStep(ddp, policy)
        slow = 1

        def loss_fn(mod: torch.nn.Module, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            if scenario == "slow" and rank == slow:
                time.sleep(0.06)
            return sum_loss(mod, mb)

        ctl.start_clock()
        if (scenario == "idle" and rank == slow) or scenario == "allidle":
            time.sleep(0.15)
        p0 = copy.deepcopy(ddp.module)
        with CountCollectives() as cc:
            res = ctl.run(data(rank, 0, m), loss_fn)
        grads = [p.grad.detach().clone() for p in ddp.module.parameters()]
        if res.skipped:
            err = max(float(g.abs().max()) for g in grads)
            expected = dropcompute.divisor(np.asarray(res.counts, dtype=np.uint64))
            assert expected is None
        else:
            ref = reference_grad(p0, res.counts, 0, m)
            err = max(float((g - r).abs().max() / max(float(r.abs().max()), 1e-300)) for g, r in zip(grads, ref))
            assert res.divisor == dropcompute.divisor(np.asarray(res.counts, dtype=np.uint64)) == sum(res.counts)
        opt.step()
        out.update(counts=res.counts, computed=res.computed_micro_batches, dropped=res.dropped_micro_batches,
                   skipped=res.skipped, divisor=res.divisor, grad_rel_err=err, all_reduce_calls=[cc.calls])
    elif scenario == "log":
        m, steps = 4, 12
        path = os.path.join(outdir, f"compute_log_rank{rank}.csv")
        ctl = DropComputeStep(ddp, dropcompute.Policy(), compute_log=path)
        for s in range(steps):
            ctl.run(data(rank, s, m), sum_loss)
            opt.step()
        ctl.close()
        out["log"] = path
    elif scenario == "timeout":
        ctl = DropComputeStep(ddp, dropcompute.Policy())
        if rank != 0:
            time.sleep(15)  # never joins the step's all-reduce
            os._exit(0)
        t0 = time.monotonic()
        try:
            ctl.run(data(rank, 0, 2), sum_loss)
            out["raised"] = None
        except TimeoutError as e:
            out["raised"] = "TimeoutError"
            out["message"] = str(e)
        out["waited_s"] = time.monotonic() - t0
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
        os._exit(0)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    out["ddp_hook_calls"] = hook_calls[0]
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
