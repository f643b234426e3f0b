"""The closed op vocabulary of the loop IR.

IR bodies (``inner_fn(index)``) are written against the ``ops`` object below. It forwards
each call to the handler installed in ``V.ops``; swapping that handler re-interprets the
same body: recording memory dependencies, pretty-printing, or emitting C++.

Values flowing between ops are opaque to the body (strings for codegen, tokens for the
recorder). Ops never promote types: lowerings insert ``to_dtype`` so that binary operands
already agree. Every op is spelled out so it can be
found by grep; ``tests/test_ops_protocol.py`` checks that each handler implements all of them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from minductor.virtualized import V

UNARY = frozenset({"abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sigmoid", "relu", "floor", "ceil", "trunc", "round", "sign", "reciprocal", "square", "logical_not", "bitwise_not", "isnan", "isinf", "signbit", "lgamma"})
BINARY = frozenset({"add", "sub", "mul", "truediv", "floordiv", "truncdiv", "mod", "fmod", "pow", "maximum", "minimum", "atan2", "hypot", "copysign", "nextafter", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"})
TERNARY = frozenset({"where", "fma"})
MEMORY = frozenset({"load", "store", "store_reduction", "index_expr", "indirect_indexing"})
OTHER = frozenset({"constant", "to_dtype", "masked", "reduction"})
# float32 element ``offset`` (int64) of the counter-based stream keyed by ``seed`` (int64):
# uniform in [0, 1), or standard normal
RANDOM = frozenset({"rand", "randn"})
ALL_OPS = UNARY | BINARY | TERNARY | MEMORY | OTHER | RANDOM

# ops costing tens of simple ones (a polynomial and range reduction each): a value computing
# one is stored once rather than recomputed by each of several readers
TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
                            "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
                            "erfinv", "sigmoid", "lgamma", "pow", "atan2", "rand", "randn"})

# combining stores of scatter-like ops; kernels holding one run serially (deterministic)
STORE_MODES = frozenset({"add", "mul", "max", "min"})

REDUCTION_TYPES = frozenset(
    {"sum", "prod", "max", "min", "argmax", "argmin", "any", "welford_reduce"}
)



class Ops:
    """Front end of the vocabulary: ``ops.add(a, b)`` calls ``V.ops.add(a, b)``."""

    def abs(self, x: Any) -> Any:
        return V.ops.abs(x)

    def neg(self, x: Any) -> Any:
        return V.ops.neg(x)

    def exp(self, x: Any) -> Any:
        return V.ops.exp(x)

    def exp2(self, x: Any) -> Any:
        return V.ops.exp2(x)

    def expm1(self, x: Any) -> Any:
        return V.ops.expm1(x)

    def log(self, x: Any) -> Any:
        return V.ops.log(x)

    def log2(self, x: Any) -> Any:
        return V.ops.log2(x)

    def log10(self, x: Any) -> Any:
        return V.ops.log10(x)

    def log1p(self, x: Any) -> Any:
        return V.ops.log1p(x)

    def sqrt(self, x: Any) -> Any:
        return V.ops.sqrt(x)

    def rsqrt(self, x: Any) -> Any:
        return V.ops.rsqrt(x)

    def sin(self, x: Any) -> Any:
        return V.ops.sin(x)

    def cos(self, x: Any) -> Any:
        return V.ops.cos(x)

    def tan(self, x: Any) -> Any:
        return V.ops.tan(x)

    def asin(self, x: Any) -> Any:
        return V.ops.asin(x)

    def acos(self, x: Any) -> Any:
        return V.ops.acos(x)

    def atan(self, x: Any) -> Any:
        return V.ops.atan(x)

    def sinh(self, x: Any) -> Any:
        return V.ops.sinh(x)

    def cosh(self, x: Any) -> Any:
        return V.ops.cosh(x)

    def tanh(self, x: Any) -> Any:
        return V.ops.tanh(x)

    def asinh(self, x: Any) -> Any:
        return V.ops.asinh(x)

    def acosh(self, x: Any) -> Any:
        return V.ops.acosh(x)

    def atanh(self, x: Any) -> Any:
        return V.ops.atanh(x)

    def erf(self, x: Any) -> Any:
        return V.ops.erf(x)

    def erfc(self, x: Any) -> Any:
        return V.ops.erfc(x)

    def erfinv(self, x: Any) -> Any:
        return V.ops.erfinv(x)

    def sigmoid(self, x: Any) -> Any:
        return V.ops.sigmoid(x)

    def relu(self, x: Any) -> Any:
        return V.ops.relu(x)

    def floor(self, x: Any) -> Any:
        return V.ops.floor(x)

    def ceil(self, x: Any) -> Any:
        return V.ops.ceil(x)

    def trunc(self, x: Any) -> Any:
        return V.ops.trunc(x)

    def round(self, x: Any) -> Any:
        return V.ops.round(x)

    def sign(self, x: Any) -> Any:
        return V.ops.sign(x)

    def reciprocal(self, x: Any) -> Any:
        return V.ops.reciprocal(x)

    def square(self, x: Any) -> Any:
        return V.ops.square(x)

    def logical_not(self, x: Any) -> Any:
        return V.ops.logical_not(x)

    def bitwise_not(self, x: Any) -> Any:
        return V.ops.bitwise_not(x)

    def isnan(self, x: Any) -> Any:
        return V.ops.isnan(x)

    def isinf(self, x: Any) -> Any:
        return V.ops.isinf(x)

    def signbit(self, x: Any) -> Any:
        return V.ops.signbit(x)

    def lgamma(self, x: Any) -> Any:
        return V.ops.lgamma(x)

    def add(self, a: Any, b: Any) -> Any:
        return V.ops.add(a, b)

    def sub(self, a: Any, b: Any) -> Any:
        return V.ops.sub(a, b)

    def mul(self, a: Any, b: Any) -> Any:
        return V.ops.mul(a, b)

    def truediv(self, a: Any, b: Any) -> Any:
        return V.ops.truediv(a, b)

    def floordiv(self, a: Any, b: Any) -> Any:
        return V.ops.floordiv(a, b)

    def truncdiv(self, a: Any, b: Any) -> Any:
        return V.ops.truncdiv(a, b)

    def mod(self, a: Any, b: Any) -> Any:
        return V.ops.mod(a, b)

    def fmod(self, a: Any, b: Any) -> Any:
        return V.ops.fmod(a, b)

    def pow(self, a: Any, b: Any) -> Any:
        return V.ops.pow(a, b)

    def maximum(self, a: Any, b: Any) -> Any:
        return V.ops.maximum(a, b)

    def minimum(self, a: Any, b: Any) -> Any:
        return V.ops.minimum(a, b)

    def atan2(self, a: Any, b: Any) -> Any:
        return V.ops.atan2(a, b)

    def hypot(self, a: Any, b: Any) -> Any:
        return V.ops.hypot(a, b)

    def copysign(self, a: Any, b: Any) -> Any:
        return V.ops.copysign(a, b)

    def nextafter(self, a: Any, b: Any) -> Any:
        return V.ops.nextafter(a, b)

    def eq(self, a: Any, b: Any) -> Any:
        return V.ops.eq(a, b)

    def ne(self, a: Any, b: Any) -> Any:
        return V.ops.ne(a, b)

    def lt(self, a: Any, b: Any) -> Any:
        return V.ops.lt(a, b)

    def le(self, a: Any, b: Any) -> Any:
        return V.ops.le(a, b)

    def gt(self, a: Any, b: Any) -> Any:
        return V.ops.gt(a, b)

    def ge(self, a: Any, b: Any) -> Any:
        return V.ops.ge(a, b)

    def logical_and(self, a: Any, b: Any) -> Any:
        return V.ops.logical_and(a, b)

    def logical_or(self, a: Any, b: Any) -> Any:
        return V.ops.logical_or(a, b)

    def logical_xor(self, a: Any, b: Any) -> Any:
        return V.ops.logical_xor(a, b)

    def bitwise_and(self, a: Any, b: Any) -> Any:
        return V.ops.bitwise_and(a, b)

    def bitwise_or(self, a: Any, b: Any) -> Any:
        return V.ops.bitwise_or(a, b)

    def bitwise_xor(self, a: Any, b: Any) -> Any:
        return V.ops.bitwise_xor(a, b)

    def left_shift(self, a: Any, b: Any) -> Any:
        return V.ops.left_shift(a, b)

    def right_shift(self, a: Any, b: Any) -> Any:
        return V.ops.right_shift(a, b)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return V.ops.where(cond, a, b)

    def fma(self, a: Any, b: Any, c: Any) -> Any:
        """``a * b + c`` with one rounding."""
        return V.ops.fma(a, b, c)

    def rand(self, seed: Any, offset: Any) -> Any:
        """Element ``offset`` of the uniform [0, 1) float32 stream keyed by ``seed`` (both int64)."""
        return V.ops.rand(seed, offset)

    def randn(self, seed: Any, offset: Any) -> Any:
        """Element ``offset`` of the standard normal float32 stream keyed by ``seed``."""
        return V.ops.randn(seed, offset)

    def load(self, name: str, index: sympy.Expr) -> Any:
        """Read buffer ``name`` at flat ``index``; fp16/bf16 read as float32."""
        return V.ops.load(name, index)

    def store(self, name: str, index: sympy.Expr, value: Any, mode: str | None = None) -> Any:
        """Write ``value``; ``mode`` in STORE_MODES combines with what is there (scatter)."""
        return V.ops.store(name, index, value, mode)

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> Any:
        return V.ops.store_reduction(name, index, value)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Any:
        """The value of an index expression, as a scalar of ``dtype``."""
        return V.ops.index_expr(expr, dtype)

    def indirect_indexing(self, x: Any, size: sympy.Expr, check: bool = True, wrap: bool = True) -> sympy.Expr:
        """Turn a loaded integer value into a symbol usable inside index expressions. ``wrap``:
        a negative value counts from the end (indexing); without it, a negative value is out of
        range (gather, index_select and embedding reject it)."""
        return V.ops.indirect_indexing(x, size, check, wrap)

    def constant(self, value: bool | float, dtype: torch.dtype) -> Any:
        return V.ops.constant(value, dtype)

    def to_dtype(self, x: Any, dtype: torch.dtype) -> Any:
        return V.ops.to_dtype(x, dtype)

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> Any:
        """``body()`` where ``mask`` holds, else ``other``; loads in body are guarded."""
        return V.ops.masked(mask, body, other)

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> Any:
        """Combine ``value`` over the reduction loop; welford_reduce yields (mean, m2, weight)."""
        return V.ops.reduction(dtype, src_dtype, reduction_type, value)


ops = Ops()


class DefaultHandler:
    """A handler whose every op calls ``self._default(name, args)``; subclasses override."""

    def _default(self, name: str, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement ops.{name}")

    def abs(self, x: Any) -> Any:
        return self._default("abs", (x,))

    def neg(self, x: Any) -> Any:
        return self._default("neg", (x,))

    def exp(self, x: Any) -> Any:
        return self._default("exp", (x,))

    def exp2(self, x: Any) -> Any:
        return self._default("exp2", (x,))

    def expm1(self, x: Any) -> Any:
        return self._default("expm1", (x,))

    def log(self, x: Any) -> Any:
        return self._default("log", (x,))

    def log2(self, x: Any) -> Any:
        return self._default("log2", (x,))

    def log10(self, x: Any) -> Any:
        return self._default("log10", (x,))

    def log1p(self, x: Any) -> Any:
        return self._default("log1p", (x,))

    def sqrt(self, x: Any) -> Any:
        return self._default("sqrt", (x,))

    def rsqrt(self, x: Any) -> Any:
        return self._default("rsqrt", (x,))

    def sin(self, x: Any) -> Any:
        return self._default("sin", (x,))

    def cos(self, x: Any) -> Any:
        return self._default("cos", (x,))

    def tan(self, x: Any) -> Any:
        return self._default("tan", (x,))

    def asin(self, x: Any) -> Any:
        return self._default("asin", (x,))

    def acos(self, x: Any) -> Any:
        return self._default("acos", (x,))

    def atan(self, x: Any) -> Any:
        return self._default("atan", (x,))

    def sinh(self, x: Any) -> Any:
        return self._default("sinh", (x,))

    def cosh(self, x: Any) -> Any:
        return self._default("cosh", (x,))

    def tanh(self, x: Any) -> Any:
        return self._default("tanh", (x,))

    def asinh(self, x: Any) -> Any:
        return self._default("asinh", (x,))

    def acosh(self, x: Any) -> Any:
        return self._default("acosh", (x,))

    def atanh(self, x: Any) -> Any:
        return self._default("atanh", (x,))

    def erf(self, x: Any) -> Any:
        return self._default("erf", (x,))

    def erfc(self, x: Any) -> Any:
        return self._default("erfc", (x,))

    def erfinv(self, x: Any) -> Any:
        return self._default("erfinv", (x,))

    def sigmoid(self, x: Any) -> Any:
        return self._default("sigmoid", (x,))

    def relu(self, x: Any) -> Any:
        return self._default("relu", (x,))

    def floor(self, x: Any) -> Any:
        return self._default("floor", (x,))

    def ceil(self, x: Any) -> Any:
        return self._default("ceil", (x,))

    def trunc(self, x: Any) -> Any:
        return self._default("trunc", (x,))

    def round(self, x: Any) -> Any:
        return self._default("round", (x,))

    def sign(self, x: Any) -> Any:
        return self._default("sign", (x,))

    def reciprocal(self, x: Any) -> Any:
        return self._default("reciprocal", (x,))

    def square(self, x: Any) -> Any:
        return self._default("square", (x,))

    def logical_not(self, x: Any) -> Any:
        return self._default("logical_not", (x,))

    def bitwise_not(self, x: Any) -> Any:
        return self._default("bitwise_not", (x,))

    def isnan(self, x: Any) -> Any:
        return self._default("isnan", (x,))

    def isinf(self, x: Any) -> Any:
        return self._default("isinf", (x,))

    def signbit(self, x: Any) -> Any:
        return self._default("signbit", (x,))

    def lgamma(self, x: Any) -> Any:
        return self._default("lgamma", (x,))

    def add(self, a: Any, b: Any) -> Any:
        return self._default("add", (a, b))

    def sub(self, a: Any, b: Any) -> Any:
        return self._default("sub", (a, b))

    def mul(self, a: Any, b: Any) -> Any:
        return self._default("mul", (a, b))

    def truediv(self, a: Any, b: Any) -> Any:
        return self._default("truediv", (a, b))

    def floordiv(self, a: Any, b: Any) -> Any:
        return self._default("floordiv", (a, b))

    def truncdiv(self, a: Any, b: Any) -> Any:
        return self._default("truncdiv", (a, b))

    def mod(self, a: Any, b: Any) -> Any:
        return self._default("mod", (a, b))

    def fmod(self, a: Any, b: Any) -> Any:
        return self._default("fmod", (a, b))

    def pow(self, a: Any, b: Any) -> Any:
        return self._default("pow", (a, b))

    def maximum(self, a: Any, b: Any) -> Any:
        return self._default("maximum", (a, b))

    def minimum(self, a: Any, b: Any) -> Any:
        return self._default("minimum", (a, b))

    def atan2(self, a: Any, b: Any) -> Any:
        return self._default("atan2", (a, b))

    def hypot(self, a: Any, b: Any) -> Any:
        return self._default("hypot", (a, b))

    def copysign(self, a: Any, b: Any) -> Any:
        return self._default("copysign", (a, b))

    def nextafter(self, a: Any, b: Any) -> Any:
        return self._default("nextafter", (a, b))

    def eq(self, a: Any, b: Any) -> Any:
        return self._default("eq", (a, b))

    def ne(self, a: Any, b: Any) -> Any:
        return self._default("ne", (a, b))

    def lt(self, a: Any, b: Any) -> Any:
        return self._default("lt", (a, b))

    def le(self, a: Any, b: Any) -> Any:
        return self._default("le", (a, b))

    def gt(self, a: Any, b: Any) -> Any:
        return self._default("gt", (a, b))

    def ge(self, a: Any, b: Any) -> Any:
        return self._default("ge", (a, b))

    def logical_and(self, a: Any, b: Any) -> Any:
        return self._default("logical_and", (a, b))

    def logical_or(self, a: Any, b: Any) -> Any:
        return self._default("logical_or", (a, b))

    def logical_xor(self, a: Any, b: Any) -> Any:
        return self._default("logical_xor", (a, b))

    def bitwise_and(self, a: Any, b: Any) -> Any:
        return self._default("bitwise_and", (a, b))

    def bitwise_or(self, a: Any, b: Any) -> Any:
        return self._default("bitwise_or", (a, b))

    def bitwise_xor(self, a: Any, b: Any) -> Any:
        return self._default("bitwise_xor", (a, b))

    def left_shift(self, a: Any, b: Any) -> Any:
        return self._default("left_shift", (a, b))

    def right_shift(self, a: Any, b: Any) -> Any:
        return self._default("right_shift", (a, b))

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self._default("where", (cond, a, b))

    def fma(self, a: Any, b: Any, c: Any) -> Any:
        return self._default("fma", (a, b, c))

    def rand(self, seed: Any, offset: Any) -> Any:
        return self._default("rand", (seed, offset))

    def randn(self, seed: Any, offset: Any) -> Any:
        return self._default("randn", (seed, offset))

    def load(self, name: str, index: sympy.Expr) -> Any:
        return self._default("load", (name, index))

    def store(self, name: str, index: sympy.Expr, value: Any, mode: str | None = None) -> Any:
        return self._default("store", (name, index, value, mode))

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> Any:
        return self._default("store_reduction", (name, index, value))

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Any:
        return self._default("index_expr", (expr, dtype))

    def indirect_indexing(self, x: Any, size: sympy.Expr, check: bool = True, wrap: bool = True) -> sympy.Expr:
        return self._default("indirect_indexing", (x, size, check, wrap))

    def constant(self, value: bool | float, dtype: torch.dtype) -> Any:
        return self._default("constant", (value, dtype))

    def to_dtype(self, x: Any, dtype: torch.dtype) -> Any:
        return self._default("to_dtype", (x, dtype))

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> Any:
        return self._default("masked", (mask, body, other))

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> Any:
        return self._default("reduction", (dtype, src_dtype, reduction_type, value))
