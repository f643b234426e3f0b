"""Graph inputs updated element by element (optimizer steps, ``x.add_(y)``) are written in place
by the kernel that computes the update, several inputs in one kernel where each is read only at
the element written; any other read keeps the safe path. Results and updated inputs vs eager,
under both CPU code generators."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from minductor import config, metrics

@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def _run(fn: Callable[..., Any], *args: Any, tmp_path: Path | None = None) -> str:
    """Compiled and eager on copies of ``args``: results and updated inputs must match. Returns
    the body of the (last) generated wrapper's call when ``tmp_path`` is given."""
    compiled_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with config.patch(debug=tmp_path is not None, debug_dir=str(tmp_path or "")):
        out = torch.compile(fn, backend="minductor")(*compiled_args)
    torch.testing.assert_close(out, fn(*eager_args))
    torch.testing.assert_close(compiled_args, eager_args)
    if tmp_path is None:
        return ""
    code = sorted(tmp_path.glob("graph_*/output_code.py"))[-1].read_text()
    return code.split("def call_direct", 1)[1].split("\ndef call(", 1)[0]


def _kernel_calls(body: str) -> list[str]:
    return re.findall(r"^\s*((?:cpp|triton)_\w+)[(\[]", body, flags=re.M)


def _optimizer(name: str, shapes: list[tuple[int, ...]]) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    torch.manual_seed(0)
    params = [torch.randn(s, requires_grad=True) for s in shapes]
    make = {"adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
            "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
            "sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True)}[name]
    return params, make(params)


@pytest.mark.parametrize("opt_name", ["adamw", "adam", "sgd"])
def test_compiled_optimizer_step_matches_eager(opt_name: str, cpu_backend: str) -> None:
    """A few compiled steps of an optimizer over parameters of several shapes (a matrix, a
    vector, one of its own size): parameters and every state tensor as eager's."""
    shapes = [(64, 48), (48,), (1,)]
    results = {}
    for compiled in (False, True):
        params, opt = _optimizer(opt_name, shapes)
        step = torch.compile(opt.step, backend="minductor") if compiled else opt.step
        torch.manual_seed(1)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn_like(p)
            step()
        states = [t for p in params for t in opt.state[p].values() if isinstance(t, torch.Tensor)]
        results[compiled] = [p.detach().clone() for p in params] + [s.clone() for s in states]
    assert len(results[True]) == len(results[False])
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want)


def test_adamw_update_is_one_kernel_writing_in_place(tmp_path: Path, cpu_backend: str) -> None:
    """AdamW's update of a parameter and its two moments reads each once and writes each once,
    in one kernel (no new parameter or moment copied back afterwards). The C++ kernel also
    hands the new first moment, which both the parameter's update and the moment's store read,
    to the update in a register: the wrapper allocates nothing of the parameter's size (the
    Triton kernel stores it in a buffer and reads it back)."""
    def adamw(p, g, m, v, lr):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.mul_(1 - lr * 0.01)
        p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)

    p, g, m, v = torch.randn(256, 96), torch.randn(256, 96), torch.randn(256, 96), torch.rand(256, 96)
    body = _run(adamw, p, g, m, v, 0.01, tmp_path=tmp_path)
    assert len(_kernel_calls(body)) == 1, body
    assert body.count("(256, 96)") == (0 if cpu_backend == "cpp" else 1), body


@pytest.mark.parametrize("n", [1000, 1 << 20], ids=["serial", "parallel"])
def test_flat_kernel_computes_its_invariants_once(n: int, tmp_path: Path) -> None:
    """A scalar computed from a 0-d input (Adam's bias correction ``1 - beta ** step``) is
    computed before the C++ kernel's flat loop over the elements, not in it (where it kept the
    loop scalar); a parallel loop's in each thread, in the parallel region around its ``omp
    for`` (in the loop, GCC vectorized the power per element: the step's load could alias the
    stores)."""
    def update(p, m, step):
        p.sub_(m / (1 - 0.999 ** (step + 1)))

    _run(update, torch.randn(n), torch.randn(n), torch.tensor(3.0), tmp_path=tmp_path)
    (source,) = [s.read_text() for s in tmp_path.glob("graph_*/cpp_*.cpp")]
    assert source.index("mi_pow") < source.index("for (int64_t"), source
    if n > 1000:
        assert source.index("#pragma omp parallel\n") < source.index("mi_pow") < source.index("#pragma omp for simd")


def _updates() -> dict[str, Callable[..., Any]]:
    def flipped_source(x, y):
        x.copy_(x.flip(0) + y)  # reads x elsewhere than it writes: not in place

    def read_before_update(x, y):
        before = x.sum(0)
        x.add_(y)
        return before

    def neighbours(x, y):
        x.add_(torch.roll(x, 1, 0))

    def two_inputs_crossed(x, y):
        x.add_(y.flip(0))
        y.add_(x.flip(0))  # reads the updated x, elsewhere than it writes y

    def two_inputs_elementwise(x, y):
        x.mul_(2).add_(y)
        y.sub_(x)  # the updated x, at the element it writes

    def returned_source(x, y):
        z = x * 2 + y
        x.copy_(z)
        return z

    def slice_and_elementwise(x, y):
        x[1:].add_(y[:-1])
        y.mul_(x)

    def broadcast_update(x, y):
        x.add_(y.sum(0, keepdim=True))
        y.add_(x[:1])  # a row of the updated x, broadcast

    return {f.__name__: f for f in (flipped_source, read_before_update, neighbours, two_inputs_crossed,
                                     two_inputs_elementwise, returned_source, slice_and_elementwise, broadcast_update)}


@pytest.mark.parametrize("name", sorted(_updates()))
def test_input_updates_match_eager(name: str, cpu_backend: str) -> None:
    """Updates that read an input elsewhere than they write it, or read it before and after:
    results and inputs as eager's."""
    _run(_updates()[name], torch.randn(6, 5), torch.randn(6, 5))
