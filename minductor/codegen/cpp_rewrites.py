"""Rewrites of a C++ kernel's emitted loop nests: tables of costly values that depend only on a
short innermost loop's variable, write prefetches of the row a reduction's later loops store, and
prefetches of the next row a gather or scatter reaches through an index.

Tables
------

A pointwise kernel over a channels-last tensor runs its innermost loop over the channels (16
of them for a small conv net) inside long outer loops over the pixels. A per-channel value
such as batch norm's ``1 / sqrt(var[c] + eps)`` then changes along the innermost loop, so the
compiler cannot hoist it, and every vector of 16 outputs paid a vsqrtps and a vdivps: the
batch-norm kernel of the suite's conv net ran 0.53 ms instead of 0.28 on a Xeon. Such values
are computed once per kernel call into a table indexed by the innermost variable, before the
outer loops, and the loop body reads the table instead.

A value qualifies when every expression it is computed from (its CSE closure) reads only the
innermost variable and the kernel's read-only inputs (``in_ptrN``), depends on that variable
(a value that does not is already hoisted by the compiler), and contains a costly operation
(a division or a math function call). Only the outermost such values are tabled; the lines
that computed them stay in the body, now dead, for the compiler to drop.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import sympy
import torch

from minductor.codegen.common import CodeBuffer, cpp_index, indent_of
from minductor.codegen.cpp_ops import INLINE_MATH
from minductor.codegen.cpp_windows import stage_window_gathers, window_sizes
from minductor.codegen.loop_shapes import SMALL_INNER_CHUNK, line_step
from minductor.ir.indexing import affine_coeffs, index_symbol, simplify_index
from minductor.runtime.cache import prefetch_beside_streaming_stores

Expr = sympy.Expr

# innermost loops at most this long get tables (16 KB of floats each, on the stack): a 1-D
# linear upsample to 2048 columns computed its source indices and weights per element, in
# every row (its kernel 2.8 ms at (1, 1024, 1024); eager 0.82 for the whole call)
MAX_INNER = 16384
MAX_TABLES = 8
TABLE_STACK_BYTES = 512 * 1024  # all of a kernel's tables, on its caller's stack (8 bytes a value at most)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
# a call, templated or not (``mi_maximum<decltype(tmp11)>(...)``: comparisons are spaced, so a
# name right before ``<`` is a template; batch norm's clamp of its variance as a variable kept
# its rsqrt out of the tables: a channels-last bf16 batch norm kernel ran 348 us, eager 366 for all)
_CALL = re.compile(r"\b([A-Za-z_]\w*)(?=\(|<)")
_DEF = re.compile(r"^\s*auto (tmp\d+) = (.*);$")
_CHECK = re.compile(r"^mi_bad \|= (tmp\d+) \? 0 : 1;$")
# identifiers a tabled value may use besides the innermost variable and the tmps it is built from
_TYPES = {"static_cast", "decltype", "float", "double", "int64_t", "int32_t", "uint64_t", "uint32_t", "int8_t",
          "uint8_t", "int16_t", "bool", "true", "false", "mi_half", "mi_bf16"}
# calls that cost no more than the arithmetic around them
_CHEAP_CALLS = {"static_cast", "decltype", "mi_relu", "mi_maximum", "mi_minimum", "mi_max_update", "mi_min_update", "mi_abs", "mi_min_i64"}


def _costly(expr: str) -> bool:
    return " / " in expr or any(name not in _CHEAP_CALLS for name in _CALL.findall(expr))


def only_cheap_calls(lines: list[str]) -> bool:
    """Whether the values the ``tmp`` lines compute call nothing beyond cheap arithmetic."""
    return all(name in _CHEAP_CALLS or name in ("mi_lowest", "mi_highest")
               for line in lines if "tmp" in line for name in _CALL.findall(line))


def _tableable(kernel: Any, var: str, inner: str, definitions: dict[str, str]) -> list[tuple[str, str]] | None:
    """The (tmp, expr) definitions ``var`` is computed from, in order, if it may be tabled."""
    exprs = kernel.definition_closure(var, definitions)
    if not exprs:
        return None
    text = "\n".join(exprs)
    calls = set(_CALL.findall(text))
    variables = set(_IDENT.findall(text)) - calls
    allowed = {n for n in variables if n == inner or n.startswith("tmp") or re.fullmatch(r"in_ptr\d+", n) or n in _TYPES}
    if variables != allowed or inner not in variables:
        return None
    wanted = set(exprs)
    return [(v, e) for e, v in kernel.cse.cache.items() if e in wanted]  # definition order


def hoist_inner_invariants(kernel: Any, code: CodeBuffer, start: int, inner: str, size: int) -> int:
    """Table the costly values of the loop nest written to ``code.lines[start:]`` that depend only
    on the innermost variable ``inner`` (``size`` iterations). Returns how many were tabled."""
    if not 0 < size <= MAX_INNER:
        return 0
    body_defs = {m.group(1): m.group(2) for line in kernel.body.lines if (m := _DEF.match(line))}
    # an index a load reads through, and its bounds check, are worth a table however cheap
    # where window gathers read through tables (cpp_windows.py): a reflect pad's |i - 3|
    indices: set[str] = set()
    if window_sizes() and kernel.indirect_sizes:
        checks = {m.group(1) for line in kernel.body.lines if (m := _CHECK.match(line.strip()))}
        indices = set(kernel.indirect_sizes) | checks
    if not indices and not any(_costly(e) for e in body_defs.values()):
        return 0  # the common case: nothing worth a table
    definitions = {v: e for e, v in kernel.cse.cache.items()}
    closures = {v: c for v in body_defs if (c := _tableable(kernel, v, inner, definitions)) is not None}
    if not closures:
        return 0
    # roots: tableable values some other line of the body uses
    used_outside: set[str] = set()
    for line in kernel.body.lines:
        m = _DEF.match(line)
        if m and m.group(1) in closures:
            continue
        used_outside |= {n for n in _IDENT.findall(line) if n in closures}
    def worth(v: str) -> bool:  # (an index read from memory scatters too much for a window)
        exprs = [e for _, e in closures[v]]
        return any(_costly(e) for e in exprs) or (v in indices and not any("in_ptr" in e for e in exprs))

    roots = [v for v in sorted(used_outside, key=lambda v: int(v[3:])) if worth(v)]
    roots = roots[:max(1, min(MAX_TABLES, TABLE_STACK_BYTES // (8 * size)))]
    if not roots:
        return 0
    indent = re.match(r"\s*", code.lines[start]).group(0)
    prologue = CodeBuffer()
    replacements = {}
    for root in roots:
        table = f"mi_table{len(replacements)}"
        prologue.writeline(f"auto {table}_fn = [&](int64_t {inner}) {{")
        with prologue.indent(open_brace=False):
            for tmp, expr in closures[root]:
                prologue.writeline(f"auto {tmp} = {expr};")
            prologue.writeline(f"return {root};")
        prologue.writeline("};")
        bound = kernel.indirect_sizes.get(root)  # an index a gather reads through: 32 bits suffice
        dtype = "int32_t" if isinstance(bound, sympy.Integer) and bound < 2**31 else f"mi_table_t<decltype({table}_fn(0))>"
        prologue.writeline(f"alignas(64) {dtype} {table}[{size}];")
        prologue.writeline("#pragma omp simd")
        prologue.writeline(f"for (int64_t {inner} = 0; {inner} < {size}; {inner}++) {table}[{inner}] = {table}_fn({inner});")
        replacements[f"auto {root} = {body_defs[root]};"] = f"auto {root} = {table}[{inner}];"
    # a bounds check of a tabled index is as invariant as the index: it runs once, on the table,
    # and each row ORs in the result (a nearest upsample's loop spent 2 of its 4.7 ms reducing it)
    checked = {root: f"mi_table{k}" for k, root in enumerate(roots)}
    flags: set[str] = set()
    inserts: list[tuple[int, str]] = []
    loop_pad, loop_at = None, start  # the indent of the loop over ``inner`` the scan is in
    for i in range(start, len(code.lines)):
        stripped, pad = code.lines[i].strip(), indent_of(code.lines[i])
        if stripped.startswith(f"for (int64_t {inner} = "):
            loop_pad, loop_at = pad, i - 1 if code.lines[i - 1].strip().startswith("#pragma") else i
        elif loop_pad is not None and len(pad) <= len(loop_pad) and stripped != "{":
            loop_pad = None
        # (only in a loop over inner: a line the interior made invariant runs before its loop)
        elif loop_pad is not None and stripped in replacements:
            code.lines[i] = pad + replacements[stripped]
        elif loop_pad is not None and (m := _CHECK.match(stripped)) and m.group(1) in checked:
            code.lines[i] = ""
            flags.add(checked[m.group(1)])
            if (loop_at, checked[m.group(1)]) not in inserts:
                inserts.append((loop_at, checked[m.group(1)]))
    for at, table in sorted(inserts, reverse=True):
        code.lines.insert(at, indent_of(code.lines[at]) + f"mi_bad |= {table}_bad;")
    code.lines[start:] = [line for line in code.lines[start:] if line != ""]
    for table in sorted(flags):
        prologue.writeline(f"int64_t {table}_bad = 0;")
        prologue.writeline(f"for (int64_t {inner} = 0; {inner} < {size}; {inner}++) {table}_bad |= {table}[{inner}] ? 0 : 1;")
    code.lines[start:start] = [indent + line if line else line for line in prologue.lines]
    # (indices read from memory scatter where they like: no window for them)
    computed = {f"mi_table{k}" for k, root in enumerate(roots) if not any("in_ptr" in e for _, e in closures[root])}
    stage_window_gathers(kernel, code, start, inner, size, computed)
    return len(roots)


@dataclasses.dataclass
class LoopShape:
    """A loop block's single innermost variable: its range, its lanes (0 for a pointwise
    loop), the stores and loads of its body (pointer, index, dtype), and the lanes of its
    second main loop, taken at run time on long symbolic rows (0: none)."""

    var: sympy.Symbol
    size: Expr
    lanes: int
    stores: list[tuple[str, Expr, torch.dtype]]
    loads: list[tuple[str, Expr, torch.dtype]] = dataclasses.field(default_factory=list)
    wide: int = 0

    def steps(self) -> list[int]:
        """The lanes of each main loop; of a streamed loop, its step (``StreamStore.width``)."""
        if not self.lanes:
            return [line_step(dtype for *_, dtype in [*self.loads, *self.stores])]
        return [self.lanes, self.wide] if self.wide else [self.lanes]


def prefetch_row_stores(first: CodeBuffer, shape: LoopShape | None, later: list[LoopShape | None],
                        range_of: dict[sympy.Symbol, Expr]) -> None:
    """While the first loop of a row reduces the row (layer_norm's mean and variance), have it
    prefetch for writing the lines the later pointwise loops store contiguously along the
    same range: their stores otherwise wait on a read-for-ownership of every line of the
    output row (layer_norm at 4096^2: 8.8 -> 7.3 ms on a Xeon; softmax, whose later loops
    compute an exp per element, unchanged)."""
    if shape is None or not shape.lanes:
        return
    mi_base = index_symbol("mi_base")
    for step in shape.steps():
        lines: list[str] = []
        for loop in later:
            if loop is None or loop.lanes or loop.size != shape.size:
                continue
            for arg, index, dtype in loop.stores:
                coeffs = affine_coeffs(index, [loop.var])
                if coeffs is None or coeffs[loop.var] != 1 or step * dtype.itemsize < 64:
                    continue
                for k in range(0, step, 64 // dtype.itemsize):  # a prefetch per 64-byte line
                    at = cpp_index(simplify_index(sympy.expand(index.xreplace({loop.var: mi_base + k})), range_of))
                    line = f"__builtin_prefetch(&{arg}[{at}], 1, 3);"
                    if line not in lines:
                        lines.append(line)
        _insert_in_loop(first, f"for (int64_t mi_base = 0; mi_base < mi_main; mi_base += {step})", lines)


# per-element math that makes a loop compute-bound (``mi_rsqrt`` and ``mi_sqrt`` are left
# out: a normalization's are per row, hoisted by the compiler)
_HEAVY_MATH = re.compile(rf"\bmi_({'|'.join((*INLINE_MATH, 'sin', 'cos'))})\(")


def prefetch_next_rows(blocks: list[CodeBuffer], shapes: list[LoopShape | None], outer: sympy.Symbol,
                       range_of: dict[sympy.Symbol, Expr]) -> None:
    """Have a later loop of a row along the same range, which works on the row the first loop
    brought into L1, prefetch the lines the first loop reads in the next outer iteration: that
    memory read then overlaps this loop's work instead of following it. Measured at 4096^2 on a
    Xeon VM, kernels alone, in alternation: a hand softmax 6.7-6.8 -> 5.3-5.7 ms, layer_norm
    3.3-3.6 -> 2.8-3.1 ms. The prefetches go where the row spends its time: the first loop
    that computes transcendental math (softmax's exp and sum; in its streamed loop instead:
    5.1-5.3 -> 5.5-5.9 ms), else the streamed loop that writes the row (a two-pass layer_norm's
    normalization; in the short variance loop between instead, the prefetches issue in a
    burst: 3.6-3.7 -> 3.9 ms, and 5.2-5.8 -> 5.9-6.8 ms with a residual add). The loop must be a
    reduction's lane loop or a streamed loop of whole lines; a plain ``omp simd`` loop has no
    place for one prefetch per line. Where prefetches slow streaming stores down (Zen 4:
    ``runtime/cache.prefetch_beside_streaming_stores``), only lane loops take them."""
    first = shapes[0] if shapes else None
    if first is None:
        return
    streams = prefetch_beside_streaming_stores()
    later = [(block, shape) for block, shape in zip(blocks[1:], shapes[1:])
             if shape is not None and shape.size == first.size and (streams or shape.lanes)]
    heavy = [(b, s) for b, s in later if any(_HEAVY_MATH.search(line) for line in b.lines)]
    streamed = [(b, s) for b, s in later if not s.lanes]
    for block, shape in heavy[:1] + streamed[-1:] + later:
        inserted = False
        for step in shape.steps():
            if shape.lanes:
                head, var = f"for (int64_t mi_base = 0; mi_base < mi_main; mi_base += {step})", "mi_base"
            else:
                head, var = f"for (int64_t mi_line_at = mi_head; mi_line_at < mi_lines_end; mi_line_at += {step})", "mi_line_at"
            at = index_symbol(var)
            lines: list[str] = []
            for arg, index, dtype in first.loads:
                coeffs = affine_coeffs(index, [first.var, outer])
                if coeffs is None or coeffs[first.var] != 1 or coeffs[outer] == 0 or step * dtype.itemsize < 64:
                    continue
                for k in range(0, step, 64 // dtype.itemsize):  # a prefetch per 64-byte line
                    nxt = index.xreplace({first.var: at + k, outer: outer + 1})
                    line = f"__builtin_prefetch(&{arg}[{cpp_index(simplify_index(sympy.expand(nxt), range_of))}], 0, 3);"
                    if line not in lines:
                        lines.append(line)
            inserted = _insert_in_loop(block, head, lines) or inserted
        if inserted:
            return


# iterations of an indirect innermost loop per chunk that prefetches its share of the next row
GATHER_CHUNK = 64


def prefetch_gathered_rows(kernel: Any, code: CodeBuffer, start: int, row: sympy.Symbol, inner: sympy.Symbol,
                           size: int) -> bool:
    """A gather or scatter that reaches elements of one row per iteration of ``row`` through an
    index (``torch.gather(x, 1, i)`` reads row ``xo0`` of ``x`` at the columns ``i`` holds;
    ``x.scatter_add(1, i, s)`` updates them) misses cache at lines no hardware prefetcher
    predicts. The innermost loop (``size`` iterations, in ``code.lines[start:]``) then runs in
    chunks of ``GATHER_CHUNK``, each first prefetching its share of the lines of the row the next
    ``row`` iteration reaches (for writing, if the loop stores there). Only rows of at most
    ``size`` lines qualify: a longer row is mostly never touched. 4096 indices into each of 4096
    rows of 4096 floats, on a Xeon (family 6 model 207), kernels alone, interleaved: gather 2.81
    -> 2.41 ms (chunks of 16 and 128: 2.40, 2.42 ms); scatter_add 10.5 -> 4.5 ms (prefetching
    for reading: the same), a copy of x taking 4.2 ms. Returns whether the loop was rewritten."""
    prefetches: dict[str, int] = {}  # address -> 1 to prefetch it for writing
    stored = {arg for arg, _, _ in kernel.body_stores}
    for arg, index, dtype in [*kernel.body_loads, *kernel.body_stores]:
        picked = [v for v in index.free_symbols if str(v) in kernel.indirect_sizes]
        coeffs = affine_coeffs(index, [*picked, row, inner]) if len(picked) == 1 else None
        extent = kernel.indirect_sizes[str(picked[0])] if coeffs is not None else None
        if coeffs is None or coeffs[picked[0]] != 1 or coeffs[row] == 0 or coeffs[inner] != 0 \
                or not isinstance(extent, sympy.Integer):
            continue
        per_line = 64 // dtype.itemsize
        lines = -(-int(extent) // per_line)
        if lines > size:
            continue
        chunks = -(-size // GATHER_CHUNK)
        share = -(-lines // chunks)
        nxt = cpp_index(simplify_index(sympy.expand(index.xreplace({picked[0]: 0, row: row + 1})), kernel.range_of))
        for k in range(share):
            at = f"&{arg}[{nxt} + {per_line}*({share}*(mi_g / {GATHER_CHUNK}) + {k})]"
            prefetches[at] = max(prefetches.get(at, 0), int(arg in stored))
    i = _loop_at(code.lines, f"for (int64_t {inner} = 0; {inner} < {size}; {inner}++)", start)
    if not prefetches or i is None:
        return False
    pragma = [code.lines[i - 1].strip()] if code.lines[i - 1].strip().startswith("#pragma omp simd") else []
    pad = indent_of(code.lines[i])
    end = next(j for j in range(i + 2, len(code.lines)) if code.lines[j] == pad + "}")
    hi = f"mi_g + {GATHER_CHUNK}" if size % GATHER_CHUNK == 0 else f"mi_min_i64(mi_g + {GATHER_CHUNK}, {size})"
    code.lines[i - len(pragma):end + 1] = [
        pad + f"for (int64_t mi_g = 0; mi_g < {size}; mi_g += {GATHER_CHUNK})",
        pad + "{",
        *[pad + f"    __builtin_prefetch({at}, {rw}, 3);" for at, rw in prefetches.items()],
        *[pad + "    " + line for line in pragma],
        pad + f"    for (int64_t {inner} = mi_g; {inner} < {hi}; {inner}++)",
        *["    " + line for line in code.lines[i + 1:end + 1]],
        pad + "}",
    ]
    return True


def _insert_in_loop(block: CodeBuffer, head: str, lines: list[str]) -> bool:
    """Put ``lines`` at the top of the body of the one loop ``head`` opens in ``block``."""
    at = _loop_at(block.lines, head)
    if not lines or at is None:
        return False
    block.lines[at + 2:at + 2] = [indent_of(block.lines[at]) + "    " + line for line in lines]
    return True


def _loop_at(lines: list[str], head: str, start: int = 0) -> int | None:
    """The index of the one line from ``start`` on that is ``head``, opening a braced body."""
    at = [i for i in range(start, len(lines)) if lines[i].strip() == head]
    return at[0] if len(at) == 1 and at[0] + 1 < len(lines) and lines[at[0] + 1].strip() == "{" else None


def open_vector_loop_outside(code: CodeBuffer, var: sympy.Symbol, size: Expr, parallel: bool) -> int:
    """Open the second-innermost loop of a nest that vectorizes outside its short innermost
    loop (``vectorizes_outside``), over chunks when the nest is parallel. Returns the loops opened."""
    lo, hi, opened = "0", cpp_index(size), 1
    if parallel:
        code.writeline(f"for (int64_t mi_chunk = 0; mi_chunk < {hi}; mi_chunk += {SMALL_INNER_CHUNK})")
        code.writeline("{")
        code._indent += 1
        lo, hi, opened = "mi_chunk", f"mi_min_i64(mi_chunk + {SMALL_INNER_CHUNK}, {hi})", 2
    code.writeline("#pragma omp simd")
    code.writeline(f"for (int64_t {var} = {lo}; {var} < {hi}; {var}++)")
    code.writeline("{")
    code._indent += 1
    return opened
