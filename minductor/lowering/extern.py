"""Extern calls: mm/addmm/bmm/baddbmm/convolution write into buffers the wrapper plans,
and ``fallback`` runs any aten op minductor does not lower."""
from __future__ import annotations

from typing import Any

import torch

from minductor import metrics
from minductor.ir.layout import FixedLayout
from minductor.ir.nodes import ExternKernelAlloc, ExternKernelOut, FallbackKernel, IRNode, MultiOutput, TensorBox
from minductor.ir.views import realize_input
from minductor.lowering.registry import aten, register_lowering
from minductor.sizevars import to_expr
from minductor.virtualized import V


def layout_of(val: torch.Tensor) -> FixedLayout:
    """The layout of a fake result; a buffer's offset is 0 (wrapper tensors start there)."""
    return FixedLayout(val.device, val.dtype, tuple(to_expr(s) for s in val.shape), tuple(to_expr(s) for s in val.stride()))


def _realize_args(obj: Any) -> Any:
    if isinstance(obj, IRNode):
        return realize_input(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_realize_args(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _realize_args(v) for k, v in obj.items()}
    return obj


def extern_out(op: Any, *args: Any, **kwargs: Any) -> TensorBox:
    """Call ``op`` (an ``.out`` overload) writing into a newly planned buffer."""
    val = V.graph.current_node.meta["val"]
    layout = layout_of(val)
    node = ExternKernelOut(name="", layout=FixedLayout(layout.device, layout.dtype, layout.size, layout.stride), op=op,
                           args=_realize_args(args), kwargs=_realize_args(kwargs))
    V.graph.register_buffer(node)
    return TensorBox.create(node)


@register_lowering(aten.mm)
def mm(a: TensorBox, b: TensorBox) -> TensorBox:
    return extern_out(aten.mm.out, a, b)


@register_lowering(aten.bmm)
def bmm(a: TensorBox, b: TensorBox) -> TensorBox:
    return extern_out(aten.bmm.out, a, b)


@register_lowering(aten.addmm)
def addmm(bias: TensorBox, a: TensorBox, b: TensorBox, *, beta: Any = 1, alpha: Any = 1) -> TensorBox:
    return extern_out(aten.addmm.out, bias, a, b, beta=beta, alpha=alpha)


@register_lowering(aten.baddbmm)
def baddbmm(bias: TensorBox, a: TensorBox, b: TensorBox, *, beta: Any = 1, alpha: Any = 1) -> TensorBox:
    return extern_out(aten.baddbmm.out, bias, a, b, beta=beta, alpha=alpha)


@register_lowering(aten.convolution)
def convolution(x: TensorBox, weight: TensorBox, bias: Any, stride: Any, padding: Any, dilation: Any,
                transposed: bool, output_padding: Any, groups: int) -> TensorBox:
    val = V.graph.current_node.meta["val"]
    node = ExternKernelAlloc(name="", layout=layout_of(val), op=aten.convolution.default,
                             args=_realize_args((x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)))
    V.graph.register_buffer(node)
    return TensorBox.create(node)


def fallback(op: Any, args: Any, kwargs: Any, val: Any) -> Any:
    """Run ``op`` through aten: a graph never fails to compile because an op is missing."""
    metrics.fallback_ops[str(op.overloadpacket if hasattr(op, "overloadpacket") else op)] += 1
    layout = layout_of(val) if isinstance(val, torch.Tensor) else None
    node = FallbackKernel(name="", layout=layout, op=op, args=_realize_args(args), kwargs=_realize_args(kwargs))  # type: ignore[arg-type]
    V.graph.register_buffer(node)
    if isinstance(val, torch.Tensor):
        return TensorBox.create(node)
    return _pick_outputs(node, val, ())


def _pick_outputs(node: FallbackKernel, val: Any, indices: tuple[int, ...]) -> Any:
    if isinstance(val, torch.Tensor):
        out = MultiOutput(name="", layout=layout_of(val), parent=node, indices=indices)
        V.graph.register_buffer(out)
        return TensorBox.create(out)
    if isinstance(val, (list, tuple)):
        return type(val)(_pick_outputs(node, v, indices + (i,)) for i, v in enumerate(val))
    return val
