"""The generated Python module: kernel sources, then ``call(args)`` that allocates, calls
kernels and extern ops, frees dead buffers and returns outputs."""
from __future__ import annotations

import math
import re
from typing import Any

import sympy
import torch

from minductor import config
from minductor.codegen.common import CodeBuffer, KernelCode, py_index, py_shape
from minductor.codegen.cpp import CppKernel, kernel_name
from minductor.codegen.cpp_scan import CppScanKernel
from minductor.codegen.cpp_rows import row_scratch_buffers
from minductor.codegen.memory import PoolSlots, plan_memory, plan_written_over
from minductor.ir.nodes import (
    Buffer,
    ComputedBuffer,
    ExternKernel,
    ExternKernelAlloc,
    ExternKernelOut,
    FallbackKernel,
    InputBuffer,
    IRNode,
    MultiOutput,
)
from minductor.ir.views import ReinterpretView
from minductor.runtime import helpers
from minductor.runtime.loader import WrapperModule
from minductor.scheduler import Scheduler
from minductor.scheduler.nodes import ExternSchedulerNode, FusedGroup

# runtime/helpers.py functions every wrapper module imports (extern calls may name them as ops)
WRAPPER_HELPERS = ("assert_size_stride", "check_dtype", "check_index_error", "mm_onednn", "reinterpret_tensor",
                   "restride")


class WrapperCodegenError(Exception):
    """The graph holds a value the wrapper cannot express; the graph then runs through aten."""


def uses_triton(group: FusedGroup) -> bool:
    return group.nodes[0].node.get_device().type == "cuda" or config.cpu_backend == "triton"


def codegen_kernel(group: FusedGroup, index: int, internal: frozenset[str] = frozenset(),
                   written_over: dict[str, str] | None = None, row_scratch: dict[str, int] | None = None) -> KernelCode:
    """Generate one fused group with the backend its device calls for. ``internal``: buffers
    this group writes that nothing else reads; the C++ kernel may keep them in locals (the
    returned ``KernelCode.local_buffers``), and then they are never allocated. ``written_over``:
    outputs the C++ kernel stores into a dying input's storage (``plan_written_over``).
    ``row_scratch``: internal buffers it may keep in a row scratch (``row_scratch_buffers``)."""
    if uses_triton(group):
        try:
            from minductor.codegen.triton import codegen_triton_kernel
        except ImportError as e:
            raise WrapperCodegenError(
                f"Triton code generation is not available yet ({e}); set minductor.config.cpu_backend = 'cpp'"
            ) from e
        return codegen_triton_kernel(group, index)
    name = kernel_name(group, index)
    kernel = CppScanKernel(group, name) if group.has_scan() else CppKernel(group, name)
    kernel.internal = internal
    kernel.written_over = dict(written_over or {})
    kernel.row_candidates = dict(row_scratch or {})
    source = kernel.generate()
    # plain ints: the loader declared the kernel's parameter types (runtime/cache.with_argtypes)
    call_args = [f"{buf}.data_ptr()" for buf, _, _ in kernel.args.call_order()] + list(kernel.size_args)
    call = f"{name}({', '.join(call_args)})"
    if kernel.uses_error_flag:
        # the flag a ctypes int, not a tensor: torch.zeros and reading it back took 3-4 us a call
        call = (f"mi_err = c_int64(0); {name}({', '.join([*call_args, 'addressof(mi_err)'])}); "
                f"check_index_error(mi_err.value, {name!r})")
    return KernelCode(name, "cpp", source, call, ".cpp", frozenset(kernel.local) | frozenset(kernel.rows) | frozenset(kernel.forwarded))


def _internal_buffers(group: FusedGroup, i: int, last_use: dict[str, int], outputs: set[str]) -> frozenset[str]:
    """Buffers group ``i`` writes that no other unit reads: ``last_use`` counts reads and writes,
    so a buffer first written here whose last use is here is read by this group alone."""
    return frozenset(n.node.name for n in group.nodes
                     if not n.node.mutates and n.node.name not in outputs and last_use.get(n.node.name) == i)


