"""Memory planning reuses buffers; the scheduler never orders a node before its inputs.

The schedule property test builds random small graphs from a seeded generator (pointwise,
reductions, views, matmuls, mutations of a fresh clone) and checks results against eager;
the IR verifier inside compile_graph checks the order of every schedule it produces.
"""
from __future__ import annotations

import random

import pytest
import torch

from minductor import config, metrics


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def test_chain_of_same_size_intermediates_uses_two_buffers(tmp_path) -> None:
    def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            x = torch.mm(x, w).relu()  # mm outputs are buffers; relu fuses into the next read
        return x

    x, w = torch.randn(32, 32), torch.randn(32, 32) / 6
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(chain, backend="minductor")(x, w)
    torch.testing.assert_close(out, chain(x, w), rtol=1e-4, atol=1e-5)
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    assert "# reuse" in code
    assert metrics.buffers_reused >= 3
    intermediates = metrics.buffers_allocated - 1  # the returned buffer is the graph's output
    assert intermediates <= 2, code


@pytest.mark.parametrize("case", ["softmax", "layer_norm_residual", "adaptive_avg_pool2d", "softmax_1d"])
def test_reduction_results_used_only_in_their_kernel_stay_in_locals(case: str, tmp_path) -> None:
    """The row max/sum of a softmax, the mean/rstd of a layer norm, the window sums of an adaptive
    pool in one pass: one value per outer iteration, read back only by the same kernel -- kept in a local,
    never allocated (only the graph outputs are)."""
    w, b = torch.randn(96), torch.randn(96)
    fns = {
        "softmax": (lambda x: x.softmax(-1), torch.randn(64, 96)),
        "layer_norm_residual": (lambda x: torch.nn.functional.layer_norm(x * 2 + 1, (96,), w, b), torch.randn(64, 96)),
        "adaptive_avg_pool2d": (lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (8, 2)), torch.randn(2, 3, 23, 40)),
        "softmax_1d": (lambda x: x.log_softmax(0), torch.randn(300)),
    }
    fn, x = fns[case]
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        out = torch.compile(fn, backend="minductor")(x)
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    assert "kept in a local" in code, code
    assert metrics.buffers_allocated == 1, code


def random_program(rng: random.Random):
    """A random straight-line program over two (8, 12) inputs."""
    steps = []
    for _ in range(rng.randint(3, 9)):
        kind = rng.choice(["unary", "binary", "reduce", "view", "mm", "scatter", "cat"])
        steps.append((kind, rng.random(), rng.random()))

    def program(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [a, b]
        for kind, p, q in steps:
            x = values[int(p * len(values))]
            y = values[int(q * len(values))]
            if kind == "unary":
                x = [torch.sin, torch.exp, torch.tanh, torch.relu][int(q * 4)](x * 0.5)
            elif kind == "binary" and x.shape == y.shape:
                x = x * y + x
            elif kind == "reduce":
                x = x - (x.amax(-1, keepdim=True) if p < 0.5 else x.mean(0, keepdim=True))
            elif kind == "view" and x.dim() == 2:
                x = x.t().reshape(x.shape) + 1
            elif kind == "mm" and x.dim() == 2:
                x = torch.mm(x, x.t()) @ x / 10
            elif kind == "scatter" and x.dim() == 2:
                x = x.index_add(0, torch.tensor([0, 3, 3]), x[:3] * 2)
            elif kind == "cat" and x.shape == y.shape:
                x = torch.cat([x, y], 0)[: x.shape[0]] * 2
            values.append(x)
        return tuple(values[2:])

    return program


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_schedule_in_order_and_match_eager(seed: int) -> None:
    rng = random.Random(seed)
    program = random_program(rng)
    a, b = torch.randn(8, 12), torch.randn(8, 12)
    out = torch.compile(program, backend="minductor")(a, b)
    torch.testing.assert_close(out, program(a, b), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_large_buffers_reused_across_calls_only_when_dead() -> None:
    """A graph output's storage comes back on a later call only once nothing holds it."""
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x * 2).relu().sum(1, keepdim=True)  # a large intermediate (x * 2 read twice)
        return torch.softmax(x, -1), x.exp() + y

    x = torch.randn(256, 512)  # 512 KiB buffers: above config.pool_min_bytes
    compiled = torch.compile(f, backend="minductor")
    a, b = compiled(x)
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    a2, b2 = compiled(x)  # a and b are alive: fresh storages
    assert {a2.data_ptr(), b2.data_ptr()}.isdisjoint({a_ptr, b_ptr})
    kept = a.view(-1)[:10]  # a view keeps a's storage alive
    del a, b
    a3, b3 = compiled(x * 1)
    assert a3.data_ptr() != a_ptr and b3.data_ptr() == b_ptr
    ref = f(x)
    for got in ((a2, b2), (a3, b3)):
        torch.testing.assert_close(got, ref)
        assert not got[0]._is_view() and got[0].untyped_storage().nbytes() == got[0].numel() * 4
    torch.testing.assert_close(kept, ref[0].view(-1)[:10])
    a3.add_(1)  # an output is the caller's to modify in place
    torch.testing.assert_close(compiled(x)[0], ref[0])


def test_buffer_pool_can_be_turned_off(tmp_path) -> None:
    x = torch.randn(256, 512)
    for enabled in (True, False):
        torch._dynamo.reset()
        with config.patch(reuse_buffers_across_calls=enabled, debug=True, debug_dir=str(tmp_path / str(enabled))):
            out = torch.compile(lambda t: t.exp(), backend="minductor")(x)
        torch.testing.assert_close(out, x.exp())
        code = next((tmp_path / str(enabled)).glob("graph_*/output_code.py")).read_text()
        assert ("mi_pool.take(" in code) == enabled, code


def _gelu_mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    from minductor.bench.workloads import GeluMLP

    torch.manual_seed(0)
    return GeluMLP(128).eval(), torch.randn(512, 128)


@pytest.mark.parametrize("case", ["gelu_mlp", "transformer_block", "pointwise_chain"])
def test_peak_memory_of_a_steady_state_call_at_most_eager(case: str) -> None:
    """Reuse inside a call (holding a freed buffer) and the pool across calls (holding storages
    between calls) never raise the peak above eager's: the profiler's allocation events plus the
    bytes the graph's pool holds, against eager's allocation events."""
    from minductor.bench.memory import minductor_peak_bytes, peak_bytes
    from minductor.bench.workloads import Block

    if case == "gelu_mlp":
        fn, args = _gelu_mlp()
        args = (args,)
    elif case == "transformer_block":
        torch.manual_seed(0)
        fn, args = Block(dim=64, heads=4).eval(), (torch.randn(4, 64, 64),)
    else:
        def fn(x: torch.Tensor) -> torch.Tensor:
            a = x.exp().sum(1, keepdim=True)    # a large intermediate dies early...
            b = torch.mm(x, x.t()).relu()       # ...a larger one of another size comes later
            return b / a + 1
        args = (torch.randn(512, 256),)
    with torch.no_grad():
        eager = peak_bytes(fn, *args)
        compiled = minductor_peak_bytes(fn, args, pool=True)
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(*args), fn(*args), rtol=1e-4, atol=1e-4)
    assert compiled <= eager, (compiled, eager)


