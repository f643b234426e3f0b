"""Inference graphs that Dynamo calls without AOTAutograd's runtime wrapper.

AOTAutograd returns our compiled graph inside its runtime wrapper: a chain of Python calls
that toggles grad mode, replays input mutations, regenerates outputs that alias inputs,
removes duplicated arguments, threads effect tokens and unwraps tensor subclasses. For an
inference graph with none of those, every call still runs the chain, and after a kernel that
streamed tens of MB through the caches, that Python runs cold: ``x.sum(1)`` over 4096x4096
floats took 1458 us through it and 1401 us without it (eager: 1378 us), one process on a
Xeon VM. So when AOTAutograd's metadata shows the wrapper would change nothing, the backend
hands Dynamo the compiled graph's own call.

The wrapper is skipped only when all of these hold for the graph AOTAutograd compiled:
- it is an inference graph, the only graph of the call (no backward);
- no input is mutated, in data or metadata;
- every output is a fresh tensor (no alias of an input or of another output);
- no effect tokens, no functionalized RNG, no tensor subclass among the inputs;
- autocast is off (the wrapper would turn it off around the graph's aten fallbacks);
- the graph takes exactly Dynamo's arguments (none deduplicated, no parameters prepended).

Grad mode then needs no toggle: an inference graph compiled with grad enabled has no input
that requires grad, so the aten calls of its wrapper record no autograd history either way
(Dynamo guards on grad mode and on each input's ``requires_grad``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch._functorch._aot_autograd.schemas import OutputType, PlainTensorMeta
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from minductor import metrics

if TYPE_CHECKING:
    from minductor.graph_cache import CompiledGraph

_collected: list[list[CompiledGraph]] = []  # graphs compiled or loaded per backend call, innermost last


@contextlib.contextmanager
def collecting() -> Iterator[list[CompiledGraph]]:
    """The graphs AOTAutograd compiles or loads from its cache inside the block."""
    graphs: list[CompiledGraph] = []
    _collected.append(graphs)
    try:
        yield graphs
    finally:
        _collected.pop()


def note(graph: CompiledGraph) -> None:
    """Record a graph compiled or loaded (outside ``collecting``, e.g. a lazy backward: ignored)."""
    if _collected and all(g is not graph for g in _collected[-1]):
        _collected[-1].append(graph)


def wrapper_free_arity(example_inputs: Sequence[Any]) -> int | None:
    """For the inference graph being compiled now: its argument count if AOTAutograd's
    runtime wrapper would add nothing around it (the module docstring's list), else None."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None or torch._C._is_any_autocast_enabled():
        return None
    if meta.tokens or meta.is_rng_op_functionalized or meta.num_intermediate_bases or meta.num_graphsafe_rng_states:
        return None
    if any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info):
        return None
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return None
    if any(not isinstance(m, (int, PlainTensorMeta)) for m in meta.subclass_inp_meta):
        return None
    if any(is_traceable_wrapper_subclass(x) for x in example_inputs):
        return None
    return len(example_inputs)


def direct_callable(gm: torch.fx.GraphModule, graphs: list[CompiledGraph],
                    example_inputs: Sequence[Any]) -> Callable[..., Any] | None:
    """The call Dynamo may use in place of AOTAutograd's wrapper around Dynamo's graph
    ``gm``, or None. AOTAutograd prepends ``gm``'s parameters and buffers to the arguments and
    drops repeated ones, so with neither the compiled graph's arity is Dynamo's."""
    if len(graphs) != 1 or torch._C._is_any_autocast_enabled():
        return None
    graph = graphs[0]
    if graph.kind != "inference" or graph.direct_arity != len(example_inputs) or graph.call is None:
        return None
    if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
        return None
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if len({id(x) for x in tensors}) != len(tensors) or any(is_traceable_wrapper_subclass(x) for x in tensors):
        return None
    metrics.direct_graphs += 1
    direct = getattr(graph.call, "direct", None)  # the generated ``call_direct`` (codegen/wrapper.py)
    if direct is not None:
        return direct
    call = graph.call  # a graph run through aten

    def run(*args: Any) -> Any:
        return call(list(args))

    return run
