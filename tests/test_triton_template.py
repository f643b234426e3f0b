"""The Triton matmul template for bmm (batch on program axis 2; baddbmm decomposes into bmm + epilogue) and bf16,
run in Triton's interpreter."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import config, metrics
from tests.conftest import check


@pytest.fixture(autouse=True)
def _triton_backend() -> Any:
    with config.patch(cpu_backend="triton"):
        yield


def wrapper_and_kernels(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> tuple[str, list[str]]:
    """Compile ``fn``; return the wrapper module source and its Triton kernel sources."""
    from minductor.runtime import loader

    modules: list[Any] = []
    original = loader.load_wrapper

    def spy(module: Any, dump: Any) -> Any:
        modules.append(module)
        return original(module, dump)

    loader.load_wrapper = spy
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend="minductor", dynamic=dynamic)(*args)
    finally:
        loader.load_wrapper = original
    (module,) = modules
    return module.source, [k.source for k in module.kernels if k.backend == "triton"]


def assert_bmm_template(fn: Callable[..., Any], *args: Any, stores: int | None = None) -> str:
    """One template kernel over a 3-D grid, no extern bmm/baddbmm call left in the wrapper."""
    source, kernels = wrapper_and_kernels(fn, *args)
    templates = [k for k in kernels if "tl.dot(" in k]
    assert len(templates) == 1 and "def triton_tem_fused_" in templates[0], kernels
    assert "tl.program_id(2)" in templates[0], templates[0]
    call = source.split("\ndef call", 1)[1]
    assert "aten.bmm" not in call and "aten.baddbmm" not in call, call
    if stores is not None:
        assert templates[0].count("tl.store(") == stores, templates[0]
    if stores == 1:  # the epilogue absorbed the bmm result: its buffer is never allocated
        mm_buf = templates[0].split("# bmm ", 1)[1].split()[0]
        assert not re.search(rf"\b{mm_buf}\b", call), call
    assert not metrics.fallback_ops
    return templates[0]


B, M, N, K = 3, 33, 17, 45
# plain bmm and bmm + bias + relu: tests/test_triton.py::test_bmm_template
BMM_CASES: dict[str, Callable[..., Any]] = {
    "residual": lambda a, b, bias, res: torch.bmm(a, b) + res,
    "baddbmm_sigmoid": lambda a, b, bias, res: torch.baddbmm(res, a, b, beta=2.0, alpha=0.5).sigmoid(),
    "baddbmm_broadcast_bias": lambda a, b, bias, res: torch.baddbmm(bias, a, b),
}


@pytest.mark.parametrize("case", sorted(BMM_CASES))
def test_bmm_template_with_epilogue(case: str) -> None:
    """Odd sizes (no dimension a multiple of the block); the epilogue reads the accumulator."""
    a, b = torch.randn(B, M, K), torch.randn(B, K, N)
    bias, res = torch.randn(N), torch.randn(B, M, N)
    fn = BMM_CASES[case]
    check(fn, a, b, bias, res, rtol=1e-4, atol=1e-4)
    # with an epilogue, the matmul result is never written: one store, of the final value
    assert_bmm_template(fn, a, b, bias, res, stores=1)


@pytest.mark.parametrize("layout", ["a_transposed", "b_transposed", "both_transposed", "sliced"])
def test_bmm_template_strided_operands(layout: str) -> None:
    a_t, b_t = torch.randn(B, K, M), torch.randn(B, N, K)
    wide = torch.randn(B, M, 2 * K)
    fns = {
        "a_transposed": lambda a, b: torch.bmm(a.transpose(1, 2), b.transpose(1, 2).contiguous()).relu(),
        "b_transposed": lambda a, b: torch.bmm(a.transpose(1, 2).contiguous(), b.transpose(1, 2)) * 3,
        "both_transposed": lambda a, b: torch.bmm(a.transpose(1, 2), b.transpose(1, 2)),
        "sliced": lambda a, b: torch.bmm(a[:, :, ::2][:, :, :K], b.transpose(1, 2)[:, :K]),
    }
    args = (wide, b_t) if layout == "sliced" else (a_t, b_t)
    check(fns[layout], *args, rtol=1e-4, atol=1e-4)
    assert_bmm_template(fns[layout], *args)


def test_bmm_result_read_twice_is_stored() -> None:
    a, b = torch.randn(2, 9, 12), torch.randn(2, 12, 7)

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.bmm(a, b)
        return (y + 1).relu(), y.sum(-1)

    check(fn, a, b, rtol=1e-4, atol=1e-4)
    template = assert_bmm_template(fn, a, b)
    assert "tl.store(" in template, template  # the sum reads the bmm result from memory


def test_attention_scores_use_the_template() -> None:
    """softmax(q @ k^T * scale) @ v: both matmuls are bmm templates (the first with its scale fused)."""
    q, k, v = torch.randn(4, 10, 16), torch.randn(4, 10, 16), torch.randn(4, 10, 16)
    fn = lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v
    check(fn, q, k, v, rtol=1e-4, atol=1e-4)
    source, kernels = wrapper_and_kernels(fn, q, k, v)
    assert sum("tl.dot(" in s and "tl.program_id(2)" in s for s in kernels) == 2, kernels
    assert "aten.bmm" not in source.split("\ndef call", 1)[1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bmm_template_half(dtype: torch.dtype) -> None:
    """fp32 accumulation, the result rounded to the input dtype like eager, then the epilogue."""
    a, b = torch.randn(B, M, K, dtype=dtype), torch.randn(B, K, N, dtype=dtype)
    res = torch.randn(B, M, N, dtype=dtype)
    fn = lambda a, b, res: (torch.bmm(a, b) + res).relu()
    # one rounding step of the output dtype (eager rounds the bmm result, then the sum)
    tol = 1e-2 if dtype == torch.float16 else 8e-2
    check(fn, a, b, res, rtol=tol, atol=tol)
    assert_bmm_template(fn, a, b, res, stores=1)


def test_bf16_mm_template() -> None:
    a, b = torch.randn(20, 40, dtype=torch.bfloat16), torch.randn(40, 24, dtype=torch.bfloat16)
    fn = lambda a, b: (a @ b).float().tanh()
    check(fn, a, b, rtol=2e-2, atol=2e-2)
    _, kernels = wrapper_and_kernels(fn, a, b)
    assert sum("tl.dot(" in k for k in kernels) == 1, kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_template_several_tiles_and_k_steps(dtype: torch.dtype) -> None:
    """M, N over one 64-wide tile and K = 150 (three K steps of 64, the last one partial)."""
    a, b = torch.randn(2, 70, 150, dtype=dtype), torch.randn(2, 150, 90, dtype=dtype)
    res = torch.randn(2, 70, 90, dtype=dtype)
    fn = lambda a, b, res: (torch.bmm(a, b) + res).relu()
    tol = 1e-4 if dtype == torch.float32 else 8e-2  # bf16: one rounding of the bmm result and of the sum
    check(fn, a, b, res, rtol=tol, atol=tol)
    template = assert_bmm_template(fn, a, b, res, stores=1)
    assert "range(0, 150, KBLOCK)" in template and "triton.cdiv" not in template


def test_symbolic_bmm_stays_extern() -> None:
    """The template needs static sizes: a dynamic-shape bmm is an aten call, still exact."""
    fn = lambda a, b: torch.bmm(a, b).relu()
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for bsz, m, k, n in [(2, 5, 7, 3), (3, 9, 11, 4), (4, 6, 13, 5)]:
        a, b = torch.randn(bsz, m, k), torch.randn(bsz, k, n)
        torch.testing.assert_close(compiled(a, b), fn(a, b), rtol=1e-5, atol=1e-5)
    source, kernels = wrapper_and_kernels(fn, torch.randn(2, 5, 7), torch.randn(2, 7, 3), dynamic=True)
    assert "torch.bmm(" in source and not any("tl.dot(" in k for k in kernels), source


def test_autotune_without_a_gpu_times_nothing(capsys: Any, tmp_path: Any) -> None:
    """CPU tensors and no injected timer: the heuristic configuration runs untimed, is cached, and
    the debug output says so once."""
    from minductor.runtime import triton_autotune

    a, b, x = torch.randn(2, 20, 36), torch.randn(2, 36, 24), torch.randn(4, 1500)
    fn = lambda a, b, x: (torch.bmm(a, b).relu(), x.sin().sum(-1))
    triton_autotune.clear_cache()
    triton_autotune._noted_untimed = False
    try:
        with config.patch(triton_autotune=True, debug=True, debug_dir=str(tmp_path)):
            source, _ = wrapper_and_kernels(fn, a, b, x)
            check(fn, a, b, x, rtol=1e-4, atol=1e-4)
        assert source.count("autotune_launch(") == 2, source
        assert len(triton_autotune._winners) == 2
        err = capsys.readouterr().err
        assert err.count("nothing is timed") == 1, err
    finally:
        triton_autotune.clear_cache()


def test_autotune_skips_candidates_that_do_not_fit_the_device() -> None:
    """A candidate whose launch runs out of a GPU resource (shared memory) is never the winner; if
    none fits, a clear error names the kernel and the way out."""
    from triton.runtime.errors import OutOfResources

    from minductor.runtime import triton_autotune

    a, b = torch.randn(2, 20, 36), torch.randn(2, 36, 24)
    fn = lambda a, b: torch.bmm(a, b).relu()
    calls: list[int] = []
    fits = [lambda i: i != 0, lambda i: False]  # the heuristic (first) candidate does not fit; then none does

    def timer(run: Any) -> float:
        calls.append(1)
        if not fits[0](len(calls) - 1):
            raise OutOfResources(131072, 101376, "shared memory")
        run()
        return float(len(calls))  # later candidates are slower: the first that fits wins

    triton_autotune.clear_cache()
    triton_autotune.set_timer(timer)
    try:
        with config.patch(triton_autotune=True):
            check(fn, a, b, rtol=1e-4, atol=1e-4)
            (key,) = triton_autotune._winners
            assert len(calls) > 2
            heuristic = {"XBLOCK": 32, "RBLOCK0": 32, "KBLOCK": 64, "num_warps": 4}
            assert triton_autotune._winners[key] != heuristic
            fits.pop(0)
            triton_autotune.clear_cache()
            calls.clear()
            with pytest.raises(RuntimeError, match="no block configuration of Triton kernel triton_tem_fused_bmm"):
                torch.compile(fn, backend="minductor")(a, b)
    finally:
        triton_autotune.set_timer(None)
        triton_autotune.clear_cache()
