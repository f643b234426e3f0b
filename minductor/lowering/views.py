"""View lowerings: reshape, permute, expand, squeeze, select, slice, as_strided...

All are lazy index remaps (``make_view``); on realized storage they fold to zero-copy
``ReinterpretView``s. Reshape of non-contiguous data uses FloorDiv/ModularIndexing.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from minductor.ir.indexing import FloorDiv, ModularIndexing
from minductor.ir.layout import FixedLayout, as_exprs
from minductor.ir.nodes import InputBuffer, Pointwise, TensorBox
from minductor.ir.ops import ops
from minductor.ir.views import ReinterpretView, make_view, realize_input
from minductor.lowering.registry import (
    Unsupported,
    aten,
    common_layout_hint,
    expand_to,
    origins_of,
    register_lowering,
    to_dtype,
)
from minductor.sizevars import to_expr
from minductor.virtualized import V

Expr = sympy.Expr


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def infer_size(size: Sequence[Any], numel: Expr) -> list[Expr]:
    size = list(size)
    if -1 in size:
        i = size.index(-1)
        known = sympy.Mul(*[sympy.sympify(s) for j, s in enumerate(size) if j != i]) if len(size) > 1 else sympy.Integer(1)
        size[i] = FloorDiv(sympy.sympify(numel), known) if known != 0 else sympy.Integer(0)
    return as_exprs(size)


@register_lowering(aten.view, aten._unsafe_view, aten.reshape)
def view(x: TensorBox, size: Sequence[Any]) -> TensorBox:
    if isinstance(size, torch.dtype):
        raise Unsupported("view as another dtype")
    old = x.get_size()
    new = infer_size(size, x.get_numel())
    if list(old) == list(new):
        return x
    return make_view(x, new, _reshape_indexer(old, new))


def _reshape_indexer(old: Sequence[Expr], new: Sequence[Expr]) -> Any:
    """Map new-shape indices to old-shape ones.

    Dims are matched in groups of equal product (``[a*b] <-> [a, b]``), so a contiguous
    reshape yields plain affine indices; only within a group that genuinely mixes dims do
    FloorDiv/ModularIndexing appear.
    """
    groups = _reshape_groups(list(old), list(new))
    empty = any(sympy.sympify(s) == 0 for s in old)  # no element: no index is ever computed

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        out: list[Expr] = [sympy.Integer(0)] * len(old)
        if empty:
            return out
        for old_dims, new_dims in groups:
            flat = sympy.Integer(0)
            for d in new_dims:
                flat = flat * new[d] + index[d]
            stride = sympy.Integer(1)
            for j, d in enumerate(reversed(old_dims)):
                if old[d] == 1:
                    continue
                is_leading = all(old[e] == 1 for e in old_dims[: len(old_dims) - 1 - j])
                out[d] = FloorDiv(flat, stride) if is_leading else ModularIndexing(flat, stride, old[d])
                stride = stride * old[d]
        return out

    return reindex


def _reshape_groups(old: list[Expr], new: list[Expr]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of old and new dims with equal products (size-1 dims join a neighbour)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        og, ng = [], []
        po, pn = sympy.Integer(1), sympy.Integer(1)
        if i < len(old):
            og.append(i); po = po * old[i]; i += 1
        if j < len(new):
            ng.append(j); pn = pn * new[j]; j += 1
        while po != pn:
            if _smaller(po, pn) and i < len(old):
                og.append(i); po = po * old[i]; i += 1
            elif j < len(new):
                ng.append(j); pn = pn * new[j]; j += 1
            elif i < len(old):
                og.append(i); po = po * old[i]; i += 1
            else:
                break
        groups.append((og, ng))
    # trailing size-1 dims on either side join the last group
    return groups


def _smaller(a: Expr, b: Expr) -> bool:
    """Whether product ``a`` is below ``b``: decided symbolically where sympy can, else on the
    size hints (s0 < 4*s0 is undecided for a plain symbol). The hint only steers which side a
    group grows; a group closes only when both products are symbolically equal, so the
    indexer is right for every size."""
    decided = sympy.sympify(a) < b
    if decided in (sympy.true, sympy.false):
        return bool(decided)
    sizevars = V.graph.sizevars
    return sizevars.hint(a) < sizevars.hint(b)


@register_lowering(aten.permute)
def permute(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    ndim = len(x.get_size())
    dims = [_dim(d, ndim) for d in dims]
    if dims == list(range(ndim)):
        return x
    old = x.get_size()
    new = [old[d] for d in dims]
    inverse = [dims.index(i) for i in range(ndim)]
    return make_view(x, new, lambda index: [index[inverse[i]] for i in range(ndim)])


@register_lowering(aten.t, aten.numpy_T)
def t(x: TensorBox) -> TensorBox:
    ndim = len(x.get_size())
    return x if ndim < 2 else permute(x, [1, 0])


@register_lowering(aten.transpose)
def transpose(x: TensorBox, a: int, b: int) -> TensorBox:
    ndim = len(x.get_size())
    dims = list(range(ndim))
    if ndim == 0:
        return x
    a, b = _dim(a, ndim), _dim(b, ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


@register_lowering(aten.expand)
def expand(x: TensorBox, size: Sequence[Any], implicit: bool = False) -> TensorBox:
    old = x.get_size()
    skip = len(size) - len(old)
    new = [old[i - skip] if s == -1 else sympy.sympify(s) for i, s in enumerate(size)]
    return expand_to(x, new)


@register_lowering(aten.unsqueeze)
def unsqueeze(x: TensorBox, dim: int) -> TensorBox:
    old = x.get_size()
    dim = _dim(dim, len(old) + 1)
    new = list(old[:dim]) + [sympy.Integer(1)] + list(old[dim:])
    return make_view(x, new, lambda index: list(index[:dim]) + list(index[dim + 1:]))


@register_lowering(aten.squeeze)
def squeeze(x: TensorBox, dim: Any = None) -> TensorBox:
    old = x.get_size()
    if dim is None:
        dims = {i for i, s in enumerate(old) if s == 1}
    else:
        dims = {_dim(d, len(old)) for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
        dims = {d for d in dims if len(old) and old[d] == 1}
    if not dims:
        return x
    new = [s for i, s in enumerate(old) if i not in dims]

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        it = iter(index)
        return [sympy.Integer(0) if i in dims else next(it) for i in range(len(old))]

    return make_view(x, new, reindex)


@register_lowering(aten.select)
def select(x: TensorBox, dim: int, index: int) -> TensorBox:
    old = x.get_size()
    dim = _dim(dim, len(old))
    size, index = old[dim], sympy.sympify(index)
    if size.is_number and index.is_number and not -int(size) <= int(index) < int(size):
        raise IndexError(f"select(): index {index} out of range for dim {dim} of size {size} (shape {list(old)})")
    # (a symbolic size or index was checked by Dynamo while tracing, and is guarded)
    index = index + size if _negative(index) else index
    new = list(old[:dim]) + list(old[dim + 1:])
    return make_view(x, new, lambda idx: list(idx[:dim]) + [index] + list(idx[dim:]))


@register_lowering(aten.slice)
def slice_(x: TensorBox, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> TensorBox:
    old = x.get_size()
    dim = _dim(dim, len(old))
    _check_step(step, "slice")
    size = old[dim]
    start, length = _slice_bounds(size, start, end, step)
    length = _traced_length(length, dim, aten.slice.Tensor)
    if start == 0 and length == size and step == 1:
        return x
    new = list(old)
    new[dim] = length
    return make_view(x, new, lambda idx: list(idx[:dim]) + [idx[dim] * step + start] + list(idx[dim + 1:]))


def _check_step(step: Any, op: str) -> None:
    """A step below 1 falls back to aten (which raises); a symbolic one was checked positive
    by tracing, which raises as eager does."""
    step = sympy.sympify(step)
    if step.is_number and step <= 0:
        raise Unsupported(f"{op} step must be positive")


def _traced_length(length: Expr, dim: int, target: Any) -> Expr:
    """A symbolic ``length`` along ``dim`` of the node being lowered, as tracing computed it
    when the node is ``target``: tracing decided (and guarded) the clamps our bounds keep as
    ``Max``. ``x[..., -1:]`` over a dim of symbolic size ``n`` is 1 there, but
    ``Max(0, n - Max(0, n - 1))`` here, which cannot broadcast against ``n`` (Mamba2's chunked
    scan under dynamic shapes failed to compile)."""
    if length.is_Integer:
        return length
    node = getattr(V.graph, "current_node", None)
    val = node.meta.get("val") if node is not None and node.target is target else None
    if not isinstance(val, torch.Tensor) or dim >= val.dim():
        return length
    traced = to_expr(val.shape[dim])
    sizevars = V.graph.sizevars
    return traced if sizevars.hint(traced) == sizevars.hint(length) else length


def _slice_bounds(size: Expr, start: Any, end: Any, step: int) -> tuple[Expr, Expr]:
    """Start and length of ``[start:end:step]`` along a dim of ``size``, clamped as Python does."""
    if size.is_Integer and isinstance(step, int) and all(v is None or isinstance(v, int) for v in (start, end)):
        start, end, _ = slice(start, end, step).indices(int(size))
        return sympy.Integer(start), sympy.Integer(max(0, (end - start + step - 1) // step))
    return _symbolic_slice(size, start, end, step)


def _negative(index: Expr) -> bool:
    """Whether an index counts from the end: a negative number, or a symbolic one negative
    for every size (``-s0``: T5's ``position_bias[:, :, -seq_length:]``) or, where the sign
    is not known, at the size hint: tracing took the same branch for it and guarded it."""
    index = sympy.sympify(index)
    if index.is_negative is not None:
        return bool(index.is_negative)
    return V.graph.sizevars.hint(index) < 0


def _symbolic_slice(size: Expr, start: Any, end: Any, step: int) -> tuple[Expr, Expr]:
    """Start and length of a slice of a symbolic size, clamped as Python does."""
    big = 2**62

    def clamp(v: Any, default: Expr) -> Expr:
        if v is None or (isinstance(v, int) and v >= big):
            return default
        v = sympy.sympify(v)
        if _negative(v):
            return sympy.Max(size + v, 0)
        return sympy.Min(v, size)

    lo, hi = clamp(start, sympy.Integer(0)), clamp(end, size)
    length = FloorDiv(sympy.Max(hi - lo, 0) + step - 1, step) if step != 1 else sympy.Max(hi - lo, 0)
    return V.graph.sizevars.simplify(lo), V.graph.sizevars.simplify(length)


@register_lowering(aten.split_with_sizes)
def split_with_sizes(x: TensorBox, sizes: Sequence[int], dim: int = 0) -> list[TensorBox]:
    out, start = [], 0
    for s in sizes:
        out.append(slice_(x, dim, start, start + s))
        start += s
    return out


@register_lowering(aten.split)
def split(x: TensorBox, split_size: Any, dim: int = 0) -> list[TensorBox]:
    dim = _dim(dim, len(x.get_size()))
    total = int(x.get_size()[dim])
    if isinstance(split_size, (list, tuple)):
        return split_with_sizes(x, split_size, dim)
    sizes = [min(split_size, total - i) for i in range(0, total, split_size)] or [0]
    return split_with_sizes(x, sizes, dim)


@register_lowering(aten.unbind)
def unbind(x: TensorBox, dim: int = 0) -> list[TensorBox]:
    dim = _dim(dim, len(x.get_size()))
    return [select(x, dim, i) for i in range(int(x.get_size()[dim]))]


@register_lowering(aten.alias, aten.lift_fresh, aten.detach)
def alias(x: TensorBox) -> TensorBox:
    return x


@register_lowering(aten.as_strided)
def as_strided(x: TensorBox, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None) -> TensorBox:
    base = realize_input(x)
    if isinstance(base, ReinterpretView):
        # as_strided addresses the underlying storage, from its start
        buf, offset = base.data, base.layout.offset
    else:
        buf, offset = base, buf_offset(base)
    if storage_offset is not None:
        # counted from the start of the storage; an input is addressed from its first element
        offset = sympy.sympify(storage_offset)
        if isinstance(buf, InputBuffer):
            offset = offset - V.graph.input_storage_offset(buf.name)
    layout = FixedLayout(buf.get_device(), buf.get_dtype(), tuple(as_exprs(size)), tuple(as_exprs(stride)), offset)
    return TensorBox(ReinterpretView(buf, layout))


def buf_offset(buf: Any) -> Expr:
    return buf.layout.offset


@register_lowering(aten.diagonal)
def diagonal(x: TensorBox, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorBox:
    """The diagonal ``offset`` above the main one (below it when negative) of dims ``dim1`` and
    ``dim2``, as a new last dim. Its length over symbolic sizes is the one tracing computed."""
    old = x.get_size()
    ndim = len(old)
    d1, d2 = _dim(dim1, ndim), _dim(dim2, ndim)
    rows, cols, offset = old[d1], old[d2], sympy.sympify(offset)
    below = _negative(offset)
    length = sympy.Max(0, sympy.Min(rows + offset, cols) if below else sympy.Min(rows, cols - offset))
    rest = [i for i in range(ndim) if i not in (d1, d2)]
    length = _traced_length(V.graph.sizevars.simplify(length), len(rest), aten.diagonal.default)
    new = [old[i] for i in rest] + [length]

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        out: list[Expr] = [sympy.Integer(0)] * ndim
        for pos, i in enumerate(rest):
            out[i] = idx[pos]
        k = idx[-1]
        out[d1] = k - offset if below else k
        out[d2] = k if below else k + offset
        return out

    return make_view(x, new, reindex)


@register_lowering(aten.unfold)
def unfold(x: TensorBox, dim: int, size: int, step: int) -> TensorBox:
    """Sliding windows along ``dim`` as a new last dim: ``out[.., i, .., j] = x[.., i*step + j, ..]``."""
    old = x.get_size()
    if len(old) == 0:
        return make_view(x, [sympy.Integer(1)], lambda idx: [])
    dim = _dim(dim, len(old))
    # (tracing checked size <= old[dim], as eager does)
    count = _traced_length(FloorDiv(old[dim] - size, step) + 1, dim, aten.unfold.default)
    new = list(old[:dim]) + [count] + list(old[dim + 1:]) + [sympy.sympify(size)]
    return make_view(x, new, lambda idx: list(idx[:dim]) + [idx[dim] * step + idx[-1]] + list(idx[dim + 1:-1]))


@register_lowering(aten.slice_scatter)
def slice_scatter(x: TensorBox, src: TensorBox, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> TensorBox:
    """``x`` with ``src`` written over its slice ``[start:end:step]`` along ``dim``, as a pointwise
    select: functionalization makes one of every ``y[:, a:b] = v`` (and a circular pad five),
    and as a select it fuses with what computes ``x`` and ``src`` and with what reads the
    result; its bound tests are cut into interior loops (``cpp_interior``). It fell back to
    aten before: a circular pad of (8, 64, 128, 128) ran 97 ms, eager 10."""
    size = x.get_size()
    dim = _dim(dim, len(size))
    _check_step(step, "slice_scatter")
    lo, length = _slice_bounds(size[dim], start, end, step)
    src_size = list(size)
    src_size[dim] = length
    src = expand_to(to_dtype(src, x.get_dtype()), src_size)
    if lo == 0 and length == size[dim] and step == 1:
        from minductor.lowering.pointwise import clone

        return clone(src)
    target = V.graph.input_overwritten_here(x)
    if target is not None:
        return _write_slice(x, target, src, dim, lo, step)
    return _slice_scatter_select(x, src, dim, lo, length, step)


def _write_slice(x: TensorBox, target: Any, src: TensorBox, dim: int, lo: Expr, step: int) -> TensorBox:
    """Write ``src`` into the slice of the graph input ``x`` in place: the graph copies the
    result back into ``x`` (a KV cache's update, ``cache[:, pos] = k``), so only the slice
    changes (the whole cache, computed anew and copied back, made a decoding step's update 4.4
    ms for a (16, 2048, 512) cache instead of eager's 9 us)."""
    from minductor.lowering.scatter import _mutate

    V.graph.realize_pending_readers(target.name)
    load, indexer = src.make_loader(), target.layout.make_indexer()

    def body(index: Sequence[Expr]) -> None:
        at = list(index)
        at[dim] = index[dim] * step + lo
        ops.store(target.name, indexer(at), load(index))

    _mutate(target, src.get_size(), body, "copy_")  # (the input mutation's write-back)
    return x


def _slice_scatter_select(x: TensorBox, src: TensorBox, dim: int, lo: Expr, length: Expr, step: int) -> TensorBox:
    size = x.get_size()
    load_x, load_src = x.make_loader(), src.make_loader()

    def inner_fn(index: Sequence[Expr]) -> Any:
        i = index[dim]
        at = ops.index_expr(i, torch.int64)
        mask = ops.logical_and(ops.ge(at, ops.index_expr(lo, torch.int64)),
                               ops.lt(at, ops.index_expr(lo + step * (length - 1) + 1, torch.int64)))
        local = list(index)
        local[dim] = i - lo
        if step != 1:  # (i + the multiple of step from lo on) - lo >= 0: no negative operand
            steps_to_lo = FloorDiv(lo + step - 1, step)
            shifted = i + step * steps_to_lo - lo
            mask = ops.logical_and(mask, ops.eq(ops.index_expr(ModularIndexing(shifted, 1, step), torch.int64),
                                                ops.index_expr(sympy.Integer(0), torch.int64)))
            local[dim] = FloorDiv(shifted, step) - steps_to_lo
        value = ops.masked(mask, lambda: load_src(local), 0)
        return ops.where(mask, value, load_x(index))

    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner_fn, list(size),
                                      origins=origins_of(x, src) | {"slice_scatter"},
                                      stride_order=common_layout_hint([x], len(size))))


@register_lowering(aten.diagonal_scatter)
def diagonal_scatter(x: TensorBox, src: TensorBox, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorBox:
    """``x`` with ``src`` written over its diagonal (``diagonal``'s view), as a pointwise select."""
    size = x.get_size()
    d1, d2 = _dim(dim1, len(size)), _dim(dim2, len(size))
    src = to_dtype(src, x.get_dtype())
    load_x, load_src = x.make_loader(), src.make_loader()
    rest = [d for d in range(len(size)) if d not in (d1, d2)]

    def inner_fn(index: Sequence[Expr]) -> Any:
        on = ops.eq(ops.index_expr(index[d2] - index[d1], torch.int64), ops.index_expr(sympy.Integer(offset), torch.int64))
        local = [index[d] for d in rest] + [index[d1] if offset >= 0 else index[d2]]
        value = ops.masked(on, lambda: load_src(local), 0)
        return ops.where(on, value, load_x(index))

    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner_fn, list(size),
                                      origins=origins_of(x, src) | {"diagonal_scatter"},
                                      stride_order=common_layout_hint([x], len(size))))
