"""einsum on the XLA path: kept whole through AOTAutograd, lowered to a jitted ``jnp.einsum``.

Forward and gradients are compared with eager ``torch.einsum``; fp32 tolerances are
rtol=1e-5/atol=1e-5 (XLA may contract in a different order than bmm).
"""
from __future__ import annotations

import sys
import warnings

import pytest
import torch

from minductor import config, metrics

pytest.importorskip("jax", reason="the XLA path needs the optional jax extra (pip install minductor[xla])")


@pytest.fixture(autouse=True)
def every_einsum_on_xla() -> None:
    """The small einsums here take the XLA path as big contractions do (einsum_xla_min_work)."""
    with config.patch(einsum_xla_min_work=0):
        yield

EQUATIONS = {
    "matmul": ("ij,jk->ik", [(3, 4), (4, 5)]),
    "batched": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    "bilinear": ("bi,oij,bj->bo", [(3, 4), (6, 4, 5), (3, 5)]),
    "trace": ("ii->", [(4, 4)]),
    "diagonal": ("ii->i", [(4, 4)]),
    "diag_of_product": ("ij,jj->ij", [(3, 4), (4, 4)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "ellipsis": ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 2)]),
    "broadcast": ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),
    "implicit": ("ij,jk", [(3, 4), (4, 5)]),
    "sum_out": ("ij->", [(3, 4)]),
    "own_letter": ("ij,j->j", [(3, 4), (4,)]),
    "attention": ("bhqd,bhkd->bhqk", [(2, 2, 5, 4), (2, 2, 6, 4)]),
    "four_operands": ("ab,bc,cd,d->a", [(2, 3), (3, 4), (4, 5), (5,)]),
}


def _inputs(shapes: list[tuple[int, ...]], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


def _grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, inputs, seed)


@pytest.mark.parametrize("case", EQUATIONS, ids=list(EQUATIONS))
def test_einsum_forward_backward(case: str) -> None:
    equation, shapes = EQUATIONS[case]

    def fn(*xs: torch.Tensor) -> torch.Tensor:
        return torch.einsum(equation, *xs)

    inputs = _inputs(shapes)
    expected = fn(*inputs)
    actual = torch.compile(fn, backend="minductor")(*inputs)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    seed = torch.randn_like(expected)
    for got, want in zip(_grads(actual, inputs, seed), _grads(expected, inputs, seed)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert metrics.kernels_by_backend["xla"] >= 2, "forward and backward einsums run on XLA"
    assert "bmm" not in metrics.fallback_ops


def test_einsum_list_form_and_operand_order() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("jk,ij->ik", [b, a]) * 2

    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(a, b), fn(a, b))
    assert metrics.kernels_by_backend["xla"] == 1


def test_debug_dump_shows_xla_not_bmm(tmp_path: object) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bij,bjk->bik", a, b).relu()

    a, b = torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 4, 5, requires_grad=True)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(a, b)
        out.sum().backward()
    dumps = sorted(p for p in tmp_path.iterdir())  # type: ignore[attr-defined]
    wrappers = "".join((d / "output_code.py").read_text() for d in dumps)
    assert "xla_einsum" in wrappers and "bmm" not in wrappers
    sources = [p for d in dumps for p in d.glob("xla_einsum*.py")]
    hlos = [p for d in dumps for p in d.glob("xla_einsum*.stablehlo.mlir")]
    assert len(sources) == 3 and len(hlos) == 3  # forward, grad of a, grad of b
    assert all("jnp.einsum" in p.read_text() for p in sources)
    assert all("stablehlo.dot_general" in p.read_text() for p in hlos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_einsum_autocast_bf16(dtype: torch.dtype) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.einsum("bij,bjk->bik", a, b)

    a = torch.randn(2, 8, 16, dtype=dtype, requires_grad=True)
    b = torch.randn(2, 16, 8, dtype=dtype, requires_grad=True)
    expected = fn(a, b)
    actual = torch.compile(fn, backend="minductor")(a, b)
    assert actual.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected, rtol=1.6e-2, atol=1e-2)  # bf16 rounding of the result
    seed = torch.randn_like(expected)
    for got, want in zip(_grads(actual, [a, b], seed), _grads(expected, [a, b], seed)):
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert metrics.kernels_by_backend["xla"] >= 3


