"""DropCompute with PyTorch DDP: the digits MLP, one rank slowed, baseline vs DropCompute.

    python -m torch.distributed.run --standalone --nproc_per_node=4 examples/pytorch_ddp.py

Both runs start from the same parameters and see the same data order and the same injected
delays (common random numbers). The baseline is the threshold off (identical to a plain DDP
accumulation loop: python/tests/test_torch_ddp.py). The DropCompute threshold is recommended by
`dropcompute.recommend` from the baseline's measured micro-batch latencies (all-gathered, so
every rank gets the same threshold), replaying the check before each micro-batch. Prints
throughput (samples computed per second), mean step time, drop rate and test accuracy of both.

Gaudi: `--backend hccl --device hpu` imports habana_frameworks.torch and times micro-batches
with torch.hpu.Event. NOT VERIFIED here (no Gaudi on the machines this was written on).

Data: data/digits.csv.gz (UCI digits, see data/README.md): 1437 training rows sharded by rank,
360 held out.
"""

import argparse
import gzip
import os
import random
import time
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeStep

DATA = Path(__file__).resolve().parent.parent / "data" / "digits.csv.gz"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or hccl (Gaudi, not verified)")
    p.add_argument("--device", default="cpu", help="cpu or hpu (Gaudi, not verified)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--micro-batches", type=int, default=8, help="M micro-batches per step and rank")
    p.add_argument("--micro-batch-size", type=int, default=4, help="b samples per micro-batch")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--slow-rank", type=int, default=1, help="the rank that is slowed")
    p.add_argument("--slow-ms", type=float, default=20.0, help="delay added to a slowed micro-batch (ms)")
    p.add_argument("--slow-prob", type=float, default=0.25, help="probability a micro-batch of the slow rank is slowed")
    p.add_argument("--threshold-ms", type=float, default=None, help="override the recommended threshold (ms)")
    p.add_argument("--data", type=Path, default=DATA)
    return p.parse_args()


def load_digits(path: Path) -> Tuple[torch.Tensor, torch.Tensor]:
    with gzip.open(path, "rt") as f:
        arr = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return torch.from_numpy(arr[:, :64] / 16.0), torch.from_numpy(arr[:, 64].astype(np.int64))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def run(args: argparse.Namespace, threshold_ns: "int | None", x: torch.Tensor, y: torch.Tensor,
        device: torch.device) -> Tuple[torch.nn.Module, dict, np.ndarray]:
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model().to(device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    ctl = DropComputeStep(ddp, dropcompute.Policy(threshold_ns, "before", warmup_steps=0, min_micro_batches=1))
    m, b = args.micro_batches, args.micro_batch_size
    shard = torch.arange(rank, x.shape[0], n)
    per_step = m * b
    steps_per_epoch = shard.numel() // per_step
    delays = random.Random(1234 + rank)  # same delays in both runs (common random numbers)
    lat: List[List[int]] = []
    computed = 0
    dropped = 0
    step_ns: List[int] = []

    def loss_fn(mod: torch.nn.Module, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if rank == args.slow_rank and delays.random() < args.slow_prob:
            time.sleep(args.slow_ms / 1e3)
        xb, yb = mb
        return torch.nn.functional.cross_entropy(mod(xb), yb, reduction="sum")

    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(epoch)
        order = shard[torch.randperm(shard.numel(), generator=g)]
        for s in range(steps_per_epoch):
            idx = order[s * per_step : (s + 1) * per_step].view(m, b)
            mbs = [(x[i].to(device), y[i].to(device)) for i in idx]
            t0 = time.perf_counter_ns()
            ctl.start_clock()
            res = ctl.run(mbs, loss_fn)
            res.apply(opt)  # steps unless no rank computed anything or the gradient is not finite
            step_ns.append(time.perf_counter_ns() - t0)
            computed += sum(res.counts)
            dropped += res.dropped_micro_batches
            # Measured latencies of the M micro-batches (0 for a dropped one; only the baseline,
            # which drops nothing, is tuned from).
            lat.append(res.latencies_ns + [0] * (m - len(res.latencies_ns)))
    total_s = sum(step_ns) / 1e9
    drop = torch.tensor([float(dropped)])
    dist.all_reduce(drop)
    stats = {
        "throughput": computed / total_s,
        "step_ms": sum(step_ns) / len(step_ns) / 1e6,
        "drop_rate": float(drop) / (n * m * len(step_ns)),
    }
    return ddp.module, stats, np.asarray(lat, dtype=np.float64)  # (steps, M)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    with torch.no_grad():
        return float((model(x.to(device)).argmax(1).cpu() == y).float().mean())


def main() -> None:
    args = parse_args()
    if args.device == "hpu":
        import habana_frameworks.torch.core  # noqa: F401  (Gaudi bridge; not verified here)
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    x, y = load_digits(args.data)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(42))
    train, test = perm[:1437], perm[1437:]

    base_model, base, lat = run(args, None, x[train], y[train], device)
    # Every rank's (steps, M) latencies -> one (N, M, steps) array, identical on every rank.
    t = torch.from_numpy(lat)
    gathered = [torch.zeros_like(t) for _ in range(n)]
    dist.all_gather(gathered, t)
    trace = np.stack([g.numpy().T for g in gathered])
    if args.threshold_ms is not None:
        threshold_ns = int(args.threshold_ms * 1e6)
        how = f"--threshold-ms {args.threshold_ms}"
    else:
        v = dropcompute.recommend(trace, check="before", max_drop_rate=0.10)
        threshold_ns = int(v.threshold_ns) if v.threshold_ns is not None else None
        how = repr(v)
    dc_model, dc, _ = run(args, threshold_ns, x[train], y[train], device)
    if rank == 0:
        acc_b = accuracy(base_model, x[test], y[test], device)
        acc_d = accuracy(dc_model, x[test], y[test], device)
        print(f"world size {n}, M={args.micro_batches}, b={args.micro_batch_size}, rank {args.slow_rank} slowed "
              f"{args.slow_ms} ms with probability {args.slow_prob}")
        print(f"threshold: {how}")
        print(f"{'run':<12} {'samples/s':>10} {'step ms':>9} {'drop rate':>10} {'test acc':>9}")
        print(f"{'baseline':<12} {base['throughput']:>10.1f} {base['step_ms']:>9.2f} {base['drop_rate']:>10.3f} {acc_b:>9.3f}")
        print(f"{'dropcompute':<12} {dc['throughput']:>10.1f} {dc['step_ms']:>9.2f} {dc['drop_rate']:>10.3f} {acc_d:>9.3f}")
        print(f"throughput ratio {dc['throughput'] / base['throughput']:.3f} (samples computed per second, same run)")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
