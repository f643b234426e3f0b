"""The lowering registry and the helpers every lowering family shares.

``@register_lowering(aten.op)`` maps aten overloads to ``TensorBox... -> TensorBox``
functions. Type promotion and broadcasting happen here; ``ops.*`` never promotes.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from minductor.ir.layout import FixedLayout, channels_last_order, is_channels_last
from minductor.ir.nodes import IRNode, Loops, Pointwise, StorageBox, TensorBox
from minductor.ir.ops import ops
from minductor.ir.views import make_view
from minductor.virtualized import V

aten = torch.ops.aten
Expr = sympy.Expr
Promotion = ELEMENTWISE_TYPE_PROMOTION_KIND

lowerings: dict[Any, Callable[..., Any]] = {}

# dtypes the C++ kernels compute; anything else (complex, float8, uint16...) falls back.
SUPPORTED_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
     torch.int16, torch.int8, torch.uint8, torch.bool}
)


class Unsupported(Exception):
    """Raised by a lowering for an input it does not handle; the op then falls back to aten."""


def register_lowering(*aten_ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` for each op; a packet registers all its functional overloads."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in aten_ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    overload = getattr(op, name)
                    if not overload._schema.is_mutable and "out" not in name:
                        lowerings[overload] = fn
            else:
                lowerings[op] = fn  # an OpOverload, or "ns.op.overload" for ops defined lazily
        return fn

    return decorator


# ---------------------------------------------------------------------------------------
# dtypes and broadcasting


def lowering_for(target: Any) -> Callable[..., Any] | None:
    fn = lowerings.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = lowerings.get(str(target))
    return fn


def is_tensor(x: Any) -> bool:
    return isinstance(x, IRNode)


def _promotion_proxy(x: Any) -> Any:
    if isinstance(x, sympy.Expr):
        return 1 if x.is_integer else 1.0
    if is_tensor(x):
        shape = () if len(x.get_size()) == 0 else (1,)
        return torch.empty(shape, dtype=x.get_dtype())
    return x


def promote(args: Sequence[Any], kind: Promotion) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of an elementwise op, by PyTorch's rules."""
    proxies = [_promotion_proxy(a) for a in args if a is not None]
    compute, result = elementwise_dtypes(*proxies, type_promotion_kind=kind)
    return compute, result


def broadcast_shapes(*shapes: Sequence[Expr]) -> list[Expr]:
    ndim = max((len(s) for s in shapes), default=0)
    out: list[Expr] = [sympy.Integer(1)] * ndim
    for shape in shapes:
        for i, s in enumerate(shape, start=ndim - len(shape)):
            if s == 1:
                continue
            if out[i] != 1 and out[i] != s:
                # two expressions of one symbolic size (a slice's Max(0, s0 - 2) and Dynamo's s0 - 2):
                # the graph broadcast them when traced, so sizes equal at the hint are equal
                if not _same_size(out[i], s):
                    raise ValueError(f"shapes {[list(s) for s in shapes]} cannot be broadcast together")
                s = min(out[i], s, key=sympy.count_ops)
            out[i] = sympy.sympify(s)
    return out


def _same_size(a: Expr, b: Expr) -> bool:
    a, b = sympy.sympify(a), sympy.sympify(b)
    if a.is_number and b.is_number:
        return a == b
    hint = V.graph.sizevars.hint
    return V.graph.sizevars.simplify(a - b) == 0 or (hint(a) == hint(b) != 1)


# a broadcast repeating each element of a gathered value at least this many times gathers it
# once first (a buffer) rather than at every element it reaches; so does one whose repeats
# times the value's operations (index math included) reach BROADCAST_REALIZE_OPS
BROADCAST_REALIZE_FACTOR = 8
BROADCAST_REALIZE_OPS = 120
# a value computed without a gather is realized before a broadcast when it takes this many
# operations an element (index math included; a layer norm's row statistics take 10)
BROADCAST_REALIZE_DIRECT_OPS = 32
# a computed value a gather reads (a table) is realized first from this many operations an element
GATHER_REALIZE_OPS = 16
# a transcendental value a broadcast repeats outside a dim it varies along (inner loops cannot
# hoist it) is realized when the repeats would evaluate this many more functions than a buffer
# does (a kernel of its own costs a few microseconds: thousands of exps)
BROADCAST_REALIZE_TRANSCENDENTALS = 8192


