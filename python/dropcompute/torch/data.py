"""Dealing an epoch's micro-batches to ranks so that no sample is lost.

Owns: ``DropComputeSampler``, a per-rank view of the crate's one global dealer
(``dropcompute.Dealer``, i.e. ``deal::RunData::global``, what ``dropcompute train`` and its
replay deal by; ``take_by_cost``: the crate's cost-balanced deal), and ``batch_size``. Must not touch: the dealing order (the crate's shuffle by
(seed, epoch) and its re-queue rule).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import Dealer, LatencyEstimator
from .args import count


class DropComputeSampler:
    """Deals the sample indices ``0..samples`` of a dataset, epoch by epoch, in micro-batches
    of ``micro_batch_size``: each step every rank takes its ``micro_batches_per_step`` (or the
    policy's assignment) from the front of ONE global shuffled stream, and after the step every
    rank's not-started micro-batches go back to the front, so every sample is computed once
    per epoch whoever dropped it. Every rank holds a replica; ``settle`` with the step's
    gathered ``StepResult.started`` keeps the replicas equal without communication.

    Usage per step: ``ids = sampler.take()`` (this rank's micro-batches as index lists; None
    when the stream ended on every rank), run them (lazily: ``(collate(ids_i) for ids_i in ids)``), then
    ``sampler.settle(result.started)``. Raises ValueError for bad arguments (from the crate)."""

    def __init__(
        self,
        samples: int,
        micro_batch_size: int,
        micro_batches_per_step: int,
        *,
        rank: int,
        world_size: int,
        seed: int = 0,
        epochs: Optional[int] = None,
    ) -> None:
        micro_batches_per_step = count("micro_batches_per_step", micro_batches_per_step, 1)
        self._dealer = Dealer(samples, micro_batch_size, rank=rank, world_size=world_size, seed=seed, epochs=epochs)
        self.world_size = world_size
        #: What every rank's replica must share (the dealing is a function of it): compared
        #: across ranks by ``DropComputeStep(sampler=...)``'s one-time configuration check.
        self.configuration = f"{samples}|{micro_batch_size}|{world_size}|{seed}|{epochs}"
        self.micro_batches_per_step = micro_batches_per_step

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return int(self._dealer.epoch)

    def take(self, assignment: Optional[Sequence[int]] = None) -> Optional[List[List[int]]]:
        """This rank's micro-batches of the next step (index lists; possibly empty at the end of
        the stream: the rank still runs the step, with nothing, to join the collectives), or
        None when the stream dealt nothing to any rank (the run is over on every rank at the
        same step). ``assignment``: micro-batches per rank (default: ``micro_batches_per_step``
        each; with a step policy pass ``DropComputeStep.assignment()``, identical on every rank)."""
        a = list(assignment) if assignment is not None else [self.micro_batches_per_step] * self.world_size
        mine = [list(ids) for ids in self._dealer.take(a)]
        return None if self._dealer.ended else mine

    def take_by_cost(self, bucket_of: Callable[[List[int]], int], estimator: LatencyEstimator, *,
                     bucket_lengths: Optional[Sequence[int]] = None) -> Optional[Tuple[List[List[int]], List[int]]]:
        """This rank's micro-batches of the next step dealt by predicted cost (``cost-balance``:
        ``Dealer.take_by_cost``, the crate's ``cost_balance`` over the estimator's per-bucket
        cost, longest first, at most 2·M per rank) and their buckets (pass both to
        ``DropComputeStep.run(ids, ..., buckets=, tokens=)``), or None when the stream ended.
        ``bucket_of(sample_ids)``: a micro-batch's bucket (an index into ``bucket_lengths``, the
        prior of the buckets not measured yet). ``estimator`` must be identical on every rank
        (e.g. fed every rank's gathered (bucket, latency) pairs in rank order), or the replicas
        deal differently. ``settle`` as after ``take``: every sample is computed once per epoch."""
        lengths = list(bucket_lengths) if bucket_lengths is not None else None  # the dealer checks each
        mine, buckets = self._dealer.take_by_cost(self.micro_batches_per_step, bucket_of, estimator,
                                                  bucket_lengths=lengths)
        return None if self._dealer.ended else ([list(ids) for ids in mine], list(buckets))

    def settle(self, started: Sequence[int]) -> None:
        """Ends the step with every rank's started micro-batches (``StepResult.started``)."""
        self._dealer.settle(list(started))

    def state_dict(self) -> Dict[str, Any]:
        """The replica's state (between steps), for a checkpoint."""
        return {"dealer": self._dealer.state(), "micro_batches_per_step": self.micro_batches_per_step}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores ``state_dict()``'s state. Raises ValueError for a malformed one (TypeError for a
        count that is a bool or not an integer)."""
        self._dealer = Dealer.from_state(state["dealer"])
        self.micro_batches_per_step = count("state['micro_batches_per_step']", state["micro_batches_per_step"], 1)


def batch_size(mb: Any) -> int:
    """Samples in a micro-batch: a tensor's leading dimension, that of the first element of a
    tuple/list or the first value of a dict; else ``len(mb)``."""
    if isinstance(mb, torch.Tensor):
        return int(mb.shape[0])
    if isinstance(mb, (tuple, list)) and mb:
        return batch_size(mb[0])
    if isinstance(mb, dict) and mb:
        return batch_size(next(iter(mb.values())))
    return len(mb)
