"""Training: compiled forward+backward graphs and compiled optimizer steps match eager.

Tolerances: float32 gradients through a few layers accumulate reassociation error, so
gradients compare with rtol=1e-4, atol=1e-5; losses and parameters after 10 optimizer steps
use the same.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minductor import config, metrics
from minductor.bench.workloads import Block

TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(F.relu(self.bn(self.c1(x)))).mean((2, 3))


class DropoutBlock(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(super().forward(x), p=0.1, training=self.training)


class LMHead(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.emb(tokens[:, :-1])))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def grads_match(model: nn.Module, make_input: Callable[[], Any], loss: Callable[[Any], torch.Tensor]) -> None:
    torch.manual_seed(0)
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend="minductor")
    x = make_input()
    torch.manual_seed(1)
    ref = loss(model(x))
    ref.backward()
    torch.manual_seed(1)
    out = loss(compiled(x))
    out.backward()
    torch.testing.assert_close(out, ref, **TOL)
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOL, msg=lambda m, n=name: f"grad of {n}: {m}")
    assert metrics.graphs_compiled >= 2  # forward and backward


def test_mlp_gradients() -> None:
    grads_match(MLP(), lambda: torch.randn(4, 10, 32), lambda y: y.pow(2).mean())


def test_conv_net_gradients() -> None:
    grads_match(ConvNet(), lambda: torch.randn(2, 3, 10, 10), lambda y: y.sum())


def test_transformer_block_with_dropout_gradients() -> None:
    # dropout runs through aten's RNG (fallback_random): identical masks under the same seed
    with config.patch(fallback_random=True):
        grads_match(DropoutBlock(dim=32, heads=2).train(), lambda: torch.randn(2, 16, 32), lambda y: y.square().mean())


def test_embedding_lm_head_cross_entropy_gradients() -> None:
    grads_match(LMHead(), lambda: torch.randint(0, 50, (4, 12)), lambda loss: loss)


def _masks() -> dict[str, dict[str, Any]]:
    bool_mask = torch.rand(16, 16) > 0.3
    bool_mask[3] = False  # a row masked out entirely: output 0, no gradient
    float_mask = torch.randn(2, 1, 16, 16)
    float_mask[1, 0, 5] = float("-inf")
    return {"causal": {"is_causal": True}, "bool_mask": {"attn_mask": bool_mask},
            "float_mask": {"attn_mask": float_mask}, "scale": {"is_causal": True, "scale": 0.3}, "plain": {}}


@pytest.mark.parametrize("case", list(_masks()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaled_dot_product_attention_gradients(case: str, dtype: torch.dtype) -> None:
    # the CPU flash-attention op: its backward takes the forward's log-sum-exp, which our
    # decomposition must return (torch's returns the probabilities in its place)
    kwargs = _masks()[case]
    if dtype == torch.float64 and "attn_mask" in kwargs and kwargs["attn_mask"].is_floating_point():
        kwargs = {"attn_mask": kwargs["attn_mask"].double()}
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=dtype, requires_grad=True) for _ in range(3))

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    expected = attention(q, k, v)
    cotangent = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (q, k, v), cotangent)
    actual = torch.compile(attention, backend="minductor")(q, k, v)
    actual_grads = torch.autograd.grad(actual, (q, k, v), cotangent)
    torch.testing.assert_close(actual, expected, **TOL)
    for name, a, e in zip("qkv", actual_grads, expected_grads):
        torch.testing.assert_close(a, e, **TOL, msg=lambda m, n=name: f"grad of {n}: {m}")
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward" in metrics.fallback_ops


@pytest.mark.parametrize("native", [False, True], ids=["float32_attention", "aten_half_attention"])
@pytest.mark.parametrize("case", ["causal", "float_mask", "plain"])
def test_half_attention_without_native_half_gemm_runs_in_float32(case: str, native: bool, tmp_path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Half attention on a CPU without native half GEMM is decomposed in float32 (eager's half
    flash attention: 2.6 ms against 1.0 at (8, 4, 128, 64)): no aten attention forward, the
    output rounded to half, the float32 log-sum-exp for aten's backward. Output and gradients
    as close to an fp64 reference as eager's."""
    from minductor.runtime import cache

    monkeypatch.setattr(cache, "native_half_gemm", lambda: native)
    kwargs = _masks()[case]
    kwargs = {k: v.half() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    cotangent = torch.randn(2, 3, 16, 8)

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    def run(fn: Any, dtype: torch.dtype) -> list[torch.Tensor]:
        args = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*args)
        return [out, *torch.autograd.grad(out, args, cotangent.to(dtype))]

    reference = [t.double() for t in run(lambda *a: F.scaled_dot_product_attention(
        *a, **{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}), torch.float64)]
    eager = run(attention, torch.float16)
    with config.patch(cache_dir=str(tmp_path)):  # (a cache of its own: the CPU's stand-in is not keyed)
        ours = run(torch.compile(attention, backend="minductor"), torch.float16)
    for o, e, r in zip(ours, eager, reference):
        assert o.dtype == torch.float16
        assert float((o.double() - r).abs().max()) <= 2 * float((e.double() - r).abs().max()) + 1e-3
    forward_fallback = "aten._scaled_dot_product_flash_attention_for_cpu" in metrics.fallback_ops
    assert forward_fallback == native and "aten._scaled_dot_product_flash_attention_for_cpu_backward" in metrics.fallback_ops


