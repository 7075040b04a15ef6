"""The flat gradient path: one buffer per (dtype, device) that the parameters' ``.grad`` are
views of, so backward accumulates straight into it and the all-reduce runs in place (no
copies; what optimum-habana's ``fast_ddp`` does on Gaudi with a flat buffer).

Owns: the buffers, the used-parameter record, the exact count collective and the rescale.
Must not touch: the divisor's rule (``dropcompute.divisor``, the crate's ``schedule::divisor``)
or the step's decisions.

Before a step object's first collective, ``agree`` compares every rank's configuration
fingerprint (one int64 all-reduce of N slots, once): the count collective's length depends on
the configuration (E and P below), and ranks whose collectives differ in length would break the
backend (gloo aborts the process) before any comparison ran.

The count collective is one int64 all-reduce (SUM) of ``[samples(N) | started(N) | state(N) |
handed(1) | extra(N·E) | used(P)]`` (N ranks, E extra values per rank, 0 unless a step policy,
retuner or straggler tracker needs every rank's latencies: ``step``; P parameters): each rank
writes its own slots, so every rank learns every rank's sample count and started micro-batches
exactly (the gradients' dtype never carries a count: bf16 rounded 257 to 256), whether the
ranks hold the same replicated state (each rank's fingerprint, compared slot by slot: a sum
alone misses a rank whose fingerprint is the others' mean), and
which parameters no rank used (their ``.grad`` is then ``None``, as DDP leaves it, so an
optimizer such as AdamW does not move them). It is issued before the gradient all-reduces, so
the gradients' collectives never wait for the host; every rank issues the same sequence
(counts, then one all-reduce per buffer) whatever it computed, zero micro-batches included.

Each dtype keeps its own buffer and collective: fp32 gradients never travel through bf16.
Backward runs on the loss times a loss scale common to every rank (``step``: 1 / (N·M·b), with
b the nominal micro-batch count), so the accumulated gradients have plain DDP's magnitude
(an fp16 ``GradScaler`` overflows exactly when it would under DDP); the rescale divides by
loss scale x divisor as a 0-d device tensor (float32, float64 for float64
gradients; pytorch_gaudi.md G5: a device input, not a constant of a captured graph).
A non-finite gradient on any rank makes the summed gradient non-finite on every rank (the
all-reduce adds it), so ``GradScaler`` sees it and backs off exactly as under plain DDP.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist


def group_timeout(group: Optional[dist.ProcessGroup]) -> Optional[datetime.timedelta]:
    """The process group's collective timeout, when its backend exposes it (gloo, nccl);
    None otherwise (e.g. the Gaudi bridge's hccl, not verified)."""
    if not dist.is_initialized():
        return None
    pg = group if group is not None else dist.group.WORLD
    for dev in ("cpu", "cuda", "hpu"):
        try:
            backend = pg._get_backend(torch.device(dev))  # type: ignore[union-attr]
            t = backend.options._timeout
            if isinstance(t, datetime.timedelta):
                return t
        except Exception:  # noqa: BLE001 (a backend without this device or options)
            continue
    return None


class _CollectiveContext(Exception):
    """What a failed collective's error carries: ``rank``, ``step`` (this rank and its step) and
    ``collective`` (which one, e.g. "the count all-reduce"); the backend's own error is the
    ``__cause__``."""

    def __init__(self, message: str, *, rank: int, step: int, collective: str) -> None:
        super().__init__(message)
        self.rank, self.step, self.collective = rank, step, collective


class CollectiveTimeout(_CollectiveContext, TimeoutError):
    """A collective did not complete within the process group's timeout: a rank died, stopped
    or never reached the step (context: ``_CollectiveContext``)."""


class CollectiveError(_CollectiveContext, RuntimeError):
    """A collective failed before the process group's timeout: a rank died (its connections
    closed), a connection broke, or the backend refused the call (context:
    ``_CollectiveContext``). A ``RuntimeError``, as the backend's error was, so a handler
    written for that still catches it."""


class FlatGradients:
    """The parameters' gradients as views of one flat buffer per (dtype, device).

    ``params``: the trainable parameters (contiguous). Raises ValueError for none, or for a
    parameter that is not contiguous (its gradient cannot be a view of a flat buffer)."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        if not params:
            raise ValueError("model: no parameter requires a gradient")
        groups: Dict[Tuple[torch.dtype, torch.device], List[int]] = {}
        for i, p in enumerate(params):
            if not p.is_contiguous():
                raise ValueError(f"parameter {i} (shape {tuple(p.shape)}): not contiguous")
            groups.setdefault((p.dtype, p.device), []).append(i)
        self.params = list(params)
        #: (buffer, [(param index, offset, numel)]) per (dtype, device), in first-seen order.
        self.buffers: List[Tuple[torch.Tensor, List[Tuple[int, int, int]]]] = []
        for (dtype, device), idx in groups.items():
            total = sum(self.params[i].numel() for i in idx)
            flat = torch.zeros(total, dtype=dtype, device=device)
            members, off = [], 0
            for i in idx:
                k = self.params[i].numel()
                members.append((i, off, k))
                off += k
            self.buffers.append((flat, members))
        self.used = [False] * len(self.params)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._marker(i))  # type: ignore[no-untyped-call]
            for i, p in enumerate(self.params)
        ]

    def _marker(self, i: int) -> Any:
        def mark(_p: torch.Tensor) -> None:
            self.used[i] = True

        return mark

    def attach(self) -> None:
        """Zeroes the buffers and points every ``.grad`` at its view (start of a step)."""
        for flat, members in self.buffers:
            flat.zero_()
            for i, off, k in members:
                self.params[i].grad = flat[off : off + k].view_as(self.params[i])
        self.used = [False] * len(self.params)

    def remove_hooks(self) -> None:
        """Removes the used-parameter hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


class Reduced:
    """What the count collective said: every rank's samples and started micro-batches, the
    parameters no rank used (flat path only), every rank's extra values (``extra[r]``, E
    int64 each; empty rows when E is 0) and the micro-batches handed out to all ranks
    (``handed``, the sum: what the drop-rate guard is fed)."""

    def __init__(self, samples: List[int], started: List[int], unused: List[int],
                 extra: Optional[List[List[int]]] = None, handed: int = 0) -> None:
        self.samples = samples
        self.started = started
        self.unused = unused
        self.extra = extra if extra is not None else [[] for _ in samples]
        self.handed = handed


class Counts:
    """The step's count collective, issued at construction (async; every rank issues it before
    its gradient collectives): one int64 all-reduce (SUM) of ``[samples(N) | started(N) |
    state(N) | handed(1) | extra(N·E) | used(P)]``, each rank writing its own slots (``handed``:
    the micro-batches this rank was handed, summed over the ranks). ``state``: this rank's
    replicated step state (a non-negative int below 2**63; ``step.DropComputeStep`` hashes it),
    which must equal every other rank's; the layout (E, P) is the configuration's, which
    ``agree`` compared before the first count collective. ``used``: per parameter whether this rank's backward reached it (the flat
    path; empty in overlap mode, where DDP tracks unused parameters itself). ``extra``: this
    rank's E int64 values (E identical on every rank; the step's latencies when a step policy,
    retuner or straggler tracker needs them), returned by rank in ``Reduced.extra``."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        samples: int,
        started: int,
        used: Sequence[bool],
        device: torch.device,
        group: Optional[dist.ProcessGroup],
        step: int,
        extra: Sequence[int] = (),
        handed: int = 0,
        state: int = 0,
    ) -> None:
        n = world_size
        e = len(extra)
        self.rank, self.n, self.e, self.step = rank, n, e, step
        row = [0] * (3 * n + 1 + n * e + len(used))
        row[rank], row[n + rank], row[2 * n + rank] = samples, started, state
        row[3 * n] = handed
        at = 3 * n + 1 + rank * e
        row[at : at + e] = [int(x) for x in extra]
        row[3 * n + 1 + n * e :] = [int(u) for u in used]
        # One host-to-device copy of the whole row.
        self.tensor = torch.tensor(row, dtype=torch.int64, device=device)
        self.work: Any = None
        if n > 1:
            # Issuing returns at once (async): an error here is never a timeout.
            with collective(rank, step, "the count all-reduce", None):
                self.work = dist.all_reduce(self.tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
        self._result: Optional[Reduced] = None

    def result(self, timeout: Optional[datetime.timedelta]) -> Reduced:
        """Waits for the collective (once). Raises CollectiveTimeout / CollectiveError (``wait``);
        ValueError on every rank when any rank's state fingerprint (the replicated step state:
        step index, drop-guard counts, ...) differs from another's (``differing``)."""
        if self._result is not None:
            return self._result
        if self.work is not None:
            wait(self.work, self.rank, self.step, "count", timeout)
        host = self.tensor.tolist()
        n = self.n
        differing(host[2 * n : 3 * n], self.rank, self.step,
                  "the ranks hold different step states (step index, drop-guard counts, observed micro-batch size "
                  "or count, threshold: resumed from checkpoints of different steps?)")
        e, base = self.e, 3 * n + 1
        extra = [host[base + r * e : base + (r + 1) * e] for r in range(n)]
        self._result = Reduced(host[:n], host[n : 2 * n], [i for i, u in enumerate(host[base + n * e :]) if u == 0],
                               extra, handed=host[3 * n])
        return self._result


