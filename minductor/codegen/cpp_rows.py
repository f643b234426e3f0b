"""What a fused row kernel keeps off memory: per-row locals and row scratch arrays.

A reduction result read back only by the same outer iteration (a softmax's row max and sum) is
a one-element local (``register_results``). Row scratch: an internal buffer a fused row kernel
writes and reads back per outer iteration.

Softmax computes ``exp(x - max)`` for a row, sums it and divides it by the sum; a GELU
feeding a layer norm is reduced to a mean and variance and then normalized. The value is read
back only by the same outer iteration (row), at the element it was stored to, and by nothing
outside the kernel. Stored in memory (in the output's storage, written over), every line of
it is read for ownership first, and the output can never take streaming stores, since the
kernel reads it back. Kept instead in a row-sized array on the stack (``mi_row0[4096]``, L1),
it never reaches memory, and the output becomes a plain store the kernel may stream.

``fold_into_reductions`` then runs such a producer inside the next reduction loop over the
same range: the exp is stored and summed in one pass instead of two. Hand kernels of softmax
at 4096^2 on a 2-core Xeon VM, timed in alternation: written over the output 9.3-9.5 ms;
row scratch, separate passes, streamed output 8.1 ms; the same with the sum in the exp loop
6.6-6.9 ms (row scratch with the fold but ordinary stores: 9.8 ms, no gain by itself). The
generated kernel, with the next-row prefetch of ``cpp_rewrites.prefetch_next_rows`` too,
went from 9.1-9.5 to 4.7-5.4 ms in ``python -m minductor.bench softmax``.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sympy
import torch

from minductor import config
from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer, cpp_index, paren
from minductor.codegen.loop_shapes import Loop
from minductor.ir.indexing import make_vars
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.fusion import inner_vars, read_within_iteration, reads_only_at
from minductor.scheduler.nodes import FusedGroup
from minductor.sizevars import size_symbols
from minductor.virtualized import V

# bytes of one row's scratch: L1-sized, and small for an OpenMP worker's stack
ROW_SCRATCH_MAX_BYTES = 64 * 1024
_NATIVE = (torch.float32, torch.float64, torch.int32, torch.int64)  # stored as computed


def _dense_offset(inner: list[tuple[sympy.Symbol, sympy.Expr]]) -> sympy.Expr:
    """The row-major position of the inner variables in their ranges."""
    offset, stride = sympy.Integer(0), sympy.Integer(1)
    for var, size in reversed(inner):
        offset += var * stride
        stride *= size
    return offset


def row_scratch_buffers(group: FusedGroup, internal: Iterable[str]) -> dict[str, int | sympy.Expr]:
    """Buffers of ``group`` that can live in a per-row scratch: name -> elements per row.

    A pointwise node's output qualifies when nothing outside the group reads it
    (``internal``), its elements per outer iteration are at most ``ROW_SCRATCH_MAX_BYTES``
    (a symbolic count: at the size hints; the kernel takes longer rows on the heap), it is
    stored at ``outer part + dense row offset``, and every read of it is a later node's,
    within the row the same iteration stored."""
    n_outer = len(group.outer)
    internal = set(internal)
    found: dict[str, int | sympy.Expr] = {}
    if n_outer == 0 or not config.row_scratch:
        return found
    outer_zero = {v: sympy.Integer(0) for v in make_vars("x", n_outer)}
    for pos, node in enumerate(group.nodes):
        name = node.node.name
        if name not in internal or node.is_reduction() or node.node.mutates or node.node.get_dtype() not in _NATIVE:
            continue
        writes = [d for d in node.read_writes.writes if d.name == name]
        inner = inner_vars(node, n_outer)
        sizes = [size for _, size in inner]
        if len(writes) != 1 or not isinstance(writes[0], MemoryDep) or not inner:
            continue
        numel = sympy.expand(sympy.Mul(*sizes))
        count = V.graph.sizevars.hint(numel)
        if count < 2 or count * node.node.get_dtype().itemsize > ROW_SCRATCH_MAX_BYTES:
            continue
        index = sympy.expand(writes[0].index)
        offset = _dense_offset(inner)
        if sympy.expand(index.xreplace(outer_zero) - offset) != 0 \
                or (sympy.expand(index - offset).free_symbols & {v for v, _ in inner}):
            continue
        if _reads_within_row(group, writes[0], node, pos, n_outer):
            found[name] = int(numel) if numel.is_Integer else numel
    return found


def _reads_within_row(group: FusedGroup, write: MemoryDep, writer: Any, pos: int, n_outer: int) -> bool:
    """Whether every read of ``write`` in ``group`` is a later node's, within the row the same
    outer iteration stored (anywhere in it: a pooling's second pass reads each window of
    the first pass's row)."""
    for reader_pos, reader in enumerate(group.nodes):
        for dep in reader.read_writes.reads:
            if dep.name != write.name:
                continue
            if reader_pos <= pos or not isinstance(dep, MemoryDep) \
                    or not read_within_iteration(write, writer, dep, reader, n_outer):
                return False
    return True


def exact_rows(group: FusedGroup, rows: Iterable[str]) -> set[str]:
    """Of the row scratch buffers, those read only at the element the same iteration stored
    (what ``fold_into_reductions`` needs)."""
    n_outer = len(group.outer)
    exact = set()
    for pos, node in enumerate(group.nodes):
        name = node.node.name
        if name not in rows:
            continue
        inner = inner_vars(node, n_outer)
        (write,) = [d for d in node.read_writes.writes if d.name == name]
        if reads_only_at(group, name, sympy.expand(write.index), inner, n_outer, range(pos + 1, len(group.nodes))):
            exact.add(name)
    return exact



def forwarded_results(group: FusedGroup, internal: Iterable[str]) -> list[str]:
    """Internal buffers of a one-loop pointwise kernel that later nodes read only at the element
    the same iteration stores: the stored value goes to them in a register instead (no store,
    no allocation). A result realized for two readers and fused with both (a moment an
    optimizer step stores and reads for the parameter's update) was written and read back."""
    internal, n_outer = set(internal), len(group.outer)
    found = []
    for pos, node in enumerate(group.nodes):
        name = node.node.name
        if name not in internal or node.is_reduction() or node.node.mutates:
            continue
        (write,) = [d for d in node.read_writes.writes if d.name == name]
        inner = inner_vars(node, n_outer)
        if isinstance(write, MemoryDep) and reads_only_at(group, name, sympy.expand(write.index), inner, n_outer,
                                                          range(pos + 1, len(group.nodes))):
            found.append(name)
    return found

def register_results(group: FusedGroup, internal: Iterable[str]) -> list[str]:
    """Internal buffers holding one reduction result per outer iteration, read back only at
    that same element by later loop blocks: a local per iteration replaces the buffer (no
    allocation, no memory traffic), e.g. the row max and sum of a softmax."""
    outer_vars = set(make_vars("x", len(group.outer)))
    internal = set(internal)
    found = []
    for node in group.nodes:
        name = node.node.name
        if name not in internal or not node.is_reduction() or node.node.mutates:
            continue
        writes = [d for d in node.read_writes.writes if d.name == name]
        if len(writes) != 1 or not isinstance(writes[0], MemoryDep) \
                or not writes[0].index.free_symbols - size_symbols(writes[0].index) <= outer_vars:
            continue  # (symbolic sizes may scale the outer variables)
        index = writes[0].index
        reads = [d for n in group.nodes for d in n.read_writes.reads if d.name == name]
        if all(isinstance(d, MemoryDep) and sympy.expand(d.index - index) == 0 for d in reads):
            found.append(name)
    return found


def row_offset(index: sympy.Expr, n_outer: int) -> sympy.Expr:
    """A row scratch element's position: its buffer index without the outer part."""
    return index.xreplace({v: sympy.Integer(0) for v in make_vars("x", n_outer)})


def fold_into_reductions(loops: list[Loop], rows: Iterable[str]) -> list[Loop]:
    """Run a pointwise loop whose every node stores a row scratch buffer inside the reduction
    loop right after it, when that loop reduces over the same range (its ``red`` equals the
    pointwise loop's ``pw_inner``): each element is then stored and reduced in one pass.
    Legal for row scratch buffers read only at the element the same iteration stored
    (``exact_rows``), which in the joint loop is stored earlier in the same loop body."""
    rows = set(rows)
    out: list[Loop] = []
    for loop in loops:
        prev = out[-1] if out else None
        if prev is not None and not prev.red and prev.pw_inner and not loop.pw_inner \
                and list(loop.red) == list(prev.pw_inner) and all(n.node.name in rows for n in prev.nodes):
            out[-1] = Loop(prev.nodes + loop.nodes, [], list(loop.red))
        else:
            out.append(loop)
    return out


def declare_rows(code: CodeBuffer, rows: dict[str, tuple[str, int | sympy.Expr]]) -> None:
    """Declare the row scratch arrays (buffer -> (array, elements)) in an outer iteration. A
    row of symbolic length is on the stack up to ``ROW_SCRATCH_MAX_BYTES``, longer ones on
    the heap (``free_rows`` at the iteration's end)."""
    for b, (v, numel) in rows.items():
        dtype = V.graph.get_dtype(b)
        ctype = CPP_STORAGE_TYPES[dtype]
        if isinstance(numel, int):
            code.writeline(f"alignas(64) {ctype} {v}[{numel}];  // {b}, one row of it")
            continue
        cap, n = ROW_SCRATCH_MAX_BYTES // dtype.itemsize, paren(cpp_index(numel))
        code.writeline(f"alignas(64) {ctype} {v}_stack[{cap}];  // {b}, one row of it")
        code.writeline(f"{ctype}* {v} = {n} <= {cap} ? {v}_stack : static_cast<{ctype}*>(__builtin_malloc(sizeof({ctype}) * {n}));")


def free_rows(code: CodeBuffer, rows: dict[str, tuple[str, int | sympy.Expr]]) -> None:
    for v, numel in rows.values():
        if not isinstance(numel, int):
            code.writeline(f"if ({v} != {v}_stack) __builtin_free({v});")