def test_half_attention_the_decomposition_leaves_to_aten() -> None:
    """Grouped-query heads in half stay the aten op (the float32 decomposition declines them,
    and so does the half one, instead of failing), with eager's result."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 16, 8).half(), torch.randn(2, 2, 16, 8).half()

    def attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)

    torch.testing.assert_close(torch.compile(attention, backend="minductor")(q, k), attention(q, k), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_long_attention_stays_the_flash_kernel(causal: bool) -> None:
    """Past SDPA_MAX_SCORES per head (a quarter of that when causal) the decomposition would
    store every score (128 MB at (8, 16, 512, 64)) and lose to the flash kernel: the aten op
    stays, forward and backward; one size step below, attention is decomposed."""
    from minductor.decompositions import SDPA_CAUSAL_MAX_SCORES, SDPA_MAX_SCORES

    limit = SDPA_CAUSAL_MAX_SCORES if causal else SDPA_MAX_SCORES
    for length, flash in ((int(limit ** 0.5), False), (2 * int(limit ** 0.5), True)):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 2, length, 8, requires_grad=True) for _ in range(3))

        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        torch._dynamo.reset()
        metrics.reset()
        got = torch.compile(attention, backend="minductor")(q, k, v)
        expected = attention(q, k, v)
        torch.testing.assert_close(got, expected, **TOL)
        for a, e in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(expected.sum(), (q, k, v))):
            torch.testing.assert_close(a, e, **TOL)
        assert ("aten._scaled_dot_product_flash_attention_for_cpu" in metrics.fallback_ops) == flash, length


def test_long_half_attention_runs_the_flash_kernel_in_float32(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without native half GEMM, half attention too long to decompose runs the aten
    op on float32 inputs (not eager's slow half kernel), rounded to half; gradients flow."""
    from minductor.decompositions import SDPA_MAX_SCORES
    from minductor.runtime import cache

    monkeypatch.setattr(cache, "native_half_gemm", lambda: False)
    torch.manual_seed(0)
    length = 2 * int(SDPA_MAX_SCORES ** 0.5)
    q, k, v = (torch.randn(1, 2, length, 8).half().requires_grad_() for _ in range(3))
    metrics.reset()
    with config.patch(cache_dir=str(tmp_path), debug=True, debug_dir=str(tmp_path / "dump")):
        got = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), backend="minductor")(q, k, v)
    expected = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)))
    assert got.dtype == torch.float16 and "aten._scaled_dot_product_flash_attention_for_cpu" in metrics.fallback_ops
    code = "".join(p.read_text() for p in tmp_path.glob("dump/*_forward/output_code.py"))
    assert code.count(f"(1, 2, {length}, 8), ({16 * length}, {8 * length}, 8, 1), device=mi_cpu, dtype=torch.float32)") == 3  # q, k, v
    torch.testing.assert_close(got.float(), expected, atol=2e-3, rtol=2e-3)
    assert all(g.dtype == torch.float16 and g.isfinite().all() for g in torch.autograd.grad(got.float().sum(), (q, k, v)))


