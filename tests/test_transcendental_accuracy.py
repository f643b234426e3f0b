"""The branch-free float32 functions of the C++ prelude against float64 references.

A dense sweep (plus tiny, huge and special values) through one compiled graph; every result
must meet float32 ``assert_close`` tolerances against the float64 function and keep NaN/inf.
"""
from __future__ import annotations

import pytest
import torch
from conftest import math_paths

from minductor import config
from minductor.runtime.cache import libmvec_installed

# the prelude's own float32 sin/cos, and glibc's vector ones where they are installed
MATH = math_paths()

FNS = {
    "erf": (torch.erf, lambda x: x),
    "exp": (torch.exp, lambda x: x.clamp(-87, 88)),
    "log": (torch.log, lambda x: x.abs() + 1e-30),
    "tanh": (torch.tanh, lambda x: x),
    "sigmoid": (torch.sigmoid, lambda x: x),
    "sin": (torch.sin, lambda x: x.clamp(-1e6, 1e6)),  # huge arguments: see the xfail below
    "cos": (torch.cos, lambda x: x.clamp(-1e6, 1e6)),
    "gelu": (torch.nn.functional.gelu, lambda x: x),
    "gelu_tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), lambda x: x),
    "expm1": (torch.expm1, lambda x: x),
    "log1p": (torch.log1p, lambda x: x.clamp(min=-1)),
    "exp2": (torch.exp2, lambda x: x),
    "log2": (torch.log2, lambda x: x.abs()),
    "log10": (torch.log10, lambda x: x.abs()),
    "atan": (torch.atan, lambda x: x),
    "asin": (torch.asin, lambda x: (x / 11).clamp(-1, 1)),
    "acos": (torch.acos, lambda x: (x / 11).clamp(-1, 1)),
    "sinh": (torch.sinh, lambda x: x * 8),
    "cosh": (torch.cosh, lambda x: x * 8),
    "asinh": (torch.asinh, lambda x: x * x * x),
    "acosh": (torch.acosh, lambda x: x.abs() * x.abs() + 1),
    "atanh": (torch.atanh, lambda x: (x / 11).clamp(-1, 1)),
    "erfinv": (torch.erfinv, lambda x: (x / 11).clamp(-1, 1)),
    "tan": (torch.tan, lambda x: x.clamp(-1e6, 1e6)),
    "erfc": (torch.erfc, lambda x: x),
    "softplus": (torch.nn.functional.softplus, lambda x: x),
    "mish": (torch.nn.functional.mish, lambda x: x),
    "elu": (torch.nn.functional.elu, lambda x: x),
    "logsigmoid": (torch.nn.functional.logsigmoid, lambda x: x),
    "lgamma": (torch.lgamma, lambda x: x),  # poles at 0 and the negative integers in the sweep
}


def sweep() -> torch.Tensor:
    dense = torch.linspace(-12, 12, 400_001)
    tiny = torch.logspace(-38, 1, 20_000)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 0.5, -0.5, 1e30, -1e30])
    return torch.cat([dense, tiny, -tiny, special]).float()