def py_arg(obj: Any) -> str:
    """Python source for an extern call argument."""
    if isinstance(obj, ReinterpretView):
        lay, base = obj.layout, getattr(obj.data, "layout", None)
        if base is not None and (lay.size, lay.stride, lay.offset) == (base.size, base.stride, 0):
            return obj.data.name  # the whole buffer as it is laid out
        return f"reinterpret_tensor({obj.data.name}, {py_shape(lay.size)}, {py_shape(lay.stride)}, {py_index(lay.offset)})"
    if isinstance(obj, Buffer):
        return obj.name
    if isinstance(obj, IRNode):
        raise WrapperCodegenError(f"unrealized IR value {obj}")
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(py_arg(o) for o in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner}{',' if len(obj) == 1 else ''})"
    if isinstance(obj, torch._ops.OpOverload):
        return _aten_name(obj)
    if isinstance(obj, torch.dtype):
        return str(obj)
    if isinstance(obj, torch.device):
        return f"torch.device({str(obj)!r})"
    if isinstance(obj, (torch.layout, torch.memory_format)):
        return str(obj)
    if isinstance(obj, float):
        return f"float({str(obj)!r})" if (math.isinf(obj) or math.isnan(obj)) else repr(obj)
    if isinstance(obj, (bool, int, str)) or obj is None:
        return repr(obj)
    if isinstance(obj, sympy.Expr):
        return py_index(obj)
    raise WrapperCodegenError(f"cannot pass {type(obj).__name__} to an extern call")


def generate_wrapper(graph: Any, scheduler: Scheduler) -> WrapperModule:
    kernels: list[KernelCode] = []
    inference = getattr(graph, "kind", "inference") == "inference"
    head = CodeBuffer()  # the boxed call's: take the arguments out of their list, check their layouts
    inputs = graph.graph_input_names
    head.writeline(f"{', '.join(inputs)}{',' if len(inputs) == 1 else ''} = args" if inputs else "pass")
    head.writeline("args.clear()")
    bound = _bind_sizes(head, graph)

    def checked(values: Any) -> str:  # symbolic entries by their values once bound (torch's C++ check takes ints)
        return py_shape([e if {s.name for s in e.free_symbols} <= bound else None for e in values])

    for name in inputs:
        buf = graph.graph_inputs.get(name)
        if buf is not None:
            head.writeline(f"assert_size_stride({name}, {checked(buf.layout.size)}, {checked(buf.layout.stride)}, {name!r})")
    body = CodeBuffer()
    if inference:  # the body is ``call_direct``, which binds the sizes itself
        _bind_sizes(body, graph)
    outputs = scheduler.output_names()
    # training graphs hold no storages across calls: a forward's pool would sit on memory
    # through the backward (and vice versa), above eager's peak
    slots = PoolSlots(enabled=inference)
    templates = _plan_templates(scheduler.units, outputs)
    last_use = dict(scheduler.last_use)
    for i, t in templates.items():
        if t.epilogue is not None:  # the matmul runs at its epilogue: its inputs live until then
            for name in t.input_names():
                last_use[name] = max(last_use.get(name, i), i)
    internal = {i: _internal_buffers(unit, i, last_use, outputs | set(graph.constants))
                for i, unit in enumerate(scheduler.units) if isinstance(unit, FusedGroup) and i not in templates}
    # what a C++ kernel may keep in a row scratch is no storage to write over
    rows = {i: row_scratch_buffers(scheduler.units[i], names) for i, names in internal.items()
            if not uses_triton(scheduler.units[i])}
    in_rows = set().union(*rows.values())
    written_over = {i: over for i, over in plan_written_over(graph, scheduler.units, last_use, outputs, in_rows).items()
                    if i not in templates and not uses_triton(scheduler.units[i])}
    # kernels first: a C++ kernel may keep a group-internal buffer in a local, which is then
    # never allocated
    kernel_of: dict[int, KernelCode] = {}
    for i, unit in enumerate(scheduler.units):
        if i in templates:
            if templates[i].store_mm or templates[i].epilogue is not None:
                from minductor.codegen.triton_template import codegen_template

                kernel_of[i] = codegen_template(templates[i], len(kernels))
                kernels.append(kernel_of[i])
        elif isinstance(unit, FusedGroup):
            kernel_of[i] = codegen_kernel(unit, len(kernels), internal[i], written_over.get(i), rows.get(i))
            kernels.append(kernel_of[i])
    local = set().union(*(k.local_buffers for k in kernels))
    plans = plan_memory(graph, scheduler.units, last_use, outputs, slots, local, written_over)
    for i, (unit, plan) in enumerate(zip(scheduler.units, plans)):
        for line in plan.allocs:
            body.writeline(line)
        if i in kernel_of:
            body.writeline(kernel_of[i].call)
        elif i not in templates and not isinstance(unit, FusedGroup):
            _extern_call(body, unit, graph)
        for line in plan.frees:
            body.writeline(line)
    rets = [_output_expr(o) for o in graph.graph_outputs]
    body.writeline(f"return ({', '.join(rets)}{',' if len(rets) == 1 else ''})")
    constants = dict(graph.constants) | dict(graph.callables)
    calls = _render_calls(head, body, inputs if inference else None)
    source = _render_module(calls, kernels, sorted(constants), slots.count) + _render_standalone(graph)
    return WrapperModule(source, kernels, constants)


