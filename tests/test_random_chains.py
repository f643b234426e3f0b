"""Random chains of views, indirect reads, masks, scans and reductions, forward and backward,
against eager with an fp64 referee; and chains of shape-generic ops compiled once with dynamic
shapes, run at several sizes.

Each seed draws an input shape and a chain of 2-7 ops whose parameters are fixed when drawn
(index tensors, masks and weights are constants of the graph). Views over views (reshape of a
permute of a slice, flips, unfolds, pads, cats) make the FloorDiv/ModularIndexing indices that
loop merging, index folding and masked loads must all get right; the chains found four
wrong-answer bugs (merged loops reading a view's folded index, a flip under a reshape divided
towards zero, sin/cos batched ahead of a fused producer's store, a bounds check firing in a
cat's masked-off lanes).

Where compiled and eager differ beyond float32 tolerances, the compiled result may be no further
from the fp64 result than 4x eager's own error plus 1e-5 of the largest value: ill-conditioned
chains (a softmax of squared cumulative sums) round differently in another summation order, and
neither answer is more right than the other there.
"""
from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

Op = tuple[str, Callable[[torch.Tensor], torch.Tensor]]


def _factor(n: int, rng: random.Random) -> list[int]:
    dims = []
    while n > 1 and len(dims) < 4:
        d = rng.choice([d for d in range(2, n + 1) if n % d == 0])
        dims.append(d)
        n //= d
    if n > 1:
        dims.append(n)
    rng.shuffle(dims)
    return dims or [1]


def _views(x: torch.Tensor, rng: random.Random, nd: int) -> Op | None:
    kind = rng.choice(["permute", "reshape", "slice", "expand", "flip", "transpose", "unfold", "contiguous"])
    d = rng.randrange(max(nd, 1))
    if kind == "permute" and nd >= 2:
        p = rng.sample(range(nd), nd)
        return f"permute{p}", lambda t: t.permute(p)
    if kind == "reshape":
        s = _factor(x.numel(), rng)
        return f"reshape{s}", lambda t: t.reshape(s)
    if kind == "slice" and nd and x.shape[d] >= 2:
        a = rng.randrange(x.shape[d])
        b, step = rng.randrange(a + 1, x.shape[d] + 1), rng.choice([1, 2, 3])
        return f"slice(d{d},{a}:{b}:{step})", lambda t: t[(slice(None),) * d + (slice(a, b, step),)]
    if kind == "expand":
        d, e = rng.randrange(nd + 1), rng.randrange(2, 4)
        return f"expand(d{d},{e})", lambda t: t.unsqueeze(d).expand(*t.shape[:d], e, *t.shape[d:])
    if kind == "flip" and nd:
        return f"flip{d}", lambda t: t.flip(d)
    if kind == "transpose" and nd >= 2:
        a, b = rng.sample(range(nd), 2)
        return f"transpose{a}{b}", lambda t: t.transpose(a, b)
    if kind == "unfold" and nd and x.shape[d] >= 2:
        size = rng.randrange(1, x.shape[d])
        return f"unfold(d{d},{size})", lambda t: t.unfold(d, size, 1)
    if kind == "contiguous":
        return "contiguous", lambda t: t.contiguous()
    return None


