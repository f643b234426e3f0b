"""Reduction lowerings against eager: sum prod mean amax amin argmax argmin any all var std var_mean,
over one dim, several dims, all dims, negative dims, keepdim, ``dtype=``, int/bool inputs,
non-contiguous layouts, ties and NaN.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LAYOUT_NAMES, check, check_named, make

from minductor import config

# every test runs with the C++ and the Triton (interpreter) code generator
pytestmark = pytest.mark.usefixtures("cpu_backend")

F32, F64, I32, I64, BOOL = torch.float32, torch.float64, torch.int32, torch.int64, torch.bool
NAN, INF = float("nan"), float("inf")

FLOAT_REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "prod": lambda x, d, k: (x * 0.5 + 1).prod(d, keepdim=k) if isinstance(d, int) else (x * 0.1 + 1).prod(),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "argmax": lambda x, d, k: x.argmax(d, keepdim=k) if isinstance(d, int) else x.argmax(),
    "argmin": lambda x, d, k: x.argmin(d, keepdim=k) if isinstance(d, int) else x.argmin(),
    "any": lambda x, d, k: (x > 1).any(d, keepdim=k),
    "all": lambda x, d, k: (x > -2).all(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k),
    "var_unbiased0": lambda x, d, k: x.var(d, keepdim=k, correction=0),
    "std": lambda x, d, k: x.std(d, keepdim=k),
    "var_mean": lambda x, d, k: torch.var_mean(x, d, keepdim=k),
    "std_mean": lambda x, d, k: torch.std_mean(x, d, keepdim=k, correction=0),
    "max_dim": lambda x, d, k: x.max(d, keepdim=k) if isinstance(d, int) else x.max(),
    "min_dim": lambda x, d, k: x.min(d, keepdim=k) if isinstance(d, int) else x.min(),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
    "norm": lambda x, d, k: torch.linalg.vector_norm(x, 2, d, keepdim=k),
}

# (dims, keepdim) on a (5, 6, 7) input: single, negative, several and all dims, keepdim alternating
CASES = [(0, False), (1, True), (-1, False), (-2, True), ((0, 1), False), ((0, 2), True), ((-1, -3), False),
         ((0, 1, 2), True), ((0, 1, 2), False)]


def input3d(case: int) -> torch.Tensor:
    """A (5, 6, 7) float32 input; the layout rotates with the case: contiguous, transposed, strided slice."""
    torch.manual_seed(case)
    base = torch.randn(7, 6, 5)
    return [
        base.permute(2, 1, 0).contiguous(),
        base.permute(2, 1, 0),
        torch.cat([base, base], 0).permute(2, 1, 0)[:, :, ::2],
    ][case % 3]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"dims={d}-keepdim={k}" for d, k in CASES])
def test_float_reductions(case: int) -> None:
    """One graph per (dims, keepdim): every reduction op (those taking one dim only when dims is one int
    or all dims), so reductions over the same range can fuse."""
    dims, keepdim = CASES[case]
    one_dim_only = {"argmax", "argmin", "max_dim", "min_dim"}
    ops = {n: op for n, op in FLOAT_REDUCTIONS.items()
           if n not in one_dim_only or isinstance(dims, int) or not keepdim and dims == (0, 1, 2)}
    check_named({n: (lambda x, op=op: op(x, dims, keepdim)) for n, op in ops.items()}, input3d(case),
                rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["scalar", "size1"])
def test_reduction_0d_and_size1(layout: str) -> None:
    """Reducing a 0-d tensor over dim 0 / -1, and a (1, 1) tensor over each dim: one graph."""
    x = make(layout, F32)
    dims: list[Any] = [0, -1] if layout == "scalar" else [0, 1, -1, (0, 1)]
    fns = {}
    for name in ["sum", "prod", "mean", "amax", "amin", "var_unbiased0", "argmax", "argmin", "any", "all", "max_dim"]:
        for d in dims:
            if name in ("argmax", "argmin", "max_dim") and not isinstance(d, int):
                continue
            for k in (False, True):
                fns[f"{name}(dim={d}, keepdim={k})"] = lambda x, op=FLOAT_REDUCTIONS[name], d=d, k=k: op(x, d, k)
    fns["sum()"] = torch.sum
    fns["argmax()"] = torch.argmax
    check_named(fns, x)


def test_full_reductions_no_dim() -> None:
    x = make("transposed", F32)
    check(lambda x: (x.sum(), x.mean(), x.prod(), x.amax(), x.amin(), x.max(), x.min(), x.argmax(), x.argmin(),
                     x.any(), (x > -10).all(), x.var(), x.std(), torch.var_mean(x), x.norm()), x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [I64, I32, BOOL], ids=["i64", "i32", "bool"])
def test_int_bool_reductions(dtype: torch.dtype) -> None:
    """sum/prod of ints and bools accumulate in int64; any/all give bool; amax/amin keep the dtype."""
    x = make("transposed", dtype, low=-3, high=4)
    check(lambda x: (x.sum(), x.sum(0), x.sum(-1, keepdim=True), x.prod(0), x.prod(), x.any(), x.any(1),
                     x.all(), x.all(0), x.amax(0), x.amin(-1), x.max(), x.min())
          + ((x.argmax(1), x.argmin(0)) if x.dtype != BOOL else ()), x)


def test_int_mean_with_dtype() -> None:
    x = make("sliced", I64)
    check(lambda x: (x.mean(0, dtype=F32), x.float().mean(), x.sum(1, dtype=F64), x.sum(dtype=I32)), x)


def test_reduction_dtype_argument() -> None:
    x = make("contiguous", F32)
    b = make("transposed", BOOL)
    i = make("sliced", I32)
    check(lambda x, b, i: (x.sum(0, dtype=F64), x.mean(-1, dtype=F64), x.prod(1, dtype=F64),
                           b.sum(0, dtype=I32), b.sum(dtype=F32), i.sum(1, dtype=I64), i.prod(dtype=F64),
                           i.sum(dtype=torch.int8), torch.sum(x, (0, 1), dtype=F64)), x, b, i)


def test_float64_reductions() -> None:
    x = make("sliced", F64)
    check(lambda x: (x.sum(0), x.mean(1), x.var(0), x.std(), x.amax(1), x.argmin(0), x.prod()), x)


def test_large_sum_precision() -> None:
    """A long float32 row: compare with a float64 reference (summation order may differ)."""
    torch.manual_seed(0)
    x = torch.rand(3, 100_003)
    out = torch.compile(lambda x: (x.sum(1), x.mean(), x.var(1)), backend="minductor")(x)
    xd = x.double()
    for got, ref in zip(out, (xd.sum(1), xd.mean(), xd.var(1))):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-3)


def test_var_welford_large_offset() -> None:
    """Variance of values with a large common offset must not cancel catastrophically."""
    x = torch.randn(4, 1000) + 1e4
    out = torch.compile(lambda x: x.var(1), backend="minductor")(x)
    torch.testing.assert_close(out.double(), x.double().var(1), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape", [(64, 300), (3, 2048)], ids=["short_rows", "longest_two_pass"])
def test_two_pass_variance_is_close_to_float64(shape) -> None:
    """Rows of at most TWO_PASS_MAX take the mean, then the squared deviations from it: with a
    large common offset the variance stays within 1e-4 of float64's (Welford's running mean
    was off by 3.6e-4 on 64x300 values around 1e4)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape) + 1e4
    var, mean = torch.compile(lambda x: torch.var_mean(x, 1), backend="minductor")(x)
    ref_var, ref_mean = torch.var_mean(x.double(), 1)
    assert (var.double() - ref_var).abs().max() < 1e-4
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dims,base", [((1,), (64, 1, 3)), ((0,), (1, 5, 3)), ((0, 2), (1, 5, 1))],
                         ids=["rows", "columns", "batch_norm_dims"])
