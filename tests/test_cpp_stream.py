"""Streaming (non-temporal) stores of large float32 outputs (codegen/cpp_stream.py).

The threshold is lowered so small tensors stream. Row lengths are not multiples of 16, so a
row's head (up to its first 64-byte boundary), its whole lines and its tail all run; results
are compared with eager.
"""
from __future__ import annotations

import platform
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen import cpp_stream


def compiled_code(fn, *args, tmp_path, min_bytes: int = 1, min_footprint: int = 0, dynamic: bool = False) -> str:
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path), stream_store_min_bytes=min_bytes, stream_store_min_footprint=min_footprint):
        got = torch.compile(fn, backend="minductor", dynamic=dynamic)(*args)
    torch.testing.assert_close(got, fn(*args))
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))


@pytest.mark.parametrize("shape", [(1000, 37), (9, 4100), (300, 129)], ids=["flat", "flat_long", "rows"])
def test_pointwise_outputs_stream(tmp_path, shape) -> None:
    x, y = torch.randn(shape), torch.randn(shape)
    code = compiled_code(lambda x, y: ((x.sin() + 1) * 2).exp().relu() - y, x, y, tmp_path=tmp_path / "a")
    assert "mi_stream_store(" in code and "mi_stream_fence();" in code and "nowait" in code
    code = compiled_code(lambda x, b: x + b, x, torch.randn(shape[-1]), tmp_path=tmp_path / "b")  # a row broadcast
    assert "mi_stream_store(" in code


@pytest.mark.parametrize("two_pass", [True, False], ids=["two_pass", "welford"])
def test_layer_norm_streams_its_rows_without_write_prefetches(tmp_path, monkeypatch, two_pass: bool) -> None:
    """The streamed rows are not prefetched for writing; the streaming loop prefetches the next
    row of both inputs instead, a line per iteration (cpp_rewrites.prefetch_next_rows), with
    Welford and with the two-pass mean and variance alike (not the short variance loop), on a
    CPU where such prefetches do not slow the streaming stores down (forced here)."""
    from minductor.codegen import cpp_rewrites
    from minductor.lowering import reduction

    monkeypatch.setattr(cpp_rewrites, "prefetch_beside_streaming_stores", lambda: True)
    monkeypatch.setattr(reduction, "TWO_PASS_MAX", 2048 if two_pass else 0)
    x, r = torch.randn(200, 300), torch.randn(200, 300)
    code = compiled_code(lambda x, r: F.layer_norm(x + r, (300,)), x, r, tmp_path=tmp_path)
    assert "mi_stream_store(" in code and ", 1, 3);" not in code and ("welford" in code) != two_pass
    prefetching = code[code.index("for (int64_t mi_line_at"):].split("mi_stream_store(")[0]
    for arg in ("in_ptr0", "in_ptr1"):
        assert re.search(rf"__builtin_prefetch\(&{arg}\[300 \+ mi_line_at \+ 300L\*xo0\], 0, 3\);", prefetching), prefetching
    assert code.count("__builtin_prefetch(") == 2


@pytest.mark.parametrize("two_pass", [True, False], ids=["two_pass", "welford"])
def test_where_prefetches_slow_streaming_stores_only_lane_loops_prefetch(tmp_path, monkeypatch, two_pass: bool) -> None:
    """On a CPU where prefetches beside streaming stores cost more than they save (Zen 4:
    runtime/cache.prefetch_beside_streaming_stores), layer_norm's streamed loop prefetches
    nothing (the two-pass variance loop may: as fast as none there), and softmax still
    prefetches the next row in its exp loop."""
    from minductor.codegen import cpp_rewrites
    from minductor.lowering import reduction

    monkeypatch.setattr(cpp_rewrites, "prefetch_beside_streaming_stores", lambda: False)
    monkeypatch.setattr(reduction, "TWO_PASS_MAX", 2048 if two_pass else 0)
    x, r = torch.randn(200, 300), torch.randn(200, 300)
    code = compiled_code(lambda x, r: F.layer_norm(x + r, (300,)), x, r, tmp_path=tmp_path / "ln")
    functions = code.split("MI_LOOP_FN void ")[1:]
    streamed = [f for f in functions if "mi_stream_store(" in f]
    assert streamed and not any("__builtin_prefetch(" in f for f in streamed), code
    assert ("__builtin_prefetch(" in code) == two_pass, code
    code = compiled_code(lambda x: torch.softmax(x, -1), torch.randn(200, 4096), tmp_path=tmp_path / "sm")
    assert "mi_stream_store(" in code and re.search(r"__builtin_prefetch\(&in_ptr0\[4096 \+ ", code), code
    (prefetching,) = [f for f in code.split("MI_LOOP_FN void ")[1:] if "__builtin_prefetch(" in f]
    assert "mi_exp(" in prefetching and "mi_stream_store(" not in prefetching, code


