"""Float32 matrix products on CPU run on MKL (aten's mm.out into a planned buffer) or on oneDNN
(``torch.ops.mkldnn._linear_pointwise``, which allocates its result): ``config.cpu_gemm``.
Either way results match eager, forward and backward, for every operand layout."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.lowering import extern
from minductor.runtime import cache
from minductor.runtime.helpers import mm_onednn

ONEDNN = "mkldnn._linear_pointwise"


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()


def _codes(tmp_path: Path) -> dict[str, str]:
    return {p.parent.name.split("_")[-1]: p.read_text() for p in tmp_path.glob("graph_*/output_code.py")}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_linear_layers_train_on_onednn(tmp_path: Path) -> None:
    """Forward (x @ w.t()), backward (g @ w and g.t() @ x: transposed operands) and inference
    all call oneDNN; outputs and every gradient match eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
    x = torch.randn(300, 256, requires_grad=True)
    ref = model(x)
    ref.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="onednn"):
        compiled = torch.compile(model, backend="minductor")
        out = compiled(x)
        out.square().sum().backward()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for got, want in zip([p.grad for p in model.parameters()] + [x.grad], grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    codes = _codes(tmp_path)
    assert {"forward", "backward", "inference"} <= set(codes), sorted(codes)
    for kind in ("forward", "backward", "inference"):
        assert ONEDNN in codes[kind] and "torch.mm(" not in codes[kind], kind
    assert codes["forward"].count(ONEDNN) == 2 and codes["backward"].count(ONEDNN) == 4


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("case", ["transposed", "sliced", "expanded", "dynamic"])
def test_onednn_takes_any_operand_layout(tmp_path: Path, case: str) -> None:
    torch.manual_seed(0)
    a, b, lin = torch.randn(200, 96), torch.randn(96, 160), torch.nn.Linear(96, 160)
    fns = {
        "transposed": (lambda a, b: a.t().t() @ b.t().contiguous().t(), (a, b)),
        "sliced": (lambda a, b: a[::2, 1:] @ b[1:, ::2], (torch.randn(400, 97), torch.randn(97, 320))),
        "expanded": (lambda a, b: a.expand(200, 96) @ b, (torch.randn(1, 96), b)),
        "dynamic": (lambda a: torch.relu(lin(a)), (a,)),  # a parameter keeps static sizes
    }
    fn, args = fns[case]
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="onednn"), torch.no_grad():
        compiled = torch.compile(fn, backend="minductor", dynamic=case == "dynamic")
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-4, atol=1e-4)
        if case == "dynamic":  # the batch is a size symbol; the reduced and output widths stay static
            other = torch.randn(333, 96)
            torch.testing.assert_close(compiled(other), fn(other), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(compiled(other[:0]), fn(other[:0]))
    first = sorted(tmp_path.glob("graph_*/output_code.py"))[0].read_text()
    assert ONEDNN in first
    if case == "dynamic":
        assert "assert_size_stride(arg" in first and "(s" in first


@pytest.mark.parametrize("shape", [(8, 8, 8), (64, 0, 64)])
def test_small_or_empty_products_stay_on_mkl(tmp_path: Path, shape: tuple[int, int, int]) -> None:
    """Below ONEDNN_MIN_MACS oneDNN's per-call cost outweighs it; an empty reduction (oneDNN
    rejects it) gives zeros through mm.out."""
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="onednn"):
        torch.testing.assert_close(torch.compile(torch.mm, backend="minductor")(a, b), a @ b)
    code = next(iter(_codes(tmp_path).values()))
    assert ONEDNN not in code and "torch.mm(" in code
    assert m * k * n < extern.ONEDNN_MIN_MACS


def test_mkl_keeps_mm_out_and_the_bias_epilogue(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(256, 256), torch.randn(256, 512), torch.randn(512)
    fn = lambda x: F.gelu(torch.addmm(b, x, w))  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="mkl"), torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), rtol=1e-4, atol=1e-4)
    code = next(iter(_codes(tmp_path).values()))
    assert ONEDNN not in code and "torch.mm(" in code and "addmm" not in code


