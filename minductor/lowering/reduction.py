"""Reduction lowerings: sum, prod, mean, amax/amin, argmax/argmin, any/all, var/var_mean."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from minductor.ir.nodes import Pointwise, Reduction, TensorBox
from minductor.ir.ops import ops
from minductor.lowering.constructors import full_of
from minductor.lowering.pointwise import add, clamp_min, div, mul, sub
from minductor.lowering.registry import Unsupported, aten, register_lowering, to_dtype
from minductor.lowering.views import view
from minductor.virtualized import V

Expr = sympy.Expr


def _dims(dims: Any, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    out = sorted({d + ndim if d < 0 else d for d in dims} if ndim else set())
    return out


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def make_reduction(
    x: TensorBox, dims: Any, keepdim: bool, reduction_type: str, dtype: torch.dtype, output_index: int | None = None
) -> TensorBox:
    """Reduce ``x`` over ``dims``; the result is realized (reductions are never inlined)."""
    size = x.get_size()
    ndim = len(size)
    reduced = _dims(dims, ndim)
    kept = [i for i in range(ndim) if i not in reduced]
    ranges = [sympy.Integer(1) if i in reduced else size[i] for i in range(ndim)] if keepdim else [size[i] for i in kept]
    reduction_ranges = [size[i] for i in reduced]
    if any(s == 0 for s in reduction_ranges):
        return _empty_reduction(x, ranges, reduction_type, dtype)
    src_dtype = x.get_dtype()
    acc_dtype = compute_dtype(dtype) if reduction_type not in ("argmax", "argmin") else compute_dtype(src_dtype)
    loader = x.make_loader()

    def inner_fn(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        full: list[Expr] = [sympy.Integer(0)] * ndim
        outer = [index[i] for i in kept] if keepdim else list(index)
        for i, v in zip(kept, outer):
            full[i] = v
        for i, r in zip(reduced, rindex):
            full[i] = r
        value = loader(full)
        if reduction_type in ("sum", "prod", "welford_reduce") and compute_dtype(src_dtype) != acc_dtype:
            value = ops.to_dtype(value, acc_dtype)
        if reduction_type == "any" and src_dtype != torch.bool:
            value = ops.ne(value, ops.constant(0, compute_dtype(src_dtype)))
        return value

    if all(s == 1 for s in reduction_ranges):  # one element each: elementwise, free to inline
        return _single_element(x, inner_fn, ranges, reduction_type, dtype, output_index, len(reduced))
    count = sympy.Mul(*reduction_ranges)
    if reduction_type in _COMBINE and count.is_Integer and int(count) <= UNROLL_MAX:
        return _unrolled(x, inner_fn, ranges, reduction_ranges, reduction_type, dtype)
    node = Reduction(
        x.get_device(), dtype, inner_fn, ranges, origins=x.origins | {reduction_type},
        src_dtype=src_dtype, reduction_ranges=reduction_ranges, reduction_type=reduction_type,
        output_index=output_index,
    )
    out = TensorBox.create(node)
    out.realize()
    return out


def _single_element(x: TensorBox, inner_fn: Any, ranges: list[Expr], reduction_type: str, dtype: torch.dtype,
                    output_index: int | None, n_reduced: int) -> TensorBox:
    """A reduction over a single element: the element itself (its index 0 for argmax/argmin,
    a deviation of 0 for Welford's m2)."""
    zero = [sympy.Integer(0)] * n_reduced

    def fn(index: Sequence[Expr]) -> Any:
        if reduction_type in ("argmax", "argmin") or (reduction_type == "welford_reduce" and output_index == 1):
            return ops.constant(0, dtype)
        return ops.to_dtype(inner_fn(index, zero), dtype)

    return TensorBox.create(Pointwise(x.get_device(), dtype, fn, ranges, origins=x.origins | {reduction_type}))


# A reduction of at most this many elements (a static count) is a pointwise combination of
# them, free to inline and to tile like any pointwise body: a DeBERTa backward's sum over 2
# (a (2, 4, 256, 64) gradient read transposed) ran as 65536 scalar two-step reductions
# (130 us, four such a step).
UNROLL_MAX = 8
_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "any": "logical_or"}


def _unrolled(x: TensorBox, inner_fn: Any, ranges: list[Expr], reduction_ranges: list[Expr], reduction_type: str,
              dtype: torch.dtype) -> TensorBox:
    """The reduction over a few elements as one pointwise body combining them in order."""
    combine = getattr(ops, _COMBINE[reduction_type])
    points = list(itertools.product(*(range(int(s)) for s in reduction_ranges)))

    def fn(index: Sequence[Expr]) -> Any:
        acc = None
        for point in points:
            value = inner_fn(index, [sympy.Integer(r) for r in point])
            acc = value if acc is None else combine(acc, value)
        return ops.to_dtype(acc, dtype)

    return TensorBox.create(Pointwise(x.get_device(), dtype, fn, ranges, origins=x.origins | {reduction_type}))


