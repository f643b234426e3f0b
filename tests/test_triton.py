"""Triton kernels, run for real in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set in conftest)."""
from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import config, metrics
from minductor.codegen.triton_heuristics import PERSISTENT_RNUMEL
from tests.conftest import check


@pytest.fixture(autouse=True)
def _triton_backend() -> Any:
    with config.patch(cpu_backend="triton"):
        yield


def sources(fn: Callable[..., Any], *args: Any) -> list[str]:
    """Compile ``fn`` and return the generated Triton kernel sources (from the wrapper module)."""
    from minductor.codegen import wrapper

    captured: list[str] = []
    original = wrapper.load_wrapper

    def spy(module: Any, dump: Any) -> Any:
        captured.extend(k.source for k in module.kernels if k.backend == "triton")
        return original(module, dump)

    wrapper.load_wrapper = spy
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend="minductor")(*args)
    finally:
        wrapper.load_wrapper = original
    return captured


def kernel_names(fn: Callable[..., Any], *args: Any) -> list[str]:
    return [src.split("def ", 1)[1].split("(", 1)[0] for src in sources(fn, *args)]


def test_pointwise_runs_in_the_interpreter() -> None:
    check(lambda x, y: (x * 2 + y).relu(), torch.randn(100), torch.randn(100))
    assert metrics.kernels_by_backend["triton"] == 1
    assert metrics.kernels_by_backend["cpp"] == 0


def test_kernel_source_is_gpu_valid_python() -> None:
    srcs = sources(lambda x: (x.sin() + 1).sum(-1), torch.randn(8, 50))
    assert srcs
    for src in srcs:
        tree = ast.parse(src)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "np" not in names and "numpy" not in src and "torch" not in names, src
        assert "@triton.jit" in src


@pytest.mark.parametrize("n", [1, 7, 1024, 5000])
def test_reductions_persistent_and_looped(n: int) -> None:
    x = torch.randn(6, n)
    fns = lambda x: (x.sum(1), x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.var(1, correction=0),
                     x.mean(1), x.softmax(-1), (x > 0).any(1), (x * 0.01 + 1).prod(1))
    check(fns, x, rtol=1e-4, atol=1e-4)
    names = kernel_names(fns, x)
    kind = "per" if n <= PERSISTENT_RNUMEL else "red"
    assert names and n == 1 or any(name.startswith(f"triton_{kind}_fused_") for name in names), names


def test_argmax_with_nan() -> None:
    x = torch.randn(5, 3000)
    x[1, 17] = float("nan")
    x[1, 2500] = float("nan")
    x[3, 2999] = float("nan")
    x[4] = float("-inf")
    y = x[:, :9].clone()
    check(lambda x: (x.argmax(1), x.argmin(1), x.amax(1), x.amin(1)), x)
    check(lambda x: (x.argmax(1), x.argmin(1), x.amax(1), x.amin(1)), y)


def test_pointwise_kernel_name() -> None:
    names = kernel_names(lambda x: x.cos() * 3, torch.randn(16))
    assert len(names) == 1 and names[0].startswith("triton_poi_fused_"), names