def test_training_graphs_hold_no_storages_across_calls(tmp_path) -> None:
    """A forward's pool would hold memory through the backward (and vice versa): training graphs
    allocate plainly; inference graphs of the same model use the pool. (MKL's mm.out writes into a
    planned buffer; oneDNN's matmul allocates its own result, see test_gemm.py.)"""
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU()), torch.randn(512, 256)
    with config.patch(debug=True, debug_dir=str(tmp_path), cpu_gemm="mkl"):
        compiled = torch.compile(model, backend="minductor")
        compiled(x).sum().backward()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    codes = {p.parent.name.split("_")[-1]: p.read_text() for p in tmp_path.glob("graph_*/output_code.py")}
    assert {"forward", "backward", "inference"} <= set(codes), sorted(codes)
    assert "mi_pool.take(" not in codes["forward"] and "mi_pool.take(" not in codes["backward"]
    assert "mi_pool.take(" in codes["inference"]


def _backward_code(tmp_path) -> str:
    return next(tmp_path.glob("graph_*_backward/output_code.py")).read_text()


def test_backward_writes_over_the_saved_tensors_aotautograd_donates(tmp_path) -> None:
    """A saved activation nothing else holds (AOTAutograd's donated buffers) dies in the
    backward: its storage takes the gradient in place instead of a fresh allocation."""
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(a, b, reduction="none").square().sum()

    a, b = torch.randn(64, 128, requires_grad=True), torch.randn(64, 128)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        grad, = torch.autograd.grad(torch.compile(fn, backend="minductor")(a, b), a)
    torch.testing.assert_close(grad, torch.autograd.grad(fn(a, b), a)[0])
    code = _backward_code(tmp_path)
    assert "buf0 = sub; del sub  # reuse in place" in code, code
    assert "empty" not in code.split("def call")[1], code


def test_saved_views_of_one_storage_are_not_written_over(tmp_path) -> None:
    """Two saved tensors on one storage (chunks of one activation): writing over one would
    change the other, so neither is donated to the backward's buffers."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        a, b = torch.ops.aten.split.Tensor(x.exp(), 64, 1)
        return (a.sin() * b.cos() + a * b).sum()

    x = torch.randn(32, 128, requires_grad=True)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        grad, = torch.autograd.grad(torch.compile(fn, backend="minductor")(x), x)
    torch.testing.assert_close(grad, torch.autograd.grad(fn(x), x)[0], rtol=1e-5, atol=1e-5)


def test_retain_graph_backward_compiles_without_donations(tmp_path) -> None:
    """``retain_graph=True`` reads the saved tensors twice: AOTAutograd compiles such a
    backward without donated buffers, and both gradients match eager."""
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ((a - b) ** 2 * a).sum()

    a, b = torch.randn(64, 128, requires_grad=True), torch.randn(64, 128)
    expected = torch.autograd.grad(fn(a, b), a)[0]
    with config.patch(cache_dir=str(tmp_path)):
        loss = torch.compile(fn, backend="minductor")(a, b)
        first = torch.autograd.grad(loss, a, retain_graph=True)[0]
        second = torch.autograd.grad(loss, a)[0]
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(second, expected)
