"""Device functions the generated Triton kernels call, and ``libdevice`` for them.

Kernels import this module, so it is decorated under the same mode as they are: compiled
for a GPU, or run by Triton's interpreter when ``TRITON_INTERPRET=1`` was set before the
first kernel loaded. ``libdevice`` is Triton's CUDA/HIP math library on a GPU; the
interpreter cannot call extern functions, so there it is a stand-in computing the same
functions with NumPy on the interpreter's host arrays (the kernel source is the same).
"""
# ruff: noqa: PLR0124  (x != x is the NaN test inside kernels)
from __future__ import annotations

import math
import types
from typing import Any

import numpy as np
import triton
import triton.language as tl
from triton import knobs

INTERPRET: bool = bool(knobs.runtime.interpret)


# -- libdevice --------------------------------------------------------------------------------

_NUMPY_MATH = {
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "expm1": np.expm1, "log1p": np.log1p, "log10": np.log10, "trunc": np.trunc, "nearbyint": np.rint,
    "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign, "nextafter": np.nextafter,
    "fmod": np.fmod, "pow": np.power, "signbit": np.signbit, "erfc": None, "erfinv": None, "lgamma": None,
}


def _scalar_fn(name: str) -> Any:
    import torch  # erfinv/erfc/lgamma: NumPy lacks them; torch computes them on the host array

    fn = {"erfc": torch.special.erfc, "erfinv": torch.special.erfinv, "lgamma": torch.lgamma}[name]
    return lambda x: fn(torch.from_numpy(np.ascontiguousarray(x))).numpy()


class _InterpreterLibdevice(types.ModuleType):
    """``libdevice.<fn>(...)`` for interpreted kernels: the same function on the host arrays."""

    def __getattr__(self, name: str) -> Any:
        if name not in _NUMPY_MATH:
            raise AttributeError(f"libdevice.{name} has no interpreter stand-in")
        fn = _NUMPY_MATH[name] or _scalar_fn(name)

        def call(*args: Any, _semantic: Any = None) -> Any:
            from triton.runtime.interpreter import TensorHandle

            arrays = [a.handle.data for a in args]
            out = np.asarray(fn(*arrays))
            dtype = tl.int1 if name == "signbit" else args[0].dtype
            out = out.astype(arrays[0].dtype if name != "signbit" else np.bool_)
            shape = list(np.broadcast_shapes(*(a.shape for a in arrays)))
            block_shape = [s for a in args if a.type.is_block() for s in [a.shape]]
            ty = tl.block_type(dtype, shape) if block_shape else dtype
            return tl.tensor(TensorHandle(out.reshape(shape) if shape else out, dtype), ty)

        return call


def _widen_bf16_dot_in_interpreter() -> None:
    """Triton's interpreter keeps bf16 blocks as uint16 host arrays and its ``tl.dot`` multiplies
    those raw bit patterns. Widen bf16 operands to float32 first: the products of bf16 values are
    exact in float32, so this is what a GPU's bf16 MMA with a float32 accumulator computes, and the
    matmul template can keep ``tl.dot`` on bf16 tiles (the fast form on a GPU)."""
    from triton.runtime.interpreter import InterpreterBuilder

    original = InterpreterBuilder.create_dot
    if getattr(original, "_widens_bf16", False):
        return

    def create_dot(self: Any, a: Any, b: Any, d: Any, *rest: Any) -> Any:
        a, b = (self.cast_impl(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x for x in (a, b))
        return original(self, a, b, d, *rest)

    create_dot._widens_bf16 = True  # type: ignore[attr-defined]
    InterpreterBuilder.create_dot = create_dot


if INTERPRET:
    libdevice: Any = _InterpreterLibdevice("libdevice")
    _widen_bf16_dot_in_interpreter()
else:
    from triton.language.extra import libdevice




@triton.jit
def maximum(a, b):
    """torch.maximum for floats: NaN wins."""
    return tl.where(a != a, a, tl.where(a > b, a, b))


@triton.jit
def minimum(a, b):
    """torch.minimum for floats: NaN wins."""
    return tl.where(a != a, a, tl.where(a < b, a, b))


@triton.jit
def multiply(a, b):
    return a * b


@triton.jit
def _nan_or(x, value, axis: tl.constexpr):
    """``value`` where the reduced slice of ``x`` holds no NaN, else NaN (reductions use builtins only:
    a GPU reduces them in registers, the interpreter with NumPy)."""
    nans = tl.sum(tl.where(x != x, 1, 0), axis)
    return tl.where(nans > 0, tl.sum(tl.where(x != x, x, 0.0), axis), value)


@triton.jit
def max_nan(x, axis: tl.constexpr):
    return _nan_or(x, tl.max(x, axis), axis)


@triton.jit
def min_nan(x, axis: tl.constexpr):
    return _nan_or(x, tl.min(x, axis), axis)


@triton.jit
def prod(x, axis: tl.constexpr):
    return tl.reduce(x, axis, multiply)


@triton.jit
def argmax_combine(va, ia, vb, ib):
    """Lane-wise step of a looped argmax: the larger value, NaN first, the lower index on ties."""
    a_nan = va != va
    b_nan = vb != vb
    tie = (va == vb) | (a_nan & b_nan)
    pick_a = (va > vb) | (a_nan & ~b_nan) | (tie & (ia < ib))
    return tl.where(pick_a, va, vb), tl.where(pick_a, ia, ib)


@triton.jit
def argmin_combine(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    tie = (va == vb) | (a_nan & b_nan)
    pick_a = (va < vb) | (a_nan & ~b_nan) | (tie & (ia < ib))
    return tl.where(pick_a, va, vb), tl.where(pick_a, ia, ib)


@triton.jit
def first_index_of(value, index, best, axis: tl.constexpr):
    """The lowest ``index`` along ``axis`` whose ``value`` is ``best`` (NaN matches NaN): with
    ``best`` the max or min, eager's argmax/argmin."""
    best = tl.expand_dims(best, axis)
    hit = (value == best) | ((value != value) & (best != best))
    return tl.min(tl.where(hit, index, 2147483647), axis)


@triton.jit
def welford(mean, m2, weight, axis: tl.constexpr):
    """Combine per-lane (mean, m2, weight) along ``axis`` (Chan's parallel formula)."""
    total = tl.sum(weight, axis)
    safe = tl.where(total == 0.0, 1.0, total)
    out_mean = tl.sum(mean * weight, axis) / safe
    delta = mean - tl.expand_dims(out_mean, axis)
    out_m2 = tl.sum(m2 + weight * delta * delta, axis)
    return out_mean, out_m2, total


@triton.jit
def round_bf16(x):
    """float32 -> nearest bfloat16 (ties to even), still as float32; bit arithmetic, so the
    interpreter (whose bf16 cast truncates) rounds exactly as a GPU does."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def floordiv_float(a, b):
    """eager's float floor division: from fmod, so ``inf // 2`` is NaN and zeros keep their sign."""
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    res = tl.where(div == 0, libdevice.copysign(tl.zeros_like(div), a / b), fl)
    return tl.where(b == 0, a / b, res)


@triton.jit
def floordiv_int(a, b):
    """Python's floor division for integers (``//`` in Triton truncates)."""
    q = a // b
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def mod_int(a, b):
    """Python's modulo for integers: the result has the divisor's sign."""
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


__all__ = ["INTERPRET", "libdevice", "math"]
