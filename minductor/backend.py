"""The ``torch.compile`` entry point: ``backend="minductor"``.

Declared as the ``torch_dynamo_backends`` entry point in pyproject.toml, so it works in a
fresh interpreter without ``import minductor``. AOTAutograd turns Dynamo's graph into aten
forward/backward (or inference) graphs; each goes through ``compile_graph``. AOTAutograd's
cache stores the compiled graphs with its runtime wrappers (``aot_cache.py``), so a warm
start skips its tracing as well.

``aot_module_simplified`` is called directly rather than through Dynamo's ``aot_autograd``
helper, which imports TorchInductor's debug module (and its IR and scheduler) on every
compile for a logging context; the helper's other steps are the few lines of ``minductor``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import _core_aten_decompositions_post_autograd, get_decompositions
from torch._dynamo import disable
from torch._dynamo.backends.common import flatten_graph_inputs
from torch._functorch.aot_autograd import aot_module_simplified

from minductor import config, direct_call
from minductor.decompositions import DECOMPOSITIONS
from minductor.partition import partition

aten = torch.ops.aten
log = logging.getLogger("minductor")

# composite ops outside the core table that we want as primitives we fuse
_EXTRA_DECOMPOSITIONS = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm,
    aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit,
    # (as fallbacks, half/bfloat16 running statistics were read as float32: the functional form's
    # fake kernel says float32 where eager's kernel returns the input's dtype)
    aten._batch_norm_with_update, aten._batch_norm_with_update_functional, aten._batch_norm_no_update,
    aten.native_group_norm, aten.addcdiv, aten.lerp, aten.sigmoid_backward, aten.tanh_backward,
    aten.silu_backward, aten.gelu_backward, aten.mse_loss_backward, aten.std, aten.logit,
    # (aten fallbacks before, breaking fusion: F.normalize, cosine_similarity, clip_grad_norm_)
    aten.linalg_vector_norm, aten.tril_indices, aten.triu_indices,
]
# decomposed unless config.fallback_random: into rand_like, generated in the kernel
# (lowering/random.py); eager's draws its mask with bernoulli_
_RANDOM_DECOMPOSITIONS = [aten.native_dropout]
# real decompositions (not CompositeImplicitAutograd passthroughs) that core_aten_decompositions()
# adds to the explicit post-autograd table
_CORE_EXTRAS = [
    aten._upsample_bicubic2d_aa.vec, aten._upsample_bilinear2d_aa.vec, aten._upsample_lanczos2d_aa.vec,
    aten._upsample_nearest_exact1d.default, aten._upsample_nearest_exact1d.vec,
    aten._upsample_nearest_exact2d.default, aten._upsample_nearest_exact2d.vec,
    aten._upsample_nearest_exact3d.default, aten._upsample_nearest_exact3d.vec,
    aten.upsample_nearest1d.default, aten.upsample_nearest1d.vec, aten.upsample_nearest2d.default,
    aten.upsample_nearest3d.default, aten.upsample_nearest3d.vec, aten.upsample_bicubic2d.vec,
    aten.upsample_linear1d.vec, aten.upsample_trilinear3d.vec,
    aten.broadcast_tensors.default, aten.matmul.default, aten.one_hot.default, aten.pad_sequence.default,
    aten.gru.data, aten.gru.input, aten.lstm.data, aten.lstm.input, aten.rnn_relu.data, aten.rnn_relu.input,
    aten.rnn_tanh.data, aten.rnn_tanh.input, aten.istft.default, aten.stft.center,
]
# decompositions we drop because a direct lowering is better
_KEEP_WHOLE = [aten.clamp_min, aten.clamp_max, aten.index_add, aten.roll, aten.reflection_pad1d, aten.reflection_pad2d,
               aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d,
               aten.reflection_pad1d_backward, aten.reflection_pad2d_backward, aten.reflection_pad3d_backward]


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """The core-aten decompositions and our extras. ``core_aten_decompositions()`` is this
    same table plus an entry per CompositeImplicitAutograd op (~0.09 s to build); AOTAutograd
    decomposes those ops while tracing anyway (the aten graphs of every OpInfo sample come out
    the same), so the explicit table and ``_CORE_EXTRAS`` are enough."""
    return _decomposition_table(config.fallback_random)


@functools.cache
def _decomposition_table(fallback_random: bool) -> dict[Any, Callable[..., Any]]:
    table = dict(_core_aten_decompositions_post_autograd())
    table.update(get_decompositions(_CORE_EXTRAS + _EXTRA_DECOMPOSITIONS
                                    + ([] if fallback_random else _RANDOM_DECOMPOSITIONS)))
    table.update(DECOMPOSITIONS)
    for packet in _KEEP_WHOLE:
        for name in packet.overloads():
            table.pop(getattr(packet, name), None)
    return table


def scan_decomposition_table() -> dict[Any, Callable[..., Any]]:
    """For graphs holding scan: detach stays whole (its decomposition into alias makes
    the scan body look like it aliases its inputs, which functionalization rejects)."""
    return _scan_decomposition_table(config.fallback_random)


@functools.cache
def _scan_decomposition_table(fallback_random: bool) -> dict[Any, Callable[..., Any]]:
    table = dict(_decomposition_table(fallback_random))
    table.pop(aten.detach.default, None)
    return table


def _has_scan(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.higher_order.scan for n in gm.graph.nodes) or any(
        isinstance(m, torch.fx.GraphModule) and _has_scan(m) for m in gm.children())


def _compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
    def compile_fn(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from minductor.graph import compile_graph

        graph = compile_graph(gm, example_inputs, kind)
        if kind == "inference":
            graph.direct_arity = direct_call.wrapper_free_arity(example_inputs)
        direct_call.note(graph)
        graph.report_output_strides()
        return graph

    return compile_fn


def _compilers(cache: bool) -> tuple[Any, Any, Any]:
    """The forward, backward and inference compilers; with ``cache``, ones whose graphs
    AOTAutograd's cache stores (``aot_cache.py``)."""
    from minductor import aot_cache

    fw, bw, inference = _compiler("forward"), _compiler("backward"), _compiler("inference")
    if not cache:
        return fw, _not_traced(bw), inference
    bw = _not_traced(aot_cache.holding_settings(bw))
    return aot_cache.serializable(fw), aot_cache.serializable(bw), aot_cache.serializable(inference)