def expand_to(x: TensorBox, size: Sequence[Expr]) -> TensorBox:
    """Broadcast ``x`` to ``size`` as a lazy view (size-1 dims read index 0). A value read
    through a computed index (a gather) that the broadcast repeats ``BROADCAST_REALIZE_FACTOR``
    times or more is realized first: Swin's relative position bias, gathered from its table and
    added to every window's scores (64 windows), was gathered again at each of them (softmax
    over (64, 8, 49, 49) scores: 1.79 -> 1.25 ms, eager 1.07), or fewer times when computing it
    costs many operations: BEiT's bias is interpolated from its table and gathered (99
    operations an element), for each of 2 images, in both passes of the softmax (the model at
    batch 2, one thread: 4.55 -> 4.0 ms, TorchInductor 4.19). A value computed without a gather
    is realized when it costs ``BROADCAST_REALIZE_DIRECT_OPS`` operations an element: Swin's
    shifted-window mask (41, from an image of region ids) was recomputed for every image and
    head in each pass of the softmax (its kernels 111 and 57 us -> 39 and 20). (Transcendental
    values broadcast along inner dims are left inlined: a squeeze-excitation's sigmoid or a
    row's exp belongs in its consumer's kernel, which evaluates it once per row; one repeated
    along outer dims, like rotary embeddings' cos and sin tables read by every image and head,
    is computed once when that saves ``BROADCAST_REALIZE_TRANSCENDENTALS`` evaluations.)"""
    size = [sympy.sympify(s) for s in size]
    old = x.get_size()
    if list(old) == list(size):
        return x
    skip = len(size) - len(old)
    _realize_if_repeated(x, size)

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        return [sympy.Integer(0) if o == 1 else i for i, o in zip(index[skip:], old)]

    return make_view(x, size, reindex)


def _repeats(x: TensorBox, size: Sequence[Expr]) -> tuple[Pointwise, int] | None:
    """``x``'s body when it is a Pointwise not yet computed into a buffer, and how many times
    a result of ``size`` reads each of its elements on average (None: not a Pointwise, fewer
    than 2 reads, or a symbolic size)."""
    storage = x.storage_box()
    if storage is None or type(storage.data) is not Pointwise:
        return None
    numel, old = sympy.Mul(*size), sympy.Mul(*x.get_size())
    if not (numel.is_Integer and old.is_Integer and int(old) > 0):
        return None
    repeats = int(numel) // int(old)
    return (storage.data, repeats) if repeats >= 2 else None


def realize_if_gathered(x: TensorBox, size: Sequence[Expr]) -> None:
    """Compute ``x`` into a buffer before a gather of ``size`` elements reads it, when the
    gather reads each element several times and computing one costs GATHER_REALIZE_OPS
    operations or more: BEiT's relative position bias table, interpolated bicubically (~100
    operations an element, 678 elements), was interpolated again at each of the 12675
    positions its index picks (135 us a layer, TorchInductor's whole bias 46)."""
    found = _repeats(x, size)
    if found is None:
        return
    body, repeats = found
    count = body.opcount()
    if count.all_ops >= GATHER_REALIZE_OPS and repeats * count.all_ops >= BROADCAST_REALIZE_OPS:
        x.realize()


def _realize_if_repeated(x: TensorBox, size: Sequence[Expr]) -> None:
    found = _repeats(x, size)
    if found is None:
        return
    body, repeats = found
    count = body.opcount()
    if count.indirect and (repeats >= BROADCAST_REALIZE_FACTOR or repeats * count.all_ops >= BROADCAST_REALIZE_OPS):
        x.realize()
    elif count.all_ops >= BROADCAST_REALIZE_DIRECT_OPS and not count.transcendental and \
            sum(1 for s in x.get_size() if s != 1) >= 2:
        # (a value along one dim, like a bicubic resize's weights of each output column,
        # the kernel tables or hoists out of its inner loop already)
        x.realize()
    elif count.transcendental and (_evaluations(x.get_size(), size) - sympy.Mul(*x.get_size())) * \
            count.transcendental >= BROADCAST_REALIZE_TRANSCENDENTALS:
        x.realize()


def _evaluations(old: Sequence[Expr], size: Sequence[Expr]) -> Expr:
    """How many times a loop nest over ``size`` (in its order) evaluates a value of ``old``
    broadcast to it, the loops inside the last dim it varies along hoisting it: a value that
    varies along the innermost dim is evaluated at every element (rotary tables read by every
    image and head), one constant along the inner dims once per row (a gate per channel)."""
    dims = [sympy.Integer(1)] * (len(size) - len(old)) + list(old)
    varying = [i for i, o in enumerate(dims) if o != 1]
    return sympy.Mul(*size[: varying[-1] + 1]) if varying else sympy.Integer(1)


def to_dtype(x: TensorBox, dtype: torch.dtype) -> TensorBox:
    if x.get_dtype() == dtype:
        return x
    loader = x.make_loader()

    def inner_fn(index: Sequence[Expr]) -> Any:
        return ops.to_dtype(loader(index), dtype)

    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, list(x.get_size()), origins=x.origins,
                                      stride_order=layout_hint([x], x.get_size())))


