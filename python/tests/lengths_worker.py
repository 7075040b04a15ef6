"""One rank of the length-bucket torch tests (run by test_lengths_torch.py under
`python -m torch.distributed.run`, CPU, gloo).

usage: lengths_worker.py SCENARIO OUTDIR (SCENARIO: "length-predictive" or "cost-balance"). Writes
OUTDIR/rank{r}.json with what it measured and the f64 reference gradient computed here (every
rank's started micro-batches, sample by sample, divided by the global started tokens).
"""

import copy
import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeSampler, DropComputeStep

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_worker import D_IN, D_OUT, model, rel_err, same_on_every_rank, sum_loss  # noqa: E402

import launch  # python/tests/launch.py: the workers' one ending

B, M, STEPS, WARMUP = 4, 4, 4, 1
MS = 1_000_000  # ns
LENS = [64, 512]
#: Sleep (s) of a micro-batch by bucket: the long bucket 20x the short one.
SLEEP = [0.001, 0.020]
#: Buckets of each rank's micro-batches: rank 1 holds the long ones.
BUCKETS = [[0, 0, 0, 0], [0, 0, 1, 1]]
THRESHOLD = 40 * MS

Mb = Tuple[torch.Tensor, torch.Tensor, int]


def gather(obj: Any) -> List[Any]:
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def tokens_of(rank: int, step: int, j: int, bucket: int) -> int:
    """Real tokens of a micro-batch: B rows of at most the bucket's length."""
    return B * LENS[bucket] - (7 * step + 3 * j + rank) % 50


def grad_sum_f64(net0: torch.nn.Module, mbs: List[Tuple[torch.Tensor, torch.Tensor]]) -> List[torch.Tensor]:
    """Sum of per-sample gradients of ``sum_loss`` over ``mbs``, sample by sample, float64."""
    ref = copy.deepcopy(net0).double()
    acc = [torch.zeros_like(p) for p in ref.parameters()]
    for x, y in mbs:
        for i in range(x.shape[0]):
            ref.zero_grad()
            sum_loss(ref, (x[i : i + 1].double(), y[i : i + 1])).backward()
            for a, p in zip(acc, ref.parameters()):
                a += p.grad
    return acc


def scenario_length_predictive(rank: int, n: int, out: Dict[str, Any]) -> None:
    """STEPS steps of M micro-batches per rank, rank 1's last two of the long bucket, under
    ``length-predictive``: the walk prices each next micro-batch by its bucket's estimate."""
    policy = dropcompute.Policy(THRESHOLD, warmup_steps=WARMUP, kind="length-predictive", bucket_lengths=LENS)
    net = model()
    ddp = DDP(net, broadcast_buffers=False)
    est = dropcompute.LatencyEstimator(8, 0.5)
    ctl = DropComputeStep(ddp, policy, micro_batches_per_step=M, estimator=est, sync_lag=0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    rows: List[Dict[str, Any]] = []

    def loss_fn(mod: torch.nn.Module, mb: Mb) -> torch.Tensor:
        time.sleep(SLEEP[mb[2]])
        return sum_loss(mod, (mb[0], mb[1]))

    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * rank + step)
        bk = BUCKETS[rank]
        mbs: List[Mb] = [(torch.randn(B, D_IN, generator=g, dtype=torch.float64),
                          torch.randint(0, D_OUT, (B,), generator=g), b) for b in bk]
        tk = [tokens_of(rank, step, j, b) for j, b in enumerate(bk)]
        before = copy.deepcopy(net)
        res = ctl.run(mbs, loss_fn, buckets=bk, tokens=tk)
        k = res.computed_micro_batches
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in net.parameters()]
        every = gather(([(x, y) for x, y, _ in mbs[:k]], sum(tk[:k])))
        tokens = sum(t for _, t in every)
        acc = grad_sum_f64(before, [mb for r, _ in every for mb in r])
        ref = [a / float(tokens) for a in acc]
        rows.append(dict(step=step, started=res.started, counts=res.counts, divisor=res.divisor,
                         ref_tokens=tokens, my_tokens=sum(tk[:k]), grad_rel_err=rel_err(grads, ref),
                         same=same_on_every_rank(grads), latencies_ns=res.latencies_ns))
        res.apply(opt)
    ctl.close()
    out["length-predictive"] = dict(rows=rows, estimates=[est.estimate(b) for b in range(len(LENS))],
                                    blind=est.estimate())


