"""``minductor.scan``: a loop whose body is a function, run by XLA when compiled.

The contract is ``torch._higher_order_ops.scan``'s (and ``torch_xla.experimental.scan``'s):
``fn(carry, x) -> (new_carry, y)``, carries and xs are pytrees of tensors, xs are sliced along
``dim``, ys are stacked along ``dim``; ``reverse=True`` walks from the end but keeps ys in
input order. Eagerly it is a plain Python loop (autograd records each step); under
``torch.compile(backend="minductor")`` it becomes the scan higher-order op, which minductor
lowers to one ``jax.lax.scan``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["scan"]


def scan(fn: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, *, dim: int = 0,
         reverse: bool = False) -> tuple[Any, Any]:
    """Run ``fn`` over slices of ``xs`` along ``dim``, threading ``carry``; returns ``(final_carry, ys)``."""
    if torch.compiler.is_compiling():
        from torch._higher_order_ops.scan import scan as scan_op

        return scan_op(fn, init, xs, dim=dim, reverse=reverse)
    return _eager_scan(fn, init, xs, dim, reverse)


def _eager_scan(fn: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, dim: int,
                reverse: bool) -> tuple[Any, Any]:
    leaves, spec = pytree.tree_flatten(xs)
    if not leaves:
        return init, []
    if not all(isinstance(x, torch.Tensor) for x in leaves):
        raise TypeError("minductor.scan: every leaf of xs must be a tensor")
    dim = dim % leaves[0].ndim
    length = leaves[0].shape[dim]
    if length == 0 or any(x.shape[dim] != length for x in leaves):
        raise ValueError(f"minductor.scan: xs leaves need the same non-zero size along dim {dim}, got "
                         f"{[tuple(x.shape) for x in leaves]}")
    carry = init
    steps: list[Any] = []
    order = range(length - 1, -1, -1) if reverse else range(length)
    for t in order:
        x = pytree.tree_unflatten([leaf.select(dim, t) for leaf in leaves], spec)
        carry, y = fn(carry, x)
        steps.append(y)
    if reverse:
        steps.reverse()
    y_leaves = [pytree.tree_flatten(y)[0] for y in steps]
    y_spec = pytree.tree_flatten(steps[0])[1]
    stacked = [torch.stack([step[i] for step in y_leaves], dim=dim if dim <= y_leaves[0][i].ndim else 0)
               for i in range(len(y_leaves[0]))]
    return carry, pytree.tree_unflatten(stacked, y_spec)