def test_einsum_autocast_single_operand_keeps_dtype() -> None:
    def fn(a: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.einsum("ii->i", a)

    a = torch.randn(5, 5)
    out = torch.compile(fn, backend="minductor")(a)
    assert out.dtype == fn(a).dtype == torch.float32
    torch.testing.assert_close(out, fn(a))


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_einsum_64_bit_exact(dtype: torch.dtype) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ij,jk->ik", a, b)

    if dtype == torch.int64:  # products beyond 2**32: int32 would wrap
        a, b = torch.full((2, 3), 3 * 2**31, dtype=dtype), torch.full((3, 2), 5, dtype=dtype)
    else:  # values fp32 cannot hold
        a, b = torch.randn(2, 3, dtype=dtype) * 1e200, torch.randn(3, 2, dtype=dtype)
    out = torch.compile(fn, backend="minductor")(a, b)
    assert out.dtype == dtype
    torch.testing.assert_close(out, fn(a, b), rtol=1e-12, atol=0)
    assert metrics.kernels_by_backend["xla"] == 1


def test_einsum_without_jax_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from minductor.codegen import xla

    monkeypatch.setitem(sys.modules, "jax", None)  # import jax now raises ImportError
    monkeypatch.setattr(xla, "_warned_missing", False)
    xla.jax_available.cache_clear()
    try:
        def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.einsum("ij,jk->ik", a, b)

        a, b = torch.randn(3, 4), torch.randn(4, 5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.compile(fn, backend="minductor")(a, b)
            torch._dynamo.reset()
            torch.compile(fn, backend="minductor")(a * 2, b)
        torch.testing.assert_close(out, fn(a, b))
        messages = [str(w.message) for w in caught if "JAX is not available" in str(w.message)]
        assert len(messages) == 1, messages
        assert metrics.kernels_by_backend["xla"] == 0
    finally:
        xla.jax_available.cache_clear()


@pytest.mark.parametrize(("equation", "shapes", "min_work", "on_xla"), [
    ("ij,jk->ik", [(3, 4), (4, 5)], 60, True),     # 3 * 4 * 5 multiply-adds: at the threshold
    ("ij,jk->ik", [(3, 4), (4, 5)], 61, False),    # below it: decomposed and lowered natively
    ("bhqd,bhkd->bhqk", [(2, 2, 5, 4), (2, 2, 6, 4)], 480, True),
    ("bi,oij,bj->bo", [(3, 4), (6, 4, 5), (3, 5)], 16 * 360, True),  # three operands: a 16th
    ("bi,oij,bj->bo", [(3, 4), (6, 4, 5), (3, 5)], 16 * 361, False),
    ("i,j->ij", [(40,), (50,)], 1, False),         # contracts nothing: never XLA
    ("ii->", [(30, 30)], 1, False),
    ("ij,j->ij", [(30, 40), (40,)], 1, False),
])
def test_einsum_routing_by_contracted_work(equation: str, shapes: list[tuple[int, ...]], min_work: int,
                                           on_xla: bool) -> None:
    """An einsum takes the XLA path only when it contracts at least ``einsum_xla_min_work``;
    the others run natively. Forward and backward match eager either way."""
    inputs = _inputs(shapes)
    seed = torch.randn_like(torch.einsum(equation, *inputs))
    with config.patch(einsum_xla_min_work=min_work):
        torch._dynamo.reset()
        metrics.reset()
        out = torch.compile(lambda *xs: torch.einsum(equation, *xs), backend="minductor")(*inputs)
        grads = _grads(out, inputs, seed)
    expected = torch.einsum(equation, *inputs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, _grads(expected, inputs, seed)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert (metrics.kernels_by_backend["xla"] > 0) == on_xla, dict(metrics.kernels_by_backend)
