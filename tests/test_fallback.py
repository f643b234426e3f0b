"""Ops without a lowering run through aten (FallbackKernel) inside otherwise compiled graphs: results
match eager and each such op is counted in ``minductor.metrics.fallback_ops`` (keys like "aten.sort").
Complex dtypes must fall back rather than produce wrong C++.
"""
from __future__ import annotations

import pytest
import torch
from conftest import check, make

from minductor import metrics


def well_conditioned(n: int = 5) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(n, n) * 0.1 + torch.eye(n) * 2


def test_linalg_inv_between_lowered_ops() -> None:
    x = well_conditioned()
    check(lambda x: (torch.linalg.inv(x.exp() * 0.5 + torch.eye(5)) * 2).relu() + 1, x, rtol=1e-4, atol=1e-5)
    print(metrics.fallback_ops)
    assert metrics.fallback_ops["aten.linalg_inv_ex"] >= 1, metrics.fallback_ops
    assert metrics.generated_kernel_count >= 2  # the pointwise code before and after still compiled


def test_sort_between_lowered_ops() -> None:
    x = make("contiguous", torch.float32)
    check(lambda x: (lambda s: (s.values * 2 + 1, s.indices + 1))(torch.sort(x.sin(), dim=-1)), x)  # noqa: PLC3002
    assert metrics.fallback_ops["aten.sort"] >= 1, metrics.fallback_ops
    assert metrics.generated_kernel_count >= 2


def test_sort_descending_stable_with_ties() -> None:
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0], [0.0, 0.0, -1.0, 5.0, 0.0]])
    check(lambda x: torch.sort(x * 1, dim=1, descending=True, stable=True), x)
    assert metrics.fallback_ops["aten.sort"] >= 1


def test_kthvalue_between_lowered_ops() -> None:
    x = make("transposed", torch.float32)
    check(lambda x: (torch.kthvalue(x * 2, 2, 0).values.relu() - 1, torch.kthvalue(x, 1, 1).indices * 2), x)
    assert metrics.fallback_ops["aten.kthvalue"] >= 1, metrics.fallback_ops


def test_fallback_on_graph_input_directly() -> None:
    x = make("sliced", torch.float32)
    check(lambda x: torch.sort(x, 0).values + torch.kthvalue(x, 2, 0, keepdim=True).values, x)
    assert metrics.fallback_ops["aten.sort"] >= 1 and metrics.fallback_ops["aten.kthvalue"] >= 1


def test_fallback_output_feeds_reduction_and_view() -> None:
    x = well_conditioned(6)
    check(lambda x: (torch.linalg.inv(x).sum(0), torch.linalg.inv(x).t()[::2] * 3, torch.sort(x, 1)[0][:, -1]), x,
          rtol=1e-4, atol=1e-5)


def test_fallback_in_backward() -> None:
    """cumsum's backward (a flip-cumsum) inside the compiled backward graph."""
    x = torch.randn(4, 7, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    fn = lambda x: (torch.cumsum(x.sin(), 1) * 2).square().sum()
    torch.compile(fn, backend="minductor")(x).backward()
    fn(x2).backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)


# A fallback on an intermediate minductor laid out differently from eager: the fallback's output
# layout comes from replaying the op on fake tensors with minductor's layouts, not eager's.


def test_sort_of_intermediate_of_transposed_input() -> None:
    """a*2 with a transposed input has eager strides (1, 4); minductor makes it (6, 1); aten.sort
    keeps its input's strides, so the following kernel must read the sort's output as (6, 1)."""
    x = torch.arange(24.0).reshape(6, 4).t().flip(1)
    check(lambda a: torch.sort(a * 2, 1)[0] + 0, x)


def test_diagonal_scatter_of_intermediate_of_transposed_input() -> None:
    x = torch.arange(24.0).reshape(6, 4).t()
    check(lambda a: torch.diagonal_scatter(a * 2, torch.ones(4), 0) + 0, x)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_fallback_of_intermediate_returned_directly(layout: str) -> None:
    """Returned without a following kernel, the fallback output is right whatever its strides."""
    check(lambda a: (torch.sort(a * 2, 1), torch.cumsum(a * 2, 0)), make(layout, torch.float32))


