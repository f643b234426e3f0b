"""2-D tiles for pointwise kernels that read a buffer transposed (``x.t() + y``): loops over
tiles of the two innermost dims, and the transposed operand staged per 16x16 block (a register
transpose for 4-byte values) so the inner loop reads it contiguously."""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy
import torch

from minductor import config
from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer, cpp_index
from minductor.codegen.cpp_ops import CppOps
from minductor.codegen.loop_shapes import STAGED_TILE_COLS, TILE, Loop, MergedDims
from minductor.ir.indexing import affine_coeffs, index_symbol, make_vars, simplify_index
from minductor.runtime.cache import gathers_enabled
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.nodes import FusedGroup
from minductor.virtualized import V

if TYPE_CHECKING:
    from minductor.codegen.cpp import CppKernel

Expr = sympy.Expr


def needs_2d_tiles(group: FusedGroup, outer: MergedDims) -> bool:
    """Whether some buffer is contiguous along the second-innermost loop while another
    is contiguous along the innermost (a transpose): then loop over 2-D tiles."""
    if len(outer.variables) < 2 or any(not s.is_Integer for s in outer.sizes[-2:]):
        return False
    if min(int(s) for s in outer.sizes[-2:]) < 2 * TILE:
        return False
    inner, second = outer.variables[-1], outer.variables[-2]
    found_inner = found_second = False
    for node in group.nodes:
        for dep in node.read_writes.reads | node.read_writes.writes:
            if not isinstance(dep, MemoryDep):
                continue
            expr = dep.index.xreplace(outer.substitution)
            coeffs = affine_coeffs(expr, [inner, second])
            if coeffs is None:
                continue
            found_inner |= coeffs[inner] == 1
            # a read constant along the innermost loop (an index vector, a row bias) is a
            # broadcast, not a transpose (index_select's indices made 64x64 tiles of a row copy)
            found_second |= coeffs[second] == 1 and coeffs[inner] not in (0, 1)
    return found_inner and found_second


def _store_contiguous_along(outer: MergedDims, var: sympy.Symbol, loop: Loop) -> bool:
    for node in loop.nodes:
        for dep in node.read_writes.writes:
            if isinstance(dep, MemoryDep):
                coeffs = affine_coeffs(dep.index.xreplace(outer.substitution), [var])
                if coeffs is not None and coeffs[var] == 1:
                    return True
    return False


def emit_tiled_2d(kernel: CppKernel, code: CodeBuffer, outer: MergedDims, loop: Loop, parallel: bool) -> None:
    """Pointwise over ``TILE x TILE`` blocks of the two innermost dims (cache blocking);
    ``SUB x STAGED_TILE_COLS`` strips when a transposed operand is staged."""
    *lead, second, inner = list(zip(outer.variables, outer.sizes))
    for var, size in zip(outer.variables, outer.sizes):
        kernel.range_of[var] = size
    if parallel:
        code.writeline(f"#pragma omp parallel for schedule(static) collapse({len(lead) + 2})")
    for var, size in lead:
        code.writeline(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++)")
    (v2, s2), (v1, s1) = second, inner
    if _store_contiguous_along(outer, v2, loop):
        (v2, s2), (v1, s1) = (v1, s1), (v2, s2)  # vectorize along the stores, gather the loads
    kernel.body, kernel.prefix, kernel.suffix = CodeBuffer(), CodeBuffer(), CodeBuffer()
    kernel.substitution = dict(outer.substitution)
    kernel.stage = StagedTile(v1, s1, v2, s2, gathers=gathers_enabled(config.cxx))
    kernel.innermost = str(v1)
    with V.set_ops(CppOps(kernel)), V.set_kernel(kernel):
        for node in loop.nodes:
            node.run(make_vars("x", len(kernel.group.outer)), [])
    stage, kernel.stage = kernel.stage, None
    # staged tiles are walked in SUB x SUB blocks
    rows, cols = (stage.SUB, STAGED_TILE_COLS) if stage.fills else (TILE, TILE)
    loops = [f"for (int64_t mi_t0 = 0; mi_t0 < {cpp_index(s2)}; mi_t0 += {rows})",
             f"for (int64_t mi_t1 = 0; mi_t1 < {cpp_index(s1)}; mi_t1 += {cols})"]
    # staged strips go down the rows of one column band: consecutive strips then read the next
    # line of the same rows of the transposed operand, a forward walk in each of its pages
    for line in reversed(loops) if stage.fills else loops:
        code.writeline(line)
    code.writeline("{")
    with code.indent(open_brace=False):
        step, lo0, lo1 = (stage.SUB, "mi_s0", "mi_s1") if stage.fills else (TILE, "mi_t0", "mi_t1")
        if stage.fills:
            code.writeline("int64_t mi_s0 = mi_t0;")
            code.writeline(f"for (int64_t mi_s1 = mi_t1; mi_s1 < mi_min_i64(mi_t1 + {cols}, {cpp_index(s1)}); mi_s1 += {step})")
            code.writeline("{")
            code._indent += 1
            stage.emit_fills(code)
        code.writeline(f"for (int64_t {v2} = {lo0}; {v2} < mi_min_i64({lo0} + {step}, {cpp_index(s2)}); {v2}++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t {v1} = {lo1}; {v1} < mi_min_i64({lo1} + {step}, {cpp_index(s1)}); {v1}++)")
            with code.indent():
                code.splice(kernel.body)
        code.writeline("}")
        if stage.fills:
            code._indent -= 1
            code.writeline("}")
    code.writeline("}")