@pytest.mark.parametrize("libmvec", MATH)
def test_prelude_functions_meet_float32_tolerances(libmvec: bool) -> None:
    names = sorted(FNS)

    def graph(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(FNS[n][0](FNS[n][1](x)) for n in names)

    x = sweep()
    with config.patch(libmvec=libmvec):
        got = torch.compile(graph, backend="minductor")(x)
    for name, value in zip(names, got):
        fn, prep = FNS[name]
        ref = fn(prep(x).double()).float()
        torch.testing.assert_close(value, ref, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


def test_exp_and_erf_near_their_limits() -> None:
    """exp just below float32 overflow (finite up to ln(FLT_MAX) ~ 88.7228, inf above), through
    underflow to 0, and erf saturating to +-1: every value as float64 rounded to float32 gives
    (relative error < 1e-6 where exp is a normal float)."""
    x = torch.cat([torch.linspace(88.0, 88.7228, 10_001), torch.linspace(88.7229, 95, 101),
                   torch.linspace(-110, -80, 10_001), torch.linspace(-6, 6, 10_001)]).float()
    got_exp, got_erf = torch.compile(lambda t: (t.exp(), t.erf()), backend="minductor")(x)
    ref = x.double().exp()
    torch.testing.assert_close(got_exp, ref.float(), rtol=1e-6, atol=2.4e-38)  # below 2^-125 may flush to 0
    assert torch.isinf(got_exp[x > 88.7229]).all() and torch.isfinite(got_exp[x <= 88.7228]).all()
    torch.testing.assert_close(got_erf, x.double().erf().float(), rtol=1e-6, atol=0)


def test_tanh_near_saturation() -> None:
    """Every float32 in [6, 8]: tanh's quotient stays within [-1, 1] where the rational
    approximation meets the saturation at 7.9, is +-1 from there on, within 4e-7 of float64."""
    lo, hi = torch.tensor([6.0, 8.0]).view(torch.int32).tolist()
    x = torch.arange(lo, hi + 1, dtype=torch.int32).view(torch.float32)
    x = torch.cat([x, -x])
    got = torch.compile(torch.tanh, backend="minductor")(x)
    assert got.abs().max().item() <= 1.0
    assert (got[x.abs() >= 7.9] == x[x.abs() >= 7.9].sign()).all()
    torch.testing.assert_close(got, x.double().tanh().float(), rtol=4e-7, atol=0)


def test_atan2_quadrants_and_special_values() -> None:
    """atan2 over every pair of signed zeros, infinities, NaN and ordinary values, and a dense
    random cloud: float64's value rounded, the sign of a zero result included."""
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-30, -3e-39, 2.5, -1e30, float("inf"), -float("inf"), float("nan")])
    y, x = torch.cartesian_prod(special, special).unbind(1)
    g = torch.Generator().manual_seed(0)
    cloud = torch.randn(2, 200_000, generator=g) * torch.logspace(-3, 3, 200_000)
    y, x = torch.cat([y, cloud[0], torch.linspace(-5, 5, 1001)]), torch.cat([x, cloud[1], torch.full((1001,), -1e-3)])
    got = torch.compile(torch.atan2, backend="minductor")(y, x)
    ref = torch.atan2(y.double(), x.double()).float()
    torch.testing.assert_close(got, ref, equal_nan=True)
    zero = ref == 0
    assert torch.equal(got[zero].signbit(), ref[zero].signbit())


def test_hypot_and_inverse_functions_at_their_edges() -> None:
    """hypot without overflow or underflow in between, inf beside NaN; asin/acos/atanh at and
    beyond +-1, acosh at and below 1, sinh/cosh up to float32's overflow, erfinv's tails."""
    special = torch.tensor([0.0, -0.0, 1e-30, -3e-39, 1.5, -2.5, 3e38, -1e30, float("inf"), -float("inf"), float("nan")])
    a, b = torch.cartesian_prod(special, special).unbind(1)
    g = torch.Generator().manual_seed(0)
    cloud = torch.randn(2, 100_000, generator=g) * torch.logspace(-30, 30, 100_000)
    a, b = torch.cat([a, cloud[0]]), torch.cat([b, cloud[1]])
    got = torch.compile(torch.hypot, backend="minductor")(a, b)
    torch.testing.assert_close(got, torch.hypot(a.double(), b.double()).float(), equal_nan=True)
    edges = torch.tensor([-1.0, 1.0, -1.0000001, 1.0000001, 0.9999999, -0.9999999, 0.99999994, 0.9999, 2.0, -2.0, 0.0, -0.0, 1e-30,
                          88.0, 89.0, 89.4, 89.5, -89.4, 100.0, 3e38, -3e38, float("inf"), -float("inf"), float("nan")])
    fns = (torch.asin, torch.acos, torch.atanh, torch.acosh, torch.sinh, torch.cosh, torch.asinh, torch.erfinv)
    got = torch.compile(lambda x: tuple(f(x) for f in fns), backend="minductor")(edges)
    for f, value in zip(fns, got):
        ref = f(edges.double()).float()
        torch.testing.assert_close(value, ref, equal_nan=True, msg=lambda m, f=f: f"{f.__name__}: {m}")
        zero = ref == 0
        assert torch.equal(value[zero].signbit(), ref[zero].signbit()), f.__name__


