"""Reductions whose reduced range is split across the threads: outer-lane reductions
(``x.sum(0)``) and full reductions (``x.sum()``).

Each thread reduces a contiguous chunk (of the rows, into per-thread partials of every
column; or of all elements, storing on the way any pointwise sibling over them) into
per-thread partials, which then combine in thread order
(deterministic results); any epilogue follows (a per-column one, or the scalar division of a
``mean``). The kernel's ``emit_loop`` does the per-thread work (``kernel.split_rows`` or its
``thread_chunk`` argument tells it to take the thread's chunk).
"""
from __future__ import annotations

from typing import Any

import sympy

from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer, cpp_index, paren
from minductor.codegen.loop_shapes import (PARALLEL_THRESHOLD, ROW_GROUP, SPLIT_ROWS_MIN, SPLIT_ROWS_TILE, Loop, MergedDims,
                                           planning_size)
from minductor.virtualized import V

# the least first reduced dim a reduction over several splits across the threads
SPLIT_ROWS_SPLIT_MIN = 8
# the threads a kernel that keeps per-thread partials runs on
THREADS_LINE = "const int mi_nt = omp_get_max_threads() < MI_MAX_THREADS ? omp_get_max_threads() : MI_MAX_THREADS;"


def splits_rows(kernel: Any, outer: MergedDims, loops: list[Loop], parallel: bool) -> bool:
    """Whether an outer-lane reduction (``x.sum(0)``) splits its reduced range across the
    threads instead of its columns: each thread then streams whole rows of one contiguous
    block of memory instead of a tile's short run per row (4 KB runs 16 KB apart: amax(0)
    of 4096x4096 2.4 -> 1.65 ms on a Zen 5 VM)."""
    if kernel.tile_var is None or not parallel or len(outer.variables) != 1:
        return False
    first, *rest = loops
    if not all(n.is_reduction() for n in first.nodes) or any(lp.red or lp.pw_inner for lp in rest):
        return False  # reductions first; then at most per-column epilogues (var's division)
    if len(first.red) == 1:
        return planning_size(first.red[0], SPLIT_ROWS_MIN) >= SPLIT_ROWS_MIN
    # several reduced dims (a channels-last batch norm's backward over N, H, W, which a pool's
    # window reads keep apart): the threads split the first, each takes whole images (32
    # channels: two 16-channel tiles, each thread reading every other 64-byte line, 1.45 ms at
    # 30% of the bandwidth; split, 0.42 ms at 91%: python -m minductor.bench --dump)
    rows = planning_size(sympy.Mul(*first.red), SPLIT_ROWS_MIN)
    return rows >= SPLIT_ROWS_MIN and planning_size(first.red[0], SPLIT_ROWS_SPLIT_MIN) >= SPLIT_ROWS_SPLIT_MIN


def emit_split_rows(kernel: Any, code: CodeBuffer, outer: MergedDims, loops: list[Loop]) -> None:
    """Each thread reduces a chunk of the rows into per-thread partials of every column
    (tiles of ``SPLIT_ROWS_TILE`` columns); the partials then combine in thread order, so the
    result is deterministic, and the stores run over the columns, then any epilogue."""
    loop, *epilogues = loops
    (var, size), = zip(outer.variables, outer.sizes)
    kernel.range_of[var] = size
    width = paren(cpp_index(size))  # (a symbolic size is a sum: mi_nt * (3 + s0))
    kernel.split_rows = True
    kernel.outer_lanes = min(SPLIT_ROWS_TILE, planning_size(size, SPLIT_ROWS_TILE))
    block = CodeBuffer()
    block._indent = code._indent + 2  # inside the block and the parallel region below
    block.writeline(f"for (int64_t mi_tile = 0; mi_tile < {width}; mi_tile += {kernel.outer_lanes})")
    block.writeline("{")
    with block.indent(open_brace=False):
        block.writeline(f"const int64_t mi_count = mi_min_i64({kernel.outer_lanes}, {width} - mi_tile);")
        kernel.emit_loop(block, outer, loop)
    block.writeline("}")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(THREADS_LINE)
        for acc, acc_type, _, _ in kernel.accumulators:
            code.writeline(f"{acc_type}* {acc}_partial = new {acc_type}[mi_nt * {width}];")
        code.writeline("#pragma omp parallel num_threads(mi_nt)")
        code.writeline("{")
        with code.indent(open_brace=False):
            code.writeline("const int64_t mi_tid = omp_get_thread_num(), mi_nthr = omp_get_num_threads();")
            code.lines.extend(block.lines)
        code.writeline("}")
        code.writeline(f"for (int64_t {var} = 0; {var} < {width}; {var}++)")
        with code.indent():
            kernel.combine_partials(code, lambda acc, t: f"{acc}_partial[{t} * {width} + {var}]")
            code.splice(kernel.suffix)
        for acc, *_ in kernel.accumulators:
            code.writeline(f"delete[] {acc}_partial;")
        if epilogues:
            code.writeline(f"for (int64_t mi_tile = 0; mi_tile < {width}; mi_tile += {kernel.outer_lanes})")
            with code.indent():
                code.writeline(f"const int64_t mi_count = mi_min_i64({kernel.outer_lanes}, {width} - mi_tile);")
                kernel.split_rows = False
                for epilogue in epilogues:
                    kernel.emit_loop(code, outer, epilogue)
    code.writeline("}")


