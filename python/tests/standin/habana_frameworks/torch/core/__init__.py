"""Stand-in of ``habana_frameworks.torch.core``: ``mark_step`` and ``torch.hpu.Event``, recorded
in ``LOG`` as ("mark_step",), ("record", id), ("synchronize", id)."""

import time
import types
from typing import Any, List, Tuple

import torch

LOG: List[Tuple[Any, ...]] = []
_ids = [0]


def mark_step(sync: bool = False) -> None:
    LOG.append(("mark_step",))


class Event:
    def __init__(self, enable_timing: bool = False) -> None:
        _ids[0] += 1
        self.id = _ids[0]
        self.t = 0

    def record(self) -> None:
        self.t = time.perf_counter_ns()
        LOG.append(("record", self.id))

    def synchronize(self) -> None:
        LOG.append(("synchronize", self.id))

    def elapsed_time(self, end: "Event") -> float:
        return (end.t - self.t) / 1e6


torch.hpu = types.SimpleNamespace(Event=Event)  # type: ignore[attr-defined]
