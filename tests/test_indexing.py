"""Indirect reads (advanced indexing, gather, index_select, embedding, take, take_along_dim)
and index-remapping copies (flip, repeat, unfold, *_copy): fused loops, no aten fallback,
eager's results and eager's errors."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import metrics


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="minductor", dynamic=False)


torch.manual_seed(0)
X = torch.randn(4, 5, 6, 7)
I = torch.tensor([[0, -1], [2, 3]])
J = torch.tensor([1, -5])
CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "adjacent_pair": (lambda x, i, j: x[:, i, j], (X, I, J)),
    "separated_by_slice": (lambda x, i, j: x[i, :, j], (X, I, J)),
    "three_separated": (lambda x, i, j: x[i, :, j, i], (X, I, J)),
    "ellipsis_last_dim": (lambda x, i: x[..., i], (X, I)),
    "int32_index": (lambda x, i: x[:, i.int()], (X, I)),
    "transposed_source": (lambda x, i: x.transpose(1, 3)[i], (X, I)),
    "expanded_source": (lambda x, i: x.expand(3, 5, 7)[:, i], (torch.randn(1, 5, 1), I)),
    "index_from_0d_tensor": (lambda x, i: x[:, i[0, 1]], (X, I)),
    "one_element_broadcast": (lambda x, i, j: x[i[:1, :1], j], (X, I, J)),
    "half_source": (lambda x, i: x.half()[i, 2], (X, I)),
    "unsafe_index": (lambda x, i: torch.ops.aten._unsafe_index(x, [None, i]), (X, I)),
    "gather_negative_dim": (lambda x, i: torch.gather(x, -1, i), (X, torch.randint(0, 7, (4, 5, 6, 2)))),
    "gather_smaller_index": (lambda x, i: torch.gather(x, 1, i), (X, torch.randint(0, 5, (2, 3, 1, 7)))),
    "index_select_0d_index": (lambda x, i: torch.index_select(x, 1, i[1, 0]), (X, I)),
    "index_select_int32": (lambda x, i: torch.index_select(x, 3, i.int().abs().flatten()), (X, I)),
    "embedding_padding_idx": (lambda w, i: F.embedding(i, w, padding_idx=0), (torch.randn(10, 4), torch.tensor([[1, 9], [0, 0]]))),
    "embedding_1d_indices": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(10, 4), torch.tensor([1, 9, 0]))),
    "take_wraps_negative": (lambda x, i: torch.take(x, i), (X, torch.tensor([[0, -1], [100, 839]]))),
    "take_along_dim_flat": (lambda x, i: torch.take_along_dim(x, i), (X, torch.tensor([0, 5, 839]))),
    "flip": (lambda x: torch.flip(x, (0, -1)) + 1, (X,)),
    "flip_transposed": (lambda x: x.t().flip(0), (torch.randn(3, 5),)),
    "repeat_new_dims": (lambda x: x.repeat(2, 1, 3, 1, 2) * 2, (X,)),
    "tile": (lambda x: torch.tile(x[0, 0], (3,)), (X,)),
    "unfold_sliding_windows": (lambda x: x.unfold(2, 3, 2).sum(-1), (X,)),
    "narrow_copy": (lambda x: torch.narrow_copy(x, 1, -3, 2), (X,)),
    "permute_and_view_copy": (lambda x: (torch.permute_copy(x, (3, 1, 0, 2)), torch.ops.aten.view_copy(x, (20, -1))),
                              (X,)),
    "unbind_copy": (lambda x: torch.unbind_copy(x, 1), (X,)),
    "index_select_scalar_source": (lambda x, i: torch.index_select(x[0, 0, 0, 0], 0, i[0, :1]), (X, I)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_indirect_read(name: str) -> None:
    fn, args = CASES[name]
    torch.testing.assert_close(compiled(fn)(*args), fn(*args), rtol=0, atol=0)
    assert not metrics.fallback_ops, metrics.fallback_ops


def test_index_fuses_with_consumer() -> None:
    fn = compiled(lambda x, i: (x[i].exp() * 2).sum(-1))
    torch.testing.assert_close(fn(X, I), (X[I].exp() * 2).sum(-1))
    assert metrics.generated_kernel_count == 1 and not metrics.fallback_ops


@pytest.mark.parametrize("fn", [
    lambda x, i: torch.gather(x, 0, i),
    lambda x, i: torch.index_select(x, 0, i.flatten()),
    lambda x, i: F.embedding(i, x),
    lambda x, i: x[i],
], ids=["gather", "index_select", "embedding", "index"])
@pytest.mark.parametrize("bad", [-4, 3], ids=["negative", "past_end"])
def test_out_of_range_raises_like_eager(fn: Callable[..., Any], bad: int) -> None:
    """Eager raises for these; negative indices are valid only for advanced indexing."""
    x, i = torch.randn(3, 2), torch.tensor([[0], [bad]])
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, i)
    with pytest.raises(IndexError, match="index out of range"):
        compiled(fn)(x, i)


def test_negative_index_is_out_of_range_for_gather_but_wraps_for_index() -> None:
    x, i = torch.randn(3, 2), torch.tensor([[0, -1]])
    torch.testing.assert_close(compiled(lambda x, i: x[i])(x, i), x[i])
    with pytest.raises(IndexError):
        compiled(lambda x, i: torch.gather(x, 1, i))(x, i)


def test_wrong_index_dtype_raises_like_eager() -> None:
    x, i = torch.randn(3, 2), torch.tensor([[0.0, 1.0]])
    with pytest.raises(RuntimeError, match="int64"):
        torch.gather(x, 1, i)
    with pytest.raises(Exception, match="int64"):
        compiled(lambda x, i: torch.gather(x, 1, i))(x, i)


FLOAT_INDEX = {
    "index_select": (lambda x, i: x.index_select(0, i), "index_select(): Expected dtype int32 or int64 for index"),
    "index": (lambda x, i: x[i], "tensors used as indices must be long, int, byte or bool tensors"),
    "embedding": (lambda x, i: F.embedding(i, x), "to have one of the following scalar types: Long, Int"),
    "index_put": (lambda x, i: x.index_put((i,), torch.ones(2)), "tensors used as indices must be long, int, byte or bool"),
    "index_add": (lambda x, i: x.index_add(0, i, torch.ones(2, 2)), "index_add_(): Expected dtype int32/int64 for index"),
    "gather": (lambda x, i: x.gather(0, i.view(2, 1)), "gather(): Expected dtype int32/int64 for index"),
}


@pytest.mark.parametrize("name", sorted(FLOAT_INDEX))
def test_float_index_raises_eagers_error(name: str) -> None:
    """A float index tensor raises eager's message, as a RuntimeError (or eager's IndexError): a
    lowering leaves it to aten, which raises eager's own error at run time; some are caught while
    Dynamo traces (a TorchRuntimeError, a RuntimeError, quoting eager's message)."""
    fn, message = FLOAT_INDEX[name]
    x, i = torch.randn(3, 2), torch.tensor([0.0, 1.0])
    with pytest.raises(Exception, match=re.escape(message)) as eager:
        fn(x, i)
    with pytest.raises((type(eager.value), RuntimeError), match=re.escape(message)):
        compiled(fn)(x, i)


def test_bounds_check_flag(tmp_path: Any) -> None:
    """``config.bounds_check`` (``MINDUCTOR_BOUNDS_CHECK``) on: out-of-range indices raise; off:
    the generated code has no check (valid indices give the same results)."""
    from minductor import config

    fn = lambda x, i: torch.gather(x, 0, i) * 2
    x, i = torch.randn(3, 2), torch.tensor([[0, 2], [1, 0]])
    for flag in (True, False):
        torch._dynamo.reset()
        dump = tmp_path / str(flag)
        with config.patch(bounds_check=flag, debug=True, debug_dir=str(dump)):
            torch.testing.assert_close(compiled(fn)(x, i), fn(x, i))
            if flag:
                with pytest.raises(IndexError, match="index out of range"):
                    compiled(fn)(x, torch.tensor([[0, 3], [1, 0]]))
        source = "".join(p.read_text() for p in dump.glob("*/*.cpp"))
        assert ("mi_err" in source) == flag, source


def test_merged_loops_fold_indices_over_their_own_ranges() -> None:
    """col2im's index_put (F.fold's backward through unfold) reads its values through
    index -> permute -> view -> view -> permute: the read index holds ``x5 // 6`` for ``x5 < 6``,
    zero over the loop's ranges but not once loops merge (it read out of range)."""
    def col2im(idx: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        rows = idx[:, :, None, None]
        cols = F.pad(grad, [1, 1, 1, 1])[:, :, rows, idx]  # (2, 3, 3, 6, 3, 6)
        vals = cols.permute(0, 1, 2, 4, 3, 5).reshape(2, 27, 36).view(2, 3, 3, 3, 6, 6).permute(0, 1, 2, 4, 3, 5)
        out = torch.ops.aten.index_put(torch.zeros(2, 3, 8, 8), [None, None, rows, idx], vals, True)
        return out[:, :, 1:-1, 1:-1]
    idx = torch.arange(6)[None, :] + torch.arange(3)[:, None]
    grad = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(compiled(col2im)(idx, grad), col2im(idx, grad))
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    fold_unfold = lambda x: F.fold(F.unfold(x, 3, padding=1), (6, 6), 3, padding=1)  # noqa: E731
    compiled(fold_unfold)(x).sum().backward()
    expected = torch.autograd.grad(fold_unfold(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


STATIC_CASES: dict[str, tuple[Callable[..., Any], str]] = {
    # (fn, "direct": positions computed, no bounds check; "checked": an indirect read, checked;
    # "raises": out of range, eager's IndexError)
    "unfold_3x3_padded": (lambda x: F.unfold(x, 3, padding=1), "direct"),
    "unfold_strided_dilated": (lambda x: F.unfold(x, (2, 3), dilation=(2, 1), stride=(1, 2)), "direct"),
    "arange_from_the_end": (lambda x: x[:, :, torch.arange(-4, 0)], "direct"),
    "arange_sum_of_two": (lambda x: x[:, :, torch.arange(4)[:, None] + torch.arange(3)], "direct"),
    "upsample_nearest_2x": (lambda x: F.interpolate(x, scale_factor=2), "direct"),  # float steps, exact
    "upsample_nearest_to_11": (lambda x: F.interpolate(x, size=(11, 11)), "checked"),  # 8/11: not exact
    "float_arange_truncated": (lambda x: x[:, :, (torch.arange(8.0) * 0.75).long()], "direct"),
    "arange_past_the_end": (lambda x: x[:, :, torch.arange(6) + 3], "raises"),
}


@pytest.mark.parametrize("name", sorted(STATIC_CASES))
def test_index_tensors_computed_from_aranges_read_directly(name: str, tmp_path) -> None:
    """Index tensors built from aranges (im2col's, upsample-nearest's float ones while every
    step is exact) become positions computed from the index when every value is in range: no
    bounds check, no index error buffer; otherwise the checked indirect read stays, and raises
    eager's error."""
    from minductor import config

    fn, kind = STATIC_CASES[name]
    x = torch.randn(2, 3, 8, 8)
    if kind == "raises":
        with pytest.raises(IndexError):
            fn(x)
        with pytest.raises(IndexError, match="index out of range"):
            compiled(fn)(x)
        return
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(compiled(fn)(x), fn(x))
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    assert ("mi_err" in code) == (kind == "checked"), code
    assert not metrics.fallback_ops


def test_max_embedding_bags_of_one_size_are_a_fused_reduction() -> None:
    """``F.embedding_bag`` of a 2-D input in max mode (bags of one size: an arange of offsets in
    the graph) is a reduction over gathered rows, eager's result; an index out of range raises
    eager's IndexError; sum bags, and bags from the caller's offsets, stay aten's kernel."""
    w, i = torch.randn(50, 24), torch.randint(0, 50, (12, 5))
    torch.testing.assert_close(compiled(lambda w, i: F.embedding_bag(i, w, mode="max"))(w, i),
                               F.embedding_bag(i, w, mode="max"))
    assert not metrics.fallback_ops
    with pytest.raises(IndexError, match="index out of range"):
        compiled(lambda w, i: F.embedding_bag(i, w, mode="max") + 1)(w, torch.full((12, 5), 50))
    torch._dynamo.reset()
    offsets = torch.tensor([0, 3, 3, 10])
    for fn, args in [(lambda w, i: F.embedding_bag(i, w, mode="sum"), (w, i)),
                     (lambda w, i, o: F.embedding_bag(i, w, o, mode="max"), (w, i.flatten(), offsets))]:
        metrics.reset()
        torch.testing.assert_close(compiled(fn)(*args), fn(*args))
        assert metrics.fallback_ops["aten._embedding_bag_forward_only"] == 1, dict(metrics.fallback_ops)


def test_as_strided_counts_its_offset_from_the_inputs_storage(cpu_backend: str) -> None:
    """``as_strided(x, size, stride, offset)`` addresses ``x``'s storage from its start, while
    kernels address an input from its first element: an input sliced at offset 5 was read 5
    elements too far. The input's offset is bound at each call, so a graph compiled for one
    offset (or served from a cache) is right for another, static or dynamic."""
    base = torch.arange(40.0)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.as_strided(x, (2, 3), (1, 2), 3) * 2 + x[:1]

    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="minductor", dynamic=dynamic)
        for start in (5, 0, 7):
            x = base[start:start + 10 + start]
            torch.testing.assert_close(compiled(x), fn(x))
