"""DropCompute with PyTorch DDP: the digits MLP, one rank slowed, baseline vs DropCompute.

    python -m torch.distributed.run --standalone --nproc_per_node=4 examples/pytorch_ddp.py

A paired comparison:
- both runs start from the same parameters and deal the data the same way (``DropComputeSampler``,
  the crate's global dealer: one shuffled stream per epoch, micro-batches not started dealt again,
  so every sample is computed once per epoch in both runs);
- both see the same injected delays: the delay of micro-batch i of step s on rank r is drawn from
  a generator keyed by (seed, r, s, i), whatever ran before it (the mock device's keyed draws);
- the baseline is the threshold off (identical to a plain DDP accumulation loop:
  python/tests/test_torch_ddp.py) and writes one compute log per rank, with each step's clock
  start, so the step overhead outside the compute phase is recorded;
- the threshold is ``dropcompute.recommend`` over every rank's log (the before-check replayed on
  the recorded latencies and overhead, guardrail: ``--max-drop-rate``) or ``--threshold-ms``; the
  prediction for it (``dropcompute.simulate`` of the run's policy on those logs: effective
  speedup and drop rate) is printed beside the measurement.

Measured: samples computed per second (throughput; the ratio minus 1 is the effective speedup,
the quantity the prediction names), mean step time, drop rate (micro-batches not started over
those handed out) and test accuracy. ``--out FILE`` writes rank 0's numbers as JSON.

Gaudi: ``--backend hccl --device hpu`` imports habana_frameworks.torch and times micro-batches
with torch.hpu.Event. NOT VERIFIED here (no Gaudi on the machines this was written on).

Data: data/digits.csv.gz (UCI digits, see data/README.md): 1437 training rows, 360 held out.
"""

import argparse
import gzip
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeSampler, DropComputeStep

