"""The C++ ops handler: every op of the vocabulary as a C++ expression, CSE'd into ``tmpN``.

Values are C++ variable names. Arithmetic results are cast back to the operand type so
``auto`` temporaries keep the dtype the lowering chose (C++ would widen int8 to int).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch

from minductor import config
from minductor.codegen.common import CPP_COMPUTE_TYPES, CPP_TYPES
from minductor.codegen.cpp_interior import record_comparison
from minductor.ir.indexing import index_symbol

Expr = sympy.Expr
# integer values whose arithmetic the kernel's index tests can follow exactly (narrower types wrap)
INDEX_DTYPES = (torch.int64, torch.int32)

# the prelude's per-element float math written out inline (``mi_<name>``, a polynomial or a
# rational of a dozen constants each): what the kernel rewrites look for in a loop body
INLINE_MATH = ("exp", "expm1", "log", "log1p", "log2", "tanh", "erf", "sigmoid", "pow")


def cpp_constant(value: bool | float, dtype: torch.dtype) -> str:
    ctype = CPP_COMPUTE_TYPES[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"static_cast<{ctype}>(MI_NAN)"
        if math.isinf(value):
            sign = "-" if value < 0 else ""
            return f"static_cast<{ctype}>({sign}MI_INF)"
        return f"static_cast<{ctype}>({value!r})"
    value = int(value)
    if value == -(2**63):
        return "static_cast<int64_t>(-9223372036854775807LL - 1)"
    return f"static_cast<{ctype}>({value}LL)"


def _t(x: str) -> str:
    return f"decltype({x})"


class CppOps:
    """Handler installed while a C++ kernel body runs. ``kernel`` owns buffers and CSE."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def _cse(self, expr: str) -> str:
        return self.kernel.cse.generate(self.kernel.body, expr)

    def _same(self, a: str, expr: str) -> str:
        return self._cse(f"static_cast<{_t(a)}>({expr})")

    # unary -------------------------------------------------------------------------------
    def abs(self, x: str) -> str:
        return self._cse(f"mi_abs({x})")

    def neg(self, x: str) -> str:
        return self._same(x, f"-{x}")

    def exp(self, x: str) -> str:
        return self._cse(f"mi_exp({x})")

    def exp2(self, x: str) -> str:
        return self._cse(f"mi_exp2({x})")

    def expm1(self, x: str) -> str:
        return self._cse(f"mi_expm1({x})")

    def log(self, x: str) -> str:
        return self._cse(f"mi_log({x})")

    def log2(self, x: str) -> str:
        return self._cse(f"mi_log2({x})")

    def log10(self, x: str) -> str:
        return self._cse(f"mi_log10({x})")

    def log1p(self, x: str) -> str:
        return self._cse(f"mi_log1p({x})")

    def sqrt(self, x: str) -> str:
        return self._cse(f"mi_c_sqrt({x})")

    def rsqrt(self, x: str) -> str:
        return self._cse(f"mi_rsqrt({x})")

    def sin(self, x: str) -> str:
        return self._cse(f"mi_sin({x})")

    def cos(self, x: str) -> str:
        return self._cse(f"mi_cos({x})")

    def tan(self, x: str) -> str:
        return self._cse(f"mi_tan({x})")

    def asin(self, x: str) -> str:
        return self._cse(f"mi_asin({x})")

    def acos(self, x: str) -> str:
        return self._cse(f"mi_acos({x})")

    def atan(self, x: str) -> str:
        return self._cse(f"mi_atan({x})")

    def sinh(self, x: str) -> str:
        return self._cse(f"mi_sinh({x})")

    def cosh(self, x: str) -> str:
        return self._cse(f"mi_cosh({x})")

    def tanh(self, x: str) -> str:
        return self._cse(f"mi_tanh({x})")

    def asinh(self, x: str) -> str:
        return self._cse(f"mi_asinh({x})")

    def acosh(self, x: str) -> str:
        return self._cse(f"mi_acosh({x})")

    def atanh(self, x: str) -> str:
        return self._cse(f"mi_atanh({x})")

    def erf(self, x: str) -> str:
        return self._cse(f"mi_erf({x})")

    def erfc(self, x: str) -> str:
        return self._cse(f"mi_erfc({x})")

    def erfinv(self, x: str) -> str:
        return self._cse(f"mi_erfinv({x})")

    def sigmoid(self, x: str) -> str:
        return self._cse(f"mi_sigmoid({x})")

    def relu(self, x: str) -> str:
        return self._cse(f"mi_relu({x})")

    def floor(self, x: str) -> str:
        return self._cse(f"mi_c_floor({x})")

    def ceil(self, x: str) -> str:
        return self._cse(f"mi_c_ceil({x})")

    def trunc(self, x: str) -> str:
        return self._cse(f"mi_c_trunc({x})")

    def round(self, x: str) -> str:
        return self._cse(f"mi_c_nearbyint({x})")

    def sign(self, x: str) -> str:
        return self._cse(f"mi_sign({x})")

    def reciprocal(self, x: str) -> str:
        return self._cse(f"mi_reciprocal({x})")

    def square(self, x: str) -> str:
        return self._same(x, f"{x} * {x}")

    def logical_not(self, x: str) -> str:
        return self._cse(f"!{x}")

    def bitwise_not(self, x: str) -> str:
        return self._same(x, f"~{x}")

    def isnan(self, x: str) -> str:
        return self._cse(f"mi_isnan({x})")

    def isinf(self, x: str) -> str:
        return self._cse(f"mi_isinf({x})")

    def signbit(self, x: str) -> str:
        return self._cse(f"mi_signbit({x})")

    def lgamma(self, x: str) -> str:
        return self._cse(f"mi_lgamma({x})")

    # binary ------------------------------------------------------------------------------
    def add(self, a: str, b: str) -> str:
        return self._index_arith(a, b, self._same(a, f"{a} + {b}"), lambda x, y: x + y)

    def sub(self, a: str, b: str) -> str:
        return self._index_arith(a, b, self._same(a, f"{a} - {b}"), lambda x, y: x - y)

    def mul(self, a: str, b: str) -> str:
        return self._index_arith(a, b, self._same(a, f"{a} * {b}"), lambda x, y: x * y)

    def _index_arith(self, a: str, b: str, var: str, fn: Callable[[Expr, Expr], Expr]) -> str:
        """Integer arithmetic on index values (arange's) stays an index value (cpp_interior)."""
        values = self.kernel.index_values
        if a in values and b in values:
            values[var] = sympy.expand(fn(values[a], values[b]))
        return var

    def truediv(self, a: str, b: str) -> str:
        # (a division by one value per row is lowered as a multiply by its reciprocal: lowering/pointwise.py)
        return self._same(a, f"{a} / {b}")

    def floordiv(self, a: str, b: str) -> str:
        self._check_divisor(a, b)
        return self._cse(f"mi_floordiv<{_t(a)}>({a}, {b})")

    def truncdiv(self, a: str, b: str) -> str:
        self._check_divisor(a, b)
        return self._cse(f"mi_truncdiv<{_t(a)}>({a}, {b})")

    def mod(self, a: str, b: str) -> str:
        self._check_divisor(a, b)
        return self._cse(f"mi_mod<{_t(a)}>({a}, {b})")

    def fmod(self, a: str, b: str) -> str:
        self._check_divisor(a, b)
        return self._cse(f"mi_fmod<{_t(a)}>({a}, {b})")

    def _check_divisor(self, a: str, b: str) -> None:
        """Integer division by zero raises ZeroDivisionError like eager (through the error flag);
        a nonzero constant divisor needs no check."""
        defining = next((e for e, v in self.kernel.cse.cache.items() if v == b), "")
        if re.fullmatch(r"static_cast<[\w:]+>\(-?\d+(\.\d*)?(LL)?\)", defining) and not re.search(r"\(-?0(\.0*)?(LL)?\)$", defining):
            return
        self.kernel.uses_error_flag = True
        self.kernel.body.writeline(f"mi_check_divisor<{_t(a)}>({b}, mi_bad);")

    def pow(self, a: str, b: str) -> str:
        return self._cse(f"mi_pow<{_t(a)}>({a}, {b})")

    def maximum(self, a: str, b: str) -> str:
        return self._cse(f"mi_maximum<{_t(a)}>({a}, {b})")

    def minimum(self, a: str, b: str) -> str:
        return self._cse(f"mi_minimum<{_t(a)}>({a}, {b})")

    def atan2(self, a: str, b: str) -> str:
        return self._cse(f"mi_atan2({a}, {b})")

    def hypot(self, a: str, b: str) -> str:
        return self._cse(f"mi_hypot({a}, {b})")

    def copysign(self, a: str, b: str) -> str:
        return self._cse(f"mi_c_copysign({a}, {b})")

    def nextafter(self, a: str, b: str) -> str:
        return self._cse(f"mi_c_nextafter({a}, {b})")

    def _compare(self, op: str, a: str, b: str, expr: str) -> str:
        var = self._cse(expr)
        record_comparison(self.kernel, var, op, a, b)
        return var

    def eq(self, a: str, b: str) -> str:
        return self._cse(f"{a} == {b}")

    def ne(self, a: str, b: str) -> str:
        return self._cse(f"{a} != {b}")

    def lt(self, a: str, b: str) -> str:
        return self._compare("lt", a, b, f"{a} < {b}")

    def le(self, a: str, b: str) -> str:
        return self._compare("le", a, b, f"{a} <= {b}")

    def gt(self, a: str, b: str) -> str:
        return self._compare("gt", a, b, f"{a} > {b}")

    def ge(self, a: str, b: str) -> str:
        return self._compare("ge", a, b, f"{a} >= {b}")

    def logical_and(self, a: str, b: str) -> str:
        return self._cse(f"{a} && {b}")

    def logical_or(self, a: str, b: str) -> str:
        return self._cse(f"{a} || {b}")

    def logical_xor(self, a: str, b: str) -> str:
        return self._cse(f"static_cast<bool>({a}) != static_cast<bool>({b})")

    def bitwise_and(self, a: str, b: str) -> str:
        return self._same(a, f"{a} & {b}")

    def bitwise_or(self, a: str, b: str) -> str:
        return self._same(a, f"{a} | {b}")

    def bitwise_xor(self, a: str, b: str) -> str:
        return self._same(a, f"{a} ^ {b}")

    def left_shift(self, a: str, b: str) -> str:
        return self._cse(f"mi_shl<{_t(a)}>({a}, {b})")

    def right_shift(self, a: str, b: str) -> str:
        return self._cse(f"mi_shr<{_t(a)}>({a}, {b})")

    def fma(self, a: str, b: str, c: str) -> str:
        return self._cse(f"mi_fma<{_t(a)}>({a}, {b}, {c})")

    def where(self, cond: str, a: str, b: str) -> str:
        return self._cse(f"{cond} ? {a} : static_cast<{_t(a)}>({b})")

    # memory and the rest -------------------------------------------------------------------
    def rand(self, seed: str, offset: str) -> str:
        return self._cse(f"mi_rand({seed}, {offset})")

    def randn(self, seed: str, offset: str) -> str:
        return self._cse(f"mi_randn({seed}, {offset})")

    def load(self, name: str, index: Expr) -> str:
        return self.kernel.load(name, index)

    def store(self, name: str, index: Expr, value: str, mode: str | None = None) -> None:
        self.kernel.store(name, index, value, self.kernel.body, mode)

    def store_reduction(self, name: str, index: Expr, value: str) -> None:
        self.kernel.store(name, index, value, self.kernel.suffix)

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> str:
        var = self._cse(f"static_cast<{CPP_COMPUTE_TYPES[dtype]}>({self.kernel.index_str(expr)})")
        if dtype in INDEX_DTYPES:
            self.kernel.index_values[var] = self.kernel.merged(expr)
        return var

    def indirect_indexing(self, x: str, size: Expr, check: bool = True, wrap: bool = True) -> Expr:
        size_str = self.kernel.index_str(size)
        var = self._cse(f"static_cast<int64_t>({x} < 0 ? {x} + {size_str} : {x})" if wrap else f"static_cast<int64_t>({x})")
        gather = self.kernel.varies_in_innermost_loop(var) and not self.kernel.scatters
        self.kernel.gathers |= gather
        self.kernel.indirect = True
        if check and config.bounds_check:
            # out of range: flag it for the wrapper to raise, and read a safe element instead
            self.kernel.uses_error_flag = True
            # no branch, so the loop still vectorizes (a branch on an index that is the same for the
            # whole inner loop, as an embedding row's, was left to the compiler to unswitch, which
            # it refused in a big loop body: a bilinear upsample's kernel ran scalar, 9.2 ms); an
            # index invariant in the inner loop stays invariant, so its row is read contiguously
            ok = self._cse(f"static_cast<uint64_t>({var}) < static_cast<uint64_t>({size_str})")  # one compare
            if self.kernel.masks and not gather:
                # under a mask, only where it holds: masked-off lanes compute indices of no element
                ok = self._cse(f"!({' && '.join(self.kernel.masks)}) || {ok}")
            self.kernel.body.writeline(f"mi_bad |= {ok} ? 0 : 1;")
            var = self._cse(f"{ok} ? {var} : static_cast<int64_t>(0)")
        self.kernel.indirect_sizes[var] = size
        return index_symbol(var)

    def constant(self, value: bool | float, dtype: torch.dtype) -> str:
        var = self._cse(cpp_constant(value, dtype))
        if dtype in INDEX_DTYPES and float(value).is_integer():
            self.kernel.index_values[var] = sympy.Integer(int(value))
        return var

    def to_dtype(self, x: str, dtype: torch.dtype) -> str:
        if dtype in (torch.float16, torch.bfloat16):
            # rounded to the 16-bit type, computed on as float; a store of it rounds the float
            # before (one conversion to the 16 bits instead of three: CppKernel.store)
            exact = f"mi_to_float<float>({x})"
            var = self._cse(f"{'mi_round_half' if dtype == torch.float16 else 'mi_round_bf16'}({exact})")
            self.kernel.rounded[var] = (dtype, exact)
            return var
        to_int = dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
        helper = "mi_to_int" if to_int else "mi_to_float" if dtype in (torch.float32, torch.float64) else "static_cast"
        var = self._cse(f"{helper}<{CPP_TYPES[dtype]}>({x})")
        if x in self.kernel.index_values and dtype in INDEX_DTYPES:
            self.kernel.index_values[var] = self.kernel.index_values[x]
        return var

    def masked(self, mask: str, body: Callable[[], Any], other: bool | float) -> str:
        return self.kernel.masked(mask, body, other)

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: str) -> Any:
        return self.kernel.reduction(dtype, src_dtype, reduction_type, value)