def test_pow_of_tensors() -> None:
    """x ** y for float32 tensors against float64's pow rounded: every pair of signed zeros,
    +-1, integers odd and even (beyond 2^24 too), halves, tiny and huge values, infinities and
    NaN (C99's special cases), plus random positive bases over 10 decades and negative bases to
    integer powers; the sign of zero results included."""
    special = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 1e-30, -1e-30, 1e30, -1e30, 16777217.0,
               33554432.0, -33554431.0, float("inf"), -float("inf"), float("nan"), 0.999, 1.001, 88.0, -149.0, 128.0, 127.5, 7.0]
    x, y = torch.cartesian_prod(torch.tensor(special), torch.tensor(special)).unbind(1)
    g = torch.Generator().manual_seed(0)
    base = torch.rand(100_000, generator=g) * 10 ** torch.empty(100_000).uniform_(-5, 5, generator=g)
    negative = -torch.randint(1, 100, (20_000,), generator=g).float() / 7
    x = torch.cat([x, base, negative])
    y = torch.cat([y, torch.randn(100_000, generator=g) * 20, torch.randint(-30, 30, (20_000,), generator=g).float()])
    got = torch.compile(torch.pow, backend="minductor")(x, y)
    exact = torch.pow(x.double(), y.double())
    torch.testing.assert_close(got, exact.float(), equal_nan=True)
    zero = exact == 0
    assert torch.equal(got[zero].signbit(), exact[zero].signbit())
    normal = torch.isfinite(exact.float()) & (exact.abs() > 1e-37)
    assert ((got[normal].double() - exact[normal]) / exact[normal]).abs().max() < 2.4e-7  # 2 ulp


def test_log2_of_powers_of_two_and_exp2_of_integers_are_exact() -> None:
    k = torch.arange(-149, 128, dtype=torch.float32)
    got_log2, got_exp2 = torch.compile(lambda p, k: (p.log2(), k.exp2()), backend="minductor")(torch.exp2(k), k)
    assert torch.equal(got_log2, k)
    assert torch.equal(got_exp2, torch.exp2(k.double()).float())
    x = torch.tensor([-1.0, -2.0, -1e-30, -float("inf")])
    got = torch.compile(lambda x: (x.log2(), x.log10(), x.log1p()), backend="minductor")(x)
    for value, ref in zip(got, (x.log2(), x.log10(), x.log1p())):  # NaN below the domain, -inf at its edge
        torch.testing.assert_close(value, ref, equal_nan=True)


def _huge_arguments() -> None:
    x = torch.tensor([1e16, -3e20, 1e30, 3e38, 1e9, -7e12])
    got = torch.compile(lambda t: (t.sin(), t.cos()), backend="minductor")(x)
    torch.testing.assert_close(got, (x.double().sin().float(), x.double().cos().float()))


@pytest.mark.skipif(not libmvec_installed(config.cxx), reason="glibc's libmvec is not installed")
def test_sin_cos_of_huge_arguments_with_libmvec() -> None:
    with config.patch(libmvec=True):
        _huge_arguments()


@pytest.mark.xfail(reason="issue 3: without libmvec, mi_sin/mi_cos reduce by pi/2 in double, which loses precision "
                          "past |x| ~ 1e9 and all of it past ~4e15 (a Payne-Hanek reduction is not written)", strict=True)
def test_sin_cos_of_huge_arguments_own_polynomials() -> None:
    with config.patch(libmvec=False):
        _huge_arguments()


@pytest.mark.parametrize("libmvec", MATH)
def test_vector_lanes_and_loop_tails_round_alike(libmvec: bool) -> None:
    """Every function gives the same float for one argument in a vector loop's lanes and in its
    scalar tail. Rows of 37 copies of one value (2 vectors of 16 and a tail of 5; a broadcast
    read keeps the row loop from merging with the next) must come out 37 equal values: a value
    two kernels recompute (an amax's tie mask over sin(x)) has to compare equal. glibc's scalar
    sinf differs from its 16-wide vector variant on about a quarter of all arguments."""
    names = sorted(FNS)
    column = torch.cat([torch.linspace(-12, 12, 4001), torch.linspace(-1000, 1000, 4001)]).float()[:, None]

    def graph(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = x.expand(x.shape[0], 37)
        return tuple(FNS[n][0](FNS[n][1](rows)) for n in names)

    with config.patch(libmvec=libmvec):
        got = torch.compile(graph, backend="minductor", dynamic=False)(column)
    for name, value in zip(names, got):
        differ = (value != value[:, :1]).any(1)
        assert not differ.any(), (f"{name}: {int(differ.sum())} of {len(column)} arguments round differently "
                                  f"across one row, e.g. {column[differ][:3, 0].tolist()}")
