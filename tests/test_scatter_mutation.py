"""Indirect writes (index_put, scatter*, index_add/copy/fill) and input mutation, vs eager.

Each case runs compiled and eager on separate copies of the inputs and compares both the
results and the (possibly mutated) inputs.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import metrics

# every test runs with the C++ and the Triton (interpreter) code generator
pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def check(fn: Callable[..., Any], *args: Any) -> None:
    compiled_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out = torch.compile(fn, backend="minductor")(*compiled_args)
    ref = fn(*eager_args)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(compiled_args, eager_args)  # mutated inputs match too


def idx(*values: int) -> torch.Tensor:
    return torch.tensor(values)


CASES = {
    "index_put_accumulate_duplicates": (lambda x, i: x.index_put((i,), torch.ones(4, 4), accumulate=True),
                                        torch.randn(5, 4), idx(0, 2, 2, -1)),
    "index_put_overwrite": (lambda x, i: x.index_put((i,), torch.arange(4.0)), torch.randn(5, 4), idx(0, 2, 4, 1)),
    "index_put_two_indices_scalar": (lambda x, i: x.index_put((i, i), torch.tensor(3.0)), torch.randn(5, 5), idx(0, 2, 3)),
    "index_put_2d_index_fused_around": (lambda x, i, v: torch.index_put(x * 2, (i,), v, True) + 1,
                                        torch.randn(6, 3), torch.tensor([[0, 1], [5, 1]]), torch.randn(2, 2, 3)),
    "scatter_src": (lambda x, i, s: x.scatter(1, i, s), torch.zeros(3, 5),
                    torch.tensor([[0, 1, 2], [4, 3, 2], [1, 0, 4]]), torch.randn(3, 4)),
    "scatter_value": (lambda x, i: x.scatter(0, i, 7.0), torch.zeros(3, 5), torch.tensor([[0, 1, 2, 0, 1]])),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), torch.zeros(3, 5),
                    torch.tensor([[0, 1, 2, 0, 1], [2, 2, 2, 2, 2]]), torch.randn(2, 5)),
    "scatter_reduce_amax": (lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), torch.zeros(3, 5),
                            torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]), torch.randn(2, 5)),
    "scatter_reduce_prod": (lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), torch.ones(3, 5),
                            torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]), torch.randn(2, 5)),
    "index_add_alpha": (lambda x, i, s: x.index_add(1, i, s, alpha=2), torch.zeros(3, 5), idx(4, 0, 4), torch.randn(3, 3)),
    "index_copy": (lambda x, i, s: x.index_copy(0, i, s), torch.zeros(4, 2), idx(3, 1), torch.randn(2, 2)),
    "index_fill": (lambda x, i: x.index_fill(1, i, -1.5), torch.randn(3, 4), idx(0, 2)),
    "int_index_put_accumulate": (lambda x, i: x.index_put((i,), torch.tensor([5, 6, 7]), accumulate=True),
                                 torch.arange(6), idx(1, 1, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_indirect_writes(name: str) -> None:
    fn, *args = CASES[name]
    check(fn, *args)
    assert not metrics.fallback_ops, metrics.fallback_ops


def add_inplace(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * 2


def setitem(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    x[i] = v
    return x.sum()


def sgd_step(p: torch.Tensor, grad: torch.Tensor) -> None:
    p.sub_(0.1 * grad)


def copy_into(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.copy_(y.t())
    return y + 1


@pytest.mark.parametrize("fn,args", [
    (add_inplace, (torch.randn(4),)),
    (setitem, (torch.randn(6), idx(1, 3), torch.randn(2))),
    (sgd_step, (torch.randn(5), torch.randn(5))),
    (copy_into, (torch.randn(3, 3), torch.randn(3, 3))),
], ids=["add_", "setitem", "sgd_step", "copy_"])
def test_input_mutation(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    check(fn, *args)
    assert metrics.generated_kernel_count >= 1


def _cache_updates() -> dict[str, Callable[..., Any]]:
    def index_copy_(cache, k, pos):
        cache.index_copy_(1, pos, k)
        return cache[:, :4].sum(1)

    def setitem_at(cache, k, pos):
        cache[:, pos] = k
        return cache.amax(1)

    def scatter_(cache, k, pos):
        cache.scatter_(1, pos.view(1, 1, 1).expand(3, 1, 8), k)
        return cache.sum(2)

    def index_add_(cache, k, pos):
        cache.index_add_(1, pos, k, alpha=2)
        return cache.sum()

    return {f.__name__: f for f in (index_copy_, setitem_at, scatter_, index_add_)}


@pytest.mark.parametrize("name", sorted(_cache_updates()))
def test_scatter_into_an_input_writes_it_in_place(name: str, tmp_path: Any) -> None:
    """A scatter the graph writes back into its input (an input mutation) updates the input
    itself: no copy of it is made (no buffer of its size), and results match eager's."""
    from minductor import config

    fn = _cache_updates()[name]
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        check(fn, torch.randn(3, 16, 8), torch.randn(3, 1, 8), idx(5))
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/output_code.py"))
    assert "(3, 16, 8)" not in code.split("def call_direct", 1)[1].split("def call(", 1)[0], code
    assert not metrics.fallback_ops


