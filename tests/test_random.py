"""Random ops run through aten (fallbacks), so with ``config.fallback_random = True`` a
compiled function draws the same numbers as eager under the same seed, in the same order,
and leaves the generator in the same state.

The functions below keep arithmetic on random values to single ops: g++ contracts
``a * b + c`` into one fused multiply-add, which rounds once where eager rounds twice
(see the note on -ffp-contract in the OpInfo test's known failures).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import config, metrics

CASES: dict[str, Callable[[torch.Tensor], Any]] = {
    "rand": lambda x: torch.rand(3, 4) + x,
    "randn": lambda x: torch.randn(3, 4) * x,
    "randint": lambda x: torch.randint(0, 10, (3, 4)) + x,
    "rand_like": lambda x: torch.rand_like(x) * 2,
    "randn_like": lambda x: torch.randn_like(x).relu(),
    "randint_like": lambda x: torch.randint_like(x, 5),
    "bernoulli_tensor_p": lambda x: torch.bernoulli(x.sigmoid()),
    "bernoulli_scalar_p": lambda x: torch.bernoulli(x, 0.3),
    "bernoulli_inplace": lambda x: x.clone().bernoulli_(0.3),
    "dropout": lambda x: F.dropout(x, 0.4, training=True),
    "dropout2d": lambda x: F.dropout2d(x.view(1, 3, 4, 1), 0.4, training=True),
    "normal": lambda x: torch.normal(x, 1.0),
    "normal_inplace": lambda x: x.clone().normal_(),
    "uniform_inplace": lambda x: x.clone().uniform_(-1, 1),
    "exponential_inplace": lambda x: x.clone().exponential_(),
    "multinomial": lambda x: torch.multinomial(x.abs() + 0.1, 2),
    "randperm": lambda x: torch.randperm(7) + 1,
    "rrelu_training": lambda x: F.rrelu(x, training=True),
    "several_in_order": lambda x: (torch.rand(3, 4), torch.randn(2), F.dropout(x, 0.5), torch.randint(0, 9, (5,))),
}


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def _run(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, seed: int) -> tuple[Any, torch.Tensor]:
    """fn(x) under ``seed``, and the next number the generator gives afterwards."""
    torch.manual_seed(seed)
    out = fn(x)
    return out, torch.rand(4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bit_identical_to_eager(name: str) -> None:
    fn, x = CASES[name], torch.randn(3, 4)
    compiled = torch.compile(fn, backend="minductor", dynamic=False)
    with config.patch(fallback_random=True):
        for seed in (0, 1):  # first call compiles, second reuses the compiled graph
            out, after = _run(compiled, x, seed)
            ref, ref_after = _run(fn, x, seed)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
            torch.testing.assert_close(after, ref_after, rtol=0, atol=0)  # same generator state
    assert metrics.graphs_compiled >= 1


def test_different_seeds_differ() -> None:
    compiled = torch.compile(lambda x: torch.rand_like(x), backend="minductor")
    x = torch.empty(100)
    with config.patch(fallback_random=True):
        assert not torch.equal(_run(compiled, x, 0)[0], _run(compiled, x, 1)[0])


def test_dropout_training_step_matches_eager() -> None:
    """Forward and backward of a model with dropout: same masks, same gradients."""
    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    eager_model, compiled_model = model(), model()
    compiled = torch.compile(compiled_model, backend="minductor")
    x = torch.randn(5, 8)
    with config.patch(fallback_random=True):
        for step in range(2):
            torch.manual_seed(step)
            compiled(x).sum().backward()
            torch.manual_seed(step)
            eager_model(x).sum().backward()
    for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
