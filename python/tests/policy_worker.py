"""One rank of the step-policy tests (run by test_torch_policies.py under
`python -m torch.distributed.run`).

usage: policy_worker.py SCENARIO OUTDIR (SCENARIO: "policies" (every step policy, and in flat
mode the retuner too) or "retune"; DC_MODE: flat or overlap). Writes OUTDIR/rank{r}.json with
what it measured and the reference computations made here (a reference Assigner / Retuner fed
latencies gathered apart from the step, the f64 reference gradient of every rank's computed
micro-batches); asserts what one rank can check.
"""

import copy
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeSampler, DropComputeStep

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_worker import D_IN, D_OUT, Batch, model, reference_grad, rel_err, sum_loss  # noqa: E402

import launch  # python/tests/launch.py: the workers' one ending

B, M = 4, 4
MS = 1_000_000  # ns
# Per micro-batch sleep (s) by rank: rank 1 is the slowed rank.
SLEEP = [0.001, 0.010]
WARMUP = 1


def step_policies() -> List[Tuple[str, dropcompute.Policy, dropcompute.StepPolicy]]:
    """Every step policy, with the job's deadline policy it runs with."""
    before = dropcompute.Policy(15 * MS, check="before", warmup_steps=WARMUP)
    pred = dropcompute.Policy(15 * MS, check="predictive", warmup_steps=WARMUP)
    off = dropcompute.Policy(None, warmup_steps=WARMUP)
    sp = dropcompute.StepPolicy
    return [
        ("synchronous", off, sp("synchronous")),
        ("drop-before", before, sp("drop-before")),
        ("drop-predictive", pred, sp("drop-predictive")),
        ("rebalance", off, sp("rebalance")),
        ("rebalance-drop", before, sp("rebalance-drop")),
        ("compute-budget", before, sp("compute-budget", budget_ns=20 * MS)),  # rank 0: 5+ in 20 ms
        ("backup-workers", off, sp("backup-workers", backup_workers=1)),
    ]