def _others(x: torch.Tensor, rng: random.Random, nd: int) -> Op | None:
    kind = rng.choice(["pointwise", "index_select", "gather", "index_add", "cat", "pad", "roll", "masked_fill",
                       "where", "sum", "amax", "var", "softmax", "log_softmax", "layer_norm", "cumsum", "matmul"])
    d = rng.randrange(max(nd, 1))
    n = x.shape[d] if nd else 1
    if kind == "pointwise":
        name, fn = rng.choice([("sin", torch.sin), ("sigmoid", torch.sigmoid), ("square", lambda t: t * t),
                               ("relu", torch.relu), ("add1", lambda t: t + 1)])
        return name, fn
    if kind == "masked_fill":
        mask = torch.rand(x.shape) < 0.3
        return "masked_fill", lambda t: t.masked_fill(mask, -2.0)
    if kind == "where":
        return "where", lambda t: torch.where(t > 0, t.tanh().exp(), t * 0.5)  # no overflow
    if not nd:
        return None
    if kind == "index_select":
        idx = torch.randint(0, n, (rng.randrange(1, 5),))
        return f"index_select(d{d},{idx.tolist()})", lambda t: t.index_select(d, idx)
    if kind == "gather":
        shape = list(x.shape)
        shape[d] = rng.randrange(1, 4)
        idx = torch.randint(0, n, shape)
        return f"gather(d{d},{shape})", lambda t: t.gather(d, idx)
    if kind == "index_add":
        idx = torch.randint(0, n, (rng.randrange(1, 4),))
        return f"index_add(d{d},{idx.tolist()})", lambda t: t.index_add(d, idx, t.index_select(d, idx) * 3)
    if kind == "cat":
        return f"cat{d}", lambda t: torch.cat([t, t * 2], d)
    if kind == "pad":
        pad = [0, 0] * (nd - 1 - d) + [1, 2]
        return f"pad{pad}", lambda t: F.pad(t, pad)
    if kind == "roll":
        s = rng.randrange(-3, 4)
        return f"roll({s},d{d})", lambda t: t.roll(s, d)
    if kind == "sum" and nd >= 2:
        return f"sum{d}", lambda t: t.sum(d)
    if kind == "amax":
        keep = rng.random() < 0.5
        return f"amax(d{d},{keep})", lambda t: t.amax(d, keepdim=keep)
    if kind == "var":
        return f"var{d}", lambda t: t.var(d, keepdim=True, correction=0)
    if kind in ("softmax", "log_softmax"):
        return f"{kind}{d}", lambda t: getattr(t, kind)(d)
    if kind == "layer_norm":
        last = x.shape[-1]
        return "layer_norm", lambda t: F.layer_norm(t, (last,))
    if kind == "cumsum":
        return f"cumsum{d}", lambda t: t.cumsum(d)
    if kind == "matmul" and nd >= 2:
        w = torch.randn(x.shape[-1], rng.randrange(1, 5))
        return f"matmul{list(w.shape)}", lambda t: t @ w.to(t.dtype)
    return None


