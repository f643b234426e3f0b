"""Pooling (max/avg/adaptive, forward and backward) and padding, lowered to fused loops.

Windows up to ``windows.MAX_UNROLL`` positions are unrolled in eager's order with eager's
update rule, so those results are compared bit for bit; larger windows are Reductions
(float sums reassociate) and compared with the default tolerance.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import config, metrics

EXACT = {"rtol": 0, "atol": 0}


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def check(fn: Callable[..., Any], x: torch.Tensor, *, exact: bool = True, backward: bool = True) -> None:
    """Forward (and backward) match eager, with no aten fallback."""
    tol = EXACT if exact else {}
    xa, xb = x.clone().requires_grad_(backward), x.clone().requires_grad_(backward)
    out = torch.compile(fn, backend="minductor", dynamic=False)(xa)
    ref = fn(xb)
    torch.testing.assert_close(out, ref, equal_nan=True, **tol)
    if backward:
        values = out[0] if isinstance(out, tuple) else out
        grad = torch.randn_like(values)
        values.backward(grad)
        (ref[0] if isinstance(ref, tuple) else ref).backward(grad)
        if x.dtype in (torch.float16, torch.bfloat16):
            # eager accumulates fp16/bf16 gradients in fp16/bf16 (we sum in float32 and
            # round once): compare both with a float64 reference instead
            x64 = x.double().requires_grad_()
            out64 = fn(x64)
            (out64[0] if isinstance(out64, tuple) else out64).backward(grad.double())
            torch.testing.assert_close(xa.grad.double(), x64.grad, rtol=1e-2, atol=2e-2)
        else:
            torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True, **tol)
    assert not metrics.fallback_ops, metrics.fallback_ops


def image(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    torch.manual_seed(sum(shape))
    return torch.randn(shape, dtype=dtype)


# (kernel, stride, padding, dilation, ceil_mode)
MAX_POOL = {
    "k3s2p1": (3, 2, 1, 1, False),
    "k2s2": (2, 2, 0, 1, False),
    "k3s2p1_ceil": (3, 2, 1, 1, True),
    "rect_dilated_ceil": ((2, 3), (1, 2), (1, 0), (2, 1), True),
    "k3s1p1_dilated": (3, 1, 1, 2, False),
}


@pytest.mark.parametrize("case", sorted(MAX_POOL))
def test_max_pool2d_with_indices(case: str) -> None:
    k, s, p, d, c = MAX_POOL[case]
    x = image(2, 3, 9, 10)
    x[0, 0, 2, 3:5] = float("nan")  # two NaNs in one window: eager returns the last one's index
    x[1, 1, :4, :4] = -float("inf")  # all -inf windows: eager returns the first valid position
    check(lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=c, return_indices=True), x)


def test_max_pool_values_keep_the_first_of_equal_values_and_every_nan(tmp_path) -> None:
    """The values alone take the larger by a select eager's rule gives too (``v > best``, then a
    NaN): signed zeros tie as eager's first-seen one, NaN anywhere in a window wins; the kernel
    has no ``||`` of compares (the indices' rule), which cost a fourth op per position."""
    x = torch.zeros(2, 4, 8, 8)
    x[0, :, ::2, ::3] = -0.0
    x[1, :, 1::2, 1::2] = -0.0
    x[0, 1, 3, 3] = float("nan")
    x[1, 2, 0, 0] = float("nan")
    x[1, 3] = torch.randn(8, 8)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(lambda t: F.max_pool2d(t, 3, 2, 1), backend="minductor")(x)
    ref = F.max_pool2d(x, 3, 2, 1)
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(out.signbit(), ref.signbit()) and torch.equal(out.isnan(), ref.isnan())
    (source,) = [p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp")]
    assert "||" not in source and "mi_isnan" in source, source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_max_pool2d_dtypes(dtype: torch.dtype) -> None:
    x = image(2, 3, 7, 7).mul(4).to(dtype)
    check(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), x, backward=dtype.is_floating_point)


@pytest.mark.parametrize("shape", [(1, 2, 3, 6), (1, 2, 4, 10)], ids=str)
def test_pools_where_some_inputs_are_in_no_window(shape: tuple[int, ...]) -> None:
    """Stride above the kernel leaves gaps; ceil_mode can end before the last input."""
    x = image(*shape)
    for k, s in [(3, 2), (2, 3)]:
        torch._dynamo.reset()
        check(lambda t, k=k, s=s: F.max_pool2d(t, k, s, ceil_mode=True), x)
        check(lambda t, k=k, s=s: F.avg_pool2d(t, k, s, ceil_mode=True), x)
        check(lambda t, k=k, s=s: F.avg_pool2d(t, k, s, padding=1, ceil_mode=True, count_include_pad=False), x)


def test_max_pool_1d_3d_channels_last_unbatched() -> None:
    check(lambda t: F.max_pool1d(t, 3, 2, 1, return_indices=True), image(2, 3, 9))
    check(lambda t: F.max_pool3d(t, 2, 2, 1, return_indices=True), image(2, 3, 5, 6, 7))
    check(lambda t: F.max_pool2d(t, 3, 2, 1), image(2, 3, 9, 9).to(memory_format=torch.channels_last))
    check(lambda t: F.max_pool2d(t, 3, 2, 1), image(3, 9, 9))


def test_max_pool_big_window_falls_back() -> None:
    fn = torch.compile(lambda t: F.max_pool2d(t, 7, 1, 3), backend="minductor")
    torch.testing.assert_close(fn(image(1, 2, 9, 9)), F.max_pool2d(image(1, 2, 9, 9), 7, 1, 3))
    assert metrics.fallback_ops


# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_POOL = {
    "k3s2p1": (3, 2, 1, False, True, None),
    "k3s2p1_ceil_exclude_pad": (3, 2, 1, True, False, None),
    "k3s2p1_ceil_include_pad": (3, 2, 1, True, True, None),
    "k2s2": (2, 2, 0, False, True, None),
    "rect_ceil": ((2, 3), (1, 2), (1, 0), True, True, None),
    "divisor_override": (3, 1, 1, False, False, 5),
}


