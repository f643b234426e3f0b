"""Triton kernels: one ``@triton.jit`` function per fused group, from the same loop IR as C++.

Kernel shape: each program handles ``XBLOCK`` iterations of the group's shared outer loops
(``xindex``, flattened, masked by ``xmask``). A group whose nodes all run over the outer
loops alone is a 1-D pointwise kernel (``triton_poi_``). Otherwise each *loop* -- consecutive
nodes with the same inner ranges, as in the C++ kernel -- covers its inner ranges with a
second block axis ``rindex`` (masked by ``rmask``): the whole row at once when it is short
and static (a persistent reduction, ``triton_per_``), or in ``RBLOCK`` chunks with
accumulators when it is long (``triton_red_``). A later loop that reads what an earlier one
stored waits for it at a ``tl.debug_barrier()`` (stores of one loop are block-local).

Values carry the block axes they vary along (``x``, ``r``), so loads and stores get exactly
the masks their index needs and pointers broadcast to the value they store.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import sympy
import torch

from minductor import config as settings
from minductor.codegen.common import CodeBuffer, KernelArgs, KernelCode, py_index
from minductor.codegen.loop_shapes import Loop, joins
from minductor.codegen.triton_heuristics import BlockConfig, candidate_configs, next_power_of_2, pick_config
from minductor.codegen.triton_ops import TRITON_TYPES, TV, TritonOps, compute_dtype, triton_constant
from minductor.ir.indexing import FloorDiv, ModularIndexing, affine_coeffs, index_symbol, make_vars, simplify_index
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.nodes import FusedGroup
from minductor.sizevars import kernel_symbols
from minductor.virtualized import V

Expr = sympy.Expr
X = frozenset({"x"})
R = frozenset({"r"})
XR = frozenset({"x", "r"})
# store modes with a Triton atomic, and the dtypes it takes
_ATOMICS = {"add": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}
_ATOMIC_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int32, torch.int64}


_SIGNATURE_TYPES = {
    torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}


class TritonCodegenError(Exception):
    """The group holds something this backend does not generate; the graph runs through aten."""


def triton_index(expr: Expr) -> str:
    """Print an integer index expression as Triton (Python) source."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add:
        terms = [triton_index(a) for a in sorted(expr.args, key=sympy.default_sort_key)]
        return " + ".join(t if not t.startswith("-") else f"({t})" for t in terms)
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        body = "*".join(_paren(triton_index(f)) for f in sympy.Mul.make_args(rest))
        if coeff == 1:
            return body
        if coeff == -1:
            return f"-{_paren(body)}"
        return f"{int(coeff)}*{body}" if coeff.is_Integer else f"({triton_index(coeff)})*{body}"
    if isinstance(expr, FloorDiv):
        return f"(({triton_index(expr.args[0])}) // {_paren(triton_index(expr.args[1]))})"
    if isinstance(expr, ModularIndexing):
        base, div, mod = (triton_index(a) for a in expr.args)
        inner = base if expr.args[1] == 1 else f"({base}) // {_paren(div)}"
        return f"(({inner}) % {_paren(mod)})"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return "*".join([_paren(triton_index(expr.base))] * int(expr.exp))
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "tl.maximum" if isinstance(expr, sympy.Max) else "tl.minimum"
        first, *rest = expr.args
        if not rest:
            return triton_index(first)
        return f"{fn}({triton_index(first)}, {triton_index(type(expr)(*rest))})"
    raise TritonCodegenError(f"cannot print index expression {expr} ({type(expr).__name__})")


def _paren(s: str) -> str:
    return s if s.replace("_", "").isalnum() else f"({s})"


def _numel(sizes: list[Expr]) -> Expr:
    out: Expr = sympy.Integer(1)
    for s in sizes:
        out = out * s
    return out


