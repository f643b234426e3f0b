"""Streaming (non-temporal) stores of a large output in a C++ pointwise loop.

An ordinary store first reads the line it writes (read-for-ownership) and leaves it in cache,
where it displaces the inputs. For an output of tens of MB neither helps: on a Xeon VM
``x + y`` over 4096^2 floats ran 7.0 ms with ordinary stores and 3.8 ms with streaming ones,
and a row sum reading the result right after still came out ahead (9.6 -> 7.5 ms). At 4 MB and
below the consumer then misses the cache the ordinary store would have hit, so only outputs of
``config.stream_store_min_bytes`` or more stream, and only from kernels too big for the
last-level cache (``min_footprint``): one that fits finds its data in cache when it runs again,
and its reader finds the output there. Kernels that gather (load through an index
that changes along the innermost loop) keep ordinary stores; a row read through one index per
row (embedding, index_select) streams, its index read and checked once before the row's loops
(``hoist_invariant_lines``). The rows of a transpose's staged tiles
stream (x.t() + y at 4096^2 in 256x128 tiles: 12.8-13.3 -> 5.2-5.9 ms).

The innermost loop over ``var`` in ``[lo, hi)`` becomes three: a head up to the first 64-byte
boundary of the output, whole lines of 16 floats (the body computes a line into a local array,
``mi_stream_store`` writes it), and a tail; head and tail store as before. A half or bfloat16
output's lines are computed as floats 64 at a time, rounded in a block and streamed
(``mi_stream_store_halves``/``_bf16s``: a bfloat16 ``x + y`` at 4096^2 1.21-1.27x, a half
softmax 1.03-1.16x, a bfloat16 layer_norm 0.95-1.11x, a half GELU, compute-bound, 0.97x). Non-temporal stores
are weakly ordered, so every thread that ran such a loop issues ``mi_stream_fence`` before its
parallel region ends (``fence_parallel_region``).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import sympy
import torch

from minductor import config
from minductor.codegen.common import CodeBuffer, cpp_index, indent_of
from minductor.codegen.cpp_calls import BATCH, emit_call_block
from minductor.codegen.cpp_row_prefetch import plan_row_prefetch
from minductor.codegen.loop_shapes import LINE, line_step
from minductor.ir.indexing import affine_coeffs, index_symbol, simplify_index
from minductor.runtime.cache import last_level_cache_bytes
from minductor.scheduler.deps import MemoryDep
from minductor.virtualized import V

if TYPE_CHECKING:
    from minductor.codegen.cpp import CppKernel

Expr = sympy.Expr


@dataclasses.dataclass
class StreamStore:
    arg: str  # the output pointer
    index: Expr  # in the loop variables, unit stride along the streamed one
    line: str  # the body's store statement
    condition: str = ""  # streams only where this holds at run time (symbolic sizes)
    width: int = LINE  # lanes of the main loop: whole lines (loop_shapes.line_step)
    bits16: str = ""  # "half" or "bf16": the line's floats rounded in a block, then streamed


# outputs that may stream, and the prelude's block store of a line of floats rounded to each
# 16-bit type (the float32 line goes out as it is): a bfloat16 layer_norm at 4096^2 wrote its
# rows with ordinary stores, each line read before it was written
STREAMED_DTYPES = {torch.float32: "", torch.float16: "half", torch.bfloat16: "bf16"}
HALF_STEP = 64  # 16-bit values a streamed step computes: two lines, as cpp_f16c's blocks (one: 5% slower)


def min_footprint() -> int:
    """``config.stream_store_min_footprint`` in bytes (-1: 1.5 times the last-level cache)."""
    if config.stream_store_min_footprint >= 0:
        return config.stream_store_min_footprint
    return 3 * (last_level_cache_bytes() or 0) // 2


def footprint(kernel: CppKernel) -> Expr:
    """The bytes of every buffer ``kernel`` reads or writes: not those it writes for itself (kept in
    registers or rows), and a buffer written over another once."""
    group = kernel.group
    names = group.read_names() | (group.write_names() - kernel.internal - set(kernel.written_over))
    return sympy.Add(*(sympy.Mul(*V.graph.get_buffer(n).get_size()) * V.graph.get_dtype(n).itemsize for n in sorted(names)))


def streamable_buffer(kernel: CppKernel, name: str) -> bool:
    """A float32, half or bfloat16 buffer ``kernel`` does not read, of at least ``config.stream_store_min_bytes``,
    in a kernel of at least ``min_footprint()`` bytes in all, or of symbolic sizes
    (``stream_condition`` then decides at run time). A row kernel (with a reduction) streams
    whatever its footprint: its second pass reads the row from L1, and the output's lines in
    cache only displace it (layer_norm at 4096x1024, 32 MB: streamed 258 us, not 286; ``x * 2``
    at 2048^2, also 32 MB: streamed 248, not 182; one process, alternating)."""
    dtype = V.graph.get_dtype(name)
    if config.stream_store_min_bytes <= 0 or name in kernel.read_names() or dtype not in STREAMED_DTYPES:
        return False
    numel = sympy.Mul(*V.graph.get_buffer(name).get_size())
    if numel.is_number and int(numel) * dtype.itemsize < config.stream_store_min_bytes:
        return False
    if kernel.group.has_reduction():
        return True
    total = footprint(kernel)
    return not total.is_number or int(total) >= min_footprint()


def stream_condition(kernel: CppKernel, name: str) -> str:
    """The run-time condition for streaming a buffer of symbolic size ("" for a static one): a
    kernel compiled while a dynamic dim was small (Dynamo's hint, which the graph cache serves
    for every size) streams large outputs all the same."""
    numel, total = sympy.Mul(*V.graph.get_buffer(name).get_size()), footprint(kernel)
    itemsize = V.graph.get_dtype(name).itemsize
    tests = [] if numel.is_number else [f"{itemsize} * ({cpp_index(numel)}) >= {config.stream_store_min_bytes}"]
    if not total.is_number and min_footprint() > 0 and not kernel.group.has_reduction():
        tests.append(f"{cpp_index(total)} >= {min_footprint()}")
    return " && ".join(tests)


def streamable_writes(kernel: CppKernel) -> bool:
    """Whether ``kernel``'s group writes a buffer that ``stream_store`` could stream."""
    return any(isinstance(dep, MemoryDep) and streamable_buffer(kernel, dep.name)
               for node in kernel.group.nodes for dep in node.read_writes.writes)


