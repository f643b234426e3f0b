"""Scans along a dim (cumsum, cumprod, cummax/cummin, logcumsumexp) as native Scan kernels.

Accumulation runs in eager's order and accumulation type (double for float32 sums and
products), so float32 results are compared bit for bit; every test also asserts that no
op fell back to aten.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import metrics

EXACT = {"rtol": 0, "atol": 0}


def check(fn: Callable[..., Any], *args: torch.Tensor, exact: bool = True, kernels: int | None = None, **tol: Any) -> Any:
    """Compiled ``fn`` matches eager (bit for bit with ``exact``), natively (no fallback)."""
    expected = fn(*[a.clone() for a in args])
    actual = torch.compile(fn, backend="minductor", dynamic=False)(*[a.clone() for a in args])
    torch.testing.assert_close(actual, expected, equal_nan=True, **(EXACT if exact else tol))
    assert not metrics.fallback_ops, dict(metrics.fallback_ops)
    if kernels is not None:
        assert metrics.generated_kernel_count == kernels
    return actual


def _x(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-5, 6, shape, dtype=dtype)


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_cumsum_cumprod_every_dim(dim: int) -> None:
    x = _x(6, 33, 70) * 0.5 + 1
    check(lambda x: (torch.cumsum(x, dim), torch.cumprod(x, dim)), x)


def test_cummax_cummin_values_and_indices_with_ties() -> None:
    x = _x(40, 50, dtype=torch.int64)  # few distinct values: many ties, eager takes the latest index
    for dim in (0, 1):
        check(lambda x, dim=dim: (torch.cummax(x, dim), torch.cummin(x, dim)), x)


def test_cummax_nan_propagates_with_its_index() -> None:
    x = _x(8, 300)
    x[2, 10] = x[5, 100] = x[5, 250] = float("nan")
    x[6, 0] = float("inf")
    x[7, 3] = float("-inf")
    for dim in (0, 1):
        check(lambda x, dim=dim: (torch.cummax(x, dim), torch.cummin(x, dim)), x)


def test_logcumsumexp_with_infinities_and_nan() -> None:
    x = _x(5, 200) * 10
    x[1, :5] = float("-inf")
    x[2, 7] = float("inf")
    x[3, 9] = float("nan")
    for dim in (0, 1):
        # exp/log1p may differ from libm in the last bit
        check(lambda x, dim=dim: torch.logcumsumexp(x, dim), x, exact=False)
    ref = torch.logcumsumexp(x.double(), 1).float()
    torch.testing.assert_close(torch.compile(lambda x: torch.logcumsumexp(x, 1), backend="minductor")(x), ref, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, torch.uint8])
def test_integer_cumsum_is_int64(dtype: torch.dtype) -> None:
    x = _x(9, 70, dtype=torch.int64).to(dtype) if dtype != torch.bool else _x(9, 70) > 0
    out = check(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 0)), x)
    assert out[0].dtype == torch.int64


def test_dtype_kwarg() -> None:
    x = _x(7, 90)
    check(lambda x: (torch.cumsum(x, 1, dtype=torch.float64), torch.cumprod(x, 0, dtype=torch.float64)), x)
    check(lambda x: torch.cumsum(x, 1, dtype=torch.int32), _x(7, 90, dtype=torch.int16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision(dtype: torch.dtype) -> None:
    x = _x(12, 64, dtype=dtype)
    check(lambda x: (torch.cumsum(x, 1), torch.cummax(x, 0), torch.logcumsumexp(x, 1)), x, exact=False)


def test_non_contiguous_input_and_fused_prologue() -> None:
    x = _x(64, 48).t()  # the scan reads a transposed buffer
    # the pointwise producer is inlined into the scan: one kernel for exp + cumsum
    check(lambda x: torch.cumsum(x.exp() * 0.5, 1), x, kernels=1, exact=False)  # exp may differ in the last bit
    # cummax's values and indices come out of one kernel
    metrics.reset()
    torch._dynamo.reset()
    check(lambda x: torch.cummax(x, 0), x, kernels=1)


def test_scalar_empty_and_size_one_dims() -> None:
    check(lambda x: (torch.cumsum(x, 0), torch.cummax(x, 0), torch.logcumsumexp(x, -1)), torch.tensor(2.5))
    check(lambda x: (torch.cumsum(x, 1), torch.cummin(x, 1)), torch.randn(3, 0, 4))
    check(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 0)), torch.randn(1, 1, 5))


def test_consumer_of_scan_output() -> None:
    x = _x(16, 1000)
    check(lambda x: torch.cumsum(x, 1).sum(1) + torch.cumsum(x, 0)[-1, :16], x, exact=False)


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax", "logcumsumexp"])
def test_backward(op: str) -> None:
    """Gradients: cumsum's is a reversed cumsum, cummax's a scatter_add of the indices."""
    fns = {
        "cumsum": lambda x: torch.cumsum(x, 1),
        "cumprod": lambda x: torch.cumprod(x, 1),
        "cummax": lambda x: torch.cummax(x, 0).values,
        "logcumsumexp": lambda x: torch.logcumsumexp(x, 1),
    }
    fn = fns[op]
    x = _x(6, 40) * 0.5 + (1 if op == "cumprod" else 0)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.compile(fn, backend="minductor")(xa)
    ref = fn(xb)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-4)
    native = {"aten.cumsum", "aten.cumprod", "aten.cummax", "aten.logcumsumexp"}
    assert not (set(metrics.fallback_ops) & native), dict(metrics.fallback_ops)


@pytest.mark.parametrize("rows", [1, 3, 4, 14])
def test_rows_scanned_together_along_the_innermost_dim(rows: int, tmp_path: Any) -> None:
    """Rows scanned along their innermost dim walk it ``INTERLEAVE`` at a time, each with its
    own carries (cummax's value and index), still in eager's order: bit for bit, with a last
    partial group and with fewer rows than a group."""
    from minductor import config
    from minductor.codegen.cpp_scan import INTERLEAVE

    x = _x(rows, 300, dtype=torch.int64)  # few distinct values: cummax ties
    y = _x(2, rows, 300)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        check(lambda x, y: (torch.cummax(x, 1), torch.cumsum(y, -1), torch.logcumsumexp(y, 2)), x, y, exact=False)
        check(lambda x, y: (torch.cummax(x, 1), torch.cumsum(y, -1)), x, y)
    source = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp"))
    grouped = f"mi_x0_base += {INTERLEAVE}" in source and f"mi_x1_base += {INTERLEAVE}" in source
    assert grouped == (rows >= INTERLEAVE)
    if grouped:
        assert f"mi_carry1_{INTERLEAVE - 1}" in source  # cummax's index carry, per row of a group
