"""``minductor.nn.GRU`` (one XLA scan per layer and direction) vs ``torch.nn.GRU`` with the same weights.

Every combination of num_layers {1, 2} x batch_first x bidirectional x bias x h0 given, in fp32
and under bf16 autocast, compiled with minductor: outputs, final state and gradients (input, h0,
every parameter). Tolerances: fp32 rtol=atol=1e-5 on these short sequences; bf16 autocast runs
the matmuls in bf16 (eager nn.GRU stays fp32 on CPU), so rtol=atol=4e-2; the long-sequence test
compares fp32 against an fp64 eager reference at 1e-4.
"""
from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
import torch

import minductor
from minductor import config, metrics

pytest.importorskip("jax", reason="the XLA path needs the optional jax extra (pip install minductor[xla])")

INPUT, HIDDEN, SEQ, BATCH = 3, 4, 3, 2
COMBOS = list(itertools.product([1, 2], [False, True], [False, True], [False, True]))


def _pair(num_layers: int, batch_first: bool, bidirectional: bool, bias: bool, **kw: Any) -> tuple[Any, Any]:
    ref = torch.nn.GRU(INPUT, HIDDEN, num_layers=num_layers, batch_first=batch_first, bidirectional=bidirectional,
                       bias=bias, **kw)
    ours = minductor.nn.GRU(INPUT, HIDDEN, num_layers=num_layers, batch_first=batch_first,
                            bidirectional=bidirectional, bias=bias, **kw)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def _run(module: Any, x: torch.Tensor, h0: torch.Tensor | None, autocast: bool) -> tuple[Any, list[torch.Tensor]]:
    x = x.detach().clone().requires_grad_()
    h0 = h0.detach().clone().requires_grad_() if h0 is not None else None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, h_n = module(x, h0) if h0 is not None else module(x)
    seed_out = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    seed_h = torch.linspace(1, -1, h_n.numel()).reshape(h_n.shape)
    wrt = [x, *([h0] if h0 is not None else []), *module.parameters()]
    grads = torch.autograd.grad([out, h_n], wrt, [seed_out.to(out.dtype), seed_h.to(h_n.dtype)])
    return (out, h_n), list(grads)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("num_layers,batch_first,bidirectional,bias", COMBOS,
                         ids=[f"L{n}-bf{int(b)}-bi{int(d)}-bias{int(c)}" for n, b, d, c in COMBOS])
def test_gru_matches_torch(num_layers: int, batch_first: bool, bidirectional: bool, bias: bool,
                           autocast: bool) -> None:
    torch.manual_seed(0)
    ref, ours = _pair(num_layers, batch_first, bidirectional, bias)
    compiled = torch.compile(ours, backend="minductor", dynamic=False)
    x = torch.randn((BATCH, SEQ, INPUT) if batch_first else (SEQ, BATCH, INPUT))
    h0 = torch.randn(num_layers * (2 if bidirectional else 1), BATCH, HIDDEN)
    tol = {"rtol": 4e-2, "atol": 4e-2} if autocast else {"rtol": 1e-5, "atol": 1e-5}
    for given in (None, h0):  # h0 absent, then given
        want, want_grads = _run(ref, x, given, autocast)
        got, got_grads = _run(compiled, x, given, autocast)
        assert [t.dtype for t in got] == [t.dtype for t in want]
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(got_grads, want_grads, **tol)
    dirs = 2 if bidirectional else 1
    assert metrics.kernels_by_backend["xla"] >= 2 * 2 * num_layers * dirs  # forward + backward scans, twice


def test_unbatched_input_eager_and_compiled() -> None:
    torch.manual_seed(0)
    ref, ours = _pair(2, False, True, True)
    x, h0 = torch.randn(SEQ, INPUT), torch.randn(4, HIDDEN)
    want = ref(x, h0)
    torch.testing.assert_close(ours(x, h0), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.compile(ours, backend="minductor")(x, h0), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_state_dict_round_trip_strict() -> None:
    ref = torch.nn.GRU(INPUT, HIDDEN, num_layers=2, bidirectional=True)
    ours = minductor.nn.GRU(INPUT, HIDDEN, num_layers=2, bidirectional=True)
    assert isinstance(ours, torch.nn.GRU)
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = torch.nn.GRU(INPUT, HIDDEN, num_layers=2, bidirectional=True)
    back.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for name, value in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], value) and torch.equal(ours.state_dict()[name], value)


def test_unsupported_arguments_fall_back_with_one_warning() -> None:
    torch.manual_seed(0)
    ref, ours = _pair(2, False, False, True, dropout=0.5)
    ours.train()
    x = torch.randn(SEQ, BATCH, INPUT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(1)
        got = ours(x)
        ours(x)
    torch.manual_seed(1)
    torch.testing.assert_close(got, ref(x))  # nn.GRU's own forward, same dropout masks
    assert len([w for w in caught if "dropout" in str(w.message)]) == 1
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, [3, 2])
    ours.eval()
    ref.eval()
    with pytest.warns(UserWarning, match="PackedSequence"):
        out, h = ours(packed)
    want_out, want_h = ref(packed)
    torch.testing.assert_close(out.data, want_out.data)
    torch.testing.assert_close(h, want_h)


def test_scan_rnn_flag_turns_torch_gru_into_scans() -> None:
    torch.manual_seed(0)
    ref = torch.nn.GRU(INPUT, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(BATCH, SEQ, INPUT, requires_grad=True)
    want = ref(x)
    torch._dynamo.config.allow_rnn = True
    with config.patch(scan_rnn=True):
        got = torch.compile(ref, backend="minductor")(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert metrics.kernels_by_backend["xla"] == 4  # one forward scan per layer and direction
    seeds = [torch.randn_like(t) for t in want]
    torch.testing.assert_close(torch.autograd.grad(got, [x, *ref.parameters()], seeds),
                               torch.autograd.grad(want, [x, *ref.parameters()], seeds), rtol=1e-5, atol=1e-5)
    assert metrics.kernels_by_backend["xla"] == 8  # and one backward scan each


def test_long_sequence_against_fp64_reference() -> None:
    torch.manual_seed(0)
    ref, ours = _pair(1, False, False, True)
    x = torch.randn(200, BATCH, INPUT)
    want, _ = ref.double()(x.double())
    got, _ = torch.compile(ours, backend="minductor")(x)
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4)
