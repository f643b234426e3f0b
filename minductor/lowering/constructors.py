"""Constructors (full, zeros, arange, empty, *_like, scalar_tensor) and cat/stack."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from minductor import config
from minductor.ir.layout import FixedLayout, FlexibleLayout, channels_last_order
from minductor.ir.nodes import ComputedBuffer, Pointwise, TensorBox
from minductor.ir.ops import ops
from minductor.lowering.registry import (
    Promotion,
    Unsupported,
    aten,
    common_layout_hint,
    expand_to,
    is_tensor,
    origins_of,
    promote,
    register_lowering,
    scalar_loader,
    to_dtype,
)
from minductor.lowering.views import unsqueeze
from minductor.sizevars import round_exactly
from minductor.virtualized import V

Expr = sympy.Expr
import torch._prims

prims = torch.ops.prims

# a CPU cat of at least this many elements writes each input into its slice of the output with
# its own kernel (below it, one masked pointwise kernel costs less than several kernel calls)
CAT_SLICES_MIN_NUMEL = 1 << 15


def _device(device: Any) -> torch.device:
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cpu":
        raise Unsupported(f"constructor on {dev}")
    return dev


def _check_layout(kwargs: dict[str, Any]) -> None:
    if kwargs.get("layout") not in (None, torch.strided):
        raise Unsupported("non-strided layout")


def full_of(size: Sequence[Any], value: Any, dtype: torch.dtype, device: torch.device) -> TensorBox:
    """``value`` may be symbolic: a dynamic graph's element count (an MSE loss's or a group
    norm's backward fills a tensor with it). A half or bfloat16 tensor holds the value rounded
    to its type, as eager's (a kernel computes on 16-bit values as floats: unrounded, a
    bfloat16 ``full(-7.3127)`` fed the kernels -7.3127 where eager's tensor holds -7.3125)."""
    if dtype in (torch.float16, torch.bfloat16) and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor(float(value), dtype=torch.float32).to(dtype).item()
    load = scalar_loader(value, dtype)
    return TensorBox.create(Pointwise(device, dtype, load, [sympy.sympify(s) for s in size], origins=frozenset({"full"})))


def _default_dtype(value: Any) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.get_default_dtype()


