"""Reductions that read memory along several far-apart streams at once.

A core reading one long run of memory gets less of the machine's bandwidth than one reading
several runs megabytes apart in step, a line of each in turn: more runs in flight for the
hardware prefetchers. On a Zen 4 VM (2 threads, C harness), a full sum of 64 MB read 1.16x
faster along 4 streams per thread (kernel alone 1.94 -> 1.54-1.69 ms; eager's 1.91-1.98),
and row sums of 4096x4096 floats 1.17x (4 far-apart rows in step: 1.55 -> 1.29-1.32 ms; 4
adjacent rows 1.42, 2 far-apart rows 1.35-1.39). A pointwise add streaming its output gained
3-7%, so only reductions of one streamed input per lane take it (a row reduction may also
read a vector the same for every row, which the caches hold: a matrix-vector product, as a
decoding step's linear layers are, (1, 4096) x (4096, 4096)^T 5.28 -> 2.74 ms on one thread).

Two shapes (``READ_STREAMS`` streams, the reduction's lanes shared out between them):
- a full reduction (``x.sum()``): each thread's chunk cut in ``READ_STREAMS`` parts;
- a row reduction (``x.sum(1)``) of long rows, one loop per row: each thread's rows cut in
  ``READ_STREAMS`` parts, a row of each reduced in step, each row finished (tail, combine,
  stores) on its own. A second, short outer loop (``SUB_ROWS_MAX`` at most) that the streamed
  read does not depend on runs inside each stream's step, on lanes of its own: a product of a
  few rows (a batch-2 decoding step's linear layers) summed column by column, each line of
  the matrix read once for all of them. (2, 4096) x (4096, 4096)^T on one thread, C harness,
  weight cold: rows apart 9.95 ms, column by column on one stream 6.59, in streams 4.11 (3
  rows: 14.4, 7.66, 4.56; 4 rows: 18.9, 8.86, 4.87). Eight rows on 4 streams need 32 vectors
  of accumulators and spilled (24.2 ms; MKL 9.8).

Each stream takes its own ``width`` of the lane arrays; the body the kernel generated for one
row runs with its accumulator lanes moved there. Each row's (each chunk's) order of operations
is fixed: results stay deterministic.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch

from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer, cpp_index
from minductor.codegen.cpp_lane_merge import emit_pairwise_tree
from minductor.codegen.cpp_stream import lane_loop
from minductor.codegen.loop_shapes import WIDE_ROW, Loop, MergedDims, long_row_lanes, planning_size
from minductor.ir.indexing import is_outer_var
from minductor.scheduler.deps import MemoryDep
from minductor.virtualized import V

READ_STREAMS = 4
# reductions whose lanes are plain accumulators combined pairwise and whose update is one
# instruction (max and min, NaN-propagating, were no faster: row amax 0.97-1.02x)
_PLAIN = ("sum", "prod")
# the least rows per stream (of each thread) that read in streams: a stream that runs past
# its thread's rows re-reads the thread's last row, so with fewer rows more are read twice
_ROWS_PER_STREAM = 2
SUB_ROWS_MAX = 4  # the longest second outer loop inside the streams (its lanes: SUB_ROWS_MAX x 4 vectors)


def least_stream_width(loop: Loop, outer: MergedDims | None = None) -> int:
    """The least lanes a stream of this loop block may have (0: it reads along one stream):
    of sums or products of values computed from one run of memory, a 32-byte vector of the
    narrowest values it reads (a row sum under a bool mask ran 1.7x slower on 16 lanes a
    stream; a bfloat16 row sum gained 1.12x on 16). Loops reading two runs (two buffers, or
    one at two places) already stream two at a time (a row sum of a product of two:
    0.95-0.98x in streams; a squared-error mean, a full reduction, 1.03-1.09x). With ``outer``
    (rows in streams with sub-rows), a read is per row when it depends on the first outer loop."""
    if not loop.red or not all(n.is_reduction() and n.node.data.reduction_type in _PLAIN for n in loop.nodes):
        return 0
    deps = [d for n in loop.nodes for d in n.read_writes.reads | n.read_writes.writes if isinstance(d, MemoryDep)]
    reads = {(d.name, d.index) for n in loop.nodes for d in n.read_writes.reads if isinstance(d, MemoryDep)}
    # of a row reduction, a read the same for every row (a matrix-vector product's vector) is
    # one small run the caches hold, not a stream
    if outer is None:
        per_row = {r for r in reads if any(is_outer_var(s) for s in r[1].free_symbols)}
    else:
        per_row = {r for r in reads if r[1].xreplace(outer.substitution).has(outer.variables[0])}
    if len(per_row or reads) != 1:
        return 0
    itemsize = min(V.graph.get_dtype(d.name).itemsize for d in deps)
    return _least_width(itemsize)


def _least_width(itemsize: int) -> int:
    """The least lanes of a stream over values of ``itemsize`` bytes: a 32-byte vector of them."""
    return max(8, 32 // itemsize)


def sub_rows_stream(itemsize: int, rows: int) -> bool:
    """Whether ``rows`` sub-rows of sums over values of ``itemsize`` bytes (the narrowest the
    sums read) fit the streams' lanes (``_width``): bfloat16 products of 3-4 rows do not (a
    stream of 16-bit values takes 16 lanes), and summed column by column on one stream they
    were slower than the GEMM library (a bf16 decoding MLP at batch 3: 10.1 ms, eager 7.0)."""
    return _width(long_row_lanes(), _least_width(itemsize), rows) > 0


def stream_width(kernel: Any) -> int:
    """The lanes of each stream in this loop's lane nest, or 0 to read along one."""
    lanes = kernel.lanes
    if not kernel.least_stream_width or kernel.wide_lanes or lanes % READ_STREAMS:
        return 0
    return _width(lanes, kernel.least_stream_width, kernel.sub_rows[1] if kernel.sub_rows else 1)