@pytest.mark.parametrize("case", sorted(AVG_POOL))
def test_avg_pool2d(case: str) -> None:
    k, s, p, c, cip, div = AVG_POOL[case]
    check(lambda t: F.avg_pool2d(t, k, s, p, c, cip, div), image(2, 3, 9, 10))


def test_avg_pool_big_window_is_a_reduction() -> None:
    check(lambda t: F.avg_pool2d(t, 6, 3, 3, ceil_mode=True, count_include_pad=False), image(2, 3, 9, 10), exact=False)


@pytest.mark.parametrize("shape", [(2, 6, 2, 2), (1, 3, 3, 5)], ids=str)
def test_windows_larger_than_their_input_sum_only_what_they_can_hold(shape: tuple[int, ...], tmp_path: Any) -> None:
    """HF EfficientNet pools its last 2x2 map with ``AvgPool2d(640, ceil_mode=True)``: a window
    element past the input (and its padding) holds nothing at any output, so the window is
    clipped to the input before it is summed: 4 unrolled loads, not a Reduction over 409600
    masked positions (137 ms a call); the divisor still follows eager's rule."""
    x = image(*shape)
    cases = [lambda t: F.avg_pool2d(t, 640, ceil_mode=True),
             lambda t: F.avg_pool2d(t, (7, 9), None, (1, 1), ceil_mode=True, count_include_pad=True),
             lambda t: F.avg_pool2d(t, (7, 9), None, (1, 1), ceil_mode=True, count_include_pad=False),
             lambda t: F.max_pool2d(t, 64, ceil_mode=True, return_indices=True),
             lambda t: F.max_pool2d(t, (4, 40), (10, 40), (0, 1), dilation=(3, 1), ceil_mode=True, return_indices=True)]
    for i, fn in enumerate(cases):
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / str(i))):
            check(fn, x)
        sources = [p.read_text() for p in (tmp_path / str(i)).glob("graph_*/cpp_fused_*.cpp")]
        assert sources and not any("ri0" in src for src in sources), sources  # no reduction loop


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_avg_pool2d_dtypes(dtype: torch.dtype) -> None:
    check(lambda t: F.avg_pool2d(t, 3, 2, 1), image(2, 3, 9, 9, dtype=dtype))


