"""Triton kernels, run for real in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set in conftest)."""
from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import pytest
import torch

from minductor import config, metrics
from minductor.codegen.triton_heuristics import PERSISTENT_RNUMEL
from tests.conftest import check


@pytest.fixture(autouse=True)
def _triton_backend() -> Any:
    with config.patch(cpu_backend="triton"):
        yield


def sources(fn: Callable[..., Any], *args: Any) -> list[str]:
    """Compile ``fn`` and return the generated Triton kernel sources (from the wrapper module)."""
    from minductor.runtime import loader

    captured: list[str] = []
    original = loader.load_wrapper

    def spy(module: Any, dump: Any) -> Any:
        captured.extend(k.source for k in module.kernels if k.backend == "triton")
        return original(module, dump)

    loader.load_wrapper = spy
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend="minductor")(*args)
    finally:
        loader.load_wrapper = original
    return captured


def kernel_names(fn: Callable[..., Any], *args: Any) -> list[str]:
    return [src.split("def ", 1)[1].split("(", 1)[0] for src in sources(fn, *args)]


def test_pointwise_runs_in_the_interpreter() -> None:
    check(lambda x, y: (x * 2 + y).relu(), torch.randn(100), torch.randn(100))
    assert metrics.kernels_by_backend["triton"] == 1
    assert metrics.kernels_by_backend["cpp"] == 0


def test_kernel_source_is_gpu_valid_python() -> None:
    srcs = sources(lambda x: (x.sin() + 1).sum(-1), torch.randn(8, 50))
    assert srcs
    for src in srcs:
        tree = ast.parse(src)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "np" not in names and "numpy" not in src and "torch" not in names, src
        assert "@triton.jit" in src


@pytest.mark.parametrize("n", [1, 7, 1024, 5000])
def test_reductions_persistent_and_looped(n: int) -> None:
    x = torch.randn(6, n)
    fns = lambda x: (x.sum(1), x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.var(1, correction=0),
                     x.mean(1), x.softmax(-1), (x > 0).any(1), (x * 0.01 + 1).prod(1))
    check(fns, x, rtol=1e-4, atol=1e-4)
    names = kernel_names(fns, x)
    kind = "per" if n <= PERSISTENT_RNUMEL else "red"
    assert names and n == 1 or any(name.startswith(f"triton_{kind}_fused_") for name in names), names


def test_argmax_with_nan() -> None:
    x = torch.randn(5, 3000)
    x[1, 17] = float("nan")
    x[1, 2500] = float("nan")
    x[3, 2999] = float("nan")
    x[4] = float("-inf")
    y = x[:, :9].clone()
    check(lambda x: (x.argmax(1), x.argmin(1), x.amax(1), x.amin(1)), x)
    check(lambda x: (x.argmax(1), x.argmin(1), x.amax(1), x.amin(1)), y)


def test_pointwise_kernel_name() -> None:
    names = kernel_names(lambda x: x.cos() * 3, torch.randn(16))
    assert len(names) == 1 and names[0].startswith("triton_poi_fused_"), names


def test_masked_padding_and_views() -> None:
    x = torch.randn(3, 5, 7)
    check(lambda x: torch.nn.functional.pad(x, (2, 3, 1, 0)) * 2, x)
    check(lambda x: torch.nn.functional.pad(x, (1, 1), value=-3.5).sum(-1), x)
    check(lambda x, b: x[:, ::2, 1:] + b, x, torch.randn(3, 1, 6))


def test_tiled_transpose_add() -> None:
    x = torch.randn(70, 130)
    y = torch.randn(130, 70)
    check(lambda x, y: x + y.t(), x, y)
    check(lambda x, y: (x.t() * 2 + y).contiguous(), x, y)
    (src,) = sources(lambda x, y: x + y.t(), x, y)
    # one program covers a 2-D tile: rows on the x axis, columns on the second block axis
    assert "triton_poi_fused_" in src and "tl.arange(0, RBLOCK0)[None, :]" in src, src


def test_gather_and_scatter_add() -> None:
    x = torch.randn(6, 9)
    idx = torch.randint(0, 9, (6, 4))
    check(lambda x, i: torch.gather(x, 1, i) * 2, x, idx)
    check(lambda x, i: x[i[:, 0]] + 1, x, torch.randint(-6, 6, (6, 4)))
    src = torch.randn(6, 4)
    check(lambda x, i, s: x.scatter_add(1, i, s), x, idx, src)
    check(lambda x, i, s: torch.zeros(10).index_add(0, i, s), x, torch.randint(0, 10, (50,)), torch.randn(50))
    check(lambda e, i: torch.nn.functional.embedding(i, e), torch.randn(10, 3), torch.randint(0, 10, (4, 5)))


