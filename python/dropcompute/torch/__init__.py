"""DropCompute for PyTorch training loops (``pip install ./python[torch]``).

What this package owns: running one gradient-accumulation step's micro-batches under the
crate's one step walker (``dropcompute.StepWalk``: the Rust scheduler's own decisions), timing
them on the device's timeline with a sync lag, the exact sample counts and the rescaled
gradient reduce, the optimizer / GradScaler / LR-scheduler step that follows, and dealing an
epoch's micro-batches to ranks so that no sample is lost; with a step policy
(``dropcompute.StepPolicy``) each rank's micro-batch count comes from the crate's ``Assigner``,
and the retuner / straggler tracker run in the step. What it must not touch: the
decisions themselves (the deadline, the warm-up, the minimum, the predictive estimate, the
divisor, the assignment and the dealing order are the crate's, called through ``dropcompute._core``).

A collective of the step that fails raises ``CollectiveTimeout`` (a ``TimeoutError``: after
the process group's timeout) or ``CollectiveError`` (a ``RuntimeError``: sooner, e.g. a rank
that died), each naming the rank, the step and the collective (``reduce.collective``).

Modules: ``clock`` (device time, marks read with a lag), ``reduce`` (flat gradient buffers, the
exact count collective, the rescale), ``step`` (``DropComputeStep``, ``StepResult``), ``data``
(``DropComputeSampler``: the crate's global dealer over a dataset's indices), ``transformers``
(the Hugging Face ``Trainer`` mixin; not imported here: ``import dropcompute.torch.transformers``).
"""

from .clock import DeviceClock
from .data import DropComputeSampler, batch_size
from .reduce import CollectiveError, CollectiveTimeout, FlatGradients
from .step import DropComputeStep, StepResult

__all__ = ["CollectiveError", "CollectiveTimeout", "DeviceClock", "DropComputeSampler", "DropComputeStep", "FlatGradients", "StepResult", "batch_size"]
