"""Out-of-line vector math calls made in batches, apart from the inline math around them.

With libmvec, float32 sin and cos in an ``omp simd`` loop are calls (``_ZGVeN16v_sinf``), and
the vector function ABI lets a call clobber every vector register: the inline math after it
(an exp's dozen constants) is reloaded after every call, once per vector. Over an L1 array,
``exp(sin(x))`` took 0.749 ns per element against 0.255 + 0.254 for its two parts. So a
pointwise loop whose body makes such a call and also does inline math runs in blocks of
``BATCH`` elements: a first loop makes the block's calls into local arrays, a second runs the
body with each call replaced by a read of its array. ``((x.sin() + 1) * 2).exp().relu() - y``
at 4096^2 on a Xeon (family 6 model 207), generated kernel via ctypes, interleaved: 14.2-15.0
ms -> 12.2-12.3 ms in blocks of 64 (32: 12.9-13.2, 128: 12.9-13.2).
"""
from __future__ import annotations

import re
from typing import Any

import sympy
import torch

from minductor import config
from minductor.codegen.common import CodeBuffer
from minductor.codegen.cpp_ops import INLINE_MATH
from minductor.runtime.cache import libmvec_installed
from minductor.virtualized import V

BATCH = 64
_CALL = re.compile(r"auto (tmp\d+) = (mi_sin|mi_cos)\((tmp\d+)\);$")
# inline math whose constants a call would evict
_INLINE_MATH = re.compile(rf"\bmi_({'|'.join((*INLINE_MATH, 'rsqrt', 'sqrt'))})\(")
_STORE = re.compile(r"[A-Za-z_]\w*\[.*\] = .*;$")
_DEFINES = re.compile(r"auto (tmp\d+) = ")
_TMP = re.compile(r"\btmp\d+\b")
_LOAD = re.compile(r"auto tmp\d+ = ([A-Za-z_]\w*)\[")


def _float_calls(kernel: Any) -> bool:
    """Whether sin/cos are libmvec calls on float32 values: libmvec is in use and every buffer
    of the kernel is float32."""
    return config.libmvec and libmvec_installed(config.cxx) and buffer_dtypes(kernel) == {torch.float32}


def may_batch(kernel: Any, origins: set[str]) -> bool:
    """Whether a kernel of these ops may make calls in batches (before its body exists:
    emit_outer then leaves the innermost loop to the pointwise nest)."""
    return bool(origins & {"sin", "cos"}) and _float_calls(kernel)


def batchable_calls(body: list[str], kernel: Any) -> list[int]:
    """Indices of ``body``'s lines to make in batches: its sin/cos calls, when the body is
    straight-line definitions and stores, does inline math besides, and the calls are float
    libmvec calls."""
    lines = [line.strip() for line in body]
    calls = [i for i, line in enumerate(lines) if _CALL.match(line)]
    if not calls or not all(line.startswith("auto ") or _STORE.match(line) for line in lines):
        return []
    others = [line for i, line in enumerate(lines) if i not in calls]
    if not any(_INLINE_MATH.search(line) for line in others) or not _float_calls(kernel):
        return []
    # not a call whose argument loads what the body stored before it (a fused producer's
    # output read back: its block of calls would run before the stores)
    return [i for i in calls if not any(_reads_stored(lines, j) for j in _argument_lines(lines, i))]


def _argument_lines(lines: list[str], call: int) -> list[int]:
    """The lines before ``call`` defining the temporaries its argument needs, last first."""
    needed, out = set(_TMP.findall(lines[call][_DEFINES.match(lines[call]).end():])), []
    for j in range(call - 1, -1, -1):
        defined = _DEFINES.match(lines[j])
        if defined is not None and defined.group(1) in needed:
            out.append(j)
            needed |= set(_TMP.findall(lines[j][defined.end():]))
    return out


def _reads_stored(lines: list[str], i: int) -> bool:
    load = _LOAD.match(lines[i])
    return load is not None and any(line.startswith(f"{load.group(1)}[") for line in lines[:i])


def emit_call_block(code: CodeBuffer, body: list[str], calls: list[int], lane: str) -> tuple[list[str], list[str]]:
    """Declare a block's call arrays; returns the lines of the loop that fills them at ``lane``
    (the element's offset in the block) and ``body`` with the calls read from them."""
    first: list[str] = []
    rest = list(body)
    names = {}
    for n, i in enumerate(calls):
        names[i] = _CALL.match(body[i].strip()).group(1)
        code.writeline(f"alignas(64) float mi_call{n}[{BATCH}];")
        rest[i] = f"auto {names[i]} = mi_call{n}[{lane}];"
    lines = [line.strip() for line in body]
    # the calls and the definitions their arguments need, in body order
    for i in sorted(set(calls).union(*(_argument_lines(lines, i) for i in calls))):
        first.append(body[i])
        if i in names:
            first.append(f"mi_call{calls.index(i)}[{lane}] = {names[i]};")
    return first, rest


def emit_batched_loop(code: CodeBuffer, var: sympy.Symbol, lo: str, hi: str, body: list[str], calls: list[int]) -> None:
    """``for var in [lo, hi): body`` in blocks of BATCH, the calls of each block made first."""
    code.writeline(f"for (int64_t mi_blk = {lo}; mi_blk < {hi}; mi_blk += {BATCH})")
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(f"const int64_t mi_blk_end = mi_min_i64(mi_blk + {BATCH}, {hi});")
        first, rest = emit_call_block(code, body, calls, f"{var} - mi_blk")
        for lines in (first, rest):
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t {var} = mi_blk; {var} < mi_blk_end; {var}++)")
            with code.indent():
                for line in lines:
                    code.writeline(line)
    code.writeline("}")


def buffer_dtypes(kernel: Any) -> set[torch.dtype]:
    """The dtypes of every buffer a kernel's group reads or writes."""
    names = set().union(*(n.read_writes.read_names() | {d.name for d in n.read_writes.writes}
                          for n in kernel.group.nodes))
    return {V.graph.get_dtype(name) for name in names}
