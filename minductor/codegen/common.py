"""Shared codegen pieces: index printing, kernel arguments, CSE and indented code buffers."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
from collections.abc import Iterator, Sequence
from typing import Any

import sympy
import torch

from minductor.ir.indexing import FloorDiv, ModularIndexing

Expr = sympy.Expr

_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def definition_names(roots: Sequence[str], definitions: dict[str, str]) -> list[str] | None:
    """The ``tmp`` names ``roots`` are computed from, transitively, themselves included, given
    each one's C++ expression in ``definitions``; None when one of them has none."""
    names: list[str] = []
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in names:
            continue
        expr = definitions.get(name)
        if expr is None:
            if name.startswith("tmp"):
                return None
            continue
        names.append(name)
        pending.extend(n for n in _IDENT.findall(expr) if n.startswith("tmp"))
    return names


CPP_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "mi_half",
    torch.bfloat16: "mi_bf16", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
# the type values of a dtype are computed in (fp16/bf16 compute in float32)
CPP_COMPUTE_TYPES = CPP_TYPES | {torch.float16: "float", torch.bfloat16: "float"}
# the type of kernel pointer arguments: bool storage is read as bytes (GCC does not
# vectorize loads of C++ bool)
CPP_STORAGE_TYPES = CPP_TYPES | {torch.bool: "uint8_t"}


def from_storage(dtype: torch.dtype, access: str) -> str:
    """A value of ``dtype`` read from memory (``access``), as kernels compute it: half and
    bfloat16 as float (both are stored as their 16 bits), bool from its byte. Every array a
    kernel keeps a buffer in (the buffer, a local, a row scratch) stores it this way."""
    if dtype == torch.float16:
        return f"mi_half_to_float({access})"
    if dtype == torch.bfloat16:
        return f"mi_bf16_to_float({access})"
    if dtype == torch.bool:
        return f"static_cast<bool>({access})"
    return access


def to_storage(dtype: torch.dtype, value: str) -> str:
    """A computed value as ``dtype`` is stored (the inverse of ``from_storage``)."""
    if dtype == torch.float16:
        return f"mi_float_to_half({value})"
    if dtype == torch.bfloat16:
        return f"mi_float_to_bf16({value})"
    return f"static_cast<{CPP_STORAGE_TYPES[dtype]}>({value})"


def stored_bits(cache: dict[str, str], dtype: torch.dtype, value: str) -> str:
    """``value`` as ``dtype`` is stored; a half or bfloat16 value read from memory as it is
    (``cache``: a kernel's CSE expressions -> names), the load itself: its 16 bits (an embedding
    row, a gather: the float round trip cost 45 instructions per 32 bfloat16 elements and made
    NaN payloads canonical, which eager's copy keeps)."""
    if dtype in (torch.float16, torch.bfloat16):
        source = next((e for e, v in cache.items() if v == value), "")
        function = re.escape(from_storage(dtype, "").removesuffix("()"))
        converted = re.fullmatch(rf"{function}\((\w+\[[^\[\]]*\])\)", source)
        if converted:  # (a load: a pointer and an index with no nested subscript)
            return converted.group(1)
    return to_storage(dtype, value)


def indent_of(line: str) -> str:
    """The leading whitespace of a line of generated code."""
    return line[: len(line) - len(line.lstrip())]