def test_two_pass_statistics_of_equal_values_are_exact(dims, base) -> None:
    """Corrected two-pass: the deviations' sum refines the mean, so rows (or columns) of one
    repeated value have exactly that mean and a variance of 0, as eager's; a layer_norm of such
    rows is 0 (it was the rounding of n*x/n over sqrt(eps), up to 6e-4 here)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = (torch.randn(base) * 7.3).expand(64, 5, 3).contiguous()
    fn = lambda x: (*torch.var_mean(x, dims, correction=0), F.layer_norm(x.movedim(dims[0], -1), (x.shape[dims[0]],)))  # noqa: E731
    for got, ref in zip(torch.compile(fn, backend="minductor")(x), fn(x)):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert not fn(x)[0].any() and not fn(x)[2].any()  # eager's exact zeros, the reference


@pytest.mark.parametrize("shape", [(5, 2049), (3, 4099), (2, 8192)], ids=["past_two_pass", "tail", "even"])
def test_welford_long_rows(shape) -> None:
    """Rows past TWO_PASS_MAX keep Welford, over WELFORD_LANES lanes on AVX-512 (the lanes'
    weights, the tail past the last whole group, the combine): variance, mean and layer_norm
    against float64, with a common offset."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 50
    w, b = torch.randn(shape[1]), torch.randn(shape[1])
    fn = lambda x, w, b: (*torch.var_mean(x, 1), F.layer_norm(x, (shape[1],), w, b))
    var, mean, ln = torch.compile(fn, backend="minductor")(x, w, b)
    ref_var, ref_mean, ref_ln = fn(x.double(), w.double(), b.double())
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-5, atol=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(ln.double(), ref_ln, rtol=1e-4, atol=1e-4)