def test_causal_attention_of_few_queries_reads_only_the_keys_they_see() -> None:
    """Causal rows i see keys 0..i: with 4 queries over 3000 keys only the first 4 keys enter
    the decomposition (eager's flash kernel skips the rest too); the others get zero gradient."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, 8, requires_grad=True)
    k, v = (torch.randn(2, 3, 3000, 8, requires_grad=True) for _ in range(2))

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    metrics.reset()
    got = torch.compile(attention, backend="minductor")(q, k, v)
    expected = attention(q, k, v)
    torch.testing.assert_close(got, expected, **TOL)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in metrics.fallback_ops
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    for a, e in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v))):
        torch.testing.assert_close(a, e, **TOL)
    assert not grads[1][:, :, 4:].any()


def test_transformer_encoder_layer_gradients() -> None:
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    grads_match(layer, lambda: torch.randn(2, 16, 32), lambda y: y.square().mean())


def test_inference_graph_saves_nothing() -> None:
    model = MLP()
    with torch.no_grad():
        out = torch.compile(model, backend="minductor")(torch.randn(2, 3, 32))
    assert not out.requires_grad and metrics.graphs_compiled == 1  # one inference graph, no backward


@pytest.mark.parametrize("opt_cls,kwargs", [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 1e-2}),
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
], ids=["sgd_momentum", "adam", "adamw"])
def test_training_steps_match_eager(opt_cls: type, kwargs: dict[str, Any]) -> None:
    torch.manual_seed(0)
    eager_model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    model = copy.deepcopy(eager_model)
    eager_opt, opt = opt_cls(eager_model.parameters(), **kwargs), opt_cls(model.parameters(), **kwargs)
    compiled = torch.compile(model, backend="minductor")
    step = torch.compile(opt.step, backend="minductor")
    for _ in range(10):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        ref = F.mse_loss(eager_model(x), y)
        ref.backward()
        eager_opt.step()
        eager_opt.zero_grad()
        loss = F.mse_loss(compiled(x), y)
        loss.backward()
        step()
        opt.zero_grad()
        torch.testing.assert_close(loss, ref, **TOL)
    for p, q in zip(eager_model.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, **TOL)
    for p, q in zip(eager_opt.state.values(), opt.state.values()):
        for key in p:
            torch.testing.assert_close(q[key], p[key], **TOL)
    assert not metrics.fallback_ops, metrics.fallback_ops


def test_min_cut_partitioner_saves_fewer_activations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """minductor's backend uses min-cut rematerialization: cheap pointwise ops are recomputed
    in the backward instead of saved, so the forward returns fewer tensors than with the
    default partitioner. Own cache dir: a hit in AOTAutograd's cache would skip the spy."""
    from functorch.compile import default_partition
    from torch._dynamo.backends.common import aot_autograd

    from minductor import backend
    from minductor import graph as graph_module

    saved: dict[str, int] = {}
    original = graph_module.compile_graph

    def recording(gm: torch.fx.GraphModule, example_inputs: Any, kind: str) -> Any:
        if kind == "forward":
            saved[current] = len(gm.graph.find_nodes(op="output")[0].args[0])
        return original(gm, example_inputs, kind)

    monkeypatch.setattr(graph_module, "compile_graph", recording)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "cache"))

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (F.gelu(x @ w).sin() * 2 + 1).tanh().sum()

    x, w = torch.randn(8, 16), torch.randn(16, 16, requires_grad=True)
    current = "min_cut"
    torch.compile(fn, backend="minductor")(x, w).backward()
    torch._dynamo.reset()
    current = "default"
    default_backend = aot_autograd(fw_compiler=backend._compiler("forward"), bw_compiler=backend._compiler("backward"),
                                   decompositions=backend.decomposition_table(), partition_fn=default_partition)
    torch.compile(fn, backend=default_backend)(x, w).backward()
    assert saved["min_cut"] < saved["default"], saved


