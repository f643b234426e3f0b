"""The graph cache: a graph compiled before loads its generated wrapper instead of being
lowered again; anything that changes the generated code misses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from minductor import config, metrics


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path) -> Iterator[None]:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        yield


def _compile_twice(fn: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    """Compile and run ``fn`` twice from scratch (fresh Dynamo, zeroed metrics); results
    must match eager each time. Returns the metrics of each round."""
    rounds = []
    for _ in range(2):
        torch._dynamo.reset()
        metrics.reset()
        out = torch.compile(fn, backend="minductor")(*args)
        torch.testing.assert_close(out, fn(*args))
        rounds.append({"hits": metrics.graph_cache_hits, "graphs": metrics.graphs_compiled,
                       "kernels": metrics.generated_kernel_count, "cpp": metrics.kernels_by_backend["cpp"],
                       "allocated": metrics.buffers_allocated, "fallbacks": dict(metrics.fallback_ops)})
    return rounds


def _softmax_mm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.sin() + y).softmax(-1) @ y.t()


def test_second_compile_hits_and_reports_the_same_metrics() -> None:
    first, second = _compile_twice(_softmax_mm, torch.randn(8, 16), torch.randn(8, 16))
    assert first["hits"] == 0 and second["hits"] == 1
    assert {k: v for k, v in first.items() if k != "hits"} == {k: v for k, v in second.items() if k != "hits"}
    assert first["kernels"] >= 1


def test_fallback_ops_are_replayed_on_a_hit() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.inv(x).relu()

    first, second = _compile_twice(fn, torch.randn(4, 4) + 4 * torch.eye(4))
    assert second["hits"] == 1 and first["fallbacks"] == second["fallbacks"] and first["fallbacks"]


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "flag"])
def test_what_changes_the_generated_code_misses(change: str) -> None:
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    torch.compile(_softmax_mm, backend="minductor")(x, y)
    torch._dynamo.reset()
    metrics.reset()
    if change == "shape":
        x, y = torch.randn(8, 32), torch.randn(8, 32)
    elif change == "dtype":
        x, y = x.double(), y.double()
    elif change == "strides":
        x = torch.randn(16, 8).t()
    with config.patch(bounds_check=change != "flag"):
        out = torch.compile(_softmax_mm, backend="minductor", dynamic=False)(x, y)
    torch.testing.assert_close(out, _softmax_mm(x, y))
    assert metrics.graph_cache_hits == 0 and metrics.graphs_compiled == 1


class _Scaled(torch.nn.Module):
    """Holds a constant tensor the graph reads through get_attr."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).tanh()


def test_a_hit_binds_the_current_graphs_constants() -> None:
    x = torch.randn(4, 8)
    with torch.no_grad():
        for i, scale in enumerate([torch.full((8,), 2.0), torch.full((8,), -3.0)]):
            torch._dynamo.reset()
            metrics.reset()
            model = _Scaled(scale)
            torch.testing.assert_close(torch.compile(model, backend="minductor")(x), model(x))
            assert metrics.graph_cache_hits == i


def test_training_graphs_hit_and_gradients_match() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    for i in range(2):
        torch._dynamo.reset()
        metrics.reset()
        model.zero_grad()
        torch.compile(model, backend="minductor")(x).square().sum().backward()
        for p, g in zip(model.parameters(), expected):
            torch.testing.assert_close(p.grad, g)
        assert metrics.graph_cache_hits == 2 * i  # forward and backward


def test_debug_runs_compile_every_stage(tmp_path: Path) -> None:
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    torch.compile(_softmax_mm, backend="minductor")(x, y)
    torch._dynamo.reset()
    metrics.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.compile(_softmax_mm, backend="minductor")(x, y)
    assert metrics.graph_cache_hits == 0
    assert list((tmp_path / "dump").glob("graph_*/ir_post_fusion.txt"))


CHILD = r"""
import json, torch
from minductor import metrics
def fn(x):
    return (x * 2).relu().sum(-1)
x = torch.randn(4, 8)
torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x))
print(json.dumps({"hits": metrics.graph_cache_hits, "graphs": metrics.graphs_compiled, "direct": metrics.direct_graphs}))
"""


def _run_twice(child: str, cache_dir: Path) -> list[dict[str, Any]]:
    """Run ``child`` in two fresh processes sharing ``cache_dir``; the JSON each prints last."""
    env = dict(os.environ, MINDUCTOR_CACHE_DIR=str(cache_dir))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True,  # noqa: PLW1510
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def test_a_second_process_loads_the_graph(tmp_path: Path) -> None:
    runs = _run_twice(CHILD, tmp_path / "shared")
    # loaded from AOTAutograd's cache, the graph still runs without its runtime wrapper
    assert runs[0] == {"hits": 0, "graphs": 1, "direct": 1} and runs[1] == {"hits": 1, "graphs": 1, "direct": 1}


TRAIN_CHILD = r"""
import json, torch
from torch._dynamo.utils import counters
from minductor import metrics
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
torch.compile(model, backend="minductor")(x).square().sum().backward()
got = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
model(x).square().sum().backward()
for g, p in zip(got, model.parameters()):
    torch.testing.assert_close(g, p.grad)
print(json.dumps({"aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
                  "aot_saved": counters["aot_autograd"]["autograd_cache_saved"],
                  "graph_hits": metrics.graph_cache_hits, "graphs": metrics.graphs_compiled}))
"""


def test_a_second_process_skips_aot_tracing(tmp_path: Path) -> None:
    """AOTAutograd's cache holds the forward and the (lazily compiled) backward graph in one
    entry under our cache dir: a second process loads both without tracing."""
    runs = _run_twice(TRAIN_CHILD, tmp_path / "shared")
    assert runs[0] == {"aot_hits": 0, "aot_saved": 1, "graph_hits": 0, "graphs": 2}
    assert runs[1] == {"aot_hits": 1, "aot_saved": 0, "graph_hits": 2, "graphs": 2}
    assert list((tmp_path / "shared" / "aotautograd").iterdir())


def test_aot_cache_settings_end_with_the_compile() -> None:
    """The settings the lazy backward compile takes are dropped when that compile ends."""
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd import autograd_cache

    key_fn = autograd_cache.autograd_cache_key
    model, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
    torch.compile(model, backend="minductor")(x).sin().sum().backward()
    torch.testing.assert_close(model.weight.grad, model(x).cos().t() @ x)
    assert autograd_cache.autograd_cache_key is key_fn and not functorch_config.bundled_autograd_cache
    assert autograd_cache.cache_dir() != config.cache_dir


def test_without_the_aot_cache_nothing_is_written_there() -> None:
    with config.patch(aot_cache=False):
        for _ in range(2):
            torch._dynamo.reset()
            x, y = torch.randn(8, 16), torch.randn(8, 16)
            torch.testing.assert_close(torch.compile(_softmax_mm, backend="minductor")(x, y), _softmax_mm(x, y))
    assert not (Path(config.cache_dir) / "aotautograd").exists()
    assert metrics.graph_cache_hits == 1  # our own graph cache still serves the second compile
