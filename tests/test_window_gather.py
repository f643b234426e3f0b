"""Window gathers (codegen/cpp_windows.py): reads through a table of indices along the innermost
loop, done as a window load and a permutation of its lanes per block, lane by lane where a
block's indices spread wider than two vectors. Results are compared bit for bit with eager's
(the reads only move values), over sizes with tail blocks, rows too short for any window,
every element size, and both choices of the gather-speed rule."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen import cpp_unit
from minductor.codegen.cpp_windows import window_sizes


def _source(fn, *args, tmp_path: Path, exact: bool = True) -> str:
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(*args)
    expected = fn(*args)
    if exact:
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    else:
        torch.testing.assert_close(got, expected)
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_fused_*.cpp")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 2, 9, 40), (2, 2, 6, 129)])
@pytest.mark.parametrize("scale", [2, 3, 0.5])
def test_nearest_resize_matches_eager_bit_for_bit(dtype: torch.dtype, shape: tuple[int, ...], scale: float,
                                                  tmp_path: Path) -> None:
    x = (torch.randn(shape) * 50).to(dtype)
    source = _source(lambda x: F.interpolate(x, scale_factor=scale), x, tmp_path=tmp_path)
    # rows of 10 to 387 outputs: every float size takes windows (a row of 7 to 14, too); an
    # exact scale (x * 0.5, x * 2.0 in float32) reads at computed positions instead
    # (lowering/indexing.static_positions), no gather at all
    if scale != 3:
        assert "mi_window_fetch<" not in source and "mi_err" not in source, source
    elif dtype.itemsize in window_sizes() and shape[-1] * scale >= 16:
        assert "mi_window_fetch<" in source, source


@pytest.fixture
def float_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Window gathers of 4-byte values, on any CPU: the header's permutations are GCC vector
    extensions, correct on every ISA (where none is one instruction, only slower)."""
    from minductor.codegen import cpp_rewrites, cpp_windows

    sizes = window_sizes() | {4}
    monkeypatch.setattr(cpp_windows, "window_sizes", lambda: sizes)
    monkeypatch.setattr(cpp_rewrites, "window_sizes", lambda: sizes)


@pytest.mark.usefixtures("float_windows")
def test_window_reads_each_row_through_a_plan_made_once(tmp_path: Path) -> None:
    """The plan is made before the loops, once per table; the rows' reads stage into a buffer
    before the innermost loop, which reads the buffer and gathers nothing."""
    x = torch.randn(2, 8, 20, 48)
    source = _source(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), x, tmp_path=tmp_path, exact=False)
    loops = source[source.index("#pragma omp parallel"):]
    prologue = source[:source.index("#pragma omp parallel")]
    assert prologue.count("mi_window_plan<4>(") == 2 and "mi_window_plan" not in loops  # x0 and x1 columns
    assert loops.count("mi_window_fetch<float, 2>(") == 2  # two rows, two columns each
    assert len(re.findall(r"__restrict__ mi_window\d+ = ", loops)) == 4
    inner = loops[loops.rindex("for (int64_t"):]
    assert "in_ptr0[" not in inner, inner


