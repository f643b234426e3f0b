"""The aten -> JAX table for scan bodies: each entry takes jax arrays (and aten's other args).

Only ops listed here run inside an XLA scan; a body with any other op makes the whole scan
fall back to aten, with a message naming the op. Results are cast to the dtype aten gives
(the translator adds ``.astype``), so JAX's promotion rules never leak into results.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten
prims = torch.ops.prims


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _lax() -> Any:
    import jax

    return jax.lax


def _dtype(dtype: torch.dtype | None) -> Any:
    from minductor.codegen.xla import jax_dtype

    return None if dtype is None else jax_dtype(dtype)


def _matmul(a: Any, b: Any) -> Any:
    jnp = _jnp()
    if a.dtype in (jnp.bfloat16, jnp.float16):  # accumulate in fp32 and round once, as aten does
        return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
    return jnp.matmul(a, b)


def _addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    out = _matmul(a, b)
    if alpha != 1:
        out = out * alpha
    return out + (bias if beta == 1 else bias * beta)


def _linear(x: Any, w: Any, b: Any = None) -> Any:
    out = _matmul(x, w.T)
    return out if b is None else out + b


def _add(a: Any, b: Any, *, alpha: Any = 1) -> Any:
    return a + (b if alpha == 1 else b * alpha)


def _sub(a: Any, b: Any, *, alpha: Any = 1) -> Any:
    return a - (b if alpha == 1 else b * alpha)


def _rsub(a: Any, b: Any, *, alpha: Any = 1) -> Any:
    return b - (a if alpha == 1 else a * alpha)


def _div(a: Any, b: Any, *, rounding_mode: str | None = None) -> Any:
    jnp = _jnp()
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    out = jnp.true_divide(a, b)
    return jnp.trunc(out) if rounding_mode == "trunc" else out


def _sigmoid(x: Any) -> Any:
    import jax

    return jax.nn.sigmoid(x)


def _shape(x: Any, size: Sequence[int]) -> tuple[int, ...]:
    size = list(size)
    known = 1
    for s in size:
        known *= s if s != -1 else 1
    return tuple(x.size // known if s == -1 else s for s in size)


def _expand(x: Any, size: Sequence[int], *, implicit: bool = False) -> Any:
    lead = len(size) - x.ndim
    target = [s if s != -1 else x.shape[i - lead] for i, s in enumerate(size)]
    return _jnp().broadcast_to(x, tuple(target))


def _slice_index(x: Any, dim: int, start: int | None, end: int | None, step: int) -> tuple[Any, ...]:
    index: list[Any] = [slice(None)] * x.ndim
    n = x.shape[dim]
    start = 0 if start is None else max(-n, min(start, n))
    end = n if end is None else max(-n, min(end, n))
    index[dim] = slice(start, end, step)
    return tuple(index)


def _slice(x: Any, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Any:
    return x[_slice_index(x, dim, start, end, step)]


def _slice_scatter(x: Any, src: Any, dim: int = 0, start: int | None = None, end: int | None = None,
                   step: int = 1) -> Any:
    return x.at[_slice_index(x, dim, start, end, step)].set(src)


def _select_scatter(x: Any, src: Any, dim: int, i: int) -> Any:
    index: list[Any] = [slice(None)] * x.ndim
    index[dim] = i
    return x.at[tuple(index)].set(src)


def _select(x: Any, dim: int, i: int) -> Any:
    return _jnp().take(x, i, axis=dim)


def _split(x: Any, size: int, dim: int = 0) -> list[Any]:
    n = x.shape[dim]
    return [_slice(x, dim, s, min(s + size, n)) for s in range(0, n, size)]


def _split_sizes(x: Any, sizes: Sequence[int], dim: int = 0) -> list[Any]:
    out, start = [], 0
    for s in sizes:
        out.append(_slice(x, dim, start, start + s))
        start += s
    return out


def _chunk(x: Any, chunks: int, dim: int = 0) -> list[Any]:
    return _split(x, -(-x.shape[dim] // chunks), dim)


def _squeeze(x: Any, dims: Any = None) -> Any:
    jnp = _jnp()
    if dims is None:
        return jnp.squeeze(x)
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = [d % max(x.ndim, 1) for d in dims if x.ndim and x.shape[d % x.ndim] == 1]
    return jnp.squeeze(x, tuple(dims)) if dims else x


def _reduce(fn_name: str) -> Callable[..., Any]:
    def reduce(x: Any, dims: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
        jnp = _jnp()
        axis = None if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) else \
            (tuple(dims) if isinstance(dims, (list, tuple)) else dims)
        if dtype is not None:
            x = x.astype(_dtype(dtype))
        return getattr(jnp, fn_name)(x, axis=axis, keepdims=keepdim)

    return reduce


def _full_like(x: Any, value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return _jnp().full(x.shape, value, dtype=_dtype(dtype) or x.dtype)


def _full(size: Sequence[int], value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return _jnp().full(tuple(size), value, dtype=_dtype(dtype or torch.get_default_dtype()))


def _to(x: Any, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return x if dtype is None else x.astype(_dtype(dtype))


def _where(c: Any, a: Any, b: Any) -> Any:
    return _jnp().where(c, a, b)


def _clamp(x: Any, lo: Any = None, hi: Any = None) -> Any:
    return _jnp().clip(x, lo, hi)


def _copy(dst: Any, src: Any, non_blocking: bool = False) -> Any:
    return _jnp().broadcast_to(src, dst.shape).astype(dst.dtype)


def _unary(name: str) -> Callable[..., Any]:
    return lambda x: getattr(_jnp(), name)(x)


def _binary(name: str) -> Callable[..., Any]:
    return lambda a, b: getattr(_jnp(), name)(a, b)


def _identity(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


def _table() -> dict[Any, Callable[..., Any]]:
    jnp_unary = {"exp": aten.exp, "log": aten.log, "sqrt": aten.sqrt, "tanh": aten.tanh, "abs": aten.abs,
                 "sin": aten.sin, "cos": aten.cos, "reciprocal": aten.reciprocal, "negative": aten.neg,
                 "floor": aten.floor, "ceil": aten.ceil, "log1p": aten.log1p, "expm1": aten.expm1,
                 "logical_not": aten.logical_not, "sign": aten.sign, "square": aten.square}
    jnp_binary = {"maximum": aten.maximum, "minimum": aten.minimum, "power": aten.pow, "equal": aten.eq,
                  "not_equal": aten.ne, "less": aten.lt, "less_equal": aten.le, "greater": aten.gt,
                  "greater_equal": aten.ge, "logical_and": aten.logical_and, "logical_or": aten.logical_or,
                  "remainder": aten.remainder, "bitwise_and": aten.bitwise_and, "bitwise_or": aten.bitwise_or}
    table: dict[Any, Callable[..., Any]] = {}
    for name, packet in jnp_unary.items():
        table[packet] = _unary(name)
    for name, packet in jnp_binary.items():
        table[packet] = _binary(name)
    table.update({
        aten.mm: _matmul, aten.bmm: _matmul, aten.matmul: _matmul, aten.addmm: _addmm, aten.linear: _linear,
        aten.add: _add, aten.sub: _sub, aten.rsub: _rsub, aten.mul: operator.mul, aten.div: _div,
        aten.sigmoid: _sigmoid, aten.relu: lambda x: _jnp().maximum(x, 0),
        aten.rsqrt: lambda x: _lax().rsqrt(x), aten.erf: lambda x: _lax().erf(x),
        aten.tanh_backward: lambda g, y: g * (1 - y * y),
        aten.sigmoid_backward: lambda g, y: g * (y * (1 - y)),
        aten.threshold_backward: lambda g, x, t: _jnp().where(x <= t, 0, g),
        aten.where: _where, aten.clamp: _clamp, aten.clamp_min: lambda x, lo: _jnp().maximum(x, lo),
        aten.clamp_max: lambda x, hi: _jnp().minimum(x, hi),
        aten.masked_fill: lambda x, m, v: _jnp().where(m, v, x),
        aten.view: lambda x, size: x.reshape(_shape(x, size)), aten._unsafe_view: lambda x, size: x.reshape(
            _shape(x, size)), aten.reshape: lambda x, size: x.reshape(_shape(x, size)),
        aten.view_copy: lambda x, size: x.reshape(_shape(x, size)),
        aten.permute: lambda x, dims: _jnp().transpose(x, dims), aten.permute_copy: lambda x, dims: _jnp().transpose(
            x, dims), aten.t: lambda x: x.T, aten.t_copy: lambda x: x.T,
        aten.transpose: lambda x, a, b: _jnp().swapaxes(x, a, b), aten.transpose_copy: lambda x, a, b: _jnp().swapaxes(
            x, a, b),
        aten.expand: _expand, aten.expand_copy: _expand,
        aten.unsqueeze: lambda x, d: _jnp().expand_dims(x, d % (x.ndim + 1)),
        aten.unsqueeze_copy: lambda x, d: _jnp().expand_dims(x, d % (x.ndim + 1)),
        aten.squeeze: _squeeze, aten.squeeze_copy: _squeeze,
        aten.slice: _slice, aten.slice_copy: _slice, aten.select: _select, aten.select_copy: _select,
        aten.slice_scatter: _slice_scatter, aten.select_scatter: _select_scatter,
        aten.narrow: lambda x, d, s, n: _slice(x, d, s, s + n),
        aten.split: _split, aten.split_copy: _split, aten.split_with_sizes: _split_sizes,
        aten.split_with_sizes_copy: _split_sizes, aten.chunk: _chunk,
        aten.cat: lambda xs, dim=0: _jnp().concatenate(xs, axis=dim),
        aten.stack: lambda xs, dim=0: _jnp().stack(xs, axis=dim),
        aten.sum: _reduce("sum"), aten.mean: _reduce("mean"), aten.amax: _reduce("max"), aten.amin: _reduce("min"),
        aten.prod: _reduce("prod"),
        aten.clone: _identity, aten.detach: _identity, aten.detach_copy: _identity, aten.alias: _identity,
        aten.alias_copy: _identity, aten.lift_fresh_copy: _identity, aten.contiguous: _identity,
        aten._to_copy: _to, prims.convert_element_type: _to, aten.copy: _copy,
        aten.zeros_like: lambda x, **kw: _full_like(x, 0, **kw), aten.ones_like: lambda x, **kw: _full_like(x, 1, **kw),
        aten.full_like: _full_like, aten.full: _full, aten.zeros: lambda size, **kw: _full(size, 0, **kw),
        aten.ones: lambda size, **kw: _full(size, 1, **kw),
        aten.scalar_tensor: lambda v, **kw: _full((), v, **kw), aten.fill: lambda x, v: _full_like(x, v),
        aten.new_zeros: lambda x, size, **kw: _full(size, 0, dtype=kw.pop("dtype", None) or _torch_dtype(x)),
    })
    return table


def _torch_dtype(x: Any) -> torch.dtype:
    return {str(v).removeprefix("torch."): v for v in (torch.float32, torch.float64, torch.bfloat16,
                                                         torch.float16, torch.int64, torch.int32)}[str(x.dtype)]


_TABLE: dict[Any, Callable[..., Any]] | None = None


def jax_op(target: Any) -> Callable[..., Any] | None:
    """The JAX implementation of an aten overload (looked up by its packet), or None."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    if target is operator.getitem:
        return operator.getitem
    packet = getattr(target, "overloadpacket", target)
    return _TABLE.get(packet)


__all__ = ["jax_op"]
