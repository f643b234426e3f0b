"""The prelude's branch-free float32 functions must vectorize in any composition: GCC 12 gave
up on whole loops over small details (an early return for NaN in relu, an ``||`` of two
compares in sin) once an exp shared the loop, and such a kernel runs scalar, 6x slower
(``((x.sin() + 1) * 2).exp().relu() - y``: 26 -> 155 ms). Every pair f(g(x)) is compiled with
the flags kernels use, and the compiler's report must show each loop vectorized."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import math_paths, vectorization_report

from minductor import config

MATH = math_paths()

UNARY = ["mi_exp", "mi_log", "mi_tanh", "mi_erf", "mi_sin", "mi_cos", "mi_sigmoid", "mi_relu", "mi_abs",
         "mi_rsqrt", "mi_sign", "mi_reciprocal", "mi_expm1", "mi_log1p", "mi_exp2", "mi_log2", "mi_log10", "mi_atan",
         "mi_asin", "mi_acos", "mi_sinh", "mi_cosh", "mi_asinh", "mi_acosh", "mi_atanh", "mi_erfinv", "mi_tan", "mi_erfc"]
BINARY = ["mi_maximum", "mi_minimum", "mi_atan2", "mi_hypot", "mi_powf", "mi_fmodf", "mi_modf", "mi_floordivf"]


def _compile_report(source: str, tmp_path: Path) -> str:
    path = tmp_path / "k.cpp"
    path.write_text(source)
    return vectorization_report(path, tmp_path)


@pytest.mark.parametrize("libmvec", MATH)
def test_every_pair_of_prelude_functions_vectorizes(libmvec: bool, tmp_path: Path) -> None:
    loops = [f"{f}({g}(a[i]))" for f in UNARY for g in UNARY]
    loops += [f"{f}({g}(a[i]), {h}(c[i]))" for f in BINARY for g in UNARY[:5] for h in UNARY[:5]]
    loops += ["mi_relu(mi_exp((mi_sin(a[i]) + 1.0f) * 2.0f)) - c[i]"]  # the suite's pointwise chain
    loops += ["mi_sin(a[i]) * mi_cos(a[i])"]  # GCC merges these into sincosf (scalar) unless told not to
    if libmvec:  # only sin and cos change with libmvec
        loops = [loop for loop in loops if "mi_sin" in loop or "mi_cos" in loop]
    lines = ['#include "minductor_prelude.h"']
    for k, expr in enumerate(loops):
        lines += [f'extern "C" void k{k}(const float* __restrict__ a, const float* __restrict__ c, float* __restrict__ b, int64_t n) {{',
                  "    #pragma omp simd",
                  f"    for (int64_t i = 0; i < n; i++) b[i] = {expr};  // LOOP{k}",
                  "}"]
    source = "\n".join(lines) + "\n"
    with config.patch(libmvec=libmvec):
        report = _compile_report(source, tmp_path)
    loop_line = {int(m.group(1)): i + 1 for i, line in enumerate(source.splitlines()) if (m := re.search(r"LOOP(\d+)", line))}
    vectorized = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    scalar = [loops[k] for k, line in loop_line.items() if line not in vectorized]
    assert not scalar, f"{len(scalar)} loops not vectorized, {scalar}"


@pytest.mark.parametrize("fn", [lambda x, y: ((x.sin() + 1) * 2).exp().relu() - y,
                                lambda x, y: torch.nn.functional.gelu(x) * torch.sigmoid(y).tanh(),
                                lambda x, y: torch.maximum(x.exp(), y.cos()).log(),
                                lambda x, y: torch.copysign(x, (x * 3).long().float()) + (y * 5).to(torch.int8)],
                         ids=["pointwise6", "gelu_sigmoid_tanh", "maximum_exp_cos_log", "int_conversions"])
def test_generated_pointwise_kernels_vectorize(fn, tmp_path: Path) -> None:
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, y), fn(x, y), equal_nan=True)
    (source,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    report = vectorization_report(source, tmp_path)
    assert "loop vectorized" in report, report[-2000:]


def _simd_loops(source: str) -> list[tuple[int, int]]:
    """(first, last) line of every ``omp simd`` loop over data (``omp parallel for simd`` and ``omp for simd`` too;
    not the lane-combine loops)."""
    lines = source.splitlines()
    loops = []
    for i, line in enumerate(lines):
        if not re.search(r"#pragma omp (parallel for |for )?simd", line) or "mi_l " in lines[i + 1]:
            continue
        start, end = i + 2, i + 2  # 1-based line of the `for`
        if lines[i + 2].strip() == "{":
            depth, end = 0, i + 2
            for j in range(i + 2, len(lines)):
                depth += lines[j].count("{") - lines[j].count("}")
                if depth == 0:
                    end = j + 1
                    break
        loops.append((start, end))
    return loops


@pytest.mark.parametrize("fn", [lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)),
                                lambda x: torch.var_mean(x, -1),
                                lambda x: torch.softmax(x, -1),
                                lambda x: x.sum(1) + x.amax(1),
                                lambda x: (x.exp() * (x - x.abs().sum(-1, keepdim=True).log())).sum(-1)],
                         ids=["layer_norm", "var_mean", "softmax", "sum_amax", "log_of_row_value"])
def test_generated_row_reductions_vectorize(fn, tmp_path: Path) -> None:
    """Every data loop of a row reduction vectorizes: -O3's unroll-and-jam once fused two rows
    of layer_norm's Welford loop and left it scalar on AVX2 (2x slower kernel), and GCC 12 left
    a lane loop scalar that took the log of a per-row value inside (kl_div; now hoisted)."""
    x = torch.randn(8, 4096)
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        # a sum of 4096 values in another order than eager's: float32 rounding, scaled to the row
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), atol=1e-4, rtol=1e-5)
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    source = path.read_text()
    report = vectorization_report(path, tmp_path)
    done = {int(m) for m in re.findall(rf"{path.name}:(\d+):\d+: optimized: loop vectorized", report)}
    loops = _simd_loops(source)
    assert loops
    scalar = [(a, b) for a, b in loops if not any(a <= n <= b for n in done)]
    assert not scalar, "\n".join(source.splitlines()[a - 1] for a, _ in scalar) + "\n" + report



def test_layer_norm_of_a_rolled_window_merge_vectorizes_along_the_channels(tmp_path: Path) -> None:
    """Swin's patch merging: a rolled image's 2x2 neighbours concatenated along the channels,
    then layer-normed. The rows are found by div/mod of the row index, the channels are
    contiguous: lanes run along the channels. (Lanes across the rows made each load a masked
    gather that GCC leaves scalar: 172 us a call, TorchInductor 43; 90 now.)"""
    def merge(x, w, b):
        x = torch.roll(x, shifts=(2, 2), dims=(1, 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return torch.nn.functional.layer_norm(x.view(2, -1, 192), (192,), w, b)

    args = (torch.randn(2, 16, 16, 48), torch.randn(192), torch.randn(192))
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.testing.assert_close(torch.compile(merge, backend="minductor")(*args), merge(*args))
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    source = path.read_text()
    assert "mi_tile" not in source  # no lanes across the rows
    report = vectorization_report(path, tmp_path)
    done = {int(m) for m in re.findall(rf"{path.name}:(\d+):\d+: optimized: loop vectorized", report)}
    scalar = [(a, b) for a, b in _simd_loops(source) if not any(a <= n <= b for n in done)]
    assert not scalar, "\n".join(source.splitlines()[a - 1] for a, _ in scalar) + "\n" + report

def _kernel_source(fn, x: torch.Tensor, tmp_path: Path) -> str:
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        out = torch.compile(fn, backend="minductor")(x)
    ref = fn(x.double())
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)  # against an fp64 reference
    torch._dynamo.reset()
    return "\n".join(p.read_text() for p in (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp"))


def test_softmax_multiplies_by_the_reciprocal_of_each_row_sum(tmp_path: Path) -> None:
    """The divisor is the same for the whole row: one reciprocal per row, a multiply per element."""
    source = _kernel_source(lambda x: torch.softmax(x, -1), torch.randn(16, 1000), tmp_path)
    recip = re.search(r"auto (tmp\d+) = mi_reciprocal\(tmp\d+\);", source)
    assert recip and f"* {recip.group(1)})" in source, source
    assert not re.search(r"tmp\d+ / tmp\d+\)", source), source


def test_a_division_by_a_row_value_rounds_as_eager() -> None:
    """A division the user writes is an IEEE division, not a multiply by the reciprocal (an ulp
    off): int8 quantization rounds ``x / scale``, and quotients at exactly .5 must round alike."""
    def quantize(x: torch.Tensor) -> torch.Tensor:
        return (x / (x.abs().amax(1, keepdim=True) / 127)).round().to(torch.int8)
    torch.manual_seed(0)
    x = torch.randn(4096, 1024)
    assert torch.equal(torch.compile(quantize, backend="minductor")(x), quantize(x))
    torch._dynamo.reset()


def test_a_row_division_recomputed_in_two_kernels_rounds_alike() -> None:
    """amax over an expanded softmax, and its backward's tie mask ``eq(amax, softmax)``, recompute
    the softmax in two kernels whose loops differ (the softmax's row is invariant in the amax's
    reduced loop): both must round it alike, or the tie count is 0 and the gradient 0/0."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.softmax(2).unsqueeze(0).expand(3, 1, 3, 2).flip(3).amax(0, keepdim=True).permute(0, 2, 1, 3) * 1.5
    torch.manual_seed(1574)
    x = torch.randn(1, 3, 2)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    grad = torch.randn(1, 3, 1, 2)
    torch.compile(fn, backend="minductor")(xs[0]).backward(grad)
    fn(xs[1]).backward(grad)
    torch.testing.assert_close(xs[0].grad, xs[1].grad)


