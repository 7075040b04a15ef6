"""One rank of the DDP tests (run by test_torch_ddp.py under `python -m torch.distributed.run`).

usage: ddp_worker.py SCENARIO OUTDIR. Writes OUTDIR/rank{r}.json with what it measured; asserts
what one rank can check itself (a failed assert exits non-zero and fails the pytest).
"""

import contextlib
import copy
import datetime
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import dropcompute
from dropcompute.torch import DropComputeSampler, DropComputeStep
from dropcompute.torch.reduce import agree

import launch  # python/tests/launch.py: the workers' one ending

B = 4  # micro-batch size (samples)
D_IN, D_H, D_OUT = 8, 16, 3
Batch = Tuple[torch.Tensor, torch.Tensor]


def model(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_H), torch.nn.Tanh(), torch.nn.Linear(D_H, D_OUT)).to(dtype)


def data(rank: int, step: int, m: int, b: int = B, dtype: torch.dtype = torch.float64) -> List[Batch]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return [(torch.randn(b, D_IN, generator=g, dtype=torch.float64).to(dtype), torch.randint(0, D_OUT, (b,), generator=g))
            for _ in range(m)]


def sum_loss(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
    x, y = mb
    return torch.nn.functional.cross_entropy(mod(x), y, reduction="sum")


def reference_grad(net0: torch.nn.Module, batches: List[List[Batch]]) -> List[torch.Tensor]:
    """f64 mean of per-sample gradients over every rank's computed micro-batches
    (``batches[r]``), computed sample by sample on a float64 copy."""
    ref = copy.deepcopy(net0).double()
    acc = [torch.zeros_like(p) for p in ref.parameters()]
    total = 0
    for mbs in batches:
        for x, y in mbs:
            for i in range(x.shape[0]):
                ref.zero_grad()
                sum_loss(ref, (x[i : i + 1].double(), y[i : i + 1])).backward()
                for a, p in zip(acc, ref.parameters()):
                    a += p.grad
                total += 1
    return [a / total for a in acc]


def rel_err(got: List[torch.Tensor], ref: List[torch.Tensor]) -> float:
    return max(float((g.double() - r).abs().max() / max(float(r.abs().max()), 1e-300)) for g, r in zip(got, ref))


def same_on_every_rank(ts: List[torch.Tensor]) -> bool:
    """Whether these tensors are bitwise identical on every rank (gathered and compared)."""
    flat = torch.cat([t.detach().double().reshape(-1) for t in ts])
    out = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return all(bool(torch.equal(o, out[0])) for o in out)


class CountCollectives:
    """Counts torch.distributed.all_reduce calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._orig = dist.all_reduce

    def __enter__(self) -> "CountCollectives":
        def counted(*a: Any, **k: Any) -> Any:
            self.calls += 1
            return self._orig(*a, **k)

        dist.all_reduce = counted  # type: ignore[assignment]
        return self

    def __exit__(self, *a: object) -> None:
        dist.all_reduce = self._orig


def no_ddp_hook(ddp: DDP) -> List[int]:
    calls = [0]

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls[0] += 1
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, hook)  # DDP's own bucketed all-reduce must never run
    return calls


def reducer_buckets(ddp: DDP) -> int:
    """Buckets DDP's own reducer all-reduced in its latest recorded synced backward (DDP's
    logging data, recorded at the next synced forward and in each of the first 10 iterations):
    the witness that overlap mode ran DDP's built-in reduction, which no Python call shows."""
    return int(ddp._get_ddp_logging_data().get("num_buckets_reduced", 0))