def sample_bucket(i: int) -> int:
    """Sample i's length bucket: every 7th sample is long."""
    return 1 if i % 7 == 0 else 0


def scenario_cost_balance(rank: int, n: int, out: Dict[str, Any]) -> None:
    """One epoch of 96 samples in micro-batches of 2, dealt by cost (``take_by_cost``) under
    ``cost-balance`` with a job-wide estimator fed every rank's gathered (bucket, latency)
    pairs in rank order (identical on every rank); threshold 25 ms drops some micro-batches,
    which go back to the stream."""
    samples, b = 96, 2
    policy = dropcompute.Policy(25 * MS, warmup_steps=WARMUP, kind="cost-balance", bucket_lengths=LENS)
    sampler = DropComputeSampler(samples, b, M, rank=rank, world_size=n, seed=5, epochs=1)
    net = model()
    ddp = DDP(net, broadcast_buffers=False)
    est = dropcompute.LatencyEstimator(8, 0.5)
    job = dropcompute.LatencyEstimator(16, 0.5)
    ctl = DropComputeStep(ddp, policy, micro_batches_per_step=M, estimator=est, sync_lag=0)
    g = torch.Generator().manual_seed(9)
    xs = torch.randn(samples, D_IN, generator=g, dtype=torch.float64)
    ys = torch.randint(0, D_OUT, (samples,), generator=g)
    computed: List[int] = []
    rows: List[Dict[str, Any]] = []

    def bucket_of(ids: List[int]) -> int:
        return max(sample_bucket(i) for i in ids)

    def loss_fn(mod: torch.nn.Module, mb: Mb) -> torch.Tensor:
        time.sleep(SLEEP[mb[2]])
        return sum_loss(mod, (mb[0], mb[1]))

    while True:
        taken = sampler.take_by_cost(bucket_of, job, bucket_lengths=LENS)
        if taken is None:
            break
        ids, bk = taken
        tk = [sum(LENS[sample_bucket(i)] for i in mb) for mb in ids]
        res = ctl.run([(xs[mb], ys[mb], k) for mb, k in zip(ids, bk)], loss_fn, buckets=bk, tokens=tk)
        k = res.computed_micro_batches
        every = gather(([list(map(int, mb)) for mb in ids], bk[:k], res.latencies_ns))
        for r_ids, r_bk, r_lat in every:
            for bb, lat in zip(r_bk, r_lat):
                job.observe(lat, bucket=bb)
        dealt = [[i for mb in r_ids for i in mb] for r_ids, _, _ in every]
        computed.extend(i for (r_ids, _, _), s in zip(every, res.started) for mb in r_ids[:s] for i in mb)
        rows.append(dict(dealt_counts=[len(r_ids) for r_ids, _, _ in every], started=res.started,
                         dealt=dealt, divisor=res.divisor, counts=res.counts,
                         long=[sum(bb for bb in r_bk) for _, r_bk, _ in every]))
        sampler.settle(res.started)
    ctl.close()
    out["cost-balance"] = dict(rows=rows, computed=sorted(computed), samples=samples,
                               job=[job.estimate(x) for x in range(len(LENS))])


SCENARIOS: Dict[str, Callable[[int, int, Dict[str, Any]], None]] = {
    "length-predictive": scenario_length_predictive,
    "cost-balance": scenario_cost_balance,
}


def main() -> None:
    launch.worker_main(SCENARIOS)


if __name__ == "__main__":
    main()
