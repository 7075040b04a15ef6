"""Intel Gaudi's PyTorch bridge (``habana_frameworks.torch``), as far as a step needs it.

Owns: loading the bridge for an "hpu" device and the lazy-mode step marker at micro-batch
boundaries (``pytorch_gaudi.md`` G2: ``htcore.mark_step()`` cuts the lazy graph; at the same
places every step, so compiled graphs are cache hits; optimum-habana marks after every
micro-batch's backward and after the optimizer step). Must not touch: timing (``clock``) or
decisions.

Lazy mode is read from ``PT_HPU_LAZY_MODE`` ("1": lazy; unset or "0": eager, the bridge's
default since 1.23). Not verified on a Gaudi machine: the tests drive a recording stand-in of
``habana_frameworks.torch.core`` (python/tests/standin/).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch


class Bridge:
    """The bridge's step marker. ``core``: the imported ``habana_frameworks.torch.core``."""

    def __init__(self, core: Any, lazy: bool) -> None:
        self.core = core
        self.lazy = lazy

    def boundary(self) -> None:
        """A micro-batch (or optimizer step) boundary: ``mark_step()`` in lazy mode, nothing in
        eager mode."""
        if self.lazy:
            self.core.mark_step()


def bridge_for(device: torch.device) -> Optional[Bridge]:
    """The bridge for an "hpu" device (imported here: importing it registers ``torch.hpu``);
    None for other devices. Raises ImportError naming the package when it is missing."""
    if device.type != "hpu":
        return None
    try:
        import habana_frameworks.torch.core as core  # type: ignore[import-not-found]
    except ImportError as e:
        raise ImportError(f"device {device}: the Intel Gaudi PyTorch bridge (habana_frameworks.torch) is not installed") from e
    return Bridge(core, os.environ.get("PT_HPU_LAZY_MODE", "0") == "1")
