"""The kernel microbenchmark runner times each generated kernel of a real workload."""
from __future__ import annotations

import pytest
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


def test_cli_tiny_suite_json_has_every_field(tmp_path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "tiny.json"
    proc = subprocess.run([sys.executable, "-m", "minductor.bench", "--suite", "tiny", "--no-inductor",  # noqa: PLW1510
                           "--min-run-time", "0.01", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["bandwidth_gbps"] > 0 and len(data["workloads"]) == 7
    fields = {"name", "eager_ms", "minductor_ms", "inductor_ms", "speedup_vs_eager", "speedup_vs_inductor",
              "minductor_compile_s", "inductor_compile_s", "minductor_spread_ms", "correct", "bandwidth_gbps", "kernels",
              "fallback_ops"}
    for w in data["workloads"]:
        assert fields <= set(w) and w["correct"] and w["kernels"] and w["fallback_ops"] == [], w
        assert {"name", "us", "bytes", "bytes_written", "gbps", "pct_bandwidth"} <= set(w["kernels"][0])
    assert "| workload |" in proc.stdout


def test_dumped_wrapper_runs_standalone(tmp_path) -> None:
    import subprocess
    import sys

    from minductor import config

    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.compile(lambda x: torch.softmax(x, -1) * 2, backend="minductor")(torch.randn(16, 24))
    code = next(tmp_path.glob("graph_*/output_code.py"))
    proc = subprocess.run([sys.executable, str(code)], capture_output=True, text=True, timeout=300)  # noqa: PLW1510
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ms per call" in proc.stdout


class _Relative(torch.nn.Module):
    """A bias gathered through an index tensor created in ``forward`` (Dynamo lifts it into the
    graph as a tensor constant, as Swin's relative position index)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(7, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]])
        return (x + self.table[index].permute(2, 0, 1)).softmax(-1)


def test_a_dump_holding_tensor_constants_runs_standalone_and_under_the_runner(tmp_path) -> None:
    """The tensors a graph holds are saved beside output_code.py (constants.pt): the module runs
    on its own and under ``--dump`` (both failed on None constants)."""
    import subprocess
    import sys

    from minductor import config

    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        module = _Relative()
        x = torch.randn(2, 3, 4, 4)
        torch.testing.assert_close(torch.compile(module, backend="minductor")(x), module(x))
    code = next(tmp_path.glob("graph_*/output_code.py"))
    assert (code.parent / "constants.pt").exists() and "_tensor_constant0" in code.read_text()
    proc = subprocess.run([sys.executable, str(code)], capture_output=True, text=True, timeout=300)  # noqa: PLW1510
    assert proc.returncode == 0 and "ms per call" in proc.stdout, proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "minductor.bench", "--dump", str(tmp_path), "--min-run-time", "0.05"],  # noqa: PLW1510
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "whole graph" in proc.stdout, proc.stderr[-3000:]


def test_the_runner_times_a_dump_whose_random_indices_fall_out_of_range(tmp_path) -> None:
    """An index input that random integers overflow (16 indices into a 2-row table: all of them in
    range once in 4^16 draws) runs with integer inputs zero, and the runner says so, instead of
    stopping at an IndexError."""
    import subprocess
    import sys

    from minductor import config

    table, index = torch.randn(2, 64), torch.randint(0, 2, (16,))
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(lambda t, i: t[i] * 2, backend="minductor")(table, index)
    torch.testing.assert_close(got, table[index] * 2)
    proc = subprocess.run([sys.executable, "-m", "minductor.bench", "--dump", str(tmp_path), "--min-run-time", "0.05"],  # noqa: PLW1510
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "integer inputs zero" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_kernel_bytes_follow_the_signature() -> None:
    """y = f(x) moves 2 x size (one read, one write); a kernel storing over the input it read
    (in_out_ptr) moves 2 x size too, all of it read and written; % of bandwidth is GB/s over it."""
    w = torch.randn(256, 256)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    def in_place(x: torch.Tensor) -> torch.Tensor:
        return (x @ w).sin() * 2  # the kernel stores over the dying matmul result

    size = 256 * 256 * 4
    for fn in (plain, in_place):
        report = run_workload("bytes", fn, (torch.randn(256, 256),), with_inductor=False, bandwidth=10.0,
                              min_run_time=0.01)
        (kernel,) = report.kernels
        assert kernel.bytes_moved == 2 * size and kernel.bytes_written == size, (fn.__name__, kernel)
        assert abs(kernel.pct_of(10.0) - 100 * kernel.gbps / 10.0) < 1e-9


def test_stream_probes_measure_each_loop() -> None:
    """The STREAM loops run and count their arrays; a fake timer makes the rates exact."""
    from minductor.bench.runner import streaming_bandwidth
    from minductor.bench.stream import stream_probes

    rates = stream_probes(1 << 16, timer=lambda fn: (fn(), 1e-3)[1])
    mb = (1 << 16) * 4 / 1e9 / 1e-3
    assert rates == pytest.approx({"read": mb, "copy": 2 * mb, "add": 3 * mb, "triad": 3 * mb,
                                   "copy_nt": 2 * mb, "add_nt": 3 * mb})
    assert streaming_bandwidth(rates) == pytest.approx(3 * mb)  # the read-only loop is not the reference


def test_pointer_roles_follow_the_signature() -> None:
    from minductor.bench.runner import pointer_roles

    source = ('extern "C" void k(float* __restrict__ in_out_ptr0, const float* __restrict__ in_ptr0, '
              'float* __restrict__ out_ptr0, const int64_t s0, int64_t* mi_err)\n{\n}\n')
    assert pointer_roles(source, "k") == ["rw", "r", "w"]
    assert pointer_roles(source, "other") == []


def test_kernels_timed_alongside_a_streaming_reference() -> None:
    """With a reference loop, each kernel's % of bandwidth is over the rate that loop reached in
    the rounds alternating with the kernel, not over the figure measured at start-up."""
    import time

    reference = {"copy": (lambda: time.sleep(1e-3), 10**6)}  # 1 MB per >= 1 ms: at most 1 GB/s
    report = run_workload("ref", lambda x: x.sin() * 2, (torch.randn(256, 256),), with_inductor=False,
                          bandwidth=10.0, min_run_time=0.05, reference=reference)
    (kernel,) = report.kernels
    assert 0.1 < kernel.reference_gbps <= 1.0
    assert kernel.pct_of(10.0) == pytest.approx(100 * kernel.gbps / kernel.reference_gbps)
    assert report.to_json()["kernels"][0]["reference_gbps"] == kernel.reference_gbps
    assert "GB/s alongside" in "\n".join(report.lines())


def test_in_place_kernels_are_timed_from_the_graphs_values() -> None:
    """A kernel that updates its input in place (in_out_ptr) restarts every timed call from the
    values the graph gave it, the restore timed alone and subtracted: repeated on its own output,
    a multiply drifts (here x * 0.5 to denormals, then 0). Afterwards the buffer holds one
    update, as after the graph's own call; read-only and write-only buffers are left alone."""
    from minductor.bench.runner import _fresh_inputs

    x, y = torch.randn(1000), torch.randn(1000)
    local = {"buf0": x.clone(), "buf1": y}

    def kernel() -> None:
        local["buf0"].mul_(0.5)

    run, restore = _fresh_inputs(kernel, ["buf0", "buf1"], ["rw", "r"], local)
    assert restore is not None
    for _ in range(300):
        run()
    torch.testing.assert_close(local["buf0"], x * 0.5, rtol=0, atol=0)
    assert _fresh_inputs(kernel, ["buf1"], ["r"], local)[1] is None
    assert _fresh_inputs(kernel, ["buf0", "buf1"], [], local)[1] is None  # roles unknown

    w = torch.randn(256, 256)
    report = run_workload("in_place", lambda a: (a @ w).sin() * 2, (torch.randn(256, 256),), with_inductor=False,
                          bandwidth=10.0, min_run_time=0.01)
    (kernel_timing,) = report.kernels
    assert kernel_timing.seconds > 0


def test_dtype_workloads_match_eager_at_a_small_size() -> None:
    """The ``dtypes`` suite's workloads (a loaded bool mask, half and bfloat16 rows) compile and
    match eager within the runner's per-dtype tolerance: 16-bit results to about two ulps."""
    from minductor.bench.runner import _matches
    from minductor.bench.workloads import SUITES, make_workloads

    workloads = make_workloads(256)
    for name in SUITES["dtypes"][1]:
        fn, make = workloads[name]
        args = make()
        torch._dynamo.reset()
        assert _matches(torch.compile(fn, backend="minductor")(*args), fn(*args)), name
    assert not _matches(torch.ones(4).bfloat16(), torch.ones(4).bfloat16() * 1.05)  # five ulps off