def _plan_templates(units: list[Any], outputs: set[str]) -> dict[int, Any]:
    """Extern mm/addmm/bmm calls generated as Triton matmul templates instead (Triton backends only)."""
    if not config.triton_mm_template or not any(isinstance(u, ExternSchedulerNode) for u in units):
        return {}
    from minductor.codegen.triton_template import plan_templates

    return plan_templates(units, outputs)


def _render_standalone(graph: Any) -> str:
    """``make_inputs()`` and a ``__main__`` block, so ``python output_code.py`` times the graph."""
    hint = graph.sizevars.hint
    specs = []
    for name in graph.graph_input_names:
        buf = graph.graph_inputs.get(name)
        if buf is not None:
            size = tuple(hint(s) for s in buf.layout.size)
            stride = tuple(hint(s) for s in buf.layout.stride)
            specs.append(f"rand_strided({size}, {stride}, {buf.get_dtype()})")
        elif name in graph.symbol_inputs:
            specs.append(str(hint(graph.symbol_inputs[name])))
        else:
            specs.append("None")
    out = CodeBuffer()
    out.writeline("")
    out.writeline("def make_inputs():")
    out.writeline("    \"\"\"Random inputs with the sizes and strides this graph was compiled for.\"\"\"")
    out.writeline("    from minductor.runtime.helpers import rand_strided")
    out.writeline(f"    return [{', '.join(specs)}]")
    out.writeline("")
    out.writeline("")
    out.writeline('if __name__ == "__main__":')
    out.writeline("    from minductor.runtime.helpers import print_call_time")
    out.writeline("    print_call_time(call, make_inputs)")
    return out.getvalue()


def _bind_sizes(body: CodeBuffer, graph: Any) -> set[str]:
    """Bind each size symbol once: from a SymInt input, or from an input tensor's size/stride.
    Returns the names bound."""
    bound: set[str] = set()
    for name, expr in graph.symbol_inputs.items():
        if expr.is_Symbol and expr.name not in bound:
            body.writeline(f"{expr.name} = {name}")
            bound.add(expr.name)
    for name, symbol in getattr(graph, "offset_symbols", {}).items():
        body.writeline(f"{symbol.name} = {name}.storage_offset()")
        bound.add(symbol.name)
    for name in graph.graph_input_names:
        buf = graph.graph_inputs.get(name)
        if buf is None:
            continue
        for method, values in (("size", buf.layout.size), ("stride", buf.layout.stride)):
            for dim, expr in enumerate(values):
                if expr.is_Symbol and expr.name not in bound:
                    body.writeline(f"{expr.name} = {name}.{method}({dim})")
                    bound.add(expr.name)
    return bound


def _extern_call(body: CodeBuffer, unit: ExternSchedulerNode, graph: Any) -> None:
    node = unit.node
    if isinstance(node, MultiOutput):
        body.writeline(f"{node.name} = {node.parent.name}{''.join(f'[{i}]' for i in node.indices)}")
        if isinstance(node.parent, FallbackKernel):
            _check_dtype(body, node, node.parent.op)
        _restride(body, node)
        return
    assert isinstance(node, ExternKernel)
    args = [py_arg(a) for a in node.args]
    kwargs = [f"{k}={py_arg(v)}" for k, v in node.kwargs.items()]
    op = _op_name(node.op, graph)
    if isinstance(node, ExternKernelOut):
        body.writeline(f"{op}({', '.join(args + kwargs + [f'out={node.name}'])})")
    elif isinstance(node, ExternKernelAlloc):
        body.writeline(f"{node.name} = {op}({', '.join(args + kwargs)})")
        lay = node.layout  # aten chose these strides; the kernels after it were generated for them
        if all(e.is_Integer for e in (*lay.size, *lay.stride)):
            body.writeline(f"assert_size_stride({node.name}, {py_shape(lay.size)}, {py_shape(lay.stride)}, {node.name!r})")
    else:
        assert isinstance(node, FallbackKernel)
        body.writeline(f"{node.name} = {op}({', '.join(args + kwargs)})  # fallback")
        _check_dtype(body, node, node.op)
        _restride(body, node)


