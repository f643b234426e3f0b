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

aten = torch.ops.aten

DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}


def _register(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        DECOMPOSITIONS[op] = fn
        return fn

    return wrap


@_register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                    scale: float | None = None) -> Any:
    """(output, logsumexp) as the CPU flash-attention kernel gives them, also for rows that
    are masked out entirely (output 0, log-sum-exp 0, so the backward's probabilities are 0).
    Other cases (dropout, grouped-query heads, half precision with its float log-sum-exp)
    stay the aten op."""
    if (dropout_p != 0.0 or query.dtype not in (torch.float32, torch.float64) or query.dim() != 4
            or key.dim() != 4 or value.dim() != 4 or key.size(1) != query.size(1) or value.size(1) != query.size(1)):
        return NotImplemented
    length, source = query.size(-2), key.size(-2)
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
