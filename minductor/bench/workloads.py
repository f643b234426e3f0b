"""The standard workloads of the benchmark suite (CPU, float32)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _block(batch: int = 8, seq: int = 128, dim: int = 256):
    def make() -> tuple[Any, ...]:
        torch.manual_seed(0)
        return (torch.randn(batch, seq, dim),)

    torch.manual_seed(0)
    return Block(dim=dim, heads=4).eval(), make


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.c2(F.relu(self.bn(self.c1(x))))).mean((2, 3))


class GeluMLP(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def decode_mlp(dim: int, layers: int = 4) -> torch.nn.Module:
    """A decoding step's feed-forward layers at batch 2 (``dim`` -> 4 ``dim`` -> ``dim``, GELU):
    each linear layer two rows times a weight matrix that comes from memory, read once."""
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                     torch.nn.Linear(4 * dim, dim)) for _ in range(layers)]).eval()


def _indexing_workloads(n: int) -> dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
    """Indirect reads and writes, windows and scans (issue 4's op families) at size ``n``."""
    cols, rows = max(n // 4, 4), max(n // 16, 4)

    def table() -> torch.Tensor:
        return torch.randn(n, n)

    def index(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape)

    def image() -> torch.Tensor:  # (batch, channels, h, w): 32 MB at n = 4096
        return torch.randn(8, 64, n // 32, n // 32)

    return {
        "gather": (lambda x, i: torch.gather(x, 1, i), lambda: (table(), index(n, n, cols))),
        "embedding": (F.embedding, lambda: (index(n * 8, n * 2), torch.randn(n * 8, rows * 4))),
        "index_select": (lambda x, i: x.index_select(0, i) * 2, lambda: (table(), index(n, n))),
        "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s), lambda: (table(), index(n, n, cols), torch.randn(n, cols))),
        "index_put_acc": (lambda x, i, v: x.index_put((i,), v, accumulate=True),
                          lambda: (torch.randn(n, rows * 4), index(n, n * 2), torch.randn(n * 2, rows * 4))),
        "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), lambda: (image(),)),
        "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1), lambda: (image(),)),
        "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 7), lambda: (image(),)),
        "constant_pad": (lambda x: F.pad(x, (1, 1, 1, 1)) * 2, lambda: (image(),)),
        "cumsum": (lambda x: x.cumsum(1), lambda: (table(),)),
        "upsample_nearest": (lambda x: F.interpolate(x, scale_factor=2), lambda: (image(),)),
        "upsample_bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), lambda: (image(),)),
    }


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention's masked softmax over scores, with a bool mask the model keeps as a buffer."""
    return (scores * 0.125).masked_fill(~mask, float("-inf")).softmax(-1)


def _dtype_workloads(n: int) -> dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
    """Loops over bools and 16-bit floats, which GCC 12 left scalar or narrow until the kernels
    sized their lanes to a vector of them and stored half as bits (codegen/loop_shapes.narrow_lanes)."""
    seq = max(n // 32, 8)

    def causal() -> torch.Tensor:
        return torch.ones(seq, seq, dtype=torch.bool).tril()

    return {
        "masked_softmax": (masked_softmax, lambda: (torch.randn(8, 4, seq, seq), causal())),
        "half_softmax": (softmax, lambda: (torch.randn(n, n).half(),)),
        "bf16_layer_norm": (layer_norm, lambda: (torch.randn(n, n).bfloat16(), torch.randn(n).bfloat16(), torch.randn(n).bfloat16())),
        "masked_row_sum": (lambda x, m: x.masked_fill(m, 0.0).sum(-1), lambda: (torch.randn(n, n), torch.rand(n, n) > 0.5)),
    }


def make_workloads(n: int = N) -> dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
    """The standard workloads at size ``n`` (4096 is the full suite; small values for CI)."""

    def square() -> torch.Tensor:
        return torch.randn(n, n)

    small = max(n // 32, 2)
    torch.manual_seed(0)
    conv = ConvNet().eval()
    mlp = GeluMLP(max(n // 16, 8)).eval()
    decode = decode_mlp(max(n // 4, 8))
    return {
        "pointwise6": (pointwise6, lambda: (square(), square())),
        "broadcast_add": (lambda x, b: (x + b).relu(), lambda: (square(), torch.randn(n))),
        "transpose_add": (transpose_add, lambda: (square(), square())),
        "softmax": (softmax, lambda: (square(),)),
        "layer_norm": (layer_norm, lambda: (square(), torch.randn(n), torch.randn(n))),
        "layer_norm_residual": (layer_norm_residual, lambda: (square(), square(), torch.randn(n), torch.randn(n))),
        "sum_dim0": (sum_dim0, lambda: (square(),)),
        "sum_dim1": (lambda x: x.sum(1), lambda: (square(),)),
        "amax_dim0": (amax_dim0, lambda: (square(),)),
        "full_sum": (full_sum, lambda: (square(),)),
        "gelu_mlp": (mlp, lambda: (torch.randn(small * 8, max(n // 16, 8)),)),
        "conv_net": (conv, lambda: (torch.randn(2, 3, small * 2, small * 2),)),
        "transformer_block": _block(seq=max(n // 32, 8), dim=max(n // 16, 16)),
        "decode_mlp": (decode, lambda: (torch.randn(2, max(n // 4, 8)),)),
    } | _indexing_workloads(n) | _dtype_workloads(n)


WORKLOADS = make_workloads()

SUITES: dict[str, tuple[int, list[str]]] = {
    "pointwise": (N, ["pointwise6", "broadcast_add", "transpose_add"]),
    "reductions": (N, ["softmax", "layer_norm", "layer_norm_residual", "sum_dim0", "sum_dim1", "amax_dim0", "full_sum"]),
    "models": (N, ["gelu_mlp", "conv_net", "transformer_block", "decode_mlp"]),
    "indexing": (N, list(_indexing_workloads(64))),
    "dtypes": (N, list(_dtype_workloads(64))),
    "all": (N, list(WORKLOADS)),
    "tiny": (64, ["pointwise6", "transpose_add", "softmax", "sum_dim0", "gelu_mlp", "gather", "max_pool2d"]),  # for CI
}
