"""Scans along a dim: cumsum, cumprod, cummax/cummin (values and indices), logcumsumexp.

Each becomes a ``Scan`` node (its own kernel, codegen/cpp_scan.py) whose ``inner_fn``
inlines the input's pointwise producers. Accumulation follows eager's CPU kernels: a
sequential walk in order, in eager's accumulation type (double for float32 sums and
products, float for float16/bfloat16, int64 for integers), so results match eager's
rounding; cummax/cummin take the latest index on ties and propagate NaN with its index.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from minductor.ir.layout import FlexibleLayout
from minductor.ir.nodes import ComputedBuffer, Scan, StorageBox, TensorBox
from minductor.ir.ops import ops
from minductor.lowering.registry import Unsupported, aten, register_lowering, to_dtype
from minductor.virtualized import V

Expr = sympy.Expr
Values = tuple[Any, ...]
Combine = Callable[[Values, Values], Values]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Eager's CPU accumulation type for sums and products of ``dtype``."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype.is_floating_point:
        return torch.float64
    return torch.int64


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def make_scan(
    x: TensorBox, dim: int, dtypes: Sequence[torch.dtype], carry_dtypes: Sequence[torch.dtype],
    init: Sequence[Any], inner_fn: Callable[[Sequence[Expr]], Values], combine_fn: Combine, origin: str,
) -> list[TensorBox]:
    """One realized buffer per output of a scan of ``x`` along ``dim`` (one kernel for all)."""
    size = list(x.get_size())
    outs = []
    for i, dtype in enumerate(dtypes):
        node = Scan(
            x.get_device(), dtype, inner_fn, size, origins=x.origins | {origin}, scan_dim=dim,
            init=tuple(init), carry_dtypes=tuple(carry_dtypes), combine_fn=combine_fn, output_index=i,
        )
        buf = ComputedBuffer(name="", layout=FlexibleLayout.contiguous(x.get_device(), dtype, size), data=node)
        V.graph.register_buffer(buf)
        outs.append(TensorBox(StorageBox(buf)))
    return outs


def _check(x: TensorBox, dim: int, name: str) -> int:
    ndim = len(x.get_size())
    if x.get_dtype().is_complex:
        raise Unsupported(f"{name} of a complex tensor")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise Unsupported(f"{name}: dim {dim} out of range for {ndim}-d input (eager raises)")
    return dim % max(ndim, 1)


def _accumulate(x: TensorBox, dim: int, dtype: torch.dtype | None, name: str, combine: Callable[[Any, Any], Any],
                identity: int) -> TensorBox:
    d = _check(x, dim, name)
    if dtype is None:
        dtype = torch.int64 if not x.get_dtype().is_floating_point else x.get_dtype()
    if dtype == torch.bool:
        raise Unsupported(f"{name} with dtype=torch.bool")
    if len(x.get_size()) == 0:
        return to_dtype(x, dtype)
    acc = acc_dtype(dtype)
    loader = x.make_loader()
    src = x.get_dtype()

    def inner_fn(index: Sequence[Expr]) -> Values:
        value = loader(index)
        return (value if _compute(src) == acc else ops.to_dtype(value, acc),)

    def combine_fn(carry: Values, values: Values) -> Values:
        return (combine(carry[0], values[0]),)

    return make_scan(x, d, [dtype], [acc], [identity], inner_fn, combine_fn, name)[0]


@register_lowering(aten.cumsum)
def cumsum(x: TensorBox, dim: int, *, dtype: torch.dtype | None = None) -> TensorBox:
    return _accumulate(x, dim, dtype, "cumsum", ops.add, 0)


@register_lowering(aten.cumprod)
def cumprod(x: TensorBox, dim: int, *, dtype: torch.dtype | None = None) -> TensorBox:
    return _accumulate(x, dim, dtype, "cumprod", ops.mul, 1)


def _lowest(dtype: torch.dtype, is_max: bool) -> Any:
    if dtype == torch.bool:
        return not is_max
    if dtype.is_floating_point:
        return float("-inf") if is_max else float("inf")
    info = torch.iinfo(dtype)
    return info.min if is_max else info.max


def _cum_extreme(x: TensorBox, dim: int, is_max: bool) -> tuple[TensorBox, TensorBox]:
    name = "cummax" if is_max else "cummin"
    d = _check(x, dim, name)
    dtype = x.get_dtype()
    if len(x.get_size()) == 0:
        zero = TensorBox.create(_scalar_zero(x))
        return to_dtype(x, dtype), zero
    compute = _compute(dtype)
    floating = dtype.is_floating_point
    loader = x.make_loader()

    def inner_fn(index: Sequence[Expr]) -> Values:
        return loader(index), ops.index_expr(index[d], torch.int64)

    def combine_fn(carry: Values, values: Values) -> Values:
        (cv, ci), (v, i) = carry, values
        take = ops.ge(v, cv) if is_max else ops.le(v, cv)  # ties take the latest index, like eager
        if floating:
            take = ops.logical_or(ops.isnan(v), take)  # NaN wins and stays (nothing compares >= NaN)
        return ops.where(take, v, cv), ops.where(take, i, ci)

    init = [_lowest(dtype, is_max), 0]
    values, indices = make_scan(x, d, [dtype, torch.int64], [compute, torch.int64], init, inner_fn, combine_fn, name)
    return values, indices


def _scalar_zero(x: TensorBox) -> Any:
    from minductor.ir.nodes import Pointwise

    return Pointwise(x.get_device(), torch.int64, lambda index: ops.constant(0, torch.int64), [])


@register_lowering(aten.cummax)
def cummax(x: TensorBox, dim: int) -> tuple[TensorBox, TensorBox]:
    return _cum_extreme(x, dim, True)


@register_lowering(aten.cummin)
def cummin(x: TensorBox, dim: int) -> tuple[TensorBox, TensorBox]:
    return _cum_extreme(x, dim, False)


def _log_add_exp(carry: Any, x: Any) -> Any:
    """Eager's ``_log_add_exp_helper(x, carry)``: log(exp(x) + exp(carry)), exact for
    infinities of the same sign and NaN-propagating."""
    nan = ops.isnan(carry)
    lo = ops.where(nan, carry, ops.minimum(x, carry))
    hi = ops.where(nan, carry, ops.maximum(x, carry))
    finite = ops.logical_not(ops.logical_or(ops.isinf(lo), ops.isnan(lo)))
    general = ops.add(ops.log1p(ops.exp(ops.sub(lo, hi))), hi)
    return ops.where(ops.logical_or(ops.ne(lo, hi), finite), general, x)


@register_lowering(aten.logcumsumexp)
def logcumsumexp(x: TensorBox, dim: int) -> TensorBox:
    d = _check(x, dim, "logcumsumexp")
    dtype = x.get_dtype()
    if not dtype.is_floating_point:
        raise Unsupported("logcumsumexp of an integer tensor (eager raises)")
    if len(x.get_size()) == 0:
        return to_dtype(x, dtype)
    acc = acc_dtype(dtype)
    loader = x.make_loader()

    def inner_fn(index: Sequence[Expr]) -> Values:
        value = loader(index)
        return (value if _compute(dtype) == acc else ops.to_dtype(value, acc),)

    def combine_fn(carry: Values, values: Values) -> Values:
        return (_log_add_exp(carry[0], values[0]),)

    return make_scan(x, d, [dtype], [acc], [float("-inf")], inner_fn, combine_fn, "logcumsumexp")[0]
