"""Window gathers: the reads an innermost loop makes through a table of indices, done a vector
at a time as a load of contiguous elements and a permutation of its lanes.

A nearest upsample reads ``x[..., i // 2]`` along its innermost loop; a bilinear one reads two
columns per output, a reflect pad ``x[..., |i - 3|]``. The index depends only on the innermost
variable, so ``cpp_rewrites.hoist_inner_invariants`` computes it once per call into a table,
and the loop then read ``row[table[i]]``: a gather instruction, which fetches lane by lane.
The kernel of a nearest 2x upsample of (8, 64, 128, 128) ran 8.1 ms, for 168 MB (20 GB/s).

Yet the indices of a vector of outputs fall within a vector or two of the row. Each table gets
a plan, once per kernel call: per block of lanes, where the window starts and whether it is
one vector or two (``mi_window_plan`` in ``include/minductor_window.h``). Before the loop, each
row's elements are then read a block at a time, as a window load and one permutation, into a
buffer on the stack (``mi_window_gather``), and the loop reads the buffer. Blocks whose indices
spread wider (a roll's block across its wrap) are read lane by lane. The upsample's kernel: 2.8
ms, the streaming bandwidth.

A read qualifies when its index is the table's value plus an offset the innermost loop does
not change, and when a permutation of the element's size is one instruction (AVX-512: 4 and 8
bytes, and 2 with AVX512BW; AVX2: 4 bytes).

Each thread of the parallel region keeps its windows across the nest's iterations: a pool of
buffers per (tensor, table) with the row offset each holds (``kernel.thread_state``,
``cpp_stream.parallel_region``), and ``mi_window_fetch`` reads only the rows no buffer holds:
an upsample's consecutive output rows read the same source rows (2x bilinear: each pair twice,
and each row in two pairs). Kernels alone, interleaved, Zen 4, two threads, each window kept in
its own buffer: bilinear 2x of (8, 64, 128, 128) 9.6 -> 7.7 ms (one thread 30.3 -> 19.5),
align_corners to 300x300 15.0 -> 10.9, bicubic 2x of (4, 32, 128, 128) 13.8 -> 11.9, nearest 3x
of (8, 64, 96, 96) 5.2 -> 4.6; any buffer of the pool: bicubic 21.2 -> 19.5 (a slow phase),
bilinear within noise (9.7 -> 9.9; one thread 13.0 -> 12.2).
"""
from __future__ import annotations

import re
from typing import Any

import sympy

from minductor import config
from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer, cpp_index, indent_of
from minductor.ir.indexing import affine_coeffs, index_symbol, simplify_index
from minductor.runtime.cache import avx512_enabled, native_enables

# a loop's window buffers, on each thread's stack (a bicubic upsample reads 16 windows a row)
WINDOW_STACK_BYTES = 256 * 1024
_TABLE = re.compile(r"^\s*alignas\(64\) int32_t (mi_table\d+)\[\d+\];$")
_DEF = re.compile(r"^\s*auto (tmp\d+) = ")
_ACCESS = re.compile(r"\b(?:in|out|in_out)_ptr\d+\[([^\]]*)\]")


def window_sizes() -> frozenset[int]:
    """The element sizes (bytes) whose lanes one instruction permutes."""
    if avx512_enabled(config.cxx):
        return frozenset({2, 4, 8} if native_enables(config.cxx, "-mavx512bw") else {4, 8})
    return frozenset({4}) if native_enables(config.cxx, "-mavx2") else frozenset()


