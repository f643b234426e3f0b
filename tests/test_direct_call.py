"""Inference graphs called without AOTAutograd's runtime wrapper (direct_call.py): taken only
when the wrapper would change nothing; every case, taken or not, matches eager, including
the inputs it mutates and the outputs that alias."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import metrics


def run(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None) -> tuple[Any, int]:
    """``fn`` compiled and run (on clones), checked against eager (on other clones, which
    must end up mutated alike); returns the result and how many graphs were called directly."""
    torch._dynamo.reset()
    metrics.reset()
    mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ref = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    got = torch.compile(fn, backend="minductor", dynamic=dynamic)(*mine)
    torch.testing.assert_close(got, fn(*ref))
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b)
    return got, metrics.direct_graphs


def test_plain_inference_graphs_are_called_directly() -> None:
    x, y = torch.randn(33, 17), torch.randn(17)
    assert run(lambda x: x.sum(1), x)[1] == 1
    assert run(lambda x, y: ((x + y).relu(), x.amax(0), (x * 2).sum()), x, y)[1] == 1  # several outputs
    assert run(lambda x, n: x * n, x, 3)[1] == 1  # a Python scalar argument
    for shape in [(5, 7), (9, 3)]:  # symbolic sizes arrive as arguments too
        assert run(lambda x: (x.cos() + x.shape[0]).sum(-1), torch.randn(shape), dynamic=True)[1] == 1
    model = torch.nn.Sequential(torch.nn.Linear(17, 8), torch.nn.GELU()).eval()
    with torch.no_grad():  # parameters that require grad, under no_grad: an inference graph
        assert run(model, x)[1] == 1


def test_results_are_fresh_tensors() -> None:
    x = torch.randn(8, 8)
    got, direct = run(lambda x: x + 1, x)
    assert direct == 1 and got.data_ptr() != x.data_ptr() and not got.requires_grad


@pytest.mark.parametrize("case", ["mutated_input", "output_views_input", "autocast", "needs_grad"])
def test_graphs_the_wrapper_changes_keep_it(case: str) -> None:
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    if case == "mutated_input":
        _, direct = run(lambda x, y: (x.add_(y), (x * 2).sum())[1], x, y)
    elif case == "output_views_input":
        _, direct = run(lambda x: (x[1:], x.sum()), x)
    elif case == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, direct = run(lambda x, y: (x @ y.t()).relu(), x, y)
    else:  # a forward graph with a backward: AOTAutograd's autograd function stays
        w = torch.randn(4, 3, requires_grad=True)
        torch._dynamo.reset()
        metrics.reset()
        out = torch.compile(lambda x, w: (x @ w).tanh(), backend="minductor")(x, w)
        assert out.requires_grad
        out.sum().backward()
        direct = metrics.direct_graphs
    assert direct == 0


def test_aliasing_dynamo_resolves_before_the_graph() -> None:
    """Returning an input, an output and its view, a metadata mutation, a repeated argument:
    Dynamo handles these outside the graph it hands over, which may then run directly; the
    identities and aliases still hold."""
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    torch._dynamo.reset()
    a, b = torch.compile(lambda x, y: (x, x + y), backend="minductor")(x, y)
    assert a is x
    torch.testing.assert_close(b, x + y)
    z, flat = torch.compile(lambda x: (lambda z: (z, z.view(-1)))(x * 2), backend="minductor")(x)
    flat[0] = 7.0
    assert z[0, 0].item() == 7.0
    torch.testing.assert_close(z.view(-1)[1:], (x * 2).view(-1)[1:])
    got, _ = run(lambda x: x.t_().sum(0), x)
    got = torch.compile(lambda a, b: a * 2 + b, backend="minductor")(x, x)
    torch.testing.assert_close(got, x * 3)


def test_output_view_of_input_still_aliases() -> None:
    x = torch.randn(6, 4)
    got = torch.compile(lambda x: x[1:], backend="minductor")(x)
    x[1, 0] = 42.0
    assert got[0, 0].item() == 42.0


def test_dynamo_calls_the_generated_call_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct callable is the wrapper module's ``call_direct``: no argument list and no layout
    checks (Dynamo's guards checked them). The boxed ``call`` still checks every input."""
    from minductor import direct_call

    returned: list[Any] = []
    original = direct_call.direct_callable

    def spy(*args: Any) -> Any:
        returned.append(original(*args))
        return returned[-1]

    monkeypatch.setattr(direct_call, "direct_callable", spy)
    x = torch.randn(33, 17)
    run(lambda x: (x.exp() + 1).sum(1), x)
    assert returned[0].__name__ == "call_direct"
    boxed = returned[0].__globals__["call"]
    torch.testing.assert_close(boxed([x]), ((x.exp() + 1).sum(1),))
    with pytest.raises(AssertionError, match=r"input arg0_1 has size \(33, 17\) and stride \(1, 33\)"):
        boxed([torch.randn(17, 33).t()])
