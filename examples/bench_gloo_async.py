"""What an asynchronous gloo all-reduce costs the host's compute on a machine whose cores the
ranks' compute fills (why overlap mode's 6-int count collective costs about a millisecond per
step at 1 M parameters on the 2-core CI machine; README's Python section).

usage: python -m torch.distributed.run --standalone --nproc_per_node=2 examples/bench_gloo_async.py

Rank 0 prints, in one run: a tiny (6 x int64) all-reduce issued blocking on an idle host, the
time of a fixed matrix loop alone, and the same loop with the tiny all-reduce issued
asynchronously before it and waited after it (median of 200 repetitions each)."""

import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.zeros(6, dtype=torch.int64)
    a, b = torch.randn(300, 300), torch.randn(300, 300)

    def compute() -> None:
        for _ in range(20):
            a @ b

    def timed(fn: object, reps: int = 200) -> float:
        out = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e3

    def overlapped() -> None:
        work = dist.all_reduce(t, async_op=True)
        compute()
        work.wait()

    for _ in range(20):
        dist.all_reduce(t)
    blocking = timed(lambda: dist.all_reduce(t))
    alone = timed(compute)
    beside = timed(overlapped)
    if dist.get_rank() == 0:
        print(f"tiny all-reduce, blocking: {blocking:.3f} ms; compute alone {alone:.3f} ms; compute with the "
              f"all-reduce beside it {beside:.3f} ms ({beside / alone - 1:+.1%})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
