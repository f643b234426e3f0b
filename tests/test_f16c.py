"""Half values converted in blocks (codegen/cpp_f16c.py): the prelude's block conversions are
exact on every path (F16C in vectors of 16 or 8, and the arithmetic fallback), and kernels that
read or write half rows contiguously use them and still match eager."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import sympy
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen.cpp_f16c import convert_halves_in_blocks


@pytest.mark.parametrize("block", [64, 24, 12], ids=["vectors_of_16", "vectors_of_8", "fallback"])
def test_block_conversions_are_exact(block: int) -> None:
    """Every half converts to eager's float; floats (random bit patterns, every half, the
    midpoints between neighbours and their neighbours: the ties) round to eager's half."""
    from minductor.runtime.cache import compile_cpp

    source = f"""#include "minductor_prelude.h"
extern "C" void h2f(const mi_half* h, float* o, int64_t n) {{
    alignas(64) float block[{block}];
    for (int64_t i = 0; i < n; i += {block}) {{
        mi_halves_to_floats<{block}>(h + i, block);
        for (int k = 0; k < {block}; k++) o[i + k] = block[k];
    }}
}}
extern "C" void f2h(const float* a, mi_half* o, int64_t n) {{
    alignas(64) float block[{block}];
    for (int64_t i = 0; i < n; i += {block}) {{
        for (int k = 0; k < {block}; k++) block[k] = a[i + k];
        mi_floats_to_halves<{block}>(block, o + i);
    }}
}}
"""
    lib = ctypes.CDLL(str(compile_cpp(source, f"mi_f16c_test_{block}")))
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    n = 65536 // block * block
    halves = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)[:n].clone()
    got = torch.empty(n)
    lib.h2f(ptr(halves), ptr(got), ctypes.c_int64(n))
    want = halves.float()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))

    bits = torch.randint(-2**31, 2**31 - 1, (1 << 18,), generator=torch.Generator().manual_seed(0)).to(torch.int32)
    finite = want[want.isfinite()].double().sort().values
    mids = ((finite[:-1] + finite[1:]) / 2)[finite[:-1] < finite[1:]].float()
    up, down = torch.nextafter(mids, torch.tensor(float("inf"))), torch.nextafter(mids, torch.tensor(-float("inf")))
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, 65519.99, 65520.0, 1e-45, 2.98e-8])
    floats = torch.cat([bits.view(torch.float32), want, mids, up, down, specials])
    floats = floats[: floats.numel() // block * block].contiguous()
    out = torch.empty(floats.numel(), dtype=torch.int16)
    lib.f2h(ptr(floats), ptr(out), ctypes.c_int64(floats.numel()))
    ref, nan = floats.half(), floats.isnan()
    assert torch.equal(out.view(torch.float16).isnan(), nan)
    assert torch.equal(out[~nan], ref.view(torch.int16)[~nan]), int((out[~nan] != ref.view(torch.int16)[~nan]).sum())


@pytest.mark.parametrize("block", [64, 24], ids=["vectors_of_16", "fallback"])
def test_bfloat16_block_conversion_is_the_scalar_rounding(block: int) -> None:
    """``mi_floats_to_bf16s`` (AVX512-BF16's conversion where the CPU has it, blocks with a
    NaN or a subnormal by the arithmetic) gives ``mi_float_to_bf16``'s bits for random bit
    patterns, subnormals, NaNs with payloads, infinities, the largest floats and the ties
    between neighbouring bfloat16 values; and eager's bits wherever eager's are not a NaN."""
    from minductor.runtime.cache import compile_cpp

    source = f"""#include "minductor_prelude.h"
extern "C" void block(const float* a, mi_bf16* o, int64_t n) {{
    alignas(64) float values[{block}];
    for (int64_t i = 0; i < n; i += {block}) {{
        for (int k = 0; k < {block}; k++) values[k] = a[i + k];
        mi_floats_to_bf16s<{block}>(values, o + i);
    }}
}}
extern "C" void scalar(const float* a, mi_bf16* o, int64_t n) {{
    for (int64_t i = 0; i < n; i++) o[i] = mi_float_to_bf16(a[i]);
}}
"""
    lib = ctypes.CDLL(str(compile_cpp(source, f"mi_bf16_block_test_{block}")))
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 18,), generator=gen).to(torch.int32)
    subnormal = torch.randint(1, 1 << 23, (4096,), generator=gen).to(torch.int32)
    nan_payloads = torch.randint(1, 1 << 22, (64,), generator=gen).to(torch.int32) | 0x7F800000
    ties = ((torch.randint(-2**15, 2**15 - 1, (4096,), generator=gen).to(torch.int32) << 16) | 0x8000)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.4028235e38, -3.4028235e38, 1.1754944e-38])
    floats = torch.cat([bits.view(torch.float32), subnormal.view(torch.float32), (-subnormal).view(torch.float32),
                        nan_payloads.view(torch.float32), ties.view(torch.float32), specials])
    floats = floats[torch.randperm(floats.numel(), generator=gen)]  # subnormals and NaNs spread over blocks
    floats = floats[: floats.numel() // block * block].contiguous()
    got, want = (torch.empty(floats.numel(), dtype=torch.int16) for _ in range(2))
    lib.block(ptr(floats), ptr(got), ctypes.c_int64(floats.numel()))
    lib.scalar(ptr(floats), ptr(want), ctypes.c_int64(floats.numel()))
    assert torch.equal(got, want), int((got != want).sum())
    nan = floats.isnan()
    assert torch.equal(got[~nan], floats.bfloat16().view(torch.int16)[~nan])


CASES = {
    "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: x.log_softmax(-1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "sum": lambda x: x.sum(-1),
    "row_pointwise": lambda x: x * x.amax(-1, keepdim=True) + 1,
}


@pytest.mark.parametrize("cols", [1000, 4096])
@pytest.mark.parametrize("case", list(CASES))
def test_half_row_kernels_convert_in_blocks(case: str, cols: int, tmp_path: Path) -> None:
    """Rows of 1000 (blocks and a remainder) and 4096 (blocks only) match eager, and the kernel
    reads (and writes) its half rows through the block conversions."""
    fn = CASES[case]
    x = torch.randn(16, cols).half()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(x)
    ref = fn(x.float()).half()  # eager's half ops compute in float and round once, as ours do
    torch.testing.assert_close(out, ref, atol=2e-3 * max(1.0, float(ref.abs().max())), rtol=2e-3)
    torch.testing.assert_close(out, fn(x), atol=2e-3 * max(1.0, float(ref.abs().max())), rtol=4e-3)
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp"))
    assert "mi_halves_to_floats<" in code, code
    assert case == "sum" or "mi_floats_to_halves<" in code, code


def test_a_pointer_the_loop_stores_through_is_read_in_place() -> None:
    """A block read ahead of the loop would miss the loop's own stores: such loads stay."""
    lines = ["#pragma omp simd",
             "for (int64_t xi0 = 0; xi0 < 256; xi0++)",
             "{",
             "    auto tmp0 = mi_half_to_float(in_out_ptr0[xi0 + 1]);",
             "    auto tmp1 = mi_half_to_float(in_ptr0[xi0]);",
             "    in_out_ptr0[xi0] = mi_float_to_half(tmp0 + tmp1);",
             "}"]
    code = "\n".join(convert_halves_in_blocks(lines))
    assert "mi_halves_to_floats<64>(&in_ptr0[mi_hb], mi_h0);" in code, code
    assert "auto tmp0 = mi_half_to_float(in_out_ptr0[xi0 + 1]);" in code, code
    assert "mi_floats_to_halves<64>(mi_hs0, &in_out_ptr0[mi_hb]);" in code, code


@pytest.mark.parametrize("kind", ["half", "bf16"])
def test_a_store_the_loop_reads_back_is_not_deferred(kind: str) -> None:
    """A value stored, then copied as its bits into a second output by a later line of the
    same iteration (a ResNet's last block, updated in place channels-last and cloned to the
    user's NCHW output): deferred to the block's end, the copy read the old value. The
    store stays in place; the kernel, compiled and run, copies the new values."""
    from minductor.runtime.cache import compile_cpp

    lines = ["#pragma omp simd",
             "for (int64_t xi0 = 0; xi0 < 256; xi0++)",
             "{",
             f"    auto tmp0 = mi_{kind}_to_float(in_out_ptr0[xi0]);",
             f"    auto tmp1 = mi_{kind}_to_float(in_ptr0[xi0]);",
             f"    in_out_ptr0[xi0] = mi_float_to_{kind}(tmp0 + tmp1);",
             "    out_ptr0[xi0] = in_out_ptr0[xi0];",
             "}"]
    body = convert_halves_in_blocks(lines)
    code = "\n".join(body)
    assert f"in_out_ptr0[xi0] = mi_float_to_{kind}(tmp0 + tmp1);" in code and "mi_h0" in code, code
    source = "\n".join(['#include "minductor_prelude.h"',
                        'extern "C" void k(uint16_t* __restrict__ in_out_ptr0, const uint16_t* __restrict__ in_ptr0, '
                        'uint16_t* __restrict__ out_ptr0) {', *body, "}"])
    lib = ctypes.CDLL(str(compile_cpp(source, f"mi_store_read_back_{kind}")))
    dtype = torch.float16 if kind == "half" else torch.bfloat16
    a, b = torch.randn(256).to(dtype), torch.randn(256).to(dtype)
    want = (a.float() + b.float()).to(dtype)
    out = torch.empty(256, dtype=dtype)
    lib.k(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(out.data_ptr()))
    assert torch.equal(a, want) and torch.equal(out, want)


@pytest.mark.parametrize("n", [37000, 4096])
def test_half_pointwise_kernels_convert_in_blocks(n: int, tmp_path: Path) -> None:
    """A one-dimensional pointwise kernel over halves: threads take blocks of converted values,
    and a remainder (37000 = 578 blocks of 64 and 8) runs the loop as it was, in one thread of
    the parallel region its invariant lines (gelu's constants) run in."""
    fn = lambda x, y: (F.gelu(x) * y + x, (x > y).half() - y)  # noqa: E731
    x, y = torch.randn(n).half(), torch.randn(n).half()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(x, y)
    for got, want in zip(out, fn(x, y)):
        torch.testing.assert_close(got, want, atol=4e-3, rtol=2e-3)
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp"))
    assert "mi_halves_to_floats<64>(&in_ptr0[mi_hb]" in code and "mi_floats_to_halves<64>(mi_hs0" in code, code
    assert f"const int64_t mi_hend = {n // 64 * 64};" in code, code
    assert ("for (int64_t xo0 = mi_hend; xo0 < 37000; xo0++)" in code) == (n == 37000), code
    assert n != 37000 or ("#pragma omp parallel\n" in code and "#pragma omp single" in code), code


def test_a_kernel_that_only_stores_halves_converts_in_blocks(tmp_path: Path) -> None:
    """A float tensor cast to half (autocast's casts, ``.half()``): no half is read, the stores
    still convert a block at a time (they were left to per-element arithmetic: 1024^2 in
    49 us, eager 34)."""
    x = torch.randn(4096, 300)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(lambda x: (x * 2).half(), backend="minductor")(x)
    assert torch.equal(out, (x * 2).half())
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    assert "mi_floats_to_halves<64>(mi_hs0" in code and "mi_halves_to_floats" not in code, code


@pytest.mark.parametrize("cols", [1000, 4096])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_16_bit_scans_over_rows_convert_in_blocks(dtype: torch.dtype, cols: int, tmp_path: Path) -> None:
    """Rows scanned together (10 rows: two groups of 4 and two rows alone) read and write their
    16-bit values a block at a time, and every step still combines in eager's order."""
    fns = {"cumsum": lambda x: x.cumsum(-1), "cumprod": lambda x: (x * 0.1 + 1).cumprod(-1),
           "cummax": lambda x: x.cummax(-1).values,
           "padded": lambda x: F.pad(x, (3, 0)).cumsum(-1)}  # (a masked load, its index under the mask: not read ahead)
    x = torch.randn(10, cols).to(dtype)
    for name, fn in fns.items():
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / name)):
            out = torch.compile(fn, backend="minductor")(x)
        torch.testing.assert_close(out, fn(x), atol=2e-2 if dtype == torch.bfloat16 else 4e-3, rtol=1.6e-2)
        code = "\n".join(p.read_text() for p in (tmp_path / name).glob("graph_*/cpp_fused_*.cpp"))
        kind = "halves" if dtype == torch.float16 else "bf16s"
        read_ahead = f"mi_{kind}_to_floats<64>(&in_ptr0[mi_rb + " in code
        assert read_ahead == (name != "padded") and f"mi_floats_to_{kind}<64>(mi_hs0_3" in code, code


