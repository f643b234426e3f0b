"""Memory dependencies, read off an IR body by running it under a recording handler."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from minductor.ir.indexing import index_symbol, simplify_index
from minductor.ir.ops import DefaultHandler
from minductor.virtualized import V

Expr = sympy.Expr


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryDep:
    """Access of ``name`` at ``index``, in the canonical loop variables of its node."""

    name: str
    index: Expr
    var_ranges: tuple[tuple[sympy.Symbol, Expr], ...]

    def __str__(self) -> str:
        return f"MemoryDep({self.name}, {self.index})"


@dataclasses.dataclass(frozen=True, slots=True)
class StarDep:
    """Access of a whole buffer (extern calls, indirect indexing)."""

    name: str

    def __str__(self) -> str:
        return f"StarDep({self.name})"


@dataclasses.dataclass(frozen=True, slots=True)
class WeakDep:
    """Ordering only: ``name`` must not be overwritten before this node runs (mutation)."""

    name: str


Dep = MemoryDep | StarDep | WeakDep


@dataclasses.dataclass(slots=True)
class ReadWrites:
    reads: set[Dep]
    writes: set[Dep]
    index_exprs: list[Expr]  # every index the body computes (loads, stores, index_expr)

    def read_names(self) -> set[str]:
        return {d.name for d in self.reads}

    def write_names(self) -> set[str]:
        return {d.name for d in self.writes}


def is_indirect(index: Expr) -> bool:
    """Whether ``index`` goes through a loaded value (``RecordingHandler.indirect_indexing``)."""
    return any(str(s).startswith("indirect") for s in index.free_symbols)


class RecordingHandler(DefaultHandler):
    """Records loads/stores/index expressions; every other op yields a placeholder."""

    def __init__(self, var_ranges: dict[sympy.Symbol, Expr]) -> None:
        self.var_ranges = var_ranges
        self.rw = ReadWrites(set(), set(), [])
        self._indirect = 0

    def _dep(self, name: str, index: Expr) -> Dep:
        index = simplify_index(index, self.var_ranges)
        self.rw.index_exprs.append(index)
        if is_indirect(index):
            return StarDep(name)
        return MemoryDep(name, index, tuple(self.var_ranges.items()))

    def _default(self, name: str, args: tuple[Any, ...]) -> Any:
        return "v"

    def load(self, name: str, index: Expr) -> Any:
        self.rw.reads.add(self._dep(name, index))
        return "v"

    def store(self, name: str, index: Expr, value: Any, mode: str | None = None) -> Any:
        dep = self._dep(name, index)
        self.rw.writes.add(dep)
        if mode is not None:
            self.rw.reads.add(dep)  # a combining store reads what is there
        return None

    def store_reduction(self, name: str, index: Expr, value: Any) -> Any:
        self.rw.writes.add(self._dep(name, index))
        return None

    def index_expr(self, expr: Expr, dtype: Any) -> Any:
        self.rw.index_exprs.append(simplify_index(expr, self.var_ranges))
        return "v"

    def indirect_indexing(self, x: Any, size: Expr, check: bool = True, wrap: bool = True) -> Expr:
        self._indirect += 1
        return index_symbol(f"indirect{self._indirect}")

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> Any:
        return body()

    def reduction(self, dtype: Any, src_dtype: Any, reduction_type: str, value: Any) -> Any:
        return ("v", "v", "v") if reduction_type == "welford_reduce" else "v"


def extract_read_writes(
    body: Callable[[Sequence[Expr], Sequence[Expr]], Any],
    var_ranges: dict[sympy.Symbol, Expr],
    index: Sequence[Expr],
    rindex: Sequence[Expr],
) -> ReadWrites:
    handler = RecordingHandler(var_ranges)
    with V.set_ops(handler):
        body(index, rindex)
    return handler.rw