def differing(fingerprints: List[int], rank: int, step: int, what: str) -> None:
    """Raises ValueError when any rank's fingerprint (``fingerprints[r]``, one per rank, as
    gathered slot by slot) differs from this rank's, naming the step, ``what`` differs and the
    ranks that differ from this one: every rank raises, each naming the others."""
    mine = fingerprints[rank]
    other = [r for r, f in enumerate(fingerprints) if f != mine]
    if other:
        raise ValueError(f"rank {rank}: step {step}: {what}: rank(s) {other} differ from this rank "
                         f"(fingerprints by rank {fingerprints})")


def agree(*, rank: int, world_size: int, fingerprint: int, device: torch.device,
          group: Optional[dist.ProcessGroup], step: int, timeout: Optional[datetime.timedelta]) -> None:
    """The configuration check, once before a step object's first collective: one int64
    all-reduce (SUM) of N slots, this rank's configuration ``fingerprint`` (a non-negative int
    below 2**63: the policy, normalization, b, M, N, step policy, mode, retuner, tracker and the
    count collective's layout; ``step.DropComputeStep`` hashes them) in its own. Ranks that
    differ would issue collectives of different lengths afterwards (a deadlock or an abort in
    the backend); here every rank raises ValueError instead (``differing``). No-op for one
    rank. Every rank must run it (a step object is made on every rank alike: one re-created on
    one rank alone meets its peers' count collective instead; whether to skip it cannot be
    decided locally, since ranks configured differently would decide differently). Raises
    CollectiveTimeout / CollectiveError when a rank never joins or the backend fails
    (``wait``)."""
    if world_size < 2:
        return
    t = torch.zeros(world_size, dtype=torch.int64, device=device)
    t[rank] = fingerprint
    with collective(rank, step, "the configuration all-reduce", None):  # async: never a timeout
        work = dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group, async_op=True)
    wait(work, rank, step, "configuration", timeout)
    differing(t.tolist(), rank, step, "the ranks run different step configurations (policy, normalization, "
              "micro-batch size, micro-batches per step, world size, step policy, mode, retuner, tracker or "
              "parameters)")


