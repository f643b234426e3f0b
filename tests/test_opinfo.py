"""Every op of PyTorch's OpInfo database with CPU samples of one dtype, compiled vs eager.

For each op, ``op(sample.input, *sample.args, **sample.kwargs)`` is compiled with
``backend="minductor"`` (Dynamo makes the sample's tensors graph inputs and specializes on
everything else) and compared with eager. An op that fails must be listed in ``KNOWN_FAILURES``
(``KNOWN_DTYPE_FAILURES`` for one dtype) with a reason; any other failure fails the suite.

Fast by default (the first ``FAST_SAMPLES`` samples of each op); ``MINDUCTOR_OPINFO_FULL=1``
runs every sample. ``MINDUCTOR_OPINFO_DYNAMIC=1`` compiles with ``dynamic=True`` (sizes become
symbols) instead of specializing on them. ``python tests/test_opinfo.py [--full] [--dynamic]
[--dtype NAME] [op names...]`` prints a report instead of asserting: pass rate over (op, sample)
pairs and each failure.

The dtype is float32 unless ``MINDUCTOR_OPINFO_DTYPE`` (or the report's ``--dtype``) names another
(``bfloat16``, ``float16``, ``int64``, ``bool``, ...); the ops are those supporting it on CPU.
float16/bfloat16 results are compared with assert_close's tolerances for the dtype, and a
mismatch is judged against a float64 reference: eager rounds after every op while a fused kernel
computes in float32 and rounds once at the store, so the compiled result may differ from eager's
as long as it is about as close to the exact answer (see ``_as_close_to_fp64_as_eager``).
"""
from __future__ import annotations

import copy
import itertools
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

from minductor import config, metrics

pytest.importorskip("expecttest", reason="the OpInfo database imports expecttest")
from torch.testing._internal.common_methods_invocations import op_db

FULL = os.environ.get("MINDUCTOR_OPINFO_FULL", "") not in ("", "0")
DYNAMIC = os.environ.get("MINDUCTOR_OPINFO_DYNAMIC", "") not in ("", "0")
# fast mode: samples per op, and more for the op families issue 4 is about
FAST_SAMPLES = 1
FOCUS_SAMPLES = 3
FOCUS = re.compile(r"index|gather|take|embedding|pool|pad|where|masked_fill|clamp|tril|triu|nan_to_num|flip|div|"
                   r"remainder|fmod|bitwise|shift|getitem|^(to|bool|byte|char|short|int|long|half|bfloat16|double)$")