def test_division_by_a_constant_stays_a_division(tmp_path: Path) -> None:
    # round(x, 2) divides by 100 as eager does: x * 0.01 would differ in the last bit
    x = torch.randn(16, 1000)
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        out = torch.compile(lambda x: torch.round(x, decimals=2), backend="minductor")(x)
    torch.testing.assert_close(out, torch.round(x, decimals=2), atol=0, rtol=0)
    source = "\n".join(p.read_text() for p in (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp"))
    assert re.search(r"tmp\d+ / tmp\d+\)", source) and "(1) / " not in source, source


def test_row_reduction_prefetches_the_row_its_later_loop_writes(tmp_path: Path) -> None:
    """layer_norm reduces a row, then writes it: the reducing loop prefetches the output row's
    lines for writing (one per 64 bytes of its lanes), and results still match."""
    fn = lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],))  # noqa: E731
    from minductor.codegen.loop_shapes import long_row_lanes

    source = _kernel_source(fn, torch.randn(16, 2048), tmp_path)  # 64 lanes (AVX-512): four lines a step
    first_loop = source.split("_loop1(")[0]
    prefetches = re.findall(r"__builtin_prefetch\(&out_ptr0\[(.*?)\], 1, 3\);", first_loop)
    lines = [f"{k} + " if k else "" for k in range(0, long_row_lanes(), 16)]
    assert prefetches == [f"{k}mi_base + 2048L*xo0" for k in lines], source


