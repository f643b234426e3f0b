"""``python -m minductor.bench``: side-by-side timing of eager, minductor and TorchInductor.

    python -m minductor.bench --suite reductions [--no-inductor] [--json out.json] [--write-results]
    python -m minductor.bench --dump ./minductor_debug      # time each kernel of a debug dump
    python -m minductor.bench --suite all --device cuda     # on a GPU: Triton kernels, timed with do_bench
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from minductor.bench.runner import (
    WorkloadReport,
    bandwidth_probes,
    median_time,
    run_workload,
    streaming_bandwidth,
    streaming_reference,
    time_kernels,
)
from minductor.bench.workloads import SUITES, make_workloads
from minductor.runtime.cache import cpu_info


def cpu_name() -> str:
    """The CPU's model name (ratios differ between CPUs of one architecture: record which)."""
    info = cpu_info()
    if not info:
        return platform.processor() or platform.machine()
    # a VM may show only the brand: the family and model tell the microarchitecture
    return f"{info.get('model name', '?')}, family {info.get('cpu family', '?')} model {info.get('model', '?')}"


def _to(value: Any, device: str) -> Any:
    return torch.utils._pytree.tree_map(lambda v: v.to(device) if isinstance(v, (torch.Tensor, torch.nn.Module)) else v, value)