def _width(lanes: int, least: int, sub_rows: int) -> int:
    """Each stream's lanes (of each sub-row), or 0: a share of ``lanes``, halved while the
    streams' sub-rows would hold more than two rows' lanes (a vector register each, GCC spilled:
    4 rows on 4 streams of 16 floats in 256-bit vectors, 32 of them, 7.2 ms; of 8 floats, 5.1)."""
    width = lanes // READ_STREAMS
    while READ_STREAMS * sub_rows * width > 2 * lanes and width > least:
        width //= 2
    return width if width >= least and READ_STREAMS * sub_rows * width <= 2 * lanes else 0


def reads_rows_in_streams(kernel: Any, outer: MergedDims, loops: list[Loop], parallel: bool) -> bool:
    """Whether a kernel reducing long rows, parallel over its rows, reads its rows in streams
    (``emit_row_streams``): one loop that may (``least_stream_width``), then at most per-row
    epilogues (a mean's division); its rows one outer loop, or two with ``sub_rows``."""
    if not parallel or len(outer.variables) not in (1, 2) or kernel.tile_var is not None or kernel.scatters or kernel.rows:
        return False
    loop, *epilogues = loops
    if len(loop.red) != 1 or loop.pw_inner or not loop.red[0].is_Integer or int(loop.red[0]) < WIDE_ROW:
        return False
    count = sub_rows(outer, loop) if len(outer.variables) == 2 else 1
    if not count:
        return False
    least = least_stream_width(loop, outer if len(outer.variables) == 2 else None)
    if not least or not _width(long_row_lanes(), least, count) or any(lp.red or lp.pw_inner for lp in epilogues):
        return False
    rows = planning_size(outer.sizes[0], 1)
    return rows >= READ_STREAMS * _ROWS_PER_STREAM * torch.get_num_threads()


