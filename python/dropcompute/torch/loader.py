"""Steps of lazily collated micro-batches from a map-style dataset, dealt by ``DropComputeSampler``.

Owns: turning the index lists a ``DropComputeSampler`` deals into micro-batches
(``MicroBatches``: collated only when the step launches them, so a dropped micro-batch is never
loaded), the take/settle pairing per step (``DropComputeLoader``), and the lazy step tokens
that a training loop which fetches ahead (Lightning's prefetching data fetcher) can hold
before the previous step has settled (``PendingStep``). Must not touch: the dealing (which
sample goes to which rank and step, the re-queue rule: the crate's dealer behind
``DropComputeSampler``) or the step's decisions (``DropComputeStep``).

Usage (any loop, e.g. Accelerate)::

    loader = DropComputeLoader(dataset, sampler, device=device)
    for micro_batches in loader:          # this rank's micro-batches of one step
        result = step.run(micro_batches, loss_fn)
        loader.settle(result)             # not-started micro-batches go back to the front
        result.apply(optimizer)

The loader runs in the training process (``num_workers`` 0: the sampler's replica must see
every settle), and ends, on every rank at the same step, when the sampler's stream ends.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence, Union, overload

import torch
import torch.distributed as dist
from torch.utils.data import default_collate

from .data import DropComputeSampler
from .step import StepResult


def to_device(obj: Any, device: Optional[torch.device]) -> Any:
    """``obj`` with every tensor (in tuples, lists and dicts, recursively) moved to ``device``
    (unchanged when ``device`` is None)."""
    if device is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


class MicroBatches(Sequence[Any]):
    """One rank's micro-batches of one step: ``ids[i]`` (sample indices) collated by ``load``
    when item ``i`` is read (``DropComputeStep.run`` reads a micro-batch only when it launches
    it). ``len()`` is the number dealt (M, fewer at the end of the stream, possibly 0)."""

    def __init__(self, ids: List[List[int]], load: Callable[[List[int]], Any]) -> None:
        self.ids = ids
        self._load = load

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> List[Any]: ...

    def __getitem__(self, i: Union[int, slice]) -> Any:
        if isinstance(i, slice):
            return [self._load(ids) for ids in self.ids[i]]
        return self._load(self.ids[i])


class PendingStep:
    """A step not yet dealt: ``take()`` deals it (after the previous step settled), ``settle``
    ends it. What ``DropComputeLoader.pending_steps`` yields for loops that fetch ahead."""

    def __init__(self, loader: "DropComputeLoader") -> None:
        self._loader = loader
        self.micro_batches: Optional[MicroBatches] = None

    def take(self) -> Optional[MicroBatches]:
        """This rank's micro-batches of this step, or None when the stream has ended (on every
        rank at the same step; then there is nothing to run or settle). Raises RuntimeError
        when the previous step is not settled or this step was already taken."""
        if self.micro_batches is not None:
            raise RuntimeError(f"rank {self._loader.rank}: step {self._loader.steps}: this step was already taken")
        self.micro_batches = self._loader._take()
        return self.micro_batches

    def settle(self, result: StepResult) -> None:
        """Ends the step (``DropComputeLoader.settle``)."""
        self._loader.settle(result)


class DropComputeLoader:
    """Steps of ``dataset`` (map-style: ``dataset[i]`` is sample ``i``) as ``sampler`` deals
    them: iterating yields this rank's ``MicroBatches`` per step; ``settle(result)`` must follow
    each step before the next is dealt. ``collate_fn`` (a list of samples -> a micro-batch;
    default ``torch.utils.data.default_collate``), then every tensor moved to ``device``.

    Raises TypeError for a ``sampler`` that is not a ``DropComputeSampler``, RuntimeError
    (with rank and step) for a step dealt before the previous one settled."""

    def __init__(
        self,
        dataset: Any,
        sampler: DropComputeSampler,
        *,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        device: Optional[Union[str, torch.device]] = None,
    ) -> None:
        if not isinstance(sampler, DropComputeSampler):
            raise TypeError(f"sampler: {type(sampler).__name__}: must be a dropcompute.torch.DropComputeSampler")
        self.dataset = dataset
        self.sampler = sampler
        self.collate_fn: Callable[[List[Any]], Any] = collate_fn if collate_fn is not None else default_collate
        self.device = torch.device(device) if device is not None else None
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        #: Steps settled so far.
        self.steps = 0
        #: Whether the stream ended (every rank learns it at the same step).
        self.ended = False
        self._pending = False

    def _load(self, ids: List[int]) -> Any:
        return to_device(self.collate_fn([self.dataset[i] for i in ids]), self.device)

    def _take(self) -> Optional[MicroBatches]:
        if self._pending:
            raise RuntimeError(
                f"rank {self.rank}: step {self.steps}: the previous step's micro-batches were dealt but not "
                "settled: call loader.settle(result) after each step"
            )
        if self.ended:
            return None
        ids = self.sampler.take()
        if ids is None:
            self.ended = True
            return None
        self._pending = True
        return MicroBatches(ids, self._load)

    def settle(self, result: StepResult) -> None:
        """Ends the step with every rank's started micro-batches (``result.started``): the
        not-started ones are dealt again. Raises RuntimeError when no step is pending."""
        if not self._pending:
            raise RuntimeError(f"rank {self.rank}: step {self.steps}: settle without a dealt step")
        self.sampler.settle(result.started)
        self._pending = False
        self.steps += 1

    def __iter__(self) -> Iterator[MicroBatches]:
        """This rank's micro-batches, step by step, until the stream ends."""
        while True:
            mbs = self._take()
            if mbs is None:
                return
            yield mbs

    def pending_steps(self) -> Iterator[PendingStep]:
        """Lazy step tokens (dealt by ``PendingStep.take`` when the step runs), for a loop that
        fetches a batch ahead of the step that consumes it (Lightning's data fetcher). Ends
        after the token whose ``take`` found the stream ended; with a one-ahead fetcher the
        loop sees that one empty token."""
        while not self.ended:
            yield PendingStep(self)