def stream_store(kernel: CppKernel, var: sympy.Symbol, length: Expr) -> StreamStore | None:
    """The store of ``kernel``'s body to stream along ``var``, if any; it leaves ``body_stores``
    (which ``prefetch_row_stores`` would otherwise prefetch for writing). A ``streamable_buffer``
    stored through a pointer the kernel does not read either (``out_ptr``: not a buffer written
    over another, like softmax's result over its exps, whose lines are in cache already), by one
    unconditional statement of the body (not inside a block), contiguously along ``var``, in a
    loop of ``length`` >= 16 iterations (a line); none under masks, staged tiles or gathers."""
    if not kernel.may_stream or kernel.masks or kernel.stage is not None or kernel.gathers:
        return None
    if sympy.sympify(length).is_number and length < LINE:
        return None
    body = kernel.body.lines
    for name, (arg, index, _) in zip(kernel.body_store_names, kernel.body_stores):
        if not arg.startswith("out_ptr") or not streamable_buffer(kernel, name):
            continue
        coeffs = affine_coeffs(index, [var])
        if coeffs is None or coeffs[var] != 1:
            continue
        lines = [line for line in body if line.lstrip().startswith(f"{arg}[")]
        if len(lines) == 1 and lines[0].startswith(f"{arg}[") and lines[0].rstrip().endswith(";"):
            bits16 = STREAMED_DTYPES[V.graph.get_dtype(name)]
            if bits16 and not re.match(rf"\S+\[.*\] = mi_float_to_{bits16}\(.*\);\s*$", lines[0]):
                continue
            kernel.body_stores = [s for s in kernel.body_stores if s[0] != arg]
            step = line_step(dtype for *_, dtype in [*kernel.body_loads, *kernel.body_stores])
            step = max(step, HALF_STEP) if bits16 else step
            return StreamStore(arg, index, lines[0], stream_condition(kernel, name), step, bits16)
    return None