def test_out_of_range_index_raises() -> None:
    fn = torch.compile(lambda x, i: torch.gather(x, 1, i), backend="minductor")
    with pytest.raises(IndexError, match="index out of range"):
        fn(torch.randn(3, 4), torch.tensor([[0], [4], [1]]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype: torch.dtype) -> None:
    x = torch.randn(8, 33, dtype=dtype)
    y = torch.randn(8, 33, dtype=dtype)
    check(lambda x, y: ((x * y).sigmoid() + x).to(dtype), x, y)
    check(lambda x: (x.sum(-1), x.softmax(-1), x.float().mean(-1), x.amax(-1)), x, rtol=2e-2, atol=2e-2)


def test_symbolic_sizes() -> None:
    fn = lambda x, y: ((x * y).sum(-1) + 1, (x + 1).relu())
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for n, m in [(3, 5), (4, 9), (7, 1100)]:
        x, y = torch.randn(n, m), torch.randn(n, m)
        for got, ref in zip(compiled(x, y), fn(x, y)):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert metrics.kernels_by_backend["triton"] >= 1
    assert metrics.graphs_compiled <= 2  # one static, then one symbolic graph for every later size


def test_integer_semantics() -> None:
    a = torch.randint(-20, 20, (40,))
    b = torch.randint(1, 7, (40,)) * torch.where(torch.rand(40) > 0.5, 1, -1)
    check(lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")), a, b)
    x, y = torch.randn(40) * 5, torch.randn(40) + 3
    check(lambda x, y: (x // y, x % y, torch.fmod(x, y), x.trunc(), x.round(), torch.maximum(x, y)), x, y)


def test_float_to_narrow_int_wraps_as_eager() -> None:
    """Through int32: a float to uint8 conversion of a negative value is undefined (eager wraps:
    -3.7 -> 253)."""
    x = torch.tensor([-3.7, -100.0, 50.2, -0.5, 200.0, 300.0, -300.0, 127.5, -128.5, 255.9])
    check(lambda t: (t.to(torch.uint8).float(), t.to(torch.int8).float(), t.to(torch.int16), t.to(torch.uint8)), x)


def test_debug_dump_writes_kernel_files(tmp_path: Any) -> None:
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        check(lambda x: x.exp().sum(-1), torch.randn(4, 10))
    dumped = list(tmp_path.rglob("triton_*_fused_*.py"))
    assert dumped, list(tmp_path.rglob("*"))
    assert "@triton.jit" in dumped[0].read_text()


@pytest.mark.parametrize("epilogue", ["none", "bias_relu_residual", "scale_sigmoid", "cast"])
def test_matmul_template_with_epilogue(epilogue: str) -> None:
    a, b = torch.randn(37, 50), torch.randn(50, 70)
    bias, res = torch.randn(70), torch.randn(37, 70)
    fns = {
        "none": lambda a, b, bias, res: a @ b,
        "bias_relu_residual": lambda a, b, bias, res: torch.relu(torch.addmm(bias, a, b)) + res,
        "scale_sigmoid": lambda a, b, bias, res: (torch.mm(a, b.t().contiguous().t()) * 2).sigmoid() - res,
        "cast": lambda a, b, bias, res: (a @ b).to(torch.float16),
    }
    # the fp16 cast may round a last-bit difference of the fp32 sum to the neighbouring fp16 value
    tol = 2e-3 if epilogue == "cast" else 1e-4
    check(fns[epilogue], a, b, bias, res, rtol=tol, atol=tol)
    srcs = [s for s in sources(fns[epilogue], a, b, bias, res) if "tl.dot(" in s]
    assert len(srcs) == 1 and "def triton_tem_fused_" in srcs[0]
    if epilogue != "none":  # the epilogue reads the accumulator: one store, of the final value
        assert srcs[0].count("tl.store(") == 1, srcs[0]
    assert not metrics.fallback_ops


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_template_half(dtype: torch.dtype) -> None:
    a, b = torch.randn(20, 40, dtype=dtype), torch.randn(40, 24, dtype=dtype)
    check(lambda a, b: (a @ b).float().tanh(), a, b, rtol=2e-2, atol=2e-2)
    templates = [s for s in sources(lambda a, b: (a @ b).float().tanh(), a, b) if "tl.dot(" in s]
    # bf16 tiles are widened to fp32 for tl.dot (exact; see codegen/triton_template.py)
    assert len(templates) == 1


def test_matmul_result_read_twice_is_stored() -> None:
    a, b = torch.randn(16, 24), torch.randn(24, 16)
    check(lambda a, b: ((a @ b).relu(), (a @ b).sum(0), a.t() @ a), a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["plain", "bias_relu", "residual_transposed"])
def test_bmm_template(case: str) -> None:
    """bmm through the template (one batch per program on grid axis 2), odd sizes, strided operands."""
    x, y = torch.randn(3, 33, 45), torch.randn(3, 45, 17)
    bias, res = torch.randn(17), torch.randn(3, 33, 17)
    fns = {
        "plain": lambda x, y, bias, res: torch.bmm(x, y),
        "bias_relu": lambda x, y, bias, res: torch.relu(torch.bmm(x, y) + bias),
        "residual_transposed": lambda x, y, bias, res: torch.bmm(y.transpose(1, 2), x.transpose(1, 2)).transpose(1, 2)
        + res,
    }
    check(fns[case], x, y, bias, res, rtol=1e-4, atol=1e-4)
    srcs = [s for s in sources(fns[case], x, y, bias, res) if "tl.dot(" in s]
    assert len(srcs) == 1 and "tl.program_id(2)" in srcs[0], srcs
    if case != "plain":  # the epilogue reads the accumulator: one store, of the final value
        assert srcs[0].count("tl.store(") == 1, srcs[0]
    assert not metrics.fallback_ops


def test_bench_runner_reports_that_triton_timing_needs_a_gpu() -> None:
    from minductor.bench.runner import NEEDS_GPU, run_workload

    report = run_workload("softmax", lambda x: torch.softmax(x, -1), [torch.randn(16, 40)], with_inductor=False,
                          bandwidth=1.0, min_run_time=0.01)
    assert report.correct
    assert report.kernels and all(k.note == NEEDS_GPU for k in report.kernels), report.kernels
    assert any(NEEDS_GPU in line for line in report.lines())


def test_generated_kernels_compile_for_a_gpu(tmp_path: Any) -> None:
    """Every kind of kernel goes through Triton's real CUDA pipeline to a cubin for sm_80 (no GPU
    needed), in a process without the interpreter: the source is valid GPU Triton."""
    import json
    import os
    import subprocess
    import sys

    from minductor.runtime import loader

    kernels: list[Any] = []
    original = loader.load_wrapper

    def spy(module: Any, dump: Any) -> Any:
        kernels.extend(k for k in module.kernels if k.backend == "triton")
        return original(module, dump)

    x, idx = torch.randn(6, 40), torch.randint(0, 40, (6, 5))
    cases = [
        (lambda x: (x.sin() * 2).relu(), x),
        (lambda x: (x.softmax(-1), x.argmax(-1), x.var(-1), x.amax(-1), (x > 0).any(-1)), x),
        (lambda x: (x.sum(-1), x.argmin(-1), x.var(-1)), torch.randn(4, 3000)),
        (lambda x, y: x + y.t(), torch.randn(70, 130), torch.randn(130, 70)),
        (lambda x, i: torch.gather(x, 1, i), x, idx),
        (lambda x, i, s: x.scatter_add(1, i, s), x, idx, torch.randn(6, 5)),
        (lambda x: (x.to(torch.bfloat16) * 2, x.half().sum(-1)), x),
        (lambda x: torch.nn.functional.pad(x, (1, 2)) // 3, x),
        (lambda a, b, bias: torch.relu(torch.addmm(bias, a, b)), torch.randn(37, 50), torch.randn(50, 70), torch.randn(70)),
        (lambda a, b: torch.bmm(a, b.transpose(1, 2)) * 2, torch.randn(3, 33, 45), torch.randn(3, 17, 45)),
        (lambda a, b, r: torch.bmm(a, b) + r, *(torch.randn(2, 20, 20, dtype=torch.bfloat16) for _ in range(3))),
        (lambda a, b: torch.bmm(a, b).float(), torch.randn(2, 20, 24, dtype=torch.float16), torch.randn(2, 24, 9).half()),
    ]
    loader.load_wrapper = spy
    try:
        for fn, *args in cases:
            torch._dynamo.reset()
            torch.compile(fn, backend="minductor")(*args)
        torch._dynamo.reset()
        torch.compile(lambda x: (x * x).sum(-1), backend="minductor", dynamic=True)(torch.randn(5, 7))
        torch.compile(lambda x: (x * x).sum(-1), backend="minductor", dynamic=True)(torch.randn(6, 9))
    finally:
        loader.load_wrapper = original
    specs = [{"name": k.name, "source": k.source, "signature": k.triton_signature[0], "constexprs": k.triton_signature[1]}
             for k in kernels]
    assert any("tl.dot(" in s["source"] for s in specs) and any("tl.atomic_add(" in s["source"] for s in specs)
    bmm = [s for s in specs if "tl.program_id(2)" in s["source"]]
    dtypes = {t for s in bmm for t in s["signature"].values()}
    assert len(bmm) == 3 and {"*fp32", "*bf16", "*fp16"} <= dtypes, "fp32, bf16 and fp16 bmm templates"
    assert any("i64" in s["signature"].values() for s in specs), "a symbolic size is a kernel argument"
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-m", "minductor.runtime.triton_aot", str(path)], capture_output=True,  # noqa: PLW1510
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("-> cubin") == len(specs), proc.stdout
    # fp16/bf16 templates multiply on tensor cores (fp32 ones stay exact: no tf32)
    for kind in ("f32.f16.f16.f32", "f32.bf16.bf16.f32"):
        assert f"mma.sync.aligned.m16n8k16.row.col.{kind}" in proc.stdout, proc.stdout
    assert "tf32" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("case", ["looped_reduction", "bmm_template"])
def test_autotune_tries_every_candidate_and_caches_the_winner(case: str) -> None:
    """config.triton_autotune with an injected timer (GPU timing is not possible here): each
    candidate configuration in turn is made the fastest; the launch that follows uses it and must
    match eager, and a second call reuses the cached winner without timing again."""
    from minductor import config
    from minductor.runtime import triton_autotune

    x, a, b = torch.randn(5, 1500), torch.randn(2, 20, 36), torch.randn(2, 36, 24)
    fn, args = {
        "looped_reduction": (lambda x: (x.sin().sum(-1), x.amax(-1)), (x,)),
        "bmm_template": (lambda a, b: torch.bmm(a, b).relu(), (a, b)),
    }[case]
    seen: list[int] = []
    prefer = [0]

    def timer(run: Any) -> float:
        run()
        seen.append(1)
        return 0.0 if len(seen) - 1 == prefer[0] else 1.0

    try:
        config.triton_autotune = True
        triton_autotune.set_timer(timer)
        compiled = torch.compile(fn, backend="minductor")
        expected = fn(*args)
        torch.testing.assert_close(compiled(*args), expected, rtol=1e-4, atol=1e-4)
        (key,) = triton_autotune._winners
        n = len(seen)
        assert n > 2, "several candidates were timed"
        winners = set()
        for k in range(n):
            triton_autotune.clear_cache()
            seen.clear()
            prefer[0] = k
            torch.testing.assert_close(compiled(*args), expected, rtol=1e-4, atol=1e-4)
            assert len(seen) == n
            winners.add(tuple(sorted(triton_autotune._winners[key].items())))
        assert len(winners) == n, "every candidate was launched as the winner once"
        seen.clear()
        torch.testing.assert_close(compiled(*args), expected, rtol=1e-4, atol=1e-4)
        assert not seen, "the cached winner is reused"
    finally:
        config.triton_autotune = False
        triton_autotune.set_timer(None)
        triton_autotune.clear_cache()


def test_autotune_skips_kernels_that_update_in_place() -> None:
    """Atomic scatter-adds change their output on every launch: never benchmarked."""
    from minductor import config
    from minductor.runtime import loader

    x, idx, src = torch.randn(6, 40), torch.randint(0, 40, (6, 5)), torch.randn(6, 5)
    kernels: list[Any] = []
    original = loader.load_wrapper

    def spy(module: Any, dump: Any) -> Any:
        kernels.extend(k for k in module.kernels if k.backend == "triton")
        return original(module, dump)

    fn = lambda x, i, s: (x.scatter_add(1, i, s), x.cos())
    try:
        config.triton_autotune = True
        loader.load_wrapper = spy
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, idx, src), fn(x, idx, src))
    finally:
        config.triton_autotune = False
        loader.load_wrapper = original
    atomic = [k for k in kernels if "tl.atomic_add(" in k.source]
    assert atomic and all("autotune_launch(" not in k.call for k in atomic)
    assert any("autotune_launch(" in k.call for k in kernels if k not in atomic), "the other kernels are tuned"


def test_kernels_repeated_by_layers_are_defined_once(tmp_path: Any) -> None:
    """A Triton kernel whose code equals an earlier one's apart from names and comments is
    not defined (nor JIT-compiled) again: the wrapper calls it through the earlier one."""
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()) for _ in range(3)]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(32, 64)
    with torch.no_grad(), config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(model, backend="minductor")(x)
        torch.testing.assert_close(out, model(x))
    (code,) = [p.read_text() for p in tmp_path.glob("graph_*/output_code.py")]
    defined, twins = code.count("@triton.jit"), code.count("  # the same code")
    assert twins >= 2 and defined + twins == metrics.generated_kernel_count, code
