"""Every lowering family against eager, over input layouts and dtypes.

Inputs: contiguous, transposed, strided slice, expanded (broadcast), 0-d and size-1, in
float32/float64/int64/bool as each op allows. To keep compiles few, one compiled graph
returns many ops' results at once; each result is compared with eager separately.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import metrics

# every test runs with the C++ and the Triton (interpreter) code generator
pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def make(kind: str, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(sum(map(ord, kind + str(dtype))))

    def base(*s: Any) -> torch.Tensor:
        shape = s[0] if s and isinstance(s[0], tuple) else s
        if dtype == torch.bool:
            return torch.randn(shape) > 0
        if dtype.is_floating_point:
            return torch.randn(shape, dtype=dtype) * 2
        return torch.randint(-9, 10, shape, dtype=dtype)

    return {
        "contiguous": lambda: base(4, 6),
        "transposed": lambda: base(6, 4).t(),
        "sliced": lambda: base(4, 13)[:, 1::2],
        "expanded": lambda: base(1, 6).expand(4, 6),
        "scalar": lambda: base(()) if dtype != torch.bool else torch.tensor(True),
        "size1": lambda: base(1, 1),
    }[kind]()


LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "scalar", "size1"]


def check_all(fns: dict[str, Callable[..., Any]], *args: Any, tol: dict[str, float] | None = None) -> None:
    names = sorted(fns)

    def graph(*a: Any) -> tuple[Any, ...]:
        return tuple(fns[n](*a) for n in names)

    outs = torch.compile(graph, backend="minductor")(*args)
    refs = graph(*args)
    for name, out, ref in zip(names, outs, refs):
        torch.testing.assert_close(out, ref, equal_nan=True, **(tol or {}), msg=lambda m, n=name: f"{n}: {m}")


FLOAT_UNARY = {
    "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 0.5), "sqrt": lambda x: x.abs().sqrt(),
    "rsqrt": lambda x: (x.abs() + 0.5).rsqrt(), "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "abs": torch.abs, "neg": torch.neg, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "sign": torch.sign,
    "reciprocal": lambda x: (x.abs() + 0.5).reciprocal(), "relu": torch.relu, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "leaky_relu": F.leaky_relu, "elu": F.elu,
    "silu": F.silu, "hardtanh": F.hardtanh, "expm1": torch.expm1, "log1p": lambda x: (x.abs()).log1p(),
    "square": torch.square, "isnan": torch.isnan, "pow_scalar": lambda x: x.abs() ** 1.5,
    "to_int": lambda x: x.to(torch.int32), "to_bool": lambda x: x.to(torch.bool),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_float_unary(layout: str, dtype: torch.dtype) -> None:
    check_all(FLOAT_UNARY, make(layout, dtype))


INT_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "bitwise_not": torch.bitwise_not,
    "to_float": lambda x: x.to(torch.float32), "exp_promotes": torch.exp, "sqrt_promotes": lambda x: x.abs().sqrt(),
    "floor_identity": torch.floor, "square": torch.square,
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_int_unary(layout: str) -> None:
    check_all(INT_UNARY, make(layout, torch.int64))


BOOL_UNARY = {"logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not, "to_int": lambda x: x.to(torch.int64),
              "to_float": lambda x: x.float(), "neg_via_int": lambda x: -x.long()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bool_unary(layout: str) -> None:
    check_all(BOOL_UNARY, make(layout, torch.bool))


BINARY_FLOAT = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "sub": torch.sub, "mul": torch.mul,
    "div": torch.div, "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"), "remainder": torch.remainder,
    "fmod": torch.fmod, "pow": lambda a, b: a.abs() ** b, "maximum": torch.maximum, "minimum": torch.minimum,
    "atan2": torch.atan2, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "where": lambda a, b: torch.where(a > b, a, b),
    "clamp_tensor": lambda a, b: torch.clamp(a, min=b, max=b + 1), "hypot": torch.hypot,
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_float_binary_broadcasting(layout: str, dtype: torch.dtype) -> None:
    a = make(layout, dtype)
    b = torch.randn(6, dtype=dtype) + 0.1  # broadcasts against the last dim (or a 0-d a)
    check_all(BINARY_FLOAT, a, b)


BINARY_INT = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "true_div": torch.div,
    "floor_div": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "trunc_div": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "remainder": torch.remainder,
    "fmod": torch.fmod, "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "lt": torch.lt,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "shl": lambda a, b: a << (b.abs() % 8), "shr": lambda a, b: a >> (b.abs() % 8), "pow": lambda a, b: a ** b.abs(),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_int_binary(layout: str) -> None:
    a = make(layout, torch.int64)
    b = torch.tensor([3, -2, 5, 7, -4, 1])  # no zeros: integer division by zero is an error in eager
    check_all(BINARY_INT, a, b)


BOOL_BINARY = {"and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
               "bit_and": torch.bitwise_and, "bit_or": torch.bitwise_or, "add": torch.add, "mul": torch.mul,
               "eq": torch.eq, "where": lambda a, b: torch.where(a, 1.5, -2.0)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bool_binary(layout: str) -> None:
    check_all(BOOL_BINARY, make(layout, torch.bool), torch.tensor([True, False, True, True, False, False]))


PROMOTION = {
    "i32_plus_f64_scalar": lambda i, f, b: i.to(torch.int32) + 2.5,
    "i64_truediv_i64": lambda i, f, b: i / (i.abs() + 1),
    "bool_plus_bool": lambda i, f, b: b + b,
    "int_times_float_scalar": lambda i, f, b: i * 0.5,
    "f32_plus_f64_0d": lambda i, f, b: f + torch.tensor(1.5, dtype=torch.float64),
    "f32_plus_f64_tensor": lambda i, f, b: f + f.double(),
    "int_plus_bool": lambda i, f, b: i + b,
    "scalar_left": lambda i, f, b: 3 - f,
    "int_scalar_left": lambda i, f, b: 7 // (i.abs() + 1),
    "bool_scalar": lambda i, f, b: f * True,
    "clamp_int_float_bounds": lambda i, f, b: torch.clamp(i, -2.5, 3.5),
    "where_mixed": lambda i, f, b: torch.where(b, i, f),
    "comparison_mixed": lambda i, f, b: i < f,
}


def test_type_promotion_and_scalars() -> None:
    check_all(PROMOTION, make("contiguous", torch.int64), make("contiguous", torch.float32), make("contiguous", torch.bool))


def test_nan_and_inf_semantics() -> None:
    x = torch.tensor([float("nan"), -float("inf"), float("inf"), -1.0, 0.0, 2.0])
    y = torch.tensor([1.0, float("nan"), 0.0, -2.0, float("nan"), 3.0])
    check_all({
        "maximum": torch.maximum, "minimum": torch.minimum, "clamp": lambda a, b: torch.clamp(a, -0.5, 0.5),
        "relu": lambda a, b: torch.relu(a), "amax": lambda a, b: a.amax(), "argmax": lambda a, b: a.argmax(),
        "argmin": lambda a, b: b.argmin(), "sum": lambda a, b: b.sum(), "eq": torch.eq, "ne": torch.ne,
        "lt": torch.lt, "isnan": lambda a, b: a.isnan(), "sigmoid": lambda a, b: a.sigmoid(),
        "exp": lambda a, b: a.exp(), "tanh": lambda a, b: a.tanh(), "log": lambda a, b: a.log(),
        "nan_to_num": lambda a, b: torch.nan_to_num(a),
    }, x, y)


def reductions(x: torch.Tensor) -> dict[str, Callable[..., Any]]:
    fns: dict[str, Callable[..., Any]] = {
        "sum": lambda t: t.sum(), "sum_0": lambda t: t.sum(0), "sum_neg_keep": lambda t: t.sum(-1, keepdim=True),
        "sum_dims": lambda t: t.sum((0, 1)), "amax": lambda t: t.amax(-1), "amin_keep": lambda t: t.amin(0, keepdim=True),
        "argmax": lambda t: t.argmax(-1), "argmin": lambda t: t.argmin(0), "argmax_all": lambda t: t.argmax(),
        "any": lambda t: t.any(-1), "all": lambda t: t.all(0), "prod": lambda t: t.prod(-1),
        "max_dim": lambda t: t.max(-1), "min_dim": lambda t: t.min(0, keepdim=True),
    }
    if x.dtype.is_floating_point:
        fns.update({
            "mean": lambda t: t.mean(), "mean_keep": lambda t: t.mean(-1, keepdim=True),
            "var": lambda t: t.var(0), "std": lambda t: t.std(-1, correction=0),
            "var_mean": lambda t: torch.var_mean(t, (0, 1), keepdim=True),
            "sum_f64": lambda t: t.sum(-1, dtype=torch.float64), "logsumexp": lambda t: t.logsumexp(-1),
        })
    else:
        fns["sum_float"] = lambda t: t.sum(0, dtype=torch.float32)
    return fns


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded", "size1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool], ids=["f32", "f64", "i64", "bool"])
def test_reductions(layout: str, dtype: torch.dtype) -> None:
    x = make(layout, dtype)
    fns = reductions(x)
    if dtype == torch.bool:
        fns = {k: v for k, v in fns.items() if k in ("sum", "sum_0", "any", "all", "amax", "sum_float", "prod")}
    check_all(fns, x, tol={"rtol": 1e-5, "atol": 1e-5})


def test_reductions_of_0d() -> None:
    check_all({"sum": lambda t: t.sum(), "amax": lambda t: t.amax(), "argmax": lambda t: t.argmax(),
               "mean": lambda t: t.mean(), "sum0": lambda t: t.sum(0)}, torch.tensor(2.5))


VIEWS = {
    "view": lambda t: t.reshape(2, 12), "view_neg": lambda t: t.reshape(-1, 3) * 2, "flatten": lambda t: t.flatten(),
    "permute": lambda t: t.permute(1, 0) + 1, "transpose": lambda t: t.transpose(0, 1), "t": lambda t: t.t() * 2,
    "slice_step": lambda t: t[:, ::2] + 1, "slice_neg": lambda t: t[-3:, -4:-1], "select_neg": lambda t: t[-1] * 3,
    "expand": lambda t: t[:, :1].expand(4, 5) + 0, "unsqueeze": lambda t: t.unsqueeze(1) * 1,
    "squeeze": lambda t: t[:1].squeeze(0) + 1, "as_strided": lambda t: t.contiguous().as_strided((2, 3), (1, 2), 1),
    "split": lambda t: t.split(2, dim=1)[1] + 1, "chunk": lambda t: t.chunk(2, 0)[1] * 2,
    "unbind": lambda t: t.unbind(1)[3] + 0, "diagonal": lambda t: t.diagonal() + 1, "narrow": lambda t: t.narrow(1, 2, 3),
    "reshape_3d": lambda t: (t + 1).reshape(2, 2, 6).sum(1), "movedim": lambda t: t.reshape(2, 2, 6).movedim(0, 2) + 1,
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded"])
def test_views(layout: str) -> None:
    check_all(VIEWS, make(layout, torch.float32))


def test_constructors_with_inputs() -> None:
    x = make("contiguous", torch.float32)
    check_all({
        "full": lambda t: torch.full((4, 6), 2.5) + t, "zeros": lambda t: torch.zeros(6) + t,
        "ones_int": lambda t: torch.ones(4, 1, dtype=torch.int64) + t.long(),
        "arange": lambda t: torch.arange(6) * t, "arange_start_step": lambda t: torch.arange(1, 13, 2) + t,
        "arange_float": lambda t: torch.arange(0, 1.2, 0.2) + t, "zeros_like": lambda t: torch.zeros_like(t) + 1,
        "ones_like_int": lambda t: torch.ones_like(t, dtype=torch.int32), "full_like": lambda t: torch.full_like(t, 7),
        "new_full": lambda t: t.new_full((2, 3), 4.0), "scalar_tensor": lambda t: t * torch.tensor(3.0),
        "eye": lambda t: torch.eye(4, 6) + t,
    }, x)


def test_empty_has_shape_and_dtype() -> None:
    out = torch.compile(lambda t: torch.empty(3, 5, dtype=torch.float64).fill_(1) + t.sum(), backend="minductor")(torch.ones(2))
    assert out.shape == (3, 5) and out.dtype == torch.float64


def test_cat_and_stack() -> None:
    a, b = make("contiguous", torch.float32), make("transposed", torch.float32)
    check_all({
        "cat0": lambda x, y: torch.cat([x, y, x[:1]], 0), "cat_neg": lambda x, y: torch.cat([x, y[:, :2]], -1),
        "cat_mixed_dtype": lambda x, y: torch.cat([x, y.long()], 0), "stack": lambda x, y: torch.stack([x, y], 1),
        "stack_neg": lambda x, y: torch.stack([x, y * 2], -1).sum(-1),
    }, a, b)


def test_matmul_family_as_externs() -> None:
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    check_all({
        "mm": lambda x, y: torch.mm(x, y) + 1, "addmm": lambda x, y: torch.addmm(torch.ones(3), x, y, beta=0.5, alpha=2),
        "bmm": lambda x, y: torch.bmm(x.expand(2, 5, 7), y.expand(2, 7, 3)),
        "baddbmm": lambda x, y: torch.baddbmm(torch.ones(2, 5, 3), x.expand(2, 5, 7), y.expand(2, 7, 3)),
        "conv": lambda x, y: F.conv2d(x.reshape(1, 1, 5, 7), y.reshape(1, 1, 7, 3)[:, :, :3, :3], padding=1),
    }, a, b, tol={"rtol": 1e-4, "atol": 1e-4})
    assert not metrics.fallback_ops, metrics.fallback_ops


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_precision_computes_in_float32_and_rounds_at_stores(dtype: torch.dtype) -> None:
    x = (torch.randn(16, 33) * 3).to(dtype)
    tol = {"rtol": 2e-2, "atol": 2e-2}
    check_all({
        "chain": lambda t: (t.exp() * 2 + 1).sum(-1), "softmax": lambda t: torch.softmax(t, -1),
        "to_float": lambda t: t.float() + 1, "cast_back": lambda t: (t * 3).to(torch.float32),
        "layer_norm": lambda t: F.layer_norm(t, (33,)), "amax": lambda t: t.amax(0), "gelu": F.gelu,
    }, x, tol=tol)
