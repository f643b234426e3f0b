"""Forward/backward partitioning of AOTAutograd's joint graph.

The partition itself is functorch's min-cut rematerialization. Its first step, a CSE pass
over the joint graph, imports TorchInductor's pattern matcher (and with it most of
TorchInductor: ~0.5-0.7 s of a training graph's compile, on a warm cache nearly all of
minductor's own time). ``partition`` runs the same CSE here, by the same rules, and then
the min-cut with functorch's CSE switched off.
"""
from __future__ import annotations

import re
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch.compile_utils import get_aten_target, rand_ops
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten
# names of calls that mutate or change global state: a trailing underscore (``add_``, but not
# ``__add__``), or a set/enter/exit/seed word (``_set_grad_enabled``, ``manual_seed``)
_MUTATING_NAME = re.compile(r"(?<!_)(_$|_[.]|(\b|_)(set|enter|exit|seed)(\b|_))(?!_)")


def partition(joint_module: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
    """functorch's min-cut partition of ``joint_module`` after our CSE of its graph, with
    values computed from no input (index tensors built from aranges) recomputed where the
    backward needs them: saved, they are opaque inputs of the backward; recomputed, lowering
    sees their positions (``lowering/indexing.static_positions``: an upsample's backward
    scatter becomes a sum over each input pixel's window, ``scatter.index_put``)."""
    joint_module.graph.eliminate_dead_code()
    joint_module.graph = cse_graph(joint_module.graph)
    _recompute_input_free(joint_module.graph)
    with functorch_config.patch(cse=False):
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)


def cse_graph(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph`` where a call repeating an earlier one (same target, same
    arguments, no mutation in between) is replaced by it. Never merged: random ops,
    ``empty``, values whose storage a graph output holds (eager returns separate tensors),
    and values of data-dependent size."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    seen: dict[Any, fx.Node] = {}
    region = 0  # bumped at each mutation: calls are merged only within one region
    output = next(iter(reversed(graph.nodes)))
    output_storages = {s for s in map(_storage, output.all_input_nodes) if s is not None}
    for node in graph.nodes:
        if _is_mutation(node):
            region += 1
        key = None if _kept(node) or _storage(node) in output_storages else _key(node, env, region)
        if key is not None and key in seen:
            env[node] = seen[key]
            continue
        env[node] = new.node_copy(node, env.__getitem__)
        if key is not None:
            seen[key] = env[node]
    return new


def _recompute_input_free(graph: fx.Graph) -> None:
    """Tag the calls that depend on no tensor input (and draw no random numbers) to be
    recomputed in the backward rather than saved."""
    from torch.utils.checkpoint import CheckpointPolicy

    free: set[fx.Node] = set()  # (sizes count as free: symbolic ones are the backward's too)
    for node in graph.nodes:
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.SymInt):
            free.add(node)
        elif node.op == "call_function" and not _kept(node) and not _is_mutation(node) \
                and all(arg in free for arg in node.all_input_nodes):
            free.add(node)
            node.meta.setdefault("recompute", CheckpointPolicy.MUST_RECOMPUTE)


def _kept(node: fx.Node) -> bool:
    if node.op != "call_function":
        return True
    target = get_aten_target(node)
    if target in rand_ops or target is aten.empty:
        return True
    if isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags:
        return True
    val = node.meta.get("val")
    return isinstance(val, (sympy.Symbol, torch.SymInt)) and bool(free_unbacked_symbols(val))


def _key(node: fx.Node, env: dict[fx.Node, fx.Node], region: int) -> Any:
    try:
        key = (node.target, region, _frozen(node.args, env), _frozen(node.kwargs, env))
        hash(key)
    except TypeError:  # an unhashable argument: keep the node
        return None
    return key


def _frozen(value: Any, env: dict[fx.Node, fx.Node]) -> Any:
    """A hashable form of call arguments (after substitution), with types, so that 1 and
    1.0 or a list and a tuple never compare equal."""
    if isinstance(value, fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_frozen(v, env) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _frozen(v, env)) for k, v in value.items()))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return (type(value), value.node)
    return (type(value), value)


def _storage(node: fx.Node) -> StorageWeakRef | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except NotImplementedError:
        return None


def _is_mutation(node: fx.Node) -> bool:
    """A node that writes to one of its arguments (the same test as the partitioner's CSE)."""
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (node.op in ("call_function", "call_method") and bool(_MUTATING_NAME.search(name))) \
        or node.kwargs.get("out") is not None
