"""Half values converted in blocks, with the CPU's conversion instructions.

GCC 12 has no vector mode for ``_Float16`` without AVX512-FP16, so kernels keep half values as
their 16 bits and convert them with integer and float arithmetic (``mi_half_to_float``, about
ten instructions a vector each way). F16C converts 16 of them in one instruction, but GCC does
not vectorize a loop into it. So the loops that read or write a half buffer contiguously get
their conversions done apart, a block at a time, by ``mi_halves_to_floats`` /
``mi_floats_to_halves`` (the prelude's F16C loops; the same arithmetic without F16C):

- a loop over lanes (a row reduction's ``mi_base`` step, a streamed line) converts its block
  of halves into a float array before the lane loop, which then reads the array;
- an ``omp simd`` loop (a row's pointwise loop; a one-dimensional kernel's ``omp parallel for
  simd`` loop, whose threads then take the blocks) runs in blocks of ``BLOCK``: each block's
  halves (and bfloat16 values: shifts and roundings out of the math loop, a bf16 gelu 9%
  faster) are converted first, its 16-bit results are written to a float array and converted
  after it; the remainder runs the loop as it was;
- rows scanned together (``cpp_scan``) step through blocks of their half or bfloat16 values
  (``blocked_scan_rows``).

Whole calls at 2048x4096 against the arithmetic alone (eager's in brackets): half sum(-1)
0.227 -> 0.112 ms (0.176), softmax 1.90 -> 1.10 (1.79), layer_norm 1.27 -> 0.50 (0.86),
gelu 1.82 -> 0.90 (1.69), x * y + x 1.68 -> 0.68 (1.2-1.5). Loads from a pointer the loop also
stores through are left in place (a block read ahead would miss the stores).
"""
from __future__ import annotations

import re

import sympy

from minductor.codegen.common import cpp_index, indent_of, parse_cpp_index
from minductor.ir.indexing import index_symbol

BLOCK = 64
_LOAD = re.compile(r"auto (tmp\d+) = mi_(half|bf16)_to_float\((\w+)\[(.*)\]\);$")
_STORE = re.compile(r"(\w+)\[(.*)\] = mi_float_to_(half|bf16)\((.*)\);$")
# the block conversions of each 16-bit type
_TO_FLOATS = {"half": "mi_halves_to_floats", "bf16": "mi_bf16s_to_floats"}
_FROM_FLOATS = {"half": "mi_floats_to_halves", "bf16": "mi_floats_to_bf16s"}
_ANY_STORE = re.compile(r"(\w+)\[.*\] = ")
_INDEXED = re.compile(r"\b(\w+)\[")
_LANE_LOOP = re.compile(r"for \(int64_t mi_lane = 0; mi_lane < (\d+); mi_lane\+\+\)$")
_LANE_VAR = re.compile(r"const int64_t (\w+) = (\w+) \+ mi_lane;$")
_SIMD_LOOP = re.compile(r"for \(int64_t (\w+) = (.+); \1 < (.+); \1\+\+\)$")
_LITERAL = re.compile(r"\b(\d+)L\b")
_PARALLEL_SIMD = "#pragma omp parallel for simd"
_FOR_SIMD = "#pragma omp for simd"  # (the loop of a parallel region its invariants run in first)


def _at(index: str, var: str, value: str) -> str | None:
    """``index`` (C++ text) with ``var`` set to ``value``, when it is ``var`` plus terms that do
    not change along the loop (its elements are contiguous); None otherwise."""
    if re.search(r"\btmp\d+\b", index):
        return None
    expr = parse_cpp_index(_LITERAL.sub(r"\1", index))
    if expr is None:
        return None
    v = index_symbol(var)
    if not expr.is_polynomial(v) or sympy.diff(expr, v) != 1:
        return None
    return cpp_index(expr.xreplace({v: index_symbol(value)}))


