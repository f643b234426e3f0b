"""C++/OpenMP kernels for scans (cumsum, cumprod, cummax/cummin, logcumsumexp).

A scan group is one ``Scan`` (one or more output buffers sharing a body). Per outer index
the kernel walks the scanned dim sequentially, carrying the combine state in registers:

    parallel for pre dims [x tiles of post]:
        carry = init
        for r0 in 0..L:                  # sequential: eager's accumulation order
            [simd for lane in tile:]     # when the scanned dim is not the innermost
                carry = combine(carry, inner_fn(index)); store carry

When dims follow the scanned one (``x.cumsum(0)``), consecutive outer positions are
contiguous in memory: they form the tile's SIMD lanes, each with its own carry.

When the scanned dim is the innermost, each row's steps form one chain of dependent combines
(a double add's latency per element for a float cumsum). So ``INTERLEAVE`` rows walk their
dims together, one block per row in each step, and the CPU overlaps their chains; each row
still combines in eager's order.
"""
from __future__ import annotations

import re

import sympy

from minductor.codegen.common import CPP_COMPUTE_TYPES, CodeBuffer, cpp_index
from minductor.codegen.cpp import CppKernel
from minductor.codegen.cpp_f16c import blocked_scan_rows
from minductor.codegen.cpp_ops import CppOps, cpp_constant
from minductor.codegen.loop_shapes import parallel_decision, planning_size
from minductor.ir.indexing import FloorDiv, ModularIndexing, index_symbol
from minductor.ir.nodes import Scan
from minductor.scheduler.nodes import FusedGroup
from minductor.virtualized import V

Expr = sympy.Expr
_CARRY = re.compile(r"\bmi_carry(\d+)\b")

# lanes per tile when the scanned dim is not the innermost (a few cache lines of float)
SCAN_TILE = 64
SMALL_SCAN_TILE = 16
# rows scanned together when the scanned dim is the innermost. At 4096^2 on a Xeon (family 6
# model 207), whole calls, interleaved: cumsum(1) 9.9 -> 8.2 ms, cumprod(1) 14.0 -> 9.0 ms,
# logcumsumexp(1) 317 -> 198 ms. Kernel alone, cumsum: 2 rows 8.1, 4 rows 7.6, 8 rows 18.6 ms
# (one row 9.4): rows 16 KB apart share L1 sets, and 16 streams overflow them.
INTERLEAVE = 4


