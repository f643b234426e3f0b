"""Random small convolutional networks, forward and backward, against eager with an fp64 referee:
convolutions (strided, dilated, transposed, depthwise), batch/group/instance/layer norms, max/avg/
adaptive pools, max-unpool, interpolation, pixel shuffle, pads, activations and a loss head, each
drawn with random shapes; a second test compiles them with dynamic shapes.

Over symbolic sizes they found interpolation sizes in float arithmetic (``TruncToInt(1.5*ToFloat(s0))``)
reaching the C++ printer and a symbolic element count as a fill value (an MSE loss's and a group
norm's backward); the symbolic seeds below are chains that failed so.

Not in the seed lists: eager PyTorch 2.13's instance_norm gradient is wrong around channels-last
layouts at batch size 1 (seed 185: 8e-3 off central finite differences, where minductor matches
them to 6e-11), and a max-pool after an unpool and an interpolation can pick another of two nearly
equal values (seed 126).
"""
from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_random_dags import _close


class _LayerNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:])


class _PoolUnpool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < 2:
            return x
        y, i = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(y, i, 2, output_size=x.shape[-2:])


class _Interpolate(nn.Module):
    def __init__(self, mode: str, scale: float, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.scale, self.align_corners = mode, scale, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kw = {"align_corners": self.align_corners} if self.mode in ("bilinear", "bicubic") else {}
        return F.interpolate(x, scale_factor=self.scale, mode=self.mode, **kw)


class _Pad(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode != "constant" and min(x.shape[-2:]) < 3:
            return x
        return F.pad(x, [1, 2, 2, 1], mode=self.mode)


class _ChannelsLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) * 1.0


class _Net(nn.Module):
    def __init__(self, body: nn.Sequential, head: str) -> None:
        super().__init__()
        self.body, self.head = body, head
        self.lin = nn.LazyLinear(5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.body(x)
        if self.head == "mean":
            return (y.mean() + (y**2).mean(),)
        if self.head == "ce":
            target = (t * 0).long() if y.shape[1] == 1 else (t.abs() * 7).long().clamp(0, y.shape[1] - 1)[:, 0]
            return (F.cross_entropy(y, target, label_smoothing=0.1),)
        if self.head == "mse":
            return F.mse_loss(y, torch.zeros_like(y)), y
        if self.head == "flatten_linear":
            return (self.lin(y.flatten(1)),)
        if self.head == "logsoftmax":
            return (y.log_softmax(1).sum(),)
        if self.head == "smoothl1":
            return (F.smooth_l1_loss(y, y.detach().flip(-1)),)
        return (F.binary_cross_entropy_with_logits(y, torch.sigmoid(y.detach() * 2)),)


def _layer(kind: str, c: int, rng: random.Random) -> tuple[nn.Module | None, int]:
    """A layer of ``kind`` over ``c`` channels, and the channels after it."""
    if kind == "conv":
        co, k = rng.choice([2, 4, 6]), rng.choice([1, 2, 3])
        stride, padding, dilation = rng.choice([1, 2]), rng.choice([0, 1]), rng.choice([1, 1, 2])
        return nn.Conv2d(c, co, k, stride=stride, padding=padding, dilation=dilation, bias=rng.random() < 0.5), co
    if kind == "convT":
        co = rng.choice([2, 4])
        return nn.ConvTranspose2d(c, co, rng.choice([2, 3]), stride=rng.choice([1, 2]), padding=rng.choice([0, 1])), co
    if kind == "depthwise":
        return nn.Conv2d(c, c, 3, padding=1, groups=c), c
    if kind == "bn":
        return nn.BatchNorm2d(c), c
    if kind == "gn":
        return nn.GroupNorm(rng.choice([d for d in (1, 2, 4) if c % d == 0]), c), c
    if kind == "in":
        return nn.InstanceNorm2d(c, affine=rng.random() < 0.5), c
    if kind == "ln":
        return _LayerNorm(), c
    if kind == "maxpool":
        return nn.MaxPool2d(rng.choice([2, 3]), stride=rng.choice([1, 2]), padding=rng.choice([0, 1]),
                            ceil_mode=rng.random() < 0.3), c
    if kind == "maxpool_idx":
        return _PoolUnpool(), c
    if kind == "avgpool":
        return nn.AvgPool2d(rng.choice([2, 3]), stride=rng.choice([1, 2]), padding=rng.choice([0, 1]),
                            ceil_mode=rng.random() < 0.3, count_include_pad=rng.random() < 0.5), c
    if kind == "adapt":
        return rng.choice([nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d])((rng.randrange(1, 5), rng.randrange(1, 5))), c
    if kind == "interp":
        mode = rng.choice(["nearest", "bilinear", "bicubic", "nearest-exact"])
        return _Interpolate(mode, rng.choice([0.5, 1.5, 2.0]), rng.random() < 0.5), c
    if kind == "upsample_bilinear":
        size = (rng.randrange(2, 9), rng.randrange(2, 9))
        return nn.Upsample(size=size, mode="bilinear", align_corners=True), c
    if kind == "act":
        return rng.choice([nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Hardswish(), nn.ELU(), nn.LeakyReLU(0.1), nn.Tanh(),
                           nn.Mish(), nn.Softplus(), nn.Hardsigmoid(), nn.ReLU6(), nn.PReLU()]), c
    if kind == "dropout0":
        return nn.Dropout(0.0), c
    if kind == "pixel":
        return (nn.PixelShuffle(2), c // 4) if c % 4 == 0 else (None, c)
    if kind == "pad":
        return _Pad(rng.choice(["constant", "reflect", "replicate", "circular"])), c
    if kind == "lrn":
        return nn.LocalResponseNorm(2), c
    return _ChannelsLast(), c


KINDS = ["conv", "convT", "bn", "gn", "ln", "in", "maxpool", "avgpool", "adapt", "interp", "act", "dropout0", "pixel",
         "pad", "depthwise", "maxpool_idx", "lrn", "upsample_bilinear", "channels_last"]


def random_network(seed: int) -> tuple[_Net, torch.Tensor]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    n, c = rng.choice([1, 2, 3]), rng.choice([1, 3, 4, 8])
    h, w = rng.randrange(3, 14), rng.randrange(3, 14)
    layers, channels = [], c
    for _ in range(rng.randrange(2, 6)):
        layer, channels = _layer(rng.choice(KINDS), channels, rng)
        if layer is not None:
            layers.append(layer)
    head = rng.choice(["mean", "ce", "mse", "flatten_linear", "logsoftmax", "smoothl1", "bce"])
    return _Net(nn.Sequential(*layers), head), torch.randn(n, c, h, w)


def _run(seed: int, dynamic: bool) -> None:
    net, x = random_network(seed)
    t = torch.randn(x.shape[0], 1, *x.shape[2:])
    net(x, t)  # (initializes the lazy linear layer)
    mine, theirs, wide = copy.deepcopy(net), copy.deepcopy(net), copy.deepcopy(net).double()
    x1, x2, x64 = x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()
    torch._dynamo.reset()
    got = torch.compile(mine, backend="minductor", dynamic=dynamic)(x1, t)
    eager, fp64 = theirs(x2, t), wide(x64, t.double())
    for i, (g, e, w) in enumerate(zip(got, eager, fp64)):
        _close(g.detach(), e.detach(), w.detach(), f"seed {seed}, output {i}")
    weights = [torch.randn(e.shape) for e in eager]
    for outs in (got, eager, fp64):
        sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights)).backward()
    _close(x1.grad, x2.grad, x64.grad, f"seed {seed}, input gradient")
    for (name, p1), p2, p64 in zip(mine.named_parameters(), theirs.parameters(), wide.parameters()):
        if p2.grad is not None:
            _close(p1.grad, p2.grad, p64.grad, f"seed {seed}, gradient of {name}")
    for (name, b1), b2 in zip(mine.named_buffers(), theirs.buffers()):
        if b2.is_floating_point():  # batch norm's running statistics
            _close(b1, b2, b2.double(), f"seed {seed}, buffer {name}")


# (seeds 3, 12 and 13 draw networks eager rejects: the cross-entropy target does not fit the body's output)
@pytest.mark.parametrize("seed", [s for s in range(27) if s not in (3, 12, 13)])
def test_random_network_matches_eager_forward_and_backward(seed: int) -> None:
    _run(seed, dynamic=False)


@pytest.mark.parametrize("seed", [0, 2, 4, 11, 19, 22])  # (each failed to compile once)
def test_random_network_over_symbolic_sizes_matches_eager(seed: int) -> None:
    _run(seed, dynamic=True)
