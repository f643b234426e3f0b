"""The kernel microbenchmark runner times each generated kernel of a real workload."""
from __future__ import annotations

import torch

from minductor.bench.runner import run_workload


def test_runner_times_every_kernel_side_by_side() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1) + y.t().sum(0)

    x, y = torch.randn(64, 96), torch.randn(96, 64)
    report = run_workload("tiny", fn, (x, y), with_inductor=False, bandwidth=10.0, min_run_time=0.01)
    assert report.eager > 0 and report.minductor > 0 and report.inductor is None
    assert report.kernels and all(k.seconds > 0 and k.bytes_moved > 0 for k in report.kernels)
    assert all(k.name.startswith("cpp_fused_") for k in report.kernels)
    text = "\n".join(report.lines())
    assert "GB/s" in text and "% of bandwidth" in text
