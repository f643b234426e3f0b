"""Pointwise lowerings: math, comparisons, logic, bitwise, where, clamp, casts."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from minductor.ir.layout import channels_last_order
from minductor.ir.nodes import Pointwise, TensorBox
from minductor.ir.ops import ops
from minductor.lowering.registry import (
    Promotion,
    Unsupported,
    _cast_loader,
    aten,
    broadcast_shapes,
    expand_to,
    is_tensor,
    layout_hint,
    make_pointwise,
    origins_of,
    promote,
    register_lowering,
    scalar_loader,
    to_dtype,
)

Expr = sympy.Expr
import torch._prims

prims = torch.ops.prims

# aten op -> ops name, for ops whose integer inputs compute in float
_FLOAT_UNARY = {
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt",
    aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos",
    aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf",
    aten.erfc: "erfc", aten.erfinv: "erfinv", aten.sigmoid: "sigmoid", aten.lgamma: "lgamma",
    aten.reciprocal: "reciprocal",
}
# aten op -> ops name, result keeps the input dtype
_SAME_UNARY = {
    aten.abs: "abs", aten.neg: "neg", aten.floor: "floor", aten.ceil: "ceil",
    aten.trunc: "trunc", aten.sign: "sign", aten.relu: "relu",
}
_BOOL_UNARY = {aten.isnan: "isnan", aten.isinf: "isinf", aten.signbit: "signbit"}
_COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}
_LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor"}
_BITWISE = {
    aten.bitwise_and: ("bitwise_and", "logical_and"),
    aten.bitwise_or: ("bitwise_or", "logical_or"),
    aten.bitwise_xor: ("bitwise_xor", "logical_xor"),
}


def _op(name: str) -> Any:
    return getattr(ops, name)


def _register_table() -> None:
    for aten_op, name in _FLOAT_UNARY.items():
        register_lowering(aten_op)(make_pointwise(_op(name), Promotion.INT_TO_FLOAT, name=aten_op.__name__))
    for aten_op, name in _SAME_UNARY.items():
        register_lowering(aten_op)(_int_identity_or(name, aten_op.__name__))
    for aten_op, name in _BOOL_UNARY.items():
        register_lowering(aten_op)(make_pointwise(_op(name), Promotion.ALWAYS_BOOL, name=aten_op.__name__))
    for aten_op, name in _COMPARE.items():
        register_lowering(aten_op)(make_pointwise(_op(name), Promotion.ALWAYS_BOOL, name=aten_op.__name__))
    for aten_op, name in _LOGICAL.items():
        register_lowering(aten_op)(_logical(name, aten_op.__name__))
    for aten_op, (name, bool_name) in _BITWISE.items():
        register_lowering(aten_op)(_bitwise(name, bool_name, aten_op.__name__))


def _int_identity_or(name: str, origin: str) -> Any:
    fn = make_pointwise(_op(name), name=origin)
    rounding = name in ("floor", "ceil", "trunc")

    def lowering(x: TensorBox) -> TensorBox:
        if rounding and not x.get_dtype().is_floating_point:
            return x
        if name == "abs" and x.get_dtype() == torch.bool:
            return x
        if name == "sign" and x.get_dtype().is_floating_point:
            return _sign_float(x)
        return fn(x)

    return lowering


def _sign_float(x: TensorBox) -> TensorBox:
    """sign with eager's sign(NaN) == 0 (its CPU kernels compute ``(0 < x) - (x < 0)``)."""
    compute = torch.float32 if x.get_dtype() in (torch.float16, torch.bfloat16) else x.get_dtype()
    return make_pointwise(lambda v: ops.where(ops.isnan(v), ops.constant(0, compute), ops.sign(v)), name="sign")(x)


def _logical(name: str, origin: str) -> Any:
    def lowering(a: Any, b: Any) -> TensorBox:
        return make_pointwise(_op(name), Promotion.ALWAYS_BOOL, compute_dtype=torch.bool, name=origin)(
            _as_bool(a), _as_bool(b)
        )

    return lowering


