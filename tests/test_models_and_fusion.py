"""Whole models against eager, fusion kernel counts, and fallbacks for ops without lowerings."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minductor import config, metrics
from minductor.bench.workloads import Block

# every test runs with the C++ and the Triton (interpreter) code generator
pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(64), nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3, stride=2)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.c2(F.relu(self.bn(self.c1(x))))).mean((2, 3))).log_softmax(-1)


@pytest.mark.parametrize("model,shape", [
    (MLP(), (4, 10, 64)),
    (Block(dim=64, heads=4), (2, 33, 64)),
    (ConvNet(), (2, 3, 16, 16)),
], ids=["mlp", "softmax_attention_block", "conv_net"])
def test_models_match_eager(model: nn.Module, shape: tuple[int, ...]) -> None:
    model.eval()
    x = torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="minductor")(x), model(x), rtol=1e-4, atol=1e-4)
    assert not metrics.fallback_ops, metrics.fallback_ops


def one_graph_kernels(fn, *args) -> int:
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(*args), fn(*args), rtol=1e-5, atol=1e-5)
    assert metrics.graphs_compiled == 1
    return metrics.kernels_by_backend[config.cpu_backend]


def test_six_op_pointwise_chain_is_one_kernel() -> None:
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    assert one_graph_kernels(lambda x, y: ((x.sin() + 1) * 2).exp().relu() - y, x, y) == 1


def test_pointwise_prologue_fuses_into_reduction() -> None:
    assert one_graph_kernels(lambda x: (x.sin() + 1).relu().sum(-1), torch.randn(32, 100)) == 1


@pytest.mark.parametrize("fn", [
    lambda x, w, b: torch.softmax(x, -1),
    lambda x, w, b: torch.log_softmax(x, -1),
    lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    lambda x, w, b: F.layer_norm(x + b, (x.shape[-1],), w, b) + x,
    lambda x, w, b: (x.sum(0), x.amax(0)),
    lambda x, w, b: (x.exp(), x.sin(), x.cos()),
], ids=["softmax", "log_softmax", "layer_norm", "layer_norm_residual", "siblings_sum_amax_dim0", "siblings_pointwise"])
def test_one_kernel_each(fn) -> None:
    assert one_graph_kernels(fn, torch.randn(48, 96), torch.randn(96), torch.randn(96)) == 1


@pytest.mark.parametrize("fn,name", [
    (lambda x: torch.linalg.inv(x + 4 * torch.eye(x.shape[0])) @ x, "aten.linalg_inv_ex"),
    (lambda x: torch.sort(x * 2, -1)[0] + 1, "aten.sort"),
    (lambda x: torch.kthvalue(x.exp() + 1, 2, 0).values * 2, "aten.kthvalue"),
], ids=["linalg_inv", "sort", "kthvalue"])
def test_ops_without_lowering_fall_back_and_are_counted(fn, name: str) -> None:
    x = torch.randn(5, 5)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), rtol=1e-4, atol=1e-4)
    assert metrics.fallback_ops[name] >= 1, metrics.fallback_ops
    assert metrics.generated_kernel_count >= 1  # the lowered ops around it still become kernels


def test_complex_dtype_falls_back_instead_of_wrong_code() -> None:
    z = torch.randn(6, dtype=torch.complex64)
    fn = lambda z: (z * z + 1).abs() * 2
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(z), fn(z))
    assert sum(metrics.fallback_ops.values()) >= 1
