"""Indirect reads: advanced indexing, gather, index_select, embedding, max embedding bags; and copies that
read their source through an index remap: flip, repeat, the ``*_copy`` views.

Each is a Pointwise whose body loads an index tensor, turns the value into an index
symbol with ``ops.indirect_indexing`` and loads the source there, so it fuses with what
consumes it. Out-of-range indices make the wrapper raise IndexError like eager; negative
indices wrap for advanced indexing and are out of range for gather, index_select and
embedding, as in eager.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from minductor.ir.indexing import FloorDiv, ModularIndexing, make_vars, value_range
from minductor.ir.nodes import Pointwise, TensorBox
from minductor.ir.ops import DefaultHandler, ops
from minductor.lowering.pointwise import clone
from minductor.lowering.registry import (
    common_layout_hint,
    Unsupported,
    aten,
    broadcast_shapes,
    expand_to,
    is_tensor,
    origins_of,
    realize_if_gathered,
    register_lowering,
)
from minductor.lowering.views import permute, slice_, unbind, view

Expr = sympy.Expr


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _pointwise(x: TensorBox, size: Sequence[Expr], inner_fn: Any, origin: str, *inputs: Any) -> TensorBox:
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner_fn, list(size),
                                      origins=origins_of(x, *inputs) | {origin}))


INDEX_DTYPES = (torch.int64, torch.int32)


def check_index_dtype(op: str, *indices: Any) -> None:
    """Index tensors must be int64/int32; any other dtype goes to aten, which raises eager's
    own error for it (the same type and message)."""
    for i in indices:
        if is_tensor(i) and i.get_dtype() not in INDEX_DTYPES:
            raise Unsupported(f"{op} with a {i.get_dtype()} index tensor (aten raises eager's error)")


class _NotAffine(Exception):
    pass


class _AffineValues(DefaultHandler):
    """Evaluates an integer tensor's body as a SymPy expression of its index (aranges, sums,
    products with constants, broadcasts). Float steps are followed while exact: a float32
    value must be a dyadic rational of at most 24 significant bits over the whole range
    (``arange(64.).mul(0.5).long()``: upsample-nearest's source rows are ``x // 2``), and a
    float-to-integer conversion of a non-negative value truncates. Any other op, a load above
    all, raises."""

    def __init__(self, ranges: dict[sympy.Symbol, Expr]) -> None:
        self.ranges = ranges

    def _default(self, name: str, args: tuple[Any, ...]) -> Any:
        raise _NotAffine(name)

    def _exact(self, value: Expr, dtype: torch.dtype) -> Expr:
        if dtype in INDEX_DTYPES:
            return value
        bits = {torch.float32: 24, torch.float64: 53}.get(dtype)
        if bits is None:
            raise _NotAffine(str(dtype))
        value = sympy.expand(value)
        den = sympy.ilcm(*[sympy.Rational(c).q for c in value.as_coefficients_dict().values()], 1)
        lo, hi = value_range(value * den, self.ranges)
        if lo is None or hi is None or den & (den - 1) or max(abs(lo), abs(hi)) >= 1 << bits:
            raise _NotAffine("inexact float")
        return value

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> Expr:
        return self._exact(expr, dtype)

    def constant(self, value: Any, dtype: torch.dtype) -> Expr:
        if isinstance(value, bool) or (dtype in INDEX_DTYPES and int(value) != value):
            raise _NotAffine("constant")
        exact = sympy.Rational(float(torch.tensor(value, dtype=dtype))) if dtype.is_floating_point else sympy.Integer(int(value))
        return self._exact(exact, dtype)

    def to_dtype(self, x: Expr, dtype: torch.dtype, *args: Any) -> Expr:
        if dtype not in INDEX_DTYPES:
            return self._exact(x, dtype)
        coeffs = sympy.expand(x).as_coefficients_dict().values()
        den = sympy.ilcm(*[sympy.Rational(c).q for c in coeffs], 1)
        if den == 1:
            return x
        lo, _ = value_range(x, self.ranges)
        if lo is None or lo < 0:
            raise _NotAffine("truncation of a negative value")
        return FloorDiv(sympy.expand(x * den), sympy.Integer(den))

    def _float(self, value: Expr) -> Expr:
        """A sum or product, in whichever dtype: float32's bound, the strictest (indices of
        16M and more go the indirect way)."""
        return self._exact(value, torch.float32)

    def add(self, a: Expr, b: Expr) -> Expr:
        return self._float(a + b)

    def sub(self, a: Expr, b: Expr) -> Expr:
        return self._float(a - b)

    def mul(self, a: Expr, b: Expr) -> Expr:
        return self._float(a * b)

    def neg(self, a: Expr) -> Expr:
        return -a


def static_positions(loader: Any, shape: Sequence[Expr], size: Expr, wrap: bool) -> Any:
    """An index tensor computed from its own index (``arange(0, 56)[:, None] + arange(3)``, as
    im2col's decomposition builds them; upsample-nearest's), whose every value is in range: a
    function of the index giving the position as an expression, else None. The read is then a
    direct one (vectorized, no bounds check) instead of an indirect one."""
    from minductor.virtualized import V

    if not all(sympy.sympify(s).is_Integer for s in [*shape, size]):
        return None
    syms = make_vars("mi_ix", len(shape))
    ranges = dict(zip(syms, shape))
    try:
        with V.set_ops(_AffineValues(ranges)):
            expr = loader(list(syms))
    except (_NotAffine, TypeError, ValueError):
        return None
    if not isinstance(expr, sympy.Expr) or not expr.is_integer and not all(
            sympy.Rational(c).q == 1 for c in sympy.expand(expr).as_coefficients_dict().values()):
        return None
    lo, hi = value_range(expr, ranges)
    if lo is None or hi is None or not (lo.is_Integer and hi.is_Integer):
        return None
    if wrap and lo >= -size and hi < 0:
        expr += size
    elif lo < 0 or hi >= size:
        return None
    return lambda idx: expr.xreplace(dict(zip(syms, idx)))


@register_lowering(aten.index.Tensor)
def index(x: TensorBox, indices: Sequence[Any]) -> TensorBox:
    if any(is_tensor(i) and i.get_dtype() in (torch.bool, torch.uint8) for i in indices):
        raise Unsupported("boolean-mask indexing (data-dependent shape)")
    check_index_dtype("index", *indices)
    size = x.get_size()
    ndim = len(size)
    indexed = [d for d, i in enumerate(indices) if i is not None]
    if not indexed:
        raise Unsupported("index without index tensors")
    index_shape = broadcast_shapes(*[indices[d].get_size() for d in indexed])
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    rest = [d for d in range(ndim) if d not in indexed]
    before = [d for d in rest if d < indexed[0]] if adjacent else []
    after = [d for d in rest if d not in before]
    out_size = [size[d] for d in before] + list(index_shape) + [size[d] for d in after]
    loaders = {d: expand_to(indices[d], index_shape).make_loader() for d in indexed}
    positions = {d: static_positions(loaders[d], index_shape, size[d], wrap=True) for d in indexed}
    if any(p is None for p in positions.values()):  # (a gather, not a static pick)
        realize_if_gathered(x, out_size)
    load = x.make_loader()
    n_before, n_index = len(before), len(index_shape)

    def inner_fn(idx: Sequence[Expr]) -> Any:
        ipart = list(idx[n_before:n_before + n_index])
        full: list[Expr] = [sympy.Integer(0)] * ndim
        for d, v in zip(before, idx[:n_before]):
            full[d] = v
        for d, v in zip(after, idx[n_before + n_index:]):
            full[d] = v
        for d in indexed:
            at = positions[d]
            full[d] = at(ipart) if at is not None else ops.indirect_indexing(loaders[d](ipart), size[d])
        return load(full)

    return _pointwise(x, out_size, inner_fn, "index", *[indices[d] for d in indexed])


@register_lowering(aten.gather)
def gather(x: TensorBox, dim: int, index: TensorBox, sparse_grad: bool = False) -> TensorBox:
    check_index_dtype("gather", index)
    size = x.get_size()
    if len(size) == 0:
        raise Unsupported("gather from a 0-d tensor")
    dim = _dim(dim, len(size))
    realize_if_gathered(x, index.get_size())
    index_load, load = index.make_loader(), x.make_loader()

    def inner_fn(idx: Sequence[Expr]) -> Any:
        full = list(idx)
        full[dim] = ops.indirect_indexing(index_load(idx), size[dim], wrap=False)  # eager rejects negatives
        return load(full)

    return _pointwise(x, index.get_size(), inner_fn, "gather", index)


@register_lowering(aten.index_select)
def index_select(x: TensorBox, dim: int, index: TensorBox) -> TensorBox:
    check_index_dtype("index_select", index)
    size = list(x.get_size())
    if len(index.get_size()) > 1:
        raise Unsupported("index_select with a multi-dim index (eager raises)")
    if len(size) == 0:  # a scalar source and a one-element index (which must be 0): a scalar
            return view(index_select(view(x, [1]), 0, index), [])
    dim = _dim(dim, len(size))
    out_size = size[:dim] + [index.get_numel()] + size[dim + 1:]
    realize_if_gathered(x, out_size)
    index_load, load = index.make_loader(), x.make_loader()

    def inner_fn(idx: Sequence[Expr]) -> Any:
        full = list(idx)
        position = [idx[dim]] if len(index.get_size()) == 1 else []
        full[dim] = ops.indirect_indexing(index_load(position), size[dim], wrap=False)
        return load(full)

    return _pointwise(x, out_size, inner_fn, "index_select", index)


@register_lowering(aten.embedding)
def embedding(weight: TensorBox, indices: TensorBox, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> TensorBox:
    check_index_dtype("embedding", indices)
    if len(weight.get_size()) != 2:
        raise Unsupported("embedding with a non-2-d weight")
    rows, dim = weight.get_size()
    index_load, load = indices.make_loader(), weight.make_loader()
    n = len(indices.get_size())

    def inner_fn(idx: Sequence[Expr]) -> Any:
        row = ops.indirect_indexing(index_load(list(idx[:n])), rows, wrap=False)
        return load([row, idx[n]])

    return _pointwise(weight, list(indices.get_size()) + [dim], inner_fn, "embedding", indices)


@register_lowering(aten._embedding_bag_forward_only)
def embedding_bag(weight: TensorBox, indices: TensorBox, offsets: TensorBox, scale_grad_by_freq: bool = False,
                  mode: int = 0, sparse: bool = False, per_sample_weights: Any = None,
                  include_last_offset: bool = False, padding_idx: int = -1) -> tuple[TensorBox, ...]:
    """Max bags of one size L (``F.embedding_bag(x2d, w, mode="max")``, whose offsets are an
    arange of step L in the graph): a reduction over each bag's L gathered rows, fused, the
    rows' index read and checked once per row (out-of-range indices raise like eager). 512
    bags of 16 rows of 256: 0.11 ms against aten's 5.8. Sum and mean bags stay aten's
    (64 and 97 us there, ours 116 and 120), as do bags of other sizes (offsets from the
    caller), padding indices and a graph that reads the op's other outputs (offset2bag, bag
    sizes, argmax)."""
    from minductor.lowering.reduction import amax
    from minductor.virtualized import V

    check_index_dtype("embedding_bag", indices, offsets)
    node = V.graph.current_node
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        raise Unsupported("embedding_bag whose offset2bag, bag sizes or argmax the graph reads")
    if padding_idx not in (-1, None) or mode != 2 or per_sample_weights is not None or len(weight.get_size()) != 2 \
            or len(indices.get_size()) != 1:
        raise Unsupported("embedding_bag of sums or means, or with padding_idx (aten's kernel)")
    n, bags = indices.get_size()[0], offsets.get_size()[0] - (1 if include_last_offset else 0)
    start = static_positions(offsets.make_loader(), offsets.get_size(), n + 1, wrap=False)
    bag = make_vars("mi_bag", 1)[0]
    step = sympy.expand(start([bag]) if start is not None else sympy.nan)
    length = step.coeff(bag) if start is not None else None
    if not (sympy.sympify(bags).is_Integer and sympy.sympify(n).is_Integer and length is not None
            and length.is_Integer and step == length * bag and length * bags == n and int(length) > 0):
        raise Unsupported("embedding_bag with bags of different sizes (offsets from the caller)")
    rows, dim = weight.get_size()
    index_load, load = indices.make_loader(), weight.make_loader()

    def inner_fn(idx: Sequence[Expr]) -> Any:
        return load([ops.indirect_indexing(index_load([idx[0] * length + idx[1]]), rows, wrap=False), idx[2]])

    out = amax(_pointwise(weight, [bags, length, dim], inner_fn, "embedding_bag", indices), [1])
    unused = [_pointwise(indices, list(v.shape), lambda idx: ops.constant(0, torch.int64), "embedding_bag")
              for v in node.meta["val"][1:]]
    return (out, *unused)


@register_lowering(aten.flip)
def flip(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    """A copy read backwards along ``dims`` (not a view: strides cannot be negative)."""
    size = x.get_size()
    flipped = {_dim(d, len(size)) for d in dims}
    load = x.make_loader()

    def inner_fn(idx: Sequence[Expr]) -> Any:
        return load([size[d] - 1 - i if d in flipped else i for d, i in enumerate(idx)])

    return _pointwise(x, size, inner_fn, "flip")


@register_lowering(aten.roll)
def roll(x: TensorBox, shifts: Any, dims: Any = ()) -> TensorBox:
    """``x`` shifted cyclically along ``dims``: element ``i`` of a rolled dim of size ``n`` reads
    ``i - s + n`` below the shift ``s`` and ``i - s`` from it on. Along the innermost dim that is a
    select of two masked loads whose test the C++ kernel cuts into two plain loops of contiguous
    reads (``cpp_interior``); along an outer dim, one load at ``(i + n - s) mod n``, computed once
    an outer iteration (a select there would compute both sides of every element: HF Swin's
    roll of its layer norm's output over (H, W) normalized four rows an element: 73 -> 8 us).
    Decomposed, it read through a table of ``(i - s) mod n``: a Swin block's (8, 56, 56, 128)
    roll by (-3, -3) took 143 us (TorchInductor 136), a 1024^2 roll by 3 78 us (eager 59)."""
    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    size = x.get_size()
    if not dims:  # the flattened tensor rolled, then shaped back
        if len(shifts) != 1:
            raise Unsupported("roll without dims takes one shift (aten raises eager's error)")
        return view(roll(view(x, [x.get_numel()]), shifts, [0]), size)
    if len(shifts) != len(dims) or not all(isinstance(s, (int, sympy.Expr)) for s in shifts):
        raise Unsupported("roll: as many shifts as dims (aten raises eager's error)")
    total: dict[int, Any] = {}
    for shift, d in zip(shifts, dims):  # (a dim named twice rolls by the sum)
        d = _dim(d, len(size))
        total[d] = total.get(d, 0) + shift
    rolled = [(d, _shift_within(s, size[d])) for d, s in sorted(total.items()) if size[d] != 0]
    rolled = [(d, s) for d, s in rolled if s != 0]
    order = common_layout_hint([x], len(size))
    innermost = order[-1] if order is not None else len(size) - 1
    load = x.make_loader()

    def pick(index: Sequence[Expr], at: list[Expr], k: int) -> Any:
        if k == len(rolled):
            return load(at)
        d, s = rolled[k]
        if d != innermost:  # a wrap per outer iteration: one load through the modular index
            at = list(at)
            at[d] = ModularIndexing(index[d] + size[d] - s, 1, size[d])
            return pick(index, at, k + 1)
        wraps = ops.lt(ops.index_expr(index[d], torch.int64), ops.index_expr(s, torch.int64))
        low, high = list(at), list(at)
        low[d], high[d] = index[d] - s + size[d], index[d] - s
        return ops.where(wraps, ops.masked(wraps, lambda: pick(index, low, k + 1), 0),
                         ops.masked(ops.logical_not(wraps), lambda: pick(index, high, k + 1), 0))

    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), lambda index: pick(index, list(index), 0),
                                      list(size), origins=origins_of(x) | {"roll"},
                                      stride_order=common_layout_hint([x], len(size))))


def _shift_within(shift: Any, n: Expr) -> Expr:
    """``shift`` taken into ``[0, n]`` (``n`` rolls as 0 does) for a dim of ``n`` elements, also
    symbolic ones. The printer knows ``ModularIndexing`` of a nonnegative value only (C's ``%``
    keeps the sign), so a shift is taken modulo ``n`` by its sign, which must hold at every size:
    the backward of ``fftshift`` rolls by ``-(s0 // 2)``. A shift of either sign goes to aten."""
    shift = sympy.sympify(shift)
    if shift.is_number and n.is_number:
        return sympy.Integer(int(shift) % int(n))
    from minductor.virtualized import V

    never_negative = V.graph.sizevars.provably_nonnegative
    if never_negative(shift):
        return ModularIndexing(shift, 1, n)
    if never_negative(-shift):
        return n - ModularIndexing(-shift, 1, n)
    raise Unsupported(f"roll by {shift}, negative at some sizes and not at others")


@register_lowering(aten.repeat)
def repeat(x: TensorBox, repeats: Sequence[int]) -> TensorBox:
    """Tiles of ``x``: output index ``i`` of a tiled dim reads ``i mod size``."""
    size = x.get_size()
    lead = len(repeats) - len(size)
    if lead < 0:
        raise Unsupported("repeat with fewer repeats than dims (eager raises)")
    repeats = [sympy.sympify(r) for r in repeats]  # (symbolic under dynamic shapes)
    out_size = list(repeats[:lead]) + [s * r for s, r in zip(size, repeats[lead:])]
    load = x.make_loader()

    def inner_fn(idx: Sequence[Expr]) -> Any:
        src = idx[lead:]
        return load([ModularIndexing(i, 1, s) if r != 1 else i for i, s, r in zip(src, size, repeats[lead:])])

    return _pointwise(x, out_size, inner_fn, "repeat")


@register_lowering(aten.narrow_copy)
def narrow_copy(x: TensorBox, dim: int, start: Any, length: Any) -> TensorBox:
    start = start + x.get_size()[_dim(dim, len(x.get_size()))] if isinstance(start, int) and start < 0 else start
    return clone(slice_(x, dim, start, start + length))


@register_lowering(aten.view_copy)
def view_copy(x: TensorBox, size: Sequence[Any]) -> TensorBox:
    return clone(view(x, size))


@register_lowering(aten.permute_copy)
def permute_copy(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    return clone(permute(x, dims))


@register_lowering(aten.unbind_copy)
def unbind_copy(x: TensorBox, dim: int = 0) -> list[TensorBox]:
    return [clone(t) for t in unbind(x, dim)]
