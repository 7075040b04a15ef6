"""Issue 25's measured targets for dropcompute.torch, in one sitting (README's Python table).

    python examples/bench_torch_targets.py [--nproc 4] [--repeats 5] [--params 1e6,5e7] [--out FILE.json]

1. Threshold off against plain DDP ``no_sync`` accumulation (examples/bench_torch_overhead.py,
   2 processes) at each ``--params``: the step time paired, plain DDP and the three modes
   (flat, overlap, and auto: the default, resolved by the gradients' size) as arms of one
   launch stepping in turn (``--mode paired``, ``--steps`` steps; the overhead is the median
   over steps of a mode's step time over DDP's in the same step), ``--overhead-rounds``
   launches, the median over them; and the peak memory growth of "ddp", "flat", "overlap", "auto",
   each its own launch (a peak is per process), launched alternately ``--overhead-rounds``
   times, the median per mode. Targets: overhead <= 2 % of the step time, peak <= DDP's + 5 %
   of the gradients' size.
2. One rank slowed (examples/pytorch_ddp.py, ``--nproc`` processes, seeds 0..repeats-1, each
   one run of plain DDP, the threshold-off baseline and DropCompute interleaved step by step):
   the median throughput ratio (target >= 1.30), the drop rate in every run (within the
   guardrail, 10 %), the predicted ratio against the measured one (target: within 3 %; against
   the whole run, and paired: over the steps the prediction replays, whose delays it saw), and the
   threshold-off overhead against plain DDP measured in the same interleaved runs (target
   <= 2 %: over the full steps, and the median of the paired steps' ratios).
Prints a Markdown table and the host load (1-minute load average) before and after.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent


def torchrun(nproc: int, script: str, *args: str) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(HERE / script), *args, "--out", str(out)]
        p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{cmd} failed:\n{p.stdout}\n{p.stderr}")
        result: Dict[str, Any] = json.loads(out.read_text())
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--params", default="1e6,5e7")
    ap.add_argument("--overhead-rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-example", action="store_true")
    ap.add_argument("--skip-memory", action="store_true", help="only the paired step times (no per-mode launches)")
    ap.add_argument("--example-epochs", type=int, default=40,
                    help="epochs of each example run (examples/pytorch_ddp.py --epochs; its own default is 5): a "
                         "run's measured ratio carries timing noise that only more steps average out (README)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--example-arg", dest="example_args", action="append", default=[],
                    help="passed to examples/pytorch_ddp.py (repeatable), e.g. --example-arg=--max-drop-rate=0.10")
    args = ap.parse_args()
    report: Dict[str, Any] = {"load_before": os.getloadavg()[0]}
    if not args.skip_overhead:
        rows: List[Dict[str, Any]] = []
        for params in args.params.split(","):
            runs: Dict[str, List[Dict[str, Any]]] = {"ddp": [], "flat": [], "overlap": [], "auto": []}
            for _ in range(0 if args.skip_memory else args.overhead_rounds):
                for mode in runs:
                    runs[mode].append(torchrun(2, "bench_torch_overhead.py", "--params", params, "--mode", mode,
                                               "--steps", str(args.steps)))
            pairs = [torchrun(2, "bench_torch_overhead.py", "--params", params, "--mode", "paired",
                              "--steps", str(args.steps)) for _ in range(args.overhead_rounds)]
            keys = ("step_ms", "peak_growth_mib", "file_growth_mib")
            nan = float("nan")
            med = {m: {k: statistics.median(r[k] for r in rs) if rs else nan for k in keys}
                   for m, rs in runs.items()}
            grad_mib = pairs[0]["params"] * 4 / 2**20
            for mode in ("flat", "overlap", "auto"):
                rows.append({
                    "params": pairs[0]["params"], "grad_mib": grad_mib,
                    "mode": f"auto ({pairs[0]['auto_resolved']})" if mode == "auto" else mode,
                    "ddp_step_ms": statistics.median(r["ddp_step_ms"] for r in pairs),
                    "step_ms": statistics.median(r[f"{mode}_step_ms"] for r in pairs),
                    "overhead": statistics.median(r[f"{mode}_overhead_paired"] for r in pairs),
                    "overhead_rounds": [r[f"{mode}_overhead_paired"] for r in pairs],
                    "ddp_peak_mib": med["ddp"]["peak_growth_mib"], "peak_mib": med[mode]["peak_growth_mib"],
                    "extra_peak_of_grads": (med[mode]["peak_growth_mib"] - med["ddp"]["peak_growth_mib"]) / grad_mib,
                    "extra_file_mib": med[mode]["file_growth_mib"] - med["ddp"]["file_growth_mib"],
                })
        report["overhead"] = rows
        print("| params | mode | DDP step ms | step ms | overhead (paired) | per launch | DDP peak MiB | peak MiB "
              "| extra peak / grads | of which code pages MiB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            each = ", ".join(f"{o:+.1%}" for o in r["overhead_rounds"])
            print(f"| {r['params']:,} | {r['mode']} | {r['ddp_step_ms']:.2f} | {r['step_ms']:.2f} | {r['overhead']:+.1%} "
                  f"| {each} "
                  f"| {r['ddp_peak_mib']:.1f} | {r['peak_mib']:.1f} | {r['extra_peak_of_grads']:+.1%} "
                  f"| {r['extra_file_mib']:+.1f} |")
    if not args.skip_example:
        ex = [torchrun(args.nproc, "pytorch_ddp.py", "--seed", str(s), "--epochs", str(args.example_epochs),
                       *args.example_args) for s in range(args.repeats)]
        report["example"] = ex
        print()
        print("| seed | load | baseline samples/s | DropCompute samples/s | ratio | predicted | error | replayed steps "
              "| their ratio | paired error | drop rate | predicted drop | overhead | paired overhead |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        nan = float("nan")
        for r in ex:
            p = r.get("predicted", {"ratio": nan, "drop_rate": nan, "paired": {"steps": 0, "ratio": nan, "error": nan}})
            print(f"| {r['seed']} | {r['load']:.1f} | {r['baseline']['throughput']:.0f} "
                  f"| {r['dropcompute']['throughput']:.0f} "
                  f"| {r['ratio']:.3f} | {p['ratio']:.3f} | {p['ratio'] / r['ratio'] - 1:+.1%} "
                  f"| {p['paired']['steps']} | {p['paired']['ratio']:.3f} | {p['paired']['error']:+.1%} "
                  f"| {r['dropcompute']['drop_rate']:.3f} | {p['drop_rate']:.3f} | {r['overhead']:+.1%} "
                  f"| {r['overhead_paired']:+.1%} |")
        print(f"median ratio {statistics.median(r['ratio'] for r in ex):.3f} over {len(ex)} runs")
    report["load_after"] = os.getloadavg()[0]
    print(f"host load (1 min): {report['load_before']:.2f} before, {report['load_after']:.2f} after")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
