"""Lazy views: index remaps over a storage, folded to zero-copy ``ReinterpretView`` when
the storage is realized and the remap is affine (plain strides)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from minductor.ir.indexing import affine_coeffs, make_vars, simplify_index
from minductor.ir.layout import FixedLayout, as_exprs
from minductor.ir.nodes import Buffer, IRNode, Loader, Pointwise, StorageBox, TensorBox
from minductor.ir.ops import ops

Expr = sympy.Expr
Reindex = Callable[[Sequence[Expr]], Sequence[Expr]]


@dataclasses.dataclass(eq=False)
class ReinterpretView(IRNode):
    """A strided alias of a realized buffer: no copy, just another layout."""

    data: Buffer
    layout: FixedLayout

    @property
    def base(self) -> Buffer:
        return self.data

    def get_size(self) -> list[Expr]:
        return list(self.layout.size)

    def get_stride(self) -> list[Expr]:
        return list(self.layout.stride)

    def get_dtype(self) -> torch.dtype:
        return self.layout.dtype

    def get_device(self) -> torch.device:
        return self.layout.device

    def is_realized(self) -> bool:
        return True

    def make_loader(self) -> Loader:
        indexer = self.layout.make_indexer()
        name = self.data.name

        def loader(index: Sequence[Expr]) -> Any:
            return ops.load(name, indexer(index))

        return loader

    def __str__(self) -> str:
        return f"ReinterpretView({self.data.name}, {self.layout})"


@dataclasses.dataclass(eq=False)
class View(IRNode):
    """``loader(index) = base_loader(reindex(index))`` over an unrealized storage."""

    base: IRNode  # StorageBox or ReinterpretView
    size: list[Expr]
    reindex: Reindex

    def get_size(self) -> list[Expr]:
        return self.size

    def get_dtype(self) -> torch.dtype:
        return self.base.get_dtype()

    def get_device(self) -> torch.device:
        return self.base.get_device()

    @property
    def origins(self) -> frozenset[str]:  # type: ignore[override]
        return self.base.origins

    def make_loader(self) -> Loader:
        inner = self.base.make_loader()
        reindex = self.reindex

        def loader(index: Sequence[Expr]) -> Any:
            return inner(reindex(index))

        return loader

    def __str__(self) -> str:
        return f"View({self.base}, size={self.size})"


def _unwrap(x: IRNode) -> tuple[IRNode, Reindex]:
    """Innermost base (StorageBox or ReinterpretView) and the index map onto it."""
    if isinstance(x, TensorBox):
        x = x.data
    if isinstance(x, View):
        return x.base, x.reindex
    return x, lambda idx: idx


def _storage_indexer(base: IRNode) -> tuple[Buffer, Callable[[Sequence[Expr]], Expr]] | None:
    if isinstance(base, ReinterpretView):
        return base.data, base.layout.make_indexer()
    if isinstance(base, StorageBox) and base.is_realized():
        buf = base.data
        assert isinstance(buf, Buffer)
        return buf, buf.layout.make_indexer()
    return None


def try_fold_to_strides(base: IRNode, size: Sequence[Expr], reindex: Reindex, freeze: bool) -> ReinterpretView | None:
    """A ReinterpretView of ``base`` remapped by ``reindex``, if that remap is strided."""
    found = _storage_indexer(base)
    if found is None:
        return None
    buf, indexer = found
    variables = make_vars("v", len(size))
    ranges = {v: s for v, s in zip(variables, size)}
    index = [v if s != 1 else sympy.Integer(0) for v, s in zip(variables, size)]
    expr = simplify_index(indexer(list(reindex(index))), ranges)
    coeffs = affine_coeffs(expr, variables)
    if coeffs is None:
        return None
    offset = expr.subs({v: 0 for v in variables})
    if offset.free_symbols & set(variables) or (offset.is_number and offset < 0):
        return None
    stride = [coeffs[v] if s != 1 else _unit_stride(coeffs, variables, size, i) for i, (v, s) in enumerate(zip(variables, size))]
    buf.freeze_layout()
    layout = FixedLayout(buf.get_device(), buf.get_dtype(), tuple(as_exprs(size)), tuple(stride), offset)
    return ReinterpretView(buf, layout)


def _unit_stride(coeffs: dict, variables: list, size: Sequence[Expr], i: int) -> Expr:
    """Stride reported for a size-1 dim: that of the next non-trivial inner dim times its size."""
    for j in range(i + 1, len(size)):
        if size[j] != 1:
            return coeffs[variables[j]] * size[j]
    return sympy.Integer(1)


def make_view(x: TensorBox, size: Sequence[Expr], reindex: Reindex) -> TensorBox:
    """A view of ``x`` with ``size``; index ``i`` of the view reads ``reindex(i)`` of ``x``."""
    size = as_exprs(size)
    base, inner = _unwrap(x)

    def composed(index: Sequence[Expr]) -> Sequence[Expr]:
        return inner(reindex(index))

    folded = try_fold_to_strides(base, size, composed, freeze=True)
    if folded is not None:
        return TensorBox(folded)
    return TensorBox(View(base, list(size), composed))


def realize_input(x: IRNode) -> Buffer | ReinterpretView:
    """The value as something with strides (for extern calls and graph outputs):
    a realized buffer, a strided alias of one, or, failing both, a contiguous copy."""
    if isinstance(x, TensorBox):
        x = x.data
    if isinstance(x, StorageBox):
        buf = x.realize()
        buf.freeze_layout()
        return buf
    if isinstance(x, ReinterpretView):
        return x
    if isinstance(x, Buffer):
        return x
    assert isinstance(x, View), x
    if isinstance(x.base, StorageBox):
        x.base.realize()
    folded = try_fold_to_strides(x.base, x.size, x.reindex, freeze=True)
    if folded is not None:
        return folded
    return contiguous_copy(x, x.origins)


def contiguous_copy(x: IRNode, origins: frozenset[str]) -> Buffer:
    """A contiguous buffer holding ``x``'s values, written by a pointwise copy kernel."""
    copy = StorageBox(Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), list(x.get_size()), origins=origins))
    buf = copy.realize()
    buf.freeze_layout()
    return buf
