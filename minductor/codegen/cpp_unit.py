"""A C++ kernel's translation unit: its entry function (``extern "C"``, pointer arguments in
call order, symbolic sizes, the error flag) and its loop functions, optionally marked for a
split over parallel compile units (``MI_PART`` in the prelude, see runtime/cache.py)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from minductor import config
from minductor.codegen.common import CPP_STORAGE_TYPES, CodeBuffer
from minductor.codegen.cpp_f16c import convert_halves_in_blocks
from minductor.codegen.cpp_rewrites import only_cheap_calls
from minductor.codegen.cpp_split_rows import THREADS_LINE
from minductor.runtime.cache import narrow_loads_stream_faster, vector_gathers_pay_off
from minductor.sizevars import kernel_symbols
from minductor.virtualized import V

if TYPE_CHECKING:
    from minductor.codegen.cpp import CppKernel

ARGS_PLACEHOLDER = "MI_KERNEL_ARGS"  # the entry function's arguments, in calls to loop functions


def render_unit(kernel: CppKernel, code: CodeBuffer) -> str:
    """The source of ``kernel`` whose entry function's body is ``code`` (sets ``kernel.size_args``)."""
    params, names = [], []
    for buf, arg, is_out in kernel.args.call_order():
        ctype = CPP_STORAGE_TYPES[V.graph.get_dtype(buf)]
        params.append(f"{ctype}* __restrict__ {arg}" if is_out else f"const {ctype}* __restrict__ {arg}")
        names.append(arg)
    # symbolic sizes (Dynamo's s0, s1...) are passed as int64_t arguments
    text = "\n".join(code.lines + [ln for _, _, block in kernel.helpers for ln in block.lines])
    kernel.size_args = kernel_symbols(text)
    params += [f"const int64_t {s}" for s in kernel.size_args]
    names += kernel.size_args
    if kernel.uses_error_flag:
        params.append("int64_t* mi_err")
        names.append("mi_err")
    flag = kernel.uses_error_flag
    # (a scatter whose innermost loop writes apart keeps its `omp simd`: no two lanes store to one place)
    if (kernel.scatters and not kernel.scatter_chunks) or (kernel.gathers and not vector_gathers_pay_off()):
        code.lines = _without_simd(code.lines)
        kernel.helpers = [(fn, extra, _buffer(_without_simd(block.lines))) for fn, extra, block in kernel.helpers]
    if any(f"mi_{k}_to_float(" in text or f"mi_float_to_{k}(" in text for k in ("half", "bf16")):  # (or only store them)
        code.lines = convert_halves_in_blocks(code.lines)
        kernel.helpers = [(fn, extra, _buffer(convert_halves_in_blocks(block.lines))) for fn, extra, block in kernel.helpers]
    if kernel.parallel_if:
        code.lines = _parallel_if(code.lines, kernel.parallel_if)
        kernel.helpers = [(fn, extra, _buffer(_parallel_if(block.lines, kernel.parallel_if))) for fn, extra, block in kernel.helpers]
    out = CodeBuffer()
    for fn in ("sin", "cos"):  # (the prelude's libmvec wrappers: ~6 ms of g++ time a unit each)
        if f"mi_{fn}(" not in text and "mi_tan(" not in text and "mi_randn(" not in text:
            out.writeline(f"#define MI_NO_{fn.upper()}")
    out.writeline('#include "minductor_prelude.h"')
    narrow = narrow_loads_stream_faster() and streams_reads(kernel, text)
    if narrow:
        out.writeline("#pragma GCC push_options")
        out.writeline('#pragma GCC target("prefer-vector-width=256")  // streamed reads (runtime/cache.narrow_loads_stream_faster)')
    out.writeline("")
    sigs = [", ".join(params + ([extra] if extra else [])) for _, extra, _ in kernel.helpers]
    parts = split_parts([len(block.lines) for _, _, block in kernel.helpers], len(code.lines))
    if parts:
        for (fn, _, _), sig in zip(kernel.helpers, sigs):
            out.writeline(f"MI_LOOP_FN void {fn}({sig});")
        out.writeline("")
    for (fn, _, block), sig, part in zip(kernel.helpers, sigs, parts or [None] * len(sigs)):
        if part is not None:
            out.writeline(f"#if MI_IN_PART({part})")
        out.writeline(f"MI_LOOP_FN void {fn}({sig})")
        out.writeline("{")
        with out.indent(open_brace=False):
            out.lines.extend(_with_error_flag(block.lines, out._indent) if flag else block.lines)
        out.writeline("}")
        if part is not None:
            out.writeline("#endif")
        out.writeline("")
    if parts:
        out.writeline("#if MI_IN_PART(0)")
    out.writeline(f'extern "C" void {kernel.name}({", ".join(params)})')
    out.writeline("{")
    with out.indent(open_brace=False):
        lines = [line.replace(ARGS_PLACEHOLDER, ", ".join(names)) for line in code.lines]
        for line in _with_error_flag(lines, 0) if flag else lines:
            out.writeline(line)
    out.writeline("}")
    if parts:
        out.writeline("#endif")
    if narrow:
        out.writeline("#pragma GCC pop_options")
    return out.getvalue()


