"""View lowerings against eager: each view is tested followed by a pointwise op (the view is folded
into the kernel's indexing) and returned directly (the output must be a correct tensor, whatever its
strides), on contiguous and non-contiguous inputs.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import check, check_named, make

F32, I64, BOOL = torch.float32, torch.int64, torch.bool

# view name -> fn on a (4, 6, 8) tensor
VIEWS: dict[str, Callable[[torch.Tensor], Any]] = {
    "view": lambda x: x.reshape(24, 8).view(6, 4, 8) if x.is_contiguous() else x.reshape(6, 4, 8),
    "view_infer": lambda x: x.reshape(-1, 8),
    "reshape_flat": lambda x: x.reshape(-1),
    "reshape_merge_split": lambda x: x.reshape(2, 12, 8).reshape(8, 3, 8),
    "permute": lambda x: x.permute(2, 0, 1),
    "permute_neg": lambda x: x.permute(-1, -3, -2),
    "transpose": lambda x: x.transpose(0, 2),
    "t_of_2d": lambda x: x[0].t(),
    "mT": lambda x: x.mT,
    "slice_step": lambda x: x[:, 1::2, ::3],
    "slice_neg": lambda x: x[-3:, :-2, -5:-1],
    "slice_step_neg_start": lambda x: x[..., -7::3],
    "slice_empty": lambda x: x[:, 4:2],
    "slice_oob": lambda x: x[:, 2:100],
    "select": lambda x: x[1],
    "select_neg": lambda x: x[:, -1],
    "select_neg_last": lambda x: x.select(-1, -2),
    "index_int_and_slice": lambda x: x[-1, 1:5:2, 3],
    "expand": lambda x: x[:, :1].expand(4, 5, 8),
    "expand_new_dim": lambda x: x[0, 0].expand(3, 8),
    "expand_minus1": lambda x: x[:, None].expand(-1, 2, -1, -1),
    "squeeze": lambda x: x[:, :1, :, None].squeeze(),
    "squeeze_dim": lambda x: x[:, :1].squeeze(1),
    "squeeze_noop": lambda x: x.squeeze(0),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "unsqueeze_neg": lambda x: x.unsqueeze(-1),
    "none_index": lambda x: x[None, :, None],
    "as_strided": lambda x: x.contiguous().as_strided((3, 5), (7, 2), 1),
    "as_strided_overlap": lambda x: x.contiguous().as_strided((4, 4), (1, 1)),
    "flatten": lambda x: x.flatten(),
    "flatten_range": lambda x: x.flatten(1),
    "unflatten": lambda x: x.unflatten(-1, (2, 4)),
    "split": lambda x: x.split(3, dim=1),
    "split_sizes": lambda x: x.split([1, 5, 2], dim=-1),
    "chunk": lambda x: x.chunk(3, dim=2),
    "unbind": lambda x: x.unbind(0),
    "unbind_neg": lambda x: x.unbind(-1)[2:5],
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(offset=2, dim1=1, dim2=2),
    "diagonal_neg_offset": lambda x: x.diagonal(offset=-1, dim1=-1, dim2=0),
    "narrow": lambda x: x.narrow(2, 3, 4),
    "narrow_neg": lambda x: x.narrow(-2, -4, 3),
    "movedim": lambda x: x.movedim(0, -1),
    "swapaxes": lambda x: x.swapaxes(1, 2),
    "view_as_flat_then_slice": lambda x: x.reshape(-1)[5:100:7],
    "unfold": lambda x: x.unfold(2, 3, 2),
    "view_dtype_same_size": lambda x: x.float().contiguous().view(torch.int32),
    "chained": lambda x: x.transpose(0, 1)[1:, ::2].reshape(5, -1).t()[3:],
}


def view_inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    base = torch.randn(8, 6, 4)
    return {
        "contiguous": torch.randn(4, 6, 8),
        "transposed": base.permute(2, 1, 0),
        "sliced": torch.randn(4, 12, 8)[:, ::2],
    }


def _apply(fn: Callable[[torch.Tensor], Any], post: Callable[[torch.Tensor], torch.Tensor],
           x: torch.Tensor) -> Any:
    out = fn(x)
    if isinstance(out, (tuple, list)):
        return tuple(post(o) for o in out)
    return post(out)


def _tolist(out: Any) -> Any:
    return tuple(out) if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_views_then_pointwise(layout: str) -> None:
    """Every view followed by a pointwise op, one graph per input layout."""
    x = view_inputs()[layout]
    fns = {n: (lambda x, fn=fn: _apply(fn, lambda v: v * 2 + 1 if v.is_floating_point() else v + 1, x))
           for n, fn in VIEWS.items()}
    check_named(fns, x)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_views_returned_directly(layout: str) -> None:
    """Every view returned as a graph output (views of inputs and of intermediates)."""
    x = view_inputs()[layout]
    fns = {n: (lambda x, fn=fn: _tolist(fn(x))) for n, fn in VIEWS.items()}
    # x * 2 is exact, so even the bitwise view (float -> int32) must match
    fns.update({f"{n}_of_intermediate": (lambda x, fn=fn: _tolist(fn(x * 2))) for n, fn in VIEWS.items()})
    check_named(fns, x)


def test_view_of_intermediate_returned_with_base() -> None:
    """An intermediate and views of it are all returned: each must see the same data."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x.sin() + 1
        return y, y.t(), y[:, 1::2], y.reshape(-1), y.unsqueeze(0).expand(2, -1, -1), y.diagonal()

    outs = check(fn, make("transposed", F32))
    assert outs[1].data_ptr() == outs[0].data_ptr() or torch.equal(outs[1], outs[0].t())


