"""Upsampling decomposes into gathers whose indices are index math of the output position (a
source coordinate: an arange scaled, clamped and truncated). That math is computed once per
row or per kernel, not per element, so it must neither make the gathers look costly enough to
store (a bilinear upsample wrote two outputs' worth of intermediates) nor keep the loop scalar
(the source row, invariant in the innermost loop, left in it: GCC 12 gave up on the loop)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import vectorization_report

from minductor import config, metrics
from minductor.codegen.cpp_windows import window_sizes
from minductor.ir.nodes import Pointwise
from minductor.ir.ops import ops
from minductor.runtime.cache import vector_gathers_pay_off


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_upsample_is_one_kernel_that_allocates_only_its_output(mode: str, layout: str) -> None:
    x = torch.randn(2, 8, 10, 12)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    fn = lambda x: F.interpolate(x, scale_factor=2, mode=mode)  # noqa: E731
    out = torch.compile(fn, backend="minductor")(x)
    torch.testing.assert_close(out, fn(x), atol=1e-5, rtol=1e-5)
    assert out.stride() == fn(x).stride()
    assert metrics.generated_kernel_count == 1 and metrics.buffers_allocated == 1


def test_upsample_loop_vectorizes_with_its_source_row_computed_before_it(tmp_path: Path) -> None:
    """The row's source index is computed and checked before the innermost loop; where gathers
    pay off or window gathers replace them, that loop vectorizes (elsewhere gather loops are
    left scalar by design)."""
    x = torch.randn(2, 8, 10, 12)
    fn = lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x))
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    code = path.read_text()
    *outer, inner = [m.group(1) for m in re.finditer(r"for \(int64_t (xo\d) = 0; ", code)]
    if not vector_gathers_pay_off() and 4 not in window_sizes():
        assert "omp simd" not in code
        return
    head = code[:code.rindex(f"for (int64_t {inner} = 0; {inner}")]
    body = code[code.rindex(f"for (int64_t {inner} = 0; {inner}"):]
    # the source row (of the second-innermost variable) is computed before the loop, not in it
    assert f"static_cast<int64_t>({outer[-1]})" in head and f"static_cast<int64_t>({outer[-1]})" not in body, code
    line = code[:code.rindex(f"for (int64_t {inner} = 0; {inner}")].count("\n") + 1
    report = vectorization_report(path, tmp_path)
    assert re.search(rf"{path.name}:({line - 1}|{line}):\d+: optimized: loop vectorized", report), report  # (pragma or for)


def test_op_count_skips_index_math_and_counts_shared_values_once() -> None:
    """``Loops.opcount``: ops on loaded data, counted as CSE leaves them (a value read twice is
    computed once); ops on indices alone only in the total."""
    def inner_fn(index):
        (i,) = index
        row = ops.to_dtype(ops.mul(ops.index_expr(i, torch.int64), ops.constant(2, torch.int64)), torch.float32)
        a = ops.load("x", i)
        shared = ops.exp(ops.add(a, row))
        return ops.add(ops.mul(shared, shared), ops.mul(shared, shared))

    node = Pointwise(device=torch.device("cpu"), dtype=torch.float32, inner_fn=inner_fn, ranges=[8])
    data_ops, loads, transcendental, all_ops, _ = node.opcount()
    assert (data_ops, loads, transcendental) == (4, 1, 1)  # add, exp, mul, add; one load
    assert all_ops == data_ops + 4  # index_expr, constant, mul, to_dtype


def test_linear_1d_upsample_tables_its_indices_and_weights(tmp_path: Path) -> None:
    """The source indices and weights of a 1-D linear upsample depend only on the output column:
    computed once into tables before the rows (2048 columns here), not per element of every
    row (the kernel at (1, 1024, 1024): 2.8 -> 0.53 ms); results as eager's."""
    x = torch.randn(2, 64, 1024)
    fn = lambda x: F.interpolate(x, scale_factor=2, mode="linear")  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x))
    (source,) = tmp_path.glob("graph_*/cpp_fused_*.cpp")
    assert "mi_table0[2048]" in source.read_text()


@pytest.mark.parametrize("case", ["2x", "4x", "2x1", "3d_2x", "1d_2x", "3x_scatter", "channels_last"])
def test_nearest_backward_at_whole_scales_sums_windows(case: str, tmp_path: Path) -> None:
    """The backward of a nearest upsample by powers of two is a pure pointwise sum of each
    input element's window of the output gradient (its index tensors recomputed from aranges
    in the backward, not saved): no serial scatter. A scale of 3 (index steps eager computes
    in inexact floats) keeps the scatter. Gradients against eager."""
    shape, kwargs = {"2x": ((2, 3, 5, 7), {"scale_factor": 2}), "4x": ((2, 3, 5, 7), {"scale_factor": 4}),
                     "2x1": ((2, 3, 5, 7), {"scale_factor": (2, 1)}), "3d_2x": ((2, 3, 4, 5, 3), {"scale_factor": 2}),
                     "1d_2x": ((2, 3, 9), {"scale_factor": 2}), "3x_scatter": ((2, 3, 5, 7), {"scale_factor": 3}),
                     "channels_last": ((2, 3, 5, 7), {"scale_factor": 2})}[case]
    x = torch.randn(shape)
    if case == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    weight = torch.randn(F.interpolate(x.detach(), **kwargs).shape)

    def grads(x: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad((F.interpolate(x, **kwargs) * weight).sum(), [x])[0]

    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(grads, backend="minductor")(x)
    torch.testing.assert_close(got, grads(x))
    kernels = sorted(p.name for p in tmp_path.glob("graph_*_backward/cpp_*.cpp"))
    scatter = any("full" in name for name in kernels)  # (a scatter fills a zeroed buffer first)
    assert scatter == (case == "3x_scatter") and len(kernels) == (2 if scatter else 1), kernels
