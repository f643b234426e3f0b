"""Lowerings to the XLA path: ``minductor::einsum`` and ``higher_order.scan`` become ``XlaKernel``s.

An ``XlaKernel`` is an extern node whose op is an ``XlaComputation`` (a jitted, generated JAX
function) registered with the graph; its outputs are ``MultiOutput``s. When JAX is missing or
the computation cannot be expressed (an op outside the scan table, a dtype JAX lacks), the
lowering raises ``Unsupported`` and the op runs through aten instead.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import torch

from minductor import metrics
from minductor.ir.layout import FixedLayout, contiguous_strides
from minductor.ir.nodes import FallbackKernel, IRNode, MultiOutput, TensorBox
from minductor.lowering.extern import _realize_args, layout_of
from minductor.lowering.registry import Unsupported, register_lowering
from minductor.virtualized import V

log = logging.getLogger("minductor")

# dtypes with a JAX counterpart; complex and the float8 family fall back
XLA_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                        torch.int16, torch.int8, torch.uint8, torch.bool})
_names = itertools.count()


class XlaKernel(FallbackKernel):
    """An extern call of a jitted JAX computation; outputs are picked with ``MultiOutput``."""


def _check_dtypes(what: str, values: Sequence[Any]) -> None:
    for v in values:
        dtype = v.get_dtype() if isinstance(v, IRNode) else getattr(v, "dtype", None)
        if dtype is not None and dtype not in XLA_DTYPES:
            raise Unsupported(f"{what}: dtype {dtype} has no XLA counterpart")


def _require_jax() -> None:
    from minductor.codegen.xla import jax_available

    if not jax_available():
        raise Unsupported("JAX is not installed")


def xla_kernel(computation: Any, inputs: Sequence[TensorBox], outputs: Sequence[torch.Tensor]) -> list[TensorBox]:
    """Register ``computation`` with the graph and return its outputs (fake values give layouts)."""
    graph = V.graph
    name = graph.register_callable(computation, f"xla_{computation.name}")
    node = XlaKernel(name="", layout=None, op=computation, args=_realize_args(list(inputs)), kwargs={})  # type: ignore[arg-type]
    graph.register_buffer(node)
    metrics.kernels_by_backend["xla"] += 1
    metrics.generated_kernel_count += 1
    _dump(graph, name, computation, inputs)
    return _outputs(node, outputs)


def _dump(graph: Any, name: str, computation: Any, inputs: Sequence[TensorBox]) -> None:
    dump = getattr(graph, "dump", None)
    if dump is None:
        return
    hint = graph.sizevars.hint
    specs = [([hint(s) for s in x.get_size()], x.get_dtype()) for x in inputs]
    try:
        hlo = computation.stablehlo(specs)
    except Exception as e:  # noqa: BLE001 - the dump must never break compilation
        hlo = f"// lowering for the dump failed: {e}\n"
    dump.write(f"{name}.py", computation.source)
    dump.write(f"{name}.stablehlo.mlir", hlo)


# -- einsum -----------------------------------------------------------------------------


@register_lowering("minductor.einsum.default")
def einsum(equation: str, operands: Sequence[TensorBox]) -> TensorBox:
    from minductor.codegen.xla_einsum_kernel import einsum_computation

    _require_jax()
    val = V.graph.current_node.meta["val"]
    _check_dtypes("einsum", [*operands, val])
    dtypes = [o.get_dtype() for o in operands]
    computation = einsum_computation(equation, tuple(dtypes), val.dtype)
    return xla_kernel(computation, operands, [val])[0]


# -- scan ---------------------------------------------------------------------------------


@register_lowering(torch.ops.higher_order.scan)
def scan(combine: torch.fx.GraphModule, init: Sequence[TensorBox], xs: Sequence[TensorBox],
         additional: Sequence[Any]) -> list[TensorBox]:
    from minductor.codegen.xla_scan import UnsupportedScan, scan_computation

    val = V.graph.current_node.meta["val"]
    inputs = [*init, *xs, *additional]
    try:
        if not all(isinstance(x, IRNode) for x in inputs):
            raise UnsupportedScan("a non-tensor scan input")
        _require_jax()
        _check_dtypes("scan", [*inputs, *val])
        computation = scan_computation(combine, len(init), len(xs), len(additional),
                                       [x.get_dtype() for x in inputs])
    except (UnsupportedScan, Unsupported) as e:
        log.warning("minductor: scan runs through aten (not XLA): %s", e)
        return _scan_fallback(combine, init, xs, additional, val)
    return xla_kernel(computation, inputs, list(val))


def _scan_fallback(combine: torch.fx.GraphModule, init: Sequence[Any], xs: Sequence[Any], additional: Sequence[Any],
                   val: Sequence[torch.Tensor]) -> list[TensorBox]:
    """Run the scan op eagerly (its own loop) on the subgraph, called from the wrapper."""
    graph = V.graph
    metrics.fallback_ops["higher_order.scan"] += 1
    run = _EagerScan(combine)
    name = graph.register_callable(run, "scan_aten")
    node = XlaKernel(name="", layout=None, op=run, args=_realize_args([list(init), list(xs), list(additional)]),  # type: ignore[arg-type]
                     kwargs={})
    graph.register_buffer(node)
    del name
    return _outputs(node, val)


class _EagerScan:
    def __init__(self, combine: torch.fx.GraphModule) -> None:
        self.combine = combine

    def __call__(self, init: list[torch.Tensor], xs: list[torch.Tensor], additional: list[torch.Tensor]) -> Any:
        return torch.ops.higher_order.scan(self.combine, init, xs, tuple(additional))


def _outputs(node: XlaKernel, outputs: Sequence[torch.Tensor]) -> list[TensorBox]:
    results = []
    for i, val in enumerate(outputs):
        out = MultiOutput(name="", layout=_contiguous_layout(val), parent=node, indices=(i,))
        V.graph.register_buffer(out)
        results.append(TensorBox.create(out))
    return results


def _contiguous_layout(val: torch.Tensor) -> FixedLayout:
    """JAX hands back row-major buffers, whatever strides the fake value had."""
    layout = layout_of(val)
    return FixedLayout(layout.device, layout.dtype, layout.size, tuple(contiguous_strides(layout.size)))


__all__ = ["XlaKernel", "einsum", "scan", "xla_kernel"]
