"""The standard workloads of the benchmark suite (CPU, float32)."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

N = 4096


def pointwise6(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x.sin() + 1) * 2).exp().relu() - y


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def layer_norm_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x + r, (x.shape[-1],), w, b)


def sum_dim0(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def amax_dim0(x: torch.Tensor) -> torch.Tensor:
    return x.amax(0)


def transpose_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.t() + y


def full_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum()


class Block(torch.nn.Module):
    """A GPT-style transformer block (pre-norm, causal attention, GELU MLP)."""

    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


def _block() -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
    torch.manual_seed(0)
    model = Block().eval()
    return model, lambda: (torch.randn(8, 128, 256),)


def _square(n: int = N) -> torch.Tensor:
    return torch.randn(n, n)


WORKLOADS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    "pointwise6": (pointwise6, lambda: (_square(), _square())),
    "softmax": (softmax, lambda: (_square(),)),
    "layer_norm": (layer_norm, lambda: (_square(), torch.randn(N), torch.randn(N))),
    "layer_norm_residual": (layer_norm_residual, lambda: (_square(), _square(), torch.randn(N), torch.randn(N))),
    "sum_dim0": (sum_dim0, lambda: (_square(),)),
    "amax_dim0": (amax_dim0, lambda: (_square(),)),
    "transpose_add": (transpose_add, lambda: (_square(), _square())),
    "full_sum": (full_sum, lambda: (_square(),)),
    "transformer_block": _block(),
}