def _flat_body(lines: list[str], start: int) -> int | None:
    """The index of the ``}`` closing the body opened at ``lines[start]`` (a ``{``), if every
    line between is a statement at the body's own level (no lambda, no nested block)."""
    pad = indent_of(lines[start])
    for j in range(start + 1, len(lines)):
        if lines[j] == pad + "}":
            return j
        if indent_of(lines[j]) != pad + "    " or lines[j].rstrip().endswith(("{", "}")) or "[&]" in lines[j]:
            return None
    return None


def _loop_body(lines: list[str], at: int) -> tuple[list[str], int] | None:
    """The body of the loop whose pragma is ``lines[at]`` (a flat body, or one block deeper as
    pointwise kernels write it, then taken out of that block), and the index of its last line."""
    pad = indent_of(lines[at])
    if at + 3 >= len(lines) or lines[at + 2] != pad + "{":
        return None
    if lines[at + 3] != pad + "    {":
        end = _flat_body(lines, at + 2)
        return (lines[at + 3:end], end) if end is not None else None
    end = _flat_body(lines, at + 3)
    if end is None or end + 1 >= len(lines) or lines[end + 1] != pad + "}":
        return None
    return [line[4:] for line in lines[at + 4:end]], end + 1


def _conversions(body: list[str], var: str, base: str, lane: str, n: str,
                 kinds: tuple[str, ...] = ("half",)) -> tuple[list[str], list[str], list[str]]:
    """(lines before the loop, the body rewritten, lines after it) for the contiguous loads and
    stores of ``body`` over ``var`` of the 16-bit ``kinds`` ("half", "bf16"), a block of ``n``
    of them starting where ``var`` is ``base``; ``lane`` is the element's place in the block."""
    stored = {m.group(1) for line in body if (m := _ANY_STORE.match(line.strip()))}
    def read_after(i: int) -> set[str]:
        """Pointers the lines after ``body[i]`` read (right of an assignment): a store through
        one of them stays in place, as the same iteration reads it back (a value copied as its
        bits into a second output; deferred to the block's end, the copy took the old value)."""
        return {p for line in body[i + 1:] for p in _INDEXED.findall(line.split(" = ", 1)[-1])}

    before: list[str] = []
    after: list[str] = []
    loads = 0
    rewritten = list(body)
    for i, line in enumerate(body):
        text = line.strip()
        load, store = _LOAD.match(text), _STORE.match(text)
        if (load and load.group(2) in kinds and load.group(3) not in stored
                and (at := _at(load.group(4), var, base)) is not None):
            array, loads = f"mi_h{loads}", loads + 1
            before += [f"alignas(64) float {array}[{n}];",
                       f"{_TO_FLOATS[load.group(2)]}<{n}>(&{load.group(3)}[{at}], {array});"]
            rewritten[i] = f"{indent_of(line)}auto {load.group(1)} = {array}[{lane}];"
        elif (store and store.group(3) in kinds and store.group(1) not in read_after(i)
              and (at := _at(store.group(2), var, base)) is not None):
            array = f"mi_hs{len(after)}"
            before.append(f"alignas(64) float {array}[{n}];")
            after.append(f"{_FROM_FLOATS[store.group(3)]}<{n}>({array}, &{store.group(1)}[{at}]);")
            rewritten[i] = f"{indent_of(line)}{array}[{lane}] = {store.group(4)};"
    return before, rewritten, after


def convert_halves_in_blocks(lines: list[str]) -> list[str]:
    """``lines`` (a kernel's C++) with the half conversions of its lane loops and plain ``omp
    simd`` loops done in blocks (see the module docstring)."""
    if not any(f"mi_{k}_to_float(" in line or f"mi_float_to_{k}(" in line for line in lines for k in ("half", "bf16")):
        return lines
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        head = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if line.strip().startswith("#pragma omp simd") and (lane := _LANE_LOOP.match(head)):
            done = _lane_loop(lines, i, int(lane.group(1)))
        elif line.strip().startswith(("#pragma omp simd", _PARALLEL_SIMD, _FOR_SIMD)) and _SIMD_LOOP.match(head):
            done = _blocked_loop(lines, i, line.strip().startswith((_PARALLEL_SIMD, _FOR_SIMD)))
        else:
            done = None
        if done is None:
            out.append(line)
            i += 1
        else:
            new, i = done
            out += new
    return out


