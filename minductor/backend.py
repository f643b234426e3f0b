"""The ``torch.compile`` entry point: ``backend="minductor"``.

Declared as the ``torch_dynamo_backends`` entry point in pyproject.toml, so it works in a
fresh interpreter without ``import minductor``. AOTAutograd turns Dynamo's graph into aten
forward/backward (or inference) graphs; each goes through ``compile_graph``.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

aten = torch.ops.aten

# composite ops outside the core table that we want as primitives we fuse
_EXTRA_DECOMPOSITIONS = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm,
    aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit,
    aten.native_group_norm, aten.addcdiv, aten.lerp, aten.sigmoid_backward, aten.tanh_backward,
    aten.silu_backward, aten.gelu_backward, aten.mse_loss_backward, aten.std, aten.logit,
]
# decompositions we drop because a direct lowering is better
_KEEP_WHOLE = [aten.clamp_min, aten.clamp_max, aten.index_add]


@functools.cache
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_EXTRA_DECOMPOSITIONS))
    for packet in _KEEP_WHOLE:
        for name in packet.overloads():
            table.pop(getattr(packet, name), None)
    return table


@functools.cache
def scan_decomposition_table() -> dict[Any, Callable[..., Any]]:
    """For graphs holding scan: detach stays whole (its decomposition into alias makes
    the scan body look like it aliases its inputs, which functionalization rejects)."""
    table = dict(decomposition_table())
    table.pop(aten.detach.default, None)
    return table


def _has_scan(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.higher_order.scan for n in gm.graph.nodes) or any(
        isinstance(m, torch.fx.GraphModule) and _has_scan(m) for m in gm.children())


def _compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
    def compile_fn(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from minductor.graph import compile_graph

        return compile_graph(gm, example_inputs, kind)

    return compile_fn


def _rewrite_before_aot(gm: torch.fx.GraphModule) -> None:
    """Ops AOTAutograd would decompose but the XLA path runs whole: einsum (and aten.gru with scan_rnn)."""
    from minductor import config

    if any(n.op == "call_function" and n.target in (torch.einsum, torch.functional.einsum) for n in gm.graph.nodes):
        from minductor.codegen.xla_einsum import rewrite_einsum  # registers a custom op: ~0.06 s, only when needed

        rewrite_einsum(gm)
    if config.scan_rnn or "minductor.nn" in sys.modules:  # minductor.nn.GRU records torch._VF.gru
        from minductor.nn import rewrite_gru

        rewrite_gru(gm, all_grus=config.scan_rnn)


def minductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """Dynamo backend: AOTAutograd with minductor's forward/backward/inference compilers."""
    _rewrite_before_aot(gm)
    return aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=scan_decomposition_table() if _has_scan(gm) else decomposition_table(),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,  # copy_ into inputs is lowered in the graph
    )(gm, example_inputs)
