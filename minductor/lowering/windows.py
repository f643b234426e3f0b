"""Windows: max/avg/adaptive pooling, forward and backward (reflection/replication padding:
``pads.py``).

Pooling forward ops are Pointwise bodies that unroll the window into loads; positions in
the padding are masked (``ops.masked``), never copied. The values combine in eager's
order with eager's update rule, so results are bit-identical. Windows larger than
``MAX_UNROLL`` become Reductions instead (avg and adaptive pools) or fall back (max pool
with padding).

Backward ops are gathers: each input position visits the few output windows that can
contain it, in increasing output order, the order in which eager's loops scatter into it,
so the sums round the same way.

All ops handle any number of spatial dims (1-d to 3-d pools) over any leading dims, and
symbolic spatial sizes (dynamic shapes): a choice that depends on a size (leaving out a bounds
check, clamping, a constant divisor) is taken only when it holds at every size (``_always``);
the window itself stays a number of positions, or a Reduction over a symbolic one.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch

from minductor.ir.indexing import FloorDiv
from minductor.ir.nodes import Pointwise, Reduction, TensorBox
from minductor.ir.ops import ops
from minductor.lowering.registry import Unsupported, aten, common_layout_hint, origins_of, register_lowering
from minductor.virtualized import V

Expr = sympy.Expr
I64 = torch.int64
# windows with more positions than this are not unrolled (3x3x3 still is)
MAX_UNROLL = 27
# (dim, output position, window element) -> (input position, validity mask or None)
Position = Callable[[int, Expr, Any], tuple[Expr, Any]]


# ---------------------------------------------------------------------------------------
# helpers


def _ints(value: Any, n: int, default: Sequence[int] | None = None) -> list[int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        assert default is not None
        return list(default)
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    return value * n if len(value) == 1 else value


def _spatial(x: TensorBox, n: int, op: str) -> list[Expr]:
    size = x.get_size()
    if len(size) < n + 1:
        raise Unsupported(f"{op}: needs a leading dim and {n} spatial dims, got {list(size)}")
    return list(size[-n:])


def _always(expr: Expr | int) -> bool:
    """Whether ``expr`` (over sizes) is >= 0 at every size, not only at this graph's."""
    return V.graph.sizevars.provably_nonnegative(expr)


def _at_hint(expr: Expr | int) -> bool:
    """Whether ``expr`` >= 0 at this graph's sizes: for a branch tracing took, and guarded,
    on the same sizes (ceil_mode's last-window rule in the output size)."""
    return V.graph.sizevars.hint(expr) >= 0


def _unrolls(kernel: Sequence[Expr | int]) -> bool:
    """Whether a window of these extents is unrolled: a number of positions, at most MAX_UNROLL."""
    return all(sympy.sympify(k).is_Integer for k in kernel) and math.prod(int(k) for k in kernel) <= MAX_UNROLL


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _pool_out(size: Expr, k: int, s: int, p: int, d: int, ceil_mode: bool) -> Expr:
    """Output length of a pooling window sweep, as ATen's pooling_output_shape."""
    out = FloorDiv(size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0), s) + 1
    if ceil_mode and _at_hint((out - 1) * s - size - p):
        out -= 1
    return out