def random_chain(seed: int) -> tuple[list[int], list[str], Callable[[torch.Tensor], torch.Tensor]]:
    """An input shape, the chain's op labels, and the chain as a function."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    big = rng.random() < 0.3  # sizes that reach vectorized, tiled and parallel loops
    shape = [rng.choice([1, 3, 16, 17, 33, 64]) if big else rng.randrange(1, 7) for _ in range(rng.randrange(1, 4))]
    x, chain = torch.randn(shape), []
    for _ in range(rng.randrange(2, 8)):
        op = (_views if rng.random() < 0.5 else _others)(x, rng, x.dim())
        if op is None:
            continue
        y = op[1](x)
        if y.numel() == 0 or y.numel() > 200_000:
            break
        chain.append(op)
        x = y

    def fn(t: torch.Tensor) -> torch.Tensor:
        for _, op_fn in chain:
            t = op_fn(t)
        return t * 1.5

    return shape, [label for label, _ in chain], fn


def _close(got: torch.Tensor, eager: torch.Tensor, fp64: torch.Tensor, what: str) -> None:
    try:
        torch.testing.assert_close(got, eager, atol=1e-4, rtol=1e-4)
    except AssertionError:
        err, eager_err = ((t.double() - fp64).abs().max().item() for t in (got, eager))
        scale = max(1.0, fp64.abs().max().item())
        assert err <= 4 * eager_err + 1e-5 * scale, \
            f"{what}: error vs fp64 {err:.3g}, eager's {eager_err:.3g}, values up to {scale:.3g}"


@pytest.mark.parametrize("seed", [*range(48), 574, 840])  # (and two chains that failed once)
def test_random_chain_matches_eager_forward_and_backward(seed: int) -> None:
    shape, labels, fn = random_chain(seed)
    torch.manual_seed(seed + 1000)
    x = torch.randn(shape)
    xs = [x.clone().requires_grad_() for _ in range(2)] + [x.double().requires_grad_()]
    torch._dynamo.reset()
    got = torch.compile(fn, backend="minductor", dynamic=False)(xs[0])
    eager, fp64 = fn(xs[1]), fn(xs[2])
    _close(got, eager, fp64, f"output of {shape} {labels}")
    grad = torch.randn_like(eager)
    for y, g in zip((got, eager, fp64), (grad, grad, grad.double())):
        y.backward(g)
    _close(xs[0].grad, xs[1].grad, xs[2].grad, f"gradient of {shape} {labels}")


def _generic_op(nd: int, rng: random.Random) -> tuple[str, Callable[[torch.Tensor], torch.Tensor], int]:
    """An op that applies at any size of a rank-``nd`` input: (label, fn, rank after)."""
    d = rng.randrange(nd)
    kind = rng.choice(["permute", "inner_slice", "step", "expand", "flip", "pointwise", "contiguous", "sum", "cat",
                       "pad", "softmax", "cumsum", "amax", "var", "layer_norm", "flatten"])
    if kind == "permute" and nd >= 2:
        p = rng.sample(range(nd), nd)
        return f"permute{p}", lambda t: t.permute(p), nd
    if kind == "inner_slice":
        return f"[1:-1](d{d})", lambda t: t[(slice(None),) * d + (slice(1, -1),)], nd
    if kind == "step":
        return f"[::2](d{d})", lambda t: t[(slice(None),) * d + (slice(None, None, 2),)], nd
    if kind == "expand":
        e = rng.randrange(2, 4)
        return f"expand(d{d},{e})", lambda t: t.unsqueeze(d).expand(*t.shape[:d], e, *t.shape[d:]), nd + 1
    if kind == "flip":
        return f"flip{d}", lambda t: t.flip(d), nd
    if kind == "contiguous":
        return "contiguous", lambda t: t.contiguous(), nd
    if kind == "sum" and nd >= 2:
        return f"sum{d}", lambda t: t.sum(d), nd - 1
    if kind == "cat":
        return f"cat{d}", lambda t: torch.cat([t, t * 2], d), nd
    if kind == "pad":
        return "pad[1, 2]", lambda t: F.pad(t, [1, 2]), nd
    if kind in ("softmax", "cumsum"):
        return f"{kind}{d}", lambda t: getattr(t, kind)(d), nd
    if kind == "amax":
        return f"amax{d}", lambda t: t.amax(d, keepdim=True), nd
    if kind == "var":
        return f"var{d}", lambda t: t.var(d, keepdim=True, correction=0), nd
    if kind == "layer_norm":
        return "layer_norm", lambda t: F.layer_norm(t, (t.shape[-1],)), nd
    if kind == "flatten" and nd >= 2:
        return "flatten01", lambda t: t.flatten(0, 1), nd - 1
    name, fn = rng.choice([("sin", torch.sin), ("sigmoid", torch.sigmoid), ("square", lambda t: t * t)])
    return name, fn, nd


@pytest.mark.parametrize("seed", [*range(24), 287, 390, 446, 709, 919, 1101])  # (and chains that failed once)
def test_random_chain_over_symbolic_sizes_matches_eager(seed: int) -> None:
    """One graph compiled with dynamic shapes, three input sizes: the chains found a heap
    overflow (column partials over a width ``3 + s0`` indexed without parentheses), slices whose
    clamped lengths did not broadcast with Dynamo's sizes, and torch's own Max/FloorDiv reaching
    the C++ printer."""
    rng = random.Random(seed)
    rank = nd = rng.randrange(1, 4)
    chain = []
    for _ in range(rng.randrange(2, 7)):
        label, fn, nd = _generic_op(nd, rng)
        chain.append((label, fn))

    def fn(t: torch.Tensor) -> torch.Tensor:
        for _, op_fn in chain:
            t = op_fn(t)
        return t * 1.5

    torch._dynamo.reset()
    torch.manual_seed(seed)
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for _ in range(3):
        shape = [rng.randrange(3, 40) for _ in range(rank)]
        x = torch.randn(shape)
        xs = [x.clone().requires_grad_() for _ in range(2)] + [x.double().requires_grad_()]
        got, eager, fp64 = compiled(xs[0]), fn(xs[1]), fn(xs[2])
        labels = [label for label, _ in chain]
        _close(got, eager, fp64, f"output of {shape} {labels}")
        grad = torch.randn_like(eager)
        for y, g in zip((got, eager, fp64), (grad, grad, grad.double())):
            y.backward(g)
        _close(xs[0].grad, xs[1].grad, xs[2].grad, f"gradient of {shape} {labels}")
