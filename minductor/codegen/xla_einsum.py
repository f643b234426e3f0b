"""einsum kept whole through AOTAutograd: the ``minductor::einsum`` custom op.

AOTAutograd decomposes ``torch.einsum`` into permute/view/bmm. Before AOT runs, ``rewrite_einsum``
replaces Dynamo's ``torch.einsum`` calls with ``minductor::einsum(equation, operands)``, an op with
a fake implementation, an autocast rule (like the bmm it stands for) and an autograd formula whose
gradients are einsums too, so forward and backward graphs both reach the XLA lowering whole.
"""
from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

_LETTERS = string.ascii_letters


@torch.library.custom_op("minductor::einsum", mutates_args=())
def einsum(equation: str, operands: list[torch.Tensor]) -> torch.Tensor:
    """``torch.einsum(equation, operands)`` as one op; the result is a fresh contiguous tensor."""
    out = torch.einsum(equation, operands).contiguous()
    if any(out.untyped_storage().data_ptr() == o.untyped_storage().data_ptr() for o in operands):
        out = out.clone()
    return out


@einsum.register_fake
def _einsum_fake(equation: str, operands: list[torch.Tensor]) -> torch.Tensor:
    out = torch.einsum(equation, operands)
    return out.new_empty(out.shape)


def _autocast(device_type: str) -> Any:
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    dispatch_key = getattr(torch._C.DispatchKey, key)

    def py_kernel(equation: str, operands: list[torch.Tensor]) -> torch.Tensor:
        # eager einsum contracts pairs with bmm, which autocast runs in the lower precision;
        # a single operand is a sum/diagonal, which autocast leaves alone
        if len(operands) > 1 and torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            operands = [o.to(dtype) if o.is_floating_point() and o.device.type == device_type else o
                        for o in operands]
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(dispatch_key)):
            return torch.ops.minductor.einsum.default(equation, operands)

    overload = torch.ops.minductor.einsum.default
    if overload.has_kernel_for_dispatch_key(dispatch_key):
        overload.py_kernels.pop(dispatch_key)
    overload.py_impl(dispatch_key)(py_kernel)
    _LIB.impl("einsum", lambda _keyset, *args: py_kernel(*args), key, with_keyset=True)


_LIB = torch.library.Library("minductor", "FRAGMENT")
for _device in ("cpu", "cuda"):
    _autocast(_device)


# -- autograd: every gradient is an einsum ------------------------------------------------