def test_view_ops_on_0d_and_size1() -> None:
    s = make("scalar", F32)
    one = make("size1", F32)
    check(lambda s, one: (s.view(1, 1) + 1, s.reshape(-1), s.unsqueeze(0).expand(3), s.expand(2, 2) * one,
                          one.squeeze(), one.squeeze() + s, one.view(()), one.expand(3, 4) - 1, one.t(), one[0, 0],
                          one.flatten(), s[None, None], one.permute(1, 0) * 2, one.select(1, -1), one.unbind(0)[0]),
          s, one)


def test_views_of_expanded_input() -> None:
    e = make("expanded", F32)  # (4, 6) with stride 0 in dim 0
    check(lambda e: (e.t() + 1, e[1:, ::2] * 2, e.reshape(24) - 1, e.reshape(2, 2, 6), e.permute(1, 0), e[2],
                     e.unsqueeze(1).expand(4, 3, 6) + 0, e.flatten(), e.diagonal(), e.split(2), e.contiguous()), e)


def test_views_of_int_and_bool() -> None:
    i = make("transposed", I64)
    b = make("sliced", BOOL)
    check(lambda i, b: (i.t()[::2] + 1, i.reshape(-1)[::5], b.t() & True, b.unsqueeze(0).expand(2, 4, 6),
                        b[:, -2:] | b[:, :2], i.diagonal(), torch.where(b.t(), i.t(), 0)), i, b)


def test_reshape_noncontiguous_copies() -> None:
    """reshape of a transposed/sliced input cannot be a view: the copy must be laid out right."""
    x = torch.randn(6, 4, 5).permute(2, 0, 1)
    y = torch.randn(4, 10)[:, ::2]
    check(lambda x, y: (x.reshape(20, 6), x.reshape(-1) + 1, y.reshape(-1), y.reshape(2, 10) * 3,
                        x.reshape(5, 2, 12).sum(1), y.view(-1, 5).t().reshape(-1)), x, y)


def test_contiguous_and_clone_of_views() -> None:
    x = make("sliced", F32)
    check(lambda x: (x.t().contiguous(), x.clone(), x.t().clone(memory_format=torch.contiguous_format),
                     x[:, ::2].contiguous() + 0), x)


