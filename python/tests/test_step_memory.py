"""Peak tensor memory of a threshold-off step against plain DDP ``no_sync`` accumulation (issue 25's
target: peak <= DDP + 5 % of the gradients' size), counted in bytes the tensor allocator handed out
(memory_worker.py: ``torch.profiler``'s allocation records), not in resident set: exact and
repeatable, so a copy of the gradients or a bucket made by the step fails it at any load.

What the resident-set peak of examples/bench_torch_overhead.py adds on top and this test leaves out
(measured at 1 M parameters, 2 ranks, README): the code pages a mode runs for the first time (file
backed, shared by the ranks, about 1.6 MiB more for overlap mode's Python comm hook path than for
DDP's built-in all-reduce) and the C heap's reuse of freed blocks (run-to-run noise of several MiB).

Limit: the profiler records the allocations of the thread that runs the step; the comm hook's
future callback runs on gloo's thread, so an allocation there (a copy of a bucket in ``rescale``)
is not counted (checked: a ``clone()`` kept there does not move these numbers). The hook's own
body, the step, the flat buffers and ``apply`` run on the step's thread and are counted."""

from pathlib import Path
from typing import Any, Dict

import launch  # python/tests/launch.py: the one worker launcher


def test_peak_tensor_memory_is_ddps_plus_under_5_percent_of_the_gradients(tmp_path: Path) -> None:
    ranks = launch.torchrun("memory_worker.py", "peaks", tmp_path)
    for out in ranks:
        by: Dict[Any, Dict[str, Any]] = {(p["params"], p["mode"]): p for p in out["peaks"]}
        sizes = sorted({p["params"] for p in out["peaks"]})
        assert len(sizes) == 2, sizes
        for params in sizes:
            ddp, flat, overlap = (by[(params, m)] for m in ("ddp", "flat", "overlap"))
            grads = ddp["grad_bytes"]
            assert grads == 4 * params
            # Plain DDP holds its gradients and its buckets (about 2x the gradients) at least.
            assert ddp["peak_bytes"] >= 2 * grads, ddp
            # Overlap runs DDP's own buckets: what it adds is a few small tensors (the count
            # collective's, the rescale factor, the most recent micro-batch's reference).
            assert overlap["peak_bytes"] - ddp["peak_bytes"] <= 0.05 * grads, (overlap, ddp)
            # The flat path's .grad are views of its buffer: no separate DDP buckets or gradients.
            assert flat["peak_bytes"] <= ddp["peak_bytes"] - 0.5 * grads, (flat, ddp)
        # What overlap adds does not grow with the model (the larger model is 8.8x the smaller).
        extra = [by[(p, "overlap")]["peak_bytes"] - by[(p, "ddp")]["peak_bytes"] for p in sizes]
        assert extra[1] <= max(extra[0], 0) + 0.01 * by[(sizes[1], "ddp")]["grad_bytes"], extra