def test_avg_pool_1d_3d() -> None:
    check(lambda t: F.avg_pool1d(t, 3, 2, 1), image(2, 3, 9))
    check(lambda t: F.avg_pool3d(t, 2, 2, 1, ceil_mode=True, count_include_pad=False), image(2, 3, 5, 6, 7))


@pytest.mark.parametrize("out", [(3, 5), (4, 4), (5, 7), (9, 10), (9, None), (1, 1), (2, 1)], ids=str)
def test_adaptive_pool2d(out: tuple[int, int | None]) -> None:
    x = image(2, 3, 9, 10)
    exact = out not in [(1, 1), (2, 1)]  # windows above MAX_UNROLL reduce in another order
    check(lambda t: F.adaptive_avg_pool2d(t, out), x, exact=exact)
    torch._dynamo.reset()
    check(lambda t: F.adaptive_max_pool2d(t, out, return_indices=True), x)


def test_adaptive_avg_pool_big_windows() -> None:
    """Windows above MAX_UNROLL: the rows of a 2-D window unrolled, its last dim reduced over
    whole 16-lane vectors past the window's end (masked); a 3-D window too big to unroll
    reduced over all its dims."""
    check(lambda t: F.adaptive_avg_pool2d(t, 7), image(2, 5, 128, 121), exact=False)
    check(lambda t: F.adaptive_avg_pool2d(t, (3, 2)), image(2, 3, 40, 41, dtype=torch.float16), exact=False)
    check(lambda t: F.adaptive_avg_pool1d(t, 3), image(2, 3, 70), exact=False)
    check(lambda t: F.adaptive_avg_pool3d(t, 2), image(1, 2, 30, 31, 33), exact=False)


# big windows whose lead dims shrink 4x or more: (fn, input, the first pass's row length, or
# the size of its buffer where the passes cannot share a kernel: a first pass that is a Reduction)
TWO_PASS = {
    "adaptive_20x20": (lambda t: F.adaptive_avg_pool2d(t, 7), image(2, 3, 128, 121), 121),
    "adaptive_half": (lambda t: F.adaptive_avg_pool2d(t, (3, 2)), image(2, 3, 40, 41, dtype=torch.float16), 41),
    "adaptive_wide_last": (lambda t: F.adaptive_avg_pool2d(t, (3, 5)), image(1, 2, 40, 200), (1, 2, 3, 200)),
    "adaptive_3d": (lambda t: F.adaptive_avg_pool3d(t, 2), image(1, 2, 30, 31, 33), (1, 2, 2, 2, 33)),
    "adaptive_channels_last": (lambda t: F.adaptive_avg_pool2d(t, 5),
                               image(2, 3, 50, 45).to(memory_format=torch.channels_last), 45),
    "avg_8x8": (lambda t: F.avg_pool2d(t, 8), image(2, 3, 64, 64), 64),
    "avg_pad_ceil_exclude": (lambda t: F.avg_pool2d(t, (9, 7), (6, 5), (4, 3), ceil_mode=True, count_include_pad=False),
                             image(2, 3, 50, 47), 47),
}


@pytest.mark.parametrize("case", list(TWO_PASS))
def test_big_windows_sum_in_two_passes(case: str, tmp_path: Any) -> None:
    """A big window sums its lead dims' windows at every position of the last dim, then the
    last dim's windows of those: both passes in one kernel, the first pass's row in a row
    scratch (no buffer), unless a pass is a Reduction (a 3-D window's lead, a last window above
    MAX_UNROLL); forward and backward match eager."""
    fn, x, first = TWO_PASS[case]
    check(fn, x, exact=False)
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        torch.compile(fn, backend="minductor")(x)
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    if isinstance(first, int):
        assert f"float mi_row0[{first}];  // buf0, one row of it" in code, code
        assert code.count("arg0_1.data_ptr()") == 1 and "buf0 =" not in code, code
    else:
        assert f"take(0, {first}" in code or f"empty_strided({first}" in code, code


def test_overlapping_big_windows_sum_in_one_pass(tmp_path: Any) -> None:
    """Stride-1 big windows barely shrink the lead dims: no buffer the input's size."""
    fn = lambda t: F.avg_pool2d(t, 7, 1, 3)  # noqa: E731
    check(fn, image(2, 3, 20, 21), exact=False, backward=False)  # its backward falls back to aten
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        torch.compile(fn, backend="minductor")(image(2, 3, 20, 21))
    assert len(list(tmp_path.glob("graph_*/cpp_*.cpp"))) == 1