def store_combine(mode: str, current: str, value: str) -> str:
    """The value a combining store (scatter add/mul/max/min) writes over ``current``."""
    t = f"decltype({current})"
    return {
        "add": f"static_cast<{t}>({current} + {value})",
        "mul": f"static_cast<{t}>({current} * {value})",
        "max": f"mi_maximum<{t}>({current}, static_cast<{t}>({value}))",
        "min": f"mi_minimum<{t}>({current}, static_cast<{t}>({value}))",
    }[mode]


def reduction_code(rtype: str, ctype: str, acc: str, value: str, rindex: str) -> tuple[str, str, str, str]:
    """(accumulator type, init, update expression, combine format with {a} and {b}). Max/min
    update with ``mi_max_update``/``mi_min_update``, whose NaN test is off the accumulator's
    dependency chain: columns (x.amax(0) at 4096^2, kernels alone: 1.68-2.00 -> 1.42-1.74 ms
    on a Xeon) and short rows in cache (the masked row max of an attention softmax, 8 vectors
    a row: 228 -> 187 us on an AMD EPYC); a row amax streamed from memory is unchanged
    (1085 -> 1109 us, within the machine's noise)."""
    v = f"static_cast<{ctype}>({value})"
    if rtype == "sum":
        return ctype, f"static_cast<{ctype}>(0)", f"{acc} + {v}", "{a} + {b}"
    if rtype == "prod":
        return ctype, f"static_cast<{ctype}>(1)", f"{acc} * {v}", "{a} * {b}"
    if rtype == "max":
        return ctype, f"mi_lowest<{ctype}>()", f"mi_max_update<{ctype}>({acc}, {v})", f"mi_maximum<{ctype}>({{a}}, {{b}})"
    if rtype == "min":
        return ctype, f"mi_highest<{ctype}>()", f"mi_min_update<{ctype}>({acc}, {v})", f"mi_minimum<{ctype}>({{a}}, {{b}})"
    if rtype == "any":  # bytes and |: GCC 12 vectorized no loop over bool lanes, nor an ||
        return "uint8_t", "0", f"{acc} | static_cast<uint8_t>(static_cast<bool>({value}))", "{a} | {b}"
    if rtype in ("argmax", "argmin"):
        t = f"MiArg<{ctype}>"
        is_max = "true" if rtype == "argmax" else "false"
        return t, f"{t}{{mi_lowest<{ctype}>(), -1}}", f"mi_{rtype}_update<{ctype}>({acc}, {v}, {rindex})", f"mi_arg_combine<{ctype}, {is_max}>({{a}}, {{b}})"
    if rtype == "welford_reduce":
        t = f"MiWelford<{ctype}>"
        return t, f"{t}{{0, 0, 0}}", f"mi_welford_update<{ctype}>({acc}, {v})", f"mi_welford_combine<{ctype}>({{a}}, {{b}})"
    raise NotImplementedError(f"reduction type {rtype}")
