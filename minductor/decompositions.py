"""Decompositions of our own, where torch's table has none we can use.

``aten._scaled_dot_product_flash_attention_for_cpu``: torch's decomposition returns the
attention probabilities where the op returns the log-sum-exp of each row. That is harmless in
an inference graph, which drops the second output, but in training AOTAutograd saves it for
``_scaled_dot_product_flash_attention_for_cpu_backward``, which then computes wrong gradients
for the query, key and value. Ours computes the same softmax (one fused kernel) and returns
the true log-sum-exp, so the aten backward gets what the op itself would have given it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

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
    probs = torch.where(masked_row, 0.0, exp / total)
    logsumexp = torch.where(masked_row, 0.0, row_max + torch.log(total)).squeeze(-1)
    return torch.matmul(probs, value), logsumexp


def _half_as_float(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    return (half_in_float32(query.device, (query.dtype, key.dtype, value.dtype))
            and (mask is None or mask.dtype in (torch.float16, torch.float32)))
