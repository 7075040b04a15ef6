"""One rank of the step-memory test (run by test_step_memory.py under `python -m torch.distributed.run`).

usage: memory_worker.py peaks OUTDIR. For each model size and mode ("ddp": plain DDP ``no_sync``
accumulation, "flat", "overlap") it builds a fresh MLP and DDP module, runs 3 threshold-off steps
of M micro-batches under ``torch.profiler`` with ``profile_memory=True`` and records the peak of
the live bytes the tensor allocator handed out (the running sum of its allocation and free
records, from the profiler's start: the step's own buffers, DDP's gradients and buckets, the
activations; not the process's resident set, which also counts the code pages a mode runs for
the first time and the C heap's reuse of freed blocks). Writes OUTDIR/rank{r}.json with
``{"peaks": [{"mode", "params", "grad_bytes", "peak_bytes"}, ...]}``.
"""

import datetime
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

import dropcompute
from dropcompute.torch import DropComputeStep

import launch  # python/tests/launch.py: the workers' one ending

M, B = 4, 8
#: Hidden widths: 3 square layers of w x w (+ biases): about 3 w^2 parameters (0.05 M and 0.43 M).
WIDTHS = (128, 380)
MODES = ("ddp", "flat", "overlap")


def peak_live_bytes(prof: Any) -> int:
    """The most bytes live at once during ``prof``, counted from its start (the running sum of
    its ``[memory]`` records, in time order; a tensor freed in the window but allocated before
    it counts negative, so the start is the floor)."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def one(mode: str, width: int, rank: int) -> Dict[str, Any]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                              torch.nn.ReLU(), torch.nn.Linear(width, width))
    params = sum(p.numel() for p in net.parameters())
    ddp = DDP(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches: List[Tuple[torch.Tensor, torch.Tensor]] = [
        (torch.randn(B, width, generator=g), torch.randn(B, width, generator=g)) for _ in range(M)]
    dist.barrier()
    ctl: Optional[DropComputeStep] = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        # The step's own buffers (the flat path's) are made inside the window, as DDP's
        # gradients, made by its first backward, are.
        if mode != "ddp":
            ctl = DropComputeStep(ddp, dropcompute.Policy(), mode=mode, micro_batch_size=B, micro_batches_per_step=M)
        for _ in range(3):
            if ctl is None:
                opt.zero_grad()
                for i, (x, y) in enumerate(batches):
                    loss = torch.nn.functional.mse_loss(ddp(x), y, reduction="sum") / (M * B)
                    if i < M - 1:
                        with ddp.no_sync():
                            loss.backward()  # type: ignore[no-untyped-call]
                    else:
                        loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
            else:
                ctl.run(batches, lambda mod, mb: torch.nn.functional.mse_loss(mod(mb[0]), mb[1], reduction="sum")
                        ).apply(opt)
    if ctl is not None:
        ctl.close()
    return {"mode": mode, "params": params, "grad_bytes": params * 4, "peak_bytes": peak_live_bytes(prof)}


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    if scenario != "peaks":
        raise SystemExit(f"unknown scenario {scenario}")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    out: Dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size(),
                           "peaks": [one(mode, w, rank) for w in WIDTHS for mode in MODES]}
    launch.finish(outdir, rank, out)


if __name__ == "__main__":
    main()