@register_lowering(aten.full)
def full(size: Sequence[Any], fill_value: Any, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    return full_of(size, fill_value, dtype or _default_dtype(fill_value), _device(kwargs.get("device")))


@register_lowering(aten.scalar_tensor)
def scalar_tensor(value: Any, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    return full_of([], value, dtype or torch.get_default_dtype(), _device(kwargs.get("device")))


@register_lowering(aten.zeros)
def zeros(size: Sequence[Any], *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    return full_of(size, 0, dtype or torch.get_default_dtype(), _device(kwargs.get("device")))


@register_lowering(aten.ones)
def ones(size: Sequence[Any], *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    return full_of(size, 1, dtype or torch.get_default_dtype(), _device(kwargs.get("device")))


@register_lowering(aten.empty.memory_format, aten.empty_strided, aten.empty_permuted)
def empty(size: Sequence[Any], *args: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    # contents are unspecified; zero-filled keeps results deterministic
    _check_layout(kwargs)
    return full_of(size, 0, dtype or torch.get_default_dtype(), _device(kwargs.get("device")))


def like_device(x: TensorBox, kwargs: dict[str, Any]) -> torch.device:
    """The device of a ``*_like`` constructor of ``x`` (its layout checked)."""
    _check_layout(kwargs)
    device = kwargs.get("device")
    return _device(device) if device is not None else x.get_device()


def _like(x: TensorBox, value: Any, dtype: torch.dtype | None, kwargs: dict[str, Any]) -> TensorBox:
    return full_of(x.get_size(), value, dtype or x.get_dtype(), like_device(x, kwargs))


@register_lowering(aten.full_like)
def full_like(x: TensorBox, fill_value: Any, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    return _like(x, fill_value, dtype, kwargs)


@register_lowering(aten.zeros_like)
def zeros_like(x: TensorBox, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    return _like(x, 0, dtype, kwargs)


@register_lowering(aten.ones_like)
def ones_like(x: TensorBox, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    return _like(x, 1, dtype, kwargs)


@register_lowering(aten.new_empty_strided)
def new_empty_strided(x: TensorBox, size: Sequence[Any], stride: Sequence[Any], *, dtype: torch.dtype | None = None,
                      **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    device = kwargs.get("device")
    return full_of(size, 0, dtype or x.get_dtype(), _device(device) if device is not None else x.get_device())


@register_lowering(aten.empty_like)
def empty_like(x: TensorBox, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    return _like(x, 0, dtype, kwargs)


@register_lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(*args: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    if dtype is None:
        # integer bounds (sizes of a dynamic graph among them) give int64, as in eager
        integer = all(isinstance(v, int) or (isinstance(v, sympy.Expr) and v.is_integer) for v in (start, end, step))
        dtype = torch.int64 if integer else torch.get_default_dtype()
    numeric = all(isinstance(v, (int, float)) or (isinstance(v, sympy.Expr) and v.is_number) for v in (start, end, step))
    if numeric and not dtype.is_floating_point:
        # eager converts the bounds to the integer type first: arange(0.5, 6.5, 1.5, dtype=int64) is 0..5
        start, end, step = int(start), int(end), int(step)
        if step == 0:
            raise Unsupported("arange with an integer dtype and a step that truncates to 0 (eager raises)")
    if all(isinstance(v, int) for v in (start, end, step)):
        length = sympy.Integer(max(0, -(-(end - start) // step)))
    elif any(isinstance(v, sympy.Expr) and not v.is_number for v in (start, end, step)):
        if isinstance(step, float) and step.is_integer():
            step = int(step)  # XLNet: arange(beg, end, -1.0, dtype=int64) over a dynamic length
        if not isinstance(step, int) or step == 0:
            raise Unsupported(f"arange with a symbolic bound needs a nonzero integer step, got {step!r}")
        # a float bound (Dynamo specializes on floats) makes the span fractional: arange(s, 3.1) has 4 - s
        length = round_exactly((sympy.sympify(end) - sympy.sympify(start)) / step, up=True)
    else:
        import math

        length = sympy.Integer(max(0, math.ceil((end - start) / step)))
    device = _device(kwargs.get("device"))
    compute = torch.float64 if dtype.is_floating_point else torch.int64

    def inner_fn(index: Sequence[Expr]) -> Any:
        if isinstance(start, sympy.Expr) and not start.is_number:  # an integer start and step
            return ops.to_dtype(ops.index_expr(index[0] * step + start, torch.int64), dtype)
        i = ops.index_expr(index[0], compute)
        value = ops.add(ops.mul(i, ops.constant(step, compute)), ops.constant(start, compute))
        return ops.to_dtype(value, dtype)

    return TensorBox.create(Pointwise(device, dtype, inner_fn, [length], origins=frozenset({"arange"})))


@register_lowering(prims.iota)
def iota(length: int, *, start: int, step: int, dtype: torch.dtype, device: Any, requires_grad: bool = False) -> TensorBox:
    def inner_fn(index: Sequence[Expr]) -> Any:
        return ops.index_expr(index[0] * step + start, dtype)

    return TensorBox.create(Pointwise(_device(device), dtype, inner_fn, [sympy.Integer(length)], origins=frozenset({"iota"})))


@register_lowering(aten.cat)
def cat(tensors: Sequence[TensorBox], dim: int = 0) -> TensorBox:
    """Concatenation: large on CPU, one kernel per input writing its slice; otherwise one
    pointwise body that selects its source by index (masked loads). Channels-last inputs give
    a channels-last result, as in eager."""
    tensors = [t for t in tensors if not (len(t.get_size()) == 1 and t.get_size()[0] == 0)] or list(tensors[:1])
    if len(tensors) == 1:
        from minductor.lowering.pointwise import clone

        return clone(tensors[0])
    ndim = len(tensors[0].get_size())
    dim = dim + ndim if dim < 0 else dim
    _, dtype = promote(tensors, Promotion.NO_OPMATH)
    tensors = [to_dtype(t, dtype) for t in tensors]
    offsets, total = [], sympy.Integer(0)
    for t in tensors:
        offsets.append(total)
        total = total + t.get_size()[dim]
    size = list(tensors[0].get_size())
    size[dim] = total
    parts = []
    for t in tensors:
        t_size = list(size)
        t_size[dim] = t.get_size()[dim]
        parts.append(expand_to(t, t_size).make_loader())
    device, order = tensors[0].get_device(), common_layout_hint(tensors, ndim)
    if order is None and ndim == 4 and _feeds_channels_last_convolution(tensors[0]):
        order = channels_last_order(4)
    if device.type == "cpu" and config.cpu_backend == "cpp" and V.graph.sizevars.hint(sympy.Mul(*size)) >= CAT_SLICES_MIN_NUMEL:
        layout = FlexibleLayout.in_order(device, dtype, size, order) if order else FlexibleLayout.contiguous(device, dtype, size)
        return _cat_into_slices(layout.freeze(), dim, [t.get_size()[dim] for t in tensors], offsets, parts,
                                origins_of(tensors[0]) | {"cat"})

    def inner_fn(index: Sequence[Expr]) -> Any:
        i = index[dim]
        result = None
        for k in range(len(parts) - 1, -1, -1):
            local = list(index)
            local[dim] = i - offsets[k]
            load = parts[k]
            value = ops.masked(_in_part(i, offsets[k], k, offsets, total), _bind(load, local), 0)
            result = value if result is None else ops.where(_in_part(i, offsets[k], k, offsets, total), value, result)
        return result

    return TensorBox.create(Pointwise(device, dtype, inner_fn, size, origins=origins_of(*tensors) | {"cat"}, stride_order=order))


def _feeds_channels_last_convolution(first: TensorBox) -> bool:
    """Whether the concatenation being lowered is the input of a convolution that will read
    it channels-last (a U-Net's skip connection, a feature pyramid's): stored so from the
    start, the convolution needs no transposing copy, and a training graph saves that
    channels-last input for the convolution's backward (oneDNN reorders an NCHW one: 15.3 ms
    against 11.2 for a (8, 128, 64, 64) input). Its other readers may only be graph outputs
    (a saved tensor keeps our layout; one the user sees is copied to eager's strides)."""
    from minductor.lowering.extern import channels_last_conv

    node = V.graph.current_node
    users = list(node.users) if node is not None else []
    convs = [u for u in users if u.op == "call_function" and u.target is aten.convolution.default and u.args[0] is node]
    return bool(convs) and all(u in convs or u.op == "output" for u in users) \
        and channels_last_conv(first)


def _cat_into_slices(layout: FixedLayout, dim: int, extents: list[Expr], offsets: list[Expr], parts: list[Any],
                     origins: frozenset[str]) -> TensorBox:
    """A large CPU concatenation as one kernel per input, each writing its slice of the output.

    The single masked pointwise body evaluates every input's load and mask at every element
    (on CPU a masked-off strided load is still a gather): a transformer's backward cat of q, k
    and v gradients ran 624 us as one kernel, 91 + 81 + 81 us as three (each timed alone, one
    process, before loop_shapes.split_and_merge_dims halved two of them). The first input's node owns the
    output's storage and writes its slice (offset 0); each later input is a node that stores
    into that buffer at its offset (a mutation, ordered after the owner and before readers).
    Inputs are not realized first: an unrealized input is computed inside its slice's loop."""
    from minductor.lowering.scatter import _mutate

    def part_size(k: int) -> list[Expr]:
        s = list(layout.size)
        s[dim] = extents[k]
        return s

    owner = ComputedBuffer(name="", layout=layout, data=Pointwise(layout.device, layout.dtype, parts[0], part_size(0), origins=origins))
    V.graph.register_buffer(owner)
    indexer = layout.make_indexer()
    for k in range(1, len(parts)):
        def body(index: Sequence[Expr], load: Any = parts[k], offset: Expr = offsets[k]) -> None:
            at = list(index)
            at[dim] = at[dim] + offset
            ops.store(owner.name, indexer(at), load(index))

        _mutate(owner, part_size(k), body, "cat", own_slice=True)
    return TensorBox.create(owner)


def _bind(load: Any, index: list[Expr]) -> Any:
    return lambda: load(index)


def _in_part(i: Expr, start: Expr, k: int, offsets: list[Expr], total: Expr) -> Any:
    end = offsets[k + 1] if k + 1 < len(offsets) else total
    lo = ops.ge(ops.index_expr(i, torch.int64), ops.index_expr(start, torch.int64))
    hi = ops.lt(ops.index_expr(i, torch.int64), ops.index_expr(end, torch.int64))
    return ops.logical_and(lo, hi)


@register_lowering(aten.stack)
def stack(tensors: Sequence[TensorBox], dim: int = 0) -> TensorBox:
    ndim = len(tensors[0].get_size()) + 1
    dim = dim + ndim if dim < 0 else dim
    return cat([unsqueeze(t, dim) for t in tensors], dim)


__all__ = ["is_tensor"]


@register_lowering(aten.constant_pad_nd)
def constant_pad_nd(x: TensorBox, pad: Sequence[int], value: Any = 0) -> TensorBox:
    """Padding as a masked load: no copy, fuses with producer and consumer."""
    size = list(x.get_size())
    if len(pad) % 2 or len(pad) // 2 > len(size):
        raise Unsupported(f"constant_pad_nd with pad {list(pad)} for a {len(size)}-d input")
    lows: dict[int, Expr] = {}
    out_size = list(size)
    for k in range(len(pad) // 2):
        d = len(size) - 1 - k
        # (symbolic under dynamic shapes: Longformer pads its sequence to a multiple of its window)
        lo, hi = sympy.sympify(pad[2 * k]), sympy.sympify(pad[2 * k + 1])
        lows[d] = lo
        out_size[d] = size[d] + lo + hi
    dtype = x.get_dtype()
    fill = bool(value) if dtype == torch.bool else (float(value) if dtype.is_floating_point else int(value))
    load = x.make_loader()

    def inner_fn(index: Sequence[Expr]) -> Any:
        src = list(index)
        mask = None
        for d, lo in lows.items():
            src[d] = index[d] - lo
            pos = ops.index_expr(src[d], torch.int64)
            inside = ops.logical_and(ops.ge(pos, ops.constant(0, torch.int64)),
                                     ops.lt(pos, ops.index_expr(size[d], torch.int64)))
            mask = inside if mask is None else ops.logical_and(mask, inside)
        if mask is None:
            return load(src)
        return ops.masked(mask, lambda: load(src), fill)

    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, out_size, origins=x.origins | {"constant_pad_nd"}))