class StagedTile:
    """Loads of a 2-D tile that are contiguous along the tile's outer variable ``v2`` while the
    inner loop runs along ``v1`` (the transposed operand of ``x.t() + y``). The tile is walked
    in ``SUB x SUB`` blocks; each such load is first copied into a local block, reading rows of
    the source contiguously, so the inner loop reads the block contiguously instead of loading
    with a stride. A full block of 4-byte values is transposed in registers
    (``mi_transpose16``): x.t() + y at 4096 ran 19.3 ms with strided (gather) loads, 14.1 ms
    staged by a scalar copy, 5.5 ms so (a STREAM add of the same bytes: 4.6 ms). Other dtypes
    are staged by a scalar copy, and only where the compiler emits no gathers."""

    SUB = 16
    MAX_STAGES = 4

    def __init__(self, v1: sympy.Symbol, s1: Expr, v2: sympy.Symbol, s2: Expr, gathers: bool) -> None:
        self.v1, self.s1, self.v2, self.s2, self.gathers = v1, s1, v2, s2, gathers
        # (block name, storage type, source access, register-transpose statement or None)
        self.fills: list[tuple[str, str, str, str | None]] = []
        self.by_access: dict[str, str] = {}

    def maybe_stage(self, kernel: CppKernel, arg: str, dtype: torch.dtype, index: Expr) -> str | None:
        expr = simplify_index(sympy.expand(sympy.sympify(index).xreplace(kernel.substitution)), kernel.range_of)
        coeffs = affine_coeffs(expr, [self.v1, self.v2])
        if coeffs is None or coeffs[self.v2] != 1 or coeffs[self.v1] == 1:
            return None
        fast = dtype.itemsize == 4 and dtype != torch.bool
        if self.gathers and not fast:
            return None
        a, b = index_symbol("mi_a"), index_symbol("mi_b")
        s0, s1 = index_symbol("mi_s0"), index_symbol("mi_s1")
        source = f"{arg}[{cpp_index(expr.xreplace({self.v1: s1 + a, self.v2: s0 + b}))}]"
        if source not in self.by_access:
            if len(self.fills) >= self.MAX_STAGES:
                return None
            name = f"mi_stage{len(self.fills)}"
            self.by_access[source] = name
            corner = f"{arg}[{cpp_index(expr.xreplace({self.v1: s1, self.v2: s0}))}]"
            fast_fill = f"mi_transpose16(&{corner}, {cpp_index(coeffs[self.v1])}, &{name}[0][0]);" if fast else None
            self.fills.append((name, CPP_STORAGE_TYPES[dtype], source, fast_fill))
        return f"{self.by_access[source]}[{self.v2} - mi_s0][{self.v1} - mi_s1]"

    def emit_fills(self, code: CodeBuffer) -> None:
        """Declare and fill the blocks of sub-block ``(mi_s0, mi_s1)``."""
        sub = self.SUB
        for name, ctype, _, _ in self.fills:
            code.writeline(f"alignas(64) {ctype} {name}[{sub}][{sub}];")
        fast = [f for f in self.fills if f[3] is not None]
        if fast:
            code.writeline(f"if (mi_s0 + {sub} <= {cpp_index(self.s2)} && mi_s1 + {sub} <= {cpp_index(self.s1)})")
            code.writeline("{")
            with code.indent(open_brace=False):
                for *_, fast_fill in fast:
                    code.writeline(fast_fill)
            code.writeline("}")
            code.writeline("else")
            self._emit_copy(code, fast)
        slow = [f for f in self.fills if f[3] is None]
        if slow:
            self._emit_copy(code, slow)

    def _emit_copy(self, code: CodeBuffer, fills: list[tuple[str, str, str, str | None]]) -> None:
        sub = self.SUB
        code.writeline(f"for (int64_t mi_a = 0; mi_a < mi_min_i64({sub}, {cpp_index(self.s1)} - mi_s1); mi_a++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t mi_b = 0; mi_b < mi_min_i64({sub}, {cpp_index(self.s2)} - mi_s0); mi_b++)")
            with code.indent():
                for name, _, source, _ in fills:
                    code.writeline(f"{name}[mi_b][mi_a] = {source};")
        code.writeline("}")