def parse(equation: str, shapes: Sequence[Sequence[int]]) -> tuple[list[str], str]:
    """Explicit subscripts, one letter per dim: ellipses expanded, the output spelled out."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    inputs = lhs.split(",")
    used = set(eq) - set(".,->")
    fresh = iter(c for c in _LETTERS if c not in used)
    ell_rank = max((len(s) - len(i.replace("...", "")) for i, s in zip(inputs, shapes) if "..." in i), default=0)
    ell = "".join(next(fresh) for _ in range(ell_rank))
    expanded = []
    for sub, shape in zip(inputs, shapes):
        if "..." in sub:
            n = len(shape) - len(sub.replace("...", ""))
            sub = sub.replace("...", ell[ell_rank - n:])
        expanded.append(sub)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: "".join(expanded).count(c) for c in set("".join(expanded))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return expanded, out


def _letter_sizes(subs: Sequence[str], shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for sub, shape in zip(subs, shapes):
        for c, n in zip(sub, shape):
            sizes[c] = max(sizes.get(c, 1), int(n))
    return sizes


def einsum_grad(i: int, subs: list[str], out: str, grad: torch.Tensor, operands: Sequence[torch.Tensor]) -> torch.Tensor:
    """d(einsum)/d(operand i) applied to ``grad``: an einsum of grad and the other operands, then
    broadcast over letters only operand i had, summed over its broadcast dims, and put back on
    the diagonals of repeated letters (an einsum with identity matrices)."""
    shapes = [tuple(o.shape) for o in operands]
    sizes = _letter_sizes(subs, shapes)
    sub = subs[i]
    own = dict(zip(sub, shapes[i]))
    others = [s for j, s in enumerate(subs) if j != i]
    available = set(out).union(*others) if others else set(out)
    unique = list(dict.fromkeys(sub))
    keep = [c for c in unique if c in available and not (own[c] == 1 and sizes[c] > 1)]
    g = torch.ops.minductor.einsum.default(f"{','.join([out, *others])}->{''.join(keep)}",
                                           [grad, *[o for j, o in enumerate(operands) if j != i]])
    for pos, c in enumerate(unique):
        if c not in keep:
            g = g.unsqueeze(pos)
    g = g.expand([own[c] for c in unique])
    if len(unique) == len(sub):
        return g
    used = set("".join(subs)) | set(out)
    fresh = iter(c for c in _LETTERS if c not in used)
    seen: set[str] = set()
    target, eyes = "", []
    for c in sub:
        if c in seen:
            d = next(fresh)
            target += d
            eyes.append((c + d, torch.eye(own[c], dtype=g.dtype, device=g.device)))
        else:
            seen.add(c)
            target += c
    spec = ",".join(["".join(unique), *[s for s, _ in eyes]]) + "->" + target
    return torch.ops.minductor.einsum.default(spec, [g, *[e for _, e in eyes]])


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    equation, operands = inputs
    ctx.equation = equation
    ctx.save_for_backward(*operands)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[None, list[torch.Tensor | None]]:
    operands = list(ctx.saved_tensors)
    subs, out = parse(ctx.equation, [o.shape for o in operands])
    grads: list[torch.Tensor | None] = []
    for i, o in enumerate(operands):
        needs = ctx.needs_input_grad[1][i] if isinstance(ctx.needs_input_grad[1], (list, tuple)) else True
        grads.append(einsum_grad(i, subs, out, grad, operands).to(o.dtype) if needs else None)
    return None, grads


einsum.register_autograd(_backward, setup_context=_setup_context)


# -- the pre-AOT rewrite ------------------------------------------------------------------


def worth_xla(equation: str, operands: Sequence[torch.fx.Node]) -> bool:
    """Whether an einsum of these operands (Dynamo's example values) contracts enough work for
    the XLA path (``config.einsum_xla_min_work``; 0: every einsum); symbolic sizes keep it there."""
    from minductor import config

    if config.einsum_xla_min_work <= 0:
        return True
    shapes = [getattr(o.meta.get("example_value"), "shape", None) for o in operands]
    if any(s is None or not all(isinstance(n, int) for n in s) for s in shapes):
        return True
    try:
        subs, out = parse(equation, shapes)
    except (ValueError, IndexError):
        return True  # (eager's error, from the XLA path's fallback)
    sizes = _letter_sizes(subs, shapes)
    contracts = any(c not in out and sum(c in s for s in subs) > 1 for c in sizes)
    # three or more operands: a 16th of it (the decomposition contracts pairwise, through bmm
    # and copies between; a bilinear layer's 'bi,oij,bj->bo' at 2^26: 1.50 ms native, 1.26 XLA)
    needed = config.einsum_xla_min_work >> (4 if len(subs) > 2 else 0)
    return contracts and math.prod(sizes.values()) >= needed


def rewrite_einsum(gm: torch.fx.GraphModule) -> int:
    """Replace ``torch.einsum(eq, *operands)`` in Dynamo's graph by ``minductor::einsum``; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (torch.einsum, torch.functional.einsum) or node.kwargs:
            continue
        if not node.args or not isinstance(node.args[0], str):
            continue  # the sublist form einsum(a, [0, 1], b, [1, 2]) stays as it is
        operands = node.args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if not all(isinstance(o, torch.fx.Node) for o in operands) or not worth_xla(node.args[0], operands):
            continue
        node.target = torch.ops.minductor.einsum.default
        node.args = (node.args[0], list(operands))
        count += 1
    if count:
        gm.recompile()
    return count


__all__ = ["einsum", "einsum_grad", "parse", "rewrite_einsum"]