def sub_rows(outer: MergedDims, loop: Loop) -> int:
    """Of two outer loops, the second's length when it runs inside the streams of the first
    (0: it does not): at most ``SUB_ROWS_MAX``, and the one read that depends on the first
    loop (the streamed matrix) does not depend on it."""
    row, sub = outer.variables
    size = outer.sizes[1]
    if not size.is_Integer or not 2 <= int(size) <= SUB_ROWS_MAX:
        return 0
    indices = [d.index.xreplace(outer.substitution) for n in loop.nodes for d in n.read_writes.reads
               if isinstance(d, MemoryDep)]
    streamed = [index for index in indices if index.has(row)]
    return int(size) if streamed and not any(index.has(sub) for index in streamed) else 0


def emit_row_streams(kernel: Any, code: CodeBuffer, outer: MergedDims, loops: list[Loop]) -> None:
    """Each thread's rows in ``READ_STREAMS`` parts, row ``mi_r`` of every part reduced in
    step (``emit_stream_steps``; the rows then finish alone, ``finish_rows``), then the
    epilogues of each of those rows. A result kept in a local has a slot per stream (and
    sub-row)."""
    var, size = outer.variables[0], outer.sizes[0]
    loop, *epilogues = loops
    kernel.range_of[var] = size
    if len(outer.variables) == 2:
        kernel.range_of[outer.variables[1]] = outer.sizes[1]
        kernel.sub_rows = (str(outer.variables[1]), int(outer.sizes[1]))
    slots = READ_STREAMS * (kernel.sub_rows[1] if kernel.sub_rows else 1)
    rows = cpp_index(size)
    code.writeline("#pragma omp parallel")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline("const int64_t mi_tid = omp_get_thread_num(), mi_nthr = omp_get_num_threads();")
        code.writeline(f"const int64_t mi_lo = {rows} * mi_tid / mi_nthr, mi_hi = {rows} * (mi_tid + 1) / mi_nthr;")
        code.writeline(f"const int64_t mi_q = (mi_hi - mi_lo + {READ_STREAMS - 1}) / {READ_STREAMS};  // rows per stream")
        code.writeline("for (int64_t mi_r = 0; mi_r < mi_q; mi_r++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            for b, v in kernel.local.items():
                code.writeline(f"{CPP_STORAGE_TYPES[V.graph.get_dtype(b)]} {v}[{slots}];  // {b}, kept in a local")
            kernel.row_streams, kernel.local_slot = str(var), _slot(kernel)
            try:
                kernel.emit_loop(code, outer, loop)
                if epilogues:
                    opened = _open_stream_row(code, kernel, str(var))
                    with code.indent(open_brace=False):
                        for epilogue in epilogues:
                            kernel.emit_loop(code, outer, epilogue)
                    _close(code, opened)
            finally:
                kernel.row_streams, kernel.local_slot, kernel.sub_rows = None, "0", None
        code.writeline("}")
    code.writeline("}")


def _slot(kernel: Any) -> str:
    """The slot of this stream's row (and sub-row) in per-row arrays: ``mi_s``, or
    ``mi_s * M + sub`` with M sub-rows."""
    if kernel.sub_rows is None:
        return "mi_s"
    sub, count = kernel.sub_rows
    return f"mi_s * {count} + {sub}"


def _open_stream_row(code: CodeBuffer, kernel: Any, row: str) -> int:
    """Open a loop over the streams binding ``row`` to each one's row, skipping rows past the
    thread's last (and, with sub-rows, a loop over them inside): the braces it opened."""
    code.writeline(f"for (int64_t mi_s = 0; mi_s < {READ_STREAMS}; mi_s++)")
    code.writeline("{")
    code._indent += 1
    code.writeline(f"const int64_t {row} = mi_lo + mi_s * mi_q + mi_r;")
    code.writeline(f"if ({row} >= mi_hi) continue;")
    if kernel.sub_rows is None:
        code._indent -= 1
        return 1
    sub, count = kernel.sub_rows
    code.writeline(f"for (int64_t {sub} = 0; {sub} < {count}; {sub}++)")
    code.writeline("{")  # (the caller's indent puts the body inside this loop)
    return 2


def _close(code: CodeBuffer, opened: int) -> None:
    """Close the loops ``_open_stream_row`` opened (the last level's body at the level of the first)."""
    code.writeline("}")
    for _ in range(opened - 1):
        code._indent -= 1
        code.writeline("}")


def emit_stream_steps(code: CodeBuffer, kernel: Any, var: str, begin: str, width: int, row: str | None) -> None:
    """The lane loop of a reduction over ``[begin, mi_main)`` in ``READ_STREAMS`` streams of
    ``width`` lanes each, a step of every stream in turn. Of a full reduction, the streams are
    the range's parts; of rows (``row``: the row variable), the same range of each stream's row,
    and of each of its sub-rows in turn. Stream ``s`` (its sub-row ``j`` of M) accumulates into
    lanes ``[k * width, (k + 1) * width)`` of each lane array, ``k = s`` (``s * M + j``)."""
    if row is None:
        code.writeline(f"const int64_t mi_q = (mi_main - {begin}) / {READ_STREAMS};  // each stream's part")
        span, start = "mi_q", f"{begin} + mi_s * mi_q + mi_i"
    else:
        span, start = f"mi_main - {begin}", f"{begin} + mi_i"
    slot = _slot(kernel) if row is not None else "mi_s"
    body = list(kernel.body.lines)
    for acc, *_ in kernel.accumulators:
        body = [line.replace(f"{acc}_lanes[mi_lane]", f"{acc}_lanes[({slot}) * {width} + mi_lane]") for line in body]
    code.writeline(f"for (int64_t mi_i = 0; mi_i < {span}; mi_i += {width})")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(f"for (int64_t mi_s = 0; mi_s < {READ_STREAMS}; mi_s++)")
        code.writeline("{")
        with code.indent(open_brace=False):
            if row is not None:  # (a part past the thread's rows re-reads its last row, unstored)
                code.writeline(f"const int64_t {row} = mi_min_i64(mi_lo + mi_s * mi_q + mi_r, mi_hi - 1);")
            code.writeline(f"const int64_t mi_base = {start};")
            if row is not None and kernel.sub_rows is not None:
                sub, count = kernel.sub_rows
                code.writeline(f"for (int64_t {sub} = 0; {sub} < {count}; {sub}++)")
                with code.indent():
                    lane_loop(code, var, width, body)
            else:
                lane_loop(code, var, width, body)
        code.writeline("}")
    code.writeline("}")


def finish_rows(kernel: Any, code: CodeBuffer, var: str, end: str, tail: CodeBuffer, width: int, row: str) -> None:
    """After the steps: each stream's row (each sub-row), if the thread has it, runs its scalar
    tail from ``mi_main``, combines its lanes pairwise and stores (the loop's suffix)."""
    opened = _open_stream_row(code, kernel, row)
    with code.indent(open_brace=False):
        for acc, acc_type, init, _ in kernel.accumulators:
            code.writeline(f"{acc_type} {acc}_tail = {init};")
        code.writeline(f"for (int64_t {var} = mi_main; {var} < {end}; {var}++)")
        with code.indent():
            code.writeline("const int64_t mi_lane = 0;")
            code.splice(tail)
        for acc, acc_type, _, combine in kernel.accumulators:
            code.writeline(f"{acc_type}* {acc}_row = {acc}_lanes + ({_slot(kernel)}) * {width};")
            emit_pairwise_tree(code, f"{acc}_row", width, combine)
            code.writeline(f"{acc_type} {acc} = {combine.format(a=f'{acc}_row[0]', b=f'{acc}_tail')};")
        code.splice(kernel.suffix)
    _close(code, opened)


def full_reduction_streams(kernel: Any, thread_chunk: bool, outer_dims: list[tuple[sympy.Symbol, sympy.Expr]]) -> int:
    """The lanes of each stream of a full reduction's chunk, or 0 (see ``stream_width``)."""
    return stream_width(kernel) if thread_chunk and not outer_dims else 0