def gather(obj: Any) -> List[Any]:
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def mean_or_nan(xs: List[int]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def run_policy(rank: int, n: int, mode: str, policy: dropcompute.Policy, sp: dropcompute.StepPolicy) -> Dict[str, Any]:
    """One epoch of 128 samples under ``sp`` with rank 1 slowed, dealt by the assignment."""
    samples = 128
    sampler = DropComputeSampler(samples, B, M, rank=rank, world_size=n, seed=3, epochs=1)
    net = model()
    ddp = DDP(net, broadcast_buffers=False)
    est = dropcompute.LatencyEstimator()
    ctl = DropComputeStep(ddp, policy, micro_batches_per_step=M, mode=mode, step_policy=sp, estimator=est,
                          sync_lag=1 if mode == "overlap" else 0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(samples, D_IN, generator=g, dtype=torch.float64)
    ys = torch.randint(0, D_OUT, (samples,), generator=g)
    ref = dropcompute.Assigner(sp, n, M, warmup_steps=policy.warmup_steps)
    rows: List[Dict[str, Any]] = []
    computed: List[int] = []

    def loss_fn(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
        time.sleep(SLEEP[rank])
        return sum_loss(mod, mb)

    while True:
        assignment = ctl.assignment()
        assert assignment == ref.assignment(), (assignment, ref.assignment())
        ids = sampler.take(assignment)
        if ids is None:
            break
        before = copy.deepcopy(net)
        res = ctl.run([(xs[i], ys[i]) for i in ids], loss_fn)
        mine = ids[: res.computed_micro_batches]
        every = gather([list(map(int, x)) for x in mine])
        computed.extend(i for r in every for mb in r for i in mb)
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in net.parameters()]
        ref_grad = reference_grad(before, [[(xs[i], ys[i]) for i in r] for r in every])
        # The reference latencies: every rank's own latencies, gathered here (not by the step).
        lat = gather(res.latencies_ns)
        per_mb = [mean_or_nan(x) for x in lat]
        ref.observe(res.step, per_mb)
        rows.append(dict(step=res.step, assignment=res.assignment, dealt=gather(len(ids)), started=res.started,
                         counts=res.counts, divisor=res.divisor, grad_rel_err=rel_err(grads, ref_grad),
                         rank_latency_ns=res.rank_latency_ns, ref_latency_ns=per_mb,
                         threshold_ns=res.threshold_ns))
        sampler.settle(res.started)
        res.apply(opt)
    ctl.close()
    return dict(rows=rows, computed=sorted(computed), samples=samples, state=ctl.state_dict().get("assigner"))


def scenario_policies(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Every step policy over one epoch with rank 1 slowed (table-driven: one launch)."""
    mode = os.environ.get("DC_MODE", "flat")
    for name, policy, sp in step_policies():
        if mode == "overlap" and sp.learns:
            try:
                DropComputeStep(DDP(model(), broadcast_buffers=False), policy, micro_batches_per_step=M, mode=mode,
                                step_policy=sp)
            except ValueError as e:
                out[name] = {"refused": str(e)}
            continue
        out[name] = run_policy(rank, n, mode, policy, sp)
    if mode == "flat":
        out["retune"] = {}
        scenario_retune(rank, n, out["retune"])
        # Ranks with different step policies (the same collective shapes) are refused on every rank.
        sp = dropcompute.StepPolicy("rebalance" if rank == 0 else "backup-workers")
        ctl = DropComputeStep(DDP(model(), broadcast_buffers=False), dropcompute.Policy(None), micro_batches_per_step=M,
                              step_policy=sp)
        g = torch.Generator().manual_seed(rank)
        mbs = [(torch.randn(B, D_IN, generator=g, dtype=torch.float64), torch.randint(0, D_OUT, (B,), generator=g))
               for _ in range(M)]
        try:
            ctl.run(mbs, sum_loss)
            out["mismatch"] = "accepted"
        except ValueError as e:
            out["mismatch"] = str(e)


def scenario_retune(rank: int, n: int, out: Dict[str, Any]) -> None:
    """The retuner and the straggler tracker in the step: rank 1's last micro-batch is slow
    (30 ms, the others 2 ms); after the 10-step probe the retuner enables a threshold that
    drops it, identical on every rank and equal to a reference Retuner fed the gathered
    latencies."""
    mode = os.environ.get("DC_MODE", "flat")
    steps = 14
    kw: Dict[str, Any] = dict(period=100, probe_steps=10, max_drop_rate=0.25, min_gain=0.0)
    rt = dropcompute.Retuner(n, M, **kw)
    ref = dropcompute.Retuner(n, M, **kw)
    tracker = dropcompute.StragglerTracker(n)
    net = model()
    ddp = DDP(net, broadcast_buffers=False)
    ctl = DropComputeStep(ddp, dropcompute.Policy(None, check="before", warmup_steps=0), micro_batches_per_step=M,
                          mode=mode, retuner=rt, stragglers=tracker, sync_lag=1 if mode == "overlap" else 0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    rows: List[Dict[str, Any]] = []
    ref_thresholds: List[Optional[int]] = []
    for s in range(steps):
        mbs = [(torch.randn(B, D_IN, generator=g, dtype=torch.float64), torch.randint(0, D_OUT, (B,), generator=g))
               for _ in range(M)]
        calls = [0]

        def loss_fn(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
            calls[0] += 1
            time.sleep(0.030 if rank == 1 and calls[0] == M else 0.002)
            return sum_loss(mod, mb)

        ref_thresholds.append(ref.threshold_ns)
        res = ctl.run(mbs, loss_fn)
        lat = gather(res.latencies_ns)
        mat = np.full((n, M), np.nan)
        for r, row in enumerate(lat):
            mat[r, : len(row)] = row
        compute = gather(res.compute_ns)
        ref.on_step(mat, float(max(compute)))
        rows.append(dict(step=s, threshold_ns=res.threshold_ns, started=res.started, retune=res.retune,
                         compute_ns=compute))
        res.apply(opt)
    out.update(rows=rows, ref_thresholds=ref_thresholds, next_threshold=rt.threshold_ns,
               ref_next=ref.threshold_ns, tracker_steps=tracker.steps, labels=tracker.labels(),
               hits=tracker.hits)


SCENARIOS: Dict[str, Callable[[int, int, Dict[str, Any]], None]] = {
    "policies": scenario_policies, "retune": scenario_retune,
}


def main() -> None:
    launch.worker_main(SCENARIOS)


if __name__ == "__main__":
    main()