def streams_reads(kernel: CppKernel, text: str) -> bool:
    """Whether ``kernel`` (its loops' ``text``) reduces what it reads along contiguous lanes
    with cheap arithmetic only: a memory-bound loop whose speed is the rate its loads stream.
    Reductions over outer lanes (column sums) and loops that store along their inner range
    are left alone, and so is any costlier math (exp, Welford updates)."""
    n_outer = len(kernel.group.outer)
    nodes = kernel.group.nodes
    if kernel.tile_var is not None or not any(n.red_ranges for n in nodes):
        return False
    if any(not n.red_ranges and n.pw_ranges[n_outer:] for n in nodes):
        return False
    return only_cheap_calls(text.splitlines())


# A kernel whose loop functions come to this many lines is split over parallel translation
# units (when it is the only one a graph compiles): g++ spends ~0.3 s on a 400-line kernel
# (ten loops of a 50-op chain), and the extra unit and link step cost ~0.05 s.
SPLIT_MIN_LINES = 200


def split_parts(helper_lines: list[int], main_lines: int) -> list[int] | None:
    """The part of each loop function (longest first onto the lightest part; part 0 also
    holds the kernel's entry function), or None to keep the kernel one unit."""
    count = min(config.compile_threads, len(helper_lines))
    if count < 2 or sum(helper_lines) < SPLIT_MIN_LINES:
        return None
    load = [main_lines] + [0] * (count - 1)
    parts = [0] * len(helper_lines)
    for i in sorted(range(len(helper_lines)), key=lambda i: -helper_lines[i]):
        parts[i] = min(range(count), key=load.__getitem__)
        load[parts[i]] += helper_lines[i]
    return parts


def _without_simd(lines: list[str]) -> list[str]:
    lines = [line.replace("#pragma omp parallel for simd", "#pragma omp parallel for")
             .replace("#pragma omp for simd", "#pragma omp for") for line in lines]
    return [line for line in lines if line.strip() != "#pragma omp simd"]


_PARALLEL = re.compile(r"^(\s*#pragma omp parallel(?: for)?(?: simd)?)(?=\s|$)")


def _parallel_if(lines: list[str], condition: str) -> list[str]:
    """Every parallel construct (``parallel for``, or a ``parallel`` region around its
    ``omp for``) with the clause ``if(condition)``: one thread below it. A region of ``mi_nt``
    threads, which keep per-thread partials that are combined after it, takes one thread
    through ``mi_nt`` itself instead, so that the combine reads only partials a thread wrote."""
    out = []
    for line in lines:
        if line.strip() == THREADS_LINE:
            line = line.replace("const int mi_nt = ", f"const int mi_nt = !({condition}) ? 1 : ")
        elif "num_threads(mi_nt)" not in line:
            line = _PARALLEL.sub(lambda m: f"{m.group(1)} if({condition})", line)
        out.append(line)
    return out


def _buffer(lines: list[str]) -> CodeBuffer:
    buf = CodeBuffer()
    buf.lines = lines
    return buf


def _with_error_flag(lines: list[str], indent: int) -> list[str]:
    """A function body whose checks OR failures into ``mi_bad``: declare it, make it a
    reduction variable of every OpenMP loop (parallel and simd; a work-sharing ``omp for``
    inside a parallel region already reduces it there), and publish it at the end."""
    pad = "    " * indent
    body = [line + " reduction(|:mi_bad)" if line.lstrip().startswith("#pragma omp") and not line.lstrip().startswith("#pragma omp for")
            else line for line in lines]
    return [f"{pad}int64_t mi_bad = 0;", *body,
            f"{pad}if (mi_bad) __atomic_fetch_or(mi_err, mi_bad, __ATOMIC_RELAXED);"]