def plain_accumulate(plain: DDP, mbs: List[Batch], scale: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> None:
    """Plain DDP gradient accumulation over ``mbs`` (the reference): zeroed gradients, mean loss
    / M per micro-batch under ``no_sync`` but the last; ``scale`` wraps each loss (a GradScaler)."""
    m = len(mbs)
    for p in plain.parameters():
        p.grad = None
    for i, (x, y) in enumerate(mbs):
        with plain.no_sync() if i < m - 1 else contextlib.nullcontext():
            scale(torch.nn.functional.cross_entropy(plain(x), y) / m).backward()


def scenario_off(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Threshold off: the same parameters as plain DDP no_sync accumulation (mean loss / M)."""
    m, steps = 4, 3
    net = model()
    ddp = DDP(copy.deepcopy(net))
    overlap = mode() == "overlap"
    hook_calls = [0] if overlap else no_ddp_hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ctl = DropComputeStep(ddp, dropcompute.Policy(), mode=mode())
    plain = DDP(copy.deepcopy(net))
    popt = torch.optim.SGD(plain.parameters(), lr=0.1)
    calls = []
    for s in range(steps):
        mbs = data(rank, s, m)
        with CountCollectives() as cc:
            res = ctl.run(mbs, sum_loss)
        calls.append(cc.calls)
        assert res.apply(opt)
        plain_accumulate(plain, mbs)
        popt.step()
        assert res.counts == [m * B] * n and res.started == [m] * n and res.divisor == n * m * B, res
    diff = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), plain.module.parameters()))
    moved = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), net.parameters()))
    out.update(all_reduce_calls=calls, max_param_diff=diff, moved=moved, ddp_hook_calls=hook_calls[0],
               buckets=reducer_buckets(ddp))


def scenario_hook(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Overlap mode composes with the user's comm hook (bf16 compression): at threshold off the
    same parameters as plain DDP with the same hook; with a slowed rank the gradient is the
    mean over computed samples within bf16's rounding."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    m, steps = 4, 3
    net = model(torch.float32)
    ddp = DDP(copy.deepcopy(net))
    ctl = DropComputeStep(ddp, dropcompute.Policy(), mode="overlap", micro_batch_size=B, micro_batches_per_step=m,
                          comm_hook=default_hooks.bf16_compress_hook, comm_state=None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    plain = DDP(copy.deepcopy(net))
    plain.register_comm_hook(None, default_hooks.bf16_compress_hook)
    popt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for s in range(steps):
        mbs = data(rank, s, m, dtype=torch.float32)
        ctl.run(mbs, sum_loss).apply(opt)
        plain_accumulate(plain, mbs)
        popt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), plain.module.parameters()))
    out.update(max_param_diff=diff, buckets=reducer_buckets(ddp))


def scenario_joininf(rank: int, n: int, out: Dict[str, Any]) -> None:
    """A rank whose previous micro-batch held an inf sample and that computes nothing in this
    step joins with exact zeros (in overlap mode its zero-weighted backward reruns that
    micro-batch, and 0 x inf is NaN): the step is finite and equals the f64 mean over the
    computing rank's samples, on every rank, in mode DC_MODE."""
    m = 2
    net = model()
    ddp = DDP(copy.deepcopy(net))
    ctl = DropComputeStep(ddp, dropcompute.Policy(min_micro_batches=0), mode=mode())
    first = data(rank, 0, m)
    if rank == 1:
        first[-1][0][0, 0] = float("inf")
    r0 = ctl.run(first, sum_loss)
    mbs = data(rank, 1, m) if rank == 0 else []
    r1 = ctl.run(mbs, sum_loss)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ddp.module.parameters()]
    ref = reference_grad(net, [data(0, 1, m), []])
    out.update(first_finite=r0.finite(), finite=r1.finite(), started=r1.started, grad_rel_err=rel_err(grads, ref),
               same_everywhere=same_on_every_rank(grads))


def mode() -> str:
    return os.environ.get("DC_MODE", "flat")


def scenario_k(rank: int, n: int, out: Dict[str, Any]) -> None:
    """k in {0, 1, M} on different ranks (rank r computes DC_KS[r] micro-batches, "M" = all), in
    mode DC_MODE: equal accumulated gradients on every rank, equal to the f64 reference.

    Steps 0 and 1 are warm-up steps (every rank computes everything, not applied; DDP rebuilds
    its buckets in the first forward after its first synced backward, a collective that would
    stall the fast ranks' first micro-batch); step 2 is measured.
    Flat (sync lag 0): k = 0: the rank is 150 ms late before its first micro-batch; k = 1: its
    first micro-batch takes 150 ms. Overlap (sync lag 1: the first launch never waits): k = 0:
    the rank is dealt nothing; k = 1: it is 150 ms late. k = M: four fast micro-batches."""
    m = 4
    want = [m if k == "M" else int(k) for k in os.environ["DC_KS"].split(",")][rank]
    net = model()
    ddp = DDP(copy.deepcopy(net))
    overlap = mode() == "overlap"
    hook_calls = [0] if overlap else no_ddp_hook(ddp)
    # Identical on every rank: 100 ms deadline, two warm-up steps, no minimum.
    ctl = DropComputeStep(ddp, dropcompute.Policy(100_000_000, warmup_steps=2, min_micro_batches=0), mode=mode())
    ctl.run(data(rank, 0, m), sum_loss)
    ctl.run(data(rank, 0, m), sum_loss)
    late = (want == 0 and not overlap) or (want == 1 and overlap)

    def loss_fn(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
        if want == 1 and not overlap:
            time.sleep(0.15)
        return sum_loss(mod, mb)

    ctl.start_clock()
    if late:
        time.sleep(0.15)
    mbs = [] if (overlap and want == 0) else data(rank, 2, m)
    with CountCollectives() as cc:
        res = ctl.run(mbs, loss_fn)
    assert res.computed_micro_batches == want, (rank, res)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ddp.module.parameters()]
    ks = res.started
    ref = reference_grad(net, [data(r, 2, m)[: ks[r]] for r in range(n)])
    out.update(started=ks, counts=res.counts, divisor=res.divisor, grad_rel_err=rel_err(grads, ref),
               same_everywhere=same_on_every_rank(grads), all_reduce_calls=cc.calls, ddp_hook_calls=hook_calls[0],
               buckets=reducer_buckets(ddp))


def scenario_allidle(rank: int, n: int, out: Dict[str, Any]) -> None:
    """No rank computes anything: every rank skips the step, the scaler is untouched."""
    ddp = DDP(model())
    ctl = DropComputeStep(ddp, dropcompute.Policy(100_000_000, warmup_steps=0, min_micro_batches=0))
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.1)
    before = [p.detach().clone() for p in ddp.parameters()]
    ctl.start_clock()
    time.sleep(0.15)
    res = ctl.run(data(rank, 0, 4), sum_loss)
    stepped = res.apply(opt)
    moved = max(float((p - b).abs().max()) for p, b in zip(ddp.parameters(), before))
    out.update(counts=res.counts, skipped=res.skipped, divisor=res.divisor, stepped=stepped, moved=moved,
               grads_none=all(p.grad is None for p in ddp.parameters()))


