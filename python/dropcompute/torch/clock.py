"""Compute time on the device's timeline, read with a lag.

Owns: the event protocol of each device kind. ``mark()`` records the end of a micro-batch
without waiting for the device; ``read(mark)`` waits for that one event only. The step walker
(``dropcompute.StepWalk`` with ``sync_lag`` L) asks for the end of micro-batch i-L before it
launches micro-batch i, so the host never waits for the micro-batch it just launched
(``pytorch_gaudi.md`` G1). Must not touch: decisions (the walker's).

Kinds: "cpu" (the host clock, ``time.perf_counter_ns``: execution is synchronous), "cuda"
(``torch.cuda.Event``), "hpu" (``torch.hpu.Event`` of Intel Gaudi's bridge; not verified on a
Gaudi machine). Times are ns since ``start()``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

#: An int (ns, the CPU) or a device event.
Mark = Any


class DeviceClock:
    """Compute time since ``start()`` in ns, on the device's timeline.

    ``device``: the device the micro-batches run on. ``on_sync``: called with the mark each time
    the host waits for an event (counted by tests and by the Gaudi stand-in). Raises ValueError
    for a device kind without an event protocol."""

    def __init__(self, device: torch.device, *, on_sync: Optional[Callable[[Mark], None]] = None) -> None:
        self.kind = device.type
        self._t0 = 0
        #: The host's monotonic time (ns) at ``start()``: the origin the compute log writes times
        #: against (on a device, the host time the start event was queued).
        self.origin_ns = 0
        self._start: Any = None
        self._event_cls: Any = None
        self.on_sync = on_sync
        if self.kind in ("cuda", "hpu"):
            self._event_cls = getattr(torch, self.kind).Event
        elif self.kind != "cpu":
            raise ValueError(f"device: {device}: no event protocol (cpu, cuda, hpu)")

    def start(self) -> None:
        """Starts the step's compute clock (right after the previous optimizer step)."""
        self.origin_ns = time.perf_counter_ns()
        if self._event_cls is None:
            self._t0 = self.origin_ns
        else:
            self._start = self._event_cls(enable_timing=True)
            self._start.record()

    def elapsed_at_start(self) -> int:
        """The answer to the walker's clock question (``StepWalk.clock_at``): on the CPU the
        host clock's reading (time before the first micro-batch counts); on a device 0, without
        waiting: the device's ends are measured from the start event, recorded right after the
        previous optimizer step was queued, so what ran before the first micro-batch is already
        inside them (the Rust scheduler answers the same)."""
        if self._event_cls is None:
            return time.perf_counter_ns() - self._t0
        return 0

    def mark(self) -> Mark:
        """Records now on the device's queue; does not wait (on the CPU: the host time)."""
        if self._event_cls is None:
            return time.perf_counter_ns() - self._t0
        ev = self._event_cls(enable_timing=True)
        ev.record()
        return ev

    def read(self, mark: Mark) -> int:
        """ns from ``start()`` to ``mark``; waits for that event only."""
        if self._event_cls is None:
            return int(mark)
        if self.on_sync is not None:
            self.on_sync(mark)
        mark.synchronize()
        return max(int(self._start.elapsed_time(mark) * 1e6), 0)