def emit_streamed_loop(code: CodeBuffer, var: sympy.Symbol, lo: str, hi: str, body: list[str],
                       store: StreamStore, range_of: dict[sympy.Symbol, Expr], calls: Sequence[int] = (),
                       loads: Sequence[tuple[str, Expr, torch.dtype]] = ()) -> None:
    """``for var in [lo, hi): body`` with ``store`` written ``store.width`` values (a line, or
    the lines of a vector of bools) at a time by streaming stores; with ``calls``
    (``cpp_calls.batchable_calls``), whole lines run in batches first. Of ``loads`` (the body's),
    a run read through a per-row index is prefetched ahead (``cpp_row_prefetch``)."""
    def at(value: str) -> str:
        expr = sympy.expand(store.index.xreplace({var: index_symbol(value)}))
        return cpp_index(simplify_index(expr, range_of))

    value = re.match(r"\S+\[.*\] = (.*);\s*$", store.line).group(1)
    if store.bits16:  # (the float, rounded with the line's block)
        value = value[len(f"mi_float_to_{store.bits16}("):-1]
    hoisted, body = ([], body) if calls else hoist_invariant_lines(body, str(var))
    rows = plan_row_prefetch(loads, hoisted, var, range_of)
    line_body = [f"mi_line[mi_lane] = {value};" if line is store.line else line for line in body]
    if hoisted:  # (what the loops would not have run, for an empty range, does not run either)
        code.writeline(f"if ({lo} < {hi})")
    code.writeline("{")
    with code.indent(open_brace=False):
        for line in hoisted + (rows.setup if rows else []):
            code.writeline(line)
        code.writeline(f"const int64_t mi_lo = {lo};")
        code.writeline(f"const int64_t mi_hi = {hi};")
        head = f"mi_min_i64(mi_hi, mi_lo + mi_stream_head(&{store.arg}[{at('mi_lo')}]))"
        # (where the condition fails, the head loop runs the whole range with ordinary stores)
        head = f"({store.condition}) ? {head} : mi_hi" if store.condition else head
        code.writeline(f"const int64_t mi_head = {head};")
        # (a loop over whole vectors of a narrow type, a bool mask, takes several lines a step)
        code.writeline(f"const int64_t mi_lines_end = mi_head + (mi_hi - mi_head) / {store.width} * {store.width};")
        simd_loop(code, var, "mi_lo", "mi_head", body)
        lines_from = "mi_head"
        if calls:
            _emit_batched_lines(code, var, line_body, list(calls), store, at, rows.step(BATCH) if rows else [])
            lines_from = "mi_batches_end"
        code.writeline(f"for (int64_t mi_line_at = {lines_from}; mi_line_at < mi_lines_end; mi_line_at += {store.width})")
        with code.indent():
            code.writeline(f"alignas(64) float mi_line[{store.width}];")
            _lane_loop(code, var, store.width, line_body)
            _store_lines(code, store, at("mi_line_at"), store.width)
            for line in rows.step(store.width) if rows else []:
                code.writeline(line)
        simd_loop(code, var, "mi_lines_end", "mi_hi", body)
    code.writeline("}")


_DEF = re.compile(r"auto (tmp\d+) = (.*);$")
_CHECK = re.compile(r"mi_bad \|= (.*);$")  # an index's bounds check
_NAME = re.compile(r"[A-Za-z_]\w*")
_STORE = re.compile(r"(\w+\[.*\] = .*|mi_bad \|= .*);$")