def rescale_factor(world_sum_scale: float, loss_scale: float, d: Optional[float]) -> Optional[float]:
    """What turns the all-reduced gradient into the sum of gradients over ``d``: the reduced
    tensor holds ``world_sum_scale`` x the sum of the ranks' ``loss_scale``-scaled gradients,
    so the factor is 1 / (world_sum_scale x loss_scale x d); None when ``d`` is None."""
    return None if d is None else 1.0 / (world_sum_scale * loss_scale * d)


def scale_(t: torch.Tensor, factor: float) -> None:
    """Multiplies ``t`` in place by ``factor`` (skipped when exactly 1), the factor a 0-d device
    tensor in float32 (float64 for float64 ``t``): a device input, not a graph constant."""
    if factor != 1.0:
        wide = torch.float64 if t.dtype == torch.float64 else torch.float32
        t.mul_(torch.tensor(factor, dtype=wide, device=t.device))


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite, in one read pass in ``t``'s own dtype: a
    non-finite element makes the sum non-finite (inf and NaN propagate), so a finite sum proves
    every element finite; only a non-finite sum (a non-finite element, or finite values whose
    sum overflows) runs the exact check (the sum in float64, where finite float32 or narrower
    values cannot overflow)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t.sum(dtype=torch.float64)))


#: The dtypes ``scale_checked_`` scales and checks in one pass (torch's own GradScaler kernel
#: takes a float32 factor; a float64 gradient keeps its float64 factor and a separate check).
_FUSED = (torch.float32, torch.float16, torch.bfloat16)


def found_flag(device: torch.device) -> torch.Tensor:
    """A zeroed non-finite flag for ``scale_checked_`` (float32, shape (1,), on ``device``)."""
    return torch.zeros(1, dtype=torch.float32, device=device)