def test_adaptive_pool_1d_3d_half() -> None:
    check(lambda t: F.adaptive_avg_pool3d(t, (2, 3, 2)), image(2, 3, 5, 6, 7))
    check(lambda t: F.adaptive_max_pool3d(t, (2, 3, 2), return_indices=True), image(2, 3, 5, 6, 7))
    check(lambda t: F.adaptive_avg_pool1d(t, 4), image(2, 3, 9))
    check(lambda t: F.adaptive_max_pool1d(t, 4, return_indices=True), image(2, 3, 9))
    check(lambda t: F.adaptive_avg_pool2d(t, 3), image(2, 3, 9, 9, dtype=torch.float16))


def check_dynamic(fn: Callable[..., Any], shapes: list[tuple[int, ...]], *, exact: bool = True,
                  backward: bool = True) -> None:
    """Compiled once with symbolic sizes, run at each shape: forward (and backward) match eager,
    with no aten fallback and no second graph per direction."""
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    tol = EXACT if exact else {}
    for shape in shapes:
        x = image(*shape)
        xa, xb = x.clone().requires_grad_(backward), x.clone().requires_grad_(backward)
        out, ref = compiled(xa), fn(xb)
        torch.testing.assert_close(out, ref, equal_nan=True, **tol)
        if backward:
            grad = torch.randn_like(out[0] if isinstance(out, tuple) else out)
            (out[0] if isinstance(out, tuple) else out).backward(grad)
            (ref[0] if isinstance(ref, tuple) else ref).backward(grad)
            torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True, **tol)
    assert not metrics.fallback_ops, metrics.fallback_ops
    assert metrics.graphs_compiled == 1 + backward, metrics.graphs_compiled


# spatial sizes of one symbolic graph: odd and even, each ceil_mode case's last window falling
# inside and past the input (within what one trace guards)
DYNAMIC_SHAPES = [(2, 3, 9, 10), (3, 2, 12, 7), (2, 3, 17, 23)]


@pytest.mark.parametrize("case", sorted(MAX_POOL))
def test_max_pool_over_symbolic_sizes(case: str) -> None:
    k, s, p, d, c = MAX_POOL[case]
    check_dynamic(lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=c, return_indices=True), DYNAMIC_SHAPES)


@pytest.mark.parametrize("case", sorted(AVG_POOL))
def test_avg_pool_over_symbolic_sizes(case: str) -> None:
    k, s, p, c, cip, div = AVG_POOL[case]
    check_dynamic(lambda t: F.avg_pool2d(t, k, s, p, c, cip, div), DYNAMIC_SHAPES)


@pytest.mark.parametrize("out", [(1, 1), (2, 1), (3, 5), 7], ids=str)
def test_adaptive_pools_over_symbolic_sizes(out: Any) -> None:
    """Windows of symbolic extent are Reductions (masked past a window's end unless one window
    covers the dim). A backward needs each input's outputs bounded at every size: with 2
    outputs the input is at least as large (Dynamo's sizes are >= 2), with 3 or more it may not
    be, and that backward is aten's (checked below). Output sizes of a module stay numbers."""
    shapes = [(2, 3, 9, 10), (3, 2, 12, 17), (2, 3, 23, 8)]
    backward = out in [(1, 1), (2, 1)]
    check_dynamic(torch.nn.AdaptiveAvgPool2d(out), shapes, exact=False, backward=backward)
    torch._dynamo.reset()
    metrics.reset()
    check_dynamic(torch.nn.AdaptiveMaxPool2d(out, return_indices=True), shapes, backward=backward)


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_adaptive_pools_to_symbolic_sizes(pool: str) -> None:
    """An output size Dynamo made symbolic (a closure's int under dynamic=True) lowers too; the
    backward, with no bound on the outputs holding an input, is aten's."""
    fn = {"avg": F.adaptive_avg_pool2d, "max": F.adaptive_max_pool2d}[pool]
    compiled = torch.compile(lambda t, size: fn(t, size), backend="minductor", dynamic=True)
    for shape, size in [((2, 3, 9, 10), (3, 5)), ((3, 2, 12, 7), (4, 9)), ((2, 3, 5, 6), (7, 2))]:
        x = image(*shape).requires_grad_()
        ref = image(*shape).requires_grad_()
        out, expected = compiled(x, size), fn(ref, size)
        torch.testing.assert_close(out, expected)
        out.backward(torch.ones_like(out))
        expected.backward(torch.ones_like(out))
        torch.testing.assert_close(x.grad, ref.grad)
    assert set(metrics.fallback_ops) == {f"aten.{'_' if pool == 'avg' else ''}adaptive_{pool}_pool2d_backward"}, \
        metrics.fallback_ops