def hoist_invariant_lines(body: list[str], var: str | set[str]) -> tuple[list[str], list[str]]:
    """The body's definitions (and bounds checks of indices) that do not depend on ``var``, to
    run once before the loops, and the rest. An embedding row or an ``index_select`` reads its
    index and checks it once per row: computed per line of 16 lanes, inside the loop that
    streams, the suite's index_select took 10.8-11.2 ms against 2.3 ms hoisted (ordinary
    stores, the check left to the compiler: 4.4-5.2 ms; one process on a Xeon). Loads from a
    pointer the body also stores through stay in the loop; a body with any other statement (a
    lambda a mask calls only where it holds) hoists nothing. ``var``: a loop variable, or several."""
    if not all(_DEF.match(t) or _CHECK.match(t) or _STORE.match(t) for t in (line.strip() for line in body)):
        return [], body
    stored = {m.group(1) for line in body if (m := re.match(r"(\w+)\[", line.strip()))}
    varying, hoisted, rest = ({var} if isinstance(var, str) else set(var)) | {"mi_lane", "mi_line"}, [], []
    for line in body:
        text = line.strip()
        m = _DEF.match(text) or _CHECK.match(text)
        names = set(_NAME.findall(m.group(2) if m and m.re is _DEF else m.group(1) if m else ""))
        if m is None or names & (varying | stored):
            rest.append(line)
            if m is not None and m.re is _DEF:
                varying.add(m.group(1))
        else:
            hoisted.append(line)
    return hoisted, rest



def hoist_flat_invariants(code: CodeBuffer, start: int, var: str) -> int:
    """Run the invariant lines (``hoist_invariant_lines``) of the one flat loop over ``var``
    written to ``code.lines[start:]`` (its range known not empty, its closing braces not yet
    written) once before it; returns the braces it opened. GCC 12 hoists them itself, except
    out of loops it then cannot vectorize: AdamW's bias correction, ``pow(beta, step)``, kept the
    update of a 1024-element bias scalar, 22 us a call. A parallel loop's run in each thread,
    inside its parallel region: declared before the region, they are shared, read through the
    outlined function's argument struct, and a constant exponent stopped GCC vectorizing
    ``x ** 0.7`` (8.1 ms at 1024^2, 0.79 in the loop); left in the loop, the step's load could
    alias the stores (the struct's pointers are not restrict), and AdamW's update computed both
    ``pow(beta, step)`` per element, vectorized in double: 655 us for a 1024^2 parameter, 460
    with the region."""
    lines = code.lines
    head = next((i for i in range(start, len(lines)) if lines[i].strip().startswith(f"for (int64_t {var} = 0;")), None)
    if head is None:
        return 0
    body = [i for i in range(head + 1, len(lines)) if lines[i].strip() not in ("{", "}")]
    hoisted, _ = hoist_invariant_lines([lines[i] for i in body], var)
    if not hoisted:
        return 0
    pragma = lines[head - 1].strip()
    at = head - 1 if pragma.startswith("#pragma omp") else head
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    moved = {i for i in body if lines[i] in hoisted}
    kept = [line for i, line in enumerate(lines[at:], start=at) if i not in moved]
    if not pragma.startswith("#pragma omp parallel for"):
        lines[at:] = [indent + line.strip() for line in hoisted] + kept
        return 0
    inner = indent + "    "
    kept[0] = inner + pragma.replace("#pragma omp parallel for", "#pragma omp for", 1)
    lines[at:] = ([indent + "#pragma omp parallel", indent + "{"] + [inner + line.strip() for line in hoisted]
                  + kept[:1] + ["    " + line if line else line for line in kept[1:]])
    code._indent += 1
    return 1