def cpp_index(expr: Expr) -> str:
    """Print an integer index expression as C++."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add:
        terms = [cpp_index(a) for a in sorted(expr.args, key=sympy.default_sort_key)]
        out = terms[0]
        for t in terms[1:]:
            out += f" - {t[1:]}" if t.startswith("-") and " " not in t else f" + {t}"
        return out
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        factors = [paren(cpp_index(f)) for f in sympy.Mul.make_args(rest)]
        body = "*".join(factors)
        if coeff == 1:
            return body
        if coeff == -1:
            return f"-{body}"
        return f"{int(coeff)}L*{body}" if coeff.is_Integer else f"({coeff})*{body}"
    if isinstance(expr, FloorDiv):
        return f"({cpp_index(expr.args[0])}) / {paren(cpp_index(expr.args[1]))}"
    if isinstance(expr, ModularIndexing):
        base, div, mod = expr.args
        inner = cpp_index(base) if div == 1 else f"({cpp_index(base)}) / {paren(cpp_index(div))}"
        return f"(({inner}) % {paren(cpp_index(mod))})"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return "*".join([paren(cpp_index(expr.base))] * int(expr.exp))
    if isinstance(expr, sympy.Max):
        return f"mi_max_i64({cpp_index(expr.args[0])}, {cpp_index(sympy.Max(*expr.args[1:]))})"
    if isinstance(expr, sympy.Min):
        return f"mi_min_i64({cpp_index(expr.args[0])}, {cpp_index(sympy.Min(*expr.args[1:]))})"
    raise NotImplementedError(f"cannot print index expression {expr} ({type(expr).__name__})")


_PARSE_BINARY: dict[type, Any] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: FloorDiv, ast.Mod: lambda a, b: ModularIndexing(a, 1, b),
}
_PARSE_CALLS: dict[str, Any] = {"mi_max_i64": sympy.Max, "mi_min_i64": sympy.Min}


def parse_cpp_index(text: str) -> Expr | None:
    """The index expression ``cpp_index`` printed as ``text``, or None for anything else. Its ``/`` and ``%`` are integer division and remainder
    of non-negative values, so they read back as FloorDiv and ModularIndexing; parsed by
    SymPy they would be exact fractions (a bfloat16 row of ``s0 / 4`` went wrong that way)."""
    from minductor.ir.indexing import index_symbol

    def convert(node: ast.AST) -> Expr:
        if isinstance(node, ast.Expression):
            return convert(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sympy.Integer(node.value)
        if isinstance(node, ast.Name):
            return index_symbol(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -convert(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _PARSE_BINARY:
            return _PARSE_BINARY[type(node.op)](convert(node.left), convert(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _PARSE_CALLS and not node.keywords:
            return _PARSE_CALLS[node.func.id](*(convert(a) for a in node.args))
        raise ValueError(f"not an index expression: {ast.dump(node)}")

    try:
        return convert(ast.parse(re.sub(r"\b(\d+)L\b", r"\1", text.strip()), mode="eval"))
    except (SyntaxError, ValueError, TypeError):
        return None


def py_shape(values: Sequence[Expr | None]) -> str:
    """A tuple of size expressions as Python source (None stays None: unchecked)."""
    items = ["None" if v is None else py_index(v) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def py_index(expr: Expr) -> str:
    """Print an integer size expression as Python (for the wrapper)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add:
        return " + ".join(py_index(a) for a in sorted(expr.args, key=sympy.default_sort_key))
    if expr.is_Mul:
        return "*".join(paren(py_index(a)) for a in expr.args)
    if isinstance(expr, FloorDiv):
        return f"({py_index(expr.args[0])}) // {paren(py_index(expr.args[1]))}"
    if isinstance(expr, ModularIndexing):
        base, div, mod = (py_index(a) for a in expr.args)
        return f"((({base}) // {paren(div)}) % {paren(mod)})"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return f"{paren(py_index(expr.base))}**{int(expr.exp)}"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(expr, sympy.Max) else "min"
        return f"{fn}({', '.join(py_index(a) for a in expr.args)})"
    raise NotImplementedError(f"cannot print size expression {expr} ({type(expr).__name__})")


def paren(s: str) -> str:
    return s if s.replace("_", "").isalnum() else f"({s})"


@dataclasses.dataclass
class KernelCode:
    """One generated kernel, as the wrapper needs it.

    ``source`` is dumped as ``<name><file_suffix>``. For ``cpp`` it is C++ that the wrapper
    compiles through the cache; for other backends it is Python defining ``name`` that the
    wrapper module includes verbatim. ``call`` is the wrapper line that launches it.
    ``local_buffers``: buffers the kernel keeps to itself, which memory planning never allocates.
    ``triton_signature``: a Triton kernel's argument types and constexpr values (for compiling
    it ahead of time for a GPU target).
    """

    name: str
    backend: str  # "cpp", "triton", "xla"
    source: str
    call: str
    file_suffix: str = ".cpp"
    local_buffers: frozenset[str] = frozenset()
    triton_signature: tuple[dict[str, str], dict[str, int]] | None = None