def test_welford_lanes() -> None:
    """Long Welford rows take WELFORD_LANES lanes where the kernels get AVX-512; sums take four
    vectors (64 lanes on AVX-512, MAX_LANES on AVX2), and AVX2 (16 registers) keeps MAX_LANES
    for Welford too."""
    import sympy

    from minductor import config
    from minductor.codegen import loop_shapes
    from minductor.runtime.cache import avx512_enabled

    row = sympy.Integer(4096)
    welford = loop_shapes.WELFORD_LANES if avx512_enabled(config.cxx) else loop_shapes.MAX_LANES
    assert loop_shapes.inner_lanes(row, welford=True) == (welford, welford)
    sums = 2 * loop_shapes.MAX_LANES if avx512_enabled(config.cxx) else loop_shapes.MAX_LANES
    assert loop_shapes.inner_lanes(row) == (sums, sums) == (loop_shapes.long_row_lanes(),) * 2
    assert loop_shapes.inner_lanes(sympy.Integer(512), welford=True) == (16, 16)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
def test_var_correction_edge_cases() -> None:
    """var of a single element (unbiased: NaN, or inf/NaN with correction > n)."""
    x = torch.randn(4, 1)
    check(lambda x: (x.var(1), x.var(1, correction=0), x.var(1, correction=2), x.std(1), torch.var_mean(x, 1)), x)


def test_argmax_ties_first_index() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, -5.0, -1.0, -5.0]])
    check(lambda x: (x.argmax(1), x.argmin(1), x.argmax(0), x.argmin(0), x.argmax(), x.argmin(), x.max(1), x.min(1),
                     x.t().argmax(0), x.long().argmax(1)), x)


def test_argmax_ties_long_row() -> None:
    """Ties across vector lanes / threads: the smallest index must still win."""
    x = torch.zeros(3, 1000)
    x[0, 100] = x[0, 900] = 5.0
    x[1, 999] = x[1, 1] = -5.0
    check(lambda x: (x.argmax(1), x.argmin(1), x.argmax(), x.argmin(), x.max(1), x.min(1)), x)


def test_argmax_nan() -> None:
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [INF, 2.0, NAN, -INF], [-INF, -INF, 0.0, 1.0], [0.0, 0.0, 0.0, NAN]])
    check(lambda x: (x.argmax(1), x.argmin(1), x.argmax(0), x.argmin(0), x.argmax(), x.argmin()), x)


def test_max_min_amax_nan_propagate() -> None:
    x = torch.tensor([[1.0, NAN, 3.0], [INF, 2.0, -INF], [NAN, NAN, 0.0]])
    check(lambda x: (x.amax(1), x.amin(1), x.amax(0), x.amin(), x.max(1), x.min(0), x.max(), x.sum(1),
                     x.mean(0)), x)


def test_nan_in_long_row() -> None:
    x = torch.randn(2, 999)
    x[0, 500] = NAN
    check(lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.max(1)), x)


def test_any_all_float_and_nan() -> None:
    x = torch.tensor([[0.0, NAN], [0.0, -0.0], [1.0, 2.0]])
    check(lambda x: (x.any(1), x.all(1), x.any(), x.all(), x.bool().any(0)), x)


def test_empty_reductions() -> None:
    x = torch.randn(3, 0)
    check(lambda x: (x.sum(1), x.prod(1), x.any(1), x.all(1), x.sum(), x.mean(1)), x)


def test_reduction_then_pointwise_broadcast() -> None:
    x = make("transposed", F32)
    check(lambda x: (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5), x, rtol=1e-4, atol=1e-5)