def _inplace_on_views_of_intermediate(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y[:, 1:3] += 10
    y.t()[0].mul_(-1)
    y.diagonal().fill_(0)
    return y


def test_view_then_inplace_on_intermediate_contiguous() -> None:
    check(_inplace_on_views_of_intermediate, make("contiguous", F32))


# slice_scatter (a fallback) of a buffer minductor laid out differently from eager: downstream reads
# use the fallback output's real strides (replayed on fake tensors with minductor's layouts).


def test_view_then_inplace_on_intermediate_transposed() -> None:
    check(_inplace_on_views_of_intermediate, make("transposed", F32))


def test_slice_scatter_of_intermediate_then_pointwise() -> None:
    """x*2 has eager strides (1, 4) but minductor realizes it contiguous (6, 1)."""
    x = torch.arange(24.0).reshape(6, 4).t()
    check(lambda a: torch.slice_scatter(a * 2, torch.ones(4, 2), 1, 1, 3) + 0, x)


def test_inplace_through_view_of_input() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x[1:, ::2].add_(1)
        x.t()[0].zero_()
        return x.sum()

    a = torch.randn(5, 6)
    b = a.clone()
    out = torch.compile(fn, backend="minductor")(a)
    ref = fn(b)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(a, b)


def test_cat() -> None:
    x = make("contiguous", F32)
    y = make("transposed", F32, seed=1)
    z = torch.randn(4, 3)
    i = make("sliced", I64)
    b = make("contiguous", BOOL)
    check_named({
        "dim0": lambda x, y, z, i, b: torch.cat([x, y], 0),
        "dim1_sizes": lambda x, y, z, i, b: torch.cat([x, z, y], 1),
        "neg_dim": lambda x, y, z, i, b: torch.cat([z, x], -1),
        "mixed_int_float": lambda x, y, z, i, b: torch.cat([x, i], 0),
        "mixed_bool_int": lambda x, y, z, i, b: torch.cat([b, i], 1),
        "mixed_bool_float": lambda x, y, z, i, b: torch.cat([b, x, z], -1),
        "f64_f32": lambda x, y, z, i, b: torch.cat([x.double(), y], 0),
        "with_empty": lambda x, y, z, i, b: torch.cat([x, torch.empty(0, 6)], 0),
        "with_legacy_1d_empty": lambda x, y, z, i, b: torch.cat([x, torch.zeros(0)], 0),
        "single": lambda x, y, z, i, b: torch.cat([x], 1),
        "of_pointwise": lambda x, y, z, i, b: torch.cat([x.sin(), y * 2, z.relu()], 1),
        "then_pointwise": lambda x, y, z, i, b: torch.cat([x, y], 1).exp() + 1,
        "of_views": lambda x, y, z, i, b: torch.cat([x.t(), y[:, ::3].t(), z.t()], 0),
        "of_expanded": lambda x, y, z, i, b: torch.cat([x[:1].expand(3, 6), y], 0),
        "then_reduction": lambda x, y, z, i, b: torch.cat([x, y], 0).sum(0),
        "same_input_twice": lambda x, y, z, i, b: torch.cat([x, x, x], 1),
        "3d_middle": lambda x, y, z, i, b: torch.cat([x[:, None], y[:, None], y[:, None]], 1),
        "int_only": lambda x, y, z, i, b: torch.cat([i, i * 2], 0),
    }, x, y, z, i, b)


def test_cat_0d_promoted_and_size1() -> None:
    s = make("scalar", F32)
    one = make("size1", F32)
    check(lambda s, one: (torch.cat([s.reshape(1), one.reshape(1), s[None]]), torch.cat([one, one * 2], 1),
                          torch.cat([one, s.view(1, 1)], 0)), s, one)


def test_stack() -> None:
    x = make("contiguous", F32)
    y = make("transposed", F32, seed=1)
    e = make("expanded", F32, seed=2)
    i = make("sliced", I64)
    s = make("scalar", F32)
    check_named({
        "dim0": lambda x, y, e, i, s: torch.stack([x, y]),
        "dim1": lambda x, y, e, i, s: torch.stack([x, y, e], 1),
        "last": lambda x, y, e, i, s: torch.stack([x, e], -1),
        "neg2": lambda x, y, e, i, s: torch.stack([x, y], -2),
        "mixed_dtypes": lambda x, y, e, i, s: torch.stack([x, i]),
        "of_pointwise": lambda x, y, e, i, s: torch.stack([x.exp(), y - 1]).sum(0),
        "0d": lambda x, y, e, i, s: torch.stack([s, s * 2, s + 1]),
        "then_view": lambda x, y, e, i, s: torch.stack([x, y], 2).reshape(4, 12),
        "hstack_vstack": lambda x, y, e, i, s: (torch.hstack([x, y]), torch.vstack([x, e])),
    }, x, y, e, i, s)


def test_split_outputs_used_separately() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a, b, c = x.split([2, 3, 1], dim=1)
        return a.sum(1, keepdim=True) * b + c.relu()

    check(fn, make("transposed", F32))


def test_flip_roll_repeat_tile() -> None:
    x = make("sliced", F32)
    check(lambda x: (x.flip(0), x.flip(-1, 0) + 1, x.roll(2, 1), x.roll(-1), x.repeat(2, 3), x.tile((2,)),
                     x.repeat_interleave(2, dim=0)), x)



@pytest.mark.parametrize("case", ["one_dim", "swin", "big_shifts", "repeated_dim", "flattened", "ints", "channels_last"])
def test_roll_reads_contiguous_runs(case: str, tmp_path: Any) -> None:
    """A roll reads each rolled dim as two contiguous runs (a select the interior loops fold),
    not through a table of ``(i - s) mod n``: results as eager's for negative and oversized
    shifts, several dims, a dim named twice, no dims (the flattened tensor), integers and a
    channels-last input."""
    from pathlib import Path

    from minductor import config

    x = torch.randn(4, 9, 10, 6)
    fns = {
        "one_dim": lambda x: x.roll(3, 2),
        "swin": lambda x: torch.roll(x, (-3, -3), (1, 2)) * 2,
        "big_shifts": lambda x: torch.roll(x, (25, -31, 0), (1, 2, 3)),
        "repeated_dim": lambda x: torch.roll(x, (2, 5), (1, 1)),
        "flattened": lambda x: torch.roll(x, 7) + torch.roll(x.transpose(1, 3), -5).transpose(1, 3),
        "ints": lambda x: (x * 10).int().roll(-4, -1),
        "channels_last": lambda x: x.to(memory_format=torch.channels_last).roll(2, 1) + 1,
    }
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fns[case], backend="minductor")(x)
    torch.testing.assert_close(got, fns[case](x), atol=0, rtol=0)
    source = "\n".join(p.read_text() for p in Path(tmp_path).glob("graph_*/cpp_*.cpp"))
    assert "mi_window_gather" not in source and "fmod" not in source and "mi_bad" not in source, source