def scenario_scaler(rank: int, n: int, out: Dict[str, Any]) -> None:
    """GradScaler: rank 1's loss overflows at steps 2 and 3; the scaler backs off and skips
    exactly as under plain DDP (the same scales, the same skipped steps, the LR scheduler
    stepped only with the optimizer, the same parameters after 6 steps)."""
    m, steps = 2, 6
    net = model(torch.float32)
    ddp = DDP(copy.deepcopy(net))
    ctl = DropComputeStep(ddp, dropcompute.Policy(), micro_batch_size=B, micro_batches_per_step=m, mode=mode())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=1000)
    plain = DDP(copy.deepcopy(net))
    popt = torch.optim.SGD(plain.parameters(), lr=0.1)
    psched = torch.optim.lr_scheduler.StepLR(popt, step_size=1, gamma=0.5)
    pscaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=1000)
    scales, pscales, stepped, pstepped = [], [], [], []
    for s in range(steps):
        blow = 1e36 if rank == 1 and s in (2, 3) else 1.0
        mbs = data(rank, s, m, dtype=torch.float32)
        res = ctl.run(mbs, lambda mod, mb: scaler.scale(sum_loss(mod, mb) * blow))
        stepped.append(res.apply(opt, scaler, sched))
        scales.append(scaler.get_scale())
        plain_accumulate(plain, mbs, lambda t: pscaler.scale(t * blow))
        before = pscaler.get_scale()
        pscaler.step(popt)
        pscaler.update()
        pstepped.append(pscaler.get_scale() >= before)
        if pstepped[-1]:
            psched.step()
        pscales.append(pscaler.get_scale())
    diff = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), plain.module.parameters()))
    out.update(scales=scales, plain_scales=pscales, stepped=stepped, plain_stepped=pstepped, max_param_diff=diff,
               lr=sched.get_last_lr(), plain_lr=psched.get_last_lr())