def emit_row_group(kernel: Any, code: CodeBuffer, var: sympy.Symbol, lane_loop: str, bind: str) -> None:
    """``ROW_GROUP`` rows per pass over a split-rows tile: the lane's accumulator stays in a
    register across the group instead of a load and a store per row (the same order of
    operations, so the same result); the rows left over run one at a time after it."""
    code.writeline(f"for (; mi_row + {ROW_GROUP} <= mi_end; mi_row += {ROW_GROUP})")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline("#pragma omp simd")
        code.writeline(lane_loop)
        with code.indent():
            code.writeline(bind)
            for k in range(ROW_GROUP):
                code.writeline("{")
                with code.indent(open_brace=False):
                    code.writeline(f"const int64_t {var} = mi_row + {k};")
                    code.splice(kernel.body)
                code.writeline("}")
    code.writeline("}")


def fold_siblings(loops: list[Loop]) -> list[Loop]:
    """A kernel with no outer loop: pointwise loops over the elements a full reduction reduces,
    reading nothing the kernel writes (``fusion._one_pass``), join the reduction's loop, first
    in its body: one pass over the inputs, each thread storing its chunk."""
    reductions = [lp for lp in loops if lp.red and not lp.pw_inner]
    if len(reductions) != 1:
        return loops
    red = reductions[0]
    siblings = [lp for lp in loops if not lp.red and list(lp.pw_inner) == list(red.red)]
    if not siblings:
        return loops
    written = {d.name for lp in loops for n in lp.nodes for d in n.read_writes.writes}
    if any(d.name in written for lp in [red, *siblings] for n in lp.nodes for d in n.read_writes.reads):
        return loops
    joined = Loop([n for lp in siblings for n in lp.nodes] + red.nodes, [], list(red.red))
    return [joined] + [lp for lp in loops if lp is not red and not any(lp is s for s in siblings)]


def full_reduction_first(loops: list[Loop]) -> bool:
    """Whether a kernel with no outer loop is a full reduction followed by small epilogues
    only (``x.mean()``: the sum, then its division), which run on one thread after it."""
    first, *rest = loops
    if not first.red or first.pw_inner or not any(n.is_reduction() for n in first.nodes):
        return False  # (pointwise siblings may share the reduction's loop: fold_siblings)
    return all(not lp.red and planning_size(sympy.Mul(*lp.pw_inner), PARALLEL_THRESHOLD) < PARALLEL_THRESHOLD
               for lp in rest)


def emit_full_reduction(kernel: Any, code: CodeBuffer, loops: list[Loop]) -> None:
    """Each thread reduces a chunk of all elements; the partials combine in thread order, then
    the stores and any epilogue run (results kept in ``kernel.local`` are declared first)."""
    loop, *epilogues = loops
    none = MergedDims([], [], {})
    block = CodeBuffer()
    block._indent = code._indent + 2  # inside the block and the parallel region below
    kernel.emit_loop(block, none, loop, thread_chunk=True)
    size, align = kernel.chunked
    numel = cpp_index(size)
    for b, v in kernel.local.items():
        code.writeline(f"{CPP_STORAGE_TYPES[V.graph.get_dtype(b)]} {v}[1];  // {b}, kept in a local")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(THREADS_LINE)
        for name, acc_type, init, _ in kernel.accumulators:
            code.writeline(f"{acc_type} {name}_partial[MI_MAX_THREADS];")
            code.writeline(f"for (int t = 0; t < mi_nt; t++) {name}_partial[t] = {init};")
        code.writeline("#pragma omp parallel num_threads(mi_nt)")
        code.writeline("{")
        with code.indent(open_brace=False):
            code.writeline("const int64_t mi_tid = omp_get_thread_num(), mi_nthr = omp_get_num_threads();")
            code.writeline(f"const int64_t mi_chunk = (({numel} + mi_nthr - 1) / mi_nthr + {align - 1}) / {align} * {align};")
            code.writeline(f"const int64_t mi_begin = mi_min_i64({numel}, mi_tid * mi_chunk);")
            code.writeline(f"const int64_t mi_end = mi_min_i64({numel}, mi_begin + mi_chunk);")
            code.lines.extend(block.lines)
        code.writeline("}")
        kernel.combine_partials(code, lambda acc, t: f"{acc}_partial[{t}]")
        code.splice(kernel.suffix)
    code.writeline("}")
    for epilogue in epilogues:
        kernel.emit_loop(code, none, epilogue)
