"""StepResult.finite: a finite sum proves every element finite; an overflowing sum of finite
values falls back to the exact float64 check (in-process, no process group)."""

import pytest
import torch

from dropcompute.torch import StepResult

BIG = 3.0e38  # finite in float32 (max 3.4e38); two of them overflow a float32 sum


def result(*buffers: torch.Tensor) -> StepResult:
    return StepResult(step=0, computed_micro_batches=1, dropped_micro_batches=0, samples=1, counts=[1],
                      started=[1], divisor=1.0, compute_ns=0, _buffers=list(buffers))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("case,want", [
    ("zeros", True), ("ordinary", True), ("overflowing sum of finite values", True),
    ("nan", False), ("inf", False), ("-inf", False), ("inf and -inf", False),
    ("finite buffer then nan buffer", False),
])
def test_finite_is_exact_for_every_dtype(dtype: torch.dtype, case: str, want: bool) -> None:
    big = min(BIG, torch.finfo(dtype).max * 0.9)
    x = torch.zeros(1000, dtype=dtype)
    bufs = [x]
    if case == "ordinary":
        x.copy_(torch.linspace(-5, 5, 1000, dtype=torch.float64).to(dtype))
    elif case == "overflowing sum of finite values":
        x.fill_(big)  # every element finite; their sum overflows in the buffer's dtype
        if dtype != torch.float64:
            assert not torch.isfinite(x.sum()), "the case must overflow the fast sum"
    elif case == "nan":
        x[417] = float("nan")
    elif case == "inf":
        x[3] = float("inf")
    elif case == "-inf":
        x[999] = float("-inf")
    elif case == "inf and -inf":
        x[1], x[2] = float("inf"), float("-inf")
    elif case == "finite buffer then nan buffer":
        y = torch.ones(10, dtype=dtype)
        y[5] = float("nan")
        bufs = [x, y]
    assert result(*bufs).finite() is want