def scenario_dtypes(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Exact counts in bf16 (micro-batches of 257 and 1001 samples) and a mixed-dtype model
    (a float32 layer and a bfloat16 layer: each keeps its own buffer)."""
    torch.manual_seed(0)
    l1 = torch.nn.Linear(D_IN, D_H).float()
    l2 = torch.nn.Linear(D_H, D_OUT).bfloat16()

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = l1, l2

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.l2(torch.tanh(self.l1(x.float())).bfloat16()).float()

    net = Mixed()
    ctl = DropComputeStep(DDP(copy.deepcopy(net)), dropcompute.Policy())
    sizes = [257, 1001]
    g = torch.Generator().manual_seed(rank)
    mbs = [(torch.randn(b, D_IN, generator=g), torch.randint(0, D_OUT, (b,), generator=g)) for b in sizes]
    res = ctl.run(mbs, sum_loss)
    mod = ctl.model.module
    # Reference for the float32 layer: float64 arithmetic on the same (bf16) forward, summed over
    # every rank's samples and divided by the exact count.
    gath = [None] * n
    dist.all_gather_object(gath, [(x.tolist(), y.tolist()) for x, y in mbs])
    ref = copy.deepcopy(net)
    ref.zero_grad()
    total = 0
    for r_mbs in gath:
        for x, y in r_mbs:
            xt, yt = torch.tensor(x), torch.tensor(y)
            sum_loss(ref, (xt, yt)).backward()
            total += len(y)
    want = ref.l1.weight.grad.double() / total
    err = float((mod.l1.weight.grad.double() - want).abs().max() / want.abs().max())
    out.update(counts=res.counts, divisor=res.divisor, total=total, f32_rel_err=err,
               dtypes=sorted(str(b.dtype) for b in res._buffers))


def scenario_unused(rank: int, n: int, out: Dict[str, Any]) -> None:
    """A parameter no rank uses keeps grad None and AdamW does not move it; one used on one
    rank only is averaged over every rank's samples."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(D_IN, D_OUT).double()
            self.never = torch.nn.Linear(D_IN, D_OUT).double()
            self.rank0 = torch.nn.Linear(D_IN, D_OUT).double()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            return y + self.rank0(x) if dist.get_rank() == 0 else y

    net = Net()
    ddp = DDP(copy.deepcopy(net), find_unused_parameters=True)
    ctl = DropComputeStep(ddp, dropcompute.Policy())
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.1, weight_decay=0.1)
    res = ctl.run(data(rank, 0, 2), sum_loss)
    never = [p.grad is None for p in ddp.module.never.parameters()]
    rank0 = [p.grad is not None for p in ddp.module.rank0.parameters()]
    assert res.apply(opt)
    moved_never = max(float((a - b).abs().max()) for a, b in zip(ddp.module.never.parameters(), net.never.parameters()))
    out.update(never_none=never, rank0_has_grad=rank0, moved_never=moved_never,
               rank0_same=same_on_every_rank([p.grad for p in ddp.module.rank0.parameters()]))
    # Without find_unused_parameters (a parameter no rank uses), by mode; DDP's bucket cap below
    # the gradients, so that auto takes overlap: flat tracks unused parameters itself, overlap
    # (DDP's reducer) must refuse with the remedy, not a collective failure at the next step.
    class BodyOnly(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    no_find: Dict[str, Any] = {}
    for mode in ["flat", "overlap", "auto"]:
        ctl = DropComputeStep(DDP(BodyOnly(), bucket_cap_mb=0.0001), dropcompute.Policy(), mode=mode)
        try:
            for s in range(2):
                ctl.run(data(rank, s, 2), sum_loss)
            no_find[mode] = (ctl.mode, None)
        except ValueError as e:
            no_find[mode] = (ctl.mode, str(e))
    out["no_find"] = no_find


def scenario_refusals(rank: int, n: int, out: Dict[str, Any]) -> None:
    """A mean loss, a loss vector that is not one per sample without ``count_fn``, and ranks
    with different policies are refused on every rank."""
    ddp = DDP(model())
    ctl = DropComputeStep(ddp, dropcompute.Policy())
    errors = {}
    for name, fn in [
        ("mean", lambda mod, mb: torch.nn.functional.cross_entropy(mod(mb[0]), mb[1])),
        ("dot_mean", lambda mod, mb: mod(mb[0]).mean()),
    ]:
        try:
            ctl.run(data(rank, 0, 1), fn)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    # A loss vector longer than the micro-batch (per token, flattened) would be divided by a
    # count it does not sum over: refused unless count_fn says what it counts.
    def twice(mod: Any, mb: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(mod(mb[0]), mb[1], reduction="none").repeat(2)

    try:
        ctl.run(data(rank, 0, 1), twice)
        errors["per_token"] = None
    except ValueError as e:
        errors["per_token"] = str(e)
    counted = ctl.run(data(rank, 0, 1), twice, lambda mb: 2 * len(mb[0]))
    out["per_token_counted"] = [counted.samples, sum(counted.counts), 2 * len(data(rank, 0, 1)[0][0])]
    other = DropComputeStep(DDP(model()), dropcompute.Policy(threshold_ns=None if rank == 0 else 5_000_000_000))
    try:
        other.run(data(rank, 0, 1), sum_loss)
        errors["policy"] = None
    except ValueError as e:
        errors["policy"] = str(e)
    out["errors"] = errors


def scenario_iterable(rank: int, n: int, out: Dict[str, Any]) -> None:
    """A generator of micro-batches (no len()) with micro_batches_per_step: pulled lazily (the
    not-started ones never leave the generator); the same gradient as the list."""
    m = 4
    net = model()
    a = DropComputeStep(DDP(copy.deepcopy(net)), dropcompute.Policy(), micro_batches_per_step=m)
    b = DropComputeStep(DDP(copy.deepcopy(net)), dropcompute.Policy())
    pulled = []

    def gen() -> Any:
        for i, mb in enumerate(data(rank, 0, m)):
            pulled.append(i)
            yield mb

    ra = a.run(gen(), sum_loss)
    rb = b.run(data(rank, 0, m), sum_loss)
    same = all(torch.equal(p.grad, q.grad) for p, q in zip(a.model.module.parameters(), b.model.module.parameters()))
    try:
        DropComputeStep(DDP(copy.deepcopy(net)), dropcompute.Policy()).run(gen(), sum_loss)
        err = None
    except ValueError as e:
        err = str(e)
    out.update(pulled=pulled, same_as_list=same, counts=ra.counts, list_counts=rb.counts, no_len_error=err)


def scenario_sampler(rank: int, n: int, out: Dict[str, Any]) -> None:
    """DropComputeSampler over 2 epochs with rank 1 slowed: every sample computed exactly once
    per epoch, every rank stops at the same step, the replicas stay equal."""
    samples, b, m = 96, 4, 3
    sampler = DropComputeSampler(samples, b, m, rank=rank, world_size=n, seed=7, epochs=2)
    net = model()
    ddp = DDP(net)
    ctl = DropComputeStep(ddp, dropcompute.Policy(60_000_000, warmup_steps=0, min_micro_batches=1),
                          micro_batches_per_step=m, mode=mode())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(samples, D_IN, generator=g, dtype=torch.float64), torch.randint(0, D_OUT, (samples,), generator=g)
    computed: List[Tuple[int, List[int]]] = []  # (epoch, ids) of every started micro-batch
    steps, dropped = 0, 0
    while True:
        epoch = sampler.epoch
        mbs = sampler.take()
        if mbs is None:
            break

        def load(ids: List[int]) -> Batch:
            return xs[ids], ys[ids]

        def loss_fn(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
            if rank == 1:
                time.sleep(0.07)  # past the 60 ms deadline after 1 (sync lag 0) or 2 (lag 1) micro-batches
            return sum_loss(mod, mb)

        res = ctl.run([load(ids) for ids in mbs], loss_fn)
        computed.extend((epoch, ids) for ids in mbs[: res.computed_micro_batches])
        dropped += res.dropped_micro_batches
        sampler.settle(res.started)
        res.apply(opt)
        steps += 1
    state = sampler.state_dict()
    out.update(computed=computed, steps=steps, dropped=dropped, state=state["dealer"])


def scenario_guard(rank: int, n: int, outdir: str, out: Dict[str, Any]) -> None:
    """Rank 1 slowed (30 ms per micro-batch, past a 50 ms deadline after 2 of M = 4), a drop
    guard at 10 %: every step's result, the guard's counts and this rank's compute log."""
    m, steps = 4, 12
    path = os.path.join(outdir, f"guard_rank{rank}.csv")
    ddp = DDP(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    policy = dropcompute.Policy(50_000_000, "before", warmup_steps=0, min_micro_batches=1, drop_guard=0.10)
    ctl = DropComputeStep(ddp, policy, micro_batches_per_step=m, compute_log=path)

    def loss_fn(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
        if rank == 1:
            time.sleep(0.03)
        return sum_loss(mod, mb)

    enforced, started, thresholds = [], [], []
    for s in range(steps):
        res = ctl.run(data(rank, s, m), loss_fn)
        res.apply(opt)
        enforced.append(res.guard_enforced)
        started.append(sum(res.started))
        thresholds.append(res.threshold_ns)
    assert ctl.guard is not None
    state = ctl.state_dict()
    ctl.close()
    # The state restores the guard's counts; states no run writes are refused, naming the key.
    again = DropComputeStep(DDP(model()), policy, micro_batches_per_step=m)
    again.load_state_dict(state)
    assert again.guard is not None
    refusals = {}
    for name, g in [("inconsistent", [1, 2, 0, 0]), ("short", [1, 0, 0]), ("negative", [4, -1, 0, 0])]:
        try:
            again.load_state_dict({**state, "drop_guard": g})
            refusals[name] = None
        except ValueError as e:
            refusals[name] = str(e)
    out.update(enforced=enforced, started=started, thresholds=thresholds, counts=list(ctl.guard.counts),
               drop_rate=ctl.guard.drop_rate, log=path, state=state["drop_guard"],
               restored=list(again.guard.counts), refusals=refusals)


def scenario_static(rank: int, n: int, out: Dict[str, Any]) -> None:
    """DDP(static_graph=True) (needed with reentrant activation checkpointing): the flat path runs
    steps; overlap mode is refused, naming static_graph (DDP's own no_sync accumulation asserts
    under a static graph, pytorch #143580)."""
    ddp = DDP(model(), static_graph=True)
    try:
        ctl = DropComputeStep(ddp, dropcompute.Policy(), mode=mode())
    except ValueError as e:
        out["refused"] = str(e)
        return
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(3):
        res = ctl.run(data(rank, s, 3), sum_loss)
        res.apply(opt)
    out["steps"] = 3


def scenario_log(rank: int, n: int, outdir: str, out: Dict[str, Any]) -> None:
    m, steps = 4, 12
    path = os.path.join(outdir, f"compute_log_rank{rank}.csv")
    ddp = DDP(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ctl = DropComputeStep(ddp, dropcompute.Policy(), compute_log=path)
    for s in range(steps):
        ctl.run(data(rank, s, m), sum_loss).apply(opt)
    ctl.close()
    out["log"] = path


def scenario_timeout(rank: int, outdir: str, out: Dict[str, Any]) -> None:
    """Rank 1 runs the steps before DC_STALL_AT, then never joins (DC_PEER=stall: it sleeps
    past the timeout; DC_PEER=die: it exits, closing its connections); rank 0 reports what it
    raised in that step (the class, its bases, message, context attributes and cause) and how
    long it waited."""
    stall = int(os.environ.get("DC_STALL_AT", "0"))
    ctl = DropComputeStep(DDP(model()), dropcompute.Policy(), mode=mode())
    for s in range(stall):
        ctl.run(data(rank, s, 2), sum_loss)
    if rank != 0:
        if os.environ.get("DC_PEER", "stall") == "stall":
            time.sleep(15)  # never joins the step's collectives
        os._exit(0)
    t0 = time.monotonic()
    try:
        ctl.run(data(rank, stall, 2), sum_loss)
        out["raised"] = None
    except Exception as e:  # noqa: BLE001 (what was raised is the report)
        out["raised"] = type(e).__name__
        out["bases"] = [c.__name__ for c in type(e).__mro__]
        out["message"] = str(e)
        out["context"] = [getattr(e, "rank", None), getattr(e, "step", None), getattr(e, "collective", None)]
        out["cause"] = type(e.__cause__).__name__ if e.__cause__ is not None else None
    out["waited_s"] = time.monotonic() - t0
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    os._exit(0)


class FailingBackward(torch.autograd.Function):
    """The identity whose backward raises RuntimeError("boom"): an error of the backward itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        raise RuntimeError("boom")


def scenario_backward_error(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Every rank's last micro-batch (of 2) raises RuntimeError("boom") in its backward (in
    overlap mode: the synced one, where DDP's all-reduce runs): DC_FAIL=backward, an autograd
    function's backward; DC_FAIL=hook (overlap mode), the user's comm hook's own callback, after
    its all-reduce completed. What the step raises (the error itself, not a collective's: every
    rank is alive and issued its counts)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def failing_hook(state: Any, bucket: Any) -> Any:
        def fail(f: Any) -> Any:
            f.value()
            raise RuntimeError("boom")

        return default_hooks.allreduce_hook(state, bucket).then(fail)

    hook = os.environ.get("DC_FAIL", "backward") == "hook"
    ctl = DropComputeStep(DDP(model()), dropcompute.Policy(), mode=mode(),
                          **({"comm_hook": failing_hook, "comm_state": None} if hook else {}))
    calls = [0]

    def loss(mod: torch.nn.Module, mb: Batch) -> torch.Tensor:
        calls[0] += 1
        x, y = mb
        logits = mod(x)
        if calls[0] == 2 and not hook:
            logits = FailingBackward.apply(logits)
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum")

    try:
        ctl.run(data(rank, 0, 2), loss)
        out["raised"] = None
    except Exception as e:  # noqa: BLE001 (what was raised is the report)
        out["raised"] = type(e).__name__
        out["message"] = str(e)


def scenario_resume_mismatch(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Every rank runs a step and saves its state; the last rank restores a state that differs
    in DC_FIELD ("step": another step index; "drop_guard": other guard counts; "assigner": the
    drop-before step policy's assigner with another next assignment): the next step raises
    ValueError on every rank, naming the ranks that differ."""
    field = os.environ["DC_FIELD"]
    policy = dropcompute.Policy(drop_guard=0.5)
    sp = dropcompute.StepPolicy("drop-before") if field == "assigner" else None
    ctl = DropComputeStep(DDP(model()), policy, mode=mode(), step_policy=sp,
                          micro_batches_per_step=2 if sp is not None else None)
    ctl.run(data(rank, 0, 2), sum_loss)
    state = ctl.state_dict()
    if rank == n - 1:
        if field == "step":
            state["step"] += 3
        elif field == "assigner":
            a = json.loads(state["assigner"])
            assert a[0]["assignment"] == [2] * n, a
            a[0]["assignment"] = [1] + [2] * (n - 1)  # within the slots: a state, not a configuration
            state["assigner"] = json.dumps(a)
        else:
            handed, dropped, reserve, last = state[field]
            state[field] = [handed + 8, dropped, reserve, last]
        ctl.load_state_dict(state)
    try:
        ctl.run(data(rank, 1, 2), sum_loss)
        out["raised"] = None
    except ValueError as e:
        out["raised"] = str(e)


def scenario_fingerprint_mean(rank: int, n: int, out: Dict[str, Any]) -> None:
    """The configuration check with fingerprints 1, 2, 3 on ranks 0, 1, 2 (rank 1's is the
    others' mean: a summed check, n x mine == sum, misses it there): every rank raises."""
    try:
        agree(rank=rank, world_size=n, fingerprint=rank + 1, device=torch.device("cpu"), group=None, step=0,
              timeout=None)
        out["raised"] = None
    except ValueError as e:
        out["raised"] = str(e)


def scenario_late_recreate(rank: int, n: int, out: Dict[str, Any]) -> None:
    """The last rank enters its first step 1 s late, under a 300 ms threshold without warm-up:
    the others wait for it in the one-time configuration check, which is no compute (every rank
    computes all its micro-batches). Then every rank re-creates its step from its own
    ``state_dict`` (a restart): the new objects check again and the next step runs."""
    pol = dropcompute.Policy(300_000_000, warmup_steps=0)
    ddp = DDP(model())
    ctl = DropComputeStep(ddp, pol)
    late = rank == n - 1
    if late:
        time.sleep(1.0)
    first = ctl.run(data(rank, 0, 4), sum_loss)
    state = ctl.state_dict()  # every rank: a step object is made on every rank alike
    ctl.close()
    ctl = DropComputeStep(ddp, pol)
    ctl.load_state_dict(state)
    second = ctl.run(data(rank, 1, 4), sum_loss)
    out.update(first_started=first.started, second_started=second.started, second_step=ctl.step)


def scenario_split_config(rank: int, n: int, out: Dict[str, Any]) -> None:
    """Per case, rank 0 configured differently from the others in a way that changes the count
    collective's length (the mode ``auto`` resolves to, a tracker, a retuner, a step policy that
    gathers latencies, the flat path's parameter count) or not (the retuner's replayed check):
    each rank's error from the first step (None: it ran). The cases run one after another in
    one process group: a refused case leaves no collective behind."""
    small_cap = 0.001  # MiB: below the model's 1560 bytes of float64 gradients: auto takes overlap
    first = rank == 0

    def wide() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(D_IN, D_H), torch.nn.Tanh(), torch.nn.Linear(D_H, D_H),
                                   torch.nn.Tanh(), torch.nn.Linear(D_H, D_OUT)).double()

    pol = dropcompute.Policy()
    cases: Dict[str, Callable[[], DropComputeStep]] = {
        "auto_bucket_cap": lambda: DropComputeStep(DDP(model(), bucket_cap_mb=small_cap if first else None), pol),
        "tracker": lambda: DropComputeStep(model(), pol, micro_batches_per_step=2,
                                           stragglers=dropcompute.StragglerTracker(n) if first else None),
        "retuner": lambda: DropComputeStep(model(), pol, micro_batches_per_step=2,
                                           retuner=dropcompute.Retuner(n, 2) if first else None),
        "step_policy": lambda: DropComputeStep(model(), pol, micro_batches_per_step=2,
                                               step_policy=dropcompute.StepPolicy("rebalance") if first else None),
        "parameters": lambda: DropComputeStep(wide() if first else model(), pol, mode="flat"),
        # As many parameters, of other shapes: the flat gradient buffer's length differs.
        "parameter_shapes": lambda: DropComputeStep(
            torch.nn.Sequential(torch.nn.Linear(D_IN, D_H + (1 if first else 0)), torch.nn.Tanh(),
                                torch.nn.Linear(D_H + (1 if first else 0), D_OUT)).double(), pol, mode="flat"),
        # The sampler's dealing (another seed: samples computed twice, others never).
        "sampler_seed": lambda: DropComputeStep(model(), pol, sampler=DropComputeSampler(64, B, 2, rank=rank,
                                                                                          world_size=n,
                                                                                          seed=int(first))),
        "retuner_check": lambda: DropComputeStep(
            model(), dropcompute.Policy(check="before"), micro_batches_per_step=2,
            retuner=dropcompute.Retuner(n, 2, check="before" if first else "oracle")),
    }
    errors: Dict[str, Any] = {}
    for name, make in cases.items():
        ctl = make()
        try:
            ctl.run(data(rank, 0, 2), sum_loss)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    out["errors"] = errors


def scenario_auto(rank: int, n: int, out: Dict[str, Any]) -> None:
    """``mode="auto"`` (the default): per case the mode the step resolved to, or the refusal;
    then threshold-off steps of the case that resolves to overlap (a DDP bucket cap below the
    gradients' 1560 bytes) and of the default DDP (gradients below its cap), each against plain
    DDP ``no_sync`` accumulation: the parameters, the Python all-reduces per step, and the
    buckets DDP's own reducer reduced (0: the flat path ran)."""
    small_cap = 0.001  # MiB: 1048 bytes, below the model's float64 gradients (195 x 8 bytes)
    cases: Dict[str, Callable[[], DropComputeStep]] = {
        "ddp_default": lambda: DropComputeStep(DDP(model()), dropcompute.Policy()),
        "ddp_small_cap": lambda: DropComputeStep(DDP(model(), bucket_cap_mb=small_cap), dropcompute.Policy()),
        "plain_module": lambda: DropComputeStep(model(), dropcompute.Policy()),
        "static_graph_small_cap": lambda: DropComputeStep(DDP(model(), bucket_cap_mb=small_cap, static_graph=True),
                                                          dropcompute.Policy()),
        "sync_lag_0_small_cap": lambda: DropComputeStep(DDP(model(), bucket_cap_mb=small_cap), dropcompute.Policy(),
                                                        sync_lag=0),
        "tracker_small_cap": lambda: DropComputeStep(DDP(model(), bucket_cap_mb=small_cap), dropcompute.Policy(),
                                                     micro_batches_per_step=4,
                                                     stragglers=dropcompute.StragglerTracker(n)),
        "comm_hook": lambda: DropComputeStep(DDP(model()), dropcompute.Policy(), comm_hook=default_hooks.allreduce_hook,
                                             comm_state=None),
        "comm_hook_static_graph": lambda: DropComputeStep(DDP(model(), static_graph=True), dropcompute.Policy(),
                                                          comm_hook=default_hooks.allreduce_hook, comm_state=None),
        "comm_hook_plain_module": lambda: DropComputeStep(model(), dropcompute.Policy(),
                                                          comm_hook=default_hooks.allreduce_hook, comm_state=None),
        "comm_hook_sync_lag_0": lambda: DropComputeStep(DDP(model()), dropcompute.Policy(), sync_lag=0,
                                                        comm_hook=default_hooks.allreduce_hook, comm_state=None),
        "comm_hook_tracker": lambda: DropComputeStep(DDP(model()), dropcompute.Policy(), micro_batches_per_step=4,
                                                     stragglers=dropcompute.StragglerTracker(n),
                                                     comm_hook=default_hooks.allreduce_hook, comm_state=None),
        "comm_hook_flat": lambda: DropComputeStep(DDP(model()), dropcompute.Policy(), mode="flat",
                                                  comm_hook=default_hooks.allreduce_hook, comm_state=None),
        "flat_small_cap": lambda: DropComputeStep(DDP(model(), bucket_cap_mb=small_cap), dropcompute.Policy(),
                                                  mode="flat"),
        "overlap_default": lambda: DropComputeStep(DDP(model()), dropcompute.Policy(), mode="overlap"),
    }
    resolved: Dict[str, Any] = {}
    for name, make in cases.items():
        try:
            ctl = make()
            resolved[name] = [ctl.mode, ctl.sync_lag]
        except ValueError as e:
            resolved[name] = f"refused: {e}"
    out["resolved"] = resolved
    m, steps = 4, 3
    runs: Dict[str, Any] = {}
    for name, cap in (("ddp_small_cap", small_cap), ("ddp_default", None)):
        net = model()
        ddp = DDP(copy.deepcopy(net), bucket_cap_mb=cap)
        ctl = DropComputeStep(ddp, dropcompute.Policy())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        plain = DDP(copy.deepcopy(net), bucket_cap_mb=cap)
        popt = torch.optim.SGD(plain.parameters(), lr=0.1)
        calls = []
        for s in range(steps):
            mbs = data(rank, s, m)
            with CountCollectives() as cc:
                ctl.run(mbs, sum_loss).apply(opt)
            calls.append(cc.calls)
            plain_accumulate(plain, mbs)
            popt.step()
        diff = max(float((a - b).abs().max()) for a, b in zip(ddp.module.parameters(), plain.module.parameters()))
        runs[name] = {"mode": ctl.mode, "all_reduce_calls": calls, "max_param_diff": diff,
                      "buckets": reducer_buckets(ddp)}
    out["runs"] = runs


SCENARIOS: Dict[str, Callable[[int, int, Dict[str, Any]], None]] = {
    "auto": scenario_auto,
    "resume_mismatch": scenario_resume_mismatch, "fingerprint_mean": scenario_fingerprint_mean,
    "split_config": scenario_split_config, "late_recreate": scenario_late_recreate,
    "backward_error": scenario_backward_error,
    "off": scenario_off, "k": scenario_k, "allidle": scenario_allidle, "scaler": scenario_scaler,
    "dtypes": scenario_dtypes, "unused": scenario_unused, "refusals": scenario_refusals,
    "iterable": scenario_iterable, "sampler": scenario_sampler, "static": scenario_static, "hook": scenario_hook,
    "joininf": scenario_joininf,
}


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    timeout = 5 if scenario == "timeout" else 120
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    out: Dict[str, Any] = {"rank": rank, "world_size": n}
    if scenario == "timeout":
        scenario_timeout(rank, outdir, out)
    elif scenario == "log":
        scenario_log(rank, n, outdir, out)
    elif scenario == "guard":
        scenario_guard(rank, n, outdir, out)
    elif scenario in SCENARIOS:
        SCENARIOS[scenario](rank, n, out)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    launch.finish(outdir, rank, out)


if __name__ == "__main__":
    main()
