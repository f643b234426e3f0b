"""Kernel microbenchmark runner: ``python -m minductor.bench``.

Times every kernel minductor generated for a workload in isolation (and the whole graph)
against eager and TorchInductor, with bytes moved, GB/s and % of the machine's measured
memory bandwidth.
"""
from minductor.bench.runner import KernelTiming, WorkloadReport, measure_bandwidth, run_workload

__all__ = ["KernelTiming", "WorkloadReport", "measure_bandwidth", "run_workload"]