COMPLEX_CASES = {
    "view_as_real_of_mul": lambda z: torch.view_as_real(z * 2),
    "abs_of_square": lambda z: (z * z).abs(),
    "conj_mul_real_plus_1": lambda z: (z.conj() * z).real + 1,
    "complex_roundtrip": lambda z: torch.view_as_complex(torch.view_as_real(z) * 2) + z,
    "angle_and_imag": lambda z: (z.angle(), (z + 1j).imag * 3),
    "exp": lambda z: torch.exp(z),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_CASES))
def test_complex_falls_back_correctly(name: str) -> None:
    torch.manual_seed(0)
    z = torch.randn(4, 3, dtype=torch.complex64)
    check(COMPLEX_CASES[name], z)
    assert metrics.fallback_ops, "complex ops should run through aten"


def test_complex_mixed_with_real_inputs() -> None:
    torch.manual_seed(0)
    z = torch.randn(5, dtype=torch.complex64)
    x = torch.randn(5)
    check(lambda z, x: ((z * x).abs() + x.relu(), torch.view_as_real(z).sum(-1) * x), z, x)


def test_complex_from_real_ops() -> None:
    x, y = torch.randn(6), torch.randn(6)
    check(lambda x, y: (torch.complex(x.sin(), y) * 2).abs() + 1, x, y)


@torch.library.custom_op("minductor_test::halves", mutates_args=())
def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x / 2).double(), x / 2  # the first in float64, not what its fake kernel says


@_halves.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def test_a_fallback_of_another_dtype_than_its_fake_kernel_says_is_a_clear_error() -> None:
    """A fallback whose real kernel returns another dtype than its fake (meta) kernel, which the
    graph was planned with, stops with an error naming the op: its bytes read as the planned dtype
    were garbage (bfloat16 batch norm statistics read as float32)."""
    fn = torch.compile(lambda x: [h * 3 for h in torch.ops.minductor_test.halves(x + 1)], backend="minductor")
    with pytest.raises(RuntimeError, match=r"minductor_test.halves.* returned torch.float64 where its fake kernel said torch.float32"):
        fn(torch.randn(8))


@pytest.mark.parametrize("stage", ["lowering", "c++"])
def test_an_internal_error_runs_the_graph_through_aten_unless_strict(stage: str, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A bug of minductor's while compiling a graph (here: a lowering that raises, a kernel the
    C++ compiler rejects) does not fail the model: the graph runs through aten, eager's results,
    the error logged with its traceback and counted; with config.strict (the tests' setting) it
    raises. A flag holding an unusable value is the user's to fix: it raises either way."""
    from minductor import config
    from minductor.codegen import cpp
    from minductor.lowering import registry

    if stage == "lowering":
        def broken(*args, **kwargs):
            raise RuntimeError("a lowering bug")

        monkeypatch.setitem(registry.lowerings, torch.ops.aten.sin.default, broken)
    else:
        render = cpp.CppKernel.render
        monkeypatch.setattr(cpp.CppKernel, "render", lambda self, code: render(self, code).replace("{\n", "{\n    not_cpp;\n", 1))
    fn = lambda x: x.sin() * 2 + 1
    x = torch.randn(8, 8)
    with config.patch(strict=False, cache_dir=config.cache_dir + "_internal_error_test"), caplog.at_level("ERROR"):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x))
    assert metrics.internal_errors == 1 and metrics.graphs_compiled == 0
    assert "internal error compiling the inference graph" in caplog.text and "Traceback" in caplog.text
    torch._dynamo.reset()
    with config.patch(strict=True, cache_dir=config.cache_dir + "_internal_error_test"), \
            pytest.raises(Exception, match="a lowering bug|not_cpp"):
        torch.compile(fn, backend="minductor")(x)
    torch._dynamo.reset()
    with config.patch(strict=False, cpu_gemm="blis"), pytest.raises(Exception, match="cpu_gemm"):
        torch.compile(torch.mm, backend="minductor")(torch.randn(256, 64), torch.randn(64, 256))