def _check_dtype(body: CodeBuffer, node: Any, op: Any) -> None:
    """A fallback's tensor result checked against the dtype the graph planned for it."""
    lay = getattr(node, "layout", None)
    if lay is not None:
        body.writeline(f"check_dtype({node.name}, {lay.dtype}, {str(op)!r})")


def _restride(body: CodeBuffer, node: Any) -> None:
    """A fallback's tensor result whose layout ``_replay_with_layouts`` (lowering/extern.py)
    could not rederive from our inputs' layouts (symbolic ones) goes to the layout the graph
    assumed (``helpers.restride``: a copy only where aten laid it out otherwise)."""
    lay = getattr(node, "layout", None)
    if lay is None or all(sympy.sympify(e).is_Integer for e in (*lay.size, *lay.stride)):
        return
    body.writeline(f"{node.name} = restride({node.name}, {py_shape(lay.size)}, {py_shape(lay.stride)})")


# aten overloads called through their ``torch.*`` binding: the same kernel with the same
# arguments (the binding's own overload resolution picks this overload: no scalar/tensor
# twins), through the generated argument parser instead of the overload's schema matching,
# 3.9 us a call against 7.8 (a small convolution, one thread); ResNet-style models call one
# per convolution
_BINDINGS = {
    torch.ops.aten.convolution.default: "torch.convolution",
    torch.ops.aten.mm.default: "torch.mm", torch.ops.aten.mm.out: "torch.mm",
    torch.ops.aten.bmm.default: "torch.bmm", torch.ops.aten.bmm.out: "torch.bmm",
    torch.ops.aten.addmm.default: "torch.addmm", torch.ops.aten.addmm.out: "torch.addmm",
    torch.ops.aten.baddbmm.default: "torch.baddbmm", torch.ops.aten.baddbmm.out: "torch.baddbmm",
}


def _aten_name(op: torch._ops.OpOverload) -> str:
    return f"torch.ops.{op.namespace}.{op._schema.name.split('::')[1]}.{op._overloadname}"


