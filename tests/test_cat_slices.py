"""A large CPU ``torch.cat`` writes each input into its slice of the output, one loop per
input (the first owns the storage, the others store into it at their offset): no loop
evaluates another input's load or mask. Slices of different widths, or reading an input in
common, share a kernel (a loop each inside the common outer loops; the common input read
once); others keep a kernel each, whose stores can stream. Results match eager; small cats
stay one kernel."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from minductor import config, metrics
from minductor.lowering.constructors import CAT_SLICES_MIN_NUMEL


def _compile(fn: Callable[..., Any], *args: torch.Tensor, tmp_path: Path, dynamic: bool = False) -> str:
    """Compile with a debug dump, compare with eager, return the generated module."""
    metrics.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        compiled = torch.compile(fn, backend="minductor", dynamic=dynamic)
        torch.testing.assert_close(compiled(*args), fn(*args))
    return next(tmp_path.glob("graph_*/output_code.py")).read_text()


def _cat_kernels(code: str) -> list[str]:
    """The C++ source of each kernel whose name holds ``cat``."""
    return re.findall(r"cpp_fused\w*cat\w*_source = r'''(.*?)'''", code, re.S)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_each_input_is_written_into_its_slice(tmp_path: Path, dim: int) -> None:
    """Three inputs: a graph input, a transposed view and an unrealized pointwise value."""
    x, y, z = torch.randn(8, 64, 96), torch.randn(8, 96, 64), torch.randn(8, 64, 96)
    code = _compile(lambda x, y, z: torch.cat([x, y.transpose(1, 2), z.exp() * 2], dim), x, y, z, tmp_path=tmp_path)
    kernels = _cat_kernels(code)
    assert len(kernels) == 3, code
    for source in kernels:
        assert "mi_masked_index" not in source and " ? " not in source, source  # no mask, no select
        assert "#pragma omp parallel" in source, source
    assert metrics.buffers_allocated == 1, code  # the output, allocated once


def test_the_cat_feeds_a_reduction_and_a_pointwise_consumer(tmp_path: Path) -> None:
    """Readers of the output run after every slice is written."""
    x, y = torch.randn(256, 300), torch.randn(256, 200)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.cat([x.sin(), y], 1)
        return c.sum(1), (c * 3).t() + 1

    _compile(fn, x, y, tmp_path=tmp_path)


def test_mixed_dtypes_promote_and_inputs_stay_unchanged(tmp_path: Path) -> None:
    x, i = torch.randn(128, 256), torch.randint(-5, 5, (128, 256))
    x0, i0 = x.clone(), i.clone()
    code = _compile(lambda x, i: torch.cat([i, x, i], 0), x, i, tmp_path=tmp_path)
    assert len(_cat_kernels(code)) == 3, code
    assert torch.equal(x, x0) and torch.equal(i, i0)


def test_many_inputs_and_empty_ones(tmp_path: Path) -> None:
    xs = [torch.randn(64, 64) for _ in range(12)]
    empty = torch.randn(0)
    code = _compile(lambda *xs: torch.cat([empty, *xs, empty], 0), *xs, tmp_path=tmp_path)
    assert len(_cat_kernels(code)) == 12, code


def test_symbolic_sizes(tmp_path: Path) -> None:
    """Offsets along the cat dim are expressions in the sizes; a second size reuses the graph."""
    fn = lambda x, y: torch.cat([x, y * 2], 1)  # noqa: E731
    code = _compile(fn, torch.randn(64, 600), torch.randn(64, 500), tmp_path=tmp_path, dynamic=True)
    (source,) = _cat_kernels(code)  # widths apart: a loop per slice inside the shared row loop
    assert "_loop1(" in source and "mi_masked_index" not in source, source
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for n, m in [(32, 700), (128, 300)]:
        x, y = torch.randn(n, m), torch.randn(n, 2 * m)
        torch.testing.assert_close(compiled(x, y), fn(x, y))


def test_small_cat_stays_one_masked_kernel(tmp_path: Path) -> None:
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    assert 2 * x.numel() < CAT_SLICES_MIN_NUMEL
    code = _compile(lambda x, y: torch.cat([x, y + 1], 1), x, y, tmp_path=tmp_path)
    assert len(_cat_kernels(code)) == 1, code


def test_gradients_through_a_large_cat() -> None:
    x = torch.randn(64, 512, requires_grad=True)
    w = torch.randn(64, 256, requires_grad=True)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.cat([x.tanh(), w * 3, x], 1) ** 2).sum()

    compiled = torch.compile(fn, backend="minductor")
    out = compiled(x, w)
    gx, gw = torch.autograd.grad(out, (x, w))
    ex, ew = torch.autograd.grad(fn(x, w), (x, w))
    torch.testing.assert_close(out, fn(x, w))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)


@pytest.mark.parametrize("numel_floor", [CAT_SLICES_MIN_NUMEL, 1 << 62], ids=["slices", "masked"])
def test_channels_last_inputs_give_a_channels_last_result(tmp_path: Path, numel_floor: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager's cat keeps the inputs' common memory format; so does ours, with no copy after."""
    import minductor.lowering.constructors as constructors

    monkeypatch.setattr(constructors, "CAT_SLICES_MIN_NUMEL", numel_floor)
    x = torch.randn(4, 32, 32, 32).to(memory_format=torch.channels_last)
    y = torch.randn(4, 16, 32, 32).to(memory_format=torch.channels_last)
    fn = lambda x, y: torch.cat([x, y * 2], 1)  # noqa: E731
    code = _compile(fn, x, y, tmp_path=tmp_path)
    out = torch.compile(fn, backend="minductor")(x, y)
    assert out.stride() == fn(x, y).stride()
    (source,) = _cat_kernels(code)  # slices of 32 and 16 channels share the pixel loops
    assert (" ? " in source) == (numel_floor != CAT_SLICES_MIN_NUMEL), source  # slices: no select


