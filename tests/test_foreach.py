"""``torch._foreach_*`` ops are decomposed into one op per tensor of their lists and fused like
any other (they were aten fallbacks): results against eager, no fallback left."""
from __future__ import annotations

import pytest
import torch

from minductor import metrics

SIZES = [(64, 33), (17,), (5, 4, 3), ()]


def _tensors(seed: int, positive: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(s, generator=g) for s in SIZES]
    return [t.abs() + 0.5 for t in ts] if positive else ts


def _compiled_matches(fn, *args) -> None:
    torch._dynamo.reset()
    metrics.reset()
    def copies() -> list:
        return [[t.clone() for t in a] if isinstance(a, list) and isinstance(a[0], torch.Tensor) else a for a in args]
    expected = fn(*copies())
    got = torch.compile(fn, backend="minductor")(*copies())
    torch.testing.assert_close(got, expected)
    assert not [op for op in metrics.fallback_ops if "foreach" in op], metrics.fallback_ops
    assert metrics.generated_kernel_count > 0


UNARY = ["abs", "exp", "sqrt", "neg", "sigmoid", "log", "reciprocal", "tanh", "trunc", "sign", "erf", "frac"]


@pytest.mark.parametrize("name", UNARY)
def test_unary(name: str) -> None:
    op = getattr(torch, f"_foreach_{name}")
    _compiled_matches(lambda xs: op(xs), _tensors(0, positive=True))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "clamp_min", "clamp_max"])
@pytest.mark.parametrize("kind", ["List", "Scalar", "ScalarList"])
def test_binary(name: str, kind: str) -> None:
    op = getattr(torch, f"_foreach_{name}")
    other = {"List": _tensors(1, positive=True), "Scalar": 1.5, "ScalarList": [0.5, 2.0, -1.0, 3.0]}[kind]
    _compiled_matches(lambda xs, ys: op(xs, ys), _tensors(0, positive=True), other)


def test_with_alpha_and_one_tensor_for_all() -> None:
    _compiled_matches(lambda xs, ys: torch._foreach_add(xs, ys, alpha=-0.3), _tensors(0), _tensors(1))
    _compiled_matches(lambda xs, t: torch._foreach_mul(xs, t), _tensors(0), torch.tensor(2.5))
    _compiled_matches(lambda e, xs: torch._foreach_pow(e, xs), 2.0, _tensors(1))


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_addcmul_addcdiv_every_overload(name: str) -> None:
    op = getattr(torch, f"_foreach_{name}")
    a, b, c = _tensors(0), _tensors(1), _tensors(2, positive=True)
    _compiled_matches(lambda a, b, c: op(a, b, c, value=0.25), a, b, c)
    _compiled_matches(lambda a, b, c: op(a, b, c, [0.1, -2.0, 3.0, 0.5]), a, b, c)


def test_lerp_and_norm() -> None:
    a, b = _tensors(0), _tensors(1)
    _compiled_matches(lambda a, b: torch._foreach_lerp(a, b, 0.1), a, b)
    _compiled_matches(lambda a, b, w: torch._foreach_lerp(a, b, w), a, b, _tensors(2))
    _compiled_matches(lambda a: torch._foreach_norm(a), a)
    _compiled_matches(lambda a: torch._foreach_norm(a, 1), a)


def test_in_place_ema_update_writes_the_inputs() -> None:
    """``torch._foreach_lerp_`` over parameters: an EMA update, written into the tensors passed."""
    def ema(avg: list[torch.Tensor], new: list[torch.Tensor]) -> None:
        torch._foreach_lerp_(avg, new, 0.01)
        torch._foreach_mul_(avg, 1.0001)
        torch._foreach_zero_(new)
    avg, new = _tensors(0), _tensors(1)
    avg_eager, new_eager = [t.clone() for t in avg], [t.clone() for t in new]
    ema(avg_eager, new_eager)
    torch._dynamo.reset()
    metrics.reset()
    torch.compile(ema, backend="minductor")(avg, new)
    torch.testing.assert_close((avg, new), (avg_eager, new_eager))
    assert not metrics.fallback_ops, metrics.fallback_ops


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW", "SGD"])
def test_foreach_optimizer_step(optimizer: str) -> None:
    """A compiled ``step()`` of a foreach optimizer updates parameters and state as eager's."""
    def make() -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
        params = [torch.nn.Parameter(t) for t in _tensors(3)]
        for p, g in zip(params, _tensors(4)):
            p.grad = g
        kwargs = {"momentum": 0.9} if optimizer == "SGD" else {}
        return params, getattr(torch.optim, optimizer)(params, lr=0.01, foreach=True, **kwargs)
    torch._dynamo.reset()
    metrics.reset()
    eager_params, eager_opt = make()
    params, opt = make()
    step = torch.compile(opt.step, backend="minductor")
    for _ in range(3):
        eager_opt.step()
        step()
    torch.testing.assert_close(params, eager_params)
    assert not [op for op in metrics.fallback_ops if "foreach" in op], metrics.fallback_ops
