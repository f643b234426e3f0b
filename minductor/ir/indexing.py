"""SymPy index math: integer division/modulo functions, simplification, affine analysis.

Index variables are non-negative integer symbols (``x0``, ``r0``...). Reshapes of
non-contiguous data produce ``FloorDiv``/``ModularIndexing``; ``simplify_index`` folds them
back to linear terms when variable ranges allow it, so contiguous code stays contiguous.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import sympy

Expr = sympy.Expr


class FloorDiv(sympy.Function):
    """Integer floor division of non-negative operands (the generated code divides towards
    zero: a rewrite must keep the base non-negative wherever the original one was)."""

    is_integer = True
    nargs = (2,)

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if divisor.is_Integer and base.is_Add:
            # pull out terms that are exact multiples of the divisor
            # (only while the rest stays non-negative: C++ and Triton divide towards zero, so a
            # flip's 8 - 2*x2 + x3 must not become 1 + (x3 - 2*x2) // 8)
            whole = [t for t in base.args if _divisible(t, divisor)]
            rest = sympy.Add(*[t for t in base.args if not _divisible(t, divisor)])
            if whole and (rest == 0 or rest.is_nonnegative):
                return sympy.Add(*[t / divisor for t in whole]) + FloorDiv(rest, divisor)
        if divisor.is_Integer and _divisible(base, divisor):
            return base / divisor
        return None

    def _eval_is_nonnegative(self):
        return True if self.args[0].is_nonnegative and self.args[1].is_positive else None


class ModularIndexing(sympy.Function):
    """``(base // divisor) % modulus`` for non-negative operands."""

    is_integer = True
    nargs = (3,)

    @classmethod
    def eval(cls, base, divisor, modulus):
        if base == 0 or modulus == 1:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if divisor != 1 and divisor.is_Integer and base.is_Add:
            whole = [t for t in base.args if _divisible(t, divisor)]
            if whole and len(whole) == len(base.args):
                return ModularIndexing(sympy.Add(*[t / divisor for t in whole]), 1, modulus)
        if base.is_Add and modulus.is_Integer:
            step = divisor * modulus
            kept = [t for t in base.args if not _divisible(t, step)]
            if len(kept) < len(base.args) and (not kept or sympy.Add(*kept).is_nonnegative):
                return ModularIndexing(sympy.Add(*kept), divisor, modulus)
        return None

    def _eval_is_nonnegative(self):
        return True


def _divisible(term: Expr, divisor: Expr) -> bool:
    if not divisor.is_Integer:
        return sympy.simplify(term / divisor).is_integer is True
    coeff, _ = term.as_coeff_Mul()
    return coeff.is_Integer and int(coeff) % int(divisor) == 0


@functools.lru_cache(maxsize=4096)
def index_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def make_vars(prefix: str, count: int, start: int = 0) -> list[sympy.Symbol]:
    return [index_symbol(f"{prefix}{i}") for i in range(start, start + count)]


def is_outer_var(sym: sympy.Symbol) -> bool:
    """Whether ``sym`` is a loop variable of the outer (pointwise) dims: ``x0``, ``x1``... in a
    node's canonical indices, ``xo0``, ``xi0``... in a kernel's (reduced dims: ``r0``...)."""
    return sym.name.startswith("x")


def upper_bound(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr | None:
    """A bound ``b`` with ``expr < b`` for affine ``expr`` in ranged vars (None if unknown)."""
    _, hi = value_range(expr, ranges)
    return None if hi is None else hi + 1


def value_range(
    expr: Expr, ranges: Mapping[sympy.Symbol, Expr]
) -> tuple[Expr | None, Expr | None]:
    """Inclusive (min, max) of an expression over ``0 <= v < ranges[v]``, if computable."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return expr, expr
    if isinstance(expr, sympy.Symbol):
        if expr in ranges:
            return sympy.Integer(0), ranges[expr] - 1
        return None, None
    if expr.is_Add:
        lo_sum, hi_sum = sympy.Integer(0), sympy.Integer(0)
        for term in expr.args:
            lo, hi = value_range(term, ranges)
            if lo is None or hi is None:
                return None, None
            lo_sum, hi_sum = lo_sum + lo, hi_sum + hi
        return lo_sum, hi_sum
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if coeff.is_Number and rest is not expr:
            lo, hi = value_range(rest, ranges)
            if lo is None or hi is None:
                return None, None
            return (coeff * lo, coeff * hi) if coeff >= 0 else (coeff * hi, coeff * lo)
        return None, None
    if isinstance(expr, FloorDiv):
        lo, hi = value_range(expr.args[0], ranges)
        d = expr.args[1]
        if lo is None or hi is None or not d.is_Integer or lo < 0:
            return None, None
        return FloorDiv(lo, d), FloorDiv(hi, d)
    if isinstance(expr, (sympy.Min, sympy.Max)):
        bounds = [value_range(a, ranges) for a in expr.args]
        if any(lo is None or hi is None for lo, hi in bounds):
            return None, None
        pick = min if isinstance(expr, sympy.Min) else max
        return pick(lo for lo, _ in bounds), pick(hi for _, hi in bounds)
    if isinstance(expr, ModularIndexing):
        lo, hi = value_range(expr.args[0], ranges)
        if lo is not None and lo >= 0 and expr.args[2].is_Integer:
            return sympy.Integer(0), expr.args[2] - 1
        return None, None
    return None, None


def simplify_index(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr:
    """Fold FloorDiv/ModularIndexing using variable ranges and recombine split variables."""
    expr = sympy.sympify(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr

    def fold(e: Expr) -> Expr:
        if isinstance(e, ModularIndexing):
            base, div, mod = (fold(a) for a in e.args)
            lo, hi = value_range(base, ranges)
            if lo is not None and hi is not None and lo >= 0 and (hi < div * mod) is sympy.true:
                return fold(FloorDiv(base, div))
            return ModularIndexing(base, div, mod)
        if isinstance(e, FloorDiv):
            base, div = (fold(a) for a in e.args)
            lo, hi = value_range(base, ranges)
            if lo is not None and hi is not None and lo >= 0 and (hi < div) is sympy.true:
                return sympy.Integer(0)
            return FloorDiv(base, div)
        if e.args:
            return e.func(*[fold(a) for a in e.args])
        return e

    for _ in range(4):
        new = _recombine(fold(expr))
        if new == expr:
            break
        expr = new
    return expr


def _recombine(expr: Expr) -> Expr:
    """``c*m*FloorDiv(x, d*m) + c*ModularIndexing(x, d, m)`` -> ``c*FloorDiv(x, d)``."""
    changed = True
    while changed and expr.is_Add:
        changed = False
        terms = list(expr.args)
        for i, t in enumerate(terms):
            # the coefficient may be symbolic (a stride of s0*64 under dynamic shapes)
            mi = next((f for f in sympy.Mul.make_args(t) if isinstance(f, ModularIndexing)), None)
            if mi is None:
                continue
            coeff = t / mi
            base, div, mod = mi.args
            partner = coeff * mod * FloorDiv(base, div * mod)
            for j, u in enumerate(terms):
                if j != i and sympy.expand(u - partner) == 0:
                    rest = [w for k, w in enumerate(terms) if k not in (i, j)]
                    expr = sympy.Add(*rest) + coeff * FloorDiv(base, div)
                    changed = True
                    break
            if changed:
                break
    return expr


def affine_coeffs(expr: Expr, variables: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, Expr] | None:
    """Coefficients of ``variables`` if ``expr`` is affine in them, else None."""
    coeffs = _affine_coeffs(expr, tuple(variables))
    return None if coeffs is None else dict(coeffs)


@functools.lru_cache(maxsize=65536)
def _affine_coeffs(expr: Expr, variables: tuple[sympy.Symbol, ...]) -> dict[sympy.Symbol, Expr] | None:
    """(Memoized: the kernels of a model's layers ask about the same indices over and over,
    and SymPy's expand and coeff took 1.5 of GPT-2's 11 s of lowering, scheduling and codegen.)"""
    expr = sympy.expand(expr)
    out = {}
    rest = expr
    for v in variables:
        c = expr.coeff(v, 1)
        if c.has(*variables):
            return None
        out[v] = c
        rest = rest - c * v
    if sympy.expand(rest).has(*variables):
        return None
    return out


def stride_of(expr: Expr, var: sympy.Symbol) -> Expr | None:
    coeffs = affine_coeffs(expr, [var])
    return None if coeffs is None else coeffs[var]