def test_pools_3d_over_symbolic_sizes() -> None:
    """(max_pool1d without indices specializes its length while Dynamo traces it.)"""
    check_dynamic(lambda t: F.max_pool3d(t, 3, 2, 1, ceil_mode=True, return_indices=True),
                  [(2, 3, 5, 6, 7), (3, 2, 6, 9, 4)])
    torch._dynamo.reset()
    metrics.reset()
    check_dynamic(lambda t: F.avg_pool3d(t, 2, 2, 1, ceil_mode=True, count_include_pad=False),
                  [(2, 3, 5, 6, 7), (3, 2, 7, 8, 5)])  # (ceil_mode's last window: by parity here)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_reflection_replication_pad(mode: str) -> None:
    exact_grad = True  # both backwards sum in eager's order
    check(lambda t: F.pad(t, (1, 2, 3, 0), mode=mode) * 2, image(2, 3, 6, 7), exact=exact_grad)
    check(lambda t: F.pad(t, (3, 2), mode=mode), image(2, 1 if mode == "replicate" else 5), exact=exact_grad)
    check(lambda t: F.pad(t, (1, 2, 2, 1, 1, 1), mode=mode), image(1, 2, 3, 4, 5), exact=exact_grad)
    check(lambda t: F.pad(t, (1, 2, 2, 1), mode=mode), image(1, 2, 3, 4).to(memory_format=torch.channels_last),
          exact=exact_grad)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dynamic", [None, True], ids=["static_sizes", "dynamic_sizes"])
def test_reflection_replication_pad_with_symbolic_widths(mode: str, dynamic: bool | None) -> None:
    """Pad widths that are graph inputs (symbolic once Dynamo sees them change, or under
    dynamic=True) fall back to aten: the lowerings converted them to ints and failed to
    compile (nn.functional.pad.replicate in the OpInfo sweep under dynamic shapes)."""
    def fn(x: torch.Tensor, pad: tuple[int, int]) -> torch.Tensor:
        return F.pad(x, pad, mode=mode) * 2

    compiled = torch.compile(fn, backend="minductor", dynamic=dynamic)
    x = image(2, 3, 6)
    for pad in [(1, 2), (2, 1), (3, 0)]:
        torch.testing.assert_close(compiled(x, pad), fn(x, pad), **EXACT)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_reflection_replication_pad_of_symbolic_sizes(mode: str) -> None:
    """Constant widths around dims of symbolic size (stft centering a signal of dynamic
    length) lower, forward and backward: the padded sizes were made SymPy Integers, and
    reflection's check that the widths are below the size compared a symbol."""
    metrics.reset()
    check_dynamic(lambda t: F.pad(t, (1, 2, 3, 0), mode=mode) * 2, DYNAMIC_SHAPES)
    metrics.reset()
    check_dynamic(lambda t: F.pad(t[0], (3, 2), mode=mode) - 1, DYNAMIC_SHAPES)


def test_pool_fuses_with_neighbours() -> None:
    """A pool reads its producer through masked loads: relu -> pad -> pool is one kernel."""
    fn = torch.compile(lambda t: F.avg_pool2d(F.pad(t.relu(), (1, 1, 1, 1)), 3, 2), backend="minductor")
    x = image(2, 3, 8, 8)
    torch.testing.assert_close(fn(x), F.avg_pool2d(F.pad(x.relu(), (1, 1, 1, 1)), 3, 2))
    assert not metrics.fallback_ops and metrics.generated_kernel_count == 1
