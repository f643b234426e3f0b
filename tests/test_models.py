"""Small whole models against eager: forward under no_grad, and backward (every parameter's .grad)
for a compiled and an eager copy with identical weights.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minductor import metrics

TOL = {"rtol": 1e-4, "atol": 1e-4}


class MLP(nn.Module):
    """Pre-norm residual MLP: x + fc2(gelu(fc1(layer_norm(x))))."""

    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class CausalAttention(nn.Module):
    """Multi-head causal self-attention written with matmuls, masked_fill and softmax."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class ConvNet(nn.Module):
    """Conv2d -> BatchNorm2d -> ReLU -> Conv2d -> ReLU -> global mean pool -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


def _model(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), torch.randn(4, 10, 32)
    if name == "attention":
        return CausalAttention(), torch.randn(2, 9, 32)
    model = ConvNet()
    with torch.no_grad():  # non-trivial running stats so eval-mode BatchNorm is not an identity
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.2, 0.2)
    return model, torch.randn(2, 3, 12, 12)


@pytest.mark.parametrize("name", ["mlp", "attention", "convnet"])
def test_forward_no_grad(name: str) -> None:
    model, x = _model(name)
    model.eval()
    with torch.no_grad():
        expected = model(x)
        actual = torch.compile(model, backend="minductor")(x)
    torch.testing.assert_close(actual, expected, **TOL)
    assert metrics.graphs_compiled >= 1
    assert metrics.generated_kernel_count >= 1


def test_attention_forward_noncontiguous_input() -> None:
    model, x = _model("attention")
    x = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, (t, b, c)-major memory
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="minductor")(x), model(x), **TOL)


@pytest.mark.parametrize("name", ["mlp", "attention"])
def test_backward_matches_eager(name: str) -> None:
    eager_model, x = _model(name)
    compiled_model = copy.deepcopy(eager_model)
    x_eager = x.clone().requires_grad_(True)
    x_comp = x.clone().requires_grad_(True)
    target = torch.randn_like(x)

    loss_eager = F.mse_loss(eager_model(x_eager), target)
    loss_eager.backward()
    loss_comp = F.mse_loss(torch.compile(compiled_model, backend="minductor")(x_comp), target)
    loss_comp.backward()

    torch.testing.assert_close(loss_comp, loss_eager, **TOL)
    torch.testing.assert_close(x_comp.grad, x_eager.grad, **TOL)
    params_eager = dict(eager_model.named_parameters())
    for pname, param in compiled_model.named_parameters():
        assert param.grad is not None, pname
        torch.testing.assert_close(param.grad, params_eager[pname].grad, **TOL, msg=lambda m, n=pname: f"{n}: {m}")
    assert metrics.graphs_compiled >= 2  # a forward and a backward graph


def test_convnet_train_mode_backward() -> None:
    """Training-mode BatchNorm (batch statistics, running-stat updates) with gradients."""
    eager_model, x = _model("convnet")
    compiled_model = copy.deepcopy(eager_model)
    eager_model.train()
    compiled_model.train()
    eager_model(x).square().mean().backward()
    torch.compile(compiled_model, backend="minductor")(x).square().mean().backward()
    params_eager = dict(eager_model.named_parameters())
    for pname, param in compiled_model.named_parameters():
        torch.testing.assert_close(param.grad, params_eager[pname].grad, **TOL, msg=lambda m, n=pname: f"{n}: {m}")
    torch.testing.assert_close(compiled_model.bn.running_mean, eager_model.bn.running_mean, **TOL)
    torch.testing.assert_close(compiled_model.bn.running_var, eager_model.bn.running_var, **TOL)


def test_optimizer_steps_match() -> None:
    """Three SGD steps through the compiled MLP keep its weights equal to eager's."""
    eager_model, x = _model("mlp")
    compiled_model = copy.deepcopy(eager_model)
    compiled_fn = torch.compile(compiled_model, backend="minductor")
    opt_e = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=0.1)
    for _ in range(3):
        for model, fn, opt in ((eager_model, eager_model, opt_e), (compiled_model, compiled_fn, opt_c)):
            opt.zero_grad()
            fn(x).pow(2).mean().backward()
            opt.step()
    for (pname, pc), pe in zip(compiled_model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(pc, pe, **TOL, msg=lambda m, n=pname: f"{n}: {m}")