def simd_loop_hoisting(code: CodeBuffer, var: sympy.Symbol, lo: str, hi: str, body: list[str]) -> None:
    """``simd_loop`` with the body's invariant lines (``hoist_invariant_lines``) run once before
    it, when the range is not empty. The compiler leaves cheap invariants in the loop, and GCC
    12 then did not vectorize a bilinear upsample's loop over one of them, the source row (a
    select between a float clamp and an int64 conversion): 9.2 ms scalar at (8, 64, 112, 112)."""
    hoisted, rest = hoist_invariant_lines(body, str(var))
    if not hoisted:
        simd_loop(code, var, lo, hi, body)
        return
    code.writeline(f"if ({lo} < {hi})")
    code.writeline("{")
    with code.indent(open_brace=False):
        for line in hoisted:
            code.writeline(line)
        simd_loop(code, var, lo, hi, rest)
    code.writeline("}")


def open_chunks(code: CodeBuffer, size: Expr, chunk: int) -> int:
    """Open a parallel loop over chunks of ``chunk`` iterations of a loop of ``size`` (its
    variable ``mi_c0``, the chunk's start); returns the loops opened."""
    code.writeline("#pragma omp parallel for schedule(static)")
    code.writeline(f"for (int64_t mi_c0 = 0; mi_c0 < {cpp_index(size)}; mi_c0 += {chunk})")
    code.writeline("{")
    code._indent += 1
    return 1


def emit_chunk_loop(code: CodeBuffer, var: sympy.Symbol, end: str, emit_body: Callable[[CodeBuffer], None],
                    kernel: CppKernel | None = None) -> None:
    """``for var in [mi_c0, end)`` around the body ``emit_body`` writes, the body's invariant
    lines before the loop: a scatter's chunk of columns it writes apart (``index_put`` of rows,
    ``index_add`` along dim 0), whose lanes never store to one place, so the loop is ``omp
    simd``; the suite's index_put_acc kernel ran 2.3 ms serially, 4.1 ms in chunks with the
    row's index read and checked per column, 1.5 ms with it hoisted (kernels alone, one
    process, a 2-core Xeon). With ``kernel`` (whose body ``emit_body`` emits), a row picked by a
    per-row index has the next row's chunk prefetched (``cpp_row_prefetch``)."""
    body = CodeBuffer()
    emit_body(body)
    lines = [line.strip() for line in body.lines if line.strip() not in ("{", "}")]
    hoisted, rest = hoist_invariant_lines(lines, str(var))
    for line in hoisted:
        code.writeline(line)
    rows = plan_row_prefetch([*kernel.body_loads, *kernel.body_stores], hoisted, var, kernel.range_of) if kernel else None
    if rows is not None and rows.next_row:
        written = {m.group(1) for line in rest if (m := re.match(r"(\w+)\[.*\] = ", line))}
        for line in rows.setup + rows.whole_next_row("mi_c0", end, written):
            code.writeline(line)
    code.writeline("#pragma omp simd")
    code.writeline(f"for (int64_t {var} = mi_c0; {var} < {end}; {var}++)")
    with code.indent():
        for line in rest if hoisted else body.lines:
            code.writeline(line)


def _emit_batched_lines(code: CodeBuffer, var: sympy.Symbol, line_body: list[str], calls: list[int],
                        store: StreamStore, at: Callable[[str], str], prefetches: list[str]) -> None:
    """Lines from ``mi_head`` to ``mi_batches_end`` in blocks of ``BATCH`` (cpp_calls.py)."""
    code.writeline(f"const int64_t mi_batches_end = mi_head + (mi_lines_end - mi_head) / {BATCH} * {BATCH};")
    code.writeline(f"for (int64_t mi_line_at = mi_head; mi_line_at < mi_batches_end; mi_line_at += {BATCH})")
    code.writeline("{")
    with code.indent(open_brace=False):
        first, rest = emit_call_block(code, line_body, calls, "mi_lane")
        code.writeline(f"alignas(64) float mi_line[{BATCH}];")
        _lane_loop(code, var, BATCH, first)
        _lane_loop(code, var, BATCH, rest)
        _store_lines(code, store, at("mi_line_at"), BATCH)
        for line in prefetches:
            code.writeline(line)
    code.writeline("}")