def scale_checked_(ts: Union[torch.Tensor, Sequence[torch.Tensor]], factor: float, found: torch.Tensor) -> None:
    """Each tensor of ``ts`` (one tensor or a sequence) ``*= factor``, and ``found`` set to a
    non-zero value when one holds a non-finite element after it, in ONE pass for float32,
    float16 and bfloat16 when ``factor`` <= 1 (torch's GradScaler kernel,
    ``torch._amp_foreach_non_finite_check_and_unscale_``, with ``factor`` as its float32 device
    tensor; one call per dtype and device of ``ts``): the finiteness check
    ``StepResult.finite`` needs then costs no pass of its own (a float32 sum of 50 M gradients
    took 26-40 ms on the CI machine, 2-4 % of the step). ``factor`` 1 is the check alone (the
    kernel multiplies by 1: the values are unchanged). The kernel checks the values before it
    scales them, which decides the scaled ones only for ``factor`` <= 1 (a product no larger
    than a finite value is finite); a larger factor (a step that computed fewer samples than the
    nominal batch: ``factor`` = nominal / computed) can overflow a finite value, so it, float64,
    and a device or build without the kernel take ``scale_`` then ``all_finite`` per tensor.
    ``found``: ``found_flag``'s tensor; it is only ever increased."""
    groups: Dict[Tuple[torch.dtype, torch.device], List[torch.Tensor]] = {}
    for t in [ts] if isinstance(ts, torch.Tensor) else ts:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for (dtype, device), group in groups.items():
        if dtype in _FUSED and found.device == device and 0.0 <= factor <= 1.0:
            try:
                inv = torch.tensor([factor], dtype=torch.float32, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(group, found, inv)
                continue
            except (RuntimeError, NotImplementedError, AttributeError):  # no kernel for this device or build
                pass
        for t in group:
            scale_(t, factor)
            if not all_finite(t):
                found.add_(1.0)


def reduce_flat(
    grads: FlatGradients,
    counts: Counts,
    *,
    divisor_of: Any,
    loss_scale: float,
    group: Optional[dist.ProcessGroup],
    timeout: Optional[datetime.timedelta],
    found: Optional[torch.Tensor] = None,
) -> Tuple[Reduced, Optional[float]]:
    """The flat path after the count collective: one in-place all-reduce per buffer (issued
    before waiting for the counts), then every buffer rescaled to the sum over
    ``divisor_of(samples per rank)`` (None: the global count is zero, every ``.grad`` is None;
    a parameter no rank used: ``.grad`` None). Returns the counts and the divisor. ``found``:
    a ``found_flag`` the rescale also checks the buffers into (``scale_checked_``, one pass).

    Raises CollectiveTimeout / CollectiveError naming the rank, the step and the collective;
    ValueError as ``Counts.result``."""
    works = []
    if counts.n > 1:
        with collective(counts.rank, counts.step, "the gradient all-reduce", None):  # async: never a timeout
            works = [dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)
                     for flat, _ in grads.buffers]
    try:
        reduced = counts.result(timeout)
    except ValueError:
        for w in works:  # every rank completes the step's collectives, then every rank raises
            wait(w, counts.rank, counts.step, "gradient", timeout)
        raise
    for w in works:
        wait(w, counts.rank, counts.step, "gradient", timeout)
    d = divisor_of(reduced.samples)
    factor = rescale_factor(1.0, loss_scale, d)
    if factor is not None:
        for flat, _ in grads.buffers:
            if found is not None:
                scale_checked_(flat, factor, found)
            else:
                scale_(flat, factor)
    for i in reduced.unused if d is not None else range(len(grads.params)):
        grads.params[i].grad = None
    return reduced, d


def failure(e: BaseException, since: float, timeout: Optional[datetime.timedelta], rank: int, step: int,
            what: str) -> Union[CollectiveTimeout, CollectiveError]:
    """``e``, raised by a collective (``what``, e.g. "the count all-reduce") issued at ``since``
    (``time.monotonic()``), as the step's typed error naming the rank, the step and the
    collective: a CollectiveTimeout when it came at least 90 % of ``timeout`` later, else a
    CollectiveError (a rank that died at once, a broken connection, a call the backend refused:
    the backend's own message is quoted). No backend's message text is parsed; the caller
    raises the answer ``from e``."""
    if timeout is not None and time.monotonic() - since >= 0.9 * timeout.total_seconds():
        return CollectiveTimeout(
            f"rank {rank}: step {step}: {what} did not finish within the process group's timeout "
            f"({timeout.total_seconds():g} s): a rank died, stopped or never reached the step ({e})",
            rank=rank, step=step, collective=what)
    return CollectiveError(
        f"rank {rank}: step {step}: {what} failed before the process group's timeout (a rank died, a "
        f"connection broke, or the backend refused the call): {type(e).__name__}: {e}",
        rank=rank, step=step, collective=what)


@contextlib.contextmanager
def collective(rank: int, step: int, what: str, timeout: Optional[datetime.timedelta]) -> Iterator[None]:
    """Runs the body (issuing or waiting for the collective ``what``) and raises any
    ``RuntimeError`` it raises as ``failure``'s typed error, chained to it."""
    since = time.monotonic()
    try:
        yield
    except RuntimeError as e:
        raise failure(e, since, timeout, rank, step, what) from e


def wait(work: Any, rank: int, step: int, what: str, timeout: Optional[datetime.timedelta]) -> None:
    """Waits for ``work`` (the ``what`` all-reduce); its error as ``collective``'s typed one:
    CollectiveTimeout after 90 % of ``timeout``, CollectiveError before."""
    with collective(rank, step, f"the {what} all-reduce", timeout):
        if timeout is not None:
            work.wait(timeout)
        else:
            work.wait()
