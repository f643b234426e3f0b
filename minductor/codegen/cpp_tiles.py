"""2-D tiles for pointwise kernels that read a buffer transposed (``x.t() + y``): loops over
tiles of the two innermost dims, and the transposed operand staged for a whole tile (register
transposes of 16x16 blocks for 4-byte values) so the inner loop reads it contiguously."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import sympy
import torch

from minductor import config
from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer, cpp_index
from minductor.codegen.cpp_ops import CppOps
from minductor.codegen.cpp_stream import emit_streamed_loop, fence_parallel_region, simd_loop, stream_store
from minductor.codegen.loop_shapes import (
    STAGE_BYTES, STAGED_COLS, STAGED_ROWS, TILE, Loop, MergedDims, planning_size, tile_sizes,
)
from minductor.ir.indexing import affine_coeffs, index_symbol, make_vars, simplify_index
from minductor.runtime.cache import gathers_enabled, l2_cache_bytes
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.nodes import FusedGroup
from minductor.virtualized import V

if TYPE_CHECKING:
    from minductor.codegen.cpp import CppKernel

Expr = sympy.Expr


def _transposed_access(deps: Iterable[MemoryDep], inner: sympy.Symbol, second: sympy.Symbol,
                       substitution: dict[sympy.Symbol, Expr] | None = None) -> bool:
    """Whether some access in ``deps`` is contiguous along the innermost loop ``inner`` while
    another is contiguous along the second-innermost ``second`` (a transpose). ``substitution``
    first rewrites the indices into those loops' variables. A read constant along ``inner``
    (an index vector, a row bias) is a broadcast, not a transpose (index_select's indices
    made 64x64 tiles of a row copy)."""
    along_inner = along_second = False
    for dep in deps:
        if not isinstance(dep, MemoryDep):
            continue
        coeffs = affine_coeffs(dep.index.xreplace(substitution) if substitution else dep.index, [inner, second])
        if coeffs is not None:
            along_inner |= coeffs[inner] == 1
            along_second |= coeffs[second] == 1 and coeffs[inner] not in (0, 1)
    return along_inner and along_second


def needs_2d_tiles(group: FusedGroup, outer: MergedDims) -> bool:
    """Whether some buffer is contiguous along the second-innermost loop while another
    is contiguous along the innermost (a transpose): then loop over 2-D tiles."""
    if len(outer.variables) < 2:
        return False
    # the tiles' partial edges handle any run-time size
    if not tile_sizes(*outer.sizes[-2:]):
        return False
    deps = [dep for node in group.nodes for dep in node.read_writes.reads | node.read_writes.writes]
    return _transposed_access(deps, outer.variables[-1], outer.variables[-2], outer.substitution)


def _store_contiguous_along(outer: MergedDims, var: sympy.Symbol, loop: Loop) -> bool:
    for node in loop.nodes:
        for dep in node.read_writes.writes:
            if isinstance(dep, MemoryDep):
                coeffs = affine_coeffs(dep.index.xreplace(outer.substitution), [var])
                if coeffs is not None and coeffs[var] == 1:
                    return True
    return False


def emit_tiled_2d(kernel: CppKernel, code: CodeBuffer, outer: MergedDims, loop: Loop, parallel: bool) -> None:
    """Pointwise over ``TILE x TILE`` blocks of the two innermost dims (cache blocking), or
    over whole staged tiles when a transposed operand is staged (``_emit_staged_tiles``)."""
    *lead, second, inner = list(zip(outer.variables, outer.sizes))
    for var, size in zip(outer.variables, outer.sizes):
        kernel.range_of[var] = size
    (v2, s2), (v1, s1) = second, inner
    if _store_contiguous_along(outer, v2, loop):
        (v2, s2), (v1, s1) = (v1, s1), (v2, s2)  # vectorize along the stores, gather the loads
    kernel.body, kernel.prefix, kernel.suffix = CodeBuffer(), CodeBuffer(), CodeBuffer()
    kernel.substitution = dict(outer.substitution)
    kernel.source_ranges = dict(zip(make_vars("x", len(kernel.group.outer)), kernel.group.outer))
    kernel.stage = StagedTile(v1, s1, v2, s2, gathers=gathers_enabled(config.cxx))
    kernel.innermost = str(v1)
    with V.set_ops(CppOps(kernel)), V.set_kernel(kernel):
        for node in loop.nodes:
            node.run(make_vars("x", len(kernel.group.outer)), [])
    stage, kernel.stage = kernel.stage, None
    start = len(code.lines)
    if parallel:
        code.writeline(f"#pragma omp parallel for schedule(static) collapse({len(lead) + 2})")
    for var, size in lead:
        code.writeline(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++)")
    if stage.fills:
        lead_count = math.prod(V.graph.sizevars.hint(size) for _, size in lead)
        _emit_staged_tiles(kernel, code, stage, lead_count)
        if kernel.streamed:
            fence_parallel_region(code.lines, start)
        return
    code.writeline(f"for (int64_t mi_t0 = 0; mi_t0 < {cpp_index(s2)}; mi_t0 += {TILE})")
    code.writeline(f"for (int64_t mi_t1 = 0; mi_t1 < {cpp_index(s1)}; mi_t1 += {TILE})")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(f"for (int64_t {v2} = mi_t0; {v2} < mi_min_i64(mi_t0 + {TILE}, {cpp_index(s2)}); {v2}++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            simd_loop(code, v1, "mi_t1", f"mi_min_i64(mi_t1 + {TILE}, {cpp_index(s1)})", kernel.body.lines)
        code.writeline("}")
    code.writeline("}")


def stage_budget() -> int:
    """Bytes the stages of one tile may take: STAGE_BYTES, or half the L2 where that is less
    (the stage stays in L2 while the tile's other operands stream past it)."""
    l2 = l2_cache_bytes()
    return min(STAGE_BYTES, l2 // 2) if l2 else STAGE_BYTES // 2


def staged_tile_shape(rows: int, cols: int, stage_bytes: int, lead_count: int, threads: int,
                      budget: int | None = None) -> tuple[int, int]:
    """The tile of a ``rows x cols`` iteration space (times ``lead_count``) whose transposed
    operands take ``stage_bytes`` per element: STAGED_ROWS x STAGED_COLS, halved while the
    stages exceed ``budget`` (``stage_budget()``) or there are fewer than four tiles per
    thread; multiples of 16."""
    def up16(n: int) -> int:
        return -(-n // 16) * 16

    budget = stage_budget() if budget is None else budget
    r, c = min(STAGED_ROWS, up16(rows)), min(STAGED_COLS, up16(cols))
    while r > 16 and r * c * stage_bytes > budget:
        r = up16(r // 2)
    while lead_count * -(-rows // r) * -(-cols // c) < 4 * threads and max(r, c) > 16:
        r, c = (up16(r // 2), c) if r >= c else (r, up16(c // 2))
    return r, c


def _emit_staged_tiles(kernel: CppKernel, code: CodeBuffer, stage: StagedTile, lead_count: int) -> None:
    """Each tile stages its transposed operands whole (``StagedTile.emit_fills``), then runs
    its rows, the innermost loop along ``v1`` streaming its output where it may."""
    # (symbolic sizes: at least 4x4 tiles of the full shape, as a large hint would give)
    rows, cols = staged_tile_shape(planning_size(stage.s2, 4 * STAGED_ROWS), planning_size(stage.s1, 4 * STAGED_COLS),
                                   sum(f.itemsize for f in stage.fills), lead_count, torch.get_num_threads())
    stage.rows, stage.cols = rows, cols
    code.writeline(f"for (int64_t mi_t0 = 0; mi_t0 < {cpp_index(stage.s2)}; mi_t0 += {rows})")
    code.writeline(f"for (int64_t mi_t1 = 0; mi_t1 < {cpp_index(stage.s1)}; mi_t1 += {cols})")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(f"const int64_t mi_rows = mi_min_i64({rows}, {cpp_index(stage.s2)} - mi_t0);")
        code.writeline(f"const int64_t mi_cols = mi_min_i64({cols}, {cpp_index(stage.s1)} - mi_t1);")
        stage.emit_fills(code)
        v1, v2 = stage.v1, stage.v2
        code.writeline(f"for (int64_t {v2} = mi_t0; {v2} < mi_t0 + mi_rows; {v2}++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            _prefetch_rows_ahead(code, stage, kernel.range_of)
            kernel.may_stream = not kernel.scatters
            store = stream_store(kernel, v1, sympy.Integer(cols))
            kernel.may_stream = False
            if store is None:
                simd_loop(code, v1, "mi_t1", "mi_t1 + mi_cols", kernel.body.lines)
            else:
                emit_streamed_loop(code, v1, "mi_t1", "mi_t1 + mi_cols", kernel.body.lines, store, kernel.range_of)
                kernel.streamed = True
        code.writeline("}")
    code.writeline("}")


PREFETCH_ROWS = 4  # how far ahead a staged tile's row prefetches its row-contiguous operands
# The tiles' prefetches are non-temporal (prefetchnta): the lines are read once, and kept out
# of the L2 they cannot evict the tile's stage there (x.t() + y at 4096, 1024x128 tiles, a C++
# harness of the kernel alone on an AMD EPYC (Zen 5), six rounds alternating: 3.69-3.87 ->
# 3.52-3.76 ms at 100 GB/s STREAM, 4.48 -> 4.10 ms at 63 GB/s; 8 or 16 rows ahead no better)
PREFETCH_LOCALITY = 0


def _prefetch_rows_ahead(code: CodeBuffer, stage: StagedTile, range_of: dict[sympy.Symbol, Expr]) -> None:
    """The lines a row of the tile reads from its operands read along the row (``y`` of
    ``x.t() + y``), ``PREFETCH_ROWS`` rows ahead: each row of a tile reads a segment of a few
    lines, too short for the hardware prefetcher to follow (x.t() + y at 4096, kernels alone,
    in alternation: 5.84-5.87 -> 5.53-5.67 ms; 1, 2 and 4 rows ahead 5.69-5.72, 5.57-5.68 and
    5.53-5.67 ms)."""
    t1, v1, v2 = index_symbol("mi_t1"), stage.v1, stage.v2
    for (arg, index), itemsize in stage.row_loads.items():
        for k in range(0, stage.cols, max(64 // itemsize, 1)):  # a prefetch per 64-byte line
            ahead = simplify_index(sympy.expand(index.xreplace({v1: t1 + k, v2: v2 + PREFETCH_ROWS})), range_of)
            code.writeline(f"__builtin_prefetch(&{arg}[{cpp_index(ahead)}], 0, {PREFETCH_LOCALITY});")


@dataclasses.dataclass
class StageFill:
    name: str  # the local array
    ctype: str
    itemsize: int
    source: str  # the operand's element at (mi_t1 + mi_a, mi_t0 + mi_b)
    stride: str | None  # 4-byte values: the source's row stride, for register transposes


class StagedTile:
    """Loads of a 2-D tile that are contiguous along the tile's outer variable ``v2`` while the
    inner loop runs along ``v1`` (the transposed operand of ``x.t() + y``). Each such operand is
    copied into a local array for the whole tile first, reading rows of the source
    contiguously, so the inner loop reads it contiguously instead of loading with a stride.
    Full 16x16 blocks of 4-byte values are transposed in registers (``mi_transpose16``): x.t()
    + y at 4096 ran 19.3 ms with strided (gather) loads, 14.1 ms staged by a scalar copy, 5.5 ms
    so (16x16 stages then; a STREAM add of the same bytes: 4.6 ms). Other dtypes are staged by
    a scalar copy, and only where the compiler emits no gathers. A buffer the kernel itself
    writes is never staged (the staging would read it before the tile computed it): a later
    node reads it back where its own iteration stored it."""

    MAX_STAGES = 4
    # elements ahead along a source row that a block's staging prefetches: each 16x16 block
    # reads 16 rows a line each, too many short runs for the hardware prefetcher (x.t() + y at
    # 4096 on an AMD EPYC, kernels alone in alternation, two runs: 512x128 tiles 3.44-3.54 ->
    # 3.38-3.40 ms; 256x128 tiles 3.66-3.71 -> 3.58-3.59 with 16 ahead)
    PREFETCH_AHEAD = 32

    def __init__(self, v1: sympy.Symbol, s1: Expr, v2: sympy.Symbol, s2: Expr, gathers: bool) -> None:
        self.v1, self.s1, self.v2, self.s2, self.gathers = v1, s1, v2, s2, gathers
        self.fills: list[StageFill] = []
        self.by_access: dict[str, str] = {}
        self.row_loads: dict[tuple[str, Expr], int] = {}  # (pointer, index) -> itemsize
        self.rows, self.cols = 0, 0  # the tile, once chosen (the arrays' extents)

    def maybe_stage(self, kernel: CppKernel, arg: str, dtype: torch.dtype, index: Expr) -> str | None:
        expr = simplify_index(kernel.merged(index), kernel.range_of)
        if any(str(s) in kernel.indirect_sizes for s in expr.free_symbols):
            return None  # through a computed index (Falcon's fused qkv picked by a tensor): known in the body only
        coeffs = affine_coeffs(expr, [self.v1, self.v2])
        if coeffs is not None and coeffs[self.v1] == 1 and coeffs[self.v2] != 0:
            self.row_loads[(arg, expr)] = dtype.itemsize  # read along the tile's rows: prefetched
        # (constant along v1, a per-row value: read as is, the compiler broadcasts it)
        if coeffs is None or coeffs[self.v2] != 1 or coeffs[self.v1] in (0, 1):
            return None
        fast = dtype.itemsize == 4 and dtype != torch.bool
        if self.gathers and not fast:
            return None
        a, b = index_symbol("mi_a"), index_symbol("mi_b")
        t0, t1 = index_symbol("mi_t0"), index_symbol("mi_t1")
        source = f"{arg}[{cpp_index(expr.xreplace({self.v1: t1 + a, self.v2: t0 + b}))}]"
        if source not in self.by_access:
            if len(self.fills) >= self.MAX_STAGES:
                return None
            name = f"mi_stage{len(self.fills)}"
            self.by_access[source] = name
            stride = cpp_index(coeffs[self.v1]) if fast else None
            self.fills.append(StageFill(name, CPP_STORAGE_TYPES[dtype], dtype.itemsize, source, stride))
        return f"{self.by_access[source]}[{self.v2} - mi_t0][{self.v1} - mi_t1]"

    def emit_fills(self, code: CodeBuffer) -> None:
        """Declare and fill the arrays of tile ``(mi_t0, mi_t1)``: ``mi_rows x mi_cols`` values."""
        for fill in self.fills:
            code.writeline(f"alignas(64) {fill.ctype} {fill.name}[{self.rows}][{self.cols}];")
        fast = [f for f in self.fills if f.stride is not None]
        if fast:
            code.writeline("for (int64_t mi_a0 = 0; mi_a0 < mi_cols; mi_a0 += 16)")
            code.writeline("for (int64_t mi_b0 = 0; mi_b0 < mi_rows; mi_b0 += 16)")
            code.writeline("{")
            with code.indent(open_brace=False):
                code.writeline("if (mi_a0 + 16 <= mi_cols && mi_b0 + 16 <= mi_rows)")
                code.writeline("{")
                with code.indent(open_brace=False):
                    code.writeline("const int64_t mi_a = mi_a0, mi_b = mi_b0;")
                    for fill in fast:  # the block two lines on along the source's rows
                        code.writeline(f"for (int mi_p = 0; mi_p < 16; mi_p++) "
                                       f"__builtin_prefetch(&{fill.source} + mi_p * {fill.stride} + {self.PREFETCH_AHEAD}, 0, {PREFETCH_LOCALITY});")
                        code.writeline(f"mi_transpose16(&{fill.source}, {fill.stride}, &{fill.name}[mi_b][mi_a], {self.cols});")
                code.writeline("}")
                code.writeline("else")
                self._emit_copy(code, fast, "mi_a0", "mi_min_i64(mi_a0 + 16, mi_cols)", "mi_b0", "mi_min_i64(mi_b0 + 16, mi_rows)")
            code.writeline("}")
        slow = [f for f in self.fills if f.stride is None]
        if slow:
            self._emit_copy(code, slow, "0", "mi_cols", "0", "mi_rows")

    @staticmethod
    def _emit_copy(code: CodeBuffer, fills: list[StageFill], a_lo: str, a_hi: str, b_lo: str, b_hi: str) -> None:
        """Element copies, reading the source along ``mi_b`` (its contiguous dim)."""
        code.writeline(f"for (int64_t mi_a = {a_lo}; mi_a < {a_hi}; mi_a++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t mi_b = {b_lo}; mi_b < {b_hi}; mi_b++)")
            with code.indent():
                for fill in fills:
                    code.writeline(f"{fill.name}[mi_b][mi_a] = {fill.source};")
        code.writeline("}")
