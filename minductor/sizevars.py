"""Symbolic sizes: Dynamo's SymInts as SymPy expressions, and hints for heuristics.

Sizes Dynamo marks dynamic arrive as ``SymInt``s whose ``node.expr`` is a SymPy expression
over positive integer symbols (``s0``...). minductor keeps them symbolic end to end.
Heuristics (parallelism, tiling) read a *hint* -- the value seen when compiling -- and
never add guards: every such decision has a path that is correct for any size.
"""
from __future__ import annotations

import re
from typing import Any

import sympy
import torch

from minductor.ir.indexing import FloorDiv, index_symbol

SIZE_SYMBOL = re.compile(r"^[su]\d+$")
# symbols a kernel takes as int64 arguments: Dynamo's sizes, and graph inputs' storage offsets
# where as_strided counts from them (graph.input_storage_offset)
KERNEL_SYMBOL = re.compile(r"\b(?:[su]\d+|mi_offset_\w+)\b")


def kernel_symbols(text: str) -> list[str]:
    """The symbols a kernel's source names, in a stable order (its size arguments)."""
    return sorted(set(KERNEL_SYMBOL.findall(text)),
                  key=lambda s: (0, s[0], int(s[1:])) if SIZE_SYMBOL.match(s) else (1, s, 0))


def to_expr(value: Any) -> sympy.Expr:
    """int / SymInt / SymPy -> SymPy expression (with minductor's index functions)."""
    if isinstance(value, torch.SymInt):
        return from_torch_sympy(sympy.sympify(value.node.expr))
    if isinstance(value, (int, sympy.Expr)):
        return sympy.sympify(value)
    raise TypeError(f"not a size: {value!r}")


def from_torch_sympy(expr: sympy.Expr) -> sympy.Expr:
    """Replace torch's SymPy functions (FloorDiv, Max, ...) by minductor's equivalents."""
    from minductor.ir.indexing import ModularIndexing

    if not expr.args:
        return expr
    args = [from_torch_sympy(a) for a in expr.args]
    name = type(expr).__name__
    table = {"FloorDiv": FloorDiv, "ModularIndexing": ModularIndexing, "Max": sympy.Max, "Min": sympy.Min}
    if name in table and type(expr).__module__ != sympy.Max.__module__ and not isinstance(expr, (FloorDiv, ModularIndexing)):
        return table[name](*args)
    if name in ("CeilDiv", "CleanDiv", "IntTrueDiv") and len(args) == 2:
        return FloorDiv(args[0] + args[1] - 1, args[1]) if name == "CeilDiv" else FloorDiv(args[0], args[1])
    if name in ("PythonMod", "Mod") and len(args) == 2:
        return ModularIndexing(args[0], 1, args[1])
    # float arithmetic on sizes (interpolate's floor(size * scale)): exact, as rationals
    if name == "ToFloat" and len(args) == 1:
        return args[0]
    if name == "FloatTrueDiv" and len(args) == 2:
        return args[0] / args[1]
    if name in ("TruncToInt", "FloorToInt", "CeilToInt") and len(args) == 1:
        # sizes are non-negative, so truncation is the floor
        return round_exactly(args[0], up=name == "CeilToInt")
    return expr.func(*args)


def round_exactly(value: sympy.Expr, up: bool) -> sympy.Expr:
    """The floor (ceiling if ``up``) of ``value``, an expression of integer symbols and
    constants, as an integer expression: its floats read as the decimals they print as
    (``3.1`` as ``31/10``), so the division is exact and rounds once, in one FloorDiv."""
    exact = value.xreplace({f: sympy.nsimplify(f, rational=True) for f in value.atoms(sympy.Float)})
    numerator, denominator = sympy.fraction(sympy.together(exact))
    if denominator == 1:
        return numerator
    return FloorDiv(numerator + denominator - 1 if up else numerator, denominator)