def test_two_reductions_same_input() -> None:
    x = torch.randn(8, 33)
    check(lambda x: (x.sum(0), x.sum(1), x.amax(0) - x.amin(1).sum(), (x * x).sum(1).sqrt()), x, rtol=1e-4,
          atol=1e-5)


def test_softmax_log_softmax() -> None:
    x = make("sliced", F32)
    y = torch.tensor([[0.0, -INF, 1.0], [-INF, -INF, 2.0], [1000.0, 1000.0, -1000.0]])
    check(lambda x, y: (x.softmax(-1), x.softmax(0), x.log_softmax(1), y.softmax(-1), y.log_softmax(1),
                        x.double().softmax(-1), x.softmax(0, dtype=F64)), x, y)


def test_softmax_all_masked_row() -> None:
    y = torch.full((2, 4), -INF)
    y[1] = 0.0
    check(lambda y: y.softmax(-1), y)


def test_reductions_of_expanded_and_0d_inputs() -> None:
    s = make("scalar", F32)
    e = make("expanded", F32)
    check(lambda s, e: (s.expand(3, 4).sum(0), e.sum(0), e.mean(1), e.argmax(0), e.var(0), (e + s).amax()), s, e)


def test_cumsum_like_sum_of_arange() -> None:
    x = torch.arange(24, dtype=I64).reshape(2, 3, 4)
    check(lambda x: (x.sum((0, 2)), x.sum(-1, keepdim=True) * x, x.prod(0), x.amax((1, 2))), x)


def test_int64_sum_no_overflow_to_int32() -> None:
    x = torch.full((4, 1000), 2**31 - 1, dtype=I32)
    check(lambda x: (x.sum(1), x.sum(), x.to(I64).sum(0)), x)


def test_bool_sum_counts() -> None:
    x = torch.rand(5, 300) > 0.3
    check(lambda x: (x.sum(1), x.sum(), x.int().sum(0), x.float().mean(1)), x)


def test_reduction_inner_size_not_multiple_of_vector_width() -> None:
    x = torch.randn(5, 17, 13)
    check(lambda x: (x.sum(-1), x.amax(1), x.argmin(-1), x.var((0, 2)), x.permute(2, 0, 1).sum(0)), x,
          rtol=1e-4, atol=1e-5)


def run_layouts(op: Callable[[torch.Tensor], Any], dtype: torch.dtype) -> None:
    xs = [make(n, dtype) for n in LAYOUT_NAMES]
    check(lambda *xs: tuple(op(x) for x in xs), *xs)


def test_sum_mean_on_every_layout() -> None:
    run_layouts(lambda x: (x.sum(-1), x.mean(0), x.sum(), x.amax(), x.argmax(), x.var(-1, correction=0)), F32)


def test_var_mean_keepdim_tuple() -> None:
    x: Any = torch.randn(3, 4, 5)
    check(lambda x: torch.var_mean(x, (0, 2), keepdim=True, correction=0) + torch.var_mean(x, -1, correction=1), x)


def test_any_all_uint8_keep_dtype() -> None:
    x = torch.tensor([[0, 1, 2], [0, 0, 0]], dtype=torch.uint8)
    check(lambda x: (x.any(1), x.all(1), x.any(), x.all()), x)


@pytest.mark.parametrize("cols", [3000, 700, 130], ids=["tiles1024", "tiles256", "tiles64"])
def test_strided_dim_reductions_in_wide_column_tiles(cols: int) -> None:
    """Reducing dim 0 walks column tiles of up to 1024 values per row; widths that leave a
    partial last tile, with a NaN and ties planted, every reduction kind."""
    torch.manual_seed(0)
    x = torch.randn(67, cols)
    x[5, cols - 3] = NAN
    x[7, 11] = x[9, 11] = 9.0  # argmax tie: the first index wins
    check_named({
        "sum": lambda x: x.sum(0), "amax": lambda x: x.amax(0), "amin": lambda x: x.amin(0),
        "argmax": lambda x: x.argmax(0), "var": lambda x: x.var(0), "any": lambda x: (x > 2).any(0),
        "mean_keepdim": lambda x: x.mean(0, keepdim=True), "prod": lambda x: (x * 0.01 + 1).prod(0),
    }, x, rtol=1e-5, atol=1e-5)


