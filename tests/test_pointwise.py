"""Pointwise lowerings against eager: unary math, binary math, comparisons, logical/bitwise ops,
where, clamp, dtype conversion and Python-scalar operands, with PyTorch's type promotion and
broadcasting.

To keep g++ compiles few, an op is usually applied to every input layout (contiguous,
transposed, sliced, expanded, 0-d, size-1) inside one compiled graph.
"""
from __future__ import annotations

import operator
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LAYOUT_NAMES, check, check_named, make

from minductor import config

F32, F64, I32, I64, BOOL = torch.float32, torch.float64, torch.int32, torch.int64, torch.bool
NAN, INF = float("nan"), float("inf")


# ---------------------------------------------------------------------------------------- unary

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.25),
    "sqrt": lambda x: x.abs().sqrt(),
    "rsqrt": lambda x: (x.abs() + 0.25).rsqrt(),
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "abs": torch.abs,
    "neg": torch.neg,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "trunc": torch.trunc,
    "sign": torch.sign,
    "reciprocal": lambda x: (x.abs() + 0.25).reciprocal(),
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": F.elu,
    "silu": F.silu,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 1.5),
    "expm1": torch.expm1,
    "log1p": lambda x: x.abs().log1p(),
}


SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5]


@pytest.mark.parametrize("layout", [*LAYOUT_NAMES, "special"])
def test_unary(layout: str) -> None:
    """One graph per input: every unary op on one float32 layout, or on special values (NaN, +-inf, +-0,
    large magnitudes; sign is left out there, see test_sign_nan)."""
    x = torch.tensor(SPECIAL) if layout == "special" else make(layout, F32)
    names = [n for n in UNARY if not (layout == "special" and n in ("sign", "gelu"))]
    check_named({n: UNARY[n] for n in names}, x)
    if layout == "special":  # eager's vectorized CPU gelu returns NaN for +inf; x * Phi(x) is +inf there, as ours
        finite = x[~x.isposinf()]
        check(F.gelu, finite)
        assert torch.compile(F.gelu, backend="minductor")(torch.tensor([INF])).item() == INF


@pytest.mark.parametrize("layout", ["transposed", "scalar"])
def test_unary_float64(layout: str) -> None:
    check_named(UNARY, make(layout, F64))


def test_sign_nan() -> None:
    """sign(NaN) is 0 in eager's CPU kernels, and so in ours."""
    check(lambda x: (torch.sign(x), torch.sgn(x)), torch.full((67,), NAN))


def test_round() -> None:
    """Round half to even, and round(decimals=)."""
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 1e7 + 0.5, 0.49999997, 1.2345, -2.5678, 0.125, 12.5])
    check(lambda x: (torch.round(x), torch.round(x.double()), torch.round(x, decimals=2)), x)


@pytest.mark.parametrize("dtype", [I32, I64], ids=["i32", "i64"])
def test_unary_int(dtype: torch.dtype) -> None:
    ops = {"abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "relu": torch.relu,
           "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
           "square": torch.square}
    names = sorted(ops)
    for layout in ("contiguous", "sliced"):
        check(lambda x: tuple(ops[n](x) for n in names), make(layout, dtype))


@pytest.mark.parametrize("dtype", [I64, BOOL], ids=["i64", "bool"])
def test_float_unary_on_int_promotes(dtype: torch.dtype) -> None:
    """exp/sin/sqrt/sigmoid of an int or bool tensor compute in the default float dtype."""
    x = make("contiguous", dtype, low=0, high=5)
    check(lambda x: (x.exp(), x.sin(), x.sqrt(), x.sigmoid(), x.reciprocal(), torch.erf(x), x.rsqrt()), x)


def test_abs_neg_int_min() -> None:
    x = torch.tensor([-2**31, 2**31 - 1, 0], dtype=I32)
    check(lambda x: (x.abs(), -x), x)


# ---------------------------------------------------------------------------------------- binary