def is_size_symbol(sym: sympy.Symbol) -> bool:
    return bool(SIZE_SYMBOL.match(sym.name))


def size_symbols(expr: Any) -> set[sympy.Symbol]:
    expr = sympy.sympify(expr)
    return {s for s in expr.free_symbols if is_size_symbol(s)}


class SizeVars:
    """Hints for symbolic sizes, from the ShapeEnv of the graph's fake inputs."""

    def __init__(self, example_inputs: Any) -> None:
        self.var_to_val: dict[sympy.Symbol, sympy.Integer] = {}
        self.lower: dict[sympy.Symbol, int] = {}  # each size symbol's lower bound (Dynamo: 2 once 0 and 1 specialize)
        # symbols that may be negative: integer arguments made dynamic (a roll's shift), not sizes
        self.signed: set[sympy.Symbol] = set()
        self.shape_env: Any = None
        for x in example_inputs:
            env = _shape_env(x)
            if env is not None:
                self.shape_env = env
                values = getattr(env, "backed_var_to_val", None)
                values = env.var_to_val if values is None else values
                self.var_to_val = {k: sympy.Integer(int(v)) for k, v in values.items()}
                for k, r in getattr(env, "var_to_range", {}).items():
                    if not sympy.sympify(r.lower).is_nonnegative:
                        self.signed.add(k)
                    elif sympy.sympify(r.lower).is_Integer:
                        self.lower[k] = int(r.lower)
                break

    def simplify(self, expr: Any) -> sympy.Expr:
        """``expr`` with the Max/Min its symbols' lower bounds decide resolved: a slice of
        ``s0`` from 1 to -1 is ``s0 - 2`` long, as Dynamo has it, not ``Max(0, s0 - 2)``."""
        expr = sympy.sympify(expr)
        if not expr.has(sympy.Max, sympy.Min):
            return expr
        over = {s: (index_symbol(f"{s.name}_over"), self.lower.get(s, 0)) for s in size_symbols(expr)}
        shifted = expr.xreplace({s: t + lo for s, (t, lo) in over.items()})  # Max/Min evaluate here
        return sympy.expand(shifted.xreplace({t: s - lo for s, (t, lo) in over.items()}))

    def provably_nonnegative(self, expr: Any) -> bool:
        """Whether ``expr`` is >= 0 for every size its symbols may take (their lower bounds
        kept; a number: its sign); False when SymPy cannot tell, or when a symbol may be
        negative. For choices that must hold at every size, such as leaving out a bounds check."""
        expr = sympy.sympify(expr)
        if size_symbols(expr) & self.signed:
            return False
        over = {s: index_symbol(f"{s.name}_over") + self.lower.get(s, 0) for s in size_symbols(expr)}
        return bool(sympy.expand(expr.xreplace(over)).is_nonnegative)

    def replace(self, expr: Any) -> sympy.Expr:
        """``expr`` with the symbols the ShapeEnv's guards have equated replaced, as the traced
        sizes have them. A guard added while compiling (``is_non_overlapping_and_dense`` on an
        output's traced strides guards ``s1 == 1``) rewrites the traced sizes from then on,
        while the IR built before it still names ``s1``."""
        expr = sympy.sympify(expr)
        if self.shape_env is None:
            return expr
        replace = self.shape_env.replace
        return expr.xreplace({s: from_torch_sympy(sympy.sympify(replace(s))) for s in size_symbols(expr)})

    def hint(self, expr: Any) -> int:
        expr = sympy.sympify(expr).xreplace(self.var_to_val)
        if not expr.is_number:
            return 8192  # unknown (unbacked): assume a large size
        return int(expr)


def _shape_env(x: Any) -> Any:
    if isinstance(x, torch.SymInt):
        return x.node.shape_env
    if isinstance(x, torch.Tensor):
        mode = getattr(x, "fake_mode", None)
        return getattr(mode, "shape_env", None)
    return None