def dtype_named(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


DTYPE = dtype_named(os.environ.get("MINDUCTOR_OPINFO_DTYPE", "float32"))
LOW_PRECISION = (torch.float16, torch.bfloat16)

# Results with unspecified values: compare shape, dtype and device only.
UNDEFINED_VALUES = frozenset({
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
})

# op name -> why it fails. Reviewed: each entry names the cause; keep it short and true.
KNOWN_FAILURES: dict[str, str] = {
}
# The same, under dynamic shapes only: failures of Dynamo's (they fail with backend="eager" too).
KNOWN_DYNAMIC_FAILURES: dict[str, str] = {
    "cov": "with aweights (full samples): Dynamo's fake run calls numel() on a tensor of symbolic sizes",
    "max_pool2d_with_indices_backward": "Dynamo's fake run passes a SymInt kernel_size where the op takes int[2]",
}
# dtype -> op name -> why it fails in that dtype (besides KNOWN_FAILURES)
KNOWN_DTYPE_FAILURES: dict[torch.dtype, dict[str, str]] = {
    torch.float16: {
        "addcdiv": "Dynamo splits addcdiv(..., value=) into div, mul and add, each rounded to half (aot_eager too)",
    },
    torch.bfloat16: {
        "addcdiv": "Dynamo splits addcdiv(..., value=) into div, mul and add, each rounded to bfloat16 (aot_eager too)",
    },
}


def known_failures(dtype: torch.dtype) -> dict[str, str]:
    return KNOWN_FAILURES | KNOWN_DTYPE_FAILURES.get(dtype, {}) | (KNOWN_DYNAMIC_FAILURES if DYNAMIC else {})


def op_key(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def ops_for(dtype: torch.dtype) -> list[Any]:
    return [op for op in op_db if dtype in op.supported_dtypes("cpu")]


def samples(op: Any, full: bool, dtype: torch.dtype) -> Iterator[Any]:
    gen = op.sample_inputs("cpu", dtype, requires_grad=False)
    if full:
        return iter(gen)
    return itertools.islice(gen, FOCUS_SAMPLES if FOCUS.search(op.name) else FAST_SAMPLES)


def _call(op: Any) -> Callable[..., Any]:
    def fn(inp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return op.op(inp, *args, **kwargs)

    return fn


def _clone(sample: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A fresh copy of the sample's arguments (some ops write into their inputs)."""
    args = (sample.input, tuple(sample.args), dict(sample.kwargs))
    try:
        return copy.deepcopy(args)
    except NotImplementedError:  # sparse tensors have no storage to copy
        return pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, args)


def _compare(key: str, actual: Any, expected: Any) -> None:
    if key in UNDEFINED_VALUES:
        a_leaves, e_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
        assert len(a_leaves) == len(e_leaves)
        for a, e in zip(a_leaves, e_leaves):
            if isinstance(e, torch.Tensor):
                assert (a.shape, a.dtype, a.device) == (e.shape, e.dtype, e.device), (a.shape, e.shape)
        return
    torch.testing.assert_close(actual, expected, equal_nan=True)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def run_both(op: Any, sample: Any, run: Callable[[Callable[..., Any], Any], Any],
             skip: Callable[[Any], bool] = lambda expected: False) -> Any:
    """``run(fn, args)`` with eager's op and with the compiled one, each on its own copy of the
    sample: (expected, actual, eager's args, compiled args); None when eager rejects the sample
    (or ``skip(expected)``), a message when the compiled run raises."""
    fn = _call(op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager_args, compiled_args = _clone(sample), _clone(sample)
        torch.manual_seed(0)
        try:
            expected = run(fn, eager_args)
        except Exception:  # noqa: BLE001
            return None  # a sample eager rejects says nothing about us
        if skip(expected):
            return None
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="minductor", dynamic=DYNAMIC)
        torch.manual_seed(0)
        try:
            with config.patch(fallback_random=True):
                actual = run(compiled, compiled_args)
        except Exception as e:  # noqa: BLE001 - every failure is reported with its type
            return f"{type(e).__name__}: {_first_line(str(e))}"
    return expected, actual, eager_args, compiled_args


def check_sample(op: Any, sample: Any, dtype: torch.dtype) -> str | None:
    """None if the compiled op matches eager on ``sample`` (or eager itself raises):
    results, and the arguments afterwards (for ops that write into them)."""
    key = op_key(op)
    result = run_both(op, sample, lambda fn, args: fn(*args))
    if not isinstance(result, tuple):
        return result
    expected, actual, eager_args, compiled_args = result
    try:
        _compare(key, actual, expected)
        _compare(key, _tensors(compiled_args), _tensors(eager_args))
    except AssertionError as e:
        if dtype not in LOW_PRECISION:
            return f"mismatch: {_first_line(str(e), 300)}"
        return _as_close_to_fp64_as_eager(op, sample, dtype, (actual, _tensors(compiled_args)),
                                          (expected, _tensors(eager_args)))
    return None


def _results_and_args(fn: Callable[..., Any], args: Any) -> tuple[Any, list[torch.Tensor]]:
    return fn(*args), _tensors(args)


def _as_close_to_fp64_as_eager(op: Any, sample: Any, dtype: torch.dtype, actual: Any, expected: Any,
                               run: Callable[[Callable[..., Any], Any], Any] = _results_and_args) -> str | None:
    """None if every ``dtype`` tensor of ``actual`` (by default results, then arguments: what
    ``run(fn, args)`` returns) is at most about as far from a float64 reference as eager's: within
    twice eager's error plus one ulp of ``dtype``, elementwise; other tensors must still match
    eager. The reference is ``run`` with eager's op on the sample with its ``dtype`` tensors upcast
    to float64."""
    def upcast(t: torch.Tensor) -> torch.Tensor:
        # detached, so that a leaf that requires grad stays one
        return t.detach().double().requires_grad_(t.requires_grad) if t.dtype == dtype else t

    args = pytree.tree_map_only(torch.Tensor, upcast, _clone(sample))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            reference = run(_call(op), args)
    except Exception as e:  # noqa: BLE001
        return f"mismatch, and no float64 reference: {type(e).__name__}: {_first_line(str(e))}"
    leaves = [pytree.tree_leaves(tree) for tree in (actual, expected, reference)]
    if len(set(map(len, leaves))) != 1:
        return "mismatch: the float64 reference has other outputs"
    try:
        for i, (a, e, r) in enumerate(zip(*leaves)):
            if isinstance(e, torch.Tensor) and e.dtype == dtype and isinstance(r, torch.Tensor):
                _check_error_bound(a, e, r, dtype, f"tensor {i}")
            else:
                torch.testing.assert_close(a, e, equal_nan=True)
    except AssertionError as e:
        return f"mismatch: {_first_line(str(e), 300)}"
    return None


def _check_error_bound(actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype,
                       what: str) -> None:
    """|actual - reference| <= 2 |expected - reference| + one ulp of ``dtype`` at the reference,
    elementwise (equal values, NaNs included, always pass)."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    a, e, r = (t.double() for t in (actual, expected, reference.to(dtype)))
    ulp = torch.finfo(dtype).eps * r.abs().clamp_min(torch.finfo(dtype).tiny)
    bound = 2 * (e - reference).abs() + ulp
    ok = (a == e) | (a.isnan() & e.isnan()) | ((a - reference).abs() <= bound)
    if not ok.all():
        i = (~ok).nonzero()[0].tolist()
        worst = ((a - reference).abs() - bound).nan_to_num(float("inf")).max().item()
        raise AssertionError(f"{what}: {int((~ok).sum())}/{ok.numel()} elements farther from float64 than eager's "
                             f"(by up to {worst:.3g}); at {i}: compiled {a[tuple(i)].item()}, eager "
                             f"{e[tuple(i)].item()}, float64 {reference.double()[tuple(i)].item()}")


def _first_line(text: str, limit: int = 200) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    summary = " | ".join(lines[:3])
    return summary[:limit]


def check_op(op: Any, full: bool, dtype: torch.dtype = DTYPE) -> tuple[int, list[str]]:
    """(samples run, failure messages) for ``op`` on ``dtype`` samples."""
    count, failures = 0, []
    for i, sample in enumerate(samples(op, full, dtype)):
        count += 1
        error = check_sample(op, sample, dtype)
        if error is not None:
            failures.append(f"sample {i}: {error}")
    return count, failures


OPS = ops_for(DTYPE)


@pytest.mark.parametrize("op", OPS, ids=op_key)
def test_op_matches_eager(op: Any) -> None:
    key = op_key(op)
    _, failures = check_op(op, FULL)
    known = known_failures(DTYPE)
    if failures and key in known:
        pytest.xfail(known[key])
    assert not failures, f"{key} fails (add it to KNOWN_FAILURES with a reason, or fix it):\n" + "\n".join(failures)


# A few ops in each other dtype the whole database was swept in (MINDUCTOR_OPINFO_DTYPE), among
# them ops those sweeps found wrong.
OTHER_DTYPES: dict[torch.dtype, list[str]] = {
    torch.bfloat16: ["mul", "sum", "softmax", "nn.functional.gelu", "signbit", "_batch_norm_with_update"],
    torch.float16: ["div.no_rounding_mode", "mean", "nn.functional.layer_norm", "signbit", "_batch_norm_with_update"],
    torch.int64: ["remainder", "floor_divide", "cumsum", "copysign", "nn.functional.hardtanh", "linspace"],
    torch.int32: ["bitwise_left_shift", "sum", "copysign", "nn.functional.hardtanh"],
    torch.bool: ["logical_xor", "any", "where", "copysign"],
}


@pytest.mark.parametrize("dtype, key", [(d, k) for d, keys in OTHER_DTYPES.items() for k in keys],
                         ids=lambda v: str(v).removeprefix("torch."))
def test_op_matches_eager_in_other_dtypes(dtype: torch.dtype, key: str) -> None:
    op = next(op for op in op_db if op_key(op) == key)
    assert dtype in op.supported_dtypes("cpu")
    _, failures = check_op(op, FULL, dtype)
    assert not failures, f"{key} fails in {dtype}:\n" + "\n".join(failures)


def test_known_failures_name_real_ops() -> None:
    names = {op_key(op) for op in OPS}
    names = {op_key(op) for op in OPS}
    listed = set(KNOWN_FAILURES) | set(KNOWN_DYNAMIC_FAILURES)
    assert not listed - names, sorted(listed - names)
    for dtype, known in KNOWN_DTYPE_FAILURES.items():
        assert not set(known) - {op_key(op) for op in ops_for(dtype)}, (dtype, sorted(known))


def _report(argv: list[str]) -> None:
    global DYNAMIC
    config.strict = True  # (an internal error is a failure, not a fallback)
    full = "--full" in argv or FULL
    DYNAMIC = "--dynamic" in argv or DYNAMIC
    dtype = DTYPE
    if "--dtype" in argv:
        at = argv.index("--dtype")
        dtype = dtype_named(argv[at + 1])
        argv = argv[:at] + argv[at + 2:]
    wanted = {a for a in argv if not a.startswith("--")}
    ops = [op for op in ops_for(dtype) if not wanted or op_key(op) in wanted or op.name in wanted]
    print(f"dtype {dtype}", flush=True)
    total = passed = 0
    start = time.perf_counter()
    fallbacks: dict[str, set[str]] = {}
    for op in ops:
        t0 = time.perf_counter()
        metrics.reset()
        count, failures = check_op(op, full, dtype)
        for name in metrics.fallback_ops:
            fallbacks.setdefault(name, set()).add(op_key(op))
        total += count
        passed += count - len(failures)
        status = "ok" if not failures else ("known" if op_key(op) in known_failures(dtype) else "FAIL")
        print(f"{status:5} {op_key(op)} [{count - len(failures)}/{count}] {time.perf_counter() - t0:.1f}s", flush=True)
        for f in failures:
            print(f"      {f}", flush=True)
    print("aten fallbacks (aten op: OpInfo ops that hit it):")
    for name, users in sorted(fallbacks.items(), key=lambda kv: -len(kv[1])):
        print(f"  {name}: {len(users)}: {' '.join(sorted(users)[:8])}")
    print(f"passed {passed}/{total} (op, sample) pairs = {100.0 * passed / max(total, 1):.2f}% "
          f"in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    _report(sys.argv[1:])