@pytest.mark.usefixtures("float_windows")
@pytest.mark.parametrize("fast", [True, False])
def test_window_gathers_keep_the_loop_vectorized_whatever_the_gather_speed(fast: bool, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Where gather instructions do not pay off, loops with gathers lose their `omp simd`; a loop
    whose gathers are all window gathers keeps it."""
    monkeypatch.setattr(cpp_unit, "vector_gathers_pay_off", lambda: fast)
    x = torch.randn(3, 4, 11 + fast, 37)  # (a shape of its own: no graph compiled under the other rule)
    source = _source(lambda x: F.interpolate(x, scale_factor=3) * 2, x, tmp_path=tmp_path)  # (1/3: indirect)
    assert "mi_window_fetch<" in source and "#pragma omp simd" in source[source.index("mi_window_fetch<"):]


def test_tabled_index_out_of_range_still_raises(tmp_path: Path) -> None:
    """The bounds check of a tabled index runs once, on the table; a row still reports it."""
    def fn(x):
        cols = torch.div(torch.arange(40, device=x.device), 0.5, rounding_mode="floor").long()  # up to 78
        return x[:, cols] + 1

    x = torch.randn(8, 50)
    with pytest.raises(Exception, match="(?i)index|out of (range|bounds)"):
        fn(x)
    with pytest.raises(Exception, match="(?i)index|out of (range|bounds)"):
        torch.compile(fn, backend="minductor")(x)
    cols_ok = torch.randn(8, 80)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(cols_ok), fn(cols_ok), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["reflect", "replicate"])
@pytest.mark.parametrize("width", [37, 5000])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_pads_copy_rows_without_gathers(name: str, width: int, dims: int, tmp_path: Path) -> None:
    """A reflection or replication pad reads each row at one computed position, its columns in
    three pieces whose tests the interior loops cut: the middle a plain copy, no window table,
    no gather, no bounds check (the positions are in range by construction). Through the
    decomposition's tables a (16, 64, 56, 56) reflection by 2 took 335-349 us (eager 318),
    now 210-239."""
    pads = (3, 4, 1, 2, 2, 1)[:2 * dims]
    x = torch.randn(*(2, 3, 4, 5)[:dims], width)
    source = _source(lambda x: F.pad(x, pads, mode=name), x, tmp_path=tmp_path)
    assert "mi_window_fetch<" not in source and "mi_table" not in source and "mi_bad" not in source, source
    assert re.search(r"for \(int64_t (\w+) = 3; \1 < %d; \1\+\+\)" % (width + 3), source), source  # the middle


def test_an_index_read_from_memory_is_not_tabled(tmp_path: Path) -> None:
    """Indices a tensor holds go where they like: they stay a gather, not a window read."""
    x, i = torch.randn(8, 300), torch.randint(0, 300, (200,))
    source = _source(lambda x, i: x[:, i] * 2, x, i, tmp_path=tmp_path)
    assert "mi_window_fetch<" not in source and "mi_table" not in source, source


@pytest.mark.usefixtures("float_windows")
def test_a_resampling_loop_streams_its_output_and_a_blending_one_does_not(tmp_path: Path) -> None:
    """With no gather left, a loop that moves one window read per output streams its large
    output (nearest: its kernel 2.6 -> 1.8 ms at (8, 64, 128, 128)); one that blends four
    window reads keeps plain stores (bilinear streamed: 5.2 -> 6.3 ms)."""
    x = torch.randn(2, 4, 24, 40)
    with config.patch(stream_store_min_bytes=1024, stream_store_min_footprint=0):
        nearest = _source(lambda x: F.interpolate(x, scale_factor=3), x, tmp_path=tmp_path / "nearest")
        bilinear = _source(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), x, tmp_path=tmp_path / "bilinear",
                           exact=False)
    assert "mi_window_fetch<" in nearest and "mi_stream_store(" in nearest and "mi_stream_fence()" in nearest, nearest
    assert "mi_window_fetch<" in bilinear and "mi_stream_store(" not in bilinear, bilinear


def test_an_index_read_from_memory_and_converted_gets_no_window(tmp_path: Path) -> None:
    """A costly conversion tables such an index, but its values still go where they like."""
    x, i = torch.randn(8, 300), torch.randint(0, 300, (200,))
    source = _source(lambda x, i: x[:, i.int().abs()] * 2, x, i, tmp_path=tmp_path)
    assert "mi_window_fetch<" not in source, source


def test_window_buffers_stay_within_their_stack_budget(tmp_path: Path) -> None:
    """A float64 bicubic upsample to rows of 6000 reads 16 windows of 48 KB a row: as many as
    fit in WINDOW_STACK_BYTES are windows, the rest stay gathers; results as eager's."""
    from minductor.codegen.cpp_windows import WINDOW_STACK_BYTES

    x = torch.randn(1, 2, 3, 3000, dtype=torch.float64)
    source = _source(lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), x, tmp_path=tmp_path, exact=False)
    windows = len(re.findall(r"__restrict__ mi_window\d+ = ", source))
    assert windows * 6000 * 8 <= WINDOW_STACK_BYTES and (windows > 0 or 8 not in window_sizes()), windows


@pytest.mark.usefixtures("float_windows")
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("case", ["bilinear_2x", "bilinear_ac_odd", "bicubic", "nearest_3x"])
def test_threads_keep_their_windows_across_rows(case: str, threads: int, tmp_path: Path) -> None:
    """Each thread of the parallel region declares a pool of windows per (tensor, table) once
    and reads a window only where no buffer of the pool holds its row (mi_window_fetch): an
    upsample's output rows read each source row two or more times. Row counts that split
    unevenly over the threads and sizes that repeat rows and that do not give eager's
    results."""
    fns = {
        "bilinear_2x": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (3, 5, 13, 40)),
        "bilinear_ac_odd": (lambda x: F.interpolate(x, size=(29, 71), mode="bilinear", align_corners=True), (2, 3, 11, 40)),
        "bicubic": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), (1, 3, 9, 24)),
        "nearest_3x": (lambda x: F.interpolate(x, scale_factor=3), (2, 3, 7, 20)),
    }
    fn, shape = fns[case]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch._dynamo.reset()
        x = torch.randn(shape)
        with config.patch(debug=True, debug_dir=str(tmp_path)):
            torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x))
    finally:
        torch.set_num_threads(before)
    source = "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_fused_*.cpp")))
    pools = re.findall(r"mi_window_fetch<\w+, (\d+)>\([^;]*, (mi_pool\d+), \2_at, mi_want, \2_got\);", source)
    assert pools, source
    region = source[source.index("#pragma omp parallel"):] if "#pragma omp parallel" in source else source
    for k, pool in pools:
        declared = region.index(f"int64_t {pool}_at[{k}];")
        assert declared < region.index("#pragma omp for") if "#pragma omp for" in region else True
        assert len(re.findall(rf"__restrict__ mi_window\d+ = {pool}_got\[\d+\];", source)) == int(k), source