def test_transposed_tiles_stream_their_rows(tmp_path) -> None:
    """The rows of a staged 2-D tile (x.t() + y) stream, heads and tails included (tile rows of
    100 values start anywhere in a line); their parallel region fences."""
    x, y = torch.randn(300, 230), torch.randn(230, 300)
    code = compiled_code(lambda x, y: x.t() + y, x, y, tmp_path=tmp_path)
    assert "mi_transpose16(" in code and "mi_stream_store(" in code and "mi_stream_fence();" in code


def test_two_outputs_one_streams(tmp_path) -> None:
    x = torch.randn(300, 129)
    code = compiled_code(lambda x: (x + 1, x * 2), x, tmp_path=tmp_path)
    assert code.count("mi_stream_store(") == 1


def test_checked_kernels_that_stream_reduce_their_error_flag(tmp_path, monkeypatch) -> None:
    """A bounds-checked kernel reduces its error flag over the parallel region (the streaming
    loop is a work-sharing ``omp for`` inside it); a bad index still raises. (Kernels that
    gather do not stream by default: the test lifts that rule.)"""
    from minductor.codegen import cpp_stream

    original = cpp_stream.stream_store

    def ignoring_gathers(kernel, var, length):
        gathers, kernel.gathers = kernel.gathers, False
        try:
            return original(kernel, var, length)
        finally:
            kernel.gathers = gathers

    monkeypatch.setattr(cpp_stream, "stream_store", ignoring_gathers)  # cpp_interior imports it per call
    x, index = torch.randn(300, 200), torch.randint(0, 200, (300, 150))
    code = compiled_code(lambda x, i: torch.gather(x, 1, i) * 2, x, index, tmp_path=tmp_path)
    assert "mi_stream_store(" in code and "mi_bad" in code
    torch._dynamo.reset()
    with config.patch(stream_store_min_bytes=1, stream_store_min_footprint=0), pytest.raises(IndexError):
        torch.compile(lambda x, i: torch.gather(x, 1, i) * 2, backend="minductor")(x, index + 200)


def test_what_does_not_stream(tmp_path) -> None:
    x = torch.randn(64, 200)
    # below the threshold (the default is 16 MB)
    assert "mi_stream" not in compiled_code(lambda x: x * 2, x, tmp_path=tmp_path / "small", min_bytes=1 << 24)
    # a buffer the kernel reads back (without a row scratch, softmax stores its exps into the
    # output's storage, then scales them in place)
    with config.patch(row_scratch=False):
        assert "mi_stream" not in compiled_code(lambda x: x.softmax(-1), x, tmp_path=tmp_path / "softmax")
    # a gather: loads through an index that changes along the row
    assert "mi_stream" not in compiled_code(lambda x, i: torch.gather(x, 1, i) * 2, x, torch.randint(0, 200, (64, 150)),
                                            tmp_path=tmp_path / "gather")
    # other dtypes, rows shorter than a line
    assert "mi_stream" not in compiled_code(lambda x: x.double() * 2, x, tmp_path=tmp_path / "f64")
    assert "mi_stream" not in compiled_code(lambda x, b: x * b, torch.randn(20000, 3), torch.randn(3), tmp_path=tmp_path / "short")
    # turned off
    assert "mi_stream" not in compiled_code(lambda x: x * 2, x, tmp_path=tmp_path / "off", min_bytes=0)