@pytest.mark.parametrize("vendor, machine, onednn", [("AuthenticAMD", "x86_64", True), ("HygonGenuine", "x86_64", True),
                                                     ("GenuineIntel", "x86_64", False), (None, "aarch64", False)])
def test_auto_takes_onednn_where_mkl_dispatch_is_slow(monkeypatch: pytest.MonkeyPatch, on_cpu: Any, vendor: str | None,
                                                     machine: str, onednn: bool) -> None:
    monkeypatch.setattr(cache.platform, "machine", lambda: machine)
    assert on_cpu(cache.onednn_gemm_pays_off, {} if vendor is None else {"vendor_id": vendor}) is onednn


def test_unknown_gemm_choice_is_a_clear_error() -> None:
    a, b = torch.randn(256, 64), torch.randn(64, 256)
    with config.patch(cpu_gemm="blis"), pytest.raises(Exception, match="cpu_gemm.*'blis'.*'auto', 'mkl' or 'onednn'"):
        torch.compile(torch.mm, backend="minductor")(a, b)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_weight_gradients_over_a_symbolic_batch_take_onednn(tmp_path: Path) -> None:
    """Under dynamic shapes a weight gradient reduces over the batch, a size symbol: it runs on
    oneDNN through ``mm_onednn``, which gives zeros for an empty reduction (oneDNN rejects it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="onednn"):
        compiled = torch.compile(model, backend="minductor", dynamic=True)
        for batch in (300, 517):
            x = torch.randn(batch, 128)
            compiled(x).square().sum().backward()
            got = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            model(x).square().sum().backward()
            for g, want in zip(got, [p.grad for p in model.parameters()]):
                torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-3)
            model.zero_grad()
    backward = _codes(tmp_path)["backward"]
    assert "mm_onednn(" in backward and "torch.mm(" not in backward
    a, w = torch.randn(5, 0), torch.randn(3, 0)
    torch.testing.assert_close(mm_onednn(a, w), a @ w.t())


def test_triton_kernels_on_cpu_keep_the_matmul_template(tmp_path: Path) -> None:
    """cpu_backend="triton" generates mm as its Triton template (interpreter): never oneDNN."""
    pytest.importorskip("triton", reason="the Triton backend needs triton")
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="onednn", cpu_backend="triton"):
        torch.testing.assert_close(torch.compile(lambda a, b: (a @ b).relu(), backend="minductor")(a, b), (a @ b).relu(),
                                   rtol=1e-4, atol=1e-4)
    code = next(iter(_codes(tmp_path).values()))
    assert ONEDNN not in code and "triton_tem_fused" in code


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_weight_gradient_inputs_are_copied_by_our_tiled_kernel(tmp_path: Path) -> None:
    """oneDNN's inner product copies a non-contiguous input with aten (1.5 ms for a transposed
    1024x1024 one); ``dy.t() @ x`` of a weight gradient gets its ``dy.t()`` from our own
    transposing copy instead: a tiled kernel of its own (not fused with the bias gradient's
    column sum of ``dy``, which would leave it untiled), and no aten copy runs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 384))
    x = torch.randn(1024, 256)
    model(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="onednn"):
        compiled = torch.compile(model, backend="minductor")
        loss = compiled(x).square().sum()
        with torch.profiler.profile(record_shapes=True) as prof:
            loss.backward()
    for got, want in zip([p.grad for p in model.parameters()], grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    def in_graph(e: Any) -> bool:  # (AOTAutograd copies the incoming expanded gradient before it)
        while e is not None and e.name != "CompiledFunctionBackward":
            e = e.cpu_parent
        return e is not None

    copies = [e.input_shapes for e in prof.events() if e.name == "aten::copy_" and in_graph(e)]
    assert not copies, copies
    code = _codes(tmp_path)["backward"]
    assert code.count(ONEDNN) == 3  # two weight gradients and the hidden layer's input gradient
    assert not re.search(rf"{ONEDNN}\.default\(reinterpret_tensor\(\w+, \(\d+, \d+\), \(1, ", code), code
    clones = [p.read_text() for p in tmp_path.glob("graph_*_backward/cpp_fused_clone_*.cpp")]
    assert clones and all("mi_stage0" in c for c in clones), [p.name for p in tmp_path.glob("graph_*_backward/*.cpp")]


HALF_PRODUCTS = {
    "mm": (lambda a, b, bias, x, y, z: a @ b),
    "addmm": (lambda a, b, bias, x, y, z: torch.addmm(bias, a, b)),
    "addmm_scaled": (lambda a, b, bias, x, y, z: torch.addmm(bias, a, b, beta=0.5, alpha=2.0)),
    "linear_gelu": (lambda a, b, bias, x, y, z: F.gelu(F.linear(a, b.t(), bias))),
    "bmm": (lambda a, b, bias, x, y, z: torch.bmm(x, y)),
    "baddbmm": (lambda a, b, bias, x, y, z: torch.baddbmm(z, x, y, alpha=0.5)),
}


@pytest.mark.parametrize("native", [False, True], ids=["float32_products", "aten_half_products"])
@pytest.mark.parametrize("case", list(HALF_PRODUCTS))
def test_half_products_without_native_half_gemm_run_in_float32(case: str, native: bool, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without native half GEMM (eager's half product ~75x slower than float32's), a
    half product runs in float32 and rounds to half once, as eager's accumulates and rounds:
    the wrapper's products write float32 buffers only. With native half GEMM, aten's half
    ops. Both within half rounding of an fp64 reference."""
    monkeypatch.setattr(cache, "native_half_gemm", lambda: native)
    torch.manual_seed(0)
    args = [torch.randn(300, 64), torch.randn(64, 96), torch.randn(96), torch.randn(4, 30, 64), torch.randn(4, 64, 20),
            torch.randn(4, 30, 20)]
    fn = HALF_PRODUCTS[case]
    # (a cache of their own: the graph cache keys the CPU, not this test's stand-in for it)
    with config.patch(debug=True, debug_dir=str(tmp_path), cache_dir=str(tmp_path / "cache")):
        out = torch.compile(fn, backend="minductor")(*(t.half() for t in args))
    ref = fn(*(t.half().double() for t in args))
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-3)
    (code,) = _codes(tmp_path).values()
    buffers = dict(re.findall(r"(buf\d+) = empty_strided\(.*dtype=torch\.(\w+)\)", code))
    products = re.findall(r"torch\.\w*mm\(.*out=(buf\d+)\)", code)
    onednn = re.findall(r"(buf\d+) = [\w.]*_linear_pointwise", code)  # (float32 only)
    assert products + onednn, code
    if not native:
        assert all(buffers[n] == "float32" for n in products), code
    elif case in ("mm", "bmm", "addmm"):  # (the others' decompositions compute in float32 themselves)
        assert all(buffers[n] == "float16" for n in products) and not onednn, code


@pytest.mark.parametrize("native", [False, True], ids=["float32_convolutions", "aten_half_convolutions"])
def test_half_convolutions_without_native_half_gemm_run_in_float32(native: bool, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A half convolution, forward and backward, runs in float32 (eager's: 233 ms against 4.1 at
    (8, 64, 56, 56) with 64 3x3 filters) and rounds to half once: the convolution reads float32
    buffers; outputs and gradients within half rounding of an fp64 reference."""
    monkeypatch.setattr(cache, "native_half_gemm", lambda: native)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 8, 3, stride=2, padding=1, groups=2))
    x = torch.randn(2, 3, 16, 16)
    ref_model = copy.deepcopy(model).double()
    xr = x.double().requires_grad_()
    ref_model(xr).square().sum().backward()
    ref_grads = [p.grad for p in ref_model.parameters()] + [xr.grad]
    model = model.half()
    xh = x.half().requires_grad_()
    with config.patch(debug=True, debug_dir=str(tmp_path), cache_dir=str(tmp_path / "cache")):
        out = torch.compile(model, backend="minductor")(xh)
        out.float().square().sum().backward()
    torch.testing.assert_close(out.double(), ref_model(x.double()), atol=1e-2, rtol=1e-2)
    for got, want in zip([p.grad for p in model.parameters()] + [xh.grad], ref_grads):
        torch.testing.assert_close(got.double(), want, atol=5e-2 * float(want.abs().max()), rtol=1e-2)
    codes = _codes(tmp_path)
    convs = re.findall(r"(?:torch\.convolution|convolution_backward\.default)\((\w+)", "\n".join(codes.values()))
    dtypes = {n: d for code in codes.values() for n, d in re.findall(r"(buf\d+) = empty_strided\(.*dtype=torch\.(\w+)\)", code)}
    assert len(convs) == 4, codes
    if native:  # the graph's half inputs, or half buffers
        assert all(dtypes.get(n, "float16") == "float16" for n in convs), codes
    else:  # buffers of ours (float32 copies, or a buffer reused for one), never a half one
        assert all(n.startswith("buf") and dtypes.get(n) != "float16" for n in convs), codes