DATA = Path(__file__).resolve().parent.parent / "data" / "digits.csv.gz"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or hccl (Gaudi, not verified)")
    p.add_argument("--device", default="cpu", help="cpu or hpu (Gaudi, not verified)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--micro-batches", type=int, default=8, help="M micro-batches per step and rank")
    p.add_argument("--micro-batch-size", type=int, default=4, help="b samples per micro-batch")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0, help="keys the injected delays and the data order")
    p.add_argument("--slow-rank", type=int, default=1, help="the rank that is slowed")
    p.add_argument("--slow-ms", type=float, default=20.0, help="delay added to a slowed micro-batch (ms)")
    p.add_argument("--slow-prob", type=float, default=0.25, help="probability a micro-batch of the slow rank is slowed")
    p.add_argument("--max-drop-rate", type=float, default=0.10, help="the tuner's drop-rate guardrail")
    p.add_argument("--threshold-ms", type=float, default=None, help="override the recommended threshold (ms)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=None, help="write rank 0's numbers as JSON")
    p.add_argument("--log-dir", type=Path, default=None,
                   help="keep the baseline's compute logs here (rank{r}.csv; default: a temporary directory, "
                        "removed) and the DropCompute run's (dropcompute_rank{r}.csv)")
    return p.parse_args()


def load_digits(path: Path) -> Tuple[torch.Tensor, torch.Tensor]:
    with gzip.open(path, "rt") as f:
        arr = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return torch.from_numpy(arr[:, :64] / 16.0), torch.from_numpy(arr[:, 64].astype(np.int64))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def delay_s(args: argparse.Namespace, rank: int, step: int, i: int) -> float:
    """The injected delay of micro-batch ``i`` of ``step`` on ``rank`` (seconds): keyed, so both
    runs see the same delay in the same slot whatever ran before."""
    if rank != args.slow_rank:
        return 0.0
    r = random.Random(f"{args.seed}/{rank}/{step}/{i}")
    return args.slow_ms / 1e3 if r.random() < args.slow_prob else 0.0


def run(args: argparse.Namespace, policy: "dropcompute.Policy", x: torch.Tensor, y: torch.Tensor,
        device: torch.device, log: Optional[str]) -> Tuple[torch.nn.Module, Dict[str, float]]:
    rank, n = dist.get_rank(), dist.get_world_size()
    m, b = args.micro_batches, args.micro_batch_size
    model = make_model().to(device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    step = DropComputeStep(ddp, policy, micro_batch_size=b, micro_batches_per_step=m, compute_log=log)
    sampler = DropComputeSampler(x.shape[0], b, m, rank=rank, world_size=n, seed=args.seed, epochs=args.epochs)
    at = {"step": 0, "i": 0}

    def loss_fn(mod: torch.nn.Module, mb: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        d = delay_s(args, rank, at["step"], at["i"])
        at["i"] += 1
        if d:
            time.sleep(d)
        xb, yb = mb
        return torch.nn.functional.cross_entropy(mod(xb), yb, reduction="sum")

    computed = dropped = handed = steps = 0
    dist.barrier()
    t0 = time.perf_counter_ns()
    while (ids := sampler.take()) is not None:
        at["i"] = 0
        step.start_clock()
        res = step.run([(x[i].to(device), y[i].to(device)) for i in ids], loss_fn)
        sampler.settle(res.started)
        res.apply(opt)  # steps unless no rank computed anything or the gradient is not finite
        computed += sum(res.counts)
        dropped += res.dropped_micro_batches
        handed += len(ids)
        steps += 1
        at["step"] += 1
    total_ns = time.perf_counter_ns() - t0
    step.close()
    # Micro-batches handed out and not started, every rank's (the last steps of the stream hand
    # out fewer than M).
    mine = torch.tensor([float(dropped), float(handed)], dtype=torch.float64)
    dist.all_reduce(mine)
    stats = {
        "throughput": computed / (total_ns / 1e9),
        "step_ms": total_ns / steps / 1e6,
        "drop_rate": float(mine[0] / mine[1]),
        "steps": float(steps),
        "samples": float(computed),
    }
    return ddp.module, stats


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

    keep = args.log_dir is not None
    if keep and rank == 0:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    where: List[Optional[str]] = [str(args.log_dir) if keep else tempfile.mkdtemp(prefix="dropcompute-ddp-")
                                  if rank == 0 else None]
    dist.broadcast_object_list(where)
    logs = [os.path.join(str(where[0]), f"rank{r}.csv") for r in range(n)]
    base_model, base = run(args, dropcompute.Policy(), x[train], y[train], device, logs[rank])
    dist.barrier()  # every log is complete: every rank reads them all and decides alike
    verdict = None
    if args.threshold_ms is not None:
        threshold_ns: Optional[int] = int(args.threshold_ms * 1e6)
        how = f"--threshold-ms {args.threshold_ms}"
    else:
        verdict = dropcompute.recommend(logs, check="before", max_drop_rate=args.max_drop_rate)
        threshold_ns = verdict.threshold_ns
        how = repr(verdict)
    policy = dropcompute.Policy(threshold_ns, "before", warmup_steps=0, min_micro_batches=1)
    # The prediction for the threshold the run uses (recommended or given): the crate's replay of
    # this policy on the baseline's logs (latencies and step overhead), as `dropcompute simulate`.
    predicted = dropcompute.simulate(logs, policy) if threshold_ns is not None else None
    # With --log-dir the DropCompute run keeps its own logs beside (dropcompute_rank{r}.csv): its
    # steps against the replay's, step by step (README: the prediction's error, found so).
    dc_log = os.path.join(str(where[0]), f"dropcompute_rank{rank}.csv") if keep else None
    dc_model, dc = run(args, policy, x[train], y[train], device, dc_log)
    if rank == 0:
        acc_b = accuracy(base_model, x[test], y[test], device)
        acc_d = accuracy(dc_model, x[test], y[test], device)
        ratio = dc["throughput"] / base["throughput"]
        print(f"world size {n}, M={args.micro_batches}, b={args.micro_batch_size}, rank {args.slow_rank} slowed "
              f"{args.slow_ms} ms with probability {args.slow_prob}, seed {args.seed}")
        print(f"threshold: {how}")
        print(f"{'run':<12} {'samples/s':>10} {'step ms':>9} {'drop rate':>10} {'test acc':>9}")
        print(f"{'baseline':<12} {base['throughput']:>10.1f} {base['step_ms']:>9.2f} {base['drop_rate']:>10.3f} {acc_b:>9.3f}")
        print(f"{'dropcompute':<12} {dc['throughput']:>10.1f} {dc['step_ms']:>9.2f} {dc['drop_rate']:>10.3f} {acc_d:>9.3f}")
        print(f"throughput ratio {ratio:.3f} (samples computed per second, same sitting)")
        out = {"world_size": n, "seed": args.seed, "threshold_ns": threshold_ns, "baseline": base, "dropcompute": dc,
               "ratio": ratio, "accuracy": {"baseline": acc_b, "dropcompute": acc_d}, "load": os.getloadavg()[0]}
        if predicted is not None:
            p_ratio = 1.0 + predicted["effective_speedup"]
            print(f"predicted: ratio {p_ratio:.3f}, drop rate {predicted['drop_rate']:.3f} "
                  f"(measured {ratio:.3f}, {dc['drop_rate']:.3f}: ratio error {p_ratio / ratio - 1:+.1%})")
            out["predicted"] = {"ratio": p_ratio, "drop_rate": predicted["drop_rate"]}
        if args.out is not None:
            args.out.write_text(json.dumps(out, indent=1))
    dist.barrier()
    if rank == 0 and not keep:
        shutil.rmtree(str(where[0]), ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
