"""Decompositions of our own, where torch's table has none we can use.

``aten._scaled_dot_product_flash_attention_for_cpu``: torch's decomposition returns the
attention probabilities where the op returns the log-sum-exp of each row. That is harmless in
an inference graph, which drops the second output, but in training AOTAutograd saves it for
``_scaled_dot_product_flash_attention_for_cpu_backward``, which then computes wrong gradients
for the query, key and value. Ours computes the same softmax (one fused kernel) and returns
the true log-sum-exp, so the aten backward gets what the op itself would have given it.

``aten._softmax``: torch's decomposition divides each row by its sum; ours multiplies by the
sum's reciprocal, as eager's CPU kernel does (one reciprocal per row, hoisted out of the row's
loop; a division per element was 16% of softmax at 4096^2 on a Xeon). The node decides it, so
every kernel recomputing the softmax rounds it alike. A division the user writes stays one.

``aten.native_group_norm`` and its backward: by the layout the input will have (a
convolution's output is channels-last), and in that layout (``_group_norm``).

``aten.linspace`` of an integer dtype: torch's decomposition computes in float32 from the
bounds as given, where eager converts the bounds to the dtype first and steps in double
(``linspace(4.3, -3, 50, dtype=torch.int64)`` differed in 7 elements).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table
from torch._decomp.decompositions import _softmax_unbacked_safe_amax

from minductor.runtime.cache import half_in_float32

aten = torch.ops.aten

DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}


def _register(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        DECOMPOSITIONS[op] = fn
        return fn

    return wrap


# Attention is decomposed (two products around a fused softmax) while the scores of one head
# hold at most this many elements; longer ones stay the aten op, a flash kernel that never
# stores the scores and skips a causal mask's blocks. Decomposed/aten, (batch, heads, L, L, 64):
# (16, 8, 96) 2.1/2.6 ms, (16, 8, 160) 6.2/6.7, (16, 12, 197) 14.6/14.4, (8, 16, 512) 55/50
# (the scores: 128 MB); causal (16, 8, 96) 2.4/2.6, (64, 8, 128, head 32) 12.3/11.6,
# (1, 8, 2048, 128) 104/54.
SDPA_MAX_SCORES = 1 << 15
SDPA_CAUSAL_MAX_SCORES = 1 << 13


@_register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                    scale: float | None = None) -> Any:
    """(output, logsumexp) as the CPU flash-attention kernel gives them, also for rows that
    are masked out entirely (output 0, log-sum-exp 0, so the backward's probabilities are 0).
    Half inputs run in float32 on a CPU without native half GEMM, the output rounded to half
    (the log-sum-exp is float32, as the op's). Other cases (dropout, grouped-query heads,
    bfloat16, half on CPUs with native half GEMM, long sequences: ``SDPA_MAX_SCORES``) stay the
    aten op."""
    if _half_as_float(query, key, value, attn_mask):
        # (as half products on such a CPU: eager's half attention at (8, 4, 128, 64) took 2.6 ms,
        # float32 1.0; eager's accumulates in float32 too)
        mask = attn_mask.float() if attn_mask is not None else None
        args = (query.float(), key.float(), value.float(), dropout_p, is_causal)
        result = _sdpa_flash_cpu(*args, attn_mask=mask, scale=scale)
        if result is NotImplemented:  # (too big, dropout, grouped-query heads: the aten op, in float32)
            result = aten._scaled_dot_product_flash_attention_for_cpu.default(*args, attn_mask=mask, scale=scale)
        return result[0].to(torch.float16), result[1]
    if (dropout_p != 0.0 or query.dtype not in (torch.float32, torch.float64) or query.dim() != 4
            or key.dim() != 4 or value.dim() != 4 or key.size(1) != query.size(1) or value.size(1) != query.size(1)):
        return NotImplemented
    length, source = query.size(-2), key.size(-2)
    if is_causal and length < source and attn_mask is None:  # row i sees keys 0..i: the first `length`
        key, value, source = key[:, :, :length], value[:, :, :length], length
    if length * source > (SDPA_CAUSAL_MAX_SCORES if is_causal else SDPA_MAX_SCORES):
        return NotImplemented
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:  # the op takes an additive mask (a boolean one was converted before)
        scores = scores + attn_mask
    row_max = scores.amax(-1, keepdim=True)
    masked_row = row_max == float("-inf")
    row_max = torch.where(masked_row, 0.0, row_max)
    exp = torch.exp(scores - row_max)
    total = exp.sum(-1, keepdim=True)
    probs = torch.where(masked_row, 0.0, exp * torch.reciprocal(total))
    logsumexp = torch.where(masked_row, 0.0, row_max + torch.log(total)).squeeze(-1)
    return torch.matmul(probs, value), logsumexp


@_register(aten._softmax.default)
def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    x = x.contiguous()  # (eager's softmax returns a contiguous tensor)
    computed = x.to(_acc_dtype(x.dtype))
    exp = torch.exp(computed - _softmax_unbacked_safe_amax(computed, dim))
    result = exp * torch.reciprocal(exp.sum(dim, keepdim=True))
    return result if half_to_float else result.to(x.dtype)


_TORCH_LINSPACE = decomposition_table[aten.linspace.default]


def _linspace(start: Any, end: Any, steps: int, *, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor:
    """As eager's CPU kernel for an integer dtype: the bounds converted to the dtype (truncated,
    wrapped), the step in double, and the second half counted back from ``end``. For half and
    bfloat16, as that kernel computes in the dtype itself: bounds, step, index and every product
    and sum rounded to it (torch's decomposition computes in float and rounds once, which eager
    matched on 47 of 300 random bfloat16 ranges)."""
    if dtype in (torch.float16, torch.bfloat16) and steps > 1:
        return _linspace_16bit(start, end, steps, dtype, kwargs.get("device"))
    if dtype is None or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool or steps <= 1:
        return _TORCH_LINSPACE(start, end, steps, dtype=dtype, **kwargs)
    first, last = _integer_bound(start, dtype), _integer_bound(end, dtype)
    step = (last - first) / (steps - 1)
    index = torch.arange(steps, dtype=torch.float64, device=kwargs.get("device"))
    return torch.where(index < steps // 2, first + step * index, last - step * (steps - 1 - index)).to(dtype)


def _linspace_16bit(start: Any, end: Any, steps: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``_linspace`` of a half or bfloat16 ``dtype``: every result rounded to it (written as
    float32 values rounded through ``dtype``: a fused kernel keeps 16-bit intermediates in
    float32 unrounded)."""
    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).to(torch.float32)

    first, last = _bound_in(start, dtype, device, torch.float32), _bound_in(end, dtype, device, torch.float32)
    step = rounded(rounded(last - first) / (steps - 1))
    index = torch.arange(steps, device=device)
    ahead, back = rounded(index.to(torch.float32)), rounded((steps - 1 - index).to(torch.float32))
    low, high = rounded(first + rounded(step * ahead)), rounded(last - rounded(step * back))
    return torch.where(index < steps // 2, low, high).to(dtype)


def _bound_in(value: Any, dtype: torch.dtype, device: Any, compute: torch.dtype) -> torch.Tensor:
    """A linspace or logspace bound (a number or a 0-d tensor) rounded to ``dtype``, as a
    ``compute`` tensor."""
    value = value.to(dtype) if isinstance(value, torch.Tensor) else torch.full((), value, dtype=dtype, device=device)
    return value.to(compute)


def _integer_bound(value: Any, dtype: torch.dtype) -> Any:
    """A linspace bound converted to the integer ``dtype``, as a double (a tensor stays one)."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype).to(torch.float64)
    info = torch.iinfo(dtype)
    return float((int(value) - info.min) % (1 << info.bits) + info.min)


for _overload in (aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
                  aten.linspace.Scalar_Tensor):
    _register(_overload)(_linspace)


_TORCH_LOGSPACE = decomposition_table[aten.logspace.default]


def _logspace(start: Any, end: Any, steps: int, base: float = 10.0, *, dtype: torch.dtype | None = None,
              **kwargs: Any) -> torch.Tensor:
    """As eager's CPU kernel for a real floating dtype: the bounds and their difference rounded
    to the dtype, the step, exponents and power in double, the second half counted back from
    ``end``, each value rounded once. torch's decomposition takes the bounds unrounded: a float32
    result differed from eager's by up to 4 ulp in 59 of 60 random ranges, a bfloat16 one in 58."""
    dtype = dtype or torch.get_default_dtype()
    if not dtype.is_floating_point or steps <= 1 or base < 0:
        return _TORCH_LOGSPACE(start, end, steps, base, dtype=dtype, **kwargs)
    device = kwargs.get("device")
    first, last = _bound_in(start, dtype, device, torch.float64), _bound_in(end, dtype, device, torch.float64)
    step = (last - first).to(dtype).to(torch.float64) / (steps - 1)
    index = torch.arange(steps, dtype=torch.float64, device=device)
    exponent = torch.where(index < steps // 2, first + step * index, last - step * (steps - 1 - index))
    return torch.pow(float(base), exponent).to(dtype)


for _overload in (aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
                  aten.logspace.Scalar_Tensor):
    _register(_overload)(_logspace)


def _half_as_float(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    return (half_in_float32(query.device, (query.dtype, key.dtype, value.dtype))
            and (mask is None or mask.dtype in (torch.float16, torch.float32)))


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _per_channel(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-(sample, channel) value broadcast over the spatial dims."""
    return t.reshape(*t.shape, *([1] * (ndim - 2)))


def _channels(t: torch.Tensor, n: Any, c: Any) -> torch.Tensor:
    """(N, G), (N, G, 1) or (N, G, C/G) values as one per channel, (N, C), stored (as torch's
    decomposition does: read through the expansion, a channel's index would be divided by
    C/G in every element's load of the pointwise pass, splitting its channel loop in two)."""
    group = t.shape[1]
    t = t.unsqueeze(-1) if t.dim() == 2 else t
    return t.expand(n, group, c // group).contiguous().as_strided((n, c), (c, 1))


def _channels_last_likely(t: torch.Tensor, hops: int = 3) -> bool:
    """Whether a 4-d input will be stored channels-last where the graph is lowered: it is so
    already, or it comes from a convolution (which minductor runs channels-last) through at
    most ``hops`` ops. Otherwise torch's decomposition suits it better: each group a row,
    reduced and normalized in one kernel that reads the row again from cache ((16, 64, 56, 56)
    NCHW: 0.19-0.29 ms; through channel statistics and a second pass, 0.33-0.50)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

    if t.dim() != 4:
        return False
    if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return True
    mode = get_proxy_mode()
    slot = get_proxy_slot(t, mode.tracer, None) if mode is not None else None
    node = getattr(getattr(slot, "proxy", None), "node", None)
    for _ in range(hops):
        if node is None or node.op != "call_function":
            return False
        if node.target is aten.convolution.default:
            return True
        node = next((a for a in node.args if isinstance(a, torch.fx.Node)), None)
    return False


@_register(aten.native_group_norm.default)
def _group_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: Any, c: Any,
                hxw: Any, group: int, eps: float) -> Any:
    """Group norm by the layout the input will have when lowered (``_channels_last_likely``):
    - channels-last: each channel's statistics first (a reduction over the spatial dims, which
      reads the input along its channels), then each group's from its channels' (equal counts:
      the group's variance is the mean of its channels' variances plus the variance of their
      means, no cancellation); every tensor stays (N, C, *spatial), so the output takes the
      input's layout. torch's decomposition reduces a view (N, G, C/G, H*W): over a
      channels-last input, runs of C/G values 4*C bytes apart (1.0 ms for (8, 64, 64, 64), 8%
      of the bandwidth);
    - otherwise each group a row, reduced and normalized (weight and bias per channel of the
      row) in one kernel."""
    if input.dim() < 3:
        return torch._decomp.decomposition_table[aten.native_group_norm.default](
            input, weight, bias, n, c, hxw, group, eps)
    x = input.to(_acc_dtype(input.dtype))
    if not _channels_last_likely(input):
        # each group a row, normalized as a row (weight and bias per channel of it): one kernel
        # (torch's CPU formula stores a per-channel scale and shift first: a second pass)
        rows = x.reshape(n, group, c // group, -1)
        var, mean = torch.var_mean(rows, dim=[2, 3], correction=0, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        out = (rows - mean) * rstd
        if weight is not None:
            out = out * weight.view(1, group, c // group, 1)
        if bias is not None:
            out = out + bias.view(1, group, c // group, 1)
        return (out.view(input.shape).to(input.dtype), mean.view(n, group).to(input.dtype),
                rstd.view(n, group).to(input.dtype))
    var_c, mean_c = torch.var_mean(x, dim=list(range(2, input.dim())), correction=0)
    means = mean_c.view(n, group, c // group)
    mean = means.mean(-1)
    var = (var_c.view(n, group, c // group) + (means - mean.unsqueeze(-1)).square()).mean(-1)
    rstd = torch.rsqrt(var + eps)
    scale = rstd.unsqueeze(-1) if weight is None else rstd.unsqueeze(-1) * weight.view(1, group, c // group)
    shift = -mean.unsqueeze(-1) * scale
    if bias is not None:
        shift = shift + bias.view(1, group, c // group)
    out = x * _per_channel(_channels(scale, n, c), input.dim()) + _per_channel(_channels(shift, n, c), input.dim())
    return out.to(input.dtype), mean.to(input.dtype), rstd.to(input.dtype)


@_register(aten.native_group_norm_backward.default)
def _group_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                         gamma: torch.Tensor | None, n: Any, c: Any, hxw: Any, group: int,
                         output_mask: list[bool]) -> Any:
    """torch's formulas, every tensor (N, C, *spatial) or per channel: the input gradient is one
    pointwise pass in the input's layout (torch's computes it as (N, G, C/G, H*W), contiguous
    whatever the input's layout: a transposing pass before a channels-last convolution's
    backward)."""
    if input.dim() < 3:
        return torch._decomp.decomposition_table[aten.native_group_norm_backward.default](
            grad_output, input, mean, rstd, gamma, n, c, hxw, group, output_mask)
    acc = _acc_dtype(input.dtype)
    dy, x, mean, rstd = grad_output.to(acc), input.to(acc), mean.to(acc), rstd.to(acc)
    gamma = gamma.to(acc) if gamma is not None else None
    cpg, spatial = c // group, list(range(2, input.dim()))
    ds = (dy * x).sum(spatial)  # (N, C)
    db = dy.sum(spatial)
    d_input = d_gamma = d_bias = None
    if output_mask[0]:
        s = 1.0 / (hxw * cpg)
        g = gamma.view(1, group, cpg) if gamma is not None else None
        ds_val = (ds.view(n, group, cpg) * g if g is not None else ds.view(n, group, cpg)).sum(2)
        db_val = (db.view(n, group, cpg) * g if g is not None else db.view(n, group, cpg)).sum(2)
        c1 = rstd.unsqueeze(-1) * g if g is not None else rstd
        c2 = (db_val * mean - ds_val) * rstd * rstd * rstd * s
        c3 = -c2 * mean - db_val * rstd * s
        d_input = (dy * _per_channel(_channels(c1, n, c), input.dim()) + x * _per_channel(_channels(c2, n, c), input.dim())
                   + _per_channel(_channels(c3, n, c), input.dim())).to(input.dtype)
    if output_mask[1]:
        d_gamma = ((ds.view(n, group, cpg) - db.view(n, group, cpg) * mean.unsqueeze(-1)) * rstd.unsqueeze(-1)) \
            .sum(0).reshape(c).to(input.dtype)
    if output_mask[2]:
        d_bias = db.sum(0).to(input.dtype)
    return d_input, d_gamma, d_bias


# ``aten._foreach_*`` (EMA updates, foreach optimizers, ``clip_grad_norm_``): one op per tensor,
# each lowered and fused as any other (the aten op was a fallback whose outputs all
# materialized: an in-place lerp over 12 tensors took three list ops and 12 copies, 2.4 ms
# against eager's 0.22). ``powsum`` and the ``.Tensor`` forms of addcmul and addcdiv stay aten ops.
_FOREACH_UNARY = ("abs", "acos", "asin", "atan", "ceil", "clone", "cos", "cosh", "erf", "erfc", "exp", "expm1",
                  "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round",
                  "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc")
_FOREACH_BINARY = ("add", "sub", "mul", "div", "pow", "clamp_min", "clamp_max", "lerp", "copy", "mm")
_FOREACH_SPECIAL: dict[str, Callable[..., Any]] = {
    "maximum": lambda a, b: aten.maximum(a, b) if isinstance(b, torch.Tensor) else aten.clamp_min(a, b),
    "minimum": lambda a, b: aten.minimum(a, b) if isinstance(b, torch.Tensor) else aten.clamp_max(a, b),
    "addcmul": lambda a, b, c, value=1: aten.addcmul(a, b, c, value=value),  # (value keyword-only there)
    "addcdiv": lambda a, b, c, value=1: aten.addcdiv(a, b, c, value=value),
    "norm": lambda a, ord=2, dtype=None: aten.linalg_vector_norm(a, ord, dtype=dtype),
    "zero": lambda a: aten.zeros_like(a),
}


def _per_tensor(overload: Any, op: Callable[..., Any]) -> Callable[..., Any]:
    arguments = overload._schema.arguments
    listed = [isinstance(a.type, torch.ListType) for a in arguments]

    def decompose(*args: Any, **kwargs: Any) -> list[Any]:
        values = [args[k] if k < len(args) else kwargs.get(a.name, a.default_value) for k, a in enumerate(arguments)]
        count = len(next(v for v, is_list in zip(values, listed) if is_list))
        out = []
        for i in range(count):
            positional, keywords = [], {}
            for a, v, is_list in zip(arguments, values, listed):
                v = v[i] if is_list else v
                if a.kwarg_only:
                    keywords[a.name] = v
                else:
                    positional.append(v)
            out.append(op(*positional, **keywords))
        return out

    return decompose


def _register_foreach() -> None:
    for name in _FOREACH_UNARY + _FOREACH_BINARY + tuple(_FOREACH_SPECIAL):
        packet = getattr(aten, f"_foreach_{name}")
        op = _FOREACH_SPECIAL.get(name, getattr(aten, name))
        for overload_name in packet.overloads():
            # (``addcmul.Tensor``: its values a 1-d tensor, which Dynamo cannot trace: left alone)
            if not overload_name.endswith("out") and not (name in ("addcmul", "addcdiv") and overload_name == "Tensor"):
                overload = getattr(packet, overload_name)
                DECOMPOSITIONS[overload] = _per_tensor(overload, op)


_register_foreach()