def _decompose(code: CodeBuffer, flat: str, variables: list[sympy.Symbol], sizes: list[Expr]) -> None:
    """Define each loop variable from the flat block index (row-major)."""
    stride: Expr = sympy.Integer(1)
    defs = []
    for i in reversed(range(len(variables))):
        var, size = variables[i], sizes[i]
        if i == 0:
            expr = f"{flat}" if stride == 1 else f"{flat} // {_paren(triton_index(stride))}"
        elif stride == 1:
            expr = f"{flat} % {_paren(triton_index(size))}"
        else:
            expr = f"({flat} // {_paren(triton_index(stride))}) % {_paren(triton_index(size))}"
        defs.append(f"{var} = {expr}")
        stride = stride * size
    for line in reversed(defs):
        code.writeline(line)


@dataclasses.dataclass
class LoopState:
    """Code of one loop block: accumulators before it, the body, and what runs after it."""

    rblock: str  # the constexpr name of its r-axis block ("1" for an x-only loop)
    looped: bool
    prefix: CodeBuffer
    body: CodeBuffer
    suffix: CodeBuffer


class TritonKernel:
    """Generates the Triton source of one fused group."""

    def __init__(self, group: FusedGroup, index: int) -> None:
        self.group = group
        self.index = index
        self.args = KernelArgs()
        self.cse: dict[str, TV] = {}
        self.counter = 0
        self.var_dims: dict[str, frozenset[str]] = {}
        self.range_of: dict[sympy.Symbol, Expr] = {}
        self.mask_stack: list[TV] = []
        self.store_cache: dict[tuple[str, str], TV] = {}
        self.uses_error_flag = False
        self.two_d = False
        self.loop: LoopState | None = None
        self.out: CodeBuffer = CodeBuffer()  # where cse_value writes (the loop body)

    # -- values ----------------------------------------------------------------------------

    def newvar(self) -> str:
        self.counter += 1
        return f"tmp{self.counter - 1}"

    def cse_value(self, expr: str, dtype: torch.dtype, dims: frozenset[str]) -> TV:
        if expr in self.cse:
            return self.cse[expr]
        var = TV(self.newvar(), dtype, dims)
        self.out.writeline(f"{var} = {expr}")
        self.cse[expr] = var
        return var

    def shape(self, dims: frozenset[str]) -> str:
        if not self.two_d:
            return "[XBLOCK]" if dims else "[]"
        rblock = self.loop.rblock if self.loop is not None else "1"
        return f"[{'XBLOCK' if 'x' in dims else 1}, {rblock if 'r' in dims else 1}]"

    def index_str(self, expr: Expr) -> tuple[str, frozenset[str]]:
        expr = simplify_index(sympy.expand(sympy.sympify(expr)), self.range_of)
        dims: frozenset[str] = frozenset()
        for s in expr.free_symbols:
            dims |= self.var_dims.get(s.name, frozenset())
        return triton_index(expr), dims

    def mask_for(self, dims: frozenset[str]) -> tuple[str | None, frozenset[str]]:
        parts = []
        if "x" in dims:
            parts.append("xmask")
        if "r" in dims:
            parts.append("rmask")
        scalars = []
        for m in self.mask_stack:
            if not m.dims:
                scalars.append(m)
                continue
            parts.append(m)
            dims = dims | m.dims
            if "x" in m.dims and "xmask" not in parts:
                parts.insert(0, "xmask")
            if "r" in m.dims and "rmask" not in parts:
                parts.insert(1 if "xmask" in parts else 0, "rmask")
        mask = " & ".join(parts) if parts else None
        for m in scalars:
            # a scalar condition selects the block mask (``&`` with a 0-d bool trips the interpreter)
            mask = f"tl.where({m}, {mask}, False)" if mask else m
        return mask, dims

    def pointer(self, arg: str, index: str, index_dims: frozenset[str], dims: frozenset[str]) -> str:
        """``arg + index``, broadcast to the block shape of ``dims`` when the index is narrower."""
        if dims - index_dims:
            return f"{arg} + ({index}) + tl.zeros({self.shape(dims)}, tl.int32)"
        return f"{arg} + ({index})"

    # -- handler callbacks -------------------------------------------------------------------

    def load(self, name: str, index: Expr) -> TV:
        idx, dims = self.index_str(index)
        if not self.mask_stack and (name, idx) in self.store_cache:
            return self.store_cache[(name, idx)]
        arg = self.args.input(name)
        dtype = V.graph.get_dtype(name)
        mask, mdims = self.mask_for(dims)
        ptr = self.pointer(arg, idx, dims, mdims)
        expr = f"tl.load({ptr}, {mask}, other=0)" if mask else f"tl.load({ptr})"
        if dtype in (torch.float16, torch.bfloat16):
            expr += ".to(tl.float32)"
        return self.cse_value(expr, compute_dtype(dtype), mdims)

    def store(self, name: str, index: Expr, value: TV, mode: str | None, reduction: bool = False) -> None:
        arg = self.args.output(name)
        dtype = V.graph.get_dtype(name)
        idx, dims = self.index_str(index)
        mask, mdims = self.mask_for(dims | value.dims)
        out = self.loop.suffix if reduction else self.out
        stored = value if value.dtype == dtype else f"{value}.to({TRITON_TYPES[dtype]})"
        if dtype == torch.bfloat16:
            stored = f"round_bf16({value}.to(tl.float32)).to(tl.bfloat16)"
        ptr = self.pointer(arg, idx, dims, mdims)
        if mode is None:
            out.writeline(f"tl.store({ptr}, {stored}{', ' + mask if mask else ''})")
            if not reduction and dtype not in (torch.float16, torch.bfloat16):
                self.store_cache[(name, idx)] = value
            return
        if mode not in _ATOMICS or dtype not in _ATOMIC_DTYPES:
            raise TritonCodegenError(f"a combining store ({mode}) into a {dtype} buffer has no Triton atomic")
        self.uses_atomics = True
        out.writeline(f"{_ATOMICS[mode]}({ptr}, {stored}{', ' + mask if mask else ''}, sem='relaxed')")

    def indirect_indexing(self, x: TV, size: Expr, check: bool, wrap: bool = True) -> Expr:
        size_s, _ = self.index_str(size)
        var = self.cse_value(f"tl.where({x} < 0, {x} + {_paren(size_s)}, {x})", x.dtype, x.dims) if wrap else x
        if check:
            # out of range: record it for the wrapper to raise, and read a safe element instead
            self.uses_error_flag = True
            bad = self.cse_value(f"({var} < 0) | ({var} >= {_paren(size_s)})", torch.bool, var.dims)
            mask, mdims = self.mask_for(var.dims)
            cond = f"{bad} & {mask}" if mask else bad
            ptr = self.pointer("mi_err", "0", frozenset(), mdims)
            self.out.writeline(f"tl.store({ptr}, tl.full([], 1, tl.int64), {cond})")
            var = self.cse_value(f"tl.where({bad}, 0, {var})", x.dtype, var.dims)
        self.var_dims[str(var)] = var.dims
        return index_symbol(str(var))

    def masked(self, mask: TV, body: Any, other: bool | float) -> TV:
        saved = dict(self.cse)
        self.mask_stack.append(mask)
        try:
            value = body()
        finally:
            self.mask_stack.pop()
            self.cse = saved
        dims = mask.dims | value.dims
        return self.cse_value(f"tl.where({mask}, {value}, {triton_constant(other, value.dtype)})", value.dtype, dims)

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, rtype: str, value: TV) -> Any:
        from minductor.codegen.triton_reduction import emit_reduction

        key = f"{rtype}:{value}"
        if key not in self.cse:
            self.cse[key] = emit_reduction(self, dtype, src_dtype, rtype, value)
        return self.cse[key]

    # -- structure -----------------------------------------------------------------------

    def _transposed(self) -> bool:
        """Whether this is one pointwise loop over 2+ outer dims where some buffer is contiguous along
        the second-innermost dim and another along the innermost (a transpose): then the last dim
        becomes the block's second axis and each program covers a 2-D tile, coalesced for both."""
        outer = self.group.outer
        if len(outer) < 2 or self.group.has_reduction() or any(len(n.pw_ranges) != len(outer) for n in self.group.nodes):
            return False
        if any(not s.is_Integer or int(s) < 16 for s in outer[-2:]):
            return False
        inner, second = make_vars("x", len(outer))[-1], make_vars("x", len(outer))[-2]
        found_inner = found_second = False
        for node in self.group.nodes:
            for dep in node.read_writes.reads | node.read_writes.writes:
                if not isinstance(dep, MemoryDep):
                    continue
                coeffs = affine_coeffs(dep.index, [inner, second])
                if coeffs is not None:
                    found_inner |= coeffs[inner] == 1
                    found_second |= coeffs[second] == 1
        return found_inner and found_second

    def split_loops(self) -> list[Loop]:
        n_outer = self.n_outer
        loops: list[Loop] = []
        for node in self.group.nodes:
            pw_inner, red = node.pw_ranges[n_outer:], node.red_ranges
            if loops and loops[-1].key() == (tuple(pw_inner), tuple(red)) and joins(loops[-1], node):
                loops[-1].nodes.append(node)
            else:
                loops.append(Loop([node], list(pw_inner), list(red)))
        return loops

    def generate(self) -> KernelCode:
        group = self.group
        reads = set().union(*(n.read_writes.read_names() for n in group.nodes))
        self.args.declare_inplace({n.node.mutates for n in group.nodes if n.node.mutates} & reads)
        tiled = self._transposed()
        self.n_outer = len(group.outer) - 1 if tiled else len(group.outer)
        loops = self.split_loops()
        self.two_d = any(lp.pw_inner or lp.red or any(n.is_reduction() for n in lp.nodes) for lp in loops)
        outer = list(group.outer)[: self.n_outer]
        xnumel = _numel(outer)
        inner_numels = [_numel(lp.pw_inner + lp.red) for lp in loops]
        reductions = [any(n.is_reduction() for n in lp.nodes) for lp in loops]
        config = pick_config(xnumel, inner_numels, self.two_d, reductions, tiled)
        self.config = config
        body = CodeBuffer()
        body._indent = 1
        xvars = make_vars("x", len(outer))
        for v, s in zip(xvars, outer):
            self.range_of[v] = s
            self.var_dims[v.name] = X
        written: set[str] = set()
        for i, (loop, rnumel) in enumerate(zip(loops, inner_numels)):
            loop_reads = set().union(*(n.read_writes.read_names() for n in loop.nodes))
            if loop_reads & written:
                body.writeline("tl.debug_barrier()")
            self.emit_loop(body, loop, i, rnumel, config)
            written |= set().union(*(n.write_names() for n in loop.nodes))
        return self.render(body, xnumel, xvars, outer, config, loops)

    def emit_loop(self, code: CodeBuffer, loop: Loop, i: int, rnumel: Expr, config: BlockConfig) -> None:
        n_outer = self.n_outer
        pw_vars = make_vars("x", len(loop.pw_inner), start=n_outer)
        red_vars = make_vars("r", len(loop.red))
        inner_vars, inner_sizes = pw_vars + red_vars, loop.pw_inner + loop.red
        for v, s in zip(inner_vars, inner_sizes):
            self.range_of[v] = s
            self.var_dims[v.name] = R
        is_red = any(n.is_reduction() for n in loop.nodes)
        has_r = self.two_d and (bool(inner_vars) or is_red)
        looped = has_r and config.looped[i]
        state = LoopState(f"RBLOCK{i}" if has_r else "1", looped, CodeBuffer(), CodeBuffer(), CodeBuffer())
        self.loop, self.out, self.cse, self.store_cache = state, state.body, {}, {}
        with V.set_ops(TritonOps(self)), V.set_kernel(self):
            for node in loop.nodes:
                node.run(make_vars("x", n_outer) + pw_vars, red_vars)
        code.writeline(f"# loop {i}: {', '.join(n.node.name for n in loop.nodes)}")
        code.splice(state.prefix)
        rn = triton_index(rnumel)
        if has_r and looped:
            code.writeline(f"for roffset in range(0, {rn}, RBLOCK{i}):")
            code._indent += 1
            code.writeline(f"rindex = roffset + tl.arange(0, RBLOCK{i})[None, :]")
        elif has_r:
            code.writeline(f"rindex = tl.arange(0, RBLOCK{i})[None, :]")
        if has_r:
            code.writeline(f"rmask = rindex < {rn}")
            _decompose(code, "rindex", inner_vars, inner_sizes)
        code.splice(state.body)
        if has_r and looped:
            code._indent -= 1
        code.splice(state.suffix)
        self.loop = None

    def render(self, body: CodeBuffer, xnumel: Expr, xvars: list[sympy.Symbol], outer: list[Expr],
               config: BlockConfig, loops: list[Loop]) -> KernelCode:
        name = self.kernel_name(config)
        head = CodeBuffer()
        head._indent = 1
        int64 = config.int64
        pid = "tl.program_id(0).to(tl.int64)" if int64 else "tl.program_id(0)"
        head.writeline(f"xnumel = {triton_index(xnumel)}")
        head.writeline(f"xoffset = {pid} * XBLOCK")
        head.writeline(f"xindex = xoffset + tl.arange(0, XBLOCK){'[:, None]' if self.two_d else ''}")
        head.writeline("xmask = xindex < xnumel")
        _decompose(head, "xindex", xvars, outer)
        text = "\n".join(head.lines + body.lines)
        size_args = kernel_symbols(text)
        buffers = self.args.call_order()
        params = [arg for _, arg, _ in buffers] + size_args + (["mi_err"] if self.uses_error_flag else [])
        blocks = [f"RBLOCK{i}" for i in range(len(loops)) if config.rblocks[i] is not None]
        params += [f"{b}: tl.constexpr" for b in ["XBLOCK", *blocks]]
        src = CodeBuffer()
        for line in self._imports():
            src.writeline(line)
        src.writeline("@triton.jit")
        src.writeline(f"def {name}({', '.join(params)}):")
        src.writeline(f"    # Source nodes: {', '.join(self.group.names())}")
        src.lines.extend(head.lines + body.lines)
        launch_args = [buf for buf, _, _ in buffers] + size_args
        if self.uses_error_flag:
            launch_args.append("mi_err")
        consts = [f"XBLOCK={config.xblock}"] + [f"RBLOCK{i}={b}" for i, b in enumerate(config.rblocks) if b is not None]
        grid = f"(triton.cdiv({py_index(xnumel)}, {config.xblock}),)"
        call = f"{name}[{grid}]({', '.join(launch_args + consts + [f'num_warps={config.num_warps}'])})"
        if self.autotunable(src.getvalue()):
            base = {"XBLOCK": config.xblock} | {f"RBLOCK{i}": b for i, b in enumerate(config.rblocks) if b is not None}
            limits = {"XBLOCK": next_power_of_2(int(V.graph.sizevars.hint(xnumel)))}
            for i, (b, lp) in enumerate(zip(config.rblocks, config.looped)):
                if b is not None and lp:  # a persistent row must stay whole
                    limits[f"RBLOCK{i}"] = next_power_of_2(int(V.graph.sizevars.hint(_numel(loops[i].pw_inner + loops[i].red))))
            grid_fn = f"lambda c: (triton.cdiv({py_index(xnumel)}, c['XBLOCK']),)"
            call = autotune_call(name, src.getvalue(), grid_fn, launch_args, candidate_configs(base, config.num_warps, limits))
        if self.uses_error_flag:
            device = buffers[0][0]
            call = (f"mi_err = torch.zeros(1, dtype=torch.int64, device={device}.device); {call}; "
                    f"check_index_error(mi_err, {name!r})")
        if not (xnumel.is_Integer and int(xnumel) > 0):
            call = f"if {py_index(xnumel)} > 0: {call}" if not xnumel.is_Integer else "pass  # empty kernel"
        consts = {"XBLOCK": config.xblock} | {f"RBLOCK{i}": b for i, b in enumerate(config.rblocks) if b is not None}
        return self.kernel_code(name, src.getvalue(), call, size_args, consts)

    def kernel_code(self, name: str, source: str, call: str, size_args: list[str], consts: dict[str, int]) -> KernelCode:
        """The KernelCode, with ``triton_signature`` (argument types and constexprs) so the kernel
        can also be compiled ahead of time for a GPU target (tests do, to check the source)."""
        signature = {arg: "*" + _SIGNATURE_TYPES[V.graph.get_dtype(buf)] for buf, arg, _ in self.args.call_order()}
        signature |= {s: "i64" for s in size_args}
        if self.uses_error_flag:
            signature["mi_err"] = "*i64"
        return KernelCode(name, "triton", source, call, ".py",
                          triton_signature=(signature | {k: "constexpr" for k in consts}, consts))

    def autotunable(self, source: str) -> bool:
        """``config.triton_autotune`` and a launch that can be repeated without changing the result."""
        return settings.triton_autotune and not self.args.inplace and "tl.atomic_" not in source

    def _imports(self) -> list[str]:
        return [
            "import triton",
            "import triton.language as tl",
            "from minductor.runtime.triton_helpers import libdevice  # noqa: F401",
            "from minductor.runtime.triton_helpers import (  # noqa: F401",
            "    argmax_combine, argmin_combine, first_index_of, floordiv_float, floordiv_int, max_nan, maximum, min_nan,",
            "    minimum, mod_int, prod, round_bf16, welford,",
            ")",
            "",
            "",
        ]

    def kernel_name(self, config: BlockConfig) -> str:
        origins: set[str] = set()
        for n in self.group.nodes:
            origins |= set(n.node.origins)
        parts = sorted(o for o in origins if o)[:6]
        if not self.group.has_reduction():
            kind = "poi"
        else:
            kind = "red" if any(config.looped) else "per"
        return f"triton_{kind}_fused_" + "_".join(parts + [str(self.index)])


