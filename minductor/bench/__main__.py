"""``python -m minductor.bench [--no-inductor] [workload ...]``: per-kernel report."""
from __future__ import annotations

import argparse

import torch

from minductor.bench.runner import measure_bandwidth, run_workload
from minductor.bench.workloads import WORKLOADS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"workloads (default all): {', '.join(WORKLOADS)}")
    parser.add_argument("--no-inductor", action="store_true", help="skip TorchInductor (slow to compile)")
    parser.add_argument("--min-run-time", type=float, default=0.5)
    ns = parser.parse_args()
    bandwidth = measure_bandwidth()
    print(f"machine: {torch.get_num_threads()} threads, out= add streams at {bandwidth:.1f} GB/s")
    for name in ns.names or list(WORKLOADS):
        fn, make_args = WORKLOADS[name]
        with torch.no_grad():
            report = run_workload(name, fn, make_args(), with_inductor=not ns.no_inductor,
                                  bandwidth=bandwidth, min_run_time=ns.min_run_time)
        print("\n".join(report.lines()), flush=True)


if __name__ == "__main__":
    main()
