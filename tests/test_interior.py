"""Interior loops (codegen/cpp_interior.py): a pointwise loop whose body tests index bounds
runs its interior with those tests folded to true, and its edges as before. Results match
eager bit for bit, at every edge, for windows, pads and masks built from index comparisons."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen.cpp_interior import record_comparison


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()


def _check(fn, *args: torch.Tensor, tmp_path: Path, dynamic: bool = False) -> str:
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        out = torch.compile(fn, backend="minductor", dynamic=dynamic)(*args)
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0, equal_nan=True)
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_*.cpp")))


WINDOWS = {
    "max_pool_3x3_s2_p1": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max_pool_ceil": lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
    "max_pool_dilated": lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2),
    "avg_pool_pad": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg_pool_no_pad_count": lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
    "pad": lambda x: F.pad(x, (1, 2, 3, 1)) * 2,
    "pad_crop": lambda x: F.pad(x, (-1, 2, 1, -2)) + 1,
    "reflect_like_roll": lambda x: torch.roll(x, 3, -1) + x,
}


@pytest.mark.parametrize("name", list(WINDOWS))
def test_windows_and_pads_match_eager_at_every_edge(tmp_path: Path, name: str) -> None:
    x = torch.randn(2, 3, 33, 40)
    x[0, 0, 0, 0] = x[1, 2, 32, 39] = x[0, 1, 16, 20] = float("nan")  # corners and interior
    _check(WINDOWS[name], x, tmp_path=tmp_path)


def test_max_pool_interior_runs_without_masks(tmp_path: Path) -> None:
    """The padding tests of the row (outer) and the column (innermost) hold inside: a guard on
    the row, the column loop split at 1, and the tests replaced by true there."""
    code = _check(lambda x: F.max_pool2d(x, 3, 2, 1), torch.randn(2, 4, 32, 32), tmp_path=tmp_path)
    assert "if ((xo1 >= 1))" in code  # (-1 + 2 xo1 >= 0 from 1 on)
    assert "for (int64_t xo2 = 1; xo2 < 16; xo2++)" in code and "for (int64_t xo2 = 0; xo2 < 1; xo2++)" in code
    assert code.count("= true;") == 2


def test_nested_selects_run_their_interior_with_constant_tests(tmp_path: Path) -> None:
    """A circular pad is five nested selects (slice assignments) that test both sides of each
    bound; in the longest piece of the rows and of the columns every test is a constant,
    true or false, so the loads there are plain (the pad at (8, 64, 128, 128): 18 -> 2.6 ms)."""
    code = _check(lambda x: F.pad(x, (3, 3, 2, 2), mode="circular"), torch.randn(2, 4, 40, 48), tmp_path=tmp_path)
    assert "= false;" in code and "= true;" in code and "if ((xo1 >= 2) && (xo1 < 42))" in code, code
    loops = [(int(lo), int(hi)) for lo, hi in re.findall(r"for \(int64_t xo2 = (\d+); xo2 < (\d+); xo2\+\+\)", code)]
    assert any(lo == 3 and hi - lo >= 27 for lo, hi in loops), loops


@pytest.mark.parametrize("case", ["ge", "gt", "le", "lt", "reversed", "negative_coefficient", "two_sided"])
def test_masks_from_index_comparisons(tmp_path: Path, case: str) -> None:
    """Every comparison form, normalized to e >= 0, bounds the interior exactly."""
    n = 64
    masks = {
        "ge": lambda i: i >= 5,
        "gt": lambda i: i > 5,
        "le": lambda i: i <= 58,
        "lt": lambda i: i < 58,
        "reversed": lambda i: 7 < i,
        "negative_coefficient": lambda i: (50 - 2 * i) < 0,
        "two_sided": lambda i: (i >= 3) & (i < 61),
    }

    def fn(x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(n, device=x.device)
        return torch.where(masks[case](i), x * 2, x - 1)

    code = _check(fn, torch.randn(8, n), tmp_path=tmp_path)
    assert "= true;" in code, code


def test_small_interiors_are_left_alone(tmp_path: Path) -> None:
    """An interior under half the loop is not worth two loops: the plain loop only."""
    code = _check(lambda x: F.pad(x, (3, 3)) * 2, torch.randn(4, 8, 2), tmp_path=tmp_path)
    assert "= true;" not in code


def test_symbolic_sizes_keep_the_plain_loop(tmp_path: Path) -> None:
    fn = lambda x: F.max_pool2d(x, 3, 2, 1)  # noqa: E731
    code = _check(fn, torch.randn(2, 3, 20, 24), tmp_path=tmp_path, dynamic=True)
    other = torch.randn(2, 3, 9, 17)
    torch.testing.assert_close(torch.compile(fn, backend="minductor", dynamic=True)(other), fn(other), rtol=0, atol=0)
    assert "= true;" not in code  # the interior's bounds are computed for static sizes only


def test_comparisons_normalize_to_nonnegative_expressions() -> None:
    import sympy

    class K:
        index_values = {"a": sympy.Symbol("x0") * 2 - 1, "c": sympy.Integer(3)}
        index_tests: dict = {}

    for op, want in (("ge", "2*x0 - 4"), ("gt", "2*x0 - 5"), ("le", "4 - 2*x0"), ("lt", "3 - 2*x0")):
        record_comparison(K, op, op, "a", "c")
        assert str(K.index_tests[op]) == want
    record_comparison(K, "float", "ge", "a", "not_an_index")
    assert "float" not in K.index_tests


def test_narrow_integer_values_that_wrap_are_not_followed(tmp_path: Path) -> None:
    """uint8 arithmetic wraps at 256: a test on it must stay a test (arange(300) as uint8)."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(300, dtype=torch.int64).to(torch.uint8)
        return torch.where(i >= 20, x, -x)

    code = _check(fn, torch.randn(4, 300), tmp_path=tmp_path)
    assert "= true;" not in code


