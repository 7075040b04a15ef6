"""Overhead of dropcompute.torch at threshold off against plain DDP ``no_sync`` accumulation:
step time and peak memory, paired in one sitting (issue 25's targets: overhead <= 2 % of step
time, peak memory <= DDP + 5 % of the gradients' size).

usage (one configuration per launch, so that each peak RSS is its own):
    python -m torch.distributed.run --standalone --nproc_per_node=2 examples/bench_torch_overhead.py \
        --params 1e6 --mode ddp|flat|overlap|auto [--steps 20] [--out FILE.json]
or, for the step time only, the four arms paired in one launch:
    ... examples/bench_torch_overhead.py --params 1e6 --mode paired [--steps 60] [--parts] [--out FILE.json]
(``--parts``: two more arms, a second plain DDP, the run's noise floor, and plain DDP plus only
the step's count collective: what the count collective costs by itself).

``--mode paired`` runs plain DDP and the three modes (``auto``: the step's default, which resolves
to flat or overlap by the gradients' size, ``overlap.overlap_pays``; printed as
``auto_resolved``) as arms of one process group, each its own model (the
same initial parameters), optimizer and micro-batches, step by step in an order drawn per step
(no arm always follows another); the overhead of a mode is the median over steps of its step
time over plain DDP's in the same step (paired: the same load hits both), and its median step
time is printed beside it. Separate launches (the other modes) differ by the load of the
minutes between them: plain DDP alone measured 1037 to 1165 ms a step at 50 M in one sitting.

Each rank builds an MLP of about ``--params`` parameters (float32), runs ``--steps`` steps of
M = 4 micro-batches (b = 16), the first 3 not timed; rank 0 prints (and writes with --out) the
median step time (ms) and the peak resident set growth during the steps over the resident set
after the model's and DDP's setup (MiB: the kernel's peak, VmHWM, reset with
``/proc/self/clear_refs``; DropCompute's own buffers are inside it, as DDP's gradients, made by
its first backward, are; tensors this large are mapped and unmapped directly by the allocator,
so the peak is the tensors' own). The gradients' size is
printed beside it, and the growth of the file-backed resident set (RssFile: the code pages of
torch a mode runs for the first time, shared by the ranks, no allocation of ours; overlap mode's
Python comm hook path adds about 1.6 MiB over DDP's built-in all-reduce) and of the anonymous
one (RssAnon) at the end. Below a few MiB the peak is dominated by those pages and by the C
heap's reuse of freed blocks (plain DDP at 1 M: 25.8 and 36.0 MiB in two runs of 8 steps); the
tensor-level peak, exact, is python/tests/test_step_memory.py's. The CPU, gloo; host load is
printed with the numbers. Linux only.
"""

import argparse
import json
import os
import random
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeStep
from dropcompute.torch.reduce import Counts

M, B = 4, 16
#: The reduce path each DropCompute arm ran, by its requested mode (``auto`` resolved).
RESOLVED: Dict[str, str] = {}


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM, RssFile, RssAnon)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> int:
    """Resets the peak resident set (VmHWM) to the current one; returns it (KiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")


def mlp(params: float) -> torch.nn.Module:
    # 3 square layers of width w: about 3 w^2 parameters.
    w = max(int((params / 3) ** 0.5), 8)
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                               torch.nn.Linear(w, w))


Batch = Tuple[torch.Tensor, torch.Tensor]


def arm(mode: str, ddp: torch.nn.Module, opt: torch.optim.Optimizer, batches: List[Batch]) -> Callable[[], None]:
    """One step of ``mode`` on ``ddp`` (a DDP module of ``mlp``) and ``opt``: plain DDP
    ``no_sync`` accumulation (mean loss / M, the last micro-batch synced; "ddp", "ddp_again",
    and "ddp_counts" with the step's count collective added, see ``paired``), or
    ``DropComputeStep`` at threshold off in that mode (made here: its flat buffers are
    allocated now; the mode it ran, ``auto`` resolved, goes to ``RESOLVED[mode]``)."""
    if mode in ("ddp", "ddp_again", "ddp_counts"):
        counts = mode == "ddp_counts"
        rank, n = dist.get_rank(), dist.get_world_size()

        def plain() -> None:
            opt.zero_grad()
            work = None
            for i, (x, y) in enumerate(batches):
                if i < M - 1:
                    with ddp.no_sync():
                        (torch.nn.functional.mse_loss(ddp(x), y, reduction="sum") / (M * B)).backward()
                else:
                    if counts:  # the step's count collective, where overlap mode issues it
                        work = Counts(rank=rank, world_size=n, samples=M * B, started=M, used=[],
                                      device=x.device, group=None, step=0, handed=M)
                    (torch.nn.functional.mse_loss(ddp(x), y, reduction="sum") / (M * B)).backward()
            if work is not None:
                work.result(None)
            opt.step()
        return plain
    ctl = DropComputeStep(ddp, dropcompute.Policy(), mode=mode, micro_batch_size=B)
    RESOLVED[mode] = ctl.mode

    def step() -> None:
        ctl.run(batches, lambda mod, mb: torch.nn.functional.mse_loss(mod(mb[0]), mb[1], reduction="sum")).apply(opt)
    return step


def model_and_optimizer(params: float) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A DDP module of ``mlp(params)`` (the same initial parameters every call) and its SGD."""
    ddp = DDP(mlp(params))
    return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)