def test_outer_lane_tiles_count_the_batch_as_parallel_work() -> None:
    """Channels-last mean over H, W: 16 channels of 2 images on 2 threads are one 16-wide tile per
    image (each thread streams whole cache lines), not two 8-wide tiles reading half of each."""
    from minductor.codegen.loop_shapes import outer_lane_width

    assert outer_lane_width(16, threads=2, other_outer=2) == 16
    assert outer_lane_width(16, threads=2, other_outer=1) == 8
    assert outer_lane_width(4096, threads=2, other_outer=1) == 1024
    x = torch.randn(2, 16, 64, 64).to(memory_format=torch.channels_last)
    fn = lambda t: torch.relu(t).mean((2, 3))
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_argmax_lanes_are_value_and_index_arrays(dtype: torch.dtype, tmp_path: Any) -> None:
    """argmax/argmin along a row keep their lanes as a value array and an index array (a
    branch-free select per element, MiArg lanes only for the final combine): NaN first wins,
    ties take the smallest index in the lanes, the scalar tail and across them, all -inf rows
    and +inf rows are found."""
    from minductor import config

    x = torch.randn(37, 1003, dtype=dtype)
    x[0, 700] = x[0, 5] = x[0].max() + 1  # a tie across lanes
    x[1, 1001] = x[1, 33] = x[1].min() - 1  # a tie between the lanes and the tail
    x[2, 40], x[2, 1002] = NAN, -NAN  # NaN in the lanes and in the tail
    x[3, 1002] = NAN  # NaN in the tail only
    x[4] = -INF
    x[5] = INF
    x[6, 17], x[6, 900] = INF, INF
    fn = lambda x: (x.argmax(1), x.argmin(1), x.max(1), x.min(-1))  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        check(fn, x)
    if config.cpu_backend == "cpp":  # (the Triton backend's reductions are its own)
        code = "".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp"))
        assert "mi_arg_soa_update<" in code and "_i[mi_lane]" in code, code


def test_reductions_over_size_one_dims() -> None:
    # each output reduces one element: lowered as elementwise ops. The first once compiled to a
    # kernel with an outer loop missing (a reduction node taken for a pointwise nest), found by
    # group_norm's backward at 1 sample per channel group.
    x, y, z = torch.randn(1, 6), torch.randn(1, 2), torch.randn(3, 1, 4) * 3
    check_named({
        "broadcast_sum": lambda x, y, z: (x.view(1, 2, 3) + y.view(1, 2, 1)).sum(0),
        "argmax_argmin": lambda x, y, z: z.argmax(1) + x.argmin(0).sum(),
        "amax_keepdim": lambda x, y, z: z.amax(1, keepdim=True) * 2,
        "var": lambda x, y, z: z.var(1, correction=0) + z.var(1).nan_to_num(3.0),
        "var_mean": lambda x, y, z: torch.stack(torch.var_mean(x, 0, correction=0)),
        "any_all": lambda x, y, z: (z > 0).any(1) ^ (z > 1).all(1),
        "prod_int": lambda x, y, z: z.int().prod(1),
        "sum_bool": lambda x, y, z: (z > 0).sum(1),
        "mean": lambda x, y, z: z.mean(1),
        "zero_dim": lambda x, y, z: x[0, 0].sum() + x[0, 1].amax(),
    }, x, y, z)


def test_group_norm_backward_with_one_value_per_group_channel() -> None:
    x = torch.randn(1, 6, 3, requires_grad=True)
    weight, bias = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)

    def norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, 2, w, b, eps=0.5)

    cotangent = torch.randn(1, 6, 3)
    expected = torch.autograd.grad(norm(x, weight, bias), (x, weight, bias), cotangent)
    actual = torch.autograd.grad(torch.compile(norm, backend="minductor")(x, weight, bias), (x, weight, bias), cotangent)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_statistics_take_two_passes(tmp_path, layout: str, dtype: torch.dtype) -> None:
    # an input that fits the last-level cache: a sum, then the sum of squared deviations (read
    # back from cache), not Welford's lanes (a division per element)
    x = torch.randn(4, 24, 9, 11, dtype=dtype) * 3 + 50
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(lambda t: torch.var_mean(t, (0, 2, 3), correction=0), backend="minductor")(x)
    torch.testing.assert_close(got, torch.var_mean(x, (0, 2, 3), correction=0))
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    assert "welford_reduce" not in code, code  # (the reduction type names the kernels)


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, float("inf"), float("-inf")])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_vector_norms_are_fused_reductions(ord: float, dim: Any, keepdim: bool) -> None:
    """``torch.linalg.vector_norm`` (F.normalize, cosine_similarity, clip_grad_norm_) is a
    reduction of our own, not an aten fallback; zeros and signs included."""
    from minductor import metrics

    x = torch.randn(6, 33, 5)
    x[0, :3] = 0.0
    check(lambda x: torch.linalg.vector_norm(x, ord, dim, keepdim) * 2, x, rtol=1e-5, atol=1e-5)
    assert not metrics.fallback_ops, metrics.fallback_ops