class CppScanKernel(CppKernel):
    """One scan group as a C++ function; reuses CppKernel's loads, stores and rendering."""

    def __init__(self, group: FusedGroup, name: str) -> None:
        super().__init__(group, name)
        self.scan: Scan = group.nodes[0].node.data

    def generate(self) -> str:
        scan = self.scan
        sizes = list(scan.ranges)
        d = scan.scan_dim
        pre, length, post = sizes[:d], sizes[d], sizes[d + 1:]
        post_numel = sympy.Mul(*post) if post else sympy.Integer(1)
        pre_vars = [index_symbol(f"x{i}") for i in range(len(pre))]
        post_var, scan_var = index_symbol("xp"), index_symbol("r0")
        self.range_of.update(dict(zip(pre_vars, pre)) | {post_var: post_numel, scan_var: length})
        post_index = _unflatten(post_var, post)
        full = list(pre_vars) + [scan_var] + post_index
        tiled = post_numel != 1
        tile = SCAN_TILE if tiled and planning_size(post_numel, 4 * SCAN_TILE) >= 4 * SCAN_TILE else SMALL_SCAN_TILE
        carries = [f"mi_carry{i}" for i in range(len(scan.carry_dtypes))]
        step = self._emit_step(full, [f"{c}[mi_lane]" if tiled else c for c in carries])

        code = CodeBuffer()
        code.writeline(f"// Source nodes: {', '.join(self.group.names())}")
        code.writeline(f"//   scan along dim {d} of {sizes}: {', '.join(sorted(scan.origins))}")
        loops = [(str(v), cpp_index(s)) for v, s in zip(pre_vars, pre) if s != 1]
        outer_iters = sympy.Mul(*[s for s in pre]) * (sympy.ceiling(post_numel / tile) if tiled else 1)
        parallel, self.parallel_if = parallel_decision(sympy.Mul(*sizes))
        parallel = parallel and not (outer_iters.is_number and int(outer_iters) <= 1)
        for v, s in zip(pre_vars, pre):
            if s == 1:
                code.writeline(f"const int64_t {v} = 0;")
        n_loops = len(loops) + int(tiled)
        row_sizes = [s for s in pre if s != 1]
        interleave = not tiled and bool(row_sizes) and planning_size(row_sizes[-1], INTERLEAVE) >= INTERLEAVE
        if parallel and n_loops:
            code.writeline(f"#pragma omp parallel for schedule(static){f' collapse({n_loops})' if n_loops > 1 else ''}")
        for var, size in loops[:-1] if interleave else loops:
            code.writeline(f"for (int64_t {var} = 0; {var} < {size}; {var}++)")
        if interleave:
            self._emit_interleaved(code, *loops[-1], step)
            return self.render(code)
        if tiled:
            code.writeline(f"for (int64_t mi_tile = 0; mi_tile < {cpp_index(post_numel)}; mi_tile += {tile})")
        code.writeline("{")
        with code.indent(open_brace=False):
            if tiled:
                code.writeline(f"const int64_t mi_count = mi_min_i64({tile}, {cpp_index(post_numel)} - mi_tile);")
            self._declare_carries(code, carries, tile if tiled else None)
            code.writeline(f"for (int64_t {scan_var} = 0; {scan_var} < {cpp_index(length)}; {scan_var}++)")
            code.writeline("{")
            with code.indent(open_brace=False):
                if tiled:
                    code.writeline("#pragma omp simd")
                    code.writeline("for (int64_t mi_lane = 0; mi_lane < mi_count; mi_lane++)")
                    code.writeline("{")
                    with code.indent(open_brace=False):
                        code.writeline(f"const int64_t {post_var} = mi_tile + mi_lane;")
                        code.splice(step)
                    code.writeline("}")
                else:
                    code.splice(step)
            code.writeline("}")
        code.writeline("}")
        return self.render(code)

    def _declare_carries(self, code: CodeBuffer, carries: list[str], tile: int | None = None) -> None:
        """Each carry at its initial value: one per lane of a ``tile``, else a scalar."""
        for c, dtype, init in zip(carries, self.scan.carry_dtypes, self.scan.init):
            ctype, value = CPP_COMPUTE_TYPES[dtype], cpp_constant(init, dtype)
            if tile is not None:
                code.writeline(f"{ctype} {c}[{tile}];")
                code.writeline(f"for (int64_t mi_lane = 0; mi_lane < {tile}; mi_lane++) {c}[mi_lane] = {value};")
            else:
                code.writeline(f"{ctype} {c} = {value};")

    def _emit_interleaved(self, code: CodeBuffer, var: str, size: str, step: CodeBuffer) -> None:
        """The innermost row loop ``var`` in groups of ``INTERLEAVE`` rows that take each scan
        step together (a block per row, its own carries); a last partial group row by row."""
        n_carries = len(self.scan.carry_dtypes)
        base, length = f"mi_{var}_base", cpp_index(self.range_of[index_symbol("r0")])
        code.writeline(f"for (int64_t {base} = 0; {base} < {size}; {base} += {INTERLEAVE})")
        with code.indent():
            code.writeline(f"if ({base} + {INTERLEAVE} <= {size})")
            with code.indent():
                for k in range(INTERLEAVE):
                    self._declare_carries(code, [f"mi_carry{i}_{k}" for i in range(n_carries)])
                rows = [[_CARRY.sub(rf"mi_carry\1_{k}", line) for line in step.lines] for k in range(INTERLEAVE)]
                blocked = blocked_scan_rows(rows, var, base, length)
                for line in blocked or []:
                    code.writeline(line)
                if blocked is None:
                    code.writeline(f"for (int64_t r0 = 0; r0 < {length}; r0++)")
                    with code.indent():
                        for k in range(INTERLEAVE):
                            with code.indent():
                                code.writeline(f"const int64_t {var} = {base} + {k};")
                                for line in rows[k]:
                                    code.writeline(line)
            code.writeline("else")
            code.writeline(f"for (int64_t {var} = {base}; {var} < {size}; {var}++)")
            with code.indent():
                self._declare_carries(code, [f"mi_carry{i}" for i in range(n_carries)])
                code.writeline(f"for (int64_t r0 = 0; r0 < {length}; r0++)")
                with code.indent():
                    code.splice(step)

    def _emit_step(self, full: list[Expr], carries: list[str]) -> CodeBuffer:
        """One scan step: read the carry, combine the new values in, store every output."""
        scan = self.scan
        self.body = CodeBuffer()
        current = []
        for i, (c, dtype) in enumerate(zip(carries, scan.carry_dtypes)):
            self.body.writeline(f"const {CPP_COMPUTE_TYPES[dtype]} mi_cur{i} = {c};")
            current.append(f"mi_cur{i}")
        with V.set_ops(CppOps(self)), V.set_kernel(self):
            values = scan.inner_fn(full)
            new = scan.combine_fn(tuple(current), tuple(values))
            for c, dtype, value in zip(carries, scan.carry_dtypes, new):
                self.body.writeline(f"{c} = static_cast<{CPP_COMPUTE_TYPES[dtype]}>({value});")
            for node in self.group.nodes:
                data = node.node.data
                assert isinstance(data, Scan)
                value = new[data.output_index]
                if data.dtype != data.carry_dtypes[data.output_index]:
                    value = V.ops.to_dtype(value, data.dtype)
                self.store(node.node.name, node.node.layout.make_indexer()(full), value, self.body)
        return self.body


def _unflatten(var: sympy.Symbol, sizes: list[Expr]) -> list[Expr]:
    """Row-major coordinates of the flat index ``var`` over ``sizes``."""
    out: list[Expr] = []
    total = sympy.Mul(*sizes) if sizes else sympy.Integer(1)
    for k, size in enumerate(sizes):
        stride = sympy.Mul(*sizes[k + 1:]) if k + 1 < len(sizes) else sympy.Integer(1)
        if size == 1:
            out.append(sympy.Integer(0))
        elif stride * size == total:
            out.append(FloorDiv(var, stride))
        else:
            out.append(ModularIndexing(var, stride, size))
    return out