def _rewrite_before_aot(gm: torch.fx.GraphModule) -> None:
    """Ops AOTAutograd would decompose but the XLA path runs whole: einsum (and aten.gru with scan_rnn)."""
    if any(n.op == "call_function" and n.target in (torch.einsum, torch.functional.einsum) for n in gm.graph.nodes):
        from minductor.codegen.xla_einsum import rewrite_einsum  # registers a custom op: ~0.06 s, only when needed

        rewrite_einsum(gm)
    if config.scan_rnn or "minductor.nn" in sys.modules:  # minductor.nn.GRU records torch._VF.gru
        from minductor.nn import rewrite_gru

        rewrite_gru(gm, all_grus=config.scan_rnn)


def _not_traced(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The backward compiler runs lazily, from autograd: Dynamo must trace neither it nor the
    callable it returns."""
    def compile_backward(*args: Any) -> Any:
        return disable(disable(compile_fn, reason="minductor's backward compiler")(*args),
                       reason="minductor's compiled backward")

    return compile_backward


def minductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """Dynamo backend: AOTAutograd with minductor's forward/backward/inference compilers."""
    if kwargs:
        log.warning("minductor: ignoring backend options %s", sorted(kwargs))
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return flatten_graph_inputs(gm, example_inputs, minductor)
    _rewrite_before_aot(gm)
    from minductor import aot_cache, config

    cache = config.aot_cache and not config.debug  # a debug run dumps every stage: no cache hit
    fw, bw, inference = _compilers(cache)
    with aot_cache.settings() if cache else contextlib.nullcontext(), direct_call.collecting() as graphs:
        compiled = aot_module_simplified(
            gm, example_inputs,
            fw_compiler=fw,
            bw_compiler=bw,
            inference_compiler=inference,
            decompositions=scan_decomposition_table() if _has_scan(gm) else decomposition_table(),
            partition_fn=partition,
            keep_inference_input_mutations=True,  # copy_ into inputs is lowered in the graph
        )
    # (Dynamo's output graph wraps what we return in its own disable(); a second one cost
    # 33 us a call after a kernel that streamed 64 MB)
    return direct_call.direct_callable(gm, graphs, example_inputs) or compiled