def test_relu_then_max_pool_indices_vectorize(tmp_path: Path) -> None:
    """A relu'd 2x2 max pool that stores only its int64 indices (a training forward: the values
    are not needed): with relu as a select of its input or 0, GCC 12 left this loop scalar
    (5.4 ms against 0.1 ms for 8x16x128x128); every data loop vectorizes."""
    fn = lambda x: torch.nn.functional.max_pool2d(x.relu(), 2, return_indices=True)[1]  # noqa: E731
    x = torch.randn(2, 3, 16, 64)
    x[0, 0, 0, :8] = float("nan")
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), rtol=0, atol=0)
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    report = vectorization_report(path, tmp_path)
    done = {int(m) for m in re.findall(rf"{path.name}:(\d+):\d+: optimized: loop vectorized", report)}
    loops = _simd_loops(path.read_text())
    assert loops and all(any(a <= n <= b for n in done) for a, b in loops), report


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_relu_keeps_nan_and_negative_zero(dtype: torch.dtype) -> None:
    """relu as a bit mask: NaN and -0 pass (as eager's), negatives and -inf become +0, bit for bit."""
    x = torch.tensor([float("nan"), -float("nan"), -0.0, 0.0, -float("inf"), float("inf"), -1.5, 2.5, 1e-45, -1e-45],
                     dtype=dtype).repeat(7)
    out = torch.compile(lambda t: t.relu() * 1, backend="minductor")(x)
    ref = x.relu() * 1
    width = torch.int32 if dtype == torch.float32 else torch.int64
    assert torch.equal(out.view(width), ref.view(width)), (out, ref)