def _and(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else ops.logical_and(a, b)


def _in_range(pos: Expr, lo: Expr | int, hi: Expr | int, check_lo: bool = True, check_hi: bool = True) -> Any:
    """``lo <= pos < hi`` as a bool value (None when no check is asked for)."""
    mask = None
    value = ops.index_expr(pos, I64) if check_lo or check_hi else None
    if check_lo:
        mask = ops.ge(value, ops.index_expr(sympy.sympify(lo), I64))
    if check_hi:
        mask = _and(mask, ops.lt(value, ops.index_expr(sympy.sympify(hi), I64)))
    return mask


def _flat(pos: Sequence[Expr], sizes: Sequence[Expr]) -> Expr:
    flat: Expr = sympy.Integer(0)
    for p, s in zip(pos, sizes):
        flat = flat * s + p
    return flat


def _pointwise(like: TensorBox, dtype: torch.dtype, inner_fn: Callable[..., Any], size: Sequence[Expr], origin: str,
               *inputs: Any, layout_of_like: bool = True) -> TensorBox:
    """A window op's output, stored channels-last when ``like`` is (as eager stores a pool's
    values and indices, a pad, a pool's gradient): a channels-last max pool's indices stored
    contiguous made its kernel loop over the pixels innermost, reading the values 32 floats
    apart (a training step's forward pool kernel: 8.2 ms). Not a big window's first pass
    (``layout_of_like=False``), whose rows a row scratch keeps."""
    return TensorBox.create(Pointwise(like.get_device(), dtype, inner_fn, list(size),
                                      origins=origins_of(like, *inputs) | {origin},
                                      stride_order=common_layout_hint([like], len(size)) if layout_of_like else None))


def _bind(load: Callable[[Sequence[Expr]], Any], index: Sequence[Expr]) -> Callable[[], Any]:
    return lambda: load(index)


# ---------------------------------------------------------------------------------------
# max pooling


class _Sweep:
    """A strided, dilated, padded window sweep over the last ``n`` dims."""

    def __init__(self, in_sizes: list[Expr], kernel: list[int], stride: list[int], padding: list[int],
                 dilation: list[int], ceil_mode: bool) -> None:
        self.n = len(in_sizes)
        self.in_sizes, self.kernel, self.stride, self.padding, self.dilation = in_sizes, kernel, stride, padding, dilation
        self.out_sizes = [_pool_out(*args, ceil_mode) for args in zip(in_sizes, kernel, stride, padding, dilation)]
        if any(not _at_hint(o - 1) for o in self.out_sizes):
            raise Unsupported(f"pooling with an empty output {self.out_sizes}")
        # window elements that can hold an input position: element k's first position is
        # k * d - p (output 0), so from ceil((size + p) / d) on none of a static size does.
        # A window larger than its input (HF EfficientNet's 640x640 average pool with
        # ceil_mode over a 2x2 map) then sums 4 elements, not a masked 409600
        self.reach = [min(k, -(-(int(size) + p) // d)) if size.is_Integer else k
                      for size, k, p, d in zip(in_sizes, kernel, padding, dilation)]

    def position(self, dim: int, out: Expr, k: int | Expr) -> tuple[Expr, bool, bool]:
        """Input position of window element ``k`` (a number, or a reduction variable over
        the window) of output ``out``, and whether it can fall below 0 / at or past the end."""
        d, p = self.dilation[dim], self.padding[dim]
        k_lo, k_hi = (k, k) if isinstance(k, int) else (0, self.reach[dim] - 1)
        last = (self.out_sizes[dim] - 1) * self.stride[dim] + k_hi * d - p
        return out * self.stride[dim] + k * d - p, k_lo * d - p < 0, not _always(self.in_sizes[dim] - 1 - last)


def _max_window(x: TensorBox, n: int, kernel: list[int], in_sizes: list[int], position: Position,
                want_index: bool) -> Callable[[Sequence[Expr]], Any]:
    """Eager's loop: ``if (v > best || isnan(v)) best = v, at = position`` over the valid
    positions in row-major order, the first valid position always taken. A loader of the
    max, or of its flat position in the input's window dims (``want_index``)."""
    load, dtype = x.make_loader(), _compute_dtype(x.get_dtype())
    lowest = -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min

    def inner_fn(index: Sequence[Expr]) -> Any:
        outer, out = list(index[:-n]), list(index[-n:])
        best = at = None
        maybe_unset = False  # `at` may still be -1: no valid position seen yet
        for ks in itertools.product(*[range(k) for k in kernel]):
            mask, pos = None, []
            for dim, k in enumerate(ks):
                p, m = position(dim, out[dim], k)
                pos.append(p)
                mask = _and(mask, m)
            value = load(outer + pos) if mask is None else ops.masked(mask, _bind(load, outer + pos), 0)
            flat = ops.index_expr(_flat(pos, in_sizes), I64) if want_index else None
            if best is None:
                best = value if mask is None else ops.where(mask, value, ops.constant(lowest, dtype))
                if want_index:
                    at = flat if mask is None else ops.where(mask, flat, ops.constant(-1, I64))
                    maybe_unset = mask is not None
                continue
            if not want_index:
                # the same choice as a select of the larger then one of a NaN: GCC makes the
                # first a vmaxps (which keeps ``best`` unless ``value > best``), so a position
                # costs three vector ops, not four ((8, 64, 56, 56) 3x3/2 pools: channels-last
                # 0.174 -> 0.127 ms, NCHW 0.74 -> 0.37; whole calls, one process)
                larger = ops.where(ops.gt(value, best), value, best)
                new = ops.where(ops.isnan(value), value, larger)
                best = new if mask is None else ops.where(mask, new, best)
                continue
            better = ops.logical_or(ops.gt(value, best), ops.isnan(value))
            if maybe_unset:
                better = ops.logical_or(better, ops.lt(at, ops.constant(0, I64)))
            update = better if mask is None else ops.logical_and(mask, better)
            best = ops.where(update, value, best)
            if want_index:
                at = ops.where(update, flat, at)
                maybe_unset = maybe_unset and mask is not None
        return at if want_index else best

    return inner_fn


def _sweep_position(sweep: _Sweep) -> Position:
    def position(dim: int, out: Expr, k: int | Expr) -> tuple[Expr, Any]:
        p, check_lo, check_hi = sweep.position(dim, out, k)
        return p, _in_range(p, 0, sweep.in_sizes[dim], check_lo, check_hi)

    return position


def _max_pool(x: TensorBox, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
              n: int, name: str) -> tuple[TensorBox, TensorBox]:
    kernel = _ints(kernel_size, n)
    sweep = _Sweep(_spatial(x, n, name), kernel, _ints(stride, n, kernel), _ints(padding, n), _ints(dilation, n), ceil_mode)
    reach = sweep.reach
    if math.prod(reach) > MAX_UNROLL:
        raise Unsupported(f"{name}: window {kernel} larger than {MAX_UNROLL} positions")
    size = list(x.get_size()[:-n]) + sweep.out_sizes
    position = _sweep_position(sweep)
    values = _pointwise(x, x.get_dtype(), _max_window(x, n, reach, sweep.in_sizes, position, False), size, name)
    indices = _pointwise(x, I64, _max_window(x, n, reach, sweep.in_sizes, position, True), size, name)
    return values, indices


@register_lowering(aten.max_pool2d_with_indices)
def max_pool2d_with_indices(x: TensorBox, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> tuple[TensorBox, TensorBox]:
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2, "max_pool2d")


@register_lowering(aten.max_pool3d_with_indices)
def max_pool3d_with_indices(x: TensorBox, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> tuple[TensorBox, TensorBox]:
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 3, "max_pool3d")


def _sweep_candidates(sweep: _Sweep, reach: list[int]) -> list[int]:
    """Per dim, how many outputs' windows (``reach`` positions long) can hold one input (at
    most the outputs there are, when that is a number: masks drop the rest)."""
    return [min(int(o), -(-r // s)) if o.is_Integer else -(-r // s)
            for o, r, s in zip(sweep.out_sizes, reach, sweep.stride)]


def _sweep_candidate(sweep: _Sweep, dim: int, pos: Expr, j: int) -> tuple[Expr, bool, bool]:
    """Output ``top - j``, ``top`` the last output whose window starts at or before ``pos``
    (clamped to the last output: trailing inputs can be in no window), whether it can be
    below 0, and whether ``top`` was clamped."""
    s, p, out = sweep.stride[dim], sweep.padding[dim], sweep.out_sizes[dim]
    top = FloorDiv(pos + p, s)
    clamped = not _always(out - 1 - FloorDiv(sweep.in_sizes[dim] - 1 + p, s))
    if clamped:
        top = sympy.Min(top, out - 1)
    return top - j, j > 0, clamped


def _gather_sum(grad: TensorBox, in_size: Sequence[Expr], n: int, counts: list[int],
                candidate: Callable[[int, Expr, int], tuple[Expr, Any]],
                contribution: Callable[[list[Expr], list[Expr], list[Expr]], Any], dtype: torch.dtype,
                name: str, *inputs: Any) -> TensorBox:
    """A backward as a gather: input position ``pos`` sums ``contribution(outer, opos, pos)``
    over candidate outputs ``opos`` (from ``candidate(dim, pos, j)`` = (position, mask)),
    in increasing output order."""
    if math.prod(counts) > MAX_UNROLL:
        raise Unsupported(f"{name}: {math.prod(counts)} candidate windows per input position")
    compute = _compute_dtype(dtype)

    def inner_fn(index: Sequence[Expr]) -> Any:
        outer, pos = list(index[:-n]), list(index[-n:])
        total = ops.constant(0, compute)
        for js in itertools.product(*[range(c) for c in counts]):
            mask, opos = None, []
            for dim, j in enumerate(js):
                o, m = candidate(dim, pos[dim], j)
                opos.append(o)
                mask = _and(mask, m)
            value = (contribution(outer, opos, pos) if mask is None
                     else ops.masked(mask, _bind_contribution(contribution, outer, opos, pos), 0.0))
            total = ops.add(total, value)
        return total

    return _pointwise(grad, dtype, inner_fn, in_size, name, *inputs)


def _bind_contribution(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _max_pool_backward(grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                       ceil_mode: bool, indices: TensorBox, n: int, name: str) -> TensorBox:
    kernel = _ints(kernel_size, n)
    sweep = _Sweep(_spatial(x, n, name), kernel, _ints(stride, n, kernel), _ints(padding, n), _ints(dilation, n), ceil_mode)
    counts = _sweep_candidates(sweep, [(k - 1) * d + 1 for k, d in zip(sweep.reach, sweep.dilation)])
    g_load, i_load, compute = grad.make_loader(), indices.make_loader(), _compute_dtype(grad.get_dtype())

    def candidate(dim: int, pos: Expr, j: int) -> tuple[Expr, Any]:
        o, check_lo, _ = _sweep_candidate(sweep, dim, pos, counts[dim] - 1 - j)
        return o, _in_range(o, 0, sweep.out_sizes[dim], check_lo, False)  # indices pick the window

    def contribution(outer: list[Expr], opos: list[Expr], pos: list[Expr]) -> Any:
        hit = ops.eq(i_load(outer + opos), ops.index_expr(_flat(pos, sweep.in_sizes), I64))
        return ops.where(hit, g_load(outer + opos), ops.constant(0, compute))

    return _gather_sum(grad, x.get_size(), n, counts, candidate, contribution, grad.get_dtype(), name, indices)


@register_lowering(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any,
                                     dilation: Any, ceil_mode: bool, indices: TensorBox) -> TensorBox:
    return _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, 2,
                              "max_pool2d_backward")


@register_lowering(aten.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward(grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any,
                                     dilation: Any, ceil_mode: bool, indices: TensorBox) -> TensorBox:
    return _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, 3,
                              "max_pool3d_backward")


# ---------------------------------------------------------------------------------------
# average pooling


def _avg_divisor(sweep: _Sweep, out: Sequence[Expr], count_include_pad: bool, divisor_override: int | None,
                 compute: torch.dtype) -> Any:
    """Eager's divide factor of the window at ``out``: the window clipped to the padded
    input (count_include_pad) or to the input itself."""
    if divisor_override:
        return ops.constant(float(divisor_override), compute)
    const, extents = 1, []
    for dim in range(sweep.n):
        k, s, p, size = sweep.kernel[dim], sweep.stride[dim], sweep.padding[dim], sweep.in_sizes[dim]
        start = out[dim] * s - p
        last_end = (sweep.out_sizes[dim] - 1) * s - p + k
        if count_include_pad:
            if _always(size + p - last_end):
                const *= k
            else:
                extents.append(sympy.Min(start + k, size + p) - start)
        elif p == 0 and _always(size - last_end):
            const *= k
        else:
            extents.append(sympy.Min(start + k, size) - sympy.Max(start, 0))
    if not extents:
        return ops.constant(float(const), compute)
    count = sympy.Mul(const, *extents)
    return ops.to_dtype(ops.index_expr(count, I64), compute)


def _avg_pool_args(x: TensorBox, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool, n: int,
                   name: str) -> _Sweep:
    if not x.get_dtype().is_floating_point:
        raise Unsupported(f"{name} of {x.get_dtype()} (integer division)")
    kernel = _ints(kernel_size, n)
    return _Sweep(_spatial(x, n, name), kernel, _ints(stride, n, kernel), _ints(padding, n), [1] * n, ceil_mode)


def _window_load(load: Callable[[Sequence[Expr]], Any], position: Position, outer: Sequence[Expr],
                 out: Sequence[Expr], ks: Sequence[Any], rest: Sequence[Expr] = ()) -> Any:
    """The input at window element ``ks`` of output ``out`` (the dims after the window's at
    ``rest``), 0 where the position is masked off."""
    mask, pos = None, []
    for dim, k in enumerate(ks):
        p, m = position(dim, out[dim], k)
        pos.append(p)
        mask = _and(mask, m)
    at = [*outer, *pos, *rest]
    return load(at) if mask is None else ops.masked(mask, _bind(load, at), 0.0)


def _sum(compute: torch.dtype, values: Iterable[Any]) -> Any:
    """``0 + v0 + v1 + ...``, in the given order (eager's, for an unrolled window)."""
    total = ops.constant(0, compute)
    for value in values:
        total = ops.add(total, value)
    return total


def _window_sum(x: TensorBox, n: int, kernel: list[int], position: Position,
                size: list[Expr], compute: torch.dtype, name: str) -> Callable[[Sequence[Expr]], Any]:
    """A loader for the sum over each output's window (``position(dim, out, k)`` =
    (input position, mask)): unrolled in row-major order, or a Reduction for big windows."""
    load = x.make_loader()

    def element(index: Sequence[Expr], ks: Sequence[Any]) -> Any:
        return _window_load(load, position, index[:-n], index[-n:], ks)

    if _unrolls(kernel):
        return lambda index: _sum(compute, (element(index, ks) for ks in itertools.product(*map(range, kernel))))

    if _separates(x, n, size):
        return _separable_window_sum(x, n, kernel, position, size, compute, name)
    # big windows: a Reduction over the last dim's window (contiguous lanes) of the sum over the
    # other dims' windows, unrolled when that is small enough, else over the whole window. With
    # a 2-D reduction each short row's lanes stay in memory across rows behind a per-row mask
    # (8x64x128x128 -> 7x7: 20x20 windows 2.9 ms; unrolled rows: see the issue note)
    lead_kernel = kernel[:-1]
    if _unrolls(lead_kernel):
        def reduced(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
            return _sum(compute, (element(index, [*ks, rindex[0]]) for ks in itertools.product(*map(range, lead_kernel))))

        ranges = [sympy.sympify(kernel[-1])]
    else:
        def reduced(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
            return element(index, list(rindex))

        ranges = [sympy.sympify(k) for k in kernel]
    node = TensorBox.create(Reduction(x.get_device(), compute, reduced, list(size), origins=x.origins | {name},
                                      src_dtype=compute, reduction_ranges=ranges, reduction_type="sum"))
    node.realize()
    return node.make_loader()


def _separates(x: TensorBox, n: int, size: list[Expr]) -> bool:
    """Whether a big window sums in two passes (``_separable_window_sum``): the lead spatial
    dims shrink at least 4x (stride-1 windows keep the one pass: their first pass would be
    nearly the input's size wherever it cannot stay in the kernel)."""
    ins, outs = x.get_size()[-n:-1], size[-n:-1]
    if n < 2 or not all(isinstance(s, sympy.Integer) for s in [*ins, *outs]):
        return False
    return 4 * math.prod(int(o) for o in outs) <= math.prod(int(i) for i in ins)


def _separable_window_sum(x: TensorBox, n: int, kernel: list[int], position: Position,
                          size: list[Expr], compute: torch.dtype, name: str) -> Callable[[Sequence[Expr]], Any]:
    """A big window's sum in two passes, as separable filters run: first, at every position of
    the last dim, the sums over the lead dims' windows (unrolled when small enough, else a
    Reduction), of the output's lead sizes by the input's last size; then the sums over the
    last dim's window of those (unrolled when small enough, else a Reduction). Both unrolled,
    the scheduler puts the passes in one kernel and the first pass's row in a row scratch
    (``fusion.fused_outer``, ``cpp_rows``); else the first pass is a buffer. The first pass
    reads whole contiguous rows instead of each window's short masked ones and adds each input
    element once per window row instead of once per window (8x64x128x128 -> 7x7, 20x20
    windows: 1.55 ms in one pass with unrolled rows, 0.41 ms in two by hand, 0.33-0.57 ms
    generated; see the issue note)."""
    load, lead_kernel = x.make_loader(), kernel[:-1]

    def lead_element(index: Sequence[Expr], ks: Sequence[Any]) -> Any:
        return _window_load(load, position, index[:-n], index[-n:-1], ks, index[-1:])

    lead_size = list(size[:-1]) + [x.get_size()[-1]]
    if math.prod(lead_kernel) <= MAX_UNROLL:
        def lead_sum(index: Sequence[Expr]) -> Any:
            return _sum(compute, (lead_element(index, ks) for ks in itertools.product(*map(range, lead_kernel))))

        lead = _pointwise(x, compute, lead_sum, lead_size, name, layout_of_like=False)
    else:
        lead = TensorBox.create(Reduction(x.get_device(), compute, lead_element, lead_size, origins=x.origins | {name},
                                          src_dtype=compute, reduction_ranges=[sympy.Integer(k) for k in lead_kernel],
                                          reduction_type="sum"))
    lead.realize()
    partial = lead.make_loader()

    last = int(x.get_size()[-1])

    def last_element(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        p, mask = position(n - 1, index[-1], rindex[0])
        if mask is not None:  # a masked-off position still reads inside the row (its kernel may keep the row)
            p = sympy.Max(0, sympy.Min(p, last - 1))
        at = list(index[:-1]) + [p]
        return partial(at) if mask is None else ops.masked(mask, _bind(partial, at), 0.0)

    if kernel[-1] <= MAX_UNROLL:
        return lambda index: _sum(compute, (last_element(index, [k]) for k in range(kernel[-1])))
    node = TensorBox.create(Reduction(x.get_device(), compute, last_element, list(size), origins=x.origins | {name},
                                      src_dtype=compute, reduction_ranges=[sympy.Integer(kernel[-1])],
                                      reduction_type="sum"))
    node.realize()
    return node.make_loader()


def _avg_pool(x: TensorBox, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool, count_include_pad: bool,
              divisor_override: int | None, n: int, name: str) -> TensorBox:
    sweep = _avg_pool_args(x, kernel_size, stride, padding, ceil_mode, n, name)
    compute = _compute_dtype(x.get_dtype())
    size = list(x.get_size()[:-n]) + sweep.out_sizes

    total = _window_sum(x, n, sweep.reach, _sweep_position(sweep), size, compute, name)

    def inner_fn(index: Sequence[Expr]) -> Any:
        divisor = _avg_divisor(sweep, list(index[-n:]), count_include_pad, divisor_override, compute)
        return ops.truediv(total(index), divisor)

    return _pointwise(x, x.get_dtype(), inner_fn, size, name)


@register_lowering(aten.avg_pool2d)
def avg_pool2d(x: TensorBox, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> TensorBox:
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2, "avg_pool2d")


@register_lowering(aten.avg_pool3d)
def avg_pool3d(x: TensorBox, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> TensorBox:
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3, "avg_pool3d")


def _avg_pool_backward(grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                       count_include_pad: bool, divisor_override: int | None, n: int, name: str) -> TensorBox:
    sweep = _avg_pool_args(x, kernel_size, stride, padding, ceil_mode, n, name)
    counts = _sweep_candidates(sweep, sweep.reach)
    g_load, compute = grad.make_loader(), _compute_dtype(grad.get_dtype())

    def candidate(dim: int, pos: Expr, j: int) -> tuple[Expr, Any]:
        jj = counts[dim] - 1 - j
        o, check_lo, clamped = _sweep_candidate(sweep, dim, pos, jj)
        mask = _in_range(o, 0, sweep.out_sizes[dim], check_lo, False)
        s, p, k = sweep.stride[dim], sweep.padding[dim], sweep.kernel[dim]
        if clamped or jj * s + s - 1 >= k:  # the window of output `o` may end before `pos`
            mask = _and(mask, _in_range(pos + p - o * s, 0, k, check_lo=False))
        return o, mask

    def contribution(outer: list[Expr], opos: list[Expr], pos: list[Expr]) -> Any:
        return ops.truediv(g_load(outer + opos), _avg_divisor(sweep, opos, count_include_pad, divisor_override, compute))

    return _gather_sum(grad, x.get_size(), n, counts, candidate, contribution, grad.get_dtype(), name)


@register_lowering(aten.avg_pool2d_backward)
def avg_pool2d_backward(grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                        count_include_pad: bool, divisor_override: int | None = None) -> TensorBox:
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                              2, "avg_pool2d_backward")


@register_lowering(aten.avg_pool3d_backward)
def avg_pool3d_backward(grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                        count_include_pad: bool, divisor_override: int | None = None) -> TensorBox:
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                              3, "avg_pool3d_backward")


# ---------------------------------------------------------------------------------------
# adaptive pooling: output ``o`` pools input [floor(o*IN/OUT), ceil((o+1)*IN/OUT))


class _Adaptive:
    def __init__(self, in_sizes: list[Expr], out_sizes: list[Expr], name: str, pad_last: bool = False) -> None:
        if not all(_at_hint(o - 1) for o in out_sizes) or not all(_at_hint(i - 1) for i in in_sizes):
            raise Unsupported(f"{name} from {in_sizes} to {out_sizes}")
        self.n, self.in_sizes, self.out_sizes = len(in_sizes), in_sizes, out_sizes
        # per dim: the largest and smallest window; how many outputs hold an input at most (None:
        # unbounded over the sizes a symbolic dim may take) and at least
        self.kernel: list[Expr] = []
        self.min_kernel: list[Expr] = []
        self.counts: list[int | None] = []
        self.min_counts: list[int] = []
        for d in range(self.n):
            measure = self._measure if in_sizes[d].is_Integer and out_sizes[d].is_Integer else self._bound
            for field, value in zip((self.kernel, self.min_kernel, self.counts, self.min_counts), measure(d)):
                field.append(value)
        # positions a window sum runs over: with pad_last, a last dim reduced as a Reduction (the
        # whole window above MAX_UNROLL) runs over whole 16-lane vectors past the largest window,
        # its positions there masked (a 20-wide window as 16 + 4 lanes left 4 scalar chains of
        # window-height adds per output)
        self.reach = list(self.kernel)
        if pad_last and not _unrolls(self.kernel) and self.kernel[-1].is_Integer and self.kernel[-1] > 8:
            self.reach[-1] = sympy.Integer(-(-int(self.kernel[-1]) // 16) * 16)

    def _measure(self, d: int) -> tuple[Expr, Expr, int, int]:
        """Dim ``d``'s windows and holders, enumerated (its sizes are numbers). The first
        output holding input i is floor(i*OUT/IN)."""
        size, out = int(self.in_sizes[d]), int(self.out_sizes[d])
        starts = [o * size // out for o in range(out)]
        ends = [-(-(o + 1) * size // out) for o in range(out)]
        holders: list[list[int]] = [[] for _ in range(size)]
        for o in range(out):
            for i in range(starts[o], ends[o]):
                holders[i].append(o)
        assert all(h[0] == i * out // size for i, h in enumerate(holders))
        spans = [e - s for s, e in zip(starts, ends)]
        return (sympy.Integer(max(spans)), sympy.Integer(min(spans)),
                max(len(h) for h in holders), min(len(h) for h in holders))

    def _bound(self, d: int) -> tuple[Expr, Expr, int | None, int]:
        """Dim ``d``'s windows and holders for every size it may take (a size is symbolic):
        one window of the whole dim, or windows at most ceil(IN/OUT) + 1 long (their ends
        masked), each input in at most two of them when IN >= OUT at every size (two windows
        overlap by at most one position, and the next starts floor(IN/OUT) further on)."""
        size, out = self.in_sizes[d], self.out_sizes[d]
        if out == 1:
            return size, size, 1, 1
        return FloorDiv(size + out - 1, out) + 1, sympy.Integer(0), 2 if _always(size - out) else None, 1

    def start(self, d: int, o: Expr) -> Expr:
        return FloorDiv(o * self.in_sizes[d], self.out_sizes[d])

    def end(self, d: int, o: Expr) -> Expr:
        return FloorDiv((o + 1) * self.in_sizes[d] + self.out_sizes[d] - 1, self.out_sizes[d])

    def position(self, d: int, o: Expr, k: int | Expr) -> tuple[Expr, Any]:
        """Input position of window element ``k`` of output ``o``, and its validity mask."""
        start = self.start(d, o)
        needs_mask = k >= self.min_kernel[d] if isinstance(k, int) else not _always(self.min_kernel[d] - self.reach[d])
        return start + k, _in_range(start + k, 0, self.end(d, o), check_lo=False, check_hi=needs_mask)

    def extent(self, d: int, o: Expr) -> Expr:
        return self.end(d, o) - self.start(d, o)

    def holder(self, d: int, pos: Expr, j: int) -> tuple[Expr, Any]:
        """Candidate output ``j`` for input ``pos`` and whether it holds ``pos``. Windows
        move monotonically, so only its start can exclude ``pos`` (and start(OUT) = IN)."""
        o = FloorDiv(pos * self.out_sizes[d], self.in_sizes[d]) + j if self.out_sizes[d] != 1 else sympy.Integer(j)
        if j < self.min_counts[d]:
            return o, None
        return o, ops.le(ops.index_expr(self.start(d, o), I64), ops.index_expr(pos, I64))


def _adaptive(x: TensorBox, output_size: Any, n: int, name: str, pad_last: bool = False) -> tuple[_Adaptive, list[Expr]]:
    in_sizes = _spatial(x, n, name)
    out_sizes = [sympy.sympify(o) for o in (output_size if isinstance(output_size, (list, tuple)) else [output_size])]
    out_sizes = out_sizes * n if len(out_sizes) == 1 else out_sizes
    if len(out_sizes) != n:
        raise Unsupported(f"{name}: output size {out_sizes} for {n} spatial dims")
    size = list(x.get_size()[:-n]) + out_sizes
    return _Adaptive(in_sizes, out_sizes, name, pad_last), size


def _holder_counts(ad: _Adaptive, name: str) -> list[int]:
    """How many outputs may hold an input, per dim, for a backward's gather."""
    if None in ad.counts:
        raise Unsupported(f"{name}: input {ad.in_sizes} may be smaller than output {ad.out_sizes} at some sizes")
    return [int(c) for c in ad.counts if c is not None]


def _divide_by_extents(value: Any, ad: _Adaptive, out: list[Expr], compute: torch.dtype) -> Any:
    """``value / kh / kw``: one division per dim, as eager rounds."""
    for d in range(ad.n):
        value = ops.truediv(value, ops.to_dtype(ops.index_expr(ad.extent(d, out[d]), I64), compute))
    return value


def _adaptive_avg_pool(x: TensorBox, output_size: Any, n: int, name: str) -> TensorBox:
    if not x.get_dtype().is_floating_point:
        raise Unsupported(f"{name} of {x.get_dtype()}")
    ad, size = _adaptive(x, output_size, n, name, pad_last=True)
    compute = _compute_dtype(x.get_dtype())
    # a one-pass Reduction runs over whole vectors past the window (reach); two passes unroll it
    total = _window_sum(x, n, ad.kernel if _separates(x, n, size) else ad.reach, ad.position, size, compute, name)

    def inner_fn(index: Sequence[Expr]) -> Any:
        return _divide_by_extents(total(index), ad, list(index[-n:]), compute)

    return _pointwise(x, x.get_dtype(), inner_fn, size, name)


@register_lowering(aten._adaptive_avg_pool2d)
def adaptive_avg_pool2d(x: TensorBox, output_size: Any) -> TensorBox:
    return _adaptive_avg_pool(x, output_size, 2, "adaptive_avg_pool2d")


@register_lowering(aten._adaptive_avg_pool3d)
def adaptive_avg_pool3d(x: TensorBox, output_size: Any) -> TensorBox:
    return _adaptive_avg_pool(x, output_size, 3, "adaptive_avg_pool3d")


def _adaptive_avg_pool_backward(grad: TensorBox, x: TensorBox, n: int, name: str) -> TensorBox:
    ad, _ = _adaptive(x, grad.get_size()[-n:], n, name)
    g_load, compute = grad.make_loader(), _compute_dtype(grad.get_dtype())

    def contribution(outer: list[Expr], opos: list[Expr], pos: list[Expr]) -> Any:
        return _divide_by_extents(g_load(outer + opos), ad, opos, compute)

    return _gather_sum(grad, x.get_size(), n, _holder_counts(ad, name), ad.holder, contribution, grad.get_dtype(), name)


@register_lowering(aten._adaptive_avg_pool2d_backward)
def adaptive_avg_pool2d_backward(grad: TensorBox, x: TensorBox) -> TensorBox:
    return _adaptive_avg_pool_backward(grad, x, 2, "adaptive_avg_pool2d_backward")


@register_lowering(aten._adaptive_avg_pool3d_backward)
def adaptive_avg_pool3d_backward(grad: TensorBox, x: TensorBox) -> TensorBox:
    return _adaptive_avg_pool_backward(grad, x, 3, "adaptive_avg_pool3d_backward")


def _adaptive_max_pool(x: TensorBox, output_size: Any, n: int, name: str) -> tuple[TensorBox, TensorBox]:
    ad, size = _adaptive(x, output_size, n, name)
    if _unrolls(ad.kernel):
        values = _pointwise(x, x.get_dtype(), _max_window(x, n, ad.kernel, ad.in_sizes, ad.position, False), size, name)
        indices = _pointwise(x, I64, _max_window(x, n, ad.kernel, ad.in_sizes, ad.position, True), size, name)
        return values, indices
    return _adaptive_max_reduced(x, ad, size, name)


def _adaptive_max_reduced(x: TensorBox, ad: _Adaptive, size: list[Expr], name: str) -> tuple[TensorBox, TensorBox]:
    """Big windows: a max and an argmax Reduction over the largest window, positions past
    a window's end reading as the lowest value (they come after its valid ones, so argmax
    keeps a valid one). Differs from eager only in which NaN's index is returned."""
    n, load, dtype = ad.n, x.make_loader(), _compute_dtype(x.get_dtype())
    lowest = -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min

    def reduced(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        outer, out = list(index[:-n]), list(index[-n:])
        mask, pos = None, []
        for d in range(n):
            p, m = ad.position(d, out[d], rindex[d])
            pos.append(p)
            mask = _and(mask, m)
        return load(outer + pos) if mask is None else ops.masked(mask, _bind(load, outer + pos), lowest)

    def reduction(kind: str, dtype: torch.dtype) -> TensorBox:
        node = TensorBox.create(Reduction(x.get_device(), dtype, reduced, list(size), origins=x.origins | {name},
                                          src_dtype=x.get_dtype(), reduction_ranges=list(ad.kernel),
                                          reduction_type=kind))
        node.realize()
        return node

    values, arg = reduction("max", x.get_dtype()), reduction("argmax", I64)
    arg_load = arg.make_loader()

    def to_position(index: Sequence[Expr]) -> Any:
        r, flat = arg_load(index), None
        out = list(index[-n:])
        for d in range(n):
            inner = sympy.Mul(*ad.kernel[d + 1:])
            k = ops.mod(ops.floordiv(r, ops.index_expr(inner, I64)), ops.index_expr(ad.kernel[d], I64))
            p = ops.add(ops.index_expr(ad.start(d, out[d]), I64), k)
            flat = p if flat is None else ops.add(ops.mul(flat, ops.index_expr(ad.in_sizes[d], I64)), p)
        return flat

    return values, _pointwise(x, I64, to_position, size, name, arg)


@register_lowering(aten.adaptive_max_pool2d)
def adaptive_max_pool2d(x: TensorBox, output_size: Any) -> tuple[TensorBox, TensorBox]:
    return _adaptive_max_pool(x, output_size, 2, "adaptive_max_pool2d")


@register_lowering(aten.adaptive_max_pool3d)
def adaptive_max_pool3d(x: TensorBox, output_size: Any) -> tuple[TensorBox, TensorBox]:
    return _adaptive_max_pool(x, output_size, 3, "adaptive_max_pool3d")


def _adaptive_max_pool_backward(grad: TensorBox, x: TensorBox, indices: TensorBox, n: int, name: str) -> TensorBox:
    ad, _ = _adaptive(x, grad.get_size()[-n:], n, name)
    g_load, i_load, compute = grad.make_loader(), indices.make_loader(), _compute_dtype(grad.get_dtype())

    def contribution(outer: list[Expr], opos: list[Expr], pos: list[Expr]) -> Any:
        hit = ops.eq(i_load(outer + opos), ops.index_expr(_flat(pos, ad.in_sizes), I64))
        return ops.where(hit, g_load(outer + opos), ops.constant(0, compute))

    return _gather_sum(grad, x.get_size(), n, _holder_counts(ad, name), ad.holder, contribution, grad.get_dtype(), name,
                       indices)


@register_lowering(aten.adaptive_max_pool2d_backward)
def adaptive_max_pool2d_backward(grad: TensorBox, x: TensorBox, indices: TensorBox) -> TensorBox:
    return _adaptive_max_pool_backward(grad, x, indices, 2, "adaptive_max_pool2d_backward")


@register_lowering(aten.adaptive_max_pool3d_backward)
def adaptive_max_pool3d_backward(grad: TensorBox, x: TensorBox, indices: TensorBox) -> TensorBox:
    return _adaptive_max_pool_backward(grad, x, indices, 3, "adaptive_max_pool3d_backward")
