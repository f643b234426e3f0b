"""Prefetches for a loop over a row picked by a per-row index: a streamed loop reading it (an
embedding row, ``index_select``, ``x[i]``), a scatter's chunk updating it.

Such a row is a contiguous run at an address no hardware prefetcher predicts: the prefetchers
follow a run within a 4 KB page and restart at each new one, and none knows where the next
row starts. The row's index is read once before its loops (``cpp_stream.hoist_invariant_lines``);
each step of the streamed loop then prefetches

- the line ``ROW_AHEAD_BYTES`` ahead in the same row (while there is one), and
- the line at the same offset in the next row, whose index is computed once, beside this one's.

Kernels alone, interleaved, Zen 4 (two threads; one thread in brackets): ``x.index_select(0, i)
* 2`` at 4096^2, rows of 16 KB, 3.90 ms without either, 3.54 with the first, 3.38 with the
second, 3.19 with both (7.62, 6.15, 5.64, 5.79 ms); an embedding of 8192 rows of 4 KB from a
(32768, 1024) table (no line 4 KB ahead in the row) 1.90 -> 1.56 ms (3.60 -> 3.17).

A scatter that updates a chunk of a row picked by a per-row index (``index_put`` with
``accumulate``, ``index_add`` along dim 0: ``cpp_stream.emit_chunk_loop``) prefetches the next
row's chunk for writing before it updates this one: the suite's index_put_acc kernel 3.36-3.43
-> 3.02-3.09 ms written by hand (prefetching the values' next rows too: 3.18-3.20), 2.93 -> 2.73
as generated (another bandwidth phase).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import sympy
import torch

from minductor.codegen.common import cpp_index, definition_names
from minductor.ir.indexing import affine_coeffs, index_symbol, simplify_index

Expr = sympy.Expr

# how far ahead in its row a step prefetches
ROW_AHEAD_BYTES = 4096

_DEF = re.compile(r"auto (tmp\d+) = (.*);$")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")


@dataclasses.dataclass
class RowPrefetch:
    setup: list[str]  # before the row's loops: the next row's index
    ahead: list[tuple[str, Expr, int, int]]  # (pointer, index at mi_line_at, elements ahead, itemsize)
    next_row: list[tuple[str, Expr, int]]  # (pointer, the next row's index at mi_line_at, itemsize)

    def whole_next_row(self, lo: str, hi: str, written: set[str]) -> list[str]:
        """Prefetches of the lines of the next row from ``lo`` to ``hi`` (a loop over a chunk of
        a row: a scatter's columns), for writing where the kernel stores through the pointer."""
        out = []
        for arg, at, itemsize in self.next_row:
            rw = int(arg in written)
            loop = f"for (int64_t mi_line_at = {lo}; mi_line_at < {hi}; mi_line_at += {64 // itemsize})"
            out.append(f"{loop} __builtin_prefetch(&{arg}[{cpp_index(at)}], {rw}, 3);")
        return list(dict.fromkeys(out))

    def step(self, width: int) -> list[str]:
        """The prefetches of a step of ``width`` iterations from ``mi_line_at``: one per 64-byte
        line of each read (not past the range's end in the row: 4 KB past a row of 16 KB would
        read a quarter more lines)."""
        def lines_of(arg: str, at: str, itemsize: int) -> list[str]:
            return [f"__builtin_prefetch(&{arg}[{at}]{f' + {k // itemsize}' if k else ''}, 0, 3);"
                    for k in range(0, width * itemsize, 64)]

        out: list[str] = []
        by_ahead: dict[int, list[str]] = {}
        for arg, at, ahead, itemsize in self.ahead:
            by_ahead.setdefault(ahead, []).extend(lines_of(arg, cpp_index(at), itemsize))
        for ahead, lines in by_ahead.items():
            out += [f"if (mi_line_at + {ahead} < mi_hi)", "{", *["    " + line for line in dict.fromkeys(lines)], "}"]
        for arg, at, itemsize in self.next_row:
            out += [line for line in lines_of(arg, cpp_index(at), itemsize) if line not in out]
        return out


def plan_row_prefetch(loads: Sequence[tuple[str, Expr, torch.dtype]], hoisted: list[str], var: sympy.Symbol,
                      range_of: dict[sympy.Symbol, Expr]) -> RowPrefetch | None:
    """The prefetches of a streamed loop over ``var`` for each of ``loads`` (the body's) that
    reads a run contiguous along ``var`` from where an index defined in ``hoisted`` points; the
    next row is the next value of the one loop variable that index depends on (none, or
    several, or reads that depend on another: no next-row prefetch)."""
    defs = {m.group(1): m.group(2) for line in hoisted if (m := _DEF.match(line.strip()))}
    line_at = index_symbol("mi_line_at")
    rows = [(arg, index, dtype) for arg, index, dtype in loads
            if (picked := {str(s) for s in index.free_symbols if str(s).startswith("tmp")})
            and picked <= set(defs) and (c := affine_coeffs(index, [var])) is not None and c[var] == 1]
    if not rows:
        return None
    ahead = [(arg, simplify_index(sympy.expand(index.xreplace({var: line_at + ROW_AHEAD_BYTES // dtype.itemsize})), range_of),
              ROW_AHEAD_BYTES // dtype.itemsize, dtype.itemsize) for arg, index, dtype in rows]
    # the index's definitions (all among the hoisted lines), and the loop variables they read
    needed = definition_names([str(s) for _, index, _ in rows for s in index.free_symbols if str(s) in defs], defs)
    loop_vars = {str(v): v for v in range_of if v != var}
    used = {n for name in needed or () for n in _NAME.findall(defs[name]) if n in loop_vars}
    # (a read that also moves with another loop variable, or an index that does, has no one next row)
    if needed is None or len(used) != 1 or any(str(s) in loop_vars for _, index, _ in rows for s in index.free_symbols):
        return RowPrefetch([], ahead, [])
    row = loop_vars[used.pop()]
    renamed = {name: f"{name}_next" for name in needed} | {str(row): "mi_next_row"}
    setup = [f"const int64_t mi_next_row = mi_min_i64({row} + 1, {cpp_index(range_of[row])} - 1);"]
    setup += [f"auto {name}_next = {_NAME.sub(lambda m: renamed.get(m.group(0), m.group(0)), defs[name])};"
              for name in defs if name in needed]
    def in_next_row(index: Expr) -> Expr:
        swap = {s: index_symbol(renamed[str(s)]) for s in index.free_symbols if str(s) in renamed}
        return simplify_index(sympy.expand(index.xreplace({**swap, var: line_at})), range_of)

    next_row = [(arg, in_next_row(index), dtype.itemsize) for arg, index, dtype in rows]
    return RowPrefetch(setup, ahead, next_row)