def stage_window_gathers(kernel: Any, code: CodeBuffer, start: int, inner: str, size: int, computed: set[str]) -> int:
    """Read through window gathers the loads of the loop nest in ``code.lines[start:]`` whose index
    is an int32 table's value (``hoist_inner_invariants``'s, built in those lines; one of
    ``computed``, of index math alone) plus an offset invariant in the innermost loop over
    ``inner`` (``size`` iterations). Returns how many."""
    sizes = window_sizes()
    tables = {m.group(1) for line in code.lines[start:] if (m := _TABLE.match(line))} & computed
    head = f"for (int64_t {inner} = 0; {inner} < {size}; {inner}++)"
    at = [i for i in range(start, len(code.lines)) if code.lines[i].strip() == head]
    if not sizes or not tables or len(at) != 1:
        return 0
    loop, pad = at[0], indent_of(code.lines[at[0]])
    end = next((j for j in range(loop + 1, len(code.lines)) if code.lines[j] == pad + "}"), len(code.lines))
    reads = {m.group(1): m.group(2) for line in code.lines[loop:end]
             if (m := re.match(rf"^\s*auto (tmp\d+) = (mi_table\d+)\[{inner}\];$", line)) and m.group(2) in tables}
    before = {m.group(1) for line in code.lines[start:loop] if (m := _DEF.match(line))}
    staged: list[str] = []
    pools: dict[tuple[str, str, Any], list[tuple[str, str]]] = {}  # (pointer, table, dtype) -> (window, offset)
    plans: dict[str, set[int]] = {}
    done: set[str] = set()
    stack_bytes = 0
    written = {arg for arg, _, _ in kernel.body_stores}
    for arg, index, dtype in kernel.body_loads:
        if not arg.startswith("in_ptr") or arg in written:  # (a scatter reads what it updates)
            continue
        via = [s for s in index.free_symbols if str(s) in reads]
        others = {str(s) for s in index.free_symbols if str(s).startswith("tmp")} - {str(s) for s in via}
        if dtype.itemsize not in sizes or len(via) != 1 or not others <= before or inner in map(str, index.free_symbols):
            continue
        coeffs = affine_coeffs(index, via)
        access = f"{arg}[{cpp_index(simplify_index(index, kernel.range_of))}]"
        if coeffs is None or coeffs[via[0]] != 1 or access in done:
            continue
        if stack_bytes + size * dtype.itemsize > WINDOW_STACK_BYTES:
            continue
        stack_bytes += size * dtype.itemsize
        window, table = f"mi_window{len(done)}", reads[str(via[0])]
        rows = [i for i in range(loop, end) if access in code.lines[i]]
        if not rows:
            continue
        for i in rows:
            code.lines[i] = code.lines[i].replace(access, f"{window}[{inner}]")
        offset = cpp_index(simplify_index(sympy.expand(index.xreplace({via[0]: 0})), kernel.range_of))
        pools.setdefault((arg, table, dtype), []).append((window, offset))
        plans.setdefault(table, set()).add(dtype.itemsize)
        done.add(access)
    if not done:
        return 0
    for i, ((arg, table, dtype), windows) in enumerate(pools.items()):
        staged += _fetch_windows(kernel, f"mi_pool{i}", arg, table, dtype, size, windows)
    first = loop - 1 if code.lines[loop - 1].strip().startswith("#pragma") else loop
    # with no gather left, the kernel loses no vector loop where gathers do not pay off, and
    # may stream its output
    indices = [m.group(1) for line in code.lines[loop:end] for m in _ACCESS.finditer(line)]
    if not any(set(re.findall(r"\btmp\d+\b", index)) - before for index in indices):
        kernel.gathers = False
        if len(done) == 1:
            _stream_output(kernel, code, first, loop, end, inner, size)
    # the buffers fill before the loop (and its pragma), in the scope of its invariant lines
    code.lines[first:first] = [pad + line for line in staged]
    for table, itemsizes in plans.items():
        built = next(i for i in range(start, len(code.lines)) if code.lines[i].strip().startswith("for") and f"{table}[" in code.lines[i])
        table_pad = indent_of(code.lines[built])
        code.lines[built + 1:built + 1] = [
            table_pad + line for s in sorted(itemsizes) for line in (
                f"alignas(64) int32_t {table}_plan{s}[{size} / (MI_WINDOW_BYTES / {s}) + 1];",
                f"mi_window_plan<{s}>({table}, {size}, {table}_plan{s});")]
    return len(done)


def _fetch_windows(kernel: Any, pool: str, arg: str, table: str, dtype: Any, size: int,
                   windows: list[tuple[str, str]]) -> list[str]:
    """The lines that point each of ``windows`` (name, row offset), read from ``arg`` through
    ``table``, at a buffer of the thread's ``pool`` holding it (``mi_window_fetch``): a row the
    last iteration read (into any of the pool's buffers) is not read again. The pool and the
    offsets its buffers hold go to ``kernel.thread_state``."""
    ctype, k = CPP_STORAGE_TYPES[dtype], len(windows)
    stride = -(-size * dtype.itemsize // 64) * 64 // dtype.itemsize  # (each buffer 64-byte aligned)
    kernel.thread_state += [f"alignas(64) {ctype} {pool}[{k * stride}];",
                            f"int64_t {pool}_at[{k}];",
                            f"for (int mi_k = 0; mi_k < {k}; mi_k++) {pool}_at[mi_k] = mi_lowest<int64_t>();"]
    want = ", ".join(offset for _, offset in windows)
    fetch = (f"mi_window_fetch<{ctype}, {k}>({arg}, {table}, {table}_plan{dtype.itemsize}, {size}, {stride}, "
             f"{pool}, {pool}_at, mi_want, {pool}_got);")
    return [f"const {ctype}* {pool}_got[{k}];",
            "{",
            f"    const int64_t mi_want[{k}] = {{{want}}};",
            f"    {fetch}",
            "}",
            *[f"const {ctype}* __restrict__ {window} = {pool}_got[{w}];" for w, (window, _) in enumerate(windows)]]


def _stream_output(kernel: Any, code: CodeBuffer, first: int, loop: int, end: int, inner: str, size: int) -> None:
    """Rewrite the plain loop in ``code.lines[first:end + 1]`` as a streamed one, when it stores a
    large output contiguously (``cpp_stream.stream_store``; no gather now keeps it from that).
    Only loops that move values, one window read per output: a nearest upsample of (8, 64,
    128, 128), which writes four times what it reads, ran its kernel in 1.75-2.3 ms instead of
    2.55-4.0; a bilinear one, four window reads blended, in 5.8-6.5 ms instead of 5.2-5.5 (the
    streamed loop's line buffer costs arithmetic; C++ harness of the kernels, alternating). With
    the windows kept across rows, streamed again on Zen 4: bilinear 2x 0.91-0.93x the time in
    three runs and 1.10x in a fourth, bilinear to rows of 300 1.62x: still plain stores."""
    from minductor.codegen.cpp_stream import emit_streamed_loop, stream_store

    var = index_symbol(inner)
    if end >= len(code.lines) or code.lines[end].strip() != "}" or code.lines[loop + 1].strip() != "{":
        return
    store = stream_store(kernel, var, sympy.Integer(size))
    if store is None:
        return
    body = [line.strip() for line in code.lines[loop + 2:end]]
    body = [store.line if line == store.line.strip() else line for line in body]
    out = CodeBuffer()
    emit_streamed_loop(out, var, "0", str(size), body, store, kernel.range_of)
    pad = indent_of(code.lines[loop])
    code.lines[first:end + 1] = [pad + line if line else line for line in out.lines]
    kernel.streamed = True