def test_an_output_aliasing_a_reused_buffer_can_be_modified_in_place_after_a_graph_break() -> None:
    """A forward graph's output that is a reshaped alias of one of its buffers (a linear's
    product viewed as (batch, time, width) and copied, as a dropout of probability 0 does: the
    copy is the product's buffer reused) is modified in place after a graph break, as Hubert
    masks its features (``h[mask] = embed``). The alias was an autograd view created inside
    the graph's autograd Function: the assignment failed."""
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.embed = nn.Linear(16, 24), nn.Parameter(torch.randn(24))

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            h = self.proj(x.reshape(-1, 16)).view(x.shape[0], x.shape[1], 24).clone()
            torch._dynamo.graph_break()
            h[mask] = self.embed.to(h.dtype)
            return h.relu().sum(2)

    torch.manual_seed(0)
    eager = Masked()
    compiled = copy.deepcopy(eager)
    x, mask = torch.randn(2, 7, 16), torch.rand(2, 7) < 0.4
    torch.compile(compiled, backend="minductor")(x, mask).square().sum().backward()
    eager(x, mask).square().sum().backward()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_a_saved_strided_slice_of_symbolic_size_keeps_the_traced_strides() -> None:
    """A tensor saved for backward that is a slice of a wider, transposed one (a depthwise
    convolution's output transposed back and split, as Mamba2's does), under dynamic shapes:
    its strides are symbolic, so we cannot report ours; the backward was compiled for the
    traced ones and rejected the forward's output at the second length. It is stored with the
    traced strides (gaps included)."""
    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(288, 288, 4, groups=288, padding=3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = x.shape[1]
            h = F.silu(self.conv(x.transpose(1, 2))[..., :t].transpose(1, 2))
            a, g = h.split([256, 32], -1)
            v = a.view(x.shape[0], t, 4, 64)
            return (v.exp() * v).sum() + g.sum()

    torch.manual_seed(0)
    _grads_match_at_each_length(Split(), [torch.randn(2, t, 288) for t in (64, 96, 200)], dynamic=None, atol=1e-3)


def test_a_saved_chunk_at_a_symbolic_offset_is_compiled(caplog: pytest.LogCaptureFixture) -> None:
    """The second chunk of a split saved for backward under dynamic shapes has a symbolic
    storage offset; kernels address their inputs from their first element, so the backward
    compiles (it ran through aten as a whole before) and matches eager."""
    class Chunks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 48)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # channels-major values seen channels-last: the chunk of channels 32.. starts at 32 * t
            h = (self.proj(x).transpose(1, 2).contiguous() * 1.5).transpose(1, 2).sin()
            a, g = h.split([32, 16], -1)
            return (a.exp() * a).sum() + (g * g.sin()).sum()

    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minductor"):
        _grads_match_at_each_length(Chunks(), [torch.randn(2, t, 32) for t in (24, 40)], dynamic=True, atol=1e-4)
    assert "through aten" not in caplog.text, caplog.text


def _grads_match_at_each_length(eager: nn.Module, inputs: list[torch.Tensor], dynamic: bool | None, atol: float) -> None:
    """A scalar-output module's gradients, compiled against eager, one backward per input."""
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, backend="minductor", dynamic=dynamic)
    for x in inputs:
        eager.zero_grad()
        compiled_module.zero_grad()
        eager(x).backward()
        compiled(x).backward()
        for a, b in zip(eager.parameters(), compiled_module.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=atol)