def _lane_loop(lines: list[str], at: int, n: int) -> tuple[list[str], int] | None:
    """A lane loop (``lines[at]`` its pragma) whose first body line binds its variable to a base
    plus the lane: the block's conversions before the pragma and after the loop."""
    end = _flat_body(lines, at + 2) if at + 3 < len(lines) and lines[at + 2].strip() == "{" else None
    bind = _LANE_VAR.match(lines[at + 3].strip()) if end is not None else None
    if bind is None or n % 16:
        return None
    body = lines[at + 4:end]
    before, body, after = _conversions(body, bind.group(1), bind.group(2), "mi_lane", str(n))
    if not before:
        return None
    pad = indent_of(lines[at])
    return [*(pad + b for b in before), *lines[at:at + 4], *body, lines[end], *(pad + a for a in after)], end + 1


def _blocked_loop(lines: list[str], at: int, parallel: bool) -> tuple[list[str], int] | None:
    """An ``omp simd`` loop (``lines[at]`` its pragma) in blocks of BLOCK, then its remainder as
    it was. ``parallel``: a one-dimensional pointwise kernel's ``omp parallel for simd`` loop
    (or ``omp for simd``, in a parallel region) over a static range, whose threads take the
    blocks (the remainder runs in one thread)."""
    var, lo, hi = _SIMD_LOOP.match(lines[at + 1].strip()).groups()
    static = lo.isdigit() and hi.isdigit()
    found = _loop_body(lines, at) if static or not parallel else None
    if found is None:
        return None
    body, end = found
    before, blocked, after = _conversions(body, var, "mi_hb", f"{var} - mi_hb", str(BLOCK), ("half", "bf16"))
    if not before:
        return None
    pad, inner = indent_of(lines[at]), indent_of(lines[at]) + "    "
    in_region = lines[at].strip().startswith(_FOR_SIMD)
    clauses = lines[at].strip()[len(_FOR_SIMD if in_region else _PARALLEL_SIMD):] if parallel else ""
    simd = "#pragma omp simd" + (" reduction(|:mi_bad)" if "reduction(|:mi_bad)" in clauses else "")
    simd = simd if parallel else lines[at].strip()
    hend = str(int(lo) + (int(hi) - int(lo)) // BLOCK * BLOCK) if static else f"({lo}) + (({hi}) - ({lo})) / {BLOCK} * {BLOCK}"
    remainder = [] if hend == hi else [  # (none where it would run no iteration)
        inner + simd,
        inner + f"for (int64_t {var} = mi_hend; {var} < {hi}; {var}++)",
        *("    " + b for b in lines[at + 2:end + 1]),
    ]
    if remainder and in_region:
        remainder = [inner + "#pragma omp single", inner + "{", *("    " + r for r in remainder), inner + "}"]
    loops = []
    for k, (body, rounded) in enumerate(_rounded_in_blocks(blocked, f"{var} - mi_hb")):
        loops += [
            *([inner + f"    alignas(64) float {rounded}[{BLOCK}];"] if rounded else []),
            inner + "    " + simd,
            inner + f"    for (int64_t {var} = mi_hb; {var} < mi_hb + {BLOCK}; {var}++)",
            inner + "    {",
            *("        " + b for b in body),
            inner + "    }",
            *([inner + f"    mi_round_halves<{BLOCK}>({rounded});"] if rounded else []),
        ]
    return [
        pad + "{",
        inner + f"const int64_t mi_hend = {hend};",
        *([inner + ("#pragma omp for" if in_region else "#pragma omp parallel for") + clauses] if parallel else []),
        inner + f"for (int64_t mi_hb = {lo}; mi_hb < mi_hend; mi_hb += {BLOCK})",
        inner + "{",
        *(inner + "    " + b for b in before),
        *loops,
        *(inner + "    " + a for a in after),
        inner + "}",
        *remainder,
        pad + "}",
    ], end + 1


_ROUND = re.compile(r"auto (tmp\d+) = mi_round_half\((.*)\);$")


def _rounded_in_blocks(body: list[str], lane: str) -> list[tuple[list[str], str]]:
    """``body`` (a block's loop body) as loops that end at each value rounded to half that a
    later line reads: each such loop writes the value into a float array (the second of the
    pair, "" for the last loop), which ``mi_round_halves`` rounds in place before the next loop
    reads it (``x * sigmoid(x)`` rounded to half before ``* y``: 1.07 -> 0.52 ms at 4096x1024
    the kernel alone). A later loop repeats the earlier lines; the compiler drops those whose
    values it does not read (the sigmoid, after its rounding)."""
    loops, done = [], list(body)
    for i, line in enumerate(body):
        m = _ROUND.match(line.strip())
        if m is None or not any(re.search(rf"\b{m.group(1)}\b", later) for later in body[i + 1:]):
            continue
        array = f"mi_r{len(loops)}"
        loops.append(([*done[:i], f"{indent_of(line)}{array}[{lane}] = {m.group(2)};"], array))
        done[i] = f"{indent_of(line)}auto {m.group(1)} = {array}[{lane}];"
    # the earlier loops' stores (16-bit results go to block arrays) are left to the last one
    return [([b for b in body_ if not _ANY_STORE.match(b.strip()) or b.strip().startswith("mi_r")], array)
            for body_, array in loops] + [(done, "")]


def blocked_scan_rows(rows: list[list[str]], var: str, base: str, length: str) -> list[str] | None:
    """The scan loop over ``r0`` of rows scanned together (``rows[k]``: row k's step, its
    variable ``var`` = ``base`` + k), in blocks of BLOCK whose half and bfloat16 loads and
    stores are converted a row's block at a time; the remainder steps as before. None when the
    steps read and write no 16-bit values contiguously along the scan. A half cumsum over rows
    converted every element alone in its scalar loop, about 20 instructions each: 13.4 ms at
    2048x4096 (kernel alone; eager's whole call 2.8), 1.07 ms in blocks."""
    decls: list[str] = []
    pre: list[str] = []
    post: list[str] = []
    steps: list[str] = []
    plain: list[str] = []
    if any("[&]" in line or line.rstrip().endswith(("{", "}")) for line in rows[0]):
        return None  # (a masked load, a lambda called only where its mask holds, must not be read ahead)
    for k, step in enumerate(rows):
        before, body, after = _conversions(step, "r0", "mi_rb", "r0 - mi_rb", str(BLOCK), ("half", "bf16"))
        if not before:
            return None
        def rename(line: str, k: int = k) -> str:
            return re.sub(r"\bmi_h(s?)(\d+)\b", rf"mi_h\g<1>\g<2>_{k}", line)
        bind = f"    const int64_t {var} = {base} + {k};"
        decls += [rename(line) for line in before if line.startswith("alignas")]
        calls = [rename(line) for line in before if not line.startswith("alignas")]
        pre += ["{", bind, *("    " + c for c in calls), "}"] if calls else []
        post += ["{", bind, *("    " + rename(a) for a in after), "}"] if after else []
        steps += ["{", bind, *("    " + rename(line.strip()) for line in body), "}"]
        plain += ["{", bind, *("    " + line.strip() for line in step), "}"]
    end = str(int(length) // BLOCK * BLOCK) if length.isdigit() else f"({length}) / {BLOCK} * {BLOCK}"
    return [
        f"const int64_t mi_rend = {end};",
        f"for (int64_t mi_rb = 0; mi_rb < mi_rend; mi_rb += {BLOCK})",
        "{",
        *("    " + line for line in decls + pre),
        f"    for (int64_t r0 = mi_rb; r0 < mi_rb + {BLOCK}; r0++)",
        "    {",
        *("        " + line for line in steps),
        "    }",
        *("    " + line for line in post),
        "}",
        f"for (int64_t r0 = mi_rend; r0 < {length}; r0++)",
        "{",
        *("    " + line for line in plain),
        "}",
    ]