def test_only_kernels_too_big_for_the_cache_stream(tmp_path) -> None:
    """A kernel whose buffers all fit in the last-level cache keeps ordinary stores: its inputs
    and its output are still in cache when it (or the output's reader) runs next. Footprints
    here: int8 in and float out, 64000 + 256000 bytes; x + y, 3 x 256000."""
    q, x, y = torch.randint(-128, 127, (1000, 64), dtype=torch.int8), torch.randn(1000, 64), torch.randn(1000, 64)
    dequantize, add = (lambda q: q.float() * 0.5), (lambda x, y: x + y)
    assert "mi_stream_store(" not in compiled_code(dequantize, q, tmp_path=tmp_path / "dq", min_footprint=500_000)
    assert "mi_stream_store(" in compiled_code(add, x, y, tmp_path=tmp_path / "add", min_footprint=500_000)
    assert "mi_stream_store(" in compiled_code(dequantize, q, tmp_path=tmp_path / "dq0", min_footprint=0)
    # a row kernel streams whatever its footprint (its second pass reads the row from L1)
    assert "mi_stream_store(" in compiled_code(lambda x: F.layer_norm(x, (64,)), x, tmp_path=tmp_path / "ln",
                                               min_footprint=1 << 40)
    # symbolic sizes: the footprint is tested at run time, next to the output's size
    code = compiled_code(add, x, y, tmp_path=tmp_path / "dynamic", min_footprint=500_000, dynamic=True)
    assert "mi_stream_store(" in code and ">= 500000" in code
    for rows in (10, 3000):  # below and above the footprint, both right
        a, b = torch.randn(rows, 64), torch.randn(rows, 64)
        with config.patch(stream_store_min_bytes=1, stream_store_min_footprint=500_000):
            torch.testing.assert_close(torch.compile(add, backend="minductor", dynamic=True)(a, b), a + b)
    assert cpp_stream.min_footprint() >= 0


def test_streaming_stores_compile_to_non_temporal_instructions(tmp_path) -> None:
    """The line store is one non-temporal instruction per vector (movntps), not a copy."""
    code_dir = tmp_path / "dump"
    assert "mi_stream_store(" in compiled_code(lambda x: x * 3 + 1, torch.randn(300, 130), tmp_path=code_dir)
    (source,) = code_dir.glob("graph_*/cpp_*.cpp")
    from minductor.runtime.cache import compiler_flags

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"movntps is x86; on {platform.machine()} mi_stream_store is the plain-copy fallback")
    flags = [f for f in compiler_flags(config.cxx) if f not in ("-shared", "-fPIC")]
    asm = subprocess.run([config.cxx, *flags, "-S", str(source), "-o", "-"], capture_output=True, text=True, check=True).stdout
    assert "movntps" in asm


