"""Dynamic shapes: one compiled graph serves many sizes, with SymPy sizes end to end."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minductor import metrics
from minductor.bench.workloads import Block


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_mlp_many_batch_sizes_one_graph() -> None:
    model = MLP().eval()
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for batch in [2, 3, 7, 16, 31, 64]:  # primes exercise vector and thread tails
            x = torch.randn(batch, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_transformer_block_batch_and_sequence_one_graph() -> None:
    torch.manual_seed(0)
    model = Block(dim=32, heads=2).eval()
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for batch, seq in [(2, 7), (3, 64), (5, 131), (2, 300), (64, 9)]:
            x = torch.randn(batch, seq, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_size_one_adds_at_most_one_specialized_graph() -> None:
    model = MLP().eval()
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for batch in [4, 1, 9, 1]:
            x = torch.randn(batch, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled <= 2


def test_automatic_dynamic_recompiles_once() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2, -1).sum(0)

    compiled = torch.compile(fn, backend="minductor")  # dynamic=None: static first, then dynamic
    for batch in [8, 13, 29, 41]:
        x = torch.randn(batch, 19)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-5)
    assert metrics.graphs_compiled == 2


@pytest.mark.parametrize("fn", [
    lambda x: (x.sin() + 1).relu().sum(-1),
    lambda x: x.reshape(-1).amax(0) + x.argmax(),
    lambda x: F.layer_norm(x, (x.shape[-1],)) * 2,
    lambda x: x.t() + 1,
    lambda x: x[1:, ::2].exp(),
    lambda x: torch.cat([x, x * 2], 0).mean(),
    lambda x: x.var(0, keepdim=True) - x,
], ids=["chain_sum", "reshape_amax_argmax", "layer_norm", "transpose", "slice_step", "cat_mean", "var"])
def test_symbolic_kernels_on_prime_sizes(fn) -> None:
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for rows, cols in [(5, 3), (11, 9), (23, 17)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_training_step_dynamic_batch() -> None:
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    for batch in [3, 8, 17]:
        x = torch.randn(batch, 32)
        eager(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    assert metrics.graphs_compiled == 2  # forward and backward, once each
