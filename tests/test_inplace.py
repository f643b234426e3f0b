"""Kernels store over an input that dies in them (``in_out_ptr``), only where that is safe:
results match eager, and the wrapper shows where storage was taken over."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import config, metrics


def _compile(fn: Callable[..., Any], *args: torch.Tensor, tmp_path: Path, **tol: float) -> str:
    """Compile with a debug dump, compare with eager, return the generated module."""
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        out = torch.compile(fn, backend="minductor")(*args)
        torch.testing.assert_close(out, fn(*args), **tol)
    return next(tmp_path.glob("graph_*/output_code.py")).read_text()


def _in_place(code: str) -> list[str]:
    return re.findall(r"(\w+) = .*# reuse in place", code)


def test_epilogue_of_a_matmul_writes_over_the_matmul_result(tmp_path: Path) -> None:
    """GELU(x @ w + b) @ w2: the GELU kernel stores into the addmm output it reads."""
    x, w, b, w2 = torch.randn(64, 32), torch.randn(32, 128), torch.randn(128), torch.randn(128, 16)
    code = _compile(lambda x: F.gelu(torch.addmm(b, x, w)) @ w2, x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    assert len(_in_place(code)) == 1, code
    # the bias is added in the GELU kernel, which stores over the product
    assert re.search(r"void cpp_fused_add_gelu_\d+\(float\* __restrict__ in_out_ptr0, const float\* __restrict__ in_ptr0\)", code), code
    assert "torch.mm(" in code and "addmm" not in code


@pytest.mark.parametrize("row_scratch", [True, False])
def test_softmax_writes_over_its_input_after_reading_each_row(tmp_path: Path, row_scratch: bool) -> None:
    """Softmax: a max loop, then exp(x - max) stored and summed, then the division stored: every
    read is in the row it stores, before the store. With a row scratch (the default) the exp
    stays in it and the result is stored over the dying product; without, the exp is stored
    over the product and the result over the exp. One storage either way (the product's), and
    exp evaluated once per element."""
    q, k = torch.randn(4, 64, 32), torch.randn(4, 64, 32)
    with config.patch(row_scratch=row_scratch):
        code = _compile(lambda q, k: (q @ k.transpose(1, 2)).softmax(-1), q, k, tmp_path=tmp_path, rtol=1e-5, atol=1e-5)
    assert len(_in_place(code)) == (1 if row_scratch else 2), code
    kernel = code.split("\ndef call")[0]
    loops = re.findall(r"MI_LOOP_FN void \w+\(.*?\n}\n}", kernel, flags=re.S)
    assert len(loops) == (3 if row_scratch else 4), kernel  # the sum runs in the exp loop with a row scratch
    assert sum("mi_exp(" in loop for loop in loops) == 1, kernel  # no recomputed exp
    assert ("mi_row0" in kernel) == row_scratch
    assert metrics.buffers_allocated == 1  # the bmm output


def test_residual_add_writes_over_a_dying_intermediate_and_is_returned(tmp_path: Path) -> None:
    x, w = torch.randn(32, 64), torch.randn(64, 64)
    code = _compile(lambda x: x + (x @ w), x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    assert len(_in_place(code)) == 1, code
    assert metrics.buffers_allocated == 1  # the mm output only; the sum is returned in it


def test_only_the_last_reader_in_a_loop_writes_over_the_input(tmp_path: Path) -> None:
    """a = y * 2 and c = y + 1 run in one loop, a's store first: a written over y would
    change what c then reads, so only c may take y's storage."""
    x, w = torch.randn(32, 64), torch.randn(64, 64)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ w
        return y * 2, y + 1

    code = _compile(fn, x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    kernels = re.findall(r"extern \"C\" void (cpp_\w+)\(", code)
    assert len(kernels) == 1, code  # both outputs in one kernel
    assert len(_in_place(code)) == 1, code


def test_no_write_over_a_value_used_later(tmp_path: Path) -> None:
    x, w = torch.randn(32, 64), torch.randn(64, 64)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ w
        z = y.relu()  # y is still needed below: z must not take its storage
        return z @ w, y.sum(0)

    code = _compile(fn, x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    assert not _in_place(code), code


def test_no_write_over_a_transposed_read(tmp_path: Path) -> None:
    """out[i, j] = y[i, j] + y[j, i] reads another element than it stores: never in place."""
    x, w = torch.randn(64, 64), torch.randn(64, 64)

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x @ w
        return y + y.t()

    code = _compile(fn, x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    assert not _in_place(code), code


def test_transposed_output_stored_where_it_reads(tmp_path: Path) -> None:
    """(x @ w).t() + 1 keeps eager's transposed strides: each store lands on the element it
    read, so the output takes the matmul result's storage."""
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    code = _compile(lambda x: (x @ w).t() + 1, x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    assert len(_in_place(code)) == 1, code


def test_no_write_over_graph_inputs(tmp_path: Path) -> None:
    x = torch.randn(64, 64)
    saved = x.clone()
    code = _compile(lambda x: x.sin() * 2, x, tmp_path=tmp_path)
    assert not _in_place(code) and "in_out_ptr" not in code
    assert torch.equal(x, saved)


@pytest.mark.parametrize("case", ["conv_bn_relu", "layer_norm_after_mm"])
def test_models_match_eager_with_in_place_kernels(case: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    if case == "conv_bn_relu":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                    torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1)).eval()
        x = torch.randn(2, 3, 16, 16)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 8)).eval()
        x = torch.randn(16, 32)
    code = _compile(model, x, tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    assert _in_place(code), code


def test_training_step_with_in_place_kernels_matches_eager() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                                torch.nn.Softmax(-1), torch.nn.Linear(64, 4))
    x = torch.randn(8, 16)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.compile(model, backend="minductor")(x).square().sum().backward()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)


def test_planner_refuses_a_store_before_a_later_loop_reads_the_row() -> None:
    """y = x @ w; (y * 2, y.sum(-1)) is one kernel whose sum loop runs first, so y * 2 may
    take y's storage. With the loops swapped (store first, sum after) it may not."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from minductor.codegen.memory import plan_written_over
    from minductor.graph import GraphLowering
    from minductor.scheduler import Scheduler
    from minductor.scheduler.nodes import FusedGroup
    from minductor.virtualized import V

    x, w = torch.randn(32, 64), torch.randn(64, 64)
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ w
        return y * 2, y.sum(-1)

    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(x, w)
    graph = GraphLowering(gm, [x, w])
    with V.set_graph(graph):
        graph.run(x, w)
        scheduler = Scheduler(graph)
        scheduler.fuse_nodes()
        outputs = scheduler.output_names()
        groups = [i for i, u in enumerate(scheduler.units) if isinstance(u, FusedGroup) and len(u.nodes) == 2]
        assert len(groups) == 1, scheduler.units
        group = scheduler.units[groups[0]]
        assert group.nodes[0].is_reduction() and not group.nodes[1].is_reduction()
        planned = plan_written_over(graph, scheduler.units, scheduler.last_use, outputs)
        assert list(planned.get(groups[0], {})) == [group.nodes[1].node.name]
        group.nodes.reverse()  # the pointwise store first, the sum's loop after it
        assert groups[0] not in plan_written_over(graph, scheduler.units, scheduler.last_use, outputs)


@pytest.mark.parametrize("two_pass", [True, False], ids=["two_pass", "welford"])
def test_gelu_then_layer_norm_stores_gelu_once_and_reduces_it_once(tmp_path: Path, monkeypatch, two_pass: bool) -> None:
    """GELU feeding a layer norm: the GELU (an erf) is stored once (in a row scratch, by the
    first loop along the row, the mean's sum or Welford's) and read back by the later loops,
    the normalizing one storing over the matmul result; with Welford the mean and m2 come from
    ONE accumulator (a store elsewhere in the kernel must not make the two readers' loads look
    different)."""
    from minductor.lowering import reduction

    monkeypatch.setattr(reduction, "TWO_PASS_MAX", 2048 if two_pass else 0)
    x, w, b = torch.randn(64, 32), torch.randn(32, 128), torch.randn(128)
    lw, lb = torch.randn(128), torch.randn(128)
    # the mean and rstd are outputs too (as a training forward saves them): stored after the loop
    code = _compile(lambda x: torch.native_layer_norm(F.gelu(torch.addmm(b, x, w)), (128,), lw, lb, 1e-5), x,
                    tmp_path=tmp_path, rtol=1e-4, atol=1e-4)
    kernel = code.split("\ndef call")[0]
    loops = re.findall(r"MI_LOOP_FN void \w+\(.*?\n}\n}", kernel, flags=re.S)
    assert len(loops) == (4 if two_pass else 3) and sum("mi_erf(" in loop for loop in loops) == 1, kernel  # no recomputed erf
    assert "mi_row0" in kernel
    assert len(set(re.findall(r"(tmp_acc\d+)_mean\[", kernel))) == (0 if two_pass else 1), kernel
    assert _in_place(code), code