def test_max_pool_backward_vectorizes(tmp_path: Path) -> None:
    """max_pool2d's backward gathers the int64 indices of the windows holding each position
    under masks it reads from a table: tabled as bools, GCC 12 vectorized none of its loops
    (8x64x128x128, 3x3/2/1: 16.9 ms scalar against eager's 9.3; 10.1 ms vectorized)."""
    x = torch.randn(2, 3, 32, 48)
    y, idx = torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)
    g = torch.randn_like(y)
    fn = lambda g, x, i: torch.ops.aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i)  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(g, x, idx), fn(g, x, idx), rtol=0, atol=0)
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    assert "mi_table_t<" in path.read_text()
    report = vectorization_report(path, tmp_path)
    done = {int(m) for m in re.findall(rf"{path.name}:(\d+):\d+: optimized: loop vectorized", report)}
    loops = _simd_loops(path.read_text())
    scalar = [(a, b) for a, b in loops if not any(a <= n <= b for n in done)]
    assert loops and not scalar, report


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_maximum_and_minimum_match_eager_bit_for_bit(dtype: torch.dtype, tmp_path: Path) -> None:
    """torch.maximum/minimum: NaN from either side, and a tie of -0 and +0 gives the second
    operand, as eager's vectorized maximum does; max/min reductions (their update tests the new
    value for NaN, off the accumulator's chain) propagate NaN and inf like eager."""
    special = [float("nan"), -float("nan"), -0.0, 0.0, -float("inf"), float("inf"), -1.5, 2.5, 1e-45, -1e-45]
    a = torch.tensor([s for s in special for _ in special], dtype=dtype).repeat(3)
    b = torch.tensor(special * len(special), dtype=dtype).repeat(3)
    fn = lambda a, b: (torch.maximum(a, b) * 1, torch.minimum(a, b) * 1)  # noqa: E731
    width = torch.int32 if dtype == torch.float32 else torch.int64
    for got, want in zip(torch.compile(fn, backend="minductor")(a, b), fn(a, b)):  # (NaN payloads aside)
        assert torch.equal(got.isnan(), want.isnan()), (got, want)
        assert torch.equal(got[~want.isnan()].view(width), want[~want.isnan()].view(width)), (got, want)
    x = torch.randn(300, 70, dtype=dtype)
    x[7, 3], x[299, 5], x[0, 69], x[150, 0] = float("nan"), -float("nan"), float("inf"), -float("inf")
    red = lambda x: (x.amax(0), x.amin(0), x.amax(1), x.amin(1), x.max(), x.min())  # noqa: E731
    torch.testing.assert_close(torch.compile(red, backend="minductor")(x), red(x), equal_nan=True, rtol=0, atol=0)
    with config.patch(debug=True, debug_dir=str(tmp_path)):  # the column max alone: its lanes are output columns
        torch.testing.assert_close(torch.compile(lambda x: x.amax(0), backend="minductor")(x), x.amax(0), equal_nan=True)
    (path,) = tmp_path.glob("graph_*/cpp_fused_*.cpp")
    assert "mi_max_update<" in path.read_text()
    report = vectorization_report(path, tmp_path)
    done = {int(m) for m in re.findall(rf"{path.name}:(\d+):\d+: optimized: loop vectorized", report)}
    loops = _simd_loops(path.read_text())
    assert loops and all(any(a <= n <= b for n in done) for a, b in loops), report


def _assert_data_loops_use_whole_vectors(path: Path, tmp_path: Path) -> None:
    """Every data loop of the kernel source ``path`` vectorizes in vectors of at least 32 bytes."""
    report = vectorization_report(path, tmp_path)
    widths: dict[int, int] = {}
    for line, size in re.findall(rf"{path.name}:(\d+):\d+: optimized: loop vectorized using (\d+) byte vectors", report):
        widths[int(line)] = max(widths.get(int(line), 0), int(size))
    loops = _simd_loops(path.read_text())
    assert loops and all(max((w for n, w in widths.items() if a <= n <= b), default=0) >= 32 for a, b in loops), \
        (widths, loops, path.read_text())