def paired(params: float, steps: int, batches: List[Batch], rank: int, parts: bool = False) -> Dict[str, object]:
    """``--mode paired``: the four arms step by step, in an order drawn per step (the same on
    every rank: one seed); per arm the median step time (the first 3 steps not counted) and per
    arm but DDP the median over steps of its time over DDP's in the same step. ``parts`` adds
    two arms: ``ddp_again`` (a second plain DDP: the run's noise floor) and ``ddp_counts``
    (plain DDP plus only the step's count collective, ``reduce.Counts``, issued before the last
    micro-batch's forward and waited for after its backward, as overlap mode does)."""
    arm_names = ("ddp", "flat", "overlap", "auto") + (("ddp_again", "ddp_counts") if parts else ())
    arms = {m: arm(m, *model_and_optimizer(params), batches) for m in arm_names}
    order = random.Random(0)
    times: Dict[str, List[float]] = {m: [] for m in arms}
    for s in range(steps):
        names = list(arms)
        order.shuffle(names)
        for m in names:
            dist.barrier()
            t0 = time.perf_counter()
            arms[m]()
            if s >= 3:
                times[m].append(time.perf_counter() - t0)
    res: Dict[str, object] = {"mode": "paired", "steps": len(times["ddp"]), "auto_resolved": RESOLVED["auto"]}
    for m, ts in times.items():
        res[f"{m}_step_ms"] = statistics.median(ts) * 1e3
    for m in arm_names[1:]:
        res[f"{m}_overhead_paired"] = statistics.median(t / d for t, d in zip(times[m], times["ddp"])) - 1
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=1e6)
    ap.add_argument("--mode", choices=["ddp", "flat", "overlap", "auto", "paired"], required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--parts", action="store_true",
                    help="with --mode paired: also a second plain DDP arm and plain DDP plus the count collective")
    ap.add_argument("--out")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode == "paired":
        w = mlp(args.params)[0].in_features
        g = torch.Generator().manual_seed(rank)
        mbs: List[Batch] = [(torch.randn(B, w, generator=g), torch.randn(B, w, generator=g)) for _ in range(M)]
        out: Dict[str, object] = paired(args.params, args.steps, mbs, rank, args.parts)
        out["params"] = sum(p.numel() for p in mlp(args.params).parameters())
        out["load"] = os.getloadavg()[0]
        emit(out, rank, args.out)
        dist.barrier()
        dist.destroy_process_group()
        return
    ddp, opt = model_and_optimizer(args.params)
    w = ddp.module[0].in_features
    n_params = sum(p.numel() for p in ddp.parameters())
    g = torch.Generator().manual_seed(rank)
    batches: List[Batch] = [(torch.randn(B, w, generator=g), torch.randn(B, w, generator=g)) for _ in range(M)]
    dist.barrier()
    # The peak counts from here: DropCompute's own buffers (the flat gradients, made by `arm`)
    # are inside it, as plain DDP's gradients, allocated by its first backward, are.
    base = reset_peak()
    file0, anon0 = status_kib("RssFile"), status_kib("RssAnon")
    step = arm(args.mode, ddp, opt, batches)
    times = []
    for s in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        if s >= 3:
            times.append(t1 - t0)
    peak = status_kib("VmHWM")
    res = {
        "mode": args.mode, "resolved": RESOLVED.get(args.mode, args.mode), "params": n_params, "grad_mib": n_params * 4 / 2**20,
        "step_ms": statistics.median(times) * 1e3, "peak_growth_mib": (peak - base) / 1024,
        "file_growth_mib": (status_kib("RssFile") - file0) / 1024,
        "anon_growth_mib": (status_kib("RssAnon") - anon0) / 1024,
        "load": os.getloadavg()[0],
    }
    emit(res, rank, args.out)
    dist.barrier()
    dist.destroy_process_group()


def emit(res: Dict[str, object], rank: int, out: Optional[str]) -> None:
    """Rank 0 prints ``res`` as JSON and writes it to ``out``."""
    if rank == 0:
        print(json.dumps(res))
        if out:
            with open(out, "w") as f:
                json.dump(res, f)


if __name__ == "__main__":
    main()
