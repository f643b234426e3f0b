"""C++/OpenMP kernels: one ``extern "C"`` function per fused group.

Kernel shape: the group's shared outer loops (``x0..``, parallel), and inside them one
block per *loop* -- consecutive nodes with the same inner ranges -- each with a prefix
(accumulators), an inner loop nest (``x``/``r`` variables, vectorizable) and a suffix
(reduction stores). Softmax is therefore one kernel: per row, a max loop, a sum loop and a
pointwise loop. Contiguous dims are merged first so plain elementwise code is one loop.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch

from minductor.codegen.common import (
    CPP_COMPUTE_TYPES,
    CPP_STORAGE_TYPES,
    CSE,
    CodeBuffer,
    KernelArgs,
    cpp_index,
    definition_names,
    from_storage,
    paren,
    stored_bits,
    to_storage,
)
from minductor.codegen.cpp_calls import may_batch
from minductor.codegen.cpp_interior import diagonal_spans, emit_innermost, pieces
from minductor.codegen.cpp_ops import CppOps, cpp_constant, reduction_code, store_combine
from minductor.codegen.cpp_stream import (
    emit_chunk_loop,
    hoist_flat_invariants,
    open_chunks,
    lane_loop,
    parallel_region,
    streamable_writes,
)
from minductor.codegen.cpp_rows import (
    declare_rows, exact_rows, fold_into_reductions, forwarded_results, free_rows, register_results, row_offset,
)
from minductor.codegen.cpp_rewrites import (
    LoopShape,
    hoist_inner_invariants,
    open_vector_loop_outside,
    prefetch_gathered_rows,
    prefetch_next_rows,
    prefetch_row_stores,
)
from minductor.codegen.cpp_read_streams import (emit_row_streams, emit_stream_steps, finish_rows, full_reduction_streams,
                                                least_stream_width, reads_rows_in_streams, stream_width)
from minductor.codegen.cpp_lane_merge import emit_pairwise_tree, emit_welford_merge
from minductor.codegen.cpp_lanes import emit_lane_step, emit_lanes_inside, lanes_go_inside
from minductor.codegen.cpp_split_rows import (emit_full_reduction, emit_row_group, emit_split_rows, fold_siblings,
                                              full_reduction_first, splits_rows)
from minductor.codegen.cpp_tiles import StagedTile, emit_tiled_2d, needs_2d_tiles
from minductor.codegen.cpp_unit import ARGS_PLACEHOLDER, render_unit
from minductor.codegen.loop_shapes import (
    OUTER_LANE_WIDTHS,
    WIDE_ROW,
    Loop,
    MergedDims,
    in_store_order,
    inner_chunk,
    inner_lanes,
    joins,
    linear_index,
    loop_narrow_lanes,
    merge_dims,
    mutation_loops,
    outer_lane_var,
    outer_lane_width,
    parallel_decision,
    planning_size,
    pure_pointwise as is_pure_pointwise,
    reduction_read_order,
    split_and_merge_dims,
    vectorizes_outside,
    wide_lanes,
)
from minductor.ir.indexing import index_symbol, make_vars, simplify_index
from minductor.scheduler.nodes import FusedGroup
from minductor.virtualized import V

Expr = sympy.Expr

FLAT_CHUNK = 4096  # elements per chunk of a flat loop whose output streams
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def group_origins(group: FusedGroup) -> set[str]:
    """The aten ops a fused group was lowered from."""
    return set().union(*(n.node.origins for n in group.nodes))


def kernel_name(group: FusedGroup, index: int) -> str:
    parts = sorted(o for o in group_origins(group) if o)[:6]
    return "cpp_fused_" + "_".join(parts + [str(index)]) if parts else f"cpp_kernel_{index}"


class CppKernel:
    """Generates the C++ source of one fused group."""

    def __init__(self, group: FusedGroup, name: str) -> None:
        self.group = group
        self.name = name
        self.args = KernelArgs()
        self.cse = CSE()
        self.acc_cse = CSE("tmp_acc")
        self.body = CodeBuffer()
        self.prefix = CodeBuffer()
        self.suffix = CodeBuffer()
        self.substitution: dict[sympy.Symbol, Expr] = {}
        self.source_ranges: dict[sympy.Symbol, Expr] = {}  # of the variables the bodies run on
        self.outside_var: sympy.Symbol | None = None
        self.range_of: dict[sympy.Symbol, Expr] = {}
        self.body_stores: list[tuple[str, Expr, torch.dtype]] = []  # (pointer, index, dtype) of the loop body's stores
        self.body_store_names: list[str] = []  # the buffers of body_stores
        self.body_loads: list[tuple[str, Expr, torch.dtype]] = []  # (pointer, index, dtype) of plain loads
        self.rounded: dict[str, tuple[torch.dtype, str]] = {}  # a value rounded to half/bf16 -> (dtype, the float)
        self.may_stream = False  # loops may use streaming stores (the parallel region fences them)
        self.streamed = False  # some loop did
        self.thread_state: list[str] = []  # declarations each thread of the parallel region makes (cached windows)
        # emit_outer's innermost loop, left to _emit_pointwise_nest: (var, lo, hi, iterations)
        self.deferred_loop: tuple[sympy.Symbol, str, str, Expr] | None = None
        self.loop_shape: LoopShape | None = None  # of the last loop block emitted
        self.rlinear: Expr = sympy.Integer(0)
        self.accumulators: list[tuple[str, str, str, str]] = []  # name, type, init, combine
        self.helpers: list[tuple[str, str, CodeBuffer]] = []  # per-block functions
        self.tile_var: sympy.Symbol | None = None
        self.parallel_if = ""  # the run-time condition of parallel loops over symbolic sizes
        self.split_rows = False  # outer-lane mode with the reduced range split across threads
        self.least_stream_width = 0  # of the loop block being emitted, if it may read in streams (cpp_read_streams)
        self.row_streams: str | None = None  # the row variable of rows reduced in streams (cpp_read_streams)
        self.sub_rows: tuple[str, int] | None = None  # of those, a short second loop inside each row: (variable, length)
        self.stage: StagedTile | None = None  # 2-D tile mode: loads staged transposed
        self.mask_depth = 0  # inside masked(): loads there must not run unconditionally
        self.masks: list[str] = []  # enclosing masks, innermost last
        self.uses_error_flag = False  # a check (index range, divisor) records failures in mi_bad
        self.innermost: str | None = None  # the innermost loop variable of the body being generated
        self.scatters = False  # stores through indirect indices or combining stores: a serial loop
        self.scatter_depth, self.scatter_chunks = 0, False  # a scatter's parallel loops (loop_shapes.mutation_loops)
        self.gathers = False  # loads through an index that changes along the innermost loop
        self.indirect_sizes: dict[str, Expr] = {}  # computed index (its C++ name) -> the dim it indexes
        self.indirect = False  # loads or stores through any computed index
        self.index_values: dict[str, Expr] = {}  # integer index values and their tests (cpp_interior)
        self.index_tests: dict[str, Expr] = {}
        self.internal: frozenset[str] = frozenset()  # written here, read nowhere else (wrapper)
        self.written_over: dict[str, str] = {}  # output -> dying input whose storage it takes (wrapper)
        self.local: dict[str, str] = {}  # of those, kept in a per-iteration local: name -> C++ name
        self.forwarded: dict[str, dict[str, str]] = {}  # or in registers: name -> {index: value}
        self.local_slot = "0"  # the element of a local this row's value takes (rows in streams: one per stream)
        self.row_candidates: dict[str, int | Expr] = {}  # of those, what may live in a row scratch (row_scratch_buffers)
        self.rows: dict[str, tuple[str, int | Expr]] = {}  # of those, kept in a row scratch: name -> (array, elements)

    # -- handler callbacks ---------------------------------------------------------------

    def merged(self, expr: Expr) -> Expr:
        """``expr`` over the merged loop variables, folded over the bodies' own ranges first:
        merging was decided on folded indices (the deps), and a term that folds to zero there
        (``x5 // 6`` for ``x5 < 6``) need not once ``x5`` stands for a merged variable."""
        return sympy.expand(simplify_index(expr, self.source_ranges).xreplace(self.substitution))

    def index_str(self, expr: Expr) -> str:
        return cpp_index(simplify_index(self.merged(expr), self.range_of))

    def load(self, name: str, index: Expr) -> str:
        dtype = V.graph.get_dtype(name)
        if name in self.local:
            return self.cse.generate(self.body, from_storage(dtype, f"{self.local[name]}[{self.local_slot}]"))
        if name in self.forwarded:  # (stored earlier in this iteration: forwarded_results)
            return self.forwarded[name][self.index_str(index)]
        if name in self.rows:
            at = self.index_str(row_offset(index, len(self.group.outer)))
            return self.cse.generate(self.body, from_storage(dtype, f"{self.rows[name][0]}[{at}]"))
        arg = self.args.input(name)
        flat = self.merged(index)
        at = cpp_index(simplify_index(flat, self.range_of))
        access = f"{arg}[{at}]"
        if self.masks:  # masked-off lanes read element 0: the load may run unconditionally
            access = f"{arg}[{_masked_index(' && '.join(self.masks), at, flat, self.outside_var)}]"
        if self.stage is not None and self.mask_depth == 0:
            access = (self.stage.maybe_stage(self, arg, dtype, index) if name not in self.group.write_names() else None) or access
        elif not self.masks:
            self.body_loads.append((arg, flat, dtype))
        return self.cse.generate(self.body, from_storage(dtype, access))

    def store(self, name: str, index: Expr, value: str, buffer: CodeBuffer, mode: str | None = None) -> None:
        dtype = V.graph.get_dtype(name)
        if mode is None and self.rounded.get(value, (None,))[0] == dtype:
            value = self.rounded[value][1]  # (the conversion to 16 bits rounds it alike)
        if name in self.forwarded:  # the value as a store and a load would give it back
            self.forwarded[name][self.index_str(index)] = self.cse.generate(self.body, from_storage(dtype, to_storage(dtype, value)))
            return
        if name in self.local:
            assert mode is None, "locals hold reduction results only"
            buffer.writeline(f"{self.local[name]}[{self.local_slot}] = {to_storage(dtype, value)};")
            return
        if name in self.rows:
            assert mode is None, "row scratch holds pointwise values only"
            array = self.rows[name][0]
            offset = self.index_str(row_offset(index, len(self.group.outer)))
            buffer.writeline(f"{array}[{offset}] = {to_storage(dtype, value)};")
            self.cse.cache = {expr: var for expr, var in self.cse.cache.items() if not expr.startswith(f"{array}[")}
            return
        arg = self.args.output(name)
        if mode is not None:
            current = self.load(name, index) if buffer is self.body else None
            assert current is not None, "combining stores happen in loop bodies"
            value = self.cse.generate(self.body, store_combine(mode, current, value))
        buffer.writeline(f"{arg}[{self.index_str(index)}] = {stored_bits(self.cse.cache, dtype, value)};")
        if buffer is self.body and mode is None:
            self.body_stores.append((arg, self.merged(index), dtype))
            self.body_store_names.append(name)
        if buffer is self.body:
            # a later load through this pointer in the loop body must see the store: several
            # buffers may share it (written over in place), so loads cached before it are stale
            through = re.compile(rf"(?<!\w){arg}\[")
            self.cse.cache = {expr: var for expr, var in self.cse.cache.items() if not through.search(expr)}

    def masked(self, mask: str, body: Callable[[], Any], other: bool | float) -> str:
        """``mask ? body() : other``. The body's loads read element 0 in masked-off lanes, so
        a body of loads and math runs unconditionally and the select is branch-free (the loop
        vectorizes, strided masked loads as gathers); a body that can raise (bounds or
        divisor checks) or nests another mask stays a lambda called only under the mask."""
        saved = self.body
        inner = CodeBuffer()
        self.body = inner
        self.mask_depth += 1
        self.masks.append(mask)
        with self.cse.scope():
            value = body()
        self.masks.pop()
        self.mask_depth -= 1
        self.body = saved
        other_str = cpp_constant(other, torch.bool if isinstance(other, bool) else (torch.float64 if isinstance(other, float) else torch.int64))
        text = inner.getvalue()
        if "mi_bad" not in text and "[&]" not in text:
            self.body.splice(inner)
            return self.cse.generate(self.body, f"{mask} ? {value} : static_cast<decltype({value})>({other_str})")
        fn = self.cse.newvar()
        self.body.writeline(f"auto {fn} = [&]() {{")
        with self.body.indent(open_brace=False):
            self.body.splice(inner)
            self.body.writeline(f"return {value};")
        self.body.writeline("};")
        return self.cse.generate(self.body, f"{mask} ? {fn}() : static_cast<decltype({fn}())>({other_str})")

    def definition_closure(self, var: str, definitions: dict[str, str] | None = None) -> list[str] | None:
        """The CSE expressions the body's value ``var`` is computed from, transitively; None when
        one of them is unknown (defined outside the CSE table, e.g. a lambda). ``definitions``
        (tmp -> expression) may be passed by a caller walking many values."""
        if definitions is None:
            definitions = {v: e for e, v in self.cse.cache.items()}
        names = definition_names([var], definitions)
        return None if names is None else [definitions[n] for n in names]

    def _varies(self, exprs: list[str] | None) -> bool:
        if self.innermost is None or exprs is None:
            return True
        return any(self.innermost in names or "mi_lane" in names for names in (set(_IDENT.findall(e)) for e in exprs))

    def varies_in_innermost_loop(self, var: str) -> bool:
        """Whether the body's value ``var`` depends on the innermost loop variable (read off the
        expressions that define it); True when that is unknown."""
        return self._varies(self.definition_closure(var))

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, rtype: str, value: str) -> Any:
        key = f"{rtype}({value})"
        if key in self.cse.cache:
            acc = self.cse.cache[key]
        else:
            acc = self.acc_cse.newvar()
            self.cse.cache[key] = acc
            ctype = CPP_COMPUTE_TYPES[src_dtype if rtype in ("argmax", "argmin") else dtype]
            acc_type, init, update, combine = reduction_code(rtype, ctype, acc, value, self.index_str(self.rlinear))
            lane = f"{acc}_lanes[mi_lane]"
            update = reduction_code(rtype, ctype, lane, value, self.index_str(self.rlinear))[2]
            lanes = self.outer_lanes if self.tile_var is not None else self.lane_slots
            used = "mi_wl" if self.wide_lanes else lanes  # the slots this row's lanes use
            if rtype == "welford_reduce" and self.welford_rw:
                # every lane has seen the same count: one reciprocal per lane step, no division per
                # element; mean and m2 live in separate arrays (structure of arrays) so the lane
                # loop vectorizes without shuffles, and become MiWelford lanes after the loop
                self.prefix.writeline(f"{ctype} {acc}_mean[{lanes}], {acc}_m2[{lanes}];")
                self.prefix.writeline(f"for (int mi_l = 0; mi_l < {used}; mi_l++) {{ {acc}_mean[mi_l] = 0; {acc}_m2[mi_l] = 0; }}")
                self.body.writeline(f"mi_welford_soa_update<{ctype}>({acc}_mean[mi_lane], {acc}_m2[mi_lane], "
                                    f"static_cast<{ctype}>({value}), static_cast<{ctype}>(mi_rw));")
                self.welford_accs.append((acc, ctype))
            elif rtype == "welford_reduce" and self.tile_var is not None:
                # outer lanes: mean, m2 and weight as arrays (an array of MiWelford structs took
                # 661 us for the channel statistics of a channels-last (8, 64, 64, 64), 12% of the
                # bandwidth); the same update, MiWelford lanes after the loops (_emit_tiled)
                self.prefix.writeline(f"{ctype} {acc}_mean[{lanes}], {acc}_m2[{lanes}], {acc}_w[{lanes}];")
                self.prefix.writeline(f"for (int mi_l = 0; mi_l < {used}; mi_l++) "
                                      f"{{ {acc}_mean[mi_l] = 0; {acc}_m2[mi_l] = 0; {acc}_w[mi_l] = 0; }}")
                self.body.writeline(f"mi_welford_soa_update_w<{ctype}>({acc}_mean[mi_lane], {acc}_m2[mi_lane], "
                                    f"{acc}_w[mi_lane], static_cast<{ctype}>({value}));")
                self.tiled_welford.append((acc, ctype))
            elif rtype in ("argmax", "argmin") and self.tile_var is None and ctype != "bool":
                # value and index lanes apart, MiArg lanes after the loop: as 16-byte structs, x.max(-1)
                # at 4096^2 ran 9.3 ms, eager 4.45 (shuffles, branches); an int8 argmax 38 ms (1.6 so)
                first = "mi_lowest" if rtype == "argmax" else "mi_highest"
                self.prefix.writeline(f"{ctype} {acc}_v[{lanes}]; int64_t {acc}_i[{lanes}];")
                self.prefix.writeline(f"for (int mi_l = 0; mi_l < {used}; mi_l++) {{ {acc}_v[mi_l] = {first}<{ctype}>(); {acc}_i[mi_l] = -1; }}")
                self.body.writeline(f"mi_arg_soa_update<{ctype}, {str(rtype == 'argmax').lower()}>({acc}_v[mi_lane], "
                                    f"{acc}_i[mi_lane], static_cast<{ctype}>({value}), {self.index_str(self.rlinear)});")
                self.arg_accs.append((acc, acc_type))
            else:
                self.prefix.writeline(f"{acc_type} {acc}_lanes[{lanes}];")
                self.prefix.writeline(f"for (int mi_l = 0; mi_l < {used}; mi_l++) {acc}_lanes[mi_l] = {init};")
                self.body.writeline(f"{lane} = {update};")
            self.accumulators.append((acc, acc_type, init, combine))
        if rtype == "welford_reduce":
            return (f"{acc}.mean", f"{acc}.m2", f"{acc}.weight")
        if rtype in ("argmax", "argmin"):
            return f"{acc}.index"
        return acc

    # -- structure -----------------------------------------------------------------------

    def split_loops(self) -> list[Loop]:
        n_outer = len(self.group.outer)
        loops: list[Loop] = []
        for node in self.group.nodes:
            pw_inner, red = node.pw_ranges[n_outer:], node.red_ranges
            if loops and loops[-1].key() == (tuple(pw_inner), tuple(red)) and joins(loops[-1], node):
                loops[-1].nodes.append(node)
            else:
                loops.append(Loop([node], list(pw_inner), list(red)))
        return loops

    def generate(self) -> str:
        # a buffer both read and written here (mutation targets) gets one in_out pointer
        reads = self.read_names()
        self.args.declare_inplace({n.node.mutates for n in self.group.nodes if n.node.mutates} & reads)
        self.args.declare_written_over(self.written_over)
        outer = list(self.group.outer)
        n_outer = len(outer)
        loops = self.split_loops()
        all_exprs = [e for n in self.group.nodes for e in n.read_writes.index_exprs]
        outer_vars = make_vars("x", n_outer)
        pure_pointwise = is_pure_pointwise(loops)
        merged_outer = (split_and_merge_dims if pure_pointwise else merge_dims)(outer_vars, outer, all_exprs, "x")
        # merged outer vars are renamed to avoid clashing with inner x-vars
        rename = {v: index_symbol(f"xo{i}") for i, v in enumerate(merged_outer.variables)}
        merged_outer = MergedDims([rename[v] for v in merged_outer.variables], merged_outer.sizes,
                                  {k: v.xreplace(rename) for k, v in merged_outer.substitution.items()})
        if pure_pointwise:
            merged_outer = in_store_order(merged_outer, self.group.nodes)
        outer_numel = sympy.Mul(*outer) if outer else sympy.Integer(1)
        inner_work = sum((sympy.Mul(*(lp.pw_inner + lp.red)) for lp in loops), sympy.Integer(0))
        self.scatters, self.scatter_depth, self.scatter_chunks, may_parallel = mutation_loops(self.group, merged_outer)
        # an element that loads many values (an unrolled window) is several elements' work
        loads = max(len(n.read_writes.reads) for n in self.group.nodes)
        parallel, self.parallel_if = parallel_decision(outer_numel * sympy.Max(inner_work, 1) * -(-loads // 4))
        parallel = parallel and may_parallel
        code = CodeBuffer()
        code.writeline(f"// Source nodes: {', '.join(self.group.names())}")
        for n in self.group.nodes:
            code.writeline(f"//   {n.node.name}: {type(n.node.data).__name__} {', '.join(sorted(n.node.origins))}")
        self.tile_var = outer_lane_var(self.group, merged_outer)
        if self.tile_var is not None:
            other = math.prod(V.graph.sizevars.hint(size) for size in merged_outer.sizes[:-1])
            width = planning_size(merged_outer.sizes[-1], OUTER_LANE_WIDTHS[0] * torch.get_num_threads())
            self.outer_lanes = outer_lane_width(width, torch.get_num_threads(), other)
        if n_outer == 0 and parallel:
            loops = fold_siblings(loops)
        if n_outer == 0 and parallel and full_reduction_first(loops):
            self.local = {b: f"mi_local{i}" for i, b in enumerate(register_results(self.group, self.internal))}
            emit_full_reduction(self, code, loops)
        elif splits_rows(self, merged_outer, loops, parallel):
            emit_split_rows(self, code, merged_outer, loops)
        else:
            if self.tile_var is None and len(loops) > 1:
                self.local = {b: f"mi_local{i}" for i, b in enumerate(register_results(self.group, self.internal))}
                self.rows = {b: (f"mi_row{i}", numel) for i, (b, numel) in enumerate(self.row_candidates.items())}
                loops = fold_into_reductions(loops, exact_rows(self.group, self.rows))
            elif self.tile_var is None:
                taken = set(self.written_over) | set(self.written_over.values())  # (storage planned already)
                self.forwarded = {b: {} for b in forwarded_results(self.group, self.internal) if b not in taken}
            self.emit_outer(code, merged_outer, loops, parallel)
        return self.render(code)

    def emit_outer(self, code: CodeBuffer, outer: MergedDims, loops: list[Loop], parallel: bool) -> None:
        n = len(outer.variables)
        pure_pointwise = is_pure_pointwise(loops)
        if pure_pointwise and not self.scatters and needs_2d_tiles(self.group, outer):
            emit_tiled_2d(self, code, outer, loops[0], parallel)
            return
        if reads_rows_in_streams(self, outer, loops, parallel):
            emit_row_streams(self, code, outer, loops)
            return
        start, gather_rows = len(code.lines), False
        self.may_stream = self.tile_var is None and not self.scatters
        # a pure pointwise nest whose output may stream leaves its innermost loop to
        # _emit_pointwise_nest; a flat one then loops over chunks of FLAT_CHUNK elements
        # (so does one whose calls may run in batches, cpp_calls.py)
        streams = self.may_stream and (n > 1 or parallel) and streamable_writes(self)
        small_inner = pure_pointwise and n >= 2 and self.tile_var is None and not self.scatters and vectorizes_outside(outer.sizes)
        self.outside_var = outer.variables[-2] if small_inner else None  # the loop vectorized outside the innermost
        chunk = inner_chunk(outer.sizes[-1]) if parallel and self.scatter_chunks else 0
        defer = pure_pointwise and n >= 1 and not small_inner and not chunk and (
            streams or may_batch(self, group_origins(self.group)) or (n > 1 and self.tile_var is None and not self.scatters))
        opened = 0
        if chunk:  # the innermost loop's chunks across threads, the other loops inside each
            opened = open_chunks(code, outer.sizes[-1], chunk)
        for i, (var, size) in enumerate(zip(outer.variables, outer.sizes)):
            self.range_of[var] = size
            innermost = i == n - 1
            if defer and innermost:
                opened += self._defer_innermost(code, var, size, parallel and n == 1)
                continue
            if i == 0 and parallel and not chunk:
                if pure_pointwise and n == 1:
                    code.writeline("#pragma omp parallel for simd schedule(static)")
                else:
                    collapse = min(n - 1 if pure_pointwise else n, self.scatter_depth or n)
                    if collapse >= 1:
                        code.writeline(f"#pragma omp parallel for schedule(static){f' collapse({collapse})' if collapse > 1 else ''}")
            if small_inner and i == n - 2:
                opened += open_vector_loop_outside(code, var, size, parallel)
                continue
            if chunk and innermost:  # (written around the body below, its invariant lines before it)
                continue
            if innermost and pure_pointwise and not (parallel and n == 1) and not small_inner:
                code.writeline("#pragma omp simd")
            if var == self.tile_var:
                code.writeline(f"for (int64_t mi_tile = 0; mi_tile < {cpp_index(size)}; mi_tile += {self.outer_lanes})")
                code.writeline("{")
                code._indent += 1
                code.writeline(f"const int64_t mi_count = mi_min_i64({self.outer_lanes}, {cpp_index(size)} - mi_tile);")
                opened += 1
                continue
            code.writeline(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++)")
            code.writeline("{")
            code._indent += 1
            opened += 1
        for b, v in self.local.items():
            code.writeline(f"{CPP_STORAGE_TYPES[V.graph.get_dtype(b)]} {v}[1];  // {b}, kept in a local")
        declare_rows(code, self.rows)
        if len(loops) == 1 and chunk:
            emit_chunk_loop(code, outer.variables[-1], f"mi_min_i64(mi_c0 + {chunk}, {cpp_index(outer.sizes[-1])})",
                            lambda body: self.emit_loop(body, outer, loops[0]), self)
        elif len(loops) == 1:
            self.emit_loop(code, outer, loops[0])
            if n == 1 and pure_pointwise and not defer and outer.sizes[0].is_Integer and outer.sizes[0] > 0:
                opened += hoist_flat_invariants(code, start, str(outer.variables[0]))
            inner_size = outer.sizes[-1] if n else None
            if pure_pointwise and n >= 2 and self.tile_var is None and isinstance(inner_size, sympy.Integer):
                hoist_inner_invariants(self, code, start, str(outer.variables[-1]), int(inner_size))
                gather_rows = self.gathers or self.scatters
        else:
            self._emit_loop_functions(code, outer, loops)
        free_rows(code, self.rows)
        for _ in range(opened):
            code._indent -= 1
            code.writeline("}")
        if gather_rows:  # (once the loops are closed)
            prefetch_gathered_rows(self, code, start, *outer.variables[-2:], int(outer.sizes[-1]))
        self.may_stream, self.deferred_loop = False, None
        if self.streamed or self.thread_state:
            parallel_region(code.lines, start, self.thread_state, fence=self.streamed)
            self.thread_state = []

    def _defer_innermost(self, code: CodeBuffer, var: sympy.Symbol, size: Expr, flat_parallel: bool) -> int:
        """Leave the innermost loop to _emit_pointwise_nest (``deferred_loop``); a flat parallel
        one first loops over chunks of FLAT_CHUNK elements. Returns the loops opened."""
        if not flat_parallel:
            self.deferred_loop = (var, "0", cpp_index(size), size)
            return 0
        code.writeline("#pragma omp parallel for schedule(static)")
        code.writeline(f"for (int64_t mi_chunk = 0; mi_chunk < {cpp_index(size)}; mi_chunk += {FLAT_CHUNK})")
        code.writeline("{")
        code._indent += 1
        self.deferred_loop = (var, "mi_chunk", f"mi_min_i64(mi_chunk + {FLAT_CHUNK}, {cpp_index(size)})",
                              sympy.Min(size, FLAT_CHUNK))
        return 1

    def _emit_loop_functions(self, code: CodeBuffer, outer: MergedDims, loops: list[Loop]) -> None:
        """Each loop block of the outer iteration as its own function, called in order; the
        locals and row scratch arrays it shares with the others passed as pointers."""
        # a function per block: GCC then vectorizes every block (inlined together, later
        # blocks lose vectorization to jump threading)
        loop_vars = [str(v) for v in outer.variables if v != self.tile_var]
        loop_vars += ["mi_tile", "mi_count"] if self.tile_var is not None else []
        kept = list(self.local.items()) + [(b, v) for b, (v, _) in self.rows.items()]
        params = ", ".join([f"const int64_t {v}" for v in loop_vars]
                           + [f"{CPP_STORAGE_TYPES[V.graph.get_dtype(b)]}* __restrict__ {v}" for b, v in kept])
        loop_vars += [v for _, v in kept]
        blocks, shapes = [], []
        for loop in loops:
            block = CodeBuffer()
            self.emit_loop(block, outer, loop)
            blocks.append(block)
            shapes.append(self.loop_shape)
            fn = f"{self.name}_loop{len(self.helpers)}"
            self.helpers.append((fn, params, block))
            call_vars = ", ".join(loop_vars)
            code.writeline(f"{fn}({ARGS_PLACEHOLDER}{', ' + call_vars if call_vars else ''});")
        prefetch_row_stores(blocks[0], shapes[0], shapes[1:], self.range_of)
        if outer.variables and self.tile_var is None and not self.indirect:  # (no computed index to repeat)
            prefetch_next_rows(blocks, shapes, outer.variables[-1], self.range_of)

    def emit_loop(self, code: CodeBuffer, outer: MergedDims, loop: Loop, thread_chunk: bool = False) -> None:
        """Emit one loop block: prefix (accumulators), inner loop nest, suffix (stores).

        Reductions accumulate into ``LANES`` independent lanes over the innermost reduction
        variable, combined after the loop: every combine (NaN-propagating max, welford,
        argmax) vectorizes that way and the order is fixed, so results are deterministic.
        With ``thread_chunk`` the first reduction range is split across OpenMP threads.
        """
        self.body, self.prefix, self.suffix = CodeBuffer(), CodeBuffer(), CodeBuffer()
        self.body_stores = []
        self.body_store_names = []
        self.body_loads = []
        self.cse = CSE()
        self.cse.counter = self._tmp_counter()
        n_outer = len(self.group.outer)
        pw_vars = make_vars("x", len(loop.pw_inner), start=n_outer)
        red_vars = make_vars("r", len(loop.red))
        # a pointwise node folded into a reduction loop (fold_into_reductions) runs on its
        # reduction variables
        folded = {node.node.name: dict(zip(make_vars("x", len(node.pw_ranges))[n_outer:], red_vars))
                  for node in loop.nodes if loop.red and not node.is_reduction()}
        exprs = [e.xreplace(folded.get(node.node.name, {})) for node in loop.nodes for e in node.read_writes.index_exprs]
        merged_pw = merge_dims(pw_vars, loop.pw_inner, exprs, "xi")
        red_order = reduction_read_order(red_vars, loop.red, loop.nodes)
        merged_red = merge_dims([red_vars[i] for i in red_order], [loop.red[i] for i in red_order], exprs, "ri")
        if not loop.red and self.tile_var is None and not any(n.is_reduction() or n.node.mutates for n in loop.nodes):
            merged_pw = in_store_order(merged_pw, loop.nodes)  # (a pointwise loop of a kernel of several)
        if not merged_red.variables and any(n.is_reduction() for n in loop.nodes):
            merged_red = MergedDims([index_symbol("ri0")], [sympy.Integer(1)], {})  # reduce 1 element
        self.substitution = outer.substitution | merged_pw.substitution | merged_red.substitution
        self.source_ranges = dict(zip(make_vars("x", n_outer) + pw_vars + red_vars, [*self.group.outer, *loop.pw_inner, *loop.red]))
        for v, s in zip(merged_pw.variables + merged_red.variables, merged_pw.sizes + merged_red.sizes):
            self.range_of[v] = s
        self.rlinear = linear_index(red_vars, loop.red)
        self.accumulators = []
        self.last_red_size = merged_red.sizes[-1] if merged_red.sizes else sympy.Integer(1)
        welford = any(n.is_reduction() and n.node.data.reduction_type == "welford_reduce" for n in loop.nodes)
        narrow = loop_narrow_lanes(loop)  # (a bool mask: a vector of bools)
        self.least_stream_width = least_stream_width(loop, outer if self.sub_rows else None)
        self.lanes, self.lane_slots = inner_lanes(self.last_red_size, thread_chunk, welford, narrow)
        if self.sub_rows:  # (lanes for each sub-row of each stream's row)
            self.lane_slots *= self.sub_rows[1]
        self.wide_lanes = wide_lanes(self.last_red_size, self.lanes, thread_chunk, welford) if self.tile_var is None else 0
        if self.wide_lanes:  # the lanes of this row, chosen at run time; the arrays hold the most
            self.lane_slots = self.wide_lanes
            self.prefix.writeline(f"const int64_t mi_wl = {cpp_index(self.last_red_size)} >= {WIDE_ROW} ? "
                                  f"{self.wide_lanes} : {self.lanes};")
        self.welford_rw = len(merged_red.variables) == 1 and self.tile_var is None
        self.welford_accs: list[tuple[str, str]] = []  # (accumulator, compute type) kept as arrays
        self.tiled_welford: list[tuple[str, str]] = []  # the same, of outer lanes (with weights)
        self.arg_accs: list[tuple[str, str]] = []  # (accumulator, MiArg type) kept as value and index arrays
        innermost = ([self.tile_var] if self.tile_var is not None else merged_red.variables or merged_pw.variables
                     or outer.variables)
        self.innermost = str(innermost[-1]) if innermost else None
        with V.set_ops(CppOps(self)), V.set_kernel(self):
            for node in loop.nodes:
                if node.node.name in folded:
                    node.run(make_vars("x", n_outer) + red_vars, [])
                else:
                    node.run(make_vars("x", n_outer) + pw_vars, red_vars)
        self._tmp_counter_value = self.cse.counter
        code.writeline("{")
        code._indent += 1
        code.splice(self.prefix)
        if self.tile_var is not None:
            self._emit_tiled(code, merged_pw, merged_red)
        elif merged_red.variables:
            self._emit_lane_nest(code, merged_red, thread_chunk)
        else:
            self._emit_pointwise_nest(code, merged_pw)
        inner = merged_red if merged_red.variables else merged_pw
        self.loop_shape = (LoopShape(inner.variables[0], inner.sizes[0], self.lanes if merged_red.variables else 0,
                                     self.body_stores, self.body_loads, self.wide_lanes if merged_red.variables else 0)
                           if len(inner.variables) == 1 and self.tile_var is None else None)
        if thread_chunk and self.tile_var is None:
            for acc, _, _, _ in self.accumulators:
                code.writeline(f"{acc}_partial[mi_tid] = {acc};")
        elif self.tile_var is None and not self.row_streams:  # (rows in streams store in the nest)
            code.splice(self.suffix)
        code._indent -= 1
        code.writeline("}")

    def _emit_tiled(self, code: CodeBuffer, pw: MergedDims, red: MergedDims) -> None:
        """Lanes across ``LANES`` consecutive values of the tile variable (outer-lane mode)."""
        lane_loop = "for (int64_t mi_lane = 0; mi_lane < mi_count; mi_lane++)"
        bind = f"const int64_t {self.tile_var} = mi_tile + mi_lane;"
        if not red.variables:
            if lanes_go_inside(self, pw):
                emit_lanes_inside(self, code, pw, lane_loop, bind)
                return
            if not pw.variables:
                code.writeline("#pragma omp simd")
            code.writeline(lane_loop)
            with code.indent():
                code.writeline(bind)
                self._emit_pointwise_nest(code, pw)
            return
        for i, (var, size) in enumerate(zip(red.variables, red.sizes)):
            if i == 0 and self.split_rows:  # this thread's chunk of the rows
                code.writeline(f"const int64_t mi_chunk = ({cpp_index(size)} + mi_nthr - 1) / mi_nthr;")
                code.writeline(f"const int64_t mi_end = mi_min_i64({cpp_index(size)}, (mi_tid + 1) * mi_chunk);")
                code.writeline("int64_t mi_row = mi_tid * mi_chunk;")
                if len(red.variables) == 1:
                    emit_row_group(self, code, var, lane_loop, bind)
                code.writeline(f"for (int64_t {var} = mi_row; {var} < mi_end; {var}++)")
            else:
                code.writeline(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++)")
            code.writeline("{")
            code._indent += 1
        emit_lane_step(self, code, lane_loop, bind)
        for _ in red.variables:
            code._indent -= 1
            code.writeline("}")
        for acc, ctype in self.tiled_welford:
            code.writeline(f"MiWelford<{ctype}> {acc}_lanes[{self.outer_lanes}];")
            code.writeline("for (int64_t mi_lane = 0; mi_lane < mi_count; mi_lane++) "
                           f"{acc}_lanes[mi_lane] = MiWelford<{ctype}>{{{acc}_mean[mi_lane], {acc}_m2[mi_lane], {acc}_w[mi_lane]}};")
        if self.split_rows:
            width = paren(cpp_index(self.range_of[self.tile_var]))
            code.writeline("#pragma omp simd")
            code.writeline(lane_loop)
            with code.indent():
                for acc, *_ in self.accumulators:
                    code.writeline(f"{acc}_partial[mi_tid * {width} + mi_tile + mi_lane] = {acc}_lanes[mi_lane];")
            return
        code.writeline(lane_loop)
        with code.indent():
            code.writeline(bind)
            for acc, acc_type, _, _ in self.accumulators:
                code.writeline(f"{acc_type} {acc} = {acc}_lanes[mi_lane];")
            code.splice(self.suffix)

    def read_names(self) -> set[str]:
        return set().union(*(n.read_writes.read_names() for n in self.group.nodes))

    def _emit_pointwise_nest(self, code: CodeBuffer, dims: MergedDims) -> None:
        """The pointwise loops of ``dims`` around the body, the innermost one ``omp simd`` (or
        streamed); with no dims, the body itself, or emit_outer's deferred innermost loop."""
        if dims.variables:
            var, lo, hi, length = dims.variables[-1], "0", cpp_index(dims.sizes[-1]), dims.sizes[-1]
        elif self.deferred_loop is not None:
            var, lo, hi, length = self.deferred_loop
        else:
            code.splice(self.body)
            return
        for outer_var, size in zip(dims.variables[:-1], dims.sizes[:-1]):
            code.writeline(f"for (int64_t {outer_var} = 0; {outer_var} < {cpp_index(size)}; {outer_var}++)")
            code.writeline("{")
            code._indent += 1
        emit_innermost(self, code, var, lo, hi, length)
        for _ in dims.variables[:-1]:
            code._indent -= 1
            code.writeline("}")

    def _emit_lane_nest(self, code: CodeBuffer, dims: MergedDims, thread_chunk: bool) -> None:
        *outer_dims, last = list(zip(dims.variables, dims.sizes))
        # the scalar tail accumulates into its own variables: sharing lane 0 with the vector loop
        # keeps the lanes in memory across rows (short rows of window reductions: ~20% slower)
        tail = self._tail_body() if not self.welford_accs else None
        streams = stream_width(self) if self.row_streams else full_reduction_streams(self, thread_chunk, outer_dims)
        if tail is not None and not self.row_streams:
            for acc, acc_type, init, _ in self.accumulators:
                code.writeline(f"{acc_type} {acc}_tail = {init};")
        # a thread's chunk: of the first of several reduced dims, else of the lanes' own dim
        self.chunked = (outer_dims[0][1], 1) if outer_dims else (last[1], self.lanes)
        for i, (var, size) in enumerate(outer_dims):
            lo, hi = ("mi_begin", "mi_end") if thread_chunk and i == 0 else ("0", cpp_index(size))
            code.writeline(f"for (int64_t {var} = {lo}; {var} < {hi}; {var}++)")
            code.writeline("{")
            code._indent += 1
        var, size = last
        begin, end = ("mi_begin", "mi_end") if thread_chunk and not outer_dims else ("0", cpp_index(size))
        wide = self.wide_lanes
        lanes = "mi_wl" if wide else self.lanes
        if self.row_streams:  # (each row's lanes are its stream's)
            assert streams, "rows in streams need plain lanes (cpp_read_streams.reads_rows_in_streams)"
            lanes = streams
        code.writeline(f"const int64_t mi_main = {begin} + (({end} - {begin}) / {lanes}) * {lanes};")
        if streams:
            emit_stream_steps(code, self, str(var), begin, streams, self.row_streams)
        if self.row_streams:
            finish_rows(self, code, str(var), end, tail, streams, self.row_streams)
            return
        spans = [(begin, "mi_main", self.body.lines)]
        if not streams and not wide and begin == "0":  # (the row's tests may cut its loop)
            parts = pieces(self, var, size, self.body.lines, align=self.lanes)
            if parts:  # a concatenation along the reduced dim: a loop per part, its tests constant there
                spans = [(str(lo), str(hi), lines) for lo, hi, lines in parts]
                spans[-1] = (spans[-1][0], "mi_main", spans[-1][2])  # (past mi_main, the tail keeps its tests)
            else:  # a causal mask: before and after the diagonal
                spans = diagonal_spans(self, code, var, size, self.body.lines, self.lanes) or spans
        for i, width in enumerate([] if streams else [wide, self.lanes] if wide else [self.lanes]):
            if wide:
                code.writeline(f"{'else' if i else f'if (mi_wl == {wide})'}")
                code.writeline("{")
                code._indent += 1
            for lo, hi, lines in spans:
                code.writeline(f"for (int64_t mi_base = {lo}; mi_base < {hi}; mi_base += {width})")
                code.writeline("{")
                with code.indent(open_brace=False):
                    if self.welford_accs:
                        code.writeline(f"const double mi_rw = 1.0 / static_cast<double>((mi_base - {begin}) / {width} + 1);")
                    lane_loop(code, str(var), width, lines)
                code.writeline("}")
            if wide:
                code._indent -= 1
                code.writeline("}")
        welford = {acc for acc, _ in self.welford_accs}
        for acc, ctype in self.welford_accs:  # (every lane has seen the same count)
            emit_welford_merge(code, acc, ctype, lanes, f"static_cast<{ctype}>((mi_main - {begin}) / {lanes})")
        code.writeline(f"for (int64_t {var} = mi_main; {var} < {end}; {var}++)")
        with code.indent():
            code.writeline("const int64_t mi_lane = 0;")
            if tail is not None:
                code.splice(tail)
            else:
                if welford:  # lane 0 holds all (mi_main - begin) values so far
                    code.writeline(f"const double mi_rw = 1.0 / static_cast<double>({var} - {begin} + 1);")
                code.splice(self.body)
        for _ in outer_dims:
            code._indent -= 1
            code.writeline("}")
        for acc, ctype in self.welford_accs:
            code.writeline(f"MiWelford<{ctype}> {acc} = MiWelford<{ctype}>{{{acc}_mean[0], {acc}_m2[0], "
                           f"static_cast<{ctype}>({end} - {begin})}};")
        for acc, acc_type in self.arg_accs:
            code.writeline(f"{acc_type} {acc}_lanes[{self.lane_slots}];")
            code.writeline(f"for (int mi_l = 0; mi_l < {'mi_wl' if wide else self.lane_slots}; mi_l++) "
                           f"{acc}_lanes[mi_l] = {acc_type}{{{acc}_v[mi_l], {acc}_i[mi_l]}};")
        for acc, acc_type, _, combine in self.accumulators:
            if acc in welford:
                continue
            if wide:  # (the lanes this row took at run time)
                pair = combine.format(a=f"{acc}_lanes[mi_l]", b=f"{acc}_lanes[mi_l + mi_w]")
                code.writeline("for (int mi_w = mi_wl / 2; mi_w > 0; mi_w /= 2)")
                with code.indent():
                    code.writeline("#pragma omp simd")
                    code.writeline(f"for (int mi_l = 0; mi_l < mi_w; mi_l++) {acc}_lanes[mi_l] = {pair};")
            else:
                emit_pairwise_tree(code, f"{acc}_lanes", self.lane_slots, combine)
            code.writeline(f"{acc_type} {acc} = {acc}_lanes[0];")
            if tail is not None:
                code.writeline(f"{acc} = {combine.format(a=acc, b=f'{acc}_tail')};")

    def _tail_body(self) -> CodeBuffer:
        """The loop body with every accumulator lane replaced by the accumulator's scalar tail."""
        tail = CodeBuffer()
        for line in self.body.lines:
            for acc, *_ in self.accumulators:
                line = line.replace(f"{acc}_lanes[mi_lane]", f"{acc}_tail")
                line = line.replace(f"{acc}_v[mi_lane]", f"{acc}_tail.value").replace(f"{acc}_i[mi_lane]", f"{acc}_tail.index")
            tail.lines.append(line)
        return tail

    def _tmp_counter(self) -> int:
        return getattr(self, "_tmp_counter_value", 0)

    def combine_partials(self, code: CodeBuffer, partial: Callable[[str, str], str]) -> None:
        """Each accumulator from its per-thread partials (``partial(acc, thread)``), combined
        in thread order: the result does not depend on timing."""
        for acc, acc_type, _, combine in self.accumulators:
            code.writeline(f"{acc_type} {acc} = {partial(acc, '0')};")
            code.writeline(f"for (int mi_t = 1; mi_t < mi_nt; mi_t++) {acc} = {combine.format(a=acc, b=partial(acc, 'mi_t'))};")

    def render(self, code: CodeBuffer) -> str:
        return render_unit(self, code)


def _masked_index(mask: str, index_str: str, index: Expr, vector_var: sympy.Symbol | None) -> str:
    """A unit-stride index as a select (GCC turns it into a masked vector load); any other
    as a bitwise select (a gather: GCC has no strided masked load). In a loop vectorized
    outside the innermost one (``vector_var``), unit stride along that loop: GCC 12 -O3
    miscompiled a masked load of stride 2 there (a pad of a (5, 2) sum read zeros for a row)."""
    expr = sympy.sympify(index)
    unit = expr.coeff(vector_var) == 1 if vector_var is not None else any(expr.coeff(v) == 1 for v in expr.free_symbols)
    if unit:
        return f"{mask} ? {index_str} : 0"
    return f"mi_masked_index({mask}, {index_str})"


__all__ = ["CppKernel", "kernel_name", "math"]