@pytest.mark.parametrize("op", ["embedding", "index_select"])
def test_rows_read_through_one_index_stream_and_check_it_once(tmp_path, op: str) -> None:
    """A row read through one index (an embedding row, index_select) streams its output, the
    index read and bounds-checked once before the row's loops, not per line; a bad index
    still raises IndexError."""
    table, index = torch.randn(1000, 200), torch.randint(0, 1000, (700,))
    fn = (lambda i, t: F.embedding(i, t)) if op == "embedding" else (lambda i, t: t.index_select(0, i) * 2)
    code = compiled_code(fn, index, table, tmp_path=tmp_path)
    assert "mi_stream_store(" in code, code
    streamed = code[code.index("const int64_t mi_lo"):]
    assert "mi_bad |=" in code and "mi_bad |=" not in streamed, code  # checked before the loops
    loop = streamed[streamed.index("for (int64_t mi_line_at"):].split("mi_stream_store(")[0]
    assert "in_ptr0[" not in loop, loop  # the index is not re-read per line
    torch._dynamo.reset()
    with config.patch(stream_store_min_bytes=1, stream_store_min_footprint=0), pytest.raises(IndexError):
        torch.compile(fn, backend="minductor")(index + 1000, table)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_read_through_one_index_prefetch_ahead_and_the_next_row(tmp_path, dtype) -> None:
    """A streamed row read through a per-row index prefetches, each step, the line
    ROW_AHEAD_BYTES ahead in the row (not past the range's end) and the line at the same offset
    in the next row, whose index is computed before the loops (clamped at the last row); rows
    shorter than the distance, longer, and an index read through a 2-d tensor give eager's
    results."""
    from minductor.codegen.cpp_row_prefetch import ROW_AHEAD_BYTES

    ahead = ROW_AHEAD_BYTES // dtype.itemsize
    for cols in (ahead // 2 + 3, ahead + 40, 2 * ahead + 17):
        index = torch.randint(0, 300, (50,))
        code = compiled_code(lambda i, t: t.index_select(0, i) * 2, index, torch.randn(300, cols).to(dtype),
                             tmp_path=tmp_path / str(cols))
        assert "const int64_t mi_next_row = mi_min_i64(xo0 + 1, 50 - 1);" in code, code
        assert re.search(r"auto (tmp\d+)_next = in_ptr0\[mi_next_row\];", code), code
        loop = code[code.index("for (int64_t mi_line_at"):]
        loop = loop[:loop.index("#pragma omp simd", loop.index("mi_stream_store"))]
        assert f"if (mi_line_at + {ahead} < mi_hi)" in loop, loop
        assert re.search(rf"__builtin_prefetch\(&in_ptr1\[{ahead} \+ mi_line_at \+ {cols}L\*tmp\d+\]", loop), loop
        assert re.search(rf"__builtin_prefetch\(&in_ptr1\[mi_line_at \+ {cols}L\*tmp\d+_next\]", loop), loop
    code = compiled_code(lambda i, w: F.embedding(i, w), torch.randint(0, 500, (7, 33)), torch.randn(500, 2000),
                         tmp_path=tmp_path / "embedding")
    assert "mi_min_i64(xo0 + 1, 231 - 1)" in code and "_next], 0, 3);" in code
    code = compiled_code(lambda i, t: t.index_select(0, i) * 2, torch.randint(0, 300, (61,)), torch.randn(300, 3000),
                         tmp_path=tmp_path / "dynamic", dynamic=True)
    assert re.search(r"mi_next_row = mi_min_i64\(xo0 \+ 1, s\d+ - 1\)", code) and "_next*s" in code, code
    # an index that changes along the row (a gather) prefetches nothing of the kind
    code = compiled_code(lambda x, i: torch.gather(x, 1, i) * 2, torch.randn(64, 3000), torch.randint(0, 3000, (64, 2500)),
                         tmp_path=tmp_path / "gather")
    assert "mi_next_row" not in code and "< mi_hi)" not in code


def test_hoisting_skips_bodies_with_lambdas() -> None:
    """A masked load with a bounds check is a lambda called only where the mask holds: nothing
    of such a body is hoisted before the streamed loops (the check would run unmasked)."""
    from minductor.codegen.cpp_stream import hoist_invariant_lines

    plain = ["auto tmp0 = in_ptr0[xo0];", "auto tmp1 = static_cast<uint64_t>(tmp0) < static_cast<uint64_t>(9);",
             "mi_bad |= tmp1 ? 0 : 1;", "auto tmp2 = tmp1 ? tmp0 : static_cast<int64_t>(0);",
             "auto tmp3 = in_ptr1[9L*tmp2 + xo1];", "out_ptr0[9L*xo0 + xo1] = tmp3;"]
    hoisted, rest = hoist_invariant_lines(plain, "xo1")
    assert hoisted == plain[:4] and rest == plain[4:]
    masked = ["auto tmp5 = xo0 < 3;", "auto tmp9 = [&]() {", "    auto tmp6 = in_ptr0[xo0];",
              "    mi_bad |= tmp6 < 9 ? 0 : 1;", "    return in_ptr1[9L*tmp6 + xo1];",
              "};", "auto tmp10 = tmp5 ? tmp9() : 0.0f;", "out_ptr0[9L*xo0 + xo1] = tmp10;"]
    assert hoist_invariant_lines(masked, "xo1") == ([], masked)


@pytest.mark.parametrize(("vendor", "family", "flags", "expected"), [
    ("AuthenticAMD", "25", "sse avx2 avx512f", False), ("AuthenticAMD", "25", "sse avx2", True),
    ("AuthenticAMD", "26", "avx2 avx512f", True), ("GenuineIntel", "6", "avx2 avx512f", True)])
def test_prefetches_beside_streaming_stores_off_on_zen_4(on_cpu, vendor: str, family: str, flags: str, expected: bool) -> None:
    from minductor.runtime import cache

    info = {"vendor_id": vendor, "cpu family": family, "flags": flags}
    assert on_cpu(cache.prefetch_beside_streaming_stores, info) is expected


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["flat", "rows", "layer_norm", "softmax", "dynamic"])
def test_half_and_bfloat16_outputs_stream_rounded_in_blocks(tmp_path, dtype, case: str) -> None:
    """A 16-bit output's lines are computed as floats, rounded in a block and streamed: the
    same bits as the ordinary stores (compared exactly with the kernel the same graph gets
    without streaming), with heads, whole steps and tails (rows of 300 and 4100), a row kernel
    after its reductions, and a symbolic size (streaming decided at run time)."""
    fns = {
        "flat": (lambda x, w: ((x * 3).exp() - w[0]).relu(), (1000, 37)),
        "rows": (lambda x, w: x * w + 1, (9, 4100)),
        "layer_norm": (lambda x, w: F.layer_norm(x, (x.shape[-1],), w), (40, 300)),
        "softmax": (lambda x, w: torch.softmax(x * w, -1), (40, 4100)),
        "dynamic": (lambda x, w: (x - w).sigmoid(), (33, 300)),
    }
    fn, shape = fns[case]
    x, w = torch.randn(shape).to(dtype), torch.randn(shape[-1]).to(dtype)
    dynamic = case == "dynamic"
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path / "s"), stream_store_min_bytes=1, stream_store_min_footprint=0):
        streamed = torch.compile(fn, backend="minductor", dynamic=dynamic)(x, w)
    code = "\n".join(p.read_text() for p in (tmp_path / "s").glob("graph_*/cpp_*.cpp"))
    kind = "halves" if dtype == torch.float16 else "bf16s"
    assert f"mi_stream_store_{kind}<64>(" in code and "mi_stream_fence();" in code, code
    torch._dynamo.reset()
    with config.patch(stream_store_min_bytes=0, aot_cache=False):
        plain = torch.compile(fn, backend="minductor", dynamic=dynamic)(x, w)
    assert torch.equal(streamed.view(torch.int16), plain.view(torch.int16))
    torch.testing.assert_close(streamed, fn(x, w), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("op", ["index_put_acc", "index_add"])
def test_scatters_of_rows_prefetch_the_next_row_for_writing(tmp_path, op: str) -> None:
    """A scatter that updates a chunk of a row picked by a per-row index prefetches the next
    row's chunk for writing (its index computed before the chunk's loop, clamped at the last
    row); repeated indices and the last row give eager's results."""
    x, v = torch.randn(300, 700), torch.randn(900, 700)
    i = torch.randint(0, 300, (900,))
    fn = (lambda x, i, v: x.index_put((i,), v, accumulate=True)) if op == "index_put_acc" else (
        lambda x, i, v: x.index_add(0, i, v, alpha=2))
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, i, v), fn(x, i, v), rtol=1e-4, atol=1e-4)
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    assert "const int64_t mi_next_row = mi_min_i64(xo0 + 1, 900 - 1);" in code, code
    assert re.search(r"__builtin_prefetch\(&in_out_ptr0\[mi_line_at \+ 700L\*tmp\d+_next\], 1, 3\);", code), code
