"""Gradients of every differentiable op of PyTorch's OpInfo database, compiled vs eager.

For each op that supports autograd, the first sample is built with ``requires_grad=True``;
``op(sample.input, *sample.args, **sample.kwargs)`` is compiled with ``backend="minductor"``
(so AOTAutograd makes a forward and a backward graph) and the gradients of every input that
requires grad, for a seeded random cotangent on every differentiable output, are compared with
eager's. An op that fails must be listed in ``KNOWN_FAILURES`` with a reason.

``MINDUCTOR_OPINFO_DYNAMIC=1`` and ``MINDUCTOR_OPINFO_DTYPE`` work as in ``test_opinfo``: compile
with ``dynamic=True``, and take samples of another dtype (its ops are those supporting its
backward on CPU). A float16/bfloat16 gradient that does not match eager's is judged against one
computed in float64 (``_as_close_to_fp64_as_eager``): the cotangents are rounded to the dtype
for both, so only the rounding inside forward and backward differs.

``python tests/test_opinfo_grad.py [op names...]`` prints a report instead of asserting.
"""
from __future__ import annotations

import functools
import sys
import time
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree


pytest.importorskip("expecttest", reason="the OpInfo database imports expecttest")
import test_opinfo  # noqa: E402
from test_opinfo import (  # noqa: E402
    DTYPE, DYNAMIC, LOW_PRECISION, UNDEFINED_VALUES, _as_close_to_fp64_as_eager, _first_line, op_key, run_both,
)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

# op name -> why its gradient fails. Reviewed: each entry names the cause.
KNOWN_FAILURES: dict[str, str] = {
}
# The same, under dynamic shapes only: failures of Dynamo's and AOTAutograd's (they fail with
# backend="aot_eager" too).
_AS_STRIDED = ("in bfloat16: AOTAutograd regenerates the output, a view of the input, with as_strided, "
               "whose eager backward sums in bfloat16")
KNOWN_DYNAMIC_FAILURES: dict[str, str] = {
    "max_pool2d_with_indices_backward": "Dynamo's fake run passes a SymInt kernel_size where the op takes int[2]",
    "broadcast_to": _AS_STRIDED, "expand": _AS_STRIDED, "expand_as": _AS_STRIDED,
}


def known_failures() -> dict[str, str]:
    return KNOWN_FAILURES | (KNOWN_DYNAMIC_FAILURES if DYNAMIC else {})


def grad_ops() -> list[Any]:
    return [op for op in op_db if op.supports_autograd and DTYPE in op.supported_backward_dtypes("cpu")
            and op_key(op) not in UNDEFINED_VALUES]


def _differentiable(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point]


def _gradients(fn: Any, args: Any, dtype: torch.dtype = DTYPE) -> tuple[torch.Tensor | None, ...] | None:
    """d(sum(out * cotangent))/d(input) for each input that requires grad; None if there is
    nothing to differentiate. The cotangents are drawn in float32 and rounded to ``dtype``, the
    sample's: a float64 reference gets the same ones."""
    inputs = _differentiable(args)
    outputs = [o for o in _differentiable(fn(*args)) if o.grad_fn is not None]
    if not inputs or not outputs:
        return None
    generator = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=generator).to(dtype).to(o.dtype) for o in outputs]
    return torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)


def _compare_gradients(actual: Any, expected: tuple[torch.Tensor | None, ...], dtype: torch.dtype) -> None:
    """Close to eager's: within 1e-4, or assert_close's default tolerances for 16-bit floats."""
    tolerance = {} if dtype in LOW_PRECISION else {"atol": 1e-4, "rtol": 1e-4}
    assert actual is not None, "the compiled op gave no differentiable output"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if e is None or a is None:
            assert a is None or not a.any(), f"input {i}: gradient where eager has none"
            assert e is None or not e.any(), f"input {i}: no gradient where eager has one"
            continue
        torch.testing.assert_close(a, e, equal_nan=True, **tolerance, msg=lambda m, i=i: f"input {i}: {m}")


