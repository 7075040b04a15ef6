"""Micro-benchmark: the per-micro-batch deadline check from Python (issue 15, target <= 5 us).

Times 10^5 calls one by one with time.perf_counter_ns and reports medians, in the same run:
  empty       the timing loop with nothing inside (the floor),
  decide      Policy.should_start (the crate's policy::decide through pyo3),
  check       what DropComputeStep does before each micro-batch on CPU: the host clock's
              elapsed_ns() plus should_start.
The cost is the median minus the empty loop's median. Exit status 1 if check costs > 5 us.

usage: python examples/bench_deadline_check.py [--calls N]
"""

import argparse
import statistics
import sys
import time
from typing import Callable, List

import torch

import dropcompute
from dropcompute.torch import DeviceClock


def per_call_ns(fn: Callable[[], object], calls: int) -> List[int]:
    clock = time.perf_counter_ns
    out = [0] * calls
    for i in range(calls):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=100_000)
    args = p.parse_args()
    policy = dropcompute.Policy(10**12, "before", warmup_steps=0, min_micro_batches=1)
    clock = DeviceClock(torch.device("cpu"))
    clock.start()

    def empty() -> None:
        return None

    def decide() -> bool:
        return policy.should_start(123_456, None, step=10, started=3)

    def check() -> bool:
        return policy.should_start(clock.read(clock.mark()), None, step=10, started=3)

    med = {name: statistics.median(per_call_ns(fn, args.calls)) for name, fn in
           [("empty", empty), ("decide", decide), ("check", check)]}
    base = med["empty"]
    print(f"median over {args.calls} calls (ns): empty {base:.0f}, decide {med['decide']:.0f}, check {med['check']:.0f}")
    cost_decide = (med["decide"] - base) / 1e3
    cost_check = (med["check"] - base) / 1e3
    print(f"cost over the empty loop: decide {cost_decide:.3f} us, check (clock + decide) {cost_check:.3f} us "
          f"(target <= 5 us)")
    sys.exit(0 if cost_check <= 5.0 else 1)


if __name__ == "__main__":
    main()
