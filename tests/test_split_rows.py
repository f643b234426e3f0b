"""Reductions along a strided dim over many rows (``x.sum(0)``) split the rows across threads:
each thread reduces its chunk of rows into per-thread partials of every column, combined in
thread order. Results match eager for every reduction kind, dtype and odd size, and a given
input always gives the same bits (the combine order is fixed)."""
from __future__ import annotations

import pytest
import torch

from minductor import config
from minductor.lowering import reduction


def compiled(fn, *args, tmp_path):
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(*args)
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    return got, code


CASES = {
    "sum": (lambda x: x.sum(0), torch.float32),
    "amax": (lambda x: x.amax(0), torch.float32),
    "amin_int": (lambda x: x.amin(0), torch.int32),
    "prod_double": (lambda x: (x * 0.01 + 1).prod(0), torch.float64),
    "argmax": (lambda x: x.argmax(0), torch.float32),
    "var": (lambda x: x.var(0), torch.float32),
    "mean_3d": (lambda x: x.mean(0), torch.float32),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("shape", [(600, 70), (1031, 4099)], ids=["narrow", "wide"])
def test_split_rows_match_eager(tmp_path, monkeypatch, name: str, shape: tuple[int, int]) -> None:
    fn, dtype = CASES[name]
    if name == "var":  # Welford's lanes (inputs above the last-level cache; smaller ones take two passes)
        monkeypatch.setattr(reduction, "TWO_PASS_MAX_BYTES", 0)
    if name == "mean_3d":
        shape = (shape[0], 3, shape[1] // 3)
    x = torch.randn(shape, dtype=torch.float64).mul(50).to(dtype) if dtype == torch.int32 else torch.randn(shape, dtype=dtype)
    got, code = compiled(fn, x, tmp_path=tmp_path)
    torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=1e-4)
    assert "_partial[mi_tid *" in code  # the rows were split across threads


def test_split_rows_deterministic_and_nan(tmp_path) -> None:
    x = torch.randn(2000, 500)
    x[1500, 7] = float("nan")
    fn = torch.compile(lambda t: (t.sum(0), t.amax(0)), backend="minductor")
    first = fn(x)
    for got, ref in zip(first, (x.sum(0), x.amax(0))):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, equal_nan=True)
    for _ in range(3):
        torch.testing.assert_close(fn(x), first, rtol=0, atol=0, equal_nan=True)  # the same bits


def test_few_rows_keep_column_tiles(tmp_path) -> None:
    x = torch.randn(100, 4096)
    got, code = compiled(lambda t: t.sum(0), x, tmp_path=tmp_path)
    torch.testing.assert_close(got, x.sum(0))
    assert "_partial[" not in code


# full reductions: the threads split the elements (or the first of several reduced dims),
# then any scalar epilogue (a mean's division) runs after the partials combine
FULL = {
    "mean": (lambda x: x.mean(), (300, 301), "ri0 = mi_base + mi_lane"),
    "mean_of_pool": (lambda x: torch.nn.functional.max_pool2d(x.relu(), 2).mean(), (4, 16, 64, 64), "ri0 = mi_begin"),
    "std": (lambda x: x.std(), (257, 255), None),
    "amax_div": (lambda x: x.amax() / 2, (300, 301), None),
}


@pytest.mark.parametrize("case", list(FULL))
def test_full_reduction_with_epilogue_runs_on_all_threads(case: str, tmp_path) -> None:
    fn, shape, chunked = FULL[case]
    x = torch.randn(*shape)
    got, code = compiled(fn, x, tmp_path=tmp_path)
    torch.testing.assert_close(got, fn(x.double()).float(), rtol=1e-5, atol=1e-5)
    assert code.count("#pragma omp parallel num_threads(mi_nt)") == 1, code
    assert "_partial[mi_tid]" in code, code
    if chunked:
        assert chunked in code, code
