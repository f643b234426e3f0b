"""The Triton ops handler: every op of the vocabulary as a Triton expression, CSE'd into ``tmpN``.

Values are ``TV``: the variable name, plus the dtype it is computed in and the block axes it
varies along (``x``, ``r``); the kernel uses both to pick masks, casts and identities.
fp16/bf16 are computed in float32 (loads upcast, stores round).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sympy
import torch

Expr = sympy.Expr

TRITON_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class TV(str):
    """A Triton value: its variable name, compute dtype and the block axes it varies along."""

    dtype: torch.dtype
    dims: frozenset[str]

    def __new__(cls, name: str, dtype: torch.dtype, dims: frozenset[str] = frozenset()) -> TV:  # noqa: PYI034
        obj = super().__new__(cls, name)
        obj.dtype = dtype
        obj.dims = frozenset(dims)
        return obj


def triton_constant(value: bool | float, dtype: torch.dtype) -> str:
    """A Python literal Triton accepts, typed by ``tl.full``."""
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return f'float("{value}")'
        return repr(value)
    # wrap out-of-range integers as eager's cast does (1000 as int8 is -24)
    bits = torch.iinfo(dtype).bits
    value = int(value) % (1 << bits)
    if dtype != torch.uint8 and value >= 1 << (bits - 1):
        value -= 1 << bits
    return str(value)


def _dims(*values: Any) -> frozenset[str]:
    out: frozenset[str] = frozenset()
    for v in values:
        out |= getattr(v, "dims", frozenset())
    return out


class TritonOps:
    """Handler installed while a Triton kernel body runs. ``kernel`` owns buffers and CSE."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def _cse(self, expr: str, dtype: torch.dtype, *operands: Any) -> TV:
        return self.kernel.cse_value(expr, dtype, _dims(*operands))

    def _same(self, x: TV, expr: str, *operands: Any) -> TV:
        return self._cse(expr, x.dtype, x, *operands)

    def _float(self, x: TV, expr: str) -> TV:
        return self._cse(expr, x.dtype, x)

    def _lib(self, name: str, *args: TV) -> TV:
        return self._cse(f"libdevice.{name}({', '.join(args)})", args[0].dtype, *args)

    # unary -------------------------------------------------------------------------------
    def abs(self, x: TV) -> TV:
        return self._same(x, f"tl.abs({x})") if x.dtype != torch.bool else x

    def neg(self, x: TV) -> TV:
        return self._same(x, f"-{x}")

    def exp(self, x: TV) -> TV:
        return self._float(x, f"tl.exp({x})")

    def exp2(self, x: TV) -> TV:
        return self._float(x, f"tl.exp2({x})")

    def expm1(self, x: TV) -> TV:
        return self._lib("expm1", x)

    def log(self, x: TV) -> TV:
        return self._float(x, f"tl.log({x})")

    def log2(self, x: TV) -> TV:
        return self._float(x, f"tl.log2({x})")

    def log10(self, x: TV) -> TV:
        return self._lib("log10", x)

    def log1p(self, x: TV) -> TV:
        return self._lib("log1p", x)

    def sqrt(self, x: TV) -> TV:
        return self._float(x, f"tl.sqrt_rn({x})" if x.dtype == torch.float32 else f"tl.sqrt({x})")

    def rsqrt(self, x: TV) -> TV:
        return self._float(x, f"tl.rsqrt({x})")

    def sin(self, x: TV) -> TV:
        return self._float(x, f"tl.sin({x})")

    def cos(self, x: TV) -> TV:
        return self._float(x, f"tl.cos({x})")

    def tan(self, x: TV) -> TV:
        return self._lib("tan", x)

    def asin(self, x: TV) -> TV:
        return self._lib("asin", x)

    def acos(self, x: TV) -> TV:
        return self._lib("acos", x)

    def atan(self, x: TV) -> TV:
        return self._lib("atan", x)

    def sinh(self, x: TV) -> TV:
        return self._lib("sinh", x)

    def cosh(self, x: TV) -> TV:
        return self._lib("cosh", x)

    def tanh(self, x: TV) -> TV:
        return self._lib("tanh", x)

    def asinh(self, x: TV) -> TV:
        return self._lib("asinh", x)

    def acosh(self, x: TV) -> TV:
        return self._lib("acosh", x)

    def atanh(self, x: TV) -> TV:
        return self._lib("atanh", x)

    def erf(self, x: TV) -> TV:
        return self._float(x, f"tl.erf({x})")

    def erfc(self, x: TV) -> TV:
        return self._lib("erfc", x)

    def erfinv(self, x: TV) -> TV:
        return self._lib("erfinv", x)

    def sigmoid(self, x: TV) -> TV:
        return self._float(x, f"tl.sigmoid({x})")

    def relu(self, x: TV) -> TV:
        return self._same(x, f"tl.where({x} < 0, 0, {x})")

    def floor(self, x: TV) -> TV:
        return self._float(x, f"tl.floor({x})") if x.dtype.is_floating_point else x

    def ceil(self, x: TV) -> TV:
        return self._float(x, f"tl.ceil({x})") if x.dtype.is_floating_point else x

    def trunc(self, x: TV) -> TV:
        return self._lib("trunc", x) if x.dtype.is_floating_point else x

    def round(self, x: TV) -> TV:
        return self._lib("nearbyint", x) if x.dtype.is_floating_point else x

    def sign(self, x: TV) -> TV:
        t = TRITON_TYPES[x.dtype]
        return self._same(x, f"({x} > 0).to({t}) - ({x} < 0).to({t})")

    def reciprocal(self, x: TV) -> TV:
        return self._same(x, f"1.0 / {x}")

    def square(self, x: TV) -> TV:
        return self._same(x, f"{x} * {x}")

    def logical_not(self, x: TV) -> TV:
        return self._cse(f"{x} == 0", torch.bool, x)

    def bitwise_not(self, x: TV) -> TV:
        return self._same(x, f"~{x}")

    def isnan(self, x: TV) -> TV:
        return self._cse(f"{x} != {x}", torch.bool, x)

    def isinf(self, x: TV) -> TV:
        return self._cse(f'tl.abs({x}) == float("inf")', torch.bool, x)

    def signbit(self, x: TV) -> TV:
        if not x.dtype.is_floating_point:
            return self._cse(f"{x} < 0", torch.bool, x)
        return self._cse(f"libdevice.signbit({x}) != 0", torch.bool, x)

    def lgamma(self, x: TV) -> TV:
        return self._lib("lgamma", x)

    # binary ------------------------------------------------------------------------------
    def add(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} + {b}", b)

    def sub(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} - {b}", b)

    def mul(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} * {b}", b)

    def truediv(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} / {b}", b)

    def floordiv(self, a: TV, b: TV) -> TV:
        if a.dtype.is_floating_point:
            return self._same(a, f"floordiv_float({a}, {b})", b)
        return self._same(a, f"floordiv_int({a}, {b})", b)

    def truncdiv(self, a: TV, b: TV) -> TV:
        if a.dtype.is_floating_point:
            return self._same(a, f"libdevice.trunc({a} / {b})", b)
        return self._same(a, f"{a} // {b}", b)

    def mod(self, a: TV, b: TV) -> TV:
        if a.dtype.is_floating_point:
            r = self._same(a, f"libdevice.fmod({a}, {b})", b)
            return self._same(a, f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})", b)
        return self._same(a, f"mod_int({a}, {b})", b)

    def fmod(self, a: TV, b: TV) -> TV:
        if a.dtype.is_floating_point:
            return self._same(a, f"libdevice.fmod({a}, {b})", b)
        return self._same(a, f"{a} % {b}", b)

    def pow(self, a: TV, b: TV) -> TV:
        return self._same(a, f"libdevice.pow({a}, {b})", b)

    def maximum(self, a: TV, b: TV) -> TV:
        if a.dtype.is_floating_point:
            return self._same(a, f"maximum({a}, {b})", b)
        return self._same(a, f"tl.maximum({a}, {b})", b)

    def minimum(self, a: TV, b: TV) -> TV:
        if a.dtype.is_floating_point:
            return self._same(a, f"minimum({a}, {b})", b)
        return self._same(a, f"tl.minimum({a}, {b})", b)

    def atan2(self, a: TV, b: TV) -> TV:
        return self._lib("atan2", a, b)

    def hypot(self, a: TV, b: TV) -> TV:
        return self._lib("hypot", a, b)

    def copysign(self, a: TV, b: TV) -> TV:
        return self._lib("copysign", a, b)

    def nextafter(self, a: TV, b: TV) -> TV:
        return self._lib("nextafter", a, b)

    def _compare(self, op: str, a: TV, b: TV) -> TV:
        return self._cse(f"{a} {op} {b}", torch.bool, a, b)

    def eq(self, a: TV, b: TV) -> TV:
        return self._compare("==", a, b)

    def ne(self, a: TV, b: TV) -> TV:
        return self._compare("!=", a, b)

    def lt(self, a: TV, b: TV) -> TV:
        return self._compare("<", a, b)

    def le(self, a: TV, b: TV) -> TV:
        return self._compare("<=", a, b)

    def gt(self, a: TV, b: TV) -> TV:
        return self._compare(">", a, b)

    def ge(self, a: TV, b: TV) -> TV:
        return self._compare(">=", a, b)

    def logical_and(self, a: TV, b: TV) -> TV:
        return self._cse(f"({a} != 0) & ({b} != 0)", torch.bool, a, b)

    def logical_or(self, a: TV, b: TV) -> TV:
        return self._cse(f"({a} != 0) | ({b} != 0)", torch.bool, a, b)

    def logical_xor(self, a: TV, b: TV) -> TV:
        return self._cse(f"({a} != 0) ^ ({b} != 0)", torch.bool, a, b)

    def bitwise_and(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} & {b}", b)

    def bitwise_or(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} | {b}", b)

    def bitwise_xor(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} ^ {b}", b)

    def left_shift(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} << {b}", b)

    def right_shift(self, a: TV, b: TV) -> TV:
        return self._same(a, f"{a} >> {b}", b)

    def fma(self, a: TV, b: TV, c: TV) -> TV:
        if a.dtype.is_floating_point:
            return self._same(a, f"tl.fma({a}, {b}, {c})", b, c)
        return self._same(a, f"{a} * {b} + {c}", b, c)

    def where(self, cond: TV, a: TV, b: TV) -> TV:
        return self._cse(f"tl.where({cond}, {a}, {b})", a.dtype, cond, a, b)

    # random: Triton's Philox, keyed by the seed and the offset's high word, counting its low
    # word (other numbers than the C++ kernels' for one seed, as two devices' generators give)
    def rand(self, seed: TV, offset: TV) -> TV:
        return self._cse(f"tl.rand({seed} ^ ({offset} >> 32), ({offset} & 0xFFFFFFFF).to(tl.uint32))",
                         torch.float32, seed, offset)

    def randn(self, seed: TV, offset: TV) -> TV:
        return self._cse(f"tl.randn({seed} ^ ({offset} >> 32), ({offset} & 0xFFFFFFFF).to(tl.uint32))",
                         torch.float32, seed, offset)

    # memory and the rest -------------------------------------------------------------------
    def load(self, name: str, index: Expr) -> TV:
        return self.kernel.load(name, index)

    def store(self, name: str, index: Expr, value: TV, mode: str | None = None) -> None:
        self.kernel.store(name, index, value, mode)

    def store_reduction(self, name: str, index: Expr, value: TV) -> None:
        self.kernel.store(name, index, value, None, reduction=True)

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> TV:
        index, dims = self.kernel.index_str(expr)
        t = TRITON_TYPES[dtype]
        code = f"({index}).to({t})" if dims else f"tl.full([], {index}, {t})"
        return self.kernel.cse_value(code, compute_dtype(dtype), dims)

    def indirect_indexing(self, x: TV, size: Expr, check: bool = True, wrap: bool = True) -> Expr:
        return self.kernel.indirect_indexing(x, size, check, wrap)

    def constant(self, value: bool | float, dtype: torch.dtype) -> TV:
        dtype = compute_dtype(dtype)
        return self._cse(f"tl.full([], {triton_constant(value, dtype)}, {TRITON_TYPES[dtype]})", dtype)

    def to_dtype(self, x: TV, dtype: torch.dtype) -> TV:
        if dtype == torch.bfloat16:
            return self._cse(f"round_bf16({x}.to(tl.float32))", torch.float32, x)
        if dtype == torch.float16:
            # computed in float32, rounded as the narrow type would be
            return self._cse(f"{x}.to({TRITON_TYPES[dtype]}).to(tl.float32)", torch.float32, x)
        if dtype == x.dtype:
            return x
        if x.dtype.is_floating_point and dtype in (torch.int8, torch.uint8, torch.int16):
            # through int32, wrapping as eager does (a float to uint8 conversion of -3.7 is
            # undefined; eager gives 253)
            return self._cse(f"{x}.to(tl.int32).to({TRITON_TYPES[dtype]})", dtype, x)
        return self._cse(f"{x}.to({TRITON_TYPES[dtype]})", dtype, x)

    def masked(self, mask: TV, body: Callable[[], Any], other: bool | float) -> TV:
        return self.kernel.masked(mask, body, other)

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: TV) -> Any:
        return self.kernel.reduction(dtype, src_dtype, reduction_type, value)