def test_values_rounded_to_half_mid_loop_round_in_blocks(tmp_path) -> None:
    """``silu(a) * b`` in half rounds silu's result to half before the product (as eager's two
    ops do): the block's loop stops there, the block rounds with the conversion instructions,
    and a second loop goes on (1.07 -> 0.52 ms at 4096x1024, the kernel alone); results match
    eager's, NaN and infinity included (silu's float value may differ from eager's by an ulp,
    and round to the neighbouring half)."""
    import torch.nn.functional as F

    from minductor import config

    a, b = torch.randn(300, 130).half() * 4, torch.randn(300, 130).half()
    a[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 65504.0])
    fn = lambda a, b: F.silu(a) * b  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(a, b)
    torch.testing.assert_close(got, fn(a, b), rtol=2e-3, atol=1e-3, equal_nan=True)  # (a half ulp, see above)
    source = "".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    assert "mi_round_halves<64>(mi_r0);" in source, source


def test_bfloat16_pointwise_loops_convert_in_blocks(tmp_path) -> None:
    """A bfloat16 pointwise loop converts its loads and stores a block at a time too, leaving
    the math loop all float (a bf16 gelu at 4096x1024: 590-607 -> 543-550 us, the kernel
    alone); results as eager's."""
    import torch.nn.functional as F

    from minductor import config

    x = (torch.randn(300, 130) * 3).bfloat16()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(lambda x: F.gelu(x), backend="minductor")(x)
    torch.testing.assert_close(got, F.gelu(x))
    source = "".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    assert "mi_bf16s_to_floats<64>(" in source and "mi_floats_to_bf16s<64>(" in source, source


