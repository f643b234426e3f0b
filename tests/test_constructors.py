"""Constructor lowerings against eager (full, zeros, ones, arange, empty, *_like, scalar_tensor),
alone and combined with inputs of every layout.
"""
from __future__ import annotations

import pytest
import torch
from conftest import LAYOUT_NAMES, check, check_named, make

F32, F64, I32, I64, BOOL = torch.float32, torch.float64, torch.int32, torch.int64, torch.bool


def test_constructors_alone() -> None:
    """Graphs that only build tensors (the input is unused but keeps the graph alive)."""
    check_named({
        "full": lambda x: torch.full((3, 4), 2.5),
        "full_int": lambda x: torch.full((3, 4), 7),
        "full_bool": lambda x: torch.full((2, 3), True),
        "full_dtype": lambda x: torch.full((5,), -1, dtype=F64),
        "full_0d": lambda x: torch.full((), 3.0),
        "full_inf_nan": lambda x: torch.cat([torch.full((2,), float("inf")), torch.full((2,), float("nan"))]),
        "full_big_int": lambda x: torch.full((2,), 2**40 + 1),
        "zeros": lambda x: torch.zeros(2, 3),
        "zeros_int": lambda x: torch.zeros(2, 3, dtype=I32),
        "ones": lambda x: torch.ones(4),
        "ones_bool": lambda x: torch.ones(3, 1, dtype=BOOL),
        "zeros_empty": lambda x: torch.zeros(0, 3),
        "arange_end": lambda x: torch.arange(7),
        "arange_start": lambda x: torch.arange(-3, 5),
        "arange_step": lambda x: torch.arange(1, 20, 3),
        "arange_neg_step": lambda x: torch.arange(10, -5, -3),
        "arange_float_step": lambda x: torch.arange(0, 1, 0.1),
        "arange_float_start": lambda x: torch.arange(-1.5, 2.0, 0.25),
        "arange_float_end": lambda x: torch.arange(5.5),
        "arange_dtype": lambda x: torch.arange(0, 10, 2, dtype=F64),
        "arange_i32": lambda x: torch.arange(5, dtype=I32),
        "linspace": lambda x: torch.linspace(-1, 1, 9),
        "eye": lambda x: torch.eye(3, 4),
        "scalar_tensor": lambda x: torch.scalar_tensor(3.5),
        "scalar_tensor_int": lambda x: torch.scalar_tensor(3, dtype=I64),
        "tensor_literal": lambda x: torch.tensor([1.0, -2.0, 3.0]),
        "tensor_literal_0d": lambda x: torch.tensor(5),
    }, torch.randn(2))


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_constructors_with_inputs(layout: str) -> None:
    """*_like and shape-derived constructors on every input layout, combined with the input."""
    x = make(layout, F32)
    i = make(layout, I64, seed=1)
    check_named({
        "zeros_like": lambda x, i: torch.zeros_like(x) + x,
        "ones_like": lambda x, i: torch.ones_like(x) * x,
        "full_like": lambda x, i: torch.full_like(x, 2.5) - x,
        "full_like_int": lambda x, i: torch.full_like(i, -3) * i,
        "full_like_dtype": lambda x, i: torch.full_like(x, 7, dtype=I32),
        "zeros_like_bool": lambda x, i: torch.zeros_like(x, dtype=BOOL) | (x > 0),
        "ones_like_returned": lambda x, i: torch.ones_like(x),
        "zeros_like_int_returned": lambda x, i: torch.zeros_like(i),
        "full_shape_of_input": lambda x, i: torch.full(x.shape, 0.5) + x,
        "arange_broadcast": lambda x, i: x + torch.arange(x.shape[-1]) if x.dim() else x + torch.arange(1),
        "arange_float_mul": lambda x, i: x.reshape(-1) * torch.arange(0.0, x.numel() * 0.5, 0.5),
        "arange_int_add": lambda x, i: i.reshape(-1) + torch.arange(i.numel()),
        "scalar_tensor_add": lambda x, i: x + torch.scalar_tensor(1.5),
        "scalar_tensor_int_promote": lambda x, i: i + torch.scalar_tensor(2, dtype=I64),
        "scalar_tensor_f64_0d": lambda x, i: i * torch.scalar_tensor(0.5, dtype=F64),
        "where_with_zeros": lambda x, i: torch.where(x > 0, x, torch.zeros_like(x)),
        "ones_new": lambda x, i: x.new_ones(3) * 2,
        "new_zeros_int": lambda x, i: x.new_zeros((2, 2), dtype=I64) + 1,
        "new_full": lambda x, i: x.new_full((2,), 4.0),
        "cat_with_full": lambda x, i: torch.cat([x.reshape(-1), torch.full((3,), -1.0)]),
        "stack_with_ones": lambda x, i: torch.stack([x, torch.ones_like(x)]),
        "sum_with_arange": lambda x, i: (x.reshape(-1) * torch.arange(x.numel())).sum(),
    }, x, i)