def layout_hint(tensors: Sequence[Any], size: Sequence[Expr]) -> tuple[int, ...] | None:
    """The stride order a pointwise result over ``tensors`` should be realized in: channels-last
    when an input of the result's full size is channels-last (a convolution's output, or a
    pointwise value over one), so the kernel reads and writes in the same order."""
    order = channels_last_order(len(size))
    if order is None:
        return None
    for t in tensors:
        if is_tensor(t) and list(t.get_size()) == list(size) and stored_in(t) == order:
            return order
    return None


def common_layout_hint(tensors: Sequence[Any], rank: int) -> tuple[int, ...] | None:
    """Channels-last when every input is stored channels-last (as eager's cat decides)."""
    order = channels_last_order(rank)
    return order if order is not None and all(stored_in(t) == order for t in tensors) else None


def stored_in(x: TensorBox) -> tuple[int, ...] | None:
    """The stride order ``x`` is (or will be) stored in, when that is channels-last."""
    data = x.data
    if isinstance(data, StorageBox):
        data = data.data
        if isinstance(data, Loops):
            return data.stride_order
    layout = getattr(data, "layout", None)
    if isinstance(layout, FixedLayout) and is_channels_last(layout):
        return channels_last_order(len(layout.size))
    return None


def origins_of(*args: Any) -> frozenset[str]:
    out: frozenset[str] = frozenset()
    for a in args:
        if is_tensor(a):
            out = out | a.origins
    return out


def device_of(args: Sequence[Any]) -> torch.device:
    for a in args:
        if is_tensor(a):
            return a.get_device()
    return torch.device("cpu")


def scalar_loader(value: Any, dtype: torch.dtype) -> Callable[[Sequence[Expr]], Any]:
    if isinstance(value, sympy.Expr) and not value.is_number:
        exact = value.xreplace({f: sympy.nsimplify(f, rational=True) for f in value.atoms(sympy.Float)})
        numerator, denominator = sympy.fraction(sympy.together(exact))
        if denominator != 1:  # a symbolic float (sizes divided): its division in the kernel
            return lambda index: ops.truediv(ops.index_expr(numerator, dtype), ops.index_expr(denominator, dtype))
        return lambda index: ops.index_expr(value, dtype)  # a symbolic size used as a value
    if dtype == torch.bool:
        value = bool(value)
    elif not dtype.is_floating_point:
        value = int(value)
    else:
        value = float(value)
    return lambda index: ops.constant(value, dtype)


# ---------------------------------------------------------------------------------------
# pointwise construction


def make_pointwise(
    fn: Callable[..., Any],
    kind: Promotion = Promotion.DEFAULT,
    *,
    result_dtype: torch.dtype | None = None,
    compute_dtype: torch.dtype | None = None,
    name: str = "",
) -> Callable[..., TensorBox]:
    """Build a lowering from ``fn(*values) -> value`` over ops: promotes, broadcasts,
    casts operands to the computation dtype and the result to the result dtype."""

    def lowering(*args: Any) -> TensorBox:
        tensors = [a for a in args if is_tensor(a)]
        if not tensors:
            raise Unsupported("pointwise op on scalars only")
        compute, result = promote(args, kind)
        compute = compute_dtype or compute
        result = result_dtype or result
        if compute in (torch.float16, torch.bfloat16):
            compute = torch.float32  # compute in fp32, round at the store
        size = broadcast_shapes(*[t.get_size() for t in tensors])
        loaders = []
        for a in args:
            if is_tensor(a):
                loaders.append(_cast_loader(expand_to(a, size).make_loader(), a.get_dtype(), compute))
            else:
                loaders.append(scalar_loader(a, compute))

        def inner_fn(index: Sequence[Expr]) -> Any:
            value = fn(*[load(index) for load in loaders])
            return ops.to_dtype(value, result) if _needs_cast(compute, result, fn) else value

        origin = frozenset({name}) if name else frozenset()
        return TensorBox.create(Pointwise(device_of(args), result, inner_fn, size, origins=origins_of(*args) | origin,
                                          stride_order=layout_hint(tensors, size)))

    return lowering


def _needs_cast(compute: torch.dtype, result: torch.dtype, fn: Callable[..., Any]) -> bool:
    return compute != result and result != torch.bool


def _cast_loader(loader: Callable[[Sequence[Expr]], Any], src: torch.dtype, dst: torch.dtype) -> Callable[[Sequence[Expr]], Any]:
    if src == dst or (src in (torch.float16, torch.bfloat16) and dst == torch.float32):
        return loader  # loads of fp16/bf16 already produce float32
    return lambda index: ops.to_dtype(loader(index), dst)


@functools.cache
def reduced_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)