PAIRS = [  # (layout of a, layout of b): every pair broadcasts to (4, 6)
    ("contiguous", "contiguous"),
    ("transposed", "sliced"),
    ("expanded", "contiguous"),
    ("contiguous", "scalar"),
    ("scalar", "transposed"),
    ("size1", "sliced"),
]


def pair_inputs(i: int, da: torch.dtype, db: torch.dtype, *, low: int = -9, high: int = 10,
                nonzero_b: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs of the i-th layout pair in PAIRS (b has no zeros if ``nonzero_b``)."""
    la, lb = PAIRS[i % len(PAIRS)]
    b = make(lb, db, seed=100 + i, low=low, high=high)
    if nonzero_b:
        b = torch.where(b == 0, torch.ones_like(b), b)
    return make(la, da, seed=i, low=low, high=high), b


def on_pairs(op: Callable[[torch.Tensor, torch.Tensor], Any], da: torch.dtype, db: torch.dtype,
             *, low: int = -9, high: int = 10, nonzero_b: bool = False, **tol: Any) -> None:
    """One graph applying ``op`` to every layout pair."""
    args = [t for i in range(len(PAIRS)) for t in pair_inputs(i, da, db, low=low, high=high, nonzero_b=nonzero_b)]
    check(lambda *xs: tuple(op(xs[j], xs[j + 1]) for j in range(0, len(xs), 2)), *args, **tol)


def on_dtype_combos(ops: dict[str, Callable[..., Any]], combos: list[tuple[torch.dtype, torch.dtype]],
                    *, low: int = -9, high: int = 10) -> None:
    """One graph: every op on every dtype combination, the layout pair rotating with the combination."""
    args: list[torch.Tensor] = []
    fns = {}
    for i, (da, db) in enumerate(combos):
        args += pair_inputs(i, da, db, low=low, high=high)
        for name, op in ops.items():
            fns[f"{name}[{da}, {db}, {PAIRS[i % len(PAIRS)]}]"] = lambda *a, op=op, k=2 * i: op(a[k], a[k + 1])
    check_named(fns, *args)


BINARY_FLOAT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5),
    "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=-3),
    "mul": torch.mul,
    "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floordiv_op": lambda a, b: a // b,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": lambda a, b: torch.pow(a.abs() + 0.1, b),
    "pow_neg_base": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "atan2": torch.atan2,
}


@pytest.mark.parametrize("pair", range(len(PAIRS)), ids=["-".join(p) for p in PAIRS])
def test_binary_float32(pair: int) -> None:
    a, b = pair_inputs(pair, F32, F32, nonzero_b=True)
    check_named({n: op for n, op in BINARY_FLOAT.items()}, a, b)


@pytest.mark.parametrize("dtypes", [(F32, F64), (I64, F32), (F64, I32)], ids=["f32_f64", "i64_f32", "f64_i32"])
def test_binary_float_mixed_dtypes(dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    names = sorted(BINARY_FLOAT)
    a = make("transposed", dtypes[0])
    b = make("contiguous", dtypes[1], seed=3)
    b = torch.where(b == 0, torch.ones_like(b), b)
    check(lambda a, b: tuple(BINARY_FLOAT[n](a, b) for n in names), a, b)


BINARY_INT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=3),
    "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": torch.mul,
    "true_div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floordiv_op": lambda a, b: a // b,
    "remainder": torch.remainder,
    "mod_op": lambda a, b: a % b,
    "fmod": torch.fmod,
    "pow": lambda a, b: torch.pow(a, b.abs() % 4),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}


@pytest.mark.parametrize("dtype", [I64, I32], ids=["i64", "i32"])
def test_binary_int_negative_values(dtype: torch.dtype) -> None:
    names = sorted(BINARY_INT)
    on_pairs(lambda a, b: tuple(BINARY_INT[n](a, b) for n in names), dtype, dtype, nonzero_b=True)


def test_binary_int_mixed_widths() -> None:
    names = sorted(BINARY_INT)
    a = make("contiguous", I32)
    b = make("sliced", I64, seed=7)
    b = torch.where(b == 0, torch.ones_like(b), b)
    check(lambda a, b: tuple(BINARY_INT[n](a, b) for n in names), a, b)


def test_int_division_exact_edges() -> None:
    """Floor/trunc division and remainder where the quotient is exact or the signs differ."""
    a = torch.tensor([7, -7, 7, -7, 6, -6, 0, 1, -1, 2**40 + 1, -(2**40) - 1], dtype=I64)
    b = torch.tensor([2, 2, -2, -2, 3, 3, 5, -5, 5, 3, 7], dtype=I64)
    check(lambda a, b: (a // b, torch.div(a, b, rounding_mode="trunc"), a % b, torch.fmod(a, b), a / b), a, b)


@pytest.mark.parametrize("op", ["floordiv", "trunc", "remainder", "fmod"])
def test_int_division_by_zero_raises(op: str) -> None:
    fn = {
        "floordiv": lambda a, b: a // b,
        "trunc": lambda a, b: torch.div(a + 1, b, rounding_mode="trunc"),
        "remainder": lambda a, b: torch.remainder(a * 2, b),
        "fmod": lambda a, b: torch.fmod(a, b),
    }[op]
    a, b = torch.tensor([5, -5]), torch.tensor([1, 0])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    compiled = torch.compile(fn, backend="minductor")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, b)
    b[1] = 3  # the same compiled graph runs once the divisor is nonzero
    torch.testing.assert_close(compiled(a, b), fn(a, b))


_INT_MIN_DIV = """
import torch
for dtype in (torch.int32, torch.int64):
    lo = torch.iinfo(dtype).min
    a, b = torch.tensor([lo, 7, lo, 9], dtype=dtype), torch.tensor([-1, -1, 3, -1], dtype=dtype)
    fn = lambda a, b: (a // b, torch.div(a, b, rounding_mode="trunc"), a % b, torch.fmod(a, b))
    got = torch.compile(fn, backend="minductor")(a, b)
    # eager's trunc division itself dies with SIGFPE here; the wrapped results, from Python ints:
    wrap = lambda v: torch.tensor(v, dtype=torch.int64).to(dtype) if dtype == torch.int32 else torch.tensor(
        [(x + 2**63) % 2**64 - 2**63 for x in v], dtype=dtype)
    av, bv = a.tolist(), b.tolist()
    floor = [x // y for x, y in zip(av, bv)]
    trunc = [abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) for x, y in zip(av, bv)]
    rem = [x % y for x, y in zip(av, bv)]
    fmod = [x - t * y for x, y, t in zip(av, bv, trunc)]
    for g, e in zip(got, (floor, trunc, rem, fmod)):
        torch.testing.assert_close(g, wrap([(x + 2**31) % 2**32 - 2**31 for x in e]) if dtype == torch.int32 else wrap(e))
    torch.testing.assert_close(got[0], a // b)  # eager's floor division wraps
"""


def test_int_min_divided_by_minus_one() -> None:
    """INT_MIN // -1 wraps to INT_MIN (no SIGFPE). Run in a subprocess: the failure mode would be
    a crash of the whole interpreter."""
    proc = subprocess.run([sys.executable, "-c", _INT_MIN_DIV], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"returncode {proc.returncode}: {proc.stderr[-2000:]}"


def test_float_division_special_values() -> None:
    a = torch.tensor([1.0, -1.0, 0.0, NAN, INF, -INF, 5.5, -5.5, 7.0, -7.0])
    b = torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0, INF, -2.0, 2.0, INF, -INF])
    check(lambda a, b: (a / b, a // b, torch.div(a, b, rounding_mode="trunc"), torch.remainder(a, b),
                        torch.fmod(a, b)), a, b)


def test_remainder_float_sign() -> None:
    a = torch.tensor([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 1e-8, -1e-8, 6.0, -6.0])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 3.0, 3.0, 3.0, -3.0])
    check(lambda a, b: (torch.remainder(a, b), torch.fmod(a, b), a % 2.5, -a % 2.5), a, b)


def test_pow_variants() -> None:
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0, 3.0, NAN, INF, -INF])
    i = torch.tensor([-3, -1, 0, 1, 2, 5, 2, 3, 3])
    check(lambda x, i: (x ** 2, x ** 3, x ** 0.5, x ** -1, x ** -2, 2 ** x, 0.5 ** x, x ** i, x ** 1.5,
                        x ** 0, i ** 2, 2 ** i.abs(), x.pow(i.float())), x, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_pow_by_constants_multiplies_out(dtype, tmp_path) -> None:
    """Constant exponents multiply out (no libm call, which keeps the whole loop scalar), with
    eager's values and dtypes at signed zeros, infinities and NaN: half's +-0.5 as eager's
    pow, the other dtypes' as its sqrt/rsqrt; an integer tensor to a float power is float."""
    x = torch.cat([torch.tensor([0.0, -0.0, INF, NAN, -INF, 1e-20, -3e4]), torch.randn(200) * 3]).to(dtype)
    exponents = [3, 3.0, -1, -2, -3, 4, 5, 7, 16, -16, -0.5, 0.5, 2, 1, 0, 1.5, 17]
    for b in exponents:
        torch._dynamo.reset()
        got, ref = torch.compile(lambda x, b=b: x ** b, backend="minductor")(x), x ** b
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got, ref, equal_nan=True, msg=lambda m, b=b: f"x ** {b}: {m}")
        zero = ref == 0
        assert torch.equal(got[zero].signbit(), ref[zero].signbit()), b
    i = torch.randint(-5, 5, (100,))
    for b in (3, 2.0, 3.0, -1.0, 0.5):
        torch._dynamo.reset()
        got, ref = torch.compile(lambda i, b=b: i ** b, backend="minductor")(i), i ** b
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got, ref, equal_nan=True)
    if dtype == torch.float32:
        with config.patch(debug=True, debug_dir=str(tmp_path)):
            torch.compile(lambda x: x ** 3 + x ** -2 + x ** -0.5, backend="minductor")(x)
        (source,) = tmp_path.glob("graph_*/cpp_fused_*.cpp")
        assert "mi_pow" not in source.read_text()


def test_float_fmod_remainder_floor_divide_are_exact() -> None:
    """Float fmod and remainder bit for bit as in float64 rounded (exact remainders; eager's own
    float32 fmod returns NaN for some huge quotients, like fmod(1, 1e-45)), floor_divide as
    eager's float32: random bit patterns (every exponent gap, subnormals, infinities, NaN),
    every pair of special values, and ordinary quotients."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (2, 200_000), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3.4e38, -3.4e38, INF, -INF, NAN, 0.7, 2.5, -2.5, 1e-38, 16777216.0])
    a, b = torch.cartesian_prod(special, special).unbind(1)
    u = torch.empty(2, 100_000).uniform_(-100, 100, generator=g)
    a, b = torch.cat([a, bits[0], u[0]]), torch.cat([b, bits[1], u[1] * 0.01])
    got = torch.compile(lambda a, b: (torch.fmod(a, b), torch.remainder(a, b), torch.floor_divide(a, b)), backend="minductor")(a, b)
    refs = (torch.fmod(a.double(), b.double()).float(), torch.remainder(a.double(), b.double()).float(), torch.floor_divide(a, b))
    for value, ref in zip(got, refs):
        assert torch.equal(value.isnan(), ref.isnan())
        assert torch.equal(value[~ref.isnan()].view(torch.int32), ref[~ref.isnan()].view(torch.int32))  # -0 included


def test_pow_int_tensor_int_tensor() -> None:
    a = torch.tensor([2, -3, 0, 1, -1, 7, 10], dtype=I64)
    b = torch.tensor([3, 3, 0, 9, 5, 2, 15], dtype=I64)
    check(lambda a, b: (a ** b, a.int() ** b.int()), a, b)


def test_maximum_minimum_nan_inf() -> None:
    a = torch.tensor([NAN, 1.0, NAN, INF, -INF, 0.0, -0.0, 2.0])
    b = torch.tensor([1.0, NAN, NAN, 1.0, 1.0, -0.0, 0.0, INF])
    check(lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), torch.fmax(a, b), torch.fmin(a, b)), a, b)


def test_relu_nan_inf() -> None:
    x = torch.tensor([NAN, INF, -INF, -0.0, 0.0, -1.0, 1.0])
    check(lambda x: (torch.relu(x), F.relu6(x), F.hardtanh(x), F.leaky_relu(x), F.elu(x), F.silu(x)), x)


def test_atan2_quadrants() -> None:
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, -0.0, INF, NAN])
    b = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, -1.0, -1.0, INF, 1.0])
    check(torch.atan2, a, b)


# ---------------------------------------------------------------------------------- comparisons

COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
           "ge": operator.ge}


def test_comparisons() -> None:
    on_dtype_combos(COMPARE, [(F32, F32), (I64, I64), (I32, F64), (BOOL, BOOL), (BOOL, I64), (F32, I64)],
                    low=-2, high=3)


def test_comparisons_nan_and_scalars() -> None:
    a = torch.tensor([NAN, 1.0, INF, -INF, 0.0, -0.0, 2.5])
    b = torch.tensor([NAN, NAN, INF, 1.0, -0.0, 0.0, 2.5])
    names = sorted(COMPARE)
    check(lambda a, b: tuple(COMPARE[n](a, b) for n in names) + tuple(COMPARE[n](a, 2.5) for n in names)
          + tuple(COMPARE[n](1, a) for n in names), a, b)


def test_int_compare_with_float_scalar() -> None:
    """An int tensor compared against 2.5 must compare in float, not truncate 2.5 to 2."""
    x = torch.arange(-3, 5)
    check(lambda x: (x < 2.5, x == 2.0, x > -0.5, x >= 2.5, x != 2.5, x <= -2.5), x)


# ------------------------------------------------------------------------------ logical / bitwise

LOGICAL = {
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "not_a": lambda a, b: torch.logical_not(a),
}


def test_logical() -> None:
    on_dtype_combos(LOGICAL, [(BOOL, BOOL), (F32, F32), (I64, BOOL), (I32, F64)], low=-1, high=2)


def test_logical_nan_is_true() -> None:
    x = torch.tensor([NAN, 0.0, -0.0, 1.0])
    check(lambda x: (torch.logical_not(x), torch.logical_and(x, x), x.bool(), torch.logical_xor(x, torch.zeros_like(x))), x)


BITWISE = {
    "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
    "not_a": lambda a, b: torch.bitwise_not(a),
    "and_op": lambda a, b: a & b, "or_op": lambda a, b: a | b, "xor_op": lambda a, b: a ^ b,
    "invert_op": lambda a, b: ~a,
}


def test_bitwise() -> None:
    on_dtype_combos(BITWISE, [(I64, I64), (I32, I32), (BOOL, BOOL), (I32, I64), (BOOL, I32), (I64, BOOL)],
                    low=-100, high=100)


@pytest.mark.parametrize("dtype", [I64, I32], ids=["i64", "i32"])
def test_shifts(dtype: torch.dtype) -> None:
    a = make("contiguous", dtype, low=-1000, high=1000)
    s = make("transposed", dtype, seed=1, low=0, high=20)
    check(lambda a, s: (a << s, a >> s, torch.bitwise_left_shift(a, 3), torch.bitwise_right_shift(a, 2),
                        a << 1, a >> 1, 1 << s), a, s)


def test_shift_by_width_or_more() -> None:
    """ATen defines shifts past the bit width (left: 0, right: sign fill); C++ leaves them undefined."""
    a = torch.tensor([5, -5, 1, -1], dtype=I64)
    s = torch.tensor([64, 64, 70, 100], dtype=I64)
    check(lambda a, s: (a << s, a >> s), a, s)


def test_shift_by_width_or_more_int32() -> None:
    a = torch.tensor([5, -5, 1, -1], dtype=I32)
    s = torch.tensor([32, 32, 40, 33], dtype=I32)
    check(lambda a, s: (a << s, a >> s), a, s)


def test_bitwise_with_scalars() -> None:
    x = torch.arange(-8, 8)
    b = x > 0
    check(lambda x, b: (x & 3, 5 | x, x ^ -1, b & True, b | False, b ^ True, ~b, x & b), x, b)


# --------------------------------------------------------------------------------------- where

def test_where_layouts() -> None:
    """where over every pair of layouts, the condition taking the second layout."""
    args = []
    for i, (la, lb) in enumerate(PAIRS):
        args += [make(lb, BOOL, seed=i), make(la, F32, seed=1), make(lb, F32, seed=2)]
    check(lambda *xs: tuple(torch.where(xs[j], xs[j + 1], xs[j + 2]) for j in range(0, len(xs), 3)), *args)


def test_where_mixed_dtypes_and_scalars() -> None:
    c = make("sliced", BOOL)
    i, f, d = make("contiguous", I64), make("transposed", F32), make("expanded", F64)
    check(lambda c, i, f, d: (
        torch.where(c, i, f), torch.where(c, i, 0.5), torch.where(c, 2, i), torch.where(c, 1.5, -1.5),
        torch.where(c, f, d), torch.where(c, True, False), torch.where(c, i.int(), i), torch.where(i > 0, f, 0),
        torch.where(c, f, torch.tensor(3.0, dtype=F64)),
    ), c, i, f, d)


def test_where_nan_branch_not_taken() -> None:
    x = torch.tensor([-1.0, 0.0, 4.0, 9.0])
    check(lambda x: torch.where(x > 0, x.sqrt(), torch.zeros_like(x)), x)


def test_masked_fill() -> None:
    x = make("transposed", F32)
    check(lambda x: (x.masked_fill(x > 0, -INF), x.masked_fill(x < 0, 0), x.long().masked_fill(x < 0, 7)), x)


# --------------------------------------------------------------------------------------- clamp

def test_clamp_scalars() -> None:
    xs = [make(n, F32) for n in LAYOUT_NAMES]
    check(lambda *xs: tuple(t for x in xs for t in (x.clamp(-0.5, 0.5), x.clamp(min=0.1), x.clamp(max=-0.1),
                                                      x.clamp_min(0), x.clamp_max(1), x.clamp(1, -1))), *xs)


def test_clamp_tensors() -> None:
    x = make("contiguous", F32)
    lo = make("sliced", F32, seed=3) - 1
    hi = make("scalar", F32, seed=4).abs() + 0.5
    check(lambda x, lo, hi: (x.clamp(lo, hi), x.clamp(min=lo), x.clamp(max=hi), torch.clamp(x, lo, lo + 0.1),
                             torch.maximum(torch.minimum(x, hi), lo)), x, lo, hi)


def test_clamp_int_and_promotion() -> None:
    i = make("transposed", I64)
    check(lambda i: (i.clamp(-3, 3), i.clamp(min=0), i.clamp(-2.5, 2.5), i.clamp(max=1.5), i.int().clamp(0, 4)), i)


def test_clamp_nan_inf() -> None:
    x = torch.tensor([NAN, INF, -INF, 0.3, -0.3, 2.0])
    lo = torch.tensor([0.0, NAN, 0.0, NAN, -1.0, 0.0])
    check(lambda x, lo: (x.clamp(-1, 1), x.clamp(min=0), x.clamp(max=0), x.clamp(lo, torch.tensor(1.0)), x.clamp(min=lo),
                         F.hardtanh(x), x.clamp(-INF, INF)), x, lo)


def test_clamp_nan_bound() -> None:
    x = torch.tensor([0.3, -0.3, 2.0])
    check(lambda x: (x.clamp(min=NAN), x.clamp(max=NAN)), x)


# ----------------------------------------------------------------------------- dtype conversion

@pytest.mark.parametrize("src", [F32, F64, I64, I32, BOOL], ids=["f32", "f64", "i64", "i32", "bool"])
def test_to_dtype(src: torch.dtype) -> None:
    x = make("transposed", src) * (3 if src != BOOL else 1)
    targets = [F32, F64, I64, I32, BOOL, torch.int8, torch.uint8, torch.float16]
    check(lambda x: tuple(x.to(d) for d in targets) + (x.to(F32).to(I32) + 1,), x)


def test_to_dtype_float_to_int_truncates_and_bool_of_nan() -> None:
    x = torch.tensor([-2.7, -0.5, -0.0, 0.5, 2.7, 1e-40, NAN])
    check(lambda x: (x[:-1].to(I64), x[:-1].to(I32), x.to(BOOL), x.double().to(BOOL), x[:-1].int().to(BOOL)), x)


def test_to_dtype_int_narrowing_wraps() -> None:
    x = torch.tensor([2**31, 2**32 + 5, -(2**31) - 1, 300, -129], dtype=I64)
    check(lambda x: (x.to(I32), x.to(torch.int8), x.to(torch.uint8), x.to(F32), x.to(F64)), x)


def test_type_as_and_double_roundtrip() -> None:
    x = torch.randn(5, 7)
    y = torch.randint(0, 5, (5, 7))
    check(lambda x, y: (x.type_as(y), y.type_as(x), x.double() * 1e-300, (x.double() + 1e-10).float()), x, y)


# -------------------------------------------------------------------- scalars and type promotion

PROMOTION_CASES: dict[str, tuple[Callable[..., Any], tuple[torch.dtype, ...]]] = {
    "int32_plus_f64_scalar": (lambda a: a + 2.5, (I32,)),
    "int64_truediv_int64": (lambda a, b: a / b, (I64, I64)),
    "bool_plus_bool": (lambda a, b: a + b, (BOOL, BOOL)),
    "bool_mul_bool": (lambda a, b: a * b, (BOOL, BOOL)),
    "int_tensor_times_float_scalar": (lambda a: a * 1.5, (I64,)),
    "float_scalar_times_int_tensor": (lambda a: 1.5 * a, (I32,)),
    "f32_plus_f64_0d": (lambda a, b: a + b, (F32, "f64_0d")),
    "i32_plus_f64_0d": (lambda a, b: a + b, (I32, "f64_0d")),
    "i32_plus_i64_0d": (lambda a, b: a + b, (I32, "i64_0d")),
    "f32_0d_plus_i64": (lambda a, b: b + a, (I64, "f32_0d")),
    "bool_plus_int_scalar": (lambda a: a + 3, (BOOL,)),
    "bool_times_float_scalar": (lambda a: a * 0.5, (BOOL,)),
    "bool_plus_true": (lambda a: a + True, (BOOL,)),
    "int_plus_bool_scalar": (lambda a: a + True, (I32,)),
    "int_sub_from_scalar": (lambda a: 7 - a, (I64,)),
    "int_rdiv_scalar": (lambda a: 7 / (a.abs() + 1), (I64,)),
    "int_floordiv_float_scalar": (lambda a: a // 2.5, (I64,)),
    "int_mod_float_scalar": (lambda a: a % 2.5, (I64,)),
    "f32_times_huge_int": (lambda a: a * 2**40, (F32,)),
    "i64_plus_huge_int": (lambda a: a + 2**40, (I64,)),
    "i32_plus_int_scalar_stays_i32": (lambda a: a + 100000, (I32,)),
    "f64_plus_f32": (lambda a, b: a + b, (F64, F32)),
    "i64_plus_f32": (lambda a, b: a + b, (I64, F32)),
    "bool_plus_i32": (lambda a, b: a + b, (BOOL, I32)),
    "scalar_pow_int": (lambda a: 2.5 ** a.abs(), (I64,)),
    "int_pow_float_scalar": (lambda a: a.abs() ** 0.5, (I64,)),
    "int_pow_neg_int_scalar_as_float": (lambda a: (a.abs() + 1).float() ** -2, (I64,)),
    "int_max_with_float": (lambda a, b: torch.maximum(a, b), (I64, F32)),
    "bool_sub_not_allowed_workaround": (lambda a, b: a.int() - b.int(), (BOOL, BOOL)),
    "neg_scalar_left": (lambda a: -1 - a, (F32,)),
    "div_scalar_left_float": (lambda a: 1 / (a.abs() + 1), (F32,)),
    "float_tensor_plus_bool_scalar": (lambda a: a + False, (F32,)),
    "true_div_bool": (lambda a, b: a / (b.int() + 1), (BOOL, BOOL)),
}


def _promotion_input(spec: Any, seed: int) -> torch.Tensor:
    if spec == "f64_0d":
        return torch.tensor(1.25, dtype=F64)
    if spec == "i64_0d":
        return torch.tensor(2**33, dtype=I64)
    if spec == "f32_0d":
        return torch.tensor(0.75, dtype=F32)
    return make("sliced" if seed else "contiguous", spec, seed=seed, low=1 if seed else -9)


def test_type_promotion() -> None:
    """Every promotion case in one graph; a mismatch (dtype or value) names its case."""
    inputs: list[torch.Tensor] = []
    fns = {}
    for case, (fn, specs) in PROMOTION_CASES.items():
        first = len(inputs)
        inputs += [_promotion_input(spec, i) for i, spec in enumerate(specs)]
        fns[case] = lambda *a, fn=fn, idx=range(first, len(inputs)): fn(*(a[i] for i in idx))  # noqa: B008
    check_named(fns, *inputs)


def test_python_scalars_as_graph_inputs() -> None:
    """Python numbers passed to the compiled function (Dynamo may turn them into graph inputs)."""
    x = make("transposed", F32)
    i = make("contiguous", I64)
    fn = lambda x, i, s, f, b: (x * s + f, i * s, i + f, x + b, i * b, s - x, f / (i.abs() + 1))
    check(fn, x, i, 3, 0.5, True)
    check(fn, x, i, -7, 2.25, False)  # second call: Dynamo may recompile with symbolic ints/floats


def test_integer_overflow_wraps() -> None:
    a = torch.tensor([2**31 - 1, -(2**31)], dtype=I32)
    b = torch.tensor([2**62, -(2**62)], dtype=I64)
    check(lambda a, b: (a + 1, a - 1, a * 2, b * 4, b + b), a, b)


def test_binary_broadcast_3d() -> None:
    a = torch.randn(3, 1, 5)
    b = torch.randn(4, 1)
    c = torch.randn(5)
    check(lambda a, b, c: (a + b, a * c - b, torch.where(a > b, b, c), torch.maximum(c, b)), a, b, c)


def test_inplace_ops_in_graph() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = x.clone()
        z.add_(y).mul_(2).clamp_(min=-1)
        z[:, 0].zero_()
        return z

    check(fn, make("transposed", F32), make("contiguous", F32))


def test_input_mutation_visible_to_caller() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1

    x1, x2 = torch.randn(4, 6), None
    x2 = x1.clone()
    out = torch.compile(fn, backend="minductor")(x1)
    ref = fn(x2)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x1, x2)


def test_input_mutation_noncontiguous() -> None:
    def fn(x: torch.Tensor) -> None:
        x.add_(1).relu_()

    x1 = torch.randn(6, 4).t()
    x2 = x1.clone()
    torch.compile(fn, backend="minductor")(x1)
    fn(x2)
    torch.testing.assert_close(x1, x2)
