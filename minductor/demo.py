"""``python -m minductor.demo``: compile a GPT-style transformer block and compare with eager.

The backend is found by name through its entry point; nothing here registers it.
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.benchmark import Timer

from minductor import config, metrics

EMBED, HEADS, SEQ, BATCH = 128, 8, 512, 4


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int = EMBED, heads: int = HEADS, seq: int = SEQ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, seq)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _median_ms(fn: object, x: torch.Tensor) -> float:
    # Timer defaults to one thread; keep torch's setting (a change would also recompile)
    timer = Timer(stmt="fn(x)", globals={"fn": fn, "x": x}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=0.2).median * 1e3


def _best_of(fns: list[object], x: torch.Tensor, rounds: int = 3) -> list[float]:
    """Median time of each fn, interleaved and best of ``rounds`` to damp a noisy machine."""
    times = [[_median_ms(fn, x) for fn in fns] for _ in range(rounds)]
    return [min(column) for column in zip(*times)]


def main() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(BATCH, SEQ, EMBED)
    debug_dir = os.path.abspath(config.debug_dir)
    with torch.no_grad(), config.patch(debug=True, debug_dir=debug_dir):
        expected = model(x)
        compiled = torch.compile(model, backend="minductor")
        t0 = time.perf_counter()
        actual = compiled(x)
        compile_s = time.perf_counter() - t0
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        eager_ms, compiled_ms = _best_of([model, compiled], x)
    print(f"GPT block (batch {BATCH}, seq {SEQ}, dim {EMBED}, {HEADS} heads): matches eager (rtol/atol 1e-4)")
    print(f"eager:      {eager_ms:8.3f} ms")
    print(f"minductor:  {compiled_ms:8.3f} ms")
    print(f"speedup:    {eager_ms / compiled_ms:8.2f}x")
    print(f"compile:    {compile_s:8.2f} s (first call)")
    print(f"kernels generated: {metrics.generated_kernel_count}")
    print(f"aten fallbacks:    {dict(metrics.fallback_ops) or 'none'}")
    print(f"debug dump:        {debug_dir}")


if __name__ == "__main__":
    main()
