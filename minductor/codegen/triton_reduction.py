"""Reductions in a Triton kernel: along the ``r`` block axis, persistent or looped.

Persistent: the masked row block is reduced at once. Looped: a ``[XBLOCK, RBLOCK]``
accumulator combines each chunk lane by lane (masked lanes keep their value) and is reduced
after the loop. Float max/min/argmax/argmin propagate NaN like eager; argmax/argmin pick the
lowest index on ties; mean/var use Welford's combine.
"""
from __future__ import annotations

from typing import Any

import torch

from minductor.codegen.triton_ops import TRITON_TYPES, TV, compute_dtype, triton_constant

X = frozenset({"x"})


def identity(rtype: str, dtype: torch.dtype) -> str:
    """The value masked lanes hold: it never changes the result."""
    if rtype in ("sum", "any", "welford_reduce"):
        return triton_constant(0, dtype)
    if rtype == "prod":
        return triton_constant(1, dtype)
    lowest = rtype in ("max", "argmax")
    if dtype == torch.bool:
        return triton_constant(not lowest, dtype)
    if dtype.is_floating_point:
        return triton_constant(float("-inf") if lowest else float("inf"), dtype)
    info = torch.iinfo(dtype)
    return str(info.min if lowest else info.max)


def _combine(rtype: str, dtype: torch.dtype, acc: str, value: str) -> str:
    if rtype == "sum":
        return f"{acc} + {value}"
    if rtype == "prod":
        return f"{acc} * {value}"
    if rtype == "any":
        return f"{acc} | ({value} != 0)"
    fn = {"max": "maximum", "min": "minimum"}[rtype]
    return f"{fn}({acc}, {value})" if dtype.is_floating_point else f"tl.{fn}({acc}, {value})"


def _final(rtype: str, dtype: torch.dtype, block: str) -> str:
    if rtype == "sum":
        return f"tl.sum({block}, 1)"
    if rtype == "prod":
        return f"prod({block}, 1)"
    if rtype == "any":
        return f"(tl.max({block}.to(tl.int8), 1) != 0)"
    if dtype.is_floating_point:
        return f"{rtype}_nan({block}, 1)"
    return f"tl.{rtype}({block}, 1)"


def emit_reduction(kernel: Any, dtype: torch.dtype, src_dtype: torch.dtype, rtype: str, value: TV) -> Any:
    """Emit one reduction of ``value`` over the r axis; returns its ``[XBLOCK, 1]`` result(s)."""
    loop = kernel.loop
    arg = rtype in ("argmax", "argmin")
    ctype = compute_dtype(src_dtype if arg else dtype)
    if rtype == "any":
        ctype = torch.bool
    t = TRITON_TYPES[ctype]
    mask, _ = kernel.mask_for(frozenset({"x", "r"}))
    v = value if value.dtype == ctype else kernel.cse_value(f"{value}.to({t})", ctype, value.dims)
    init = identity(rtype, ctype)
    if rtype == "welford_reduce":
        return _welford(kernel, v, mask, t)
    if arg:
        return _arg_reduction(kernel, rtype, v, mask, t, init)
    out_t = ctype
    if not loop.looped:
        block = kernel.cse_value(f"tl.where({mask}, {v}, {init})", ctype, frozenset({"x", "r"}))
        return _result(kernel, f"{_final(rtype, ctype, block)}[:, None]", out_t)
    acc = kernel.newvar().replace("tmp", "acc")
    loop.prefix.writeline(f"{acc} = tl.full([XBLOCK, {loop.rblock}], {init}, {t})")
    loop.body.writeline(f"{acc} = tl.where({mask}, {_combine(rtype, ctype, acc, v)}, {acc})")
    return _result(kernel, f"{_final(rtype, ctype, acc)}[:, None]", out_t)


def _result(kernel: Any, expr: str, dtype: torch.dtype) -> TV:
    var = TV(kernel.newvar(), dtype, X)
    kernel.loop.suffix.writeline(f"{var} = {expr}")
    return var


def _arg_reduction(kernel: Any, rtype: str, v: TV, mask: str, t: str, init: str) -> TV:
    loop = kernel.loop
    big = str(2**31 - 1)
    if not loop.looped:
        vals = kernel.cse_value(f"tl.where({mask}, {v}, {init})", v.dtype, frozenset({"x", "r"}))
        idx = kernel.cse_value(f"tl.where({mask}, rindex, {big})", torch.int32, frozenset({"x", "r"}))
        return _arg_result(kernel, rtype, vals, idx)
    accv = kernel.newvar().replace("tmp", "accv")
    acci = kernel.newvar().replace("tmp", "acci")
    loop.prefix.writeline(f"{accv} = tl.full([XBLOCK, {loop.rblock}], {init}, {t})")
    loop.prefix.writeline(f"{acci} = tl.full([XBLOCK, {loop.rblock}], {big}, tl.int32)")
    nv, ni = kernel.newvar(), kernel.newvar()
    loop.body.writeline(f"{nv}, {ni} = {rtype}_combine({accv}, {acci}, {v}, rindex)")
    loop.body.writeline(f"{accv} = tl.where({mask}, {nv}, {accv})")
    loop.body.writeline(f"{acci} = tl.where({mask}, {ni}, {acci})")
    return _arg_result(kernel, rtype, TV(accv, v.dtype, v.dims), acci)


def _arg_result(kernel: Any, rtype: str, values: TV, indices: str) -> TV:
    best = _result(kernel, _final(rtype[3:], values.dtype, values), values.dtype)
    return _result(kernel, f"first_index_of({values}, {indices}, {best}, 1)[:, None].to(tl.int64)", torch.int64)


def _welford(kernel: Any, v: TV, mask: str, t: str) -> tuple[TV, TV, TV]:
    loop = kernel.loop
    names = [kernel.newvar() for _ in range(3)]
    outs = tuple(TV(n, v.dtype, X) for n in names)
    if not loop.looped:
        mean = kernel.cse_value(f"tl.where({mask}, {v}, 0.0)", v.dtype, frozenset({"x", "r"}))
        weight = kernel.cse_value(f"tl.where({mask}, 1.0, 0.0).to({t})", v.dtype, frozenset({"x", "r"}))
        loop.suffix.writeline(f"{', '.join(names)} = welford({mean}, {mean} * 0.0, {weight}, 1)")
    else:
        m, m2, w = (kernel.newvar().replace("tmp", p) for p in ("accm", "accm2", "accw"))
        for acc in (m, m2, w):
            loop.prefix.writeline(f"{acc} = tl.zeros([XBLOCK, {loop.rblock}], {t})")
        nw, delta, nm = kernel.newvar(), kernel.newvar(), kernel.newvar()
        loop.body.writeline(f"{nw} = {w} + 1.0")
        loop.body.writeline(f"{delta} = {v} - {m}")
        loop.body.writeline(f"{nm} = {m} + {delta} / {nw}")
        loop.body.writeline(f"{m2} = tl.where({mask}, {m2} + {delta} * ({v} - {nm}), {m2})")
        loop.body.writeline(f"{m} = tl.where({mask}, {nm}, {m})")
        loop.body.writeline(f"{w} = tl.where({mask}, {nw}, {w})")
        loop.suffix.writeline(f"{', '.join(names)} = welford({m}, {m2}, {w}, 1)")
    for n in names:
        loop.suffix.writeline(f"{n} = {n}[:, None]")
    return outs