def test_roll_over_outer_dims_reads_once_through_a_modular_index(tmp_path: Path) -> None:
    """A Swin block rolls its layer norm's output over (H, W) with the channels innermost: the
    wrap of an outer dim is one load at ``(i + n - s) mod n``, so the fused layer norm's row
    statistics are read once per row (as a select of both sides, every element computed the
    normalized value of four rows: 73 us a call in HF Swin, 8 after)."""
    def block(x, w, b):
        return torch.roll(F.layer_norm(x, (48,), w, b), shifts=(-2, -2), dims=(1, 2)) * 2

    x, w, b = torch.randn(2, 16, 16, 48), torch.randn(48), torch.randn(48)
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        out = torch.compile(block, backend="minductor")(x, w, b)
    torch.testing.assert_close(out, block(x, w, b))
    code = "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_*.cpp")))
    assert "% 16" in code
    assert code.count("mi_rsqrt(") == 1, code  # one normalization per element, not four


@pytest.mark.parametrize("dims", [(1, 2), (2, 3), (0, 3), (-1,), (1,)])
def test_roll_matches_eager_along_any_dims(tmp_path: Path, dims: tuple[int, ...]) -> None:
    """Outer dims wrap through a modular index, the innermost through two plain loops; both
    bit for bit at every shift, also in a channels-last tensor (whose innermost dim is 1)."""
    x = torch.randn(2, 6, 20, 24)
    for shifts in [tuple(s * (k + 1) for k in range(len(dims))) for s in (1, -7, 25)]:
        _check(lambda t, s=shifts: torch.roll(t + 1, s, dims), x, tmp_path=tmp_path)
        torch._dynamo.reset()
        _check(lambda t, s=shifts: torch.roll(t * 3, s, dims), x.to(memory_format=torch.channels_last), tmp_path=tmp_path)
        torch._dynamo.reset()


def test_concatenation_along_the_innermost_dim_runs_a_loop_per_part(tmp_path: Path) -> None:
    """Swin's patch merging layer-norms four images' channels side by side (48 each): the
    reduction loops and the normalizing loop run once per part, each part's tests constant
    (one loop computed all four parts, masked, at every element: 172 us a call, 24 now)."""
    def merge(x, w, b):
        x = torch.roll(x, shifts=(2, 2), dims=(1, 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return F.layer_norm(x.view(2, -1, 192), (192,), w, b)

    args = (torch.randn(2, 16, 16, 48), torch.randn(192), torch.randn(192))
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        out = torch.compile(merge, backend="minductor")(*args)
    torch.testing.assert_close(out, merge(*args))
    code = "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_*.cpp")))
    for lo, hi in [(0, 48), (48, 96), (96, 144)]:
        assert f"for (int64_t mi_base = {lo}; mi_base < {hi}; mi_base += " in code, code  # reductions
    assert "for (int64_t mi_base = 144; mi_base < mi_main;" in code
    assert "for (int64_t xi0 = 144; xi0 < 192; xi0++)" in code  # the normalized output