@pytest.mark.parametrize("case", ["source_reads_input", "input_read_after"])
def test_scatter_into_an_input_that_is_read_elsewhere_matches_eager(case: str) -> None:
    """In place only when nothing else sees the input half written: a source computed from
    the input, or a value taken from the input before the update and used after it."""
    def source_reads_input(cache, pos):
        cache.index_copy_(1, pos, cache[:, 2:3] * 2)
        return cache.sum(1)

    def input_read_after(cache, pos):
        before = cache.sum(1)
        cache.index_copy_(1, pos, torch.ones(3, 1, 8))
        return before + cache.sum(1)

    fn = {"source_reads_input": source_reads_input, "input_read_after": input_read_after}[case]
    check(fn, torch.randn(3, 16, 8), idx(5))


def test_embedding_backward_accumulates_like_eager() -> None:
    weight = torch.randn(10, 4, requires_grad=True)
    index = torch.tensor([[1, 2, 2], [9, 0, 1]])
    compiled = torch.compile(lambda w, i: torch.nn.functional.embedding(i, w).pow(2).sum(), backend="minductor")
    compiled(weight, index).backward()
    grad = weight.grad.clone()
    weight.grad = None
    torch.nn.functional.embedding(index, weight).pow(2).sum().backward()
    torch.testing.assert_close(grad, weight.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_every_mode(include_self: bool, dtype: torch.dtype) -> None:
    """sum/mean/prod/amax/amin with and without ``self``, natively: positions nobody scatters to
    keep ``self``; ``mean`` divides by the count (floored for integers); duplicates accumulate
    in eager's order."""
    torch.manual_seed(0)
    x, src = (torch.randn(5, 7) * 4).to(dtype), (torch.randn(6, 7) * 4).to(dtype)
    idx = torch.randint(0, 5, (6, 7))

    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x.scatter_reduce(0, i, s, r, include_self=include_self) for r in ("sum", "mean", "prod", "amax", "amin"))

    expected = fn(x, idx, src)
    actual = torch.compile(fn, backend="minductor")(x, idx, src)
    torch.testing.assert_close(actual, expected)
    assert not metrics.fallback_ops, metrics.fallback_ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scatter_sums_16_bit_floats_in_float32_like_eager(dtype: torch.dtype) -> None:
    """Eager's scatter_add (scatter_reduce's sum and mean, scatter's reduce="add") into float16
    or bfloat16 sums in float32 and rounds once (a mean: its sum, then the quotient). Summed in
    the 16-bit buffer, each addition rounded: cummax's backward was far off where cotangents
    cancelled. Values of a few sizes that mostly cancel, many to a position: bit for bit."""
    torch.manual_seed(0)
    x = (torch.randn(3, 40) * 4).to(dtype)
    src = (torch.randn(60, 40) * torch.logspace(-2, 2, 60)[:, None]).to(dtype)
    index = torch.randint(0, 3, (60, 40))

    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.scatter_add(0, i, s), torch.zeros_like(x).scatter_add(0, i, s),
                x.scatter_reduce(0, i, s, "sum", include_self=False), x.scatter_reduce(0, i, s, "mean"),
                x.scatter(0, i, 0.3, reduce="add"))

    expected = fn(x, index, src)
    actual = torch.compile(fn, backend="minductor")(x, index, src)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == dtype and torch.equal(a, e), (i, (a.float() - e.float()).abs().max())