def _store_lines(code: CodeBuffer, store: StreamStore, at: str, width: int) -> None:
    """Stream the ``width`` floats of ``mi_line`` to ``store.arg[at]`` (rounded to 16 bits
    in a block first, for a 16-bit output)."""
    if store.bits16:
        kind = "halves" if store.bits16 == "half" else "bf16s"
        code.writeline(f"mi_stream_store_{kind}<{width}>(&{store.arg}[{at}], mi_line);")
    elif width > LINE:
        code.writeline(f"for (int64_t mi_k = 0; mi_k < {width}; mi_k += {LINE}) mi_stream_store(&{store.arg}[{at}] + mi_k, mi_line + mi_k);")
    else:
        code.writeline(f"mi_stream_store(&{store.arg}[{at}], mi_line);")


def _lane_loop(code: CodeBuffer, var: sympy.Symbol, width: int, body: list[str]) -> None:
    """``#pragma omp simd`` over the ``width`` lanes from ``mi_line_at``, ``var`` at each."""
    code.writeline("#pragma omp simd")
    code.writeline(f"for (int64_t mi_lane = 0; mi_lane < {width}; mi_lane++)")
    with code.indent():
        code.writeline(f"const int64_t {var} = mi_line_at + mi_lane;")
        for line in body:
            code.writeline(line)


def lane_loop(code: CodeBuffer, var: str, width: int | str, body: list[str]) -> None:
    """A reduction's ``omp simd`` loop over ``width`` lanes from ``mi_base`` (``var`` =
    ``mi_base + mi_lane``), the body's invariant lines (``hoist_invariant_lines``) before it,
    once per step. GCC 12 vectorized no such loop that took the log of a per-row value inside
    (kl_div's log-normalizer): kl_div at 1024^2, its reduction kernel 4.7 -> 0.30 ms."""
    hoisted, rest = hoist_invariant_lines(body, var)
    for line in hoisted:
        code.writeline(line)
    simd_loop(code, index_symbol("mi_lane"), "0", str(width), [f"const int64_t {var} = mi_base + mi_lane;", *rest])


def simd_loop(code: CodeBuffer, var: sympy.Symbol, lo: str, hi: str, body: list[str]) -> None:
    """``#pragma omp simd`` over ``var`` in ``[lo, hi)``; ``body``'s lines at their own level."""
    code.writeline("#pragma omp simd")
    code.writeline(f"for (int64_t {var} = {lo}; {var} < {hi}; {var}++)")
    with code.indent():
        for line in body:
            code.writeline(line)


def fence_parallel_region(lines: list[str], start: int) -> None:
    """``parallel_region`` whose threads fence their streaming stores."""
    parallel_region(lines, start, fence=True)


def parallel_region(lines: list[str], start: int, private: Sequence[str] = (), fence: bool = False) -> None:
    """Make the first ``omp parallel for`` at or after ``start`` (its loop nest the rest of
    ``lines``) a parallel region: each thread runs the ``private`` lines (declarations of state
    its iterations share: ``cpp_windows``' cached windows) before the (then ``nowait``) loop and,
    with ``fence``, fences its streaming stores after it. Without a parallel loop, the
    declarations go before the nest and the fence after it."""
    at = next((i for i in range(start, len(lines)) if lines[i].lstrip().startswith("#pragma omp parallel for")), None)
    if at is None:
        pad = indent_of(lines[start]) if start < len(lines) else ""
        lines[start:start] = [pad + line for line in private]
        if fence:
            lines.append("mi_stream_fence();")
        return
    pad = indent_of(lines[at])
    clauses = lines[at].strip()[len("#pragma omp parallel for"):]
    lines[at:at + 1] = [pad + "#pragma omp parallel", pad + "{", *[pad + line for line in private],
                        pad + "#pragma omp for" + clauses + " nowait"]
    lines.extend([pad + "mi_stream_fence();"] if fence else [])
    lines.append(pad + "}")
