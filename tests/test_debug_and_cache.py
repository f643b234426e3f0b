"""Debug dumps, the on-disk kernel cache across processes, and compile errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minductor import config, metrics
from minductor.codegen import cpp
from minductor.runtime import cache
from minductor.runtime.cache import CppCompileError


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()
    metrics.reset()


def chain(x: torch.Tensor) -> torch.Tensor:
    return (x.sin() + 1).relu().sum(-1)


def test_debug_dump_has_every_stage_and_the_source_that_ran(tmp_path: Path) -> None:
    x = torch.randn(8, 32)
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump"), cache_dir=str(tmp_path / "cache")):
        out = torch.compile(chain, backend="minductor")(x)
    torch.testing.assert_close(out, chain(x))
    graphs = sorted((tmp_path / "dump").iterdir())
    assert len(graphs) == 1
    files = {p.name for p in graphs[0].iterdir()}
    assert {"fx_graph.py", "ir_pre_fusion.txt", "ir_post_fusion.txt", "output_code.py"} <= files
    kernels = sorted(graphs[0].glob("*.cpp"))
    assert [k.stem for k in kernels] == ["cpp_fused_add_relu_sin_sum_0"]
    dumped = kernels[0].read_text()
    with config.patch(cache_dir=str(tmp_path / "cache")):
        compiled_from = cache.cpp_source_path(dumped, kernels[0].stem)
    assert compiled_from.exists() and compiled_from.read_text() == dumped
    assert dumped in (graphs[0] / "output_code.py").read_text()
    assert "aten.sin" in (graphs[0] / "fx_graph.py").read_text()


CHILD = """
import json, torch
from minductor import metrics
f = torch.compile(lambda x: ((x * 2).exp() - 1).tanh().mean(-1), backend="minductor")
x = torch.arange(12.0).reshape(3, 4) / 10
torch.testing.assert_close(f(x), ((x * 2).exp() - 1).tanh().mean(-1))
print(json.dumps({"hits": metrics.cache_hits, "misses": metrics.cache_misses,
                  "kernels": metrics.generated_kernel_count}))
"""


def test_second_process_reuses_compiled_kernels(tmp_path: Path) -> None:
    env = dict(os.environ, MINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)  # noqa: PLW1510
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["kernels"] >= 1 and first["misses"] == first["kernels"]
    assert second["misses"] == 0 and second["hits"] == first["kernels"]


def test_kernel_rejected_by_compiler_names_the_file_and_shows_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    render = cpp.CppKernel.render

    def broken(self: cpp.CppKernel, code: object) -> str:
        return render(self, code).replace("{\n", "{\n    this_is_not_cpp;\n", 1)

    monkeypatch.setattr(cpp.CppKernel, "render", broken)
    with config.patch(cache_dir=str(tmp_path / "cache")), pytest.raises(Exception) as info:
        torch.compile(chain, backend="minductor")(torch.randn(4, 4))
    err = getattr(info.value, "inner_exception", info.value)  # Dynamo wraps backend errors
    assert isinstance(err, CppCompileError), repr(info.value)
    message = str(err)
    assert "cpp_fused_add_relu_sin_sum_0" in message and ".cpp" in message
    assert "this_is_not_cpp" in message and "error" in message


def test_metrics_count_graphs_and_kernels() -> None:
    metrics.reset()
    torch.compile(chain, backend="minductor")(torch.randn(4, 4))
    assert metrics.graphs_compiled == 1
    assert metrics.generated_kernel_count == 1 and metrics.kernels_by_backend["cpp"] == 1


@pytest.mark.parametrize("size, stride", [((8, 9), (9, 1)), ((8, 8), (1, 8)), ((8,), (1,)), ((None, 9), (9, 1))])
def test_wrapper_layout_check_names_the_input(size: tuple, stride: tuple) -> None:
    # static layouts go through torch's C++ check first; a mismatch still gets our message
    from minductor.runtime.helpers import assert_size_stride

    with pytest.raises(AssertionError, match=r"input arg3_1 has size \(8, 8\) and stride \(8, 1\).*expects size"):
        assert_size_stride(torch.randn(8, 8), size, stride, "arg3_1")


def test_wrapper_layout_check_accepts_matching_layouts() -> None:
    from minductor.runtime.helpers import assert_size_stride

    assert_size_stride(torch.randn(8, 8).t(), (8, 8), (1, 8), "a")
    assert_size_stride(torch.randn(1, 8), (1, 8), (1, 1), "a")  # the stride of a size-1 dim is free
    assert_size_stride(torch.randn(5, 8), (None, 8), (8, 1), "a")  # symbolic size
    assert_size_stride(None, (1,), (1,), "token")  # an effect token
