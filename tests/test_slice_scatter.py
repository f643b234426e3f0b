"""slice_scatter and diagonal_scatter (lowering/views.py): functionalization turns every slice
or diagonal assignment (``y[:, a:b] = v``, ``y.diagonal().fill_(0)``, a KV cache's update, the
border copies of a circular pad) into one. Both are pointwise selects, one kernel with what
surrounds them and no aten fallback; results match eager exactly (the selects only move values)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import check

from minductor import config, metrics

pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.mark.parametrize("dim, start, end, step", [
    (0, 1, 3, 1), (1, None, 2, 1), (1, -3, None, 1), (1, 2, 17, 1), (1, 1, None, 2), (1, 0, 5, 3), (2, -5, -1, 2),
    (2, 0, 40, 1), (1, 3, 3, 1),
])
def test_slice_assignment_is_one_kernel(dim: int, start, end, step: int) -> None:
    x = torch.randn(4, 9, 40)
    region = [slice(None)] * 3
    region[dim] = slice(start, end, step)
    y = torch.randn_like(x[tuple(region)])

    def fn(x, y):
        out = x.clone()
        out[tuple(region)] = y * 2
        return out + 1

    check(fn, x, y, atol=0, rtol=0)
    assert not metrics.fallback_ops and metrics.generated_kernel_count == 1


@pytest.mark.parametrize("offset, dims", [(0, (0, 1)), (2, (0, 1)), (-1, (1, 2)), (1, (2, 0))])
def test_diagonal_assignment_is_one_kernel(offset: int, dims: tuple[int, int]) -> None:
    x = torch.randn(6, 7, 5)

    def fn(x):
        out = x * 3
        out.diagonal(offset, *dims).copy_(out.diagonal(offset, *dims).exp())
        return out

    check(fn, x, atol=1e-6, rtol=1e-6)
    assert not metrics.fallback_ops and metrics.generated_kernel_count == 1


def test_cache_update_writes_into_the_input() -> None:
    """A KV cache updated in place at a position: the input holds eager's values afterwards."""
    cache, k = torch.randn(2, 16, 8), torch.randn(2, 1, 8)

    def fn(cache, k):
        cache[:, 5:6] = k
        return cache.sum(1)

    mine, theirs = cache.clone(), cache.clone()
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(mine, k), fn(theirs, k))
    torch.testing.assert_close(mine, theirs, atol=0, rtol=0)
    assert not metrics.fallback_ops


def test_cache_update_writes_only_the_slice(tmp_path: Path) -> None:
    """The copy back into the cache loops over the slice (2 x 1 x 8 elements), not the cache."""
    cache, k = torch.randn(2, 16, 8), torch.randn(2, 1, 8)

    def fn(cache, k):
        cache[:, 5:6] = k * 2
        return cache.sum(1)

    mine, theirs = cache.clone(), cache.clone()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(mine, k), fn(theirs, k))
    torch.testing.assert_close(mine, theirs, atol=0, rtol=0)
    (copy,) = [p for p in tmp_path.glob("graph_*/*_fused_copy_*") if p.suffix in (".cpp", ".py")]
    if copy.suffix == ".py":  # Triton: the kernel's element count
        assert "xnumel = 16\n" in copy.read_text(), copy.read_text()
    else:
        bounds = [int(b) for b in re.findall(r"for \(int64_t xo\d+ = 0; xo\d+ < (\d+);", copy.read_text())]
        assert math.prod(bounds) == 16, copy.read_text()


def test_cache_shift_reads_the_old_values() -> None:
    """The right side reads the cache it is written into: it is computed first, as eager's copy."""
    def fn(cache):
        cache[:, 1:] = cache[:, :-1].clone()
        return cache * 1

    cache = torch.randn(2, 16, 8)
    mine, theirs = cache.clone(), cache.clone()
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(mine), fn(theirs), atol=0, rtol=0)
    torch.testing.assert_close(mine, theirs, atol=0, rtol=0)


@pytest.mark.parametrize("shape, pad", [((2, 3, 40), (2, 3)), ((2, 3, 20, 33), (1, 2, 3, 0)), ((1, 2, 5, 6, 7), (1, 1, 2, 2, 0, 3)),
                                        ((2, 3, 20, 33), (33, 0, 0, 20))])
def test_circular_pad_matches_eager(shape: tuple[int, ...], pad: tuple[int, ...]) -> None:
    check(lambda x: F.pad(x, pad, mode="circular"), torch.randn(shape), atol=0, rtol=0)
    assert not metrics.fallback_ops


def test_slice_assignment_gradients() -> None:
    x, y = torch.randn(5, 12, requires_grad=True), torch.randn(5, 6, requires_grad=True)

    def fn(x, y):
        out = x * 2
        out[:, ::2] = y.sin()
        return out

    out = torch.compile(fn, backend="minductor")(x, y)
    x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    expected = fn(x2, y2)
    grad = torch.randn_like(out)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out, (x, y), grad), torch.autograd.grad(expected, (x2, y2), grad))


def test_slice_assignment_with_dynamic_shapes() -> None:
    def fn(x, y):
        out = x.clone()
        out[:, 1:] = y
        return out

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for n in (5, 9):
        x, y = torch.randn(3, n), torch.randn(3, n - 1)
        torch.testing.assert_close(compiled(x, y), fn(x, y), atol=0, rtol=0)


def test_slices_with_a_symbolic_step() -> None:
    """A step (and start) that are graph inputs under dynamic shapes: the lowerings tested
    ``step <= 0`` and failed to compile; tracing checked the step positive, as eager does.
    One graph serves every start and step."""
    def fn(x, y, start, step):
        out = torch.slice_scatter(x, y, 0, start, None, step)
        return out + x[start::step].sum(0)

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for n, start, step in [(20, 2, 3), (23, 5, 4), (17, 0, 2)]:
        x = torch.randn(n, 3)
        y = torch.randn(len(range(start, n, step)), 3)
        torch.testing.assert_close(compiled(x, y, start, step), fn(x, y, start, step))
    assert not metrics.fallback_ops and metrics.graphs_compiled == 1