def test_norm_based_functions_and_their_gradients() -> None:
    from minductor import metrics

    torch.manual_seed(88)  # (a seed where half's rounding of b's gradient differs most from eager's: 7e-4)
    a, b = torch.randn(16, 40, requires_grad=True), torch.randn(16, 40, requires_grad=True)

    def fn(a, b):
        return F.cosine_similarity(a, b) + F.normalize(a, dim=0).sum(0)[:16] + torch.linalg.vector_norm(b.half(), dtype=torch.float32)

    out = torch.compile(fn, backend="minductor")(a, b)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    expected = fn(a2, b2)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    (ga, gb), (ga2, gb2) = torch.autograd.grad(out.sum(), (a, b)), torch.autograd.grad(expected.sum(), (a2, b2))
    torch.testing.assert_close(ga, ga2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gb, gb2, rtol=2e-3, atol=2e-3)  # (through b.half(): half's rounding)
    assert "aten.linalg_vector_norm" not in metrics.fallback_ops


@pytest.mark.parametrize("offset", [0, 2, -3])
def test_triangle_indices_select_rows(offset: int) -> None:
    x = torch.randn(9, 7)
    check(lambda x: x[tuple(torch.tril_indices(9, 7, offset))] + x[tuple(torch.triu_indices(9, 7, offset))].sum(), x)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_norm_from_channel_statistics_stays_accurate(channels_last: bool, dtype: torch.dtype) -> None:
    """Group norm's statistics are combined from each channel's (mean and spread over the
    pixels, then the spread of the channels' means): far from zero (a mean of 1000, a spread of
    0.01; bfloat16: 10 and 1, what its 8 bits resolve) the output and all three gradients stay
    as close to a float64 reference as eager's."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 12, 12) * 0.01 + 1000 if dtype == torch.float32 else torch.randn(4, 32, 12, 12) + 10
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    w, b = torch.randn(32), torch.randn(32)
    dy = torch.randn(4, 32, 12, 12)

    def run(fn: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
        out = fn(x, w, b)
        return [out, *torch.autograd.grad(out, (x, w, b), dy.to(out.dtype))]

    fn = lambda x, w, b: F.group_norm(x, 8, w, b)  # noqa: E731
    reference = run(fn, x.double(), w.double(), b.double())
    eager = run(fn, x.to(dtype), w.to(dtype), b.to(dtype))
    compiled = run(torch.compile(fn, backend="minductor"), x.to(dtype), w.to(dtype), b.to(dtype))
    for ref, e, c in zip(reference, eager, compiled):
        scale = ref.abs().max().item()
        eager_error = (e.double() - ref).abs().max().item() / scale
        error = (c.double() - ref).abs().max().item() / scale
        assert error <= 2 * eager_error + (1e-6 if dtype == torch.float32 else 1e-2), (error, eager_error)


def test_reductions_of_a_few_elements_are_pointwise(tmp_path) -> None:
    """A reduction of at most 8 elements (``UNROLL_MAX``) combines them in one pointwise body,
    which inlines and tiles like any other (a DeBERTa backward summed a gradient over 2, read
    transposed, as 65536 scalar two-step reductions); over 9 it stays a reduction. Results match
    eager: NaN through max/min, bfloat16 summed in float32, several reduced dims."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.permute(0, 1, 3, 2).sum(0), x.amax(1), x.amin(1), (x * 0.5 + 1).prod(0), (x > 0).any(0),
                x.to(torch.bfloat16).sum(0), x[:, :3].sum((0, 1)), x.sum(-1))

    x = torch.randn(2, 4, 16, 9)
    x[0, 1, 2, 3] = NAN
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(x)
    for got, want in zip(out, fn(x)):
        torch.testing.assert_close(got, want, equal_nan=True)
    (ir,) = [p.read_text() for p in tmp_path.glob("graph_*/ir_pre_fusion.txt")]
    assert ir.count("Reduction(") == 1, ir  # x.sum(-1), over 9