def test_bfloat16_rows_of_symbolic_width_divided_convert_in_blocks() -> None:
    """Index text with C++ integer division and mi_max_i64 (a dynamic width split into heads)
    reads back as FloorDiv and Max (``common.parse_cpp_index``): SymPy's own parser made
    ``s0 / 4`` a fraction, and compiling the kernel failed; results match eager."""
    from minductor.codegen.common import cpp_index, parse_cpp_index
    from minductor.ir.indexing import FloorDiv, ModularIndexing, index_symbol

    s0, x = index_symbol("s0"), index_symbol("xo1")
    for expr in (x + 64 * FloorDiv(s0, 4), ModularIndexing(x, 1, s0) - 3, sympy.Max(1, FloorDiv(s0, 4)) * x + 2):
        assert parse_cpp_index(cpp_index(expr)) == expr
    assert parse_cpp_index("tmp0[3]") is None and parse_cpp_index("abs(xo1)") is None

    def heads(x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        return x.view(b, t, 4, c // 4).transpose(1, 2).reshape(b * 4, t, c // 4) + 1

    compiled = torch.compile(heads, backend="minductor", dynamic=True)
    for t in (64, 96):
        x = torch.randn(2, t, 256).bfloat16()
        torch.testing.assert_close(compiled(x), heads(x))
