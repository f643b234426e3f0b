"""Buffer layouts: where each element of a tensor lives in its storage.

``FixedLayout`` is final (inputs, extern outputs, anything whose strides were observed).
``FlexibleLayout`` is what the compiler picked for an intermediate and may still change
until it is frozen; it starts contiguous.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import sympy
import torch

from minductor.sizevars import to_expr

Expr = sympy.Expr


def contiguous_strides(size: Sequence[Expr]) -> list[Expr]:
    strides: list[Expr] = []
    acc: Expr = sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        acc = acc * sympy.Max(s, 1) if not sympy.sympify(s).is_Integer else acc * max(int(s), 1)
    return list(reversed(strides))


def strides_in_order(size: Sequence[Expr], order: Sequence[int]) -> list[Expr]:
    """Dense strides laying dims out in ``order`` (outermost first, innermost last): the
    order ``(0, 2, 3, 1)`` of a 4-D size gives channels-last (NHWC) strides."""
    strides: list[Expr] = [sympy.Integer(0)] * len(size)
    acc: Expr = sympy.Integer(1)
    for dim in reversed(order):
        strides[dim] = acc
        s = sympy.sympify(size[dim])
        acc = acc * (max(int(s), 1) if s.is_Integer else sympy.Max(s, 1))
    return strides


def channels_last_order(rank: int) -> tuple[int, ...] | None:
    """The dim order of channels-last memory for a 4-D (NHWC) or 5-D (NDHWC) tensor."""
    return (0, *range(2, rank), 1) if rank in (4, 5) else None


def is_channels_last(layout: FixedLayout) -> bool:
    order = channels_last_order(len(layout.size))
    return order is not None and tuple(layout.stride) == tuple(strides_in_order(layout.size, order)) \
        and not layout.is_contiguous()


def as_exprs(values: Sequence[int | Expr | torch.SymInt]) -> list[Expr]:
    """Sizes or strides as SymPy (a SymInt's expression with minductor's index functions: a
    symbolic contiguous stride holds torch's ``Max(1, s0)``, which the printers do not know)."""
    return [to_expr(v) if isinstance(v, torch.SymInt) else sympy.sympify(v) for v in values]


@dataclasses.dataclass(frozen=True, slots=True)
class FixedLayout:
    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = sympy.Integer(0)  # noqa: RUF009

    def make_indexer(self) -> Callable[[Sequence[Expr]], Expr]:
        """Map a full index (one entry per dim) to a flat storage offset."""
        size, stride, offset = self.size, self.stride, self.offset

        def indexer(index: Sequence[Expr]) -> Expr:
            assert len(index) == len(size), (index, size)
            expr = offset
            for i, s, st in zip(index, size, stride):
                if s != 1:
                    expr = expr + i * st
            return expr

        return indexer

    def storage_numel(self) -> Expr:
        """Elements of storage the layout touches (offset included)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + sum(((s - 1) * st for s, st in zip(self.size, self.stride)), sympy.Integer(0)) + 1

    def is_contiguous(self) -> bool:
        return all(
            s == 1 or st == c for s, st, c in zip(self.size, self.stride, contiguous_strides(self.size))
        )

    def numel(self) -> Expr:
        return sympy.Mul(*self.size) if self.size else sympy.Integer(1)

    def __str__(self) -> str:
        sz = ", ".join(map(str, self.size))
        st = ", ".join(map(str, self.stride))
        off = f", offset={self.offset}" if self.offset != 0 else ""
        return f"{type(self).__name__}({self.device.type}, {self.dtype}, size=[{sz}], stride=[{st}]{off})"


@dataclasses.dataclass(frozen=True, slots=True)
class FlexibleLayout(FixedLayout):
    """A layout the compiler chose (contiguous) and may re-decide until frozen."""

    @staticmethod
    def contiguous(device: torch.device, dtype: torch.dtype, size: Sequence[Expr]) -> FlexibleLayout:
        size = tuple(as_exprs(size))
        return FlexibleLayout(device, dtype, size, tuple(contiguous_strides(size)))

    @staticmethod
    def in_order(device: torch.device, dtype: torch.dtype, size: Sequence[Expr], order: Sequence[int]) -> FlexibleLayout:
        size = tuple(as_exprs(size))
        return FlexibleLayout(device, dtype, size, tuple(strides_in_order(size, order)))

    def freeze(self) -> FixedLayout:
        return FixedLayout(self.device, self.dtype, self.size, self.stride, self.offset)

    def with_stride(self, stride: Sequence[Expr]) -> FlexibleLayout:
        return FlexibleLayout(self.device, self.dtype, self.size, tuple(as_exprs(stride)), self.offset)
