"""GraphLowering (aten FX graph -> IR) and ``compile_graph``, the whole pipeline."""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import operator
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx

from minductor import config, metrics
from minductor.ir.layout import FixedLayout, as_exprs
from minductor.ir.nodes import Buffer, InputBuffer, IRNode, StorageBox, TensorBox
from minductor.ir.views import ReinterpretView, realize_input
from minductor.lowering import SUPPORTED_DTYPES, Unsupported
from minductor.lowering.extern import fallback, tangent_in_saved_layout
from minductor.lowering.registry import lowering_for
from minductor.sizevars import SizeVars, to_expr
from minductor.virtualized import V

log = logging.getLogger("minductor")


class GraphLowering(torch.fx.Interpreter):
    """Interprets an aten graph, producing IR instead of tensors."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.example_inputs = list(example_inputs)
        self.buffers: list[Buffer] = []
        self.name_to_buffer: dict[str, Buffer] = {}
        self.graph_inputs: dict[str, InputBuffer] = {}
        self.constants: dict[str, torch.Tensor] = {}  # tensors held by the graph module
        self.constant_targets: dict[str, str] = {}  # their attribute paths in the graph module
        self.callables: dict[str, Any] = {}  # Python callables extern nodes call (XLA kernels)
        self.graph_input_names: list[str] = []
        self.graph_outputs: list[IRNode | None] = []
        self.saved_outputs = range(0)  # a forward graph's outputs that keep our layouts
        self.current_node: torch.fx.Node | None = None
        self._input_index = 0
        self.sizevars = SizeVars(example_inputs)
        self.symbol_inputs: dict[str, sympy.Expr] = {}  # SymInt graph inputs, by placeholder name
        # inputs whose storage offset the kernels depend on (as_strided counts from the storage's
        # start): a symbol bound from ``x.storage_offset()`` at each call, by placeholder name
        self.offset_symbols: dict[str, sympy.Symbol] = {}
        self.donated_inputs: frozenset[str] = frozenset()  # a backward's inputs it may write over
        self._lazy_reads: dict[Any, frozenset[str]] = {}  # realize_pending_readers: a lazy body's reads
        self.random_seeds: dict[torch.device, Any] = {}  # lowering/random.py: a seed loader per device
        self.random_streams = 0  # random nodes lowered so far (each its own stream)
        self.dump: Any = None  # the debug dump (debug.GraphDump) when config.debug is on
        self._order: dict[torch.fx.Node, int] | None = None  # the graph's nodes, numbered in order

    def register_buffer(self, buf: Buffer) -> str:
        buf.name = f"buf{len(self.buffers)}"
        self.buffers.append(buf)
        self.name_to_buffer[buf.name] = buf
        return buf.name

    def get_buffer(self, name: str) -> Buffer:
        if name in self.name_to_buffer:
            return self.name_to_buffer[name]
        return self.graph_inputs[name]

    def realize_pending_readers(self, name: str, source: TensorBox | None = None) -> None:
        """Before ``name`` is mutated, compute every still-needed lazy value that reads it,
        so it sees the old contents (lazy bodies are evaluated where they are used).
        ``source``: the value the mutation writes, left lazy when the mutation is all that still
        needs it (it is computed inside the mutating kernel, reading the old contents)."""
        from minductor.ir.nodes import Loops
        from minductor.scheduler.deps import RecordingHandler

        for node, value in self.env.items():
            if not isinstance(value, TensorBox) or all(user in self.env for user in node.users):
                continue
            if value is source and all(user in self.env or user is self.current_node for user in node.users):
                continue
            storage = value.storage_box()
            if storage is None or not isinstance(storage.data, Loops):
                continue
            # a body's reads of graph inputs, recorded once (an optimizer step mutates hundreds of
            # inputs: recorded at each, 2.4 s of lowering for 72 AdamW parameters, 0.85 once); they
            # only shrink as values it inlines are realized, so a stale entry realizes it early,
            # never late. Other buffers (none mutated yet) are recorded each time.
            reads = self._lazy_reads.get(storage.data) if name in self.graph_inputs else None
            if reads is None:
                recorder = RecordingHandler({})
                with V.set_ops(recorder):
                    storage.data._run_for_count()
                reads = self._lazy_reads[storage.data] = frozenset(recorder.rw.read_names())
            if name in reads:
                storage.realize()

    def register_callable(self, fn: Any, hint: str) -> str:
        """Make ``fn`` callable from the wrapper under a fresh name (returned)."""
        name = f"{hint}_{len(self.callables)}"
        self.callables[name] = fn
        return name

    def get_attr(self, target: str, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if not isinstance(value, torch.Tensor):
            return value
        if value.dtype not in SUPPORTED_DTYPES or value.device.type not in ("cpu", "cuda"):
            raise Unsupported(f"constant {target} of dtype {value.dtype} on {value.device}")
        name = target.replace(".", "_")
        layout = FixedLayout(value.device, value.dtype, tuple(as_exprs(value.shape)), tuple(as_exprs(value.stride())))
        buf = InputBuffer(name=name, layout=layout)
        self.constants[name] = value
        self.constant_targets[name] = target
        self.graph_inputs[name] = buf
        return TensorBox(StorageBox(buf))

    def get_dtype(self, name: str) -> torch.dtype:
        return self.get_buffer(name).get_dtype()

    # -- fx.Interpreter hooks -----------------------------------------------------------

    def input_overwritten_here(self, x: TensorBox) -> InputBuffer | None:
        """The buffer of ``x`` if ``x`` is a graph input the node being lowered may update in
        place instead of in a copy: the graph copies the node's result back into the input
        (``copy_``, an input mutation AOTAutograd keeps in the graph), no later node reads the
        input itself, and nothing else the node reads reads the input (it would see it half
        written)."""
        node = self.current_node
        sources = [a for a in node.args if isinstance(a, torch.fx.Node) and self.env.get(a) is x]
        if len(sources) != 1 or sources[0].op != "placeholder" or sources[0].name not in self.graph_inputs:
            return None
        source = sources[0]
        copies = [u for u in node.users if u.target is torch.ops.aten.copy_.default and u.args[:2] == (source, node)]
        if len(copies) != 1:
            return None
        if self._order is None:
            self._order = {n: i for i, n in enumerate(self.module.graph.nodes)}
        if any(self._order[u] > self._order[node] for u in source.users if u is not node and u is not copies[0]):
            return None
        others = [self.env[a] for a in node.all_input_nodes if a is not source and isinstance(self.env.get(a), TensorBox)]
        if any(source.name in {d.name for d in value_reads(v)} for v in others):
            return None
        return self.graph_inputs[source.name]

    @functools.cached_property
    def _offset_hints(self) -> dict[str, sympy.Expr]:
        return {}

    def input_storage_offset(self, name: str) -> sympy.Expr:
        """Where input ``name``'s first element sits in its storage, as a symbol the wrapper
        binds at each call (a cached graph may run on an input sliced elsewhere)."""
        if name not in self.offset_symbols:
            symbol = sympy.Symbol(f"mi_offset_{name}", integer=True, nonnegative=True)
            self.sizevars.var_to_val[symbol] = sympy.Integer(self.sizevars.hint(self._offset_hints[name]))
            self.offset_symbols[name] = symbol
        return self.offset_symbols[name]

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current_node = n
        result = super().run_node(n)
        if n.op == "call_function" and isinstance(result, TensorBox):
            # through views too: every user of a view of an unrealized body inlines that body
            # (Llama's rotary cos/sin tables, unsqueezed once and read by q and k of each
            # layer, were recomputed at each element of each head)
            storage = result.storage_box()
            if storage is not None:
                storage.realize_if_costly(len(n.users))
        return result

    def placeholder(self, target: str, args: Any, kwargs: Any) -> Any:
        example = self.example_inputs[self._input_index]
        self._input_index += 1
        name = self.current_node.name
        self.graph_input_names.append(name)
        if isinstance(example, torch.SymInt):
            expr = to_expr(example)
            self.symbol_inputs[name] = expr
            return expr
        if not isinstance(example, torch.Tensor):
            return example
        layout = FixedLayout(example.device, example.dtype, tuple(to_expr(s) for s in example.shape),
                             tuple(to_expr(s) for s in example.stride()))
        buf = InputBuffer(name=name, layout=layout)
        self.graph_inputs[name] = buf
        self._offset_hints[name] = to_expr(example.storage_offset())
        if getattr(self, "kind", "") == "backward" and name.startswith("tangents"):
            return tangent_in_saved_layout(TensorBox(StorageBox(buf)), example, self.example_inputs)
        return TensorBox(StorageBox(buf))

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        val = self.current_node.meta.get("val")
        lowering = lowering_for(target)
        if lowering is not None and _dtypes_supported(args, kwargs, val):
            try:
                return lowering(*args, **kwargs)
            except Unsupported as e:
                log.debug("falling back for %s: %s", target, e)
        if target.__module__ == "_operator" and target.__name__ == "getitem":
            return args[0][args[1]]
        if target in SYMBOLIC_OPS:
            return SYMBOLIC_OPS[target](*args, **kwargs)
        if isinstance(val, torch.SymInt):  # other size arithmetic (torch.sym_sum, sym_max...): its value
            return to_expr(val)
        return fallback(target, args, kwargs, val)

    def output(self, target: str, args: Any, kwargs: Any) -> Any:
        outputs = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
        self.saved_outputs = self._saved_for_backward(len(outputs))
        self.graph_outputs = [self._realize_output(o, i, i in self.saved_outputs) for i, o in enumerate(outputs)]
        return self.graph_outputs

    def _realize_output(self, value: Any, i: int, saved: bool) -> IRNode | None:
        if not isinstance(value, IRNode):
            return value
        node = self.module.graph.find_nodes(op="output")[0].args[0]
        node = node[i] if isinstance(node, (list, tuple)) else node
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, TensorBox) and isinstance(value.data, StorageBox):
            value.data.realize()  # realize, but keep the layout open until strides are adopted
            if isinstance(value.data.data, Buffer) and not isinstance(value.data.data, InputBuffer):  # noqa: SIM102
                if isinstance(meta, torch.Tensor) and not saved:
                    _adopt_strides(value.data.data, meta)
        out = realize_input(value)
        if saved and _static_strides(out) is not None:
            return out  # the backward is compiled for the strides we report (output_strides)
        # The user sees eager's strides: when our layout differs, store a copy with them. So does
        # the backward for a saved tensor of symbolic strides (we report static ones only), even
        # a strided slice of a wider tensor (Mamba2's transposed convolution output split in
        # three: the backward's input check failed at the second sequence length).
        copy = _dense(meta) or (saved and _apart(meta)) if isinstance(meta, torch.Tensor) else False
        if copy and not _same_strides(out, meta):
            out = _copy_with_strides(out, meta)
        return out

    def _saved_for_backward(self, n_outputs: int) -> range:
        """Indices of a forward graph's outputs that only its backward reads (saved tensors):
        they keep our layouts (a convolution's channels-last output), which AOTAutograd hands
        to the backward compiler when we report them."""
        if getattr(self, "kind", "") != "forward":
            return range(0)
        context = torch._guards.TracingContext.try_get()
        meta = getattr(context, "fw_metadata", None)
        if meta is None or context.output_strides is None or meta.tokens:  # nobody to report our strides to
            return range(0)  # (effect tokens: AOTAutograd's output indices skip them)
        return range(n_outputs)[meta.tensors_saved_for_backwards_slice]

    def output_strides(self) -> list[tuple[int, ...] | None] | None:
        """Each output's strides as compiled (None: not a tensor, or symbolic); None for a graph
        whose outputs all have eager's strides."""
        if not self.saved_outputs:
            return None
        return [_static_strides(o) if isinstance(o, IRNode) else None for o in self.graph_outputs]


def _static_strides(node: IRNode) -> tuple[int, ...] | None:
    stride = node.get_stride() if hasattr(node, "get_stride") else None
    if stride is None or not all(sympy.sympify(s).is_Integer for s in stride):
        return None
    return tuple(int(s) for s in stride)


def _same_strides(out: IRNode, meta: torch.Tensor) -> bool:
    stride = out.get_stride() if hasattr(out, "get_stride") else None
    if stride is None:
        return True
    replace = V.graph.sizevars.replace  # (_dense may just have guarded, simplifying meta's strides)
    expected = [to_expr(s) for s in meta.stride()]
    return all(replace(sz) == 1 or sympy.expand(replace(a) - b) == 0
               for sz, a, b in zip(out.get_size(), stride, expected))


def _copy_with_strides(value: IRNode, meta: torch.Tensor) -> Buffer:
    from minductor.ir.nodes import ComputedBuffer, Pointwise

    layout = FixedLayout(meta.device, meta.dtype, tuple(value.get_size()), tuple(to_expr(s) for s in meta.stride()))
    data = Pointwise(value.get_device(), value.get_dtype(), value.make_loader(), list(value.get_size()),
                     origins=frozenset({"clone"}))
    buf = ComputedBuffer(name="", layout=layout, data=data)
    V.graph.register_buffer(buf)
    return buf


def _sym_size(x: IRNode, dim: int) -> sympy.Expr:
    return x.get_size()[dim]


def _sym_stride(x: IRNode, dim: int) -> sympy.Expr:
    return realize_input(x).get_stride()[dim]


def _truediv(a: Any, b: Any) -> Any:
    """A symbolic float, kept exact (``s0*s1/64``): a kernel computes it as a division of
    its numerator and denominator (``registry.scalar_loader``)."""
    return sympy.sympify(a) / sympy.sympify(b)


def _floordiv(a: Any, b: Any) -> Any:
    from minductor.ir.indexing import FloorDiv

    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return FloorDiv(sympy.sympify(a), sympy.sympify(b))


# size arithmetic in graphs with symbolic shapes, evaluated on SymPy expressions
SYMBOLIC_OPS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.sym_size.int: _sym_size,
    torch.ops.aten.sym_stride.int: _sym_stride,
    torch.ops.aten.sym_numel.default: lambda x: x.get_numel(),
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.floordiv: _floordiv,
    operator.truediv: _truediv,
    operator.neg: operator.neg,
    torch.sym_float: sympy.sympify,
}
# symbolic floats these nodes make from sizes (batch_norm's count / channels) are supported
_SYMBOLIC_FLOAT_OPS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, torch.sym_float})