def _as_bool(x: Any) -> Any:
    if is_tensor(x):
        return x if x.get_dtype() == torch.bool else make_pointwise(
            lambda v: ops.ne(v, ops.constant(0, x.get_dtype())), Promotion.ALWAYS_BOOL, compute_dtype=x.get_dtype()
        )(x)
    return bool(x)


def _bitwise(name: str, bool_name: str, origin: str) -> Any:
    int_fn = make_pointwise(_op(name), name=origin)
    bool_fn = make_pointwise(_op(bool_name), name=origin)

    def lowering(a: Any, b: Any) -> TensorBox:
        tensors = [t for t in (a, b) if is_tensor(t)]
        if any(t.get_dtype().is_floating_point for t in tensors) or isinstance(a, float) or isinstance(b, float):
            raise Unsupported("bitwise op on floating point")
        if all(t.get_dtype() == torch.bool for t in tensors) and all(is_tensor(t) or isinstance(t, bool) for t in (a, b)):
            return bool_fn(a, b)
        return int_fn(a, b)

    return lowering


_register_table()


@register_lowering(aten.logical_not)
def logical_not(x: TensorBox) -> TensorBox:
    return make_pointwise(ops.logical_not, Promotion.ALWAYS_BOOL, compute_dtype=torch.bool, name="logical_not")(_as_bool(x))


@register_lowering(aten.bitwise_not)
def bitwise_not(x: TensorBox) -> TensorBox:
    if x.get_dtype() == torch.bool:
        return logical_not(x)
    if x.get_dtype().is_floating_point:
        raise Unsupported("bitwise_not of float")
    return make_pointwise(ops.bitwise_not, name="bitwise_not")(x)