def run_suite(names: list[str], size: int, with_inductor: bool, min_run_time: float,
              device: str = "cpu") -> tuple[float, list[WorkloadReport]]:
    probes = bandwidth_probes(max(size * size, 1 << 20), device=device)  # arrays the size of a suite tensor
    bandwidth = streaming_bandwidth(probes)
    print(f"machine: {platform.machine()} ({cpu_name()}), {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"streaming bandwidth {bandwidth:.1f} GB/s (STREAM loops over {max(size * size, 1 << 20) * 4 >> 20} MB arrays: "
          + ", ".join(f"{name} {gbps:.1f}" for name, gbps in probes.items()) + ")", flush=True)
    workloads = make_workloads(size)
    reference = streaming_reference(max(size * size, 1 << 20)) if device == "cpu" else None
    reports = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        fn, make_args = workloads[name]
        with torch.no_grad():
            report = run_workload(name, _to(fn, device), _to(make_args(), device), with_inductor=with_inductor, bandwidth=bandwidth,
                                  min_run_time=min_run_time, reference=reference)
        print("\n".join(report.lines()), flush=True)
        reports.append(report)
    return bandwidth, reports


def table(reports: list[WorkloadReport]) -> str:
    rows = ["| workload | eager ms | minductor ms | inductor ms | vs eager | vs inductor | compile s (minductor / inductor) | aten fallbacks |",
            "|---|---|---|---|---|---|---|---|"]
    for r in reports:
        j = r.to_json()
        ind = "-" if j["inductor_ms"] is None else f"{j['inductor_ms']:.3f}"
        vs_ind = "-" if j["speedup_vs_inductor"] is None else f"{j['speedup_vs_inductor']:.2f}x"
        ind_c = "-" if j["inductor_compile_s"] is None else f"{j['inductor_compile_s']:.1f}"
        rows.append(f"| {r.name} | {j['eager_ms']:.3f} | {j['minductor_ms']:.3f} | {ind} | "
                    f"{j['speedup_vs_eager']:.2f}x | {vs_ind} | {j['minductor_compile_s']:.1f} / {ind_c} | "
                    f"{', '.join(r.fallback_ops) or 'none'} |")
    return "\n".join(rows)


def kernel_table(reports: list[WorkloadReport], bandwidth: float) -> str:
    rows = ["| workload | kernel | us | MB read + written | GB/s | STREAM GB/s alongside | % of streaming bandwidth |",
            "|---|---|---|---|---|---|---|"]
    for r in reports:
        for k in r.kernels:
            if not k.note:
                rows.append(f"| {r.name} | {k.name} | {k.seconds * 1e6:.1f} | {k.bytes_moved / 1e6:.1f} | "
                            f"{k.gbps:.1f} | {k.reference_gbps or bandwidth:.1f} | {k.pct_of(bandwidth):.0f}% |")
    return "\n".join(rows)


def bench_dump(directory: Path, min_run_time: float) -> None:
    """Time each kernel of every graph in a MINDUCTOR_DEBUG dump, and each whole graph."""
    bandwidth = streaming_bandwidth(bandwidth_probes())
    for code in sorted(directory.glob("graph_*/output_code.py")):
        namespace: dict[str, Any] = {"__name__": "minductor_dump", "__file__": str(code)}  # (its constants beside it)
        source = code.read_text()
        exec(compile(source, str(code), "exec"), namespace)  # noqa: S102 - a generated wrapper
        args, note = _valid_inputs(namespace["make_inputs"](), namespace["call"])
        module = type("Module", (), {"source": source, "constants": namespace.get("constants", {})})
        print(f"{code.parent.name}: whole graph {median_time(lambda: namespace['call'](list(args)), min_run_time) * 1e3:.3f} ms{note}")  # noqa: B023
        for k in time_kernels(module, args, min_run_time / 5, streaming_reference()):
            print(f"    {k.name}: {k.seconds * 1e6:9.1f} us  {k.gbps:6.1f} GB/s  {k.pct_of(bandwidth):5.1f}% of bandwidth{k.reference_note}")


def _valid_inputs(args: list[Any], call: Any) -> tuple[list[Any], str]:
    """The dump's random inputs, or, where random integers index out of range (an attention
    bias table's indices, a graph's index buffers), the same with every integer input zero."""
    try:
        call(list(args))
        return args, ""
    except IndexError:
        zeroed = [a.zero_() if isinstance(a, torch.Tensor) and not a.is_floating_point() else a for a in args]
        return zeroed, " (integer inputs zero: random ones indexed out of range)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), help="a suite of benchmarks/ workloads")
    parser.add_argument("names", nargs="*", help="individual workloads instead of a suite")
    parser.add_argument("--no-inductor", action="store_true", help="skip TorchInductor (slow to compile)")
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS.md")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the workloads on a GPU, compiled to Triton")
    parser.add_argument("--dump", type=Path, help="time the kernels of a MINDUCTOR_DEBUG dump directory")
    ns = parser.parse_args()
    if ns.dump:
        bench_dump(ns.dump, ns.min_run_time)
        return
    size, names = SUITES[ns.suite or "all"]
    names = ns.names or names
    bandwidth, reports = run_suite(names, size, not ns.no_inductor, ns.min_run_time, ns.device)
    print(table(reports))
    if ns.json:
        ns.json.write_text(json.dumps({"bandwidth_gbps": bandwidth, "torch": torch.__version__,
                                       "workloads": [r.to_json() for r in reports]}, indent=2))
    if ns.write_results:
        path = Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md"
        header = (f"# Results\n\n{datetime.date.today()}, {platform.machine()} ({cpu_name()}) with {torch.get_num_threads()} threads, "
                  f"torch {torch.__version__}, streaming bandwidth {bandwidth:.1f} GB/s, suite `{ns.suite or 'all'}`.\n\n")
        kernels = ("\n\n## Kernels\n\nEach kernel timed alone on the workload's inputs; bytes as STREAM counts them "
                   "(each buffer read or written once). % of streaming bandwidth: over the best of the runner's STREAM "
                   "copy/add/triad loops and copy/add with streaming stores (as kernels write large outputs), compiled like "
                   "the kernels, over arrays the size of a suite tensor, timed in "
                   "rounds alternating with the kernel (the column before it; the header's figure was measured once, at "
                   "the start). Kernels that only read (reductions) can exceed 100%.\n\n")
        path.write_text(header + table(reports) + kernels + kernel_table(reports, bandwidth) + "\n")


if __name__ == "__main__":
    main()
