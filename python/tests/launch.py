"""The one launcher of the Python tests' workers: ``python -m torch.distributed.run`` on the CPU
(gloo), one OpenMP thread per process; a worker writes ``rank{r}.json`` into the output folder it
is given after its scenario name."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Union

HERE = Path(__file__).resolve().parent


def run_workers(script: Union[str, Path], args: Sequence[str], nproc: int = 2, timeout: float = 600,
                **env_extra: str) -> "subprocess.CompletedProcess[str]":
    """Runs ``script`` (a path, or a file name in python/tests) with ``args`` on ``nproc`` ranks;
    the finished process, whatever its exit status (raises ``subprocess.TimeoutExpired`` after
    ``timeout`` s)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **env_extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def torchrun(worker: str, scenario: str, outdir: Path, nproc: int = 2, **env_extra: str) -> List[Dict[str, Any]]:
    """Runs ``worker``'s ``scenario`` on ``nproc`` ranks and returns every rank's output, by rank;
    fails the test with the launch's output when it exits non-zero."""
    outdir.mkdir(parents=True, exist_ok=True)
    p = run_workers(worker, [scenario, str(outdir)], nproc, **env_extra)
    assert p.returncode == 0, f"{p.args} failed:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(nproc)]


def finish(outdir: str, rank: int, out: Dict[str, Any]) -> None:
    """A worker's end: writes ``out`` to ``rank{rank}.json`` in ``outdir``, waits for every rank
    and destroys the process group (when one is up), then leaves without the interpreter's
    teardown, where gloo's threads once raced static destructors ("terminate called without an
    active exception", exit -6, once in 4 full runs on a rank that computed nothing)."""
    import torch.distributed as dist

    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker_main(scenarios: Dict[str, Any]) -> None:
    """A worker's main: ``argv`` is (scenario, outdir); joins the gloo group (300 s timeout),
    runs ``scenarios[scenario](rank, world_size, out)`` on one thread and ``finish``es."""
    import datetime

    import torch
    import torch.distributed as dist

    scenario, outdir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    out: Dict[str, Any] = {}
    scenarios[scenario](rank, n, out)
    finish(outdir, rank, out)