def _scaled(b: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return b
    if is_tensor(b):
        return mul(b, alpha)
    return b * alpha


_add = make_pointwise(ops.add, name="add")
_sub = make_pointwise(ops.sub, name="sub")
_mul = make_pointwise(ops.mul, name="mul")


@register_lowering(aten.add)
def add(a: Any, b: Any, alpha: Any = None) -> TensorBox:
    b = _scaled(b, alpha)
    if _all_bool(a, b):
        return make_pointwise(ops.logical_or, name="add")(a, b)
    return _add(a, b)


@register_lowering(aten.sub)
def sub(a: Any, b: Any, alpha: Any = None) -> TensorBox:
    return _sub(a, _scaled(b, alpha))


@register_lowering(aten.rsub)
def rsub(a: Any, b: Any, alpha: Any = None) -> TensorBox:
    return _sub(b, _scaled(a, alpha))


@register_lowering(aten.mul)
def mul(a: Any, b: Any) -> TensorBox:
    if _all_bool(a, b):
        return make_pointwise(ops.logical_and, name="mul")(a, b)
    return _mul(a, b)


def _all_bool(*args: Any) -> bool:
    return all((is_tensor(a) and a.get_dtype() == torch.bool) or isinstance(a, bool) for a in args)


_truediv = make_pointwise(ops.truediv, Promotion.INT_TO_FLOAT, name="div")


@register_lowering(aten.div)
def div(a: Any, b: Any, rounding_mode: str | None = None) -> TensorBox:
    if rounding_mode is None:
        return _truediv(a, b)  # an IEEE division, as eager's: `x / scale` rounded must round alike
    if rounding_mode == "trunc":
        return make_pointwise(_div_trunc, name="div")(a, b)
    if rounding_mode == "floor":
        return make_pointwise(_div_floor, name="div")(a, b)
    raise Unsupported(f"rounding_mode={rounding_mode!r}")


# which ops to use for integer vs float operands is decided at codegen by the operand type;
# ops.floordiv / ops.truncdiv follow Python / C semantics for both.
def _div_trunc(a: Any, b: Any) -> Any:
    return ops.truncdiv(a, b)


def _div_floor(a: Any, b: Any) -> Any:
    return ops.floordiv(a, b)


@register_lowering(aten.remainder)
def remainder(a: Any, b: Any) -> TensorBox:
    return make_pointwise(ops.mod, name="remainder")(a, b)


@register_lowering(aten.fmod)
def fmod(a: Any, b: Any) -> TensorBox:
    return make_pointwise(ops.fmod, name="fmod")(a, b)


# |exponent| up to which a float tensor's integer power is multiplied out (x ** 3 in GELU-tanh)
MAX_MULTIPLIED_POWER = 16


@register_lowering(aten.pow)
def pow_(a: Any, b: Any) -> TensorBox:
    """Powers by a constant multiply out: an integer exponent by repeated squaring (a
    reciprocal after it if negative, for floats), and 0.5 and -0.5 as sqrt and rsqrt, as
    eager's kernel does for them, except in half, where eager calls pow ((-inf) ** 0.5 is inf
    there, NaN as sqrt). libm's powf is a call per element that keeps the whole fused loop
    scalar (GPT-2's GELU-tanh, ``x ** 3``). Within float32 tolerances of powf (at most
    2 log2(n) roundings); integer powers wrap as eager's repeated squaring does."""
    if is_tensor(a) and not is_tensor(b) and isinstance(b, (int, float)):
        a = to_dtype(a, _result_dtype(a, b))  # an integer tensor to a float power is float
        dtype = a.get_dtype()
        if b == 1:
            return a
        if b in (0.5, -0.5) and dtype in (torch.float32, torch.float64, torch.bfloat16):
            return make_pointwise(ops.sqrt if b > 0 else ops.rsqrt, name="pow")(a)
        if b in (0.5, -0.5) and dtype == torch.float16:  # pow's: +0 at -0, inf at -inf (GCC's rewrite of powf gave NaN)
            return make_pointwise(_pow_sqrt if b > 0 else lambda x: ops.reciprocal(_pow_sqrt(x)), name="pow")(a)
        if (float(b).is_integer() and 0 < abs(b) <= MAX_MULTIPLIED_POWER and dtype != torch.bool
                and (b > 0 or dtype.is_floating_point)):
            return make_pointwise(lambda x: _integer_power(x, int(b)), name="pow")(a)
    return make_pointwise(ops.pow, name="pow")(a, b)


def _pow_sqrt(x: Any) -> Any:
    """pow(x, 0.5): sqrt, but +0 at -0 and inf at -inf."""
    root = ops.add(ops.sqrt(x), ops.constant(0.0, torch.float32))
    return ops.where(ops.eq(x, ops.constant(-math.inf, torch.float32)), ops.constant(math.inf, torch.float32), root)


def _integer_power(x: Any, n: int) -> Any:
    result, base, k = None, x, abs(n)
    while k:
        if k & 1:
            result = base if result is None else ops.mul(result, base)
        k >>= 1
        if k:
            base = ops.mul(base, base)
    return ops.reciprocal(result) if n < 0 else result


def _result_dtype(a: Any, b: Any) -> torch.dtype:
    from minductor.lowering.registry import promote

    return promote([a, b], Promotion.DEFAULT)[1]


for _aten_op, _name in [(aten.maximum, "maximum"), (aten.minimum, "minimum"), (aten.nextafter, "nextafter")]:
    register_lowering(_aten_op)(make_pointwise(_op(_name), name=_name))


def _nan_ignoring(name: str) -> Any:
    """fmax/fmin: like maximum/minimum, but a NaN loses to a number."""
    def body(a: Any, b: Any) -> Any:
        return ops.where(ops.isnan(b), a, ops.where(ops.isnan(a), b, _op(name)(a, b)))

    return make_pointwise(body, name=f"f{name[:3]}")


register_lowering(aten.fmax)(_nan_ignoring("maximum"))
register_lowering(aten.fmin)(_nan_ignoring("minimum"))
for _aten_op, _name in [(aten.atan2, "atan2"), (aten.hypot, "hypot"), (aten.copysign, "copysign")]:
    register_lowering(_aten_op)(make_pointwise(_op(_name), Promotion.INT_TO_FLOAT, name=_name))
for _aten_op, _name in [
    (aten.bitwise_left_shift, "left_shift"), (aten.bitwise_right_shift, "right_shift"),
    (aten.__lshift__, "left_shift"), (aten.__rshift__, "right_shift"),
]:
    register_lowering(_aten_op)(make_pointwise(_op(_name), name=_name))


@register_lowering(aten.round)
def round_(x: TensorBox, decimals: int = 0) -> TensorBox:
    if not x.get_dtype().is_floating_point:
        return x
    if decimals == 0:
        return make_pointwise(ops.round, name="round")(x)
    scale = 10.0 ** decimals
    return make_pointwise(lambda v, s: ops.truediv(ops.round(ops.mul(v, s)), s), name="round")(x, scale)


@register_lowering(aten.where)
def where(cond: Any, a: Any, b: Any) -> TensorBox:
    if not is_tensor(cond):
        raise Unsupported("where with a scalar condition")
    cond = _as_bool(cond)
    _, result = promote([a, b], Promotion.DEFAULT)
    compute = torch.float32 if result in (torch.float16, torch.bfloat16) else result
    values = [_cast_loader_for(v, compute) for v in (a, b)]
    size = broadcast_shapes(*[t.get_size() for t in (cond, a, b) if is_tensor(t)])
    cond_load = expand_to(cond, size).make_loader()
    a_load, b_load = (v if not is_tensor(t) else expand_to(t, size).make_loader() for v, t in zip(values, (a, b)))
    a_load = _cast_loader(a_load, a.get_dtype(), compute) if is_tensor(a) else a_load
    b_load = _cast_loader(b_load, b.get_dtype(), compute) if is_tensor(b) else b_load

    def inner_fn(index: Sequence[Expr]) -> Any:
        value = ops.where(cond_load(index), a_load(index), b_load(index))
        return ops.to_dtype(value, result) if compute != result else value

    return TensorBox.create(Pointwise(cond.get_device(), result, inner_fn, size, origins=origins_of(cond, a, b) | {"where"},
                                      stride_order=layout_hint([cond, a, b], size)))


def _cast_loader_for(v: Any, dtype: torch.dtype) -> Any:
    return None if is_tensor(v) else scalar_loader(v, dtype)


@register_lowering(aten.clamp)
def clamp(x: TensorBox, min: Any = None, max: Any = None) -> TensorBox:
    out = x
    if min is not None:
        out = make_pointwise(ops.maximum, name="clamp")(out, min)
    if max is not None:
        out = make_pointwise(ops.minimum, name="clamp")(out, max)
    if min is None and max is None:
        raise Unsupported("clamp without bounds")
    return out


@register_lowering(aten.clamp_min)
def clamp_min(x: TensorBox, min: Any) -> TensorBox:
    return clamp(x, min, None)


@register_lowering(aten.clamp_max)
def clamp_max(x: TensorBox, max: Any) -> TensorBox:
    return clamp(x, None, max)


@register_lowering(aten.hardtanh)
def hardtanh(x: TensorBox, min_val: float = -1.0, max_val: float = 1.0) -> TensorBox:
    """clamp to bounds of ``x``'s dtype: an integer tensor stays one, its bounds truncated toward
    zero as eager converts them (clamp's float bounds would make the result float)."""
    if not x.get_dtype().is_floating_point:
        min_val, max_val = int(min_val), int(max_val)
    return clamp(x, min_val, max_val)


@register_lowering(aten.gelu)
def gelu(x: TensorBox, approximate: str = "none") -> TensorBox:
    def exact(v: Any) -> Any:
        half = ops.constant(0.5, torch.float32)
        inner = ops.erf(ops.mul(v, ops.constant(math.sqrt(0.5), torch.float32)))
        return ops.mul(ops.mul(v, half), ops.add(inner, ops.constant(1.0, torch.float32)))

    def tanh_approx(v: Any) -> Any:
        c = ops.constant(math.sqrt(2.0 / math.pi), torch.float32)
        cube = ops.mul(ops.mul(v, v), v)
        inner = ops.mul(c, ops.add(v, ops.mul(ops.constant(0.044715, torch.float32), cube)))
        return ops.mul(ops.mul(ops.constant(0.5, torch.float32), v), ops.add(ops.constant(1.0, torch.float32), ops.tanh(inner)))

    if x.get_dtype() == torch.float64:
        raise Unsupported("gelu body is written in float32 constants")
    return make_pointwise(exact if approximate == "none" else tanh_approx, name="gelu")(x)


@register_lowering(aten.leaky_relu)
def leaky_relu(x: TensorBox, negative_slope: float = 0.01) -> TensorBox:
    return make_pointwise(
        lambda v, s: ops.where(ops.gt(v, ops.constant(0, x.get_dtype())), v, ops.mul(v, s)), name="leaky_relu"
    )(x, negative_slope)


@register_lowering(aten.elu)
def elu(x: TensorBox, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> TensorBox:
    def body(v: Any, a: Any, s: Any, i: Any) -> Any:
        neg = ops.mul(ops.mul(ops.expm1(ops.mul(v, i)), a), s)
        return ops.where(ops.gt(v, ops.constant(0, x.get_dtype())), ops.mul(v, s), neg)

    return make_pointwise(body, Promotion.INT_TO_FLOAT, name="elu")(x, alpha, scale, input_scale)


@register_lowering(aten._to_copy, prims.convert_element_type)
def to_copy(x: TensorBox, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    device = kwargs.get("device")
    if device is not None and torch.device(device) != x.get_device():
        raise Unsupported("device transfer")
    if kwargs.get("layout") not in (None, torch.strided):
        raise Unsupported("non-strided layout")
    if dtype is None or dtype == x.get_dtype():
        return clone(x)
    return to_dtype(x, dtype)


@register_lowering(aten.clone, aten.lift_fresh_copy)
def clone(x: TensorBox, memory_format: Any = None) -> TensorBox:
    loader = x.make_loader()
    size = list(x.get_size())
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        order = channels_last_order(len(size))
    elif memory_format == torch.contiguous_format:
        order = None
    else:
        order = layout_hint([x], size)
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), loader, size, origins=x.origins | {"clone"},
                                      stride_order=order))


@register_lowering(aten.nan_to_num)
def nan_to_num(x: TensorBox, nan: float | None = None, posinf: float | None = None, neginf: float | None = None) -> TensorBox:
    dt = x.get_dtype()
    if not dt.is_floating_point:
        return clone(x)
    info = torch.finfo(dt)
    nan_v = 0.0 if nan is None else nan
    pos_v = info.max if posinf is None else posinf
    neg_v = info.min if neginf is None else neginf

    def body(v: Any) -> Any:
        c = lambda val: ops.constant(val, torch.float32 if dt in (torch.float16, torch.bfloat16) else dt)
        v = ops.where(ops.isnan(v), c(nan_v), v)
        v = ops.where(ops.eq(v, c(math.inf)), c(pos_v), v)
        return ops.where(ops.eq(v, c(-math.inf)), c(neg_v), v)

    return make_pointwise(body, name="nan_to_num")(x)


@register_lowering("prims.fma.default")  # by name: defined only once torch._inductor is imported
def fma(a: Any, b: Any, c: Any) -> TensorBox:
    return make_pointwise(ops.fma, name="fma")(a, b, c)