def _op_name(op: Any, graph: Any) -> str:
    """What the wrapper calls to run ``op``."""
    if isinstance(op, torch._ops.OpOverload):
        return _BINDINGS.get(op) or _aten_name(op)
    if isinstance(op, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{op.__name__}"
    if getattr(op, "__name__", "") in WRAPPER_HELPERS and getattr(helpers, op.__name__) is op:
        return op.__name__
    for name, fn in graph.callables.items():
        if fn is op:
            return name
    raise WrapperCodegenError(f"extern op {op} is neither an aten overload nor registered with graph.register_callable")


def _output_expr(out: Any) -> str:
    if out is None:
        return "None"
    if isinstance(out, (ReinterpretView, Buffer)):
        return py_arg(out)
    if isinstance(out, (int, float, bool, sympy.Expr)):
        return py_arg(out)
    raise WrapperCodegenError(f"cannot return {out}")


def _render_module(calls: CodeBuffer, kernels: list[KernelCode], constants: list[str], pool_slots: int = 0) -> str:
    out = CodeBuffer()
    out.writeline("# minductor generated wrapper")
    out.writeline("import torch")
    if any("c_int64(0)" in k.call for k in kernels):
        out.writeline("from ctypes import addressof, c_int64")
    out.writeline("from minductor.runtime.cache import compile_and_load_many")
    out.writeline(f"from minductor.runtime.helpers import {', '.join(WRAPPER_HELPERS)}")
    out.writeline("")
    out.writeline("empty_strided = torch.empty_strided")
    out.writeline("mi_cpu = torch.device('cpu')")
    if any("autotune_launch(" in k.call for k in kernels if k.backend == "triton"):
        out.writeline("from minductor.runtime.triton_autotune import autotune_launch")
    if "empty_huge(" in calls.getvalue():
        out.writeline("from minductor.runtime.huge_pages import empty_huge")
    if pool_slots:
        out.writeline("from minductor.runtime.buffer_pool import BufferPool")
        out.writeline(f"mi_pool = BufferPool({pool_slots})  # large buffers kept across calls")
    out.writeline("")
    if constants:
        out.writeline("constants = globals().get('constants')  # bound by minductor when loaded")
        out.writeline("if constants is None:  # run on its own from a debug dump: the tensors saved beside it")
        out.writeline("    from minductor.runtime.helpers import dumped_constants")
        out.writeline("    constants = dumped_constants(__file__)")
    for name in constants:
        out.writeline(f"{name} = constants.get({name!r})  # held by the graph")
    if constants:
        out.writeline("")
    kernels, twins = _distinct(kernels)
    for kernel in kernels:
        if kernel.backend != "cpp":
            out.lines.extend(kernel.source.rstrip("\n").split("\n"))
            out.writeline("")
    cpp = [(k.name, k.source) for k in kernels if k.backend == "cpp"]
    for name, source in cpp:
        # the string holds exactly ``source``: what is dumped is what is compiled
        first, *rest = source.rstrip("\n").split("\n")
        out.writeline(f"{name}_source = r'''{first}")
        out.lines.extend(rest)
        out.writeline("'''")
        assert "'''" not in source
        out.writeline("")
    if cpp:
        names = ", ".join(n for n, _ in cpp)
        items = ", ".join(f"({n}_source, {n!r})" for n, _ in cpp)
        out.writeline(f"{names}{',' if len(cpp) == 1 else ''} = compile_and_load_many([{items}])")
        out.writeline("")
    for name, twin in twins:
        out.writeline(f"{name} = {twin}  # the same code")
    out.writeline("")
    out.splice(calls)
    return out.getvalue()


# comments, by backend (generated C++ holds no string with "//" in it, Triton's none with "#")
_COMMENT = {"cpp": re.compile(r"[ \t]*//[^\n]*"), "triton": re.compile(r"[ \t]*#[^\n]*")}


def _distinct(kernels: list[KernelCode]) -> tuple[list[KernelCode], list[tuple[str, str]]]:
    """The kernels whose code differs from every earlier one's apart from names and comments,
    and (name, earlier kernel) for the rest, which the wrapper calls through the earlier one.
    Each layer of a model repeats its kernels: GPT-2's 12 layers make 85 kernels of 11
    different codes (the first layer's differ: buffers reused in place later); compiling every
    one took g++ 2.9-3.3 s of an 11-13 s first call, the 11 take 0.6-1.0 s (7-9.5 s)."""
    first: dict[tuple[str, str], str] = {}
    distinct, twins = [], []
    for kernel in kernels:
        code = re.sub(rf"\b{kernel.name}(?!\d)", "mi_kernel", kernel.source)
        if kernel.backend in _COMMENT:
            code = _COMMENT[kernel.backend].sub("", code)
        twin = first.setdefault((kernel.backend, code), kernel.name)
        if twin == kernel.name:
            distinct.append(kernel)
        else:
            twins.append((kernel.name, twin))
    return distinct, twins


def _render_calls(head: CodeBuffer, body: CodeBuffer, direct: list[str] | None) -> CodeBuffer:
    """``call(args)``, the boxed call AOTAutograd makes: ``head`` then ``body``. With ``direct``
    (an inference graph's inputs), the body is ``call_direct(*inputs)`` and ``call`` calls it:
    Dynamo calls ``call_direct`` itself when AOTAutograd's wrapper would change nothing
    (``direct_call.py``). Its arguments are exactly Dynamo's, whose guards checked their sizes
    and strides, so it skips the layout checks. Those and the argument list cost 10 of 37 us a
    call of a small graph after a kernel that streamed 64 MB through the caches. (The inputs of
    an inference graph stay alive in the caller anyway, so its early frees free nothing.)"""
    out = CodeBuffer()
    if direct is not None:
        out.writeline(f"def call_direct({', '.join(direct)}):")
        with out.indent(open_brace=False):
            out.splice(body)
        out.writeline("")
        out.writeline("")
        out.writeline("def call(args):")
        with out.indent(open_brace=False):
            out.splice(head)
            out.writeline(f"return call_direct({', '.join(direct)})")
        out.writeline("")
        out.writeline("call._boxed_call = True")
        out.writeline("call.direct = call_direct")
        return out
    out.writeline("def call(args):")
    with out.indent(open_brace=False):
        out.splice(head)
        out.splice(body)
    out.writeline("")
    out.writeline("call._boxed_call = True")
    return out


__all__ = ["ComputedBuffer", "InputBuffer", "generate_wrapper"]