@pytest.mark.parametrize("case", ["masked_softmax", "masked_softmax_long_rows", "where"])
def test_loops_over_a_loaded_bool_mask_use_whole_vectors(case: str, tmp_path: Path) -> None:
    """A fixed-width loop that selects under a bool mask it loads takes a vector of bools in
    lanes (64 on AVX-512): with 16 lanes, GCC 12 vectorized a row reduction's loop and a streamed
    loop's lines in 8-byte vectors, two floats at a time (a masked attention softmax at
    (8, 4, 128, 128), kernel alone: 1016 -> 156 us). Every data loop must use vectors of at least
    32 bytes, and a long row's streamed loop keeps the next row's prefetches."""
    from minductor.codegen.loop_shapes import narrow_lanes

    def masked_softmax(a, m):
        return (a * 0.125).masked_fill(~m, float("-inf")).softmax(-1)

    fn, args = {
        "masked_softmax": (masked_softmax, (torch.randn(2, 3, 128, 128), torch.ones(128, 128, dtype=torch.bool).tril())),
        "masked_softmax_long_rows": (masked_softmax, (torch.randn(8, 2048), torch.rand(8, 2048) > 0.3)),
        "where": (lambda a, m: torch.where(m, a * 2, 0.0), (torch.randn(512, 1000), torch.rand(512, 1000) > 0.5)),
    }[case]
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump"), stream_store_min_bytes=1024, stream_store_min_footprint=0):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(*args), fn(*args))
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    source = path.read_text()
    _assert_data_loops_use_whole_vectors(path, tmp_path)
    lanes = narrow_lanes([torch.bool])  # 64 on AVX-512, 32 on AVX2
    if case == "where":  # its streamed loop, a block of lines a step
        assert "mi_stream_store(" in source and f"mi_line_at += {lanes})" in source, source
    else:  # the row loops that read the mask; a long row's loops prefetch the next row
        assert f"mi_base += {lanes})" in source, source
        if case == "masked_softmax_long_rows":
            assert re.search(r"__builtin_prefetch\(&in_ptr\d\[2048 \+ mi_base", source), source


@pytest.mark.parametrize("case", ["half_softmax", "half_layer_norm", "half_pointwise", "any_rows", "bool_to_float_sum",
                                  "int8_argmax"])
def test_kernels_over_narrow_dtypes_vectorize(case: str, tmp_path: Path) -> None:
    """Every data loop over half values or bools vectorizes in vectors of at least 32 bytes. GCC
    12 vectorized no loop that loaded or stored ``_Float16`` (a half softmax at 4096^2: 137 ms,
    eager 21; 12 ms now), none that converted a bool to a float (``m.float().sum(-1)``: 6.5 ->
    0.3 ms), no ``any`` over bool lanes combined with ``||`` (5.9 -> 1.6 ms), and no integer
    argmax over lanes of (value, index) structs (int8 at 4096^2: 38 -> 1.6 ms; ties, many here,
    keep the first index)."""
    fn, x = {
        "half_softmax": (lambda x: x.softmax(-1), torch.randn(64, 512).half()),
        "half_layer_norm": (lambda x: torch.nn.functional.layer_norm(x, (512,)), torch.randn(64, 512).half()),
        "half_pointwise": (lambda x: (x * 2 + 1).exp(), torch.randn(64, 512).half()),
        "any_rows": (lambda x: (x > 2).any(-1), torch.randn(64, 512)),
        "bool_to_float_sum": (lambda x: (x > 0).float().sum(-1), torch.randn(64, 512)),
        "int8_argmax": (lambda x: (x.argmax(-1), x.argmin(-1)), torch.randint(-3, 3, (64, 512), dtype=torch.int8)),
    }[case]
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), atol=2e-3, rtol=2e-3)
    (path,) = (tmp_path / "dump").glob("graph_*/cpp_fused_*.cpp")
    assert case != "int8_argmax" or "mi_arg_soa_update<int8_t, true>" in path.read_text()
    _assert_data_loops_use_whole_vectors(path, tmp_path)
