"""Fusion: pointwise chains, reductions with their prologue, softmax and layer_norm each compile to
exactly one kernel (C++, or Triton in its interpreter) (metrics read after the first call)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import check

from minductor import config, metrics

# every test runs with the C++ and the Triton (interpreter) code generator
pytestmark = pytest.mark.usefixtures("cpu_backend")


def kernels_after_first_call(fn: Callable[..., Any], *args: Any, **tol: Any) -> int:
    """Compile and run once (checking against eager); one graph; return the kernel count of the chosen backend."""
    check(fn, *args, **tol)
    backend = config.cpu_backend
    assert metrics.graphs_compiled == 1, metrics.graphs_compiled
    assert metrics.generated_kernel_count == metrics.kernels_by_backend[backend], dict(metrics.kernels_by_backend)
    assert not metrics.fallback_ops, metrics.fallback_ops
    return metrics.kernels_by_backend[backend]


def test_six_op_pointwise_chain_is_one_kernel() -> None:
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    assert kernels_after_first_call(lambda x, y: ((x.sin() + 1) * 2).exp().relu() - y, x, y) == 1
    assert metrics.generated_kernel_count == 1


def test_pointwise_chain_with_broadcast_and_transposed_input_is_one_kernel() -> None:
    x, y = torch.randn(33, 64).t(), torch.randn(33)
    assert kernels_after_first_call(lambda x, y: ((x.sin() + 1) * 2).exp().relu() - y, x, y) == 1


def test_pointwise_then_sum_is_one_kernel() -> None:
    x = torch.randn(64, 33)
    assert kernels_after_first_call(lambda x: (x.sin() + 1).relu().sum(-1), x, rtol=1e-5, atol=1e-5) == 1


def test_softmax_is_one_kernel() -> None:
    x = torch.randn(64, 33)
    assert kernels_after_first_call(lambda x: torch.softmax(x, -1), x) == 1


def test_log_softmax_is_one_kernel() -> None:
    x = torch.randn(64, 33)
    assert kernels_after_first_call(lambda x: F.log_softmax(x, -1), x) == 1


def test_layer_norm_with_residual_is_one_kernel() -> None:
    x, r = torch.randn(64, 48), torch.randn(64, 48)
    w, b = torch.randn(48), torch.randn(48)
    fn = lambda x, r, w, b: F.layer_norm(x, (48,), w, b) + r
    assert kernels_after_first_call(fn, x, r, w, b, rtol=1e-4, atol=1e-5) == 1


def test_counts_reset_between_tests() -> None:
    """The autouse fixture zeroes metrics: nothing counted before this test compiles anything."""
    assert metrics.generated_kernel_count == 0 and metrics.graphs_compiled == 0
    assert not metrics.kernels_by_backend and not metrics.fallback_ops


def test_second_call_compiles_nothing() -> None:
    x = torch.randn(16, 8)
    fn = torch.compile(lambda x: (x.cos() * 3).tanh(), backend="minductor")
    fn(x)
    counts = (metrics.graphs_compiled, metrics.generated_kernel_count)
    torch.testing.assert_close(fn(x + 1), ((x + 1).cos() * 3).tanh())
    assert (metrics.graphs_compiled, metrics.generated_kernel_count) == counts


@pytest.mark.parametrize("n, kernels", [(8, 1), (256, 2)])
def test_big_loops_under_a_full_reduction_stay_apart(n: int, kernels: int) -> None:
    """A full reduction shares no outer loop: a big pointwise loop after it in its kernel (one
    that reads the reduction's result) would be a second pass run on one thread, so it gets a
    kernel of its own; small ones and a second reduction of the same nest still fuse."""
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
    # (a float32 sum of 65536 values in another order than eager's: ~1e-4 apart at times)
    assert kernels_after_first_call(lambda x: (x - x.mean()) * 2, x, rtol=1e-5, atol=1e-3) == kernels
    torch._dynamo.reset()
    metrics.reset()
    assert kernels_after_first_call(lambda x: (x.sum(), x.amax()), x, rtol=1e-5, atol=1e-3) == 1


@pytest.mark.parametrize("n", [8, 256])
def test_pointwise_siblings_of_a_full_reduction_share_its_pass(n: int, tmp_path) -> None:
    """A pointwise sibling over the elements a full reduction reduces (``x - y`` saved for the
    backward of ``((x - y) ** 2).sum()``) is stored inside the reduction's loop, each thread
    over its chunk: one kernel, one pass over the inputs."""
    x, y = torch.randn(n, n), torch.randn(n, n)
    # (Triton: a full reduction runs as few programs, its big siblings apart)
    expected = 2 if config.cpu_backend == "triton" and n == 256 else 1
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        assert kernels_after_first_call(lambda x, y: (((x - y) ** 2).sum(), x - y, x.relu() * 2), x, y,
                                        rtol=1e-5, atol=1e-3) == expected
    if n == 256 and config.cpu_backend == "cpp":
        kernel = next(tmp_path.glob("graph_*/cpp_fused_*.cpp")).read_text()
        assert kernel.count("#pragma omp parallel") == 1 and "mi_begin" in kernel, kernel


@pytest.mark.parametrize("n, kernels", [(32, 1), (512, 2)])
def test_a_big_transposing_copy_stays_apart_from_a_reduction(n: int, kernels: int) -> None:
    """A transposing copy big enough for 2-D tiles gets a kernel of its own rather than joining
    a column sum of the same input (where it would run untiled); small ones still fuse."""
    x = torch.randn(n, n)
    assert kernels_after_first_call(lambda x: (x.t().contiguous(), x.sum(0)), x, rtol=1e-5, atol=1e-4) == kernels
    torch._dynamo.reset()
    metrics.reset()
    assert kernels_after_first_call(lambda x: (x.t().contiguous(), x.t() * 2), x) == 1  # pointwise siblings: tiled together


def test_group_norm_of_an_nchw_input_is_one_kernel() -> None:
    """Not from a convolution (which runs channels-last), a group is a row of the input: its
    statistics and its normalization (weight and bias too) are one kernel that reads the row
    again from cache (torch's CPU formula stores a scale and shift per channel first: two)."""
    x, w, b = torch.randn(2, 16, 12, 12), torch.randn(16), torch.randn(16)
    assert kernels_after_first_call(lambda x: F.group_norm(x, 4), x, rtol=1e-5, atol=1e-5) == 1
    torch._dynamo.reset()
    metrics.reset()
    assert kernels_after_first_call(lambda x, w, b: F.group_norm(x, 4, w, b), x, w, b, rtol=1e-5, atol=1e-5) == 1