@pytest.mark.parametrize("widths", [(20, 17, 30), (16, 16, 16, 16, 5), (33, 40)])
def test_pieces_match_eager_at_every_edge(tmp_path: Path, widths: tuple[int, ...]) -> None:
    """Parts of any width: a piece shorter than 16, or a part boundary inside a vector of the
    reduction, keeps the masked loop; results bit for bit (pointwise) and as eager's (sums)."""
    parts = [torch.randn(3, 5, w) for w in widths]
    _check(lambda *p: torch.cat([q * (i + 1) for i, q in enumerate(p)], -1) + 1, *parts, tmp_path=tmp_path)
    torch._dynamo.reset()
    fn = lambda *p: torch.cat([q.exp() for q in p], -1).softmax(-1)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(*parts), fn(*parts))


MASKS = {
    "causal": lambda t: torch.ones(t, t, dtype=torch.bool).tril(),
    "causal_offset": lambda t: torch.ones(t, t, dtype=torch.bool).tril(-3),  # (fully masked rows: NaN, as eager)
    "upper": lambda t: torch.ones(t, t, dtype=torch.bool).triu(),
    "band": lambda t: torch.ones(t, t, dtype=torch.bool).tril() & torch.ones(t, t, dtype=torch.bool).triu(-8),
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("t", [100, 128, 130])
def test_masked_softmax_rows_cut_at_the_diagonal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mask: str, t: int) -> None:
    """A softmax under a mask built from index comparisons (a causal mask inside the model)
    runs its row loops before and after the diagonal with the test constant (the masked part
    reads nothing), the step around it as before: bit for bit the kernel without the cut, and
    eager's values. A band (two cut points) keeps its tests."""
    from minductor.codegen import cpp

    def fn(x: torch.Tensor) -> torch.Tensor:
        keep = MASKS[mask](x.shape[-1])
        return (x * 0.125).masked_fill(~keep, float("-inf")).softmax(-1)

    x = torch.randn(2, 3, t, t)
    with config.patch(debug=True, debug_dir=str(tmp_path / "cut")), torch.no_grad():
        out = torch.compile(fn, backend="minductor")(x)
    source = "\n".join(p.read_text() for p in (tmp_path / "cut").glob("graph_*/cpp_*.cpp"))
    assert ("mi_cut" in source) == (mask != "band"), source
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-6, equal_nan=True)
    torch._dynamo.reset()
    monkeypatch.setattr(cpp, "diagonal_spans", lambda *args: None)
    with config.patch(debug=True, debug_dir=str(tmp_path / "plain"), aot_cache=False), torch.no_grad():
        plain = torch.compile(fn, backend="minductor")(x)
    assert torch.equal(out.nan_to_num(), plain.nan_to_num()) and torch.equal(out.isnan(), plain.isnan())


@pytest.mark.parametrize("channels_last", [True, False])
def test_max_pool_backward_runs_its_interior_under_a_guard_on_clamped_windows(tmp_path: Path, channels_last: bool) -> None:
    """A 3x3/2 max-pool's backward gathers each input's gradient from the windows that may hold
    it, ``min(15, (1 + h) // 2) - 1`` and its neighbours: tests of outer variables that are not
    affine. Each is folded to the value it takes at most rows (true: inside the image) under a
    guard that it does, so the loads there are plain (a ResNet stem's, (4, 32, 32, 32) channels
    last: 1.62 ms -> 0.20). Gradients match eager at every edge."""
    x = torch.randn(4, 32, 32, 32)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    g = torch.randn(4, 32, 16, 16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x), 3, 2, 1)

    leaf, ref_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.compile(fn, backend="minductor")(leaf).backward(g)
    fn(ref_leaf).backward(g)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    (backward,) = [p.read_text() for p in tmp_path.glob("graph_*backward/cpp_*max_pool2d_backward*.cpp")]
    # (channels first, the column's tests are on the innermost variable: a table of them)
    assert "if ((-1 + mi_min_i64(15, (1 + xo" in backward and backward.count("= true;") == 1 + channels_last, backward