_VECTOR_PRODUCTS = {
    "row_times_matrix": (lambda v, m: v @ m, [(1, 300), (300, 200)]),
    "vector_times_matrix": (lambda v, m: v.squeeze(0) @ m, [(1, 300), (300, 200)]),
    "batch_1_linear": (lambda v, m: F.linear(v, m.t()), [(1, 300), (300, 200)]),
    "matrix_times_column": (lambda m, v: m @ v, [(200, 300), (300, 1)]),
    "decoding_scores": (lambda q, k: torch.bmm(q, k.transpose(1, 2)), [(6, 1, 64), (6, 500, 64)]),
    "decoding_values": (lambda p, v: torch.bmm(p, v), [(6, 1, 500), (6, 500, 64)]),
    "batched_column": (lambda m, v: torch.bmm(m, v), [(6, 40, 300), (6, 300, 1)]),
    "two_rows": (lambda v, m: F.linear(v, m.t()), [(2, 300), (300, 200)]),
    "two_columns": (lambda m, v: torch.bmm(m, v), [(6, 40, 300), (6, 300, 2)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", list(_VECTOR_PRODUCTS))
def test_products_with_one_output_row_or_column_are_sums(case: str, dtype: torch.dtype, tmp_path: Path) -> None:
    """A product with one or two output rows or columns reads its matrix as a native sum of
    products (bf16 summed in float32), not a GEMM call: results as eager's, no extern call."""
    fn, shapes = _VECTOR_PRODUCTS[case]
    torch.manual_seed(0)
    args = [torch.randn(s, dtype=dtype) for s in shapes]
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(*args)
    tol = {torch.bfloat16: dict(rtol=2e-2, atol=2e-1)}.get(dtype, {})
    torch.testing.assert_close(got, fn(*args), **tol)
    code = "\n".join(_codes(tmp_path).values())
    assert ONEDNN not in code and ".mm" not in code and "bmm" not in code, code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [3, 8])
def test_products_with_a_few_rows_sum_column_by_column(rows: int, dtype: torch.dtype, tmp_path: Path) -> None:
    """3 to 8 rows (a small batch's linear layer, batched too) are sums over the matrix's
    columns with the rows inside, each column's row of the matrix read once for all of them
    (batch-4 linear 4096x1024: 191 us, oneDNN 336): results as eager's, no GEMM call, and the
    product's loops run columns outside, rows inside."""
    torch.manual_seed(0)
    x, w, bias = torch.randn(rows, 300, dtype=dtype), torch.randn(400, 300, dtype=dtype), torch.randn(400, dtype=dtype)
    xb, wb = torch.randn(2, rows, 300, dtype=dtype), torch.randn(2, 400, 300, dtype=dtype).transpose(1, 2)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(lambda x, w, b, xb, wb: (F.linear(x, w, b), torch.bmm(xb, wb)), backend="minductor")(x, w, bias, xb, wb)
    tol = {torch.bfloat16: dict(rtol=2e-2, atol=2e-1)}.get(dtype, dict(rtol=1e-4, atol=1e-4))
    torch.testing.assert_close(got, (F.linear(x, w, bias), torch.bmm(xb, wb)), **tol)
    code = "\n".join(_codes(tmp_path).values())
    assert ONEDNN not in code and ".mm" not in code and "bmm" not in code, code
    assert re.search(rf"for \(int64_t (\w+) = 0; \1 < 400; \1\+\+\)\s*\{{\s*for \(int64_t (\w+) = 0; \2 < {rows}; \2\+\+\)", code), code


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_an_operand_read_for_every_column_is_computed_once(rows: int, tmp_path: Path) -> None:
    """The operand a sum of products reads whole for each column of the other is a contiguous
    buffer of its own: computed in the product's loops (hardswish of a transposed view, here),
    it was recomputed for every one of the 256 columns (LeViT: 1.0 ms, 0.02 computed once).
    The same for a matrix's few columns, read for each row."""
    torch.manual_seed(0)
    x, w, m = torch.randn(2, 64, rows, 4), torch.randn(256, 512), torch.randn(40, 512)

    def fn(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = F.hardswish(x.transpose(1, 2).reshape(-1, 512))[:rows]  # (rows, 512), computed
        return F.linear(a, w), m @ a.t()

    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(x, w, m)
    torch.testing.assert_close(got, fn(x, w, m), rtol=1e-4, atol=1e-4)
    kernels = {p.stem: p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp")}
    products = [name for name in kernels if "_sum_" in name]
    assert products and not any("mi_maximum" in kernels[n] for n in products), kernels  # no hardswish inside
    assert sum("mi_maximum" in k for k in kernels.values()) == 1, kernels  # computed once, by its own kernel


def test_a_matrix_stored_along_its_columns_goes_to_the_gemm(tmp_path: Path) -> None:
    """Column by column, the sums read the matrix along its depth: one stored along its columns
    (a weight gradient's activations, LeViT's 8x96 @ 96x256; GPT-2's Conv1D weights) was read
    256 floats apart, 274 us where a GEMM call takes a few. It goes to the GEMM library; one
    stored along its depth (a linear layer's weight) stays a sum."""
    torch.manual_seed(0)
    a, b = torch.randn(8, 96), torch.randn(96, 256)
    for name, matrix in (("columns", b), ("depth", b.t().contiguous().t())):
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / name)):
            torch.testing.assert_close(torch.compile(torch.mm, backend="minductor")(a, matrix), a @ matrix, rtol=1e-4, atol=1e-4)
        code = "\n".join(_codes(tmp_path / name).values())
        assert (ONEDNN in code or "torch.mm(" in code) == (name == "columns"), code
    # GPT-2's Conv1D: addmm(bias, x, weight) with its weight stored (in, out), at 4 rows (a batch-4
    # decoding step: 95 ms a two-layer step as sums, 9.3 through the GEMM)
    x, weight, bias = torch.randn(4, 768), torch.randn(768, 2304), torch.randn(2304)
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path / "conv1d")):
        got = torch.compile(torch.addmm, backend="minductor")(bias, x, weight)
    torch.testing.assert_close(got, torch.addmm(bias, x, weight), rtol=1e-4, atol=1e-4)
    code = "\n".join(_codes(tmp_path / "conv1d").values())
    assert ONEDNN in code or "torch.mm(" in code, code