def test_flip_of_a_reshape_keeps_division_bases_non_negative() -> None:
    """A flipped dim under a reshape's FloorDiv/ModularIndexing: the index base ``8 - 2*x2 + ...``
    must not lose its whole multiples of the divisor (``1 + (x3 - 2*x2) // 8``): generated code
    divides towards zero, and the rest is negative for some elements."""
    x = torch.randn(5, 1)
    check(lambda x: torch.cat([torch.nn.functional.pad(x, [1, 2])] * 2, 1).reshape(2, 2, 5, 2).flip(2) * 1.5, x)
    check(lambda x: x.reshape(4, 6).flip(1).reshape(3, 4, 2).flip(0, 2) + 1, make("transposed", F32))

def test_constant_pad_and_slice_scatter() -> None:
    x = make("transposed", F32)
    check(lambda x: (torch.nn.functional.pad(x, (1, 2, 0, 3)), torch.nn.functional.pad(x, (-1, 1), value=2.5),
                     torch.slice_scatter(x, x[:, :2] * 10, 1, 0, 4, 2), torch.select_scatter(x, x[0] + 1, 0, -1),
                     torch.diagonal_scatter(x, torch.zeros(4), 0)), x)


@pytest.mark.parametrize("shape,dim", [((0, 1, 0), 0), ((0, 1, 0), 2), ((3, 0), 1)])
def test_stack_and_reshape_of_empty_tensors(shape: tuple[int, ...], dim: int) -> None:
    """Zero-size dims: the reshape index map is never evaluated (no division by a zero stride)."""
    a, b = torch.randn(shape), torch.randn(shape)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a, b], dim).reshape(-1, 1) + 1

    out = torch.compile(f, backend="minductor")(a, b)
    torch.testing.assert_close(out, f(a, b))