def check_grad_sample(op: Any, sample: Any, dtype: torch.dtype = DTYPE) -> str | None:
    """None if the compiled op's gradients match eager's on ``sample`` (or eager raises); in
    float16/bfloat16, or are about as close to float64 gradients as eager's."""
    gradients = functools.partial(_gradients, dtype=dtype)
    result = run_both(op, sample, gradients, skip=lambda expected: expected is None)
    if not isinstance(result, tuple):
        return result
    expected, actual, _, _ = result
    try:
        _compare_gradients(actual, expected, dtype)
    except AssertionError as e:
        if dtype not in LOW_PRECISION or actual is None:
            return f"mismatch: {_first_line(str(e), 300)}"
        return _as_close_to_fp64_as_eager(op, sample, dtype, actual, expected, run=gradients)
    return None


def check_op(op: Any, dtype: torch.dtype = DTYPE) -> str | None:
    sample = next(iter(op.sample_inputs("cpu", dtype, requires_grad=True)), None)
    return None if sample is None else check_grad_sample(op, sample, dtype)


OPS = grad_ops()


@pytest.mark.parametrize("op", OPS, ids=op_key)
def test_op_gradient_matches_eager(op: Any) -> None:
    key = op_key(op)
    failure = check_op(op)
    known = known_failures()
    if failure and key in known:
        pytest.xfail(known[key])
    assert failure is None, f"{key}'s gradient fails (add it to KNOWN_FAILURES with a reason, or fix it): {failure}"


# A few gradients in each other mode the whole database was swept in (MINDUCTOR_OPINFO_DTYPE,
# MINDUCTOR_OPINFO_DYNAMIC), among them ops those sweeps found wrong.
OTHER_MODES: list[tuple[torch.dtype, bool, str]] = [
    (torch.float32, True, "fft.fftshift"), (torch.float32, True, "fft.ifftshift"), (torch.float32, True, "roll"),
    (torch.float32, True, "nn.functional.layer_norm"), (torch.float32, True, "cummax"),
    (torch.bfloat16, False, "cummax"), (torch.bfloat16, False, "cummin"), (torch.bfloat16, False, "scatter_add"),
    (torch.bfloat16, False, "softmax"), (torch.bfloat16, False, "nn.functional.layer_norm"),
]


@pytest.mark.parametrize("dtype, dynamic, key", OTHER_MODES,
                         ids=[f"{key}-{str(dtype).removeprefix('torch.')}{'-dynamic' * dynamic}"
                              for dtype, dynamic, key in OTHER_MODES])
def test_op_gradient_matches_eager_in_other_modes(dtype: torch.dtype, dynamic: bool, key: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_opinfo, "DYNAMIC", dynamic)
    op = next(op for op in op_db if op_key(op) == key)
    assert dtype in op.supported_backward_dtypes("cpu")
    failure = check_op(op, dtype)
    assert failure is None, f"{key}'s gradient fails in {dtype}{' with dynamic shapes' * dynamic}: {failure}"


def test_known_failures_name_real_ops() -> None:
    names = {op_key(op) for op in OPS}
    listed = set(KNOWN_FAILURES) | set(KNOWN_DYNAMIC_FAILURES)
    assert not listed - names, sorted(listed - names)


def _report(argv: list[str]) -> None:
    wanted = set(argv)
    ops = [op for op in OPS if not wanted or op_key(op) in wanted or op.name in wanted]
    print(f"dtype {DTYPE}{', dynamic shapes' if DYNAMIC else ''}", flush=True)
    failed = 0
    start = time.perf_counter()
    for op in ops:
        t0 = time.perf_counter()
        failure = check_op(op)
        failed += failure is not None
        status = "ok" if failure is None else ("known" if op_key(op) in known_failures() else "FAIL")
        print(f"{status:5} {op_key(op)} {time.perf_counter() - t0:.1f}s" + (f"\n      {failure}" if failure else ""), flush=True)
    print(f"passed {len(ops) - failed}/{len(ops)} ops in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    _report(sys.argv[1:])