def _adopt_strides(buf: Buffer, meta: torch.Tensor) -> None:
    """Give an output the strides eager would produce, if the buffer is still ours to shape."""
    from minductor.ir.layout import FlexibleLayout

    layout = buf.layout
    if not isinstance(layout, FlexibleLayout) or type(buf).__name__ != "ComputedBuffer":
        return  # frozen: something already reads these strides
    stride = tuple(as_exprs(meta.stride()))
    if _dense(meta) and tuple(as_exprs(meta.shape)) == tuple(layout.size):
        buf.layout = FixedLayout(layout.device, layout.dtype, layout.size, stride)


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last) or _non_overlapping_dense(t)


def _apart(t: torch.Tensor) -> bool:
    """Whether no two elements of ``t`` share memory (at the size hints: no guard is added), so a
    buffer can be laid out with its strides, gaps and all."""
    hint = V.graph.sizevars.hint
    dims = sorted((hint(to_expr(st)), hint(to_expr(sz))) for st, sz in zip(t.stride(), t.shape) if hint(to_expr(sz)) != 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return False
        extent = stride * size
    return True


def _non_overlapping_dense(t: torch.Tensor) -> bool:
    return bool(torch._prims_common.is_non_overlapping_and_dense_or_false(t))


def _dtypes_supported(args: Any, kwargs: Any, val: Any) -> bool:
    values = list(torch.utils._pytree.tree_leaves((args, kwargs)))
    for v in values:
        if isinstance(v, IRNode) and v.get_dtype() not in SUPPORTED_DTYPES:
            return False
        if isinstance(v, complex):
            return False
    for v in torch.utils._pytree.tree_leaves(val):
        if isinstance(v, torch.Tensor) and (v.dtype not in SUPPORTED_DTYPES or v.device.type not in ("cpu", "cuda")):
            return False
    return True


# ---------------------------------------------------------------------------------------


def unsupported_reason(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why this graph runs as plain aten instead (None when minductor compiles it)."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            if _unbacked(x):
                return f"data-dependent size {x}"
            continue
        if not isinstance(x, torch.Tensor):
            return f"non-tensor graph input {type(x).__name__}"
        if x.device.type not in ("cpu", "cuda"):
            return f"input on {x.device} (kernels are generated for CPU and CUDA tensors)"
        if any(_unbacked(s) for s in (*x.shape, *x.stride(), x.storage_offset())):
            return "data-dependent input size"
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):  # noqa: SIM102
            if node.target._schema.is_mutable and node.target is not torch.ops.aten.copy_.default:
                return f"in-graph mutation by {node.target}"
        val = node.meta.get("val")
        for v in torch.utils._pytree.tree_leaves(val):
            if isinstance(v, torch.SymFloat) and node.target in _SYMBOLIC_FLOAT_OPS and not _unbacked_expr(v):
                continue
            if isinstance(v, (torch.SymFloat, torch.SymBool)) or _unbacked(v):
                return f"data-dependent value produced by {node.format_node()}"
            if isinstance(v, torch.Tensor) and any(_unbacked(s) for s in v.shape):
                return f"data-dependent shape produced by {node.format_node()}"
    return None


def _unbacked_expr(v: Any) -> bool:
    return any(str(s).startswith("u") for s in v.node.expr.free_symbols)


def _unbacked(v: Any) -> bool:
    """A size with no value at compile time (from .item(), nonzero...): not supported."""
    if not isinstance(v, torch.SymInt):
        return False
    return any(str(s).startswith("u") for s in v.node.expr.free_symbols)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Any:
    """The pipeline: lower -> schedule -> codegen -> wrap -> load. Returns a ``CompiledGraph``
    (a boxed callable). A graph compiled before (this process or another) loads its wrapper
    from the graph cache."""
    from minductor import debug, graph_cache

    reason = unsupported_reason(gm, example_inputs)
    if reason is not None:
        log.warning("minductor: running %s graph through aten: %s", kind, reason)
        return graph_cache.CompiledGraph.uncached(kind, _run_aten_graph(gm), f"runs through aten: {reason}")
    t0 = time.perf_counter()
    dump = debug.maybe_graph_dump(kind)
    donated = donated_inputs(gm, example_inputs, kind)
    key = graph_cache.graph_key(gm, example_inputs, kind, donated) if dump is None else None
    entry = graph_cache.load(key) if key is not None else None
    if entry is not None:
        constants = graph_cache.constants_of(gm, entry)
        call = entry.load(constants)
        log.info("minductor: loaded %s graph from the graph cache in %.3fs", kind, time.perf_counter() - t0)
        return graph_cache.CompiledGraph(kind, call, entry, constants, _not_in_aot_cache(gm),
                                         output_strides=entry.output_strides)
    before = graph_cache.metrics_snapshot()
    try:
        result = _compile(gm, example_inputs, kind, dump, donated)
    except config.ConfigError:
        raise
    except Exception as e:
        if config.strict:
            raise
        metrics.internal_errors += 1
        log.error("minductor: internal error compiling the %s graph; it runs through aten instead (please report "
                  "this with the MINDUCTOR_DEBUG=1 dump; MINDUCTOR_STRICT=1 raises it):\n%s", kind, traceback.format_exc())
        return graph_cache.CompiledGraph.uncached(kind, _run_aten_graph(gm), f"runs through aten: {type(e).__name__}: {e}")
    if result is None:
        return graph_cache.CompiledGraph.uncached(kind, _run_aten_graph(gm), "runs through aten")
    call, graph, module = result
    log.info("minductor: compiled %s graph in %.3fs", kind, time.perf_counter() - t0)
    strides = graph.output_strides()
    if key is None:
        return graph_cache.CompiledGraph.uncached(kind, call, "debug runs dump every stage", strides)
    if graph.callables:
        return graph_cache.CompiledGraph.uncached(kind, call, "it calls Python callables (XLA computations)", strides)
    entry = graph_cache.CachedGraph(module.source, [dataclasses.asdict(k) for k in module.kernels],
                                    graph.constant_targets, graph_cache.metrics_since(before), strides)
    graph_cache.save(key, entry)
    return graph_cache.CompiledGraph(kind, call, entry, dict(graph.constants), _not_in_aot_cache(gm), output_strides=strides)


def _not_in_aot_cache(gm: torch.fx.GraphModule) -> str:
    """Why AOTAutograd's cache must not store this graph ("" if it may)."""
    if gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.with_effects):
        # its entries drop the effect tokens such graphs take as inputs (TorchInductor's graphs
        # have them unlifted, with unlift_effect_tokens)
        return "it threads effect tokens"
    return ""


