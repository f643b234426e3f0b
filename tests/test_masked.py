"""Masked and conditional semantics: where, masked_fill, clamp with tensor bounds,
tril/triu, nan_to_num, NaN/inf/signed-zero behaviour of comparisons, min/max and friends.
Compared with eager bit for bit, with no aten fallback."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import metrics

NAN, INF = float("nan"), float("inf")
# every special value, in three rows of different sign and scale
X = torch.tensor([[1.0, NAN, -INF, INF, -0.0, 0.0, 3.5, -2.0]] * 3) * torch.tensor([[1.0], [2.0], [-1.0]])
LO = torch.tensor([0.0, 0.0, NAN, 1.0, 0.5, -1.0, 4.0, -3.0])
HI = torch.tensor([2.0, 1.0, 1.0, NAN, -1.0, 1.0, 3.0, -2.5])
INTS = torch.tensor([[3, -7, 0, 127, -128, 5, 1, 2]])

CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "where_promotes_scalar_other": (lambda c: torch.where(c > 0, c, 2.5), (INTS,)),
    "where_int_scalar": (lambda c: torch.where(c > 0, c, 2), (INTS,)),
    "where_mixed_dtypes": (lambda x, c: torch.where(x > 0, x, c), (X, INTS)),
    "where_half_and_float": (lambda x, c: torch.where(c > 0, x.half(), x), (X, INTS)),
    "where_int_condition": (lambda x, c: torch.where(c.bool(), x, -x), (X, INTS)),
    "masked_fill_scalar": (lambda x, c: x.masked_fill(c > 0, -1.5), (X, INTS)),
    "masked_fill_0d_tensor": (lambda x, c: x.masked_fill(c > 0, x[0, 0]), (X, INTS)),
    "masked_fill_int": (lambda x, c: c.masked_fill(x > 0, 7), (X, INTS)),
    "masked_fill_nan": (lambda x, c: x.masked_fill(c < 2, NAN), (X, INTS)),
    "clamp_tensor_bounds": (lambda x, lo, hi: torch.clamp(x, lo, hi), (X, LO, HI)),
    "clamp_min_tensor": (lambda x, lo: torch.clamp(x, min=lo), (X, LO)),
    "clamp_max_tensor": (lambda x, hi: torch.clamp(x, max=hi), (X, HI)),
    "clamp_scalars": (lambda x: torch.clamp(x, -1, 1), (X,)),
    "clamp_inverted_bounds": (lambda x: torch.clamp(x, 2, 1), (X,)),
    "clamp_int_float_bounds": (lambda c: torch.clamp(c, -1.5, 2.5), (INTS,)),
    "clamp_int": (lambda c: torch.clamp(c, -5, 10), (INTS,)),
    "clamp_min_int8": (lambda c: torch.clamp_min(c.to(torch.int8), 3), (INTS,)),
    "tril": (lambda x: torch.tril(x, -1), (torch.randn(2, 5, 4),)),
    "triu": (lambda x: torch.triu(x, 2), (torch.randn(2, 5, 4),)),
    "tril_bool": (lambda x: torch.tril(x > 0), (torch.randn(5, 4),)),
    "triu_int": (lambda c: torch.triu(c.view(2, 4)), (INTS,)),
    "nan_to_num": (lambda x: torch.nan_to_num(x), (X,)),
    "nan_to_num_values": (lambda x: torch.nan_to_num(x, 1.0, 2.0, -3.0), (X,)),
    "nan_to_num_half": (lambda x: torch.nan_to_num(x.half()), (X,)),
    "nan_to_num_bf16": (lambda x: torch.nan_to_num(x.bfloat16(), posinf=1e30), (X,)),
    "nan_to_num_int": (lambda c: torch.nan_to_num(c), (INTS,)),
    "compare_with_nan": (lambda x, lo: torch.stack([x == lo, x != lo, x < lo, x <= lo, x > lo, x >= lo]), (X, LO)),
    "compare_with_nan_scalar": (lambda x: torch.stack([x == NAN, x != NAN, x < NAN, x.ne(x)]), (X,)),
    "compare_int_with_float": (lambda x, c: torch.stack([c == x, (c < 2.5).expand(3, 8), c >= x]), (X, INTS)),
    "max_min_nan": (lambda x, lo: torch.stack([torch.maximum(x, lo), torch.minimum(x, lo), torch.fmax(x, lo),
                                               torch.fmin(x, lo)]), (X, LO)),
    "fmax_int": (lambda c: torch.fmax(c, c.flip(1)), (INTS,)),
    "classify": (lambda x: torch.stack([x.isnan(), x.isinf(), x.isfinite(), x.isposinf(), x.isneginf(), x.signbit()]),
                 (X,)),
    "logical": (lambda x, c: torch.stack([torch.logical_and(x, c), torch.logical_or(x, c), torch.logical_xor(x, c),
                                          torch.logical_not(x)]), (X, INTS)),
    "sign_of_nan_is_zero": (lambda x: torch.stack([x.sign(), x.sgn(), torch.heaviside(x, x.flip(1))]), (X,)),
    "sign_half": (lambda x: x.half().sign(), (X,)),
    "relu_family_nan": (lambda x: torch.stack([x.relu(), F.hardtanh(x), F.relu6(x), F.threshold(x, 0.5, -1.0)]), (X,)),
}


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_exactly(name: str) -> None:
    fn, args = CASES[name]
    out = torch.compile(fn, backend="minductor", dynamic=False)(*args)
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0, equal_nan=True)
    assert not metrics.fallback_ops, metrics.fallback_ops


def test_masked_ops_fuse_into_one_kernel() -> None:
    def fn(x: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
        y = torch.where(x > 0, x, lo).clamp(lo, lo + 2).masked_fill(x.isnan(), 0.0)
        return torch.tril(y.view(4, 6), 1)

    x, lo = torch.randn(24), torch.randn(24)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, lo), fn(x, lo))
    assert metrics.generated_kernel_count == 1 and not metrics.fallback_ops


def test_masked_loads_are_branch_free(tmp_path: Any) -> None:
    """Masked bodies of loads and math run unconditionally (masked-off lanes read element 0), so
    pooling and padding kernels have no per-element lambda; results keep eager's -inf/NaN edges."""
    from minductor import config

    x = torch.randn(2, 3, 9, 11)
    x[0, 0, 0, 0], x[1, 2, -1, -1] = float("nan"), float("-inf")
    fns = [lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: F.pad(x, (1, 2, 0, 1), value=-1.5) * 2,
           lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)]
    for i, fn in enumerate(fns):
        with config.patch(debug=True, debug_dir=str(tmp_path / str(i))):
            torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), equal_nan=True)
        code = next((tmp_path / str(i)).glob("graph_*/output_code.py")).read_text()
        assert "[&]" not in code, code
        if i == 0:  # stride-2 window loads: a bitwise-selected (gathered) index
            assert "in_ptr0[mi_masked_index(" in code, code


def test_masked_body_with_a_checked_division_stays_conditional(tmp_path: Any) -> None:
    from minductor import config

    a, b = torch.randint(-9, 9, (4, 6)), torch.randint(1, 5, (4, 6))
    fn = lambda a, b: F.pad(a // b, (1, 1))
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(a, b), fn(a, b))
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    assert "mi_check_divisor" not in code or "[&]" in code, code


@pytest.mark.parametrize("shape", [(5, 2, 1), (5, 3, 1), (33, 2, 1)])
def test_pad_of_short_rows_vectorized_outside_the_row(shape) -> None:
    """A pad along rows of 2-3 elements: the row loop is unrolled and the loop outside it
    vectorized, so the padded read is strided along the vector; GCC 12 -O3 miscompiled it as a
    masked strided load (a whole row read as zeros). Such reads take the bitwise select."""
    torch._dynamo.reset()
    x = torch.randn(shape)
    fn = lambda t: torch.nn.functional.pad(t.sum(2), [0, 0, 1, 2]) * 1.5  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend="minductor", dynamic=False)(x), fn(x))