def _cpp_source(tmp_path: Any, fn: Callable[..., Any], *args: torch.Tensor) -> str:
    from minductor import config

    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(*args)
    ref = fn(*args)
    assert torch.equal(out, ref), (out - ref).abs().max()  # each row in eager's order: bit for bit
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*scatter*.cpp")) + \
        "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*index*.cpp"))


@pytest.mark.parametrize("case", ["scatter_add", "scatter_dup", "scatter_amax", "index_add", "index_put_cols", "index_put_both"])
def test_scatter_along_a_later_dim_runs_its_rows_in_parallel(tmp_path: Any, case: str, cpu_backend: str) -> None:
    """Rows of a scatter along dim 1 (index_add along dim 1, index_put after a sliced dim) are
    written apart: the loop over them is parallel, the loop within a row serial and in order,
    so duplicates resolve and sums round as in eager; it prefetches the next row in chunks."""
    x = torch.randn(300, 200)
    i = torch.randint(0, 200, (300, 400))  # many duplicates per row
    src = torch.randn(300, 400)
    fns = {
        "scatter_add": lambda x, i, s: x.scatter_add(1, i, s),
        "scatter_dup": lambda x, i, s: x.scatter(1, i, s),
        "scatter_amax": lambda x, i, s: x.scatter_reduce(1, i, s, "amax", include_self=False),
        "index_add": lambda x, i, s: x.index_add(1, i[0], s),
        "index_put_cols": lambda x, i, s: torch.ops.aten.index_put(x, [None, i[0]], s, True),
        "index_put_both": lambda x, i, s: x.index_put((torch.arange(300)[:, None], i), s, accumulate=True),
    }
    code = _cpp_source(tmp_path, fns[case], x, i, src)
    if cpu_backend == "cpp" and case != "index_put_both":  # (both dims indexed: serial)
        assert "#pragma omp parallel for" in code and "collapse" not in code and "simd" not in code, code
        # chunks of the row loop prefetch the next row's 13 lines, for writing where it is stored to
        found = re.findall(r"__builtin_prefetch\(&\w+\[200 \+ 200L\*xo0 \+ 16\*\((\d+)\*\(mi_g / 64\) \+ (\d+)\)\], (\d), 3\)", code)
        assert {int(share) * c + int(k) for share, k, _ in found for c in range(7)} >= set(range(13)), code
        # (amax without self first stores each target plainly, then combines into it)
        assert ("1" in {rw for _, _, rw in found}) == (case in ("scatter_dup", "scatter_amax"))


@pytest.mark.parametrize("case", ["scatter_add", "index_add", "index_put"])
def test_scatter_along_dim_0_splits_its_columns_across_threads(tmp_path: Any, case: str, cpu_backend: str) -> None:
    """Along dim 0 every update may hit any row, but columns are written apart: the column loop
    is split into per-thread chunks (each running all updates in eager's order) and is `omp
    simd`; a row's index is read and checked once per row, before the column loop."""
    x, src = torch.randn(300, 200), torch.randn(400, 200)
    i2, i1 = torch.randint(0, 300, (400, 200)), torch.randint(0, 300, (400,))
    fns = {
        "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), i2),
        "index_add": (lambda x, i, s: x.index_add(0, i, s), i1),
        "index_put": (lambda x, i, s: x.index_put((i,), s, accumulate=True), i1),
    }
    fn, index = fns[case]
    code = _cpp_source(tmp_path, fn, x, index, src) if case != "index_put" else ""
    if case == "index_put":  # eager sums an index_put's duplicates in another order
        with __import__("minductor").config.patch(debug=True, debug_dir=str(tmp_path)):
            torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, index, src), fn(x, index, src))
        code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_index_put*.cpp"))
    if cpu_backend == "cpp":
        assert "mi_c0" in code and "#pragma omp simd" in code and "#pragma omp parallel for" in code, code
        if case != "scatter_add":  # (its index changes along the columns)
            loop = code[code.index("#pragma omp simd"):]
            assert "mi_err[0] = 1" not in loop, code
