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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("factor", [1.0, 1.0 / 3.0, 1.0 + 2.0 ** -7, 4.0])
@pytest.mark.parametrize("case,want", [
    ("ordinary", True), ("overflowing sum of finite values", True), ("nan", False), ("inf", False),
    ("overflow by the factor", False),
])
def test_the_rescale_checks_in_the_same_pass_as_the_exact_check(dtype: torch.dtype, case: str, want: bool,
                                                                 factor: float) -> None:
    """``scale_checked_`` (the rescale ``run`` applies, with the finiteness flag ``finite``
    reads) scales like an f64 reference rounded once to the dtype, and flags exactly the
    buffers ``all_finite`` refuses after the same scaling, for every gradient dtype and factors
    below, at and above 1 (the kernel checks before it scales: a factor above 1 can overflow)."""
    from dropcompute.torch.reduce import all_finite, found_flag, scale_checked_

    big = min(BIG, torch.finfo(dtype).max * 0.9)
    ref = torch.linspace(-5, 5, 1000, dtype=torch.float64)
    if case == "overflowing sum of finite values":
        ref = torch.full((1000,), big / 4.0, dtype=torch.float64)  # finite after any factor here
    elif case == "nan":
        ref[417] = float("nan")
    elif case == "inf":
        ref[3] = float("inf")
    elif case == "overflow by the factor":
        if factor <= 1.0:
            pytest.skip("a factor <= 1 cannot overflow a finite value")
        ref = torch.full((10,), torch.finfo(dtype).max, dtype=torch.float64)  # finite before, not after
    x = ref.to(dtype).clone()
    found = found_flag(x.device)
    scale_checked_(x, factor, found)
    assert (float(found.item()) == 0.0) is want, (case, found)
    assert all_finite(x) is want
    # The product in float64 rounded once to the dtype: equal, or within one unit in the last
    # place where the kernel rounds its factor to float32 (float64 keeps a float64 factor).
    want_x = (ref.to(dtype).to(torch.float64) * factor).to(dtype)
    finite = torch.isfinite(want_x)
    assert torch.equal(torch.isfinite(x), finite)
    if finite.any():
        eps = torch.finfo(dtype).eps
        err = ((x[finite].to(torch.float64) - want_x[finite].to(torch.float64)).abs()
               / want_x[finite].to(torch.float64).abs().clamp_min(1e-30))
        assert float(err.max()) <= (0.0 if dtype == torch.float64 else eps), (case, float(err.max()))
