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
    results = []
    for i, val in enumerate(outputs):
        out = MultiOutput(name="", layout=layout_of(val), parent=node, indices=(i,))
        graph.register_buffer(out)
        results.append(TensorBox.create(out))
    return results


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


__all__ = ["XlaKernel", "einsum", "xla_kernel"]