def test_arange_int64_dtype_with_float_args() -> None:
    """Eager converts the bounds to the integer type first: arange(0.5, 6.5, 1.5, dtype=int64) is 0..5."""
    check(lambda x: (torch.arange(0.5, 6.5, 1.5, dtype=I64) + x, torch.arange(-2.7, 5.9, 2.2, dtype=torch.int32) + x),
          torch.tensor(0))


def test_linspace_integer_dtypes() -> None:
    """Eager converts the bounds to the integer type (truncated, uint8's wrapped) and steps in
    double, counting the second half back from the end; bounds from 0-d tensor inputs too."""
    U8 = torch.uint8
    check_named({
        "i64": lambda s, e: torch.linspace(4.3, -3, 50, dtype=I64),
        "i64_to_zero": lambda s, e: torch.linspace(4.3, 0, 50, dtype=I64),
        "i64_halves": lambda s, e: torch.linspace(0, 7, 50, dtype=I64),
        "i32": lambda s, e: torch.linspace(-9.7, 55.5, 101, dtype=I32),
        "u8_wrapped": lambda s, e: torch.linspace(4.3, -3, 9, dtype=U8),
        "tensor_bounds": lambda s, e: torch.linspace(s, e, 50, dtype=I64),
        "tensor_start": lambda s, e: torch.linspace(s, 0, 50, dtype=I32),
    }, torch.tensor(4.3), torch.tensor(-3.0), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linspace_half_dtypes_round_as_eager(dtype: torch.dtype) -> None:
    """Eager's half and bfloat16 linspace computes in the dtype: bounds, step, index and each
    product and sum rounded (a float computation rounded once differed from it in most of these
    ranges); Python bounds, 0-d tensor bounds, and both halves of the range."""
    import random

    random.seed(0)
    for _ in range(25):
        s, e, n = random.uniform(-10, 10), random.uniform(-30, 30), random.randint(2, 60)
        torch._dynamo.reset()
        got = torch.compile(lambda: torch.linspace(s, e, n, dtype=dtype), backend="minductor")()
        assert torch.equal(got, torch.linspace(s, e, n, dtype=dtype)), (s, e, n)
    fn = lambda a, b: torch.linspace(a, b, 37, dtype=dtype)  # noqa: E731
    a, b = torch.tensor(-4.7), torch.tensor(21.3)
    assert torch.equal(torch.compile(fn, backend="minductor")(a, b), fn(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logspace_rounds_bounds_as_eager(dtype: torch.dtype) -> None:
    """Eager's logspace rounds the bounds and their difference to the dtype and computes the
    exponents and the power in double (the unrounded bounds missed eager by up to 4 float32 ulp
    in most ranges, and by a bfloat16 step at 20480); Python and 0-d tensor bounds, both halves."""
    import random

    random.seed(0)
    for _ in range(20):
        s, e, n = random.uniform(-4, 4), random.uniform(-4, 4.3), random.randint(2, 40)
        base = random.choice([10.0, 2.0, 1.5, 7.3])
        torch._dynamo.reset()
        fn = lambda s=s, e=e, n=n, base=base: torch.logspace(s, e, n, base=base, dtype=dtype)
        assert torch.equal(torch.compile(fn, backend="minductor")(), fn()), (s, e, n, base)
    fn = lambda a, b: torch.logspace(a, b, 37, dtype=dtype)
    a, b = torch.tensor(-1.37), torch.tensor(4.31)
    assert torch.equal(torch.compile(fn, backend="minductor")(a, b), fn(a, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_full_holds_the_rounded_value(dtype: torch.dtype) -> None:
    """A half or bfloat16 ``full`` holds its value rounded to the dtype, also where a kernel
    computes on it as a float before storing (-7.3127 is -7.3125 in bfloat16)."""
    fn = lambda x: (torch.full((4,), -7.312715117751976, dtype=dtype).float() * x, torch.full((3,), 0.1, dtype=dtype))  # noqa: E731
    x = torch.randn(4)
    for got, want in zip(torch.compile(fn, backend="minductor")(x), fn(x)):
        assert torch.equal(got, want), (got, want)


def test_empty_shape_and_dtype_only() -> None:
    fn = lambda x: (torch.empty(3, 4), torch.empty_like(x), torch.empty((2,), dtype=I64),
                    torch.empty_like(x, dtype=BOOL), x.new_empty((5, 1)), torch.empty_strided((2, 3), (1, 2)))
    x = make("transposed", F32)
    out = torch.compile(fn, backend="minductor")(x)
    ref = fn(x)
    assert len(out) == len(ref)
    for got, want in zip(out, ref):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)


def test_empty_then_filled() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        y.fill_(3.0)
        z = torch.empty(4, 6)
        z.copy_(x * 2)
        return y + z

    check(fn, make("sliced", F32))


def test_arange_float_step_length_and_values() -> None:
    """Float steps whose length eager computes with ceil((end - start) / step) in double."""
    check(lambda x: (torch.arange(0, 1, 0.1) + x, torch.arange(1, 2.2, 0.3) * x, torch.arange(-1, 1, 1 / 3) + x,
                     torch.arange(0, 0.3, 0.1, dtype=F32), torch.arange(0, 0.3, 0.1, dtype=F64)), torch.tensor(0.0))


def test_arange_large_values() -> None:
    check(lambda x: (torch.arange(2**31 - 3, 2**31 + 2), torch.arange(2**24, 2**24 + 5, dtype=F32) + x,
                     torch.arange(0, 2**40, 2**38)), torch.tensor(0.0))


def test_full_with_python_scalar_input() -> None:
    """A fill value read from a 0-d tensor input (item) and from the input's shape."""
    x = make("contiguous", F32)
    check(lambda x: (torch.full_like(x, 3) + x.sum(), torch.zeros(x.shape[0], x.shape[1] * 2) + x.repeat(1, 2)), x)


def test_constructor_dtypes_follow_defaults() -> None:
    check(lambda x: (torch.full((2,), 1), torch.full((2,), 1.0), torch.full((2,), True), torch.arange(3.0),
                     torch.arange(3), torch.zeros(2, dtype=F64) + x, torch.ones(2, dtype=I32) + 1.5,
                     torch.ones(2, dtype=BOOL) + torch.ones(2, dtype=BOOL)), torch.tensor(1.0))


def test_tril_triu_masks_from_arange() -> None:
    """Causal masks built from arange comparisons and ones().tril()."""
    x = torch.randn(5, 5)
    check(lambda x: (x.masked_fill(torch.arange(5)[None, :] > torch.arange(5)[:, None], float("-inf")),
                     torch.ones(5, 5, dtype=BOOL).tril() & (x > 0), torch.ones(5, 5).triu(1) * x,
                     torch.tril(x, -1), torch.triu(x, 2)), x)