def _empty_reduction(x: TensorBox, ranges: list[Expr], reduction_type: str, dtype: torch.dtype) -> TensorBox:
    identity = {"sum": 0, "prod": 1, "any": False}
    if reduction_type not in identity:
        raise Unsupported(f"{reduction_type} of an empty dimension (eager raises)")
    value = identity[reduction_type]
    return TensorBox.create(Pointwise(x.get_device(), dtype, lambda index: ops.constant(value, dtype), ranges))


def _sum_dtype(x: TensorBox, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    src = x.get_dtype()
    return torch.int64 if (src == torch.bool or not src.is_floating_point) else src


@register_lowering(aten.sum)
def sum_(x: TensorBox, dims: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> TensorBox:
    if isinstance(dims, torch.dtype):  # sum.default(x, dtype)
        dims, dtype = None, dims
    out_dtype = _sum_dtype(x, dtype)
    if dtype is not None:
        x = to_dtype(x, dtype)
    return make_reduction(x, dims, keepdim, "sum", out_dtype)


@register_lowering(aten.prod)
def prod(x: TensorBox, dim: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> TensorBox:
    if isinstance(dim, torch.dtype):
        dim, dtype = None, dim
    out_dtype = _sum_dtype(x, dtype)
    if dtype is not None:
        x = to_dtype(x, dtype)
    return make_reduction(x, dim, keepdim, "prod", out_dtype)


@register_lowering(aten.mean)
def mean(x: TensorBox, dims: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> TensorBox:
    if isinstance(dims, torch.dtype):
        dims, dtype = None, dims
    out_dtype = dtype or x.get_dtype()
    if not out_dtype.is_floating_point:
        raise Unsupported("mean of an integer tensor (eager raises)")
    # half and bfloat16: the sum and the division in float, rounded once (as eager does; a sum
    # rounded to bfloat16 and then divided was off by up to an ulp)
    acc_dtype = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    total = make_reduction(to_dtype(x, acc_dtype), dims, keepdim, "sum", acc_dtype)
    size = x.get_size()
    count = sympy.Mul(*[size[d] for d in _dims(dims, len(size))]) if size else sympy.Integer(1)
    return to_dtype(div(total, float(count) if count.is_number else count), out_dtype)


@register_lowering(aten.amax)
def amax(x: TensorBox, dims: Any = None, keepdim: bool = False) -> TensorBox:
    return make_reduction(x, dims, keepdim, "max", x.get_dtype())


@register_lowering(aten.amin)
def amin(x: TensorBox, dims: Any = None, keepdim: bool = False) -> TensorBox:
    return make_reduction(x, dims, keepdim, "min", x.get_dtype())


def _arg(x: TensorBox, dim: int | None, keepdim: bool, kind: str) -> TensorBox:
    if dim is None:
        flat = view(x, [-1]) if len(x.get_size()) != 1 else x
        out = make_reduction(flat, [0], False, kind, torch.int64)
        if keepdim:
            return view(out, [1] * len(x.get_size()))
        return out
    if len(x.get_size()) == 0:
        return make_reduction(view(x, [1]), [0], False, kind, torch.int64)
    return make_reduction(x, [dim], keepdim, kind, torch.int64)


@register_lowering(aten.argmax)
def argmax(x: TensorBox, dim: int | None = None, keepdim: bool = False) -> TensorBox:
    return _arg(x, dim, keepdim, "argmax")


@register_lowering(aten.argmin)
def argmin(x: TensorBox, dim: int | None = None, keepdim: bool = False) -> TensorBox:
    return _arg(x, dim, keepdim, "argmin")


@register_lowering(aten.max.dim)
def max_dim(x: TensorBox, dim: int, keepdim: bool = False) -> tuple[TensorBox, TensorBox]:
    if len(x.get_size()) == 0:
        return x, _arg(x, dim, keepdim, "argmax")
    return amax(x, [dim], keepdim), argmax(x, dim, keepdim)


@register_lowering(aten.min.dim)
def min_dim(x: TensorBox, dim: int, keepdim: bool = False) -> tuple[TensorBox, TensorBox]:
    if len(x.get_size()) == 0:
        return x, _arg(x, dim, keepdim, "argmin")
    return amin(x, [dim], keepdim), argmin(x, dim, keepdim)


@register_lowering(aten.max.default)
def max_all(x: TensorBox) -> TensorBox:
    return amax(x, None, False)


@register_lowering(aten.min.default)
def min_all(x: TensorBox) -> TensorBox:
    return amin(x, None, False)


@register_lowering(aten.any)
def any_(x: TensorBox, dims: Any = None, keepdim: bool = False) -> TensorBox:
    out = make_reduction(x, dims, keepdim, "any", torch.bool)
    return to_dtype(out, torch.uint8) if x.get_dtype() == torch.uint8 else out  # eager keeps uint8


@register_lowering(aten.all)
def all_(x: TensorBox, dims: Any = None, keepdim: bool = False) -> TensorBox:
    from minductor.lowering.pointwise import logical_not

    return logical_not(any_(logical_not(x), dims, keepdim))


# float32/float64 rows (trailing dims) of at most TWO_PASS_MAX elements (a known count) take the
# mean, then the sum of squared deviations from it: two sum reductions the scheduler fuses into
# one row kernel (like softmax's max and sum) that reads the row back from cache, where Welford's
# update chains a subtract and a multiply-add per element. On a Xeon (family 6 model 207),
# generated kernels via ctypes, interleaved: layer_norm of 1024x256 63-69 -> 35-40 us (eager
# 75-96). The variance is closer to float64's too: x.var(1) of 64x300 values around 1e4 was off
# by 3.6e-4 with Welford, 1.7e-6 so. A third pass over long rows costs more than the chain:
# layer_norm(x + r) of 4096x4096 ran 6.4-6.9 ms with Welford, 7.9-8.4 so. Longer rows, symbolic
# counts and half types (the mean would round) keep Welford.
TWO_PASS_MAX = 2048
# Other reductions (columns: batch_norm's statistics over N, H, W) take two passes too when the
# input fits the last-level cache, where the second pass reads it back: Welford's lanes over
# columns cost a division per element. On the Zen 5 VM (2 threads, 32 MB L3), compiled
# var_mean(x, (0, 2, 3)), interleaved: 8x64x32x32 channels-last 208 -> 44 us, NCHW 185 -> 36 us;
# 32x64x56x56 (25.7 MB) channels-last 2.40 -> 0.69 ms, NCHW 2.55 -> 0.37 ms. From memory twice
# is slower: x.var(0) of 4096x4096 (64 MB) 2.58 ms with Welford, 3.93 with two passes.
TWO_PASS_MAX_BYTES = 32 << 20


def _welford(x: TensorBox, dims: Any, keepdim: bool) -> tuple[TensorBox, TensorBox, Expr]:
    """The mean, the sum of squared deviations from it (m2) and the count of ``x`` over ``dims``."""
    dtype = x.get_dtype()
    if not dtype.is_floating_point:
        raise Unsupported("var of an integer tensor")
    size = x.get_size()
    reduced = _dims(dims, len(size))
    count = sympy.Mul(*[size[d] for d in reduced]) if size else sympy.Integer(1)
    trailing = reduced == list(range(len(size) - len(reduced), len(size)))  # rows, not columns
    rows = trailing and count.is_Integer and 1 < int(count) <= TWO_PASS_MAX
    # (a symbolic size at its hint: dynamic batch norm statistics take two passes too)
    cached = not trailing and V.graph.sizevars.hint(sympy.Mul(*size) * dtype.itemsize) <= TWO_PASS_MAX_BYTES
    if dtype in (torch.float32, torch.float64) and (rows or cached):
        # corrected two-pass: the deviations' own sum refines the mean and the squares (exact
        # for a row of equal values, as eager is: a layer_norm of such a row is 0, not the
        # rounding of n*x/n over sqrt(eps)); one more sum in the same pass
        n = float(count) if count.is_Integer else count
        mean0 = div(make_reduction(x, dims, True, "sum", dtype), n)
        deviation = sub(x, mean0)
        shift = make_reduction(deviation, dims, True, "sum", dtype)
        squares = make_reduction(mul(deviation, deviation), dims, True, "sum", dtype)
        m2 = clamp_min(sub(squares, div(mul(shift, shift), n)), 0.0)
        mean_ = add(mean0, div(shift, n))
        if not keepdim:
            kept = [size[i] for i in range(len(size)) if i not in reduced]
            mean_, m2 = view(mean_, kept), view(m2, kept)
        return mean_, m2, count
    mean_ = make_reduction(x, dims, keepdim, "welford_reduce", dtype, output_index=0)
    m2 = make_reduction(x, dims, keepdim, "welford_reduce", dtype, output_index=1)
    return mean_, m2, count


@register_lowering(aten.var.correction)
def var(x: TensorBox, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> TensorBox:
    _, m2, count = _welford(x, dims, keepdim)
    return div(m2, _dof(count, correction, m2))


@register_lowering(aten.var_mean.correction)
def var_mean(x: TensorBox, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple[TensorBox, TensorBox]:
    mean_, m2, count = _welford(x, dims, keepdim)
    return div(m2, _dof(count, correction, m2)), mean_


def _dof(count: Expr, correction: Any, m2: TensorBox) -> Any:
    """Degrees of freedom, ``max(count - correction, 0)``: a number, a size expression (an
    integral correction, which Dynamo may pass as a symbol), or, for a fractional correction
    of a symbolic count, a scalar tensor of ``m2``'s dtype computed in the kernel (a size
    expression is an integer: ``count - 1.3`` in one truncated the correction)."""
    correction = sympy.sympify(1 if correction is None else correction)
    if correction.is_number and float(correction).is_integer():
        correction = sympy.Integer(int(correction))
    if count.is_number and correction.is_number:
        return max(float(count) - float(correction), 0.0)
    if correction.is_integer:
        return sympy.Max(count - correction, 0)
    return clamp_min(sub(full_of([], count, m2.get_dtype(), m2.get_device()), float(correction)), 0.0)


__all__ = ["make_reduction", "mul", "sub"]