@pytest.mark.parametrize("shape", [(8, 4, 128, 64), (2, 3, 5, 7)])
def test_heads_merged_into_rows_read_in_contiguous_runs(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """Reading (b, h, t, d) as (b, t, h*d) indexes ``h*d`` through ``/ d`` and ``% d``: the
    pointwise loop over it is split into ``h`` and ``d``, so each inner run is contiguous."""
    b, h, t, d = shape
    q = torch.randn(b, h, t, d)
    code = _compile(lambda q: q.transpose(1, 2).reshape(b, t, h * d) * 2, q, tmp_path=tmp_path)
    assert f"/ {d})" not in code and f"% {d})" not in code, code
    assert re.search(rf"for \(int64_t xo\d = 0; xo\d < {d}; xo\d\+\+\)", code), code


def test_a_dim_cut_at_two_points_is_not_split(tmp_path: Path) -> None:
    """Indices cutting one dim at 4 and at 6 (two reshapes of one flat dim): no single split
    serves both, the loop stays whole and the results still match."""
    x, y = torch.randn(16, 6, 4), torch.randn(16, 4, 6)
    code = _compile(lambda x, y: x.transpose(1, 2).reshape(16, 24) + y.transpose(1, 2).reshape(16, 24), x, y,
                    tmp_path=tmp_path)
    assert "for (int64_t xo1 = 0; xo1 < 24; xo1++)" in code, code


@pytest.mark.parametrize("second", ["other", "same"])
def test_output_may_take_the_storage_of_an_input_that_dies_in_the_first_slice(tmp_path: Path, second: str) -> None:
    """``y`` (as large as the cat) is read by the first slice at exactly the elements it writes:
    the output may take y's storage, but only if no later slice still reads ``y``."""
    x, z = torch.randn(256, 256), torch.randn(256, 128)

    def fn(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        rest = z * 3 if second == "other" else y[:, 128:] + 1
        return torch.cat([y[:, :128], rest], 1)

    code = _compile(fn, x, z, tmp_path=tmp_path)
    assert len(_cat_kernels(code)) == (2 if second == "other" else 1), code  # slices reading y share a kernel


def _stores(source: str) -> int:
    return len(re.findall(r"^\s*(?:out_ptr|in_out_ptr)\d+\[.*\] = ", source, re.M))


def test_rotate_half_reads_each_half_once(tmp_path: Path) -> None:
    """Rotary embeddings' rotate-half: both output halves read both input halves. The slices
    share one loop, which loads each half of ``x`` once (two slice kernels read ``x`` twice)."""
    x, c, s = torch.randn(4, 8, 256, 64), torch.randn(256, 32), torch.randn(256, 32)

    def fn(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :32], x[..., 32:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    (source,) = _cat_kernels(_compile(fn, x, c, s, tmp_path=tmp_path))
    assert len(re.findall(r"= in_ptr0\[", source)) == 2 and _stores(source) == 2, source


def test_slices_of_different_widths_share_the_row_loop(tmp_path: Path) -> None:
    a, b = torch.randn(512, 300), torch.randn(512, 724)
    (source,) = _cat_kernels(_compile(lambda a, b: torch.cat([a * 2, b.relu()], 1), a, b, tmp_path=tmp_path))
    assert "_loop1(" in source and "mi_masked_index" not in source and " ? " not in source, source


def test_a_scatter_into_a_copy_keeps_a_kernel_of_its_own(tmp_path: Path) -> None:
    """Unlike a slice, a scatter's stores may land on elements its copy writes in a later
    iteration: it never shares the copy's kernel (results match eager)."""
    # Distinct rows: which of two writes to one row wins is unspecified, in eager too.
    x, i, v = torch.randn(512, 256), torch.randperm(512)[:64], torch.randn(64, 256)
    code = _compile(lambda x, i, v: (x * 2).index_put((i,), v), x, i, v, tmp_path=tmp_path)
    assert len(re.findall(r"cpp_fused\w*_source = ", code)) == 2, code