def donated_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> frozenset[str]:
    """A backward graph's inputs whose storage is ours once read: saved tensors AOTAutograd
    donates (aliasing no forward input or output and no gradient; it forbids
    ``retain_graph=True`` for such a backward, and compiles one without donations for it), and
    aliasing no other input of the backward either. The wrapper writes over them in place or
    hands their storage to a later buffer (``codegen/memory.py``), as it does with its own."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    idxs = getattr(meta, "bw_donated_idxs", None)
    if kind != "backward" or not idxs:
        return frozenset()
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    storages = collections.Counter(_storage_key(x) for x in example_inputs if isinstance(x, torch.Tensor))
    return frozenset(names[i] for i in idxs if i < len(names) and i < len(example_inputs)
                     and isinstance(example_inputs[i], torch.Tensor) and storages[_storage_key(example_inputs[i])] == 1)


def _storage_key(t: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage())


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str, dump: Any,
             donated: frozenset[str] = frozenset()) -> Any:
    """Lower, schedule, generate and load: (call, graph, wrapper module), or None when the
    graph holds something minductor cannot compile (it then runs through aten)."""
    from minductor.codegen.wrapper import WrapperCodegenError, generate_wrapper
    from minductor.ir.verify import verify_graph, verify_schedule
    from minductor.runtime import loader
    from minductor.scheduler import Scheduler

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if dump is not None:
        dump.write("fx_graph.py", gm.print_readable(print_output=False))
    graph = GraphLowering(gm, example_inputs)
    graph.kind = kind  # "inference", "forward" or "backward"
    graph.donated_inputs = donated
    graph.dump = dump  # lowerings that build their own computations (XLA) dump them here
    try:
        with V.set_graph(graph):
            graph.run(*example_inputs)                               # 1. lower (and realize)
            verify_graph(graph)
            timings["lower"] = time.perf_counter() - t0
            scheduler = Scheduler(graph)                             # 2. schedule
            if dump is not None:
                dump.write("ir_pre_fusion.txt", scheduler.debug_str())
            scheduler.fuse_nodes()
            verify_schedule(scheduler)
            if dump is not None:
                dump.write("ir_post_fusion.txt", scheduler.debug_str())
            timings["schedule"] = time.perf_counter() - t0 - timings["lower"]
            module = generate_wrapper(graph, scheduler)              # 3-4. codegen + wrap
    except (Unsupported, WrapperCodegenError) as e:
        log.warning("minductor: running %s graph through aten: %s", kind, e)
        return None
    timings["codegen"] = time.perf_counter() - t0 - timings["lower"] - timings["schedule"]
    call = loader.load_wrapper(module, dump)                         # 5. load (compiles kernels)
    timings["load"] = time.perf_counter() - t0 - sum(timings.values())
    metrics.graphs_compiled += 1
    metrics.generated_kernel_count += len(module.kernels)
    for kernel in module.kernels:
        metrics.kernels_by_backend[kernel.backend] += 1
    log.info("minductor: %s graph stages: %s", kind, ", ".join(f"{k} {v:.3f}s" for k, v in timings.items()))
    if dump is not None:
        dump.write("timings.txt", "".join(f"{k}: {v:.4f}s\n" for k, v in timings.items()))
    return call, graph, module


def _run_aten_graph(gm: torch.fx.GraphModule) -> Callable[[list[Any]], Any]:
    def call(args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        return gm(*inputs)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def value_reads(value: TensorBox, index: Sequence[sympy.Expr] | None = None) -> set[Any]:
    """The reads (dependencies) one element of ``value`` makes through views and lazy bodies, at
    ``index`` (fresh symbols by default)."""
    from minductor.scheduler.deps import RecordingHandler

    recorder = RecordingHandler({})
    if index is None:
        index = [sympy.Symbol(f"i{k}", integer=True, nonnegative=True) for k in range(len(value.get_size()))]
    with V.set_ops(recorder):
        value.make_loader()(index)
    return set(recorder.rw.reads)


__all__ = ["GraphLowering", "ReinterpretView", "compile_graph", "sympy"]