@dataclasses.dataclass
class KernelArgs:
    """Buffers a kernel touches, named ``in_ptrN`` / ``out_ptrN`` / ``in_out_ptrN`` (read and
    written by the same kernel, e.g. a scatter or an in-place update) in call order."""

    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    inplace: dict[str, str] = dataclasses.field(default_factory=dict)
    dying: dict[str, str] = dataclasses.field(default_factory=dict)  # input -> output written over it

    def declare_inplace(self, names: set[str]) -> None:
        for name in sorted(names):
            self.inplace[name] = f"in_out_ptr{len(self.inplace)}"

    def declare_written_over(self, written_over: dict[str, str]) -> None:
        """Outputs stored into the storage of a value that dies in this kernel (output -> that
        value): they become one ``in_out_ptr``, passed under the last name of the chain (a
        softmax's exp written over a matmul result, then its division over the exp)."""
        next_of = {dying: out for out, dying in written_over.items()}

        def last(name: str) -> str:
            while name in next_of:
                name = next_of[name]
            return name

        for out in sorted({last(o) for o in written_over}):
            self.inplace[out] = f"in_out_ptr{len(self.inplace)}"
        for name in next_of:
            self.dying[name] = last(name)

    def input(self, name: str) -> str:
        if name in self.dying:
            return self.inplace[self.dying[name]]
        if name in self.inplace:
            return self.inplace[name]
        if name in self.outputs:
            return self.outputs[name]
        if name not in self.inputs:
            self.inputs[name] = f"in_ptr{len(self.inputs)}"
        return self.inputs[name]

    def output(self, name: str) -> str:
        if name in self.dying:  # a value stored and read back here, then written over
            return self.inplace[self.dying[name]]
        if name in self.inplace:
            return self.inplace[name]
        if name not in self.outputs:
            self.outputs[name] = f"out_ptr{len(self.outputs)}"
        return self.outputs[name]

    def call_order(self) -> list[tuple[str, str, bool]]:
        """(buffer name, arg name, is_written) in signature order."""
        return (
            [(b, a, True) for b, a in self.inplace.items()]
            + [(b, a, False) for b, a in self.inputs.items() if b not in self.outputs]
            + [(b, a, True) for b, a in self.outputs.items()]
        )


class CodeBuffer:
    """Lines with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._indent = 0

    def writeline(self, line: str) -> None:
        self.lines.append("    " * self._indent + line if line else "")

    def splice(self, other: CodeBuffer) -> None:
        for line in other.lines:
            self.writeline(line)

    @contextlib.contextmanager
    def indent(self, open_brace: bool = True) -> Iterator[None]:
        if open_brace:
            self.writeline("{")
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1
            if open_brace:
                self.writeline("}")

    def getvalue(self) -> str:
        return "\n".join(self.lines) + "\n"


class CSE:
    """Common-subexpression elimination: the same expression yields the same ``tmpN``."""

    def __init__(self, prefix: str = "tmp") -> None:
        self.prefix = prefix
        self.cache: dict[str, str] = {}
        self.counter = 0

    def newvar(self) -> str:
        name = f"{self.prefix}{self.counter}"
        self.counter += 1
        return name

    def generate(self, buffer: CodeBuffer, expr: str) -> str:
        if expr in self.cache:
            return self.cache[expr]
        var = self.newvar()
        buffer.writeline(f"auto {var} = {expr};")
        self.cache[expr] = var
        return var

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Entries made inside are forgotten on exit (they live in a nested C++ scope)."""
        saved = dict(self.cache)
        try:
            yield
        finally:
            self.cache = saved
