"""Shared fixtures and helpers: every test starts from a fresh Dynamo cache and zeroed metrics."""
from __future__ import annotations

import os

# Triton kernels for CPU tensors run in Triton's interpreter; it is chosen when a kernel is
# decorated, so the variable is set before anything loads one (a CUDA run unsets it).
os.environ.setdefault("TRITON_INTERPRET", "1")
# An internal error compiling a graph fails the test instead of running the graph through aten.
os.environ.setdefault("MINDUCTOR_STRICT", "1")

from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import config, metrics


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_metrics() -> None:
    torch._dynamo.reset()
    metrics.reset()


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``on_cpu(cache.decision, info)``: one of ``runtime.cache``'s cached per-CPU decisions as it
    comes out where /proc/cpuinfo reads ``info`` (its cache cleared before and after)."""
    from minductor.runtime import cache

    asked: list[Any] = []

    def decide(decision: Any, info: dict[str, str]) -> Any:
        monkeypatch.setattr(cache, "cpu_info", lambda: info)
        decision.cache_clear()
        asked.append(decision)
        return decision()

    yield decide
    for decision in asked:
        decision.cache_clear()


@pytest.fixture(params=["cpp", "triton"])
def cpu_backend(request: pytest.FixtureRequest) -> Any:
    """Run a test under both CPU code generators (Triton in its interpreter); a module opts in with
    ``pytestmark = pytest.mark.usefixtures("cpu_backend")``."""
    with config.patch(cpu_backend=request.param):
        yield request.param


def _clone(value: Any) -> Any:
    """Copy tensors with their exact strides and storage offset, so neither run can disturb the other's inputs."""
    if isinstance(value, torch.Tensor):
        copy = torch.empty(0, dtype=value.dtype)
        return copy.set_(value.untyped_storage().clone(), value.storage_offset(), value.size(), value.stride())
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def check(fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None,
          equal_nan: bool = True, check_stride: bool = False) -> Any:
    """Compile ``fn`` with minductor, run it and eager on the same inputs, assert_close them; return compiled outputs.

    Dtype, shape (and device) equality come from assert_close's defaults; ``check_stride`` adds strides.
    """
    compiled = torch.compile(fn, backend="minductor")
    expected = fn(*_clone(args))
    actual = compiled(*_clone(args))
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan, check_stride=check_stride)
    return actual


def layouts(dtype: torch.dtype = torch.float32, *, low: int = -9, high: int = 10) -> dict[str, torch.Tensor]:
    """One (4, 6)-shaped-ish input per layout: contiguous, transposed, sliced, expanded, 0-d, size-1."""
    def base(*shape: int) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.randn(shape) > 0
        if dtype.is_floating_point:
            return torch.randn(shape, dtype=dtype) * 2
        return torch.randint(low, high, shape, dtype=dtype)

    return {
        "contiguous": base(4, 6),
        "transposed": base(6, 4).t(),
        "sliced": base(4, 12)[:, ::2],
        "expanded": base(1, 6).expand(4, 6),
        "scalar": base(),
        "size1": base(1, 1),
    }


LAYOUT_NAMES = ["contiguous", "transposed", "sliced", "expanded", "scalar", "size1"]


def make(layout: str, dtype: torch.dtype = torch.float32, *, seed: int = 0, low: int = -9, high: int = 10) -> torch.Tensor:
    """A deterministic input of the given layout and dtype."""
    torch.manual_seed(seed + sum(map(ord, layout + str(dtype))))
    return layouts(dtype, low=low, high=high)[layout]


def check_named(fns: dict[str, Callable[..., Any]], *args: Any, rtol: float | None = None,
                atol: float | None = None) -> None:
    """Like ``check`` for many ops at once: one compiled graph returns every op's result (one g++
    compile instead of many); each result is compared with eager separately, and a mismatch names its op.
    """
    names = sorted(fns)

    def graph(*a: Any) -> tuple[Any, ...]:
        return tuple(fns[n](*a) for n in names)

    actual = torch.compile(graph, backend="minductor")(*_clone(args))
    expected = graph(*_clone(args))
    for name, got, ref in zip(names, actual, expected):
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, n=name: f"{n}: {m}")


def vectorization_report(source: "os.PathLike[str] | str", out_dir: "os.PathLike[str] | str") -> str:
    """Compile a C++ kernel source with the flags kernels use (an object file, no link) and
    return the compiler's report of the loops it vectorized (``-fopt-info-vec-optimized``).
    Identical functions stay apart (``-fno-ipa-icf``): folded into one, they report once
    (``relu(abs(x))`` is ``abs(abs(x))``)."""
    import subprocess
    from pathlib import Path

    from minductor.runtime.cache import compiler_flags

    flags = [f for f in compiler_flags(config.cxx) if f not in ("-shared", "-fPIC")]
    proc = subprocess.run([config.cxx, *flags, "-c", str(source), "-o", str(Path(out_dir) / "k.o"), "-fopt-info-vec-optimized",
                           "-fno-ipa-icf"],
                          capture_output=True, text=True, check=True)
    return proc.stderr


def math_paths() -> list[Any]:
    """pytest params for the two float32 sin/cos paths of C++ kernels: the prelude's own
    polynomials, and glibc's libmvec (skipped, with the reason, where it cannot be linked)."""
    import pytest

    from minductor.runtime.cache import libmvec_installed

    return [pytest.param(False, id="own-sin-cos"),
            pytest.param(True, id="libmvec", marks=pytest.mark.skipif(not libmvec_installed(config.cxx),
                                                                     reason="glibc's libmvec is not installed"))]
