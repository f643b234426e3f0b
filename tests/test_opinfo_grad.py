"""Gradients of every differentiable op of PyTorch's OpInfo database, compiled vs eager.

For each op that supports autograd, the first sample is built with ``requires_grad=True``;
``op(sample.input, *sample.args, **sample.kwargs)`` is compiled with ``backend="minductor"``
(so AOTAutograd makes a forward and a backward graph) and the gradients of every input that
requires grad, for a seeded random cotangent on every differentiable output, are compared with
eager's. An op that fails must be listed in ``KNOWN_FAILURES`` with a reason.

``python tests/test_opinfo_grad.py [op names...]`` prints a report instead of asserting.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree


pytest.importorskip("expecttest", reason="the OpInfo database imports expecttest")
from test_opinfo import DTYPE, UNDEFINED_VALUES, _first_line, op_key, run_both  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

# op name -> why its gradient fails. Reviewed: each entry names the cause.
KNOWN_FAILURES: dict[str, str] = {
}


def grad_ops() -> list[Any]:
    return [op for op in op_db if op.supports_autograd and DTYPE in op.supported_backward_dtypes("cpu")
            and op_key(op) not in UNDEFINED_VALUES]


def _differentiable(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point]


def _gradients(fn: Any, args: Any) -> tuple[torch.Tensor | None, ...] | None:
    """d(sum(out * cotangent))/d(input) for each input that requires grad; None if there is
    nothing to differentiate."""
    inputs = _differentiable(args)
    outputs = [o for o in _differentiable(fn(*args)) if o.grad_fn is not None]
    if not inputs or not outputs:
        return None
    generator = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in outputs]
    return torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)


def check_grad_sample(op: Any, sample: Any) -> str | None:
    """None if the compiled op's gradients match eager's on ``sample`` (or eager raises)."""
    result = run_both(op, sample, _gradients, skip=lambda expected: expected is None)
    if not isinstance(result, tuple):
        return result
    expected, actual, _, _ = result
    try:
        assert actual is not None, "the compiled op gave no differentiable output"
        for i, (a, e) in enumerate(zip(actual, expected)):
            if e is None or a is None:
                assert a is None or not a.any(), f"input {i}: gradient where eager has none"
                assert e is None or not e.any(), f"input {i}: no gradient where eager has one"
                continue
            torch.testing.assert_close(a, e, equal_nan=True, atol=1e-4, rtol=1e-4, msg=lambda m, i=i: f"input {i}: {m}")
    except AssertionError as e:
        return f"mismatch: {_first_line(str(e), 300)}"
    return None


def check_op(op: Any) -> str | None:
    sample = next(iter(op.sample_inputs("cpu", DTYPE, requires_grad=True)), None)
    return None if sample is None else check_grad_sample(op, sample)


OPS = grad_ops()


@pytest.mark.parametrize("op", OPS, ids=op_key)
def test_op_gradient_matches_eager(op: Any) -> None:
    key = op_key(op)
    failure = check_op(op)
    if failure and key in KNOWN_FAILURES:
        pytest.xfail(KNOWN_FAILURES[key])
    assert failure is None, f"{key}'s gradient fails (add it to KNOWN_FAILURES with a reason, or fix it): {failure}"


def test_known_failures_name_real_ops() -> None:
    names = {op_key(op) for op in OPS}
    assert not set(KNOWN_FAILURES) - names, sorted(set(KNOWN_FAILURES) - names)


def _report(argv: list[str]) -> None:
    wanted = set(argv)
    ops = [op for op in OPS if not wanted or op_key(op) in wanted or op.name in wanted]
    failed = 0
    start = time.perf_counter()
    for op in ops:
        t0 = time.perf_counter()
        failure = check_op(op)
        failed += failure is not None
        status = "ok" if failure is None else ("known" if op_key(op) in KNOWN_FAILURES else "FAIL")
        print(f"{status:5} {op_key(op)} {time.perf_counter() - t0:.1f}s" + (f"\n      {failure}" if failure else ""), flush=True)
    print(f"passed {len(ops) - failed}/{len(ops)} ops in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    _report(sys.argv[1:])
