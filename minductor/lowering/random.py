"""Random tensors computed in the kernels that read them.

``aten.rand`` and ``aten.randn`` (and their ``_like`` forms; dropout and bernoulli decompose
into them) are pointwise nodes whose element ``i`` is ``ops.rand(seed, stream + i)``: a
counter-based generator (``minductor_random.h``: Threefry-2x32-20), so the node fuses like
any other (a dropout is one pass over its input, writing the output and the mask), and any
kernel recomputing an element gets the same number. They were aten calls: eager's CPU rand
fills 4M floats in 8 ms, one thread (dropout 23 ms in all).

Each call of a graph draws one seed per device from torch's generator (a ``randint`` before
the kernels), so ``torch.manual_seed`` repeats a compiled run and two calls differ; each
random node of the graph takes its own stream (its own key: the seed plus a multiple of the
node's number), counted by the element's index. The numbers
are not eager's (nor TorchInductor's): another generator, the same distribution.
``config.fallback_random`` keeps eager's (aten calls, and dropout undecomposed); float64
results and explicit generators stay aten's too.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from minductor import config
from minductor.ir.nodes import FallbackKernel, Pointwise, TensorBox
from minductor.ir.ops import ops
from minductor.lowering.constructors import _check_layout, _device, like_device
from minductor.lowering.extern import layout_of
from minductor.lowering.registry import Unsupported, register_lowering
from minductor.virtualized import V

aten = torch.ops.aten

# each random node of a graph keys its stream with the seed (below 2**62) plus its number times
# this, modulo 2**62 (odd: distinct keys for 2**62 nodes)
_STREAM_KEY_STEP = 0x1E3779B97F4A7C15
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _seed(device: torch.device) -> Callable[[Sequence[Any]], Any]:
    """The loader of this graph call's seed for ``device`` (a 0-d int64 drawn by aten)."""
    seeds = V.graph.random_seeds
    if device not in seeds:
        example = torch.empty((), dtype=torch.int64, device=device)
        node = FallbackKernel(name="", layout=layout_of(example), op=aten.randint.low,  # type: ignore[arg-type]
                              args=(0, 1 << 62, []), kwargs={"dtype": torch.int64, "device": device})
        V.graph.register_buffer(node)
        seeds[device] = TensorBox.create(node).make_loader()
    return seeds[device]


def _random(kind: str, size: Sequence[Any], dtype: torch.dtype | None, device: torch.device) -> TensorBox:
    if config.fallback_random:
        raise Unsupported("config.fallback_random: eager's numbers")
    dtype = dtype or torch.get_default_dtype()
    if dtype not in _DTYPES:
        raise Unsupported(f"{kind} of {dtype}")
    sizes = [sympy.sympify(s) for s in size]
    seed = _seed(device)
    stream = V.graph.random_streams
    V.graph.random_streams += 1
    strides, step = [], sympy.Integer(1)
    for s in reversed(sizes):
        strides.insert(0, step)
        step = step * s

    def inner_fn(index: Sequence[Any]) -> Any:
        key = seed([])
        if stream:
            key = ops.add(key, ops.constant(stream * _STREAM_KEY_STEP % (1 << 62), torch.int64))  # (no overflow)
        offset = sum((i * s for i, s in zip(index, strides)), sympy.Integer(0))
        value = getattr(ops, kind)(key, ops.index_expr(offset, torch.int64))
        return value if dtype == torch.float32 else ops.to_dtype(value, dtype)

    return TensorBox.create(Pointwise(device, dtype, inner_fn, sizes, origins=frozenset({kind})))


@register_lowering(aten.rand.default)
def rand(size: Sequence[Any], *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    return _random("rand", size, dtype, _device(kwargs.get("device")))


@register_lowering(aten.randn.default)
def randn(size: Sequence[Any], *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    _check_layout(kwargs)
    return _random("randn", size, dtype, _device(kwargs.get("device")))


@register_lowering(aten.rand_like.default)
def rand_like(x: TensorBox, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    return _random("rand", x.get_size(), dtype or x.get_dtype(), like_device(x, kwargs))


@register_lowering(aten.randn_like.default)
def randn_like(x: TensorBox, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorBox:
    return _random("randn", x.get_size(), dtype or x.get_dtype(), like_device(x, kwargs))