def test_products_with_more_rows_stay_gemms(tmp_path: Path) -> None:
    """Nine rows go to the GEMM library, and so do five to eight rows summing more than 1024
    products each (8 rows of 11008x4096: 7.5 ms as sums, 6.9 on oneDNN; up to four read the
    matrix in streams, test_read_streams)."""
    for a, b in ((torch.randn(9, 300), torch.randn(300, 4000)), (torch.randn(5, 2000), torch.randn(2000, 300))):
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / str(a.shape[0]))):
            torch.testing.assert_close(torch.compile(torch.mm, backend="minductor")(a, b), a @ b, rtol=1e-4, atol=1e-4)
        code = next(iter(_codes(tmp_path / str(a.shape[0])).values()))
        assert ONEDNN in code or "torch.mm(" in code, code


@pytest.mark.parametrize("vendor, family, least", [("AuthenticAMD", "25", 1 << 24), ("AuthenticAMD", "26", 1 << 20),
                                                   ("HygonGenuine", "24", 1 << 20)])
def test_auto_sends_smaller_products_to_mkl_where_its_path_is_not_slow(on_cpu: Any, vendor: str, family: str,
                                                                       least: int) -> None:
    assert on_cpu(cache.onednn_auto_min_macs, {"vendor_id": vendor, "cpu family": family}) == least


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("least", [1 << 20, 1 << 24])
def test_auto_threshold_decides_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, least: int) -> None:
    """A 512x48 @ 48x144 product (3.4M multiply-adds, a Swin layer's): oneDNN under the 2^20
    threshold, MKL under Zen 4's 2^24; results match eager either way."""
    monkeypatch.setattr(extern, "onednn_gemm_pays_off", lambda: True, raising=False)
    monkeypatch.setattr(cache, "onednn_gemm_pays_off", lambda: True)
    monkeypatch.setattr(cache, "onednn_auto_min_macs", lambda: least)
    a, b = torch.randn(512, 48), torch.randn(48, 144)
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="auto"):
        torch.testing.assert_close(torch.compile(torch.mm, backend="minductor")(a, b), a @ b, rtol=1e-4, atol=1e-4)
    code = next(iter(_codes(tmp_path).values()))
    assert (ONEDNN in code) == (least == 1 << 20), code


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_sixteen_bit_linear_layers_of_few_rows_sum_in_float32(dtype: torch.dtype, rows: int, tmp_path: Path) -> None:
    """A 16-bit linear layer with a bias, one to three rows: summed in float32 by our kernel,
    the bias added before the one rounding (as the GEMM's epilogue), no aten addmm; as close to
    a float64 reference as eager's result, within one unit in the last place of it. (A batch-1
    bfloat16 decoding step's MLP, four layers of 1024 -> 4096 -> 1024, one thread: 7.05 ->
    3.59 ms, eager 7.15.) Three bfloat16 rows summing over 1024 products would read the matrix
    along one stream (their lanes do not fit the streams: 10.1 ms at batch 3, eager 7.0): aten's
    addmm takes them; half products run in float32 (``half_in_float32``) and stream."""
    torch.manual_seed(0)
    x, w, b = torch.randn(rows, 1100, dtype=dtype), torch.randn(300, 1100, dtype=dtype), torch.randn(300, dtype=dtype)
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(x, w, b)
    code = next(iter(_codes(tmp_path).values()))
    gemm = rows == 3 and dtype == torch.bfloat16
    assert ("addmm" in code) == gemm and "mkldnn" not in code, code
    ref = fn(x.double(), w.double(), b.double())
    ours, eager = (out.double() - ref).abs(), (fn(x, w, b).double() - ref).abs()
    ulp = torch.finfo(dtype).eps * ref.abs().clamp_min(1.0)
    assert (ours <= eager + ulp).all(), (ours - eager).max()