def autotune_call(name: str, source: str, grid_fn: str, launch_args: list[str], candidates: list[dict[str, int]]) -> str:
    """The wrapper line launching ``name`` through the autotuner (runtime/triton_autotune.py). The
    winner is cached under the name and a digest of the source: kernels of other graphs may share
    the name, and a persistent reduction's block must fit its own row."""
    key = f"{name}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    return f"autotune_launch({key!r}, {name}, {grid_fn}, ({', '.join(launch_args)},), {candidates!r})"


def _interpreting() -> bool:
    from triton import knobs

    from minductor.runtime import triton_helpers

    return bool(knobs.runtime.interpret) and triton_helpers.INTERPRET


def codegen_triton_kernel(group: FusedGroup, index: int) -> KernelCode:
    """The Triton kernel of one fused group (the wrapper includes its source verbatim)."""
    from minductor.codegen.wrapper import WrapperCodegenError

    device = group.nodes[0].node.get_device()
    if device.type != "cuda" and not _interpreting():
        raise WrapperCodegenError(
            f"Triton kernels for {device.type} tensors run in Triton's interpreter: set the environment variable "
            "TRITON_INTERPRET=1 before the first kernel loads, or use minductor.config.cpu_backend = 'cpp'"
        )
    try:
        return TritonKernel(group, index).generate()
    except TritonCodegenError as e:
        raise WrapperCodegenError(f"Triton codegen: {e}") from e


__all__ = ["TritonKernel", "codegen_triton_kernel", "triton_index"]
