"""Interior loops: a pointwise loop whose body tests index bounds (the padding masks of a
pooling window, a pad, a shifted slice) runs its interior, where every such test holds,
with the tests replaced by ``true``.

The C++ compiler then folds the masked loads into plain ones: a stride-2 window read becomes
contiguous loads and shuffles instead of one gather per element (whole calls on an AMD EPYC,
8x64x128x128: max_pool2d 3x3/2 2.75 -> 1.70 ms, avg_pool2d 1.47 -> 0.89, a pad 2.14 -> 1.19).
Tests on the innermost variable cut its range into head, interior and tail; tests on outer
variables alone become one guard per outer iteration, with the plain loop in its else branch.

The kernel's ops handler records what the tests compare: ``index_values`` (a CSE name ->
its integer index expression or constant) and ``index_tests`` (a CSE name -> ``e >= 0``'s
``e``, every comparison of two recorded values normalized to that form).
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any

import sympy

from minductor.codegen.common import cpp_index
from minductor.codegen.loop_shapes import LINE
from minductor.ir.indexing import is_outer_var

Expr = sympy.Expr
MIN_SIZE = 16  # a shorter innermost loop keeps one loop: the split would cost more than it saves
MAX_PIECES = 8  # a loop cut into more pieces than this keeps its tests (code size)
MIN_PIECE = 16  # nor is it cut into pieces shorter than this


def record_comparison(kernel: Any, name: str, op: str, a: str, b: str) -> None:
    """Note ``name = a <op> b`` when both sides are recorded integer index values."""
    values = kernel.index_values
    if a not in values or b not in values:
        return
    diff = sympy.expand(values[a] - values[b])
    # over integers: a > b is a - b - 1 >= 0, a <= b is b - a >= 0, a < b is b - a - 1 >= 0
    normalized = {"ge": diff, "gt": diff - 1, "le": -diff, "lt": -diff - 1}.get(op)
    if normalized is not None:
        kernel.index_tests[name] = normalized


@dataclasses.dataclass
class Interior:
    guard: str  # C++ condition on outer variables ("" when none)
    lo: int  # the interior of the innermost variable: [lo, hi)
    hi: int
    lines: list[str]  # the body with the tests that hold there replaced by true


def interior(kernel: Any, var: sympy.Symbol, size: Expr, lines: list[str]) -> Interior | None:
    """The interior of the innermost loop over ``var`` in ``[0, size)`` (a static size of at
    least MIN_SIZE), or None when the body tests no bound that an interior could drop.

    Each test of one loop variable, ``a v + b >= 0``, cuts that variable's range where it
    changes value; the longest piece of the range, if at least half of it, is the interior
    along that variable, and there every such test is a constant: ``true``, or ``false``
    (a nested select, as functionalization makes of several slice assignments, tests both
    sides of a bound: a circular pad's borders are the copies where ``i < 3`` holds). Along
    ``var`` the interior is ``[lo, hi)``; along outer variables it is the guard."""
    if not size.is_Integer or int(size) < MIN_SIZE or not kernel.index_tests:
        return None
    tests, extents, others = _tests(kernel, var, size, lines)
    values, guards = _outer_tests(kernel, others)
    pieces: dict[sympy.Symbol, tuple[int, int]] = {}
    for v, on_v in tests.items():
        extent = extents[v]
        ends = _cuts(on_v, extent)
        lo, hi = max(itertools.pairwise(ends), key=lambda piece: piece[1] - piece[0])
        if hi - lo < max(extent // 2, 1):
            continue
        pieces[v] = (lo, hi)
        values.update({name: a * lo + b >= 0 for name, a, b in on_v})
    if not values:
        return None
    lo, hi = pieces.pop(var, (0, int(size)))
    guards += [g for v, (a, b) in pieces.items() for g in ([f"{v} >= {a}"] if a > 0 else []) +
               ([f"{v} < {b}"] if b < extents[v] else [])]
    return Interior(" && ".join(f"({g})" for g in guards), lo, hi, _fold(lines, values))


OUTER_TEST_POINTS = 4096  # a test of outer variables is tabulated over at most this many points
_INDEX_FUNCTIONS = {"FloorDiv": operator.floordiv, "ModularIndexing": lambda base, div, mod: base // div % mod,
                    "Min": min, "Max": max}


def _outer_tests(kernel: Any, others: list[tuple[str, Expr]]) -> tuple[dict[str, bool], list[str]]:
    """Tests of outer variables alone that are not affine in one (``_tests`` cuts ranges at
    those): a pooling window's row clamped and halved, ``min(15, (1 + h) // 2) - 1 >= 0`` in a
    max-pool backward. Each is folded to the value it takes at most points of its variables'
    static ranges, under a guard that it takes it; GCC 12 vectorized no loop that read through
    four windows' masked loads (a ResNet stem's pool backward, (4, 32, 32, 32): 1.62 ms)."""
    values: dict[str, bool] = {}
    guards: list[str] = []
    for name, expr in others:
        free = sorted(expr.free_symbols, key=str)
        extents = [kernel.range_of.get(v) for v in free]
        if not all(isinstance(e, sympy.Integer) for e in extents) or sympy.Mul(*extents) > OUTER_TEST_POINTS:
            continue
        # (evaluated as Python: 85 us a point through sympy, a 64x64 test took 350 ms)
        test = sympy.lambdify(free, expr, modules=[_INDEX_FUNCTIONS])
        holds = sum(test(*point) >= 0 for point in itertools.product(*(range(int(e)) for e in extents)))
        values[name] = 2 * holds >= int(sympy.Mul(*extents))
        guards.append(f"{cpp_index(expr)} {'>=' if values[name] else '<'} 0")
    return values, guards


def pieces(kernel: Any, var: sympy.Symbol, size: Expr, lines: list[str], align: int = 1) -> list[tuple[int, int, list[str]]] | None:
    """The innermost range ``[0, size)`` of ``var`` cut at every bound its tests change value
    at, each piece with those tests folded to constants; None unless that cuts it in 2 to
    MAX_PIECES pieces, every cut a multiple of ``align`` and every piece at least MIN_PIECE
    long. A concatenation along the innermost dim selects among its parts by such tests:
    Swin's patch merging layer-norms four images' channels, 48 each, side by side, and one
    loop computed all four parts (masked) at every element."""
    if not size.is_Integer or not kernel.index_tests:
        return None
    tests, _, _ = _tests(kernel, var, size, lines)
    on_var = tests.get(var)
    if not on_var:
        return None
    ends = _cuts(on_var, int(size))
    spans = list(itertools.pairwise(ends))
    if not 2 <= len(spans) <= MAX_PIECES or any(hi - lo < MIN_PIECE or lo % align for lo, hi in spans):
        return None
    return [(lo, hi, _fold(lines, {name: a * lo + b >= 0 for name, a, b in on_var})) for lo, hi in spans]


def diagonal_spans(kernel: Any, code: Any, var: sympy.Symbol, size: Expr, lines: list[str],
                   align: int) -> list[tuple[str, str, list[str]]] | None:
    """A reduction's lane loop over ``var`` cut where tests of ``var`` against an outer
    variable change value (a causal mask's ``j <= i``): the steps before the cut and after it
    run with those tests constant, the one step around the cut keeps them. Declares the cut
    (``mi_cut``, clamped to ``[0, mi_main)``) and its step's bounds in ``code``; returns the
    spans ``[lo, hi)`` of ``mi_base`` with their lines, or None (tests of ``var`` alone, several
    cut points, a coefficient of ``var`` other than +-1). In the masked part a causal softmax
    reads nothing and its exp is one loop-invariant value: the suite's transformer block's
    causal softmax over (8, 4, 128, 128), inside the whole call, one thread 406-411 -> 259-269
    us, two threads 204-206 -> 133-134."""
    if not size.is_Integer or int(size) < MIN_SIZE or not kernel.index_tests:
        return None
    defined = _defined(lines)
    cut: Expr | None = None
    before: dict[str, bool] = {}
    for name, expr in kernel.index_tests.items():
        if name not in defined or var not in expr.free_symbols:
            continue
        others = expr.free_symbols - {var}
        if len(others) != 1 or not is_outer_var(next(iter(others))) or not expr.is_polynomial(*expr.free_symbols):
            return None
        a = expr.coeff(var)
        rest = sympy.expand(expr - a * var)
        if a not in (1, -1) or rest.has(var) or not sympy.Poly(rest, *others).is_linear:
            return None
        # a = 1: v + rest >= 0 holds from v = -rest on; a = -1: up to v = rest, false from rest + 1
        at = -rest if a == 1 else rest + 1
        if cut is not None and sympy.expand(at - cut) != 0:
            return None
        cut, before[name] = at, a == -1
    if cut is None:
        return None
    code.writeline(f"const int64_t mi_cut = mi_min_i64(mi_max_i64({cpp_index(cut)}, 0), mi_main);  // tests change value here")
    code.writeline(f"const int64_t mi_cut0 = mi_cut / {align} * {align}, mi_cut1 = mi_min_i64(mi_cut0 + {align}, mi_main);")
    after = {name: not value for name, value in before.items()}
    return [("0", "mi_cut0", _fold(lines, before)), ("mi_cut0", "mi_cut1", lines), ("mi_cut1", "mi_main", _fold(lines, after))]


def _tests(kernel: Any, var: sympy.Symbol, size: Expr, lines: list[str]) -> tuple[
        dict[sympy.Symbol, list[tuple[str, int, int]]], dict[sympy.Symbol, int], list[tuple[str, Expr]]]:
    """The body's tests of one loop variable each, ``a v + b >= 0`` as (name, a, b) by
    variable, and each such variable's extent (``size`` for ``var``); and the other tests of
    outer variables alone, (name, expression) (``_outer_tests``)."""
    defined = _defined(lines)
    tests: dict[sympy.Symbol, list[tuple[str, int, int]]] = {}
    extents: dict[sympy.Symbol, int] = {}
    others: list[tuple[str, Expr]] = []
    for name, expr in kernel.index_tests.items():
        free = expr.free_symbols
        if name not in defined or not free:
            continue
        if len(free) == 1 and _affine_test(kernel, var, size, name, expr, tests, extents):
            continue
        if var not in free and all(is_outer_var(v) for v in free):
            others.append((name, expr))
    return tests, extents, others


def _affine_test(kernel: Any, var: sympy.Symbol, size: Expr, name: str, expr: Expr,
                 tests: dict[sympy.Symbol, list[tuple[str, int, int]]], extents: dict[sympy.Symbol, int]) -> bool:
    """Record ``expr >= 0`` in ``tests`` when it is ``a v + b`` of one loop variable of a
    static extent, integers ``a`` and ``b``; whether it was."""
    (v,) = expr.free_symbols
    if (v != var and not is_outer_var(v)) or not expr.is_polynomial(v):  # (a FloorDiv)
        return False
    coeffs = sympy.Poly(expr, v).all_coeffs()
    extent = size if v == var else kernel.range_of.get(v)
    if len(coeffs) != 2 or not all(c.is_Integer for c in coeffs) or not isinstance(extent, sympy.Integer):
        return False
    tests.setdefault(v, []).append((name, int(coeffs[0]), int(coeffs[1])))
    extents[v] = int(extent)
    return True


def _defined(lines: list[str]) -> set[str]:
    """The names ``lines`` define (``auto name = ...``): the tests a body holds."""
    return {line.split(" = ", 1)[0].removeprefix("auto ").strip() for line in lines if line.lstrip().startswith("auto ")}


def _cuts(on_v: list[tuple[str, int, int]], extent: int) -> list[int]:
    """The sorted bounds of ``[0, extent)`` where some test ``a v + b >= 0`` changes value."""
    # a > 0: true from ceil(-b / a) on; a < 0: true up to floor(b / -a)
    return sorted({0, extent} | {min(max(-(b // a) if a > 0 else b // -a + 1, 0), extent) for _, a, b in on_v})


def _fold(lines: list[str], values: dict[str, bool]) -> list[str]:
    """``lines`` with the tests named in ``values`` defined as those constants."""
    out = []
    for line in lines:
        stripped = line.lstrip()
        name = stripped.removeprefix("auto ").split(" = ", 1)[0] if stripped.startswith("auto ") else None
        if name in values:
            line = f"{line[: len(line) - len(stripped)]}auto {name} = {'true' if values[name] else 'false'};"
        out.append(line)
    return out


def emit_innermost(kernel: Any, code: Any, var: sympy.Symbol, lo: str, hi: str, length: Expr) -> None:
    """The innermost pointwise loop over ``var`` in ``[lo, hi)``: streamed, with batched math
    calls, or ``omp simd``; over a whole static dim whose body tests bounds, split around its
    interior (see the module docstring)."""
    # (imported here: cpp_calls imports cpp_ops, which records comparisons through this module)
    from minductor.codegen.cpp_calls import batchable_calls, emit_batched_loop
    from minductor.codegen.cpp_stream import emit_streamed_loop, simd_loop_hoisting, stream_store

    store = stream_store(kernel, var, length)

    def loop(begin: str, end: str, lines: list[str]) -> None:
        calls = batchable_calls(lines, kernel)
        # (a border piece shorter than a line stores plainly: a 3-d reflection pad's rows of 66,
        # one element either side of the interior, streamed in three pieces ran 7% slower)
        short = begin.isdigit() and end.isdigit() and int(end) - int(begin) < LINE
        if (store is None or short) and calls:
            emit_batched_loop(code, var, begin, end, lines, calls)
        elif store is None or short:
            simd_loop_hoisting(code, var, begin, end, lines)
        else:
            emit_streamed_loop(code, var, begin, end, lines, store, kernel.range_of, calls, kernel.body_loads)
            kernel.streamed = True

    body = kernel.body.lines
    whole = lo == "0" and hi == cpp_index(length)
    inner = interior(kernel, var, length, body) if whole else None
    if inner is None:
        for begin, end, lines in (pieces(kernel, var, length, body) if whole else None) or [(lo, hi, body)]:
            loop(str(begin), str(end), lines)
        return
    # head and tail outside the guard: with them inside both branches, GCC 12 compiled the
    # max-pool interior 2.4x slower
    if inner.lo > 0:
        loop("0", str(inner.lo), body)
    if inner.guard:
        code.writeline(f"if ({inner.guard})")
        with code.indent():
            loop(str(inner.lo), str(inner.hi), inner.lines)
        code.writeline("else")
        with code.indent():
            loop(str(inner.lo), str(inner.hi), body)
    else:
        loop(str(inner.lo), str(inner.hi), inner.lines)
    if inner.hi < int(length):
        loop(str(inner.hi), hi, body)
