"""``minductor.scan`` eagerly and compiled (one ``jax.lax.scan``), forward and backward vs eager.

The eager reference is ``torch._higher_order_ops.scan``'s contract written as a Python loop;
fp32 results agree to rtol=atol=1e-5 (short sequences, so rounding does not accumulate).
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import minductor
from minductor import metrics

pytest.importorskip("jax", reason="the XLA path needs the optional jax extra (pip install minductor[xla])")

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _reference(fn: Callable[..., Any], init: Any, xs: Any, dim: int = 0, reverse: bool = False) -> Any:
    """The contract, spelled out: slice along dim, walk (maybe backwards), stack ys along dim in input order."""
    leaves, spec = pytree.tree_flatten(xs)
    n = leaves[0].shape[dim]
    carry, ys = init, [None] * n
    for t in (reversed(range(n)) if reverse else range(n)):
        carry, ys[t] = fn(carry, pytree.tree_unflatten([x.select(dim, t) for x in leaves], spec))
    return carry, pytree.tree_map(lambda *s: torch.stack(s, dim), *ys)


def _leaves_requiring_grad(*trees: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(trees) if isinstance(t, torch.Tensor) and t.requires_grad]


def _check(fn: Callable[..., Any], init: Any, xs: Any, *, dim: int = 0, reverse: bool = False,
           params: tuple[torch.Tensor, ...] = ()) -> None:
    def run(init: Any, xs: Any) -> Any:
        return minductor.scan(fn, init, xs, dim=dim, reverse=reverse)

    expected = _reference(fn, init, xs, dim, reverse)
    eager = run(init, xs)
    compiled = torch.compile(run, backend="minductor", fullgraph=True)(init, xs)
    torch.testing.assert_close(eager, expected, **TOL)
    torch.testing.assert_close(compiled, expected, **TOL)
    assert metrics.kernels_by_backend["xla"] >= 1
    wrt = _leaves_requiring_grad(init, xs) + list(params)
    if not wrt:
        return
    pairs = [(e, c) for e, c in zip(pytree.tree_leaves(expected), pytree.tree_leaves(compiled)) if e.requires_grad]
    seeds = [torch.randn_like(e) for e, _ in pairs]
    want = torch.autograd.grad([e for e, _ in pairs], wrt, seeds)
    got = torch.autograd.grad([c for _, c in pairs], wrt, seeds)
    torch.testing.assert_close(got, want, **TOL)
    assert metrics.kernels_by_backend["xla"] >= 2, "the backward scan runs on XLA too"


def test_cumulative_sum() -> None:
    def step(c: torch.Tensor, x: torch.Tensor) -> Any:
        c = c + x
        return c, c.clone()

    _check(step, torch.zeros(3, requires_grad=True), torch.randn(6, 3, requires_grad=True))


def test_tanh_rnn_with_closure() -> None:
    w, u = torch.randn(4, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)

    def step(h: torch.Tensor, x: torch.Tensor) -> Any:
        h = torch.tanh(h @ w + x @ u)
        return h, h * 2

    _check(step, torch.zeros(2, 4), torch.randn(5, 2, 3, requires_grad=True), params=(w, u))


def test_gru_cell_loop() -> None:
    cell = torch.nn.GRUCell(3, 4)

    def step(h: torch.Tensor, x: torch.Tensor) -> Any:
        h = cell(x, h)
        return h, h.clone()

    _check(step, torch.randn(2, 4, requires_grad=True), torch.randn(5, 2, 3, requires_grad=True),
           params=tuple(cell.parameters()))


def test_pytree_carries_and_xs() -> None:
    def step(carry: dict[str, Any], x: tuple[torch.Tensor, torch.Tensor]) -> Any:
        a, b = x
        total = carry["sum"] + a * b
        peak = torch.maximum(carry["stats"][0], a)
        count = carry["stats"][1] + 1
        return {"sum": total, "stats": (peak, count)}, {"prod": (a * b).sum(-1), "relu": torch.relu(total)}

    init = {"sum": torch.zeros(3, requires_grad=True), "stats": (torch.full((3,), -10.0), torch.zeros(3))}
    xs = (torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True))
    _check(step, init, xs)


@pytest.mark.parametrize("dim", [0, 1])
def test_reverse_and_dim(dim: int) -> None:
    w = torch.randn(3, 3, requires_grad=True)

    def step(h: torch.Tensor, x: torch.Tensor) -> Any:
        h = torch.sigmoid(h @ w) + x
        return h, torch.cat([h, x], -1)

    _check(step, torch.zeros(2, 3), torch.randn(2, 5, 3, requires_grad=True) if dim == 1
           else torch.randn(5, 2, 3, requires_grad=True), dim=dim, reverse=True, params=(w,))


def test_view_slicing_reduction_ops() -> None:
    def step(c: torch.Tensor, x: torch.Tensor) -> Any:
        a, b = x.split([2, 4], dim=-1)
        s = torch.stack([a.sum(-1), b.mean(-1)], dim=-1).reshape(-1).unsqueeze(0).expand(3, -1)
        new = torch.where(c > 0, c * 0.5, c + s.amax(0).sum()) + x.permute(1, 0)[:2].sum()
        return new, new[:2].clamp(-1, 1)

    _check(step, torch.randn(3, requires_grad=True), torch.randn(4, 2, 6, requires_grad=True))


def test_int64_exact() -> None:
    def step(c: torch.Tensor, x: torch.Tensor) -> Any:
        c = c * 3 + x
        return c, c.clone()

    xs = torch.full((8, 2), 2**40, dtype=torch.int64)  # beyond int32: must not truncate
    _check(step, torch.ones(2, dtype=torch.int64), xs)


def test_untranslatable_op_falls_back_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    def step(c: torch.Tensor, x: torch.Tensor) -> Any:
        c = torch.special.i0(c) * 0.1 + x  # no JAX translation in the table
        return c, c.clone()

    with caplog.at_level(logging.WARNING, logger="minductor"):
        init, xs = torch.randn(3), torch.randn(4, 3)
        out = torch.compile(lambda i, x: minductor.scan(step, i, x), backend="minductor")(init, xs)
    torch.testing.assert_close(out, _reference(step, init, xs), **TOL)
    assert any("scan runs through aten" in r.message and "i0" in r.message for r in caplog.records)
    assert metrics.fallback_ops["higher_order.scan"] == 1 and metrics.kernels_by_backend["xla"] == 0


def test_scan_without_jax_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from minductor.codegen import xla

    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setattr(xla, "_warned_missing", False)
    xla.jax_available.cache_clear()
    try:
        def step(c: torch.Tensor, x: torch.Tensor) -> Any:
            c = torch.tanh(c + x)
            return c, c.clone()

        init, xs = torch.randn(3), torch.randn(4, 3)
        with pytest.warns(UserWarning, match="JAX is not available"):
            out = torch.compile(lambda i, x: minductor.scan(step, i, x), backend="minductor")(init, xs)
        torch.testing.assert_close(out, _reference(step, init, xs), **TOL)
        assert metrics.kernels_by_backend["xla"] == 0
    finally:
        xla.jax_available.cache_clear()


def test_import_minductor_does_not_import_jax() -> None:
    import subprocess

    code = "import sys, minductor; minductor.scan; minductor.nn; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_debug_dump_has_jax_source_and_stablehlo(tmp_path: Any) -> None:
    from minductor import config

    def step(c: torch.Tensor, x: torch.Tensor) -> Any:
        c = torch.tanh(c + x)
        return c, c.clone()

    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.compile(lambda i, x: minductor.scan(step, i, x), backend="minductor")(torch.randn(3), torch.randn(4, 3))
    (folder,) = list(tmp_path.iterdir())
    (source,) = list(folder.glob("xla_scan_*.py"))
    (hlo,) = list(folder.glob("xla_scan_*.stablehlo.mlir"))
    assert "lax.scan(body" in source.read_text() and "aten_tanh_default" in source.read_text()
    assert "stablehlo.while" in hlo.read_text() and "stablehlo.tanh" in hlo.read_text()
    assert "xla_scan" in (folder / "output_code.py").read_text()
