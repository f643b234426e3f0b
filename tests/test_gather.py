"""Indirect reads (advanced indexing, gather, take_along_dim, index_select, embedding)
lowered into fused kernels; out-of-range indices raise like eager."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import metrics

# every test runs with the C++ and the Triton (interpreter) code generator
pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


X = torch.randn(5, 6, 7)
CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "index_negative": (lambda x, i: x[i] * 2, (X, torch.tensor([0, -1, 3]))),
    "index_two_broadcast": (lambda x, i, j: x[i, j] + 1, (X, torch.tensor([[0], [4]]), torch.tensor([1, -2, 5]))),
    "index_middle_dim": (lambda x, i: x[:, i], (X, torch.tensor([[0, 1], [5, 2]]))),
    "index_separated": (lambda x, i: x[i, :, i], (X, torch.tensor([0, 3]))),
    "gather": (lambda x, i: torch.gather(x, 1, i), (X, torch.randint(0, 6, (5, 3, 7)))),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i, 2), (X, torch.randint(0, 7, (5, 6, 2)))),
    "index_select": (lambda x, i: torch.index_select(x, 2, i).exp(), (X, torch.tensor([6, 0, 0]))),
    "embedding": (lambda w, i: F.embedding(i, w).sum(-1), (torch.randn(10, 4), torch.tensor([[1, 9], [0, 0]]))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_indirect_reads_match_eager_without_fallback(name: str) -> None:
    fn, args = CASES[name]
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(*args), fn(*args))
    assert not metrics.fallback_ops, metrics.fallback_ops


def test_out_of_range_index_raises_index_error() -> None:
    fn = torch.compile(lambda x, i: x[i] * 2, backend="minductor")
    with pytest.raises(IndexError, match="index out of range"):
        fn(X, torch.tensor([0, 9]))


@pytest.mark.parametrize("fn", [
    lambda x: F.pad(x, (1, 2, 0, 1), value=0.5) * 2,
    lambda x: F.pad(x.exp(), (-1, 2)),
    lambda x: F.pad(x.long(), (1, 1, 1, 1, 1, 0), value=3),
    lambda x: F.pad(x.half(), (2, 0)).float(),
], ids=["constant", "negative_crop", "int_3d", "half"])
def test_constant_pad_is_a_masked_load(fn: Callable[..., Any]) -> None:
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x))
    assert not metrics.fallback_ops and metrics.generated_kernel_count == 1
