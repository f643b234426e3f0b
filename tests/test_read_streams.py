"""Reductions that read along several far-apart streams at once (codegen/cpp_read_streams.py):
full reductions cut each thread's chunk in parts, row reductions of long rows reduce a row of
each part of the thread's rows in step. The results are compared with eager at row counts
and lengths that leave remainders (rows past a thread's last, scalar tails), at thread counts
that split the rows unevenly, and with a symbolic row count; the kernels are checked to take
(or not take) the streamed shape."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minductor import config

ROWS_MARK = "// rows per stream"
FULL_MARK = "// each stream's part"


def _run(fn, args, tmp_path: Path, atol: float, rtol: float = 1e-5, dynamic_rows: bool = False, again=()) -> str:
    torch._dynamo.reset()
    if dynamic_rows:
        torch._dynamo.mark_dynamic(args[0], 0)
    with config.patch(debug=True, debug_dir=str(tmp_path), aot_cache=False):
        compiled = torch.compile(fn, backend="minductor")
        for a in (args, *again):
            torch.testing.assert_close(compiled(*a), fn(*a), atol=atol, rtol=rtol, equal_nan=True)
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# (fn, dtype, atol, reads in streams): sums and products of one input do
ROW_CASES = {
    "sum": (lambda x: x.sum(1), torch.float32, 1e-4, True),
    "mean": (lambda x: x.mean(1), torch.float32, 1e-5, True),
    "sum_of_squares": (lambda x: (x * x).sum(-1), torch.float32, 1e-3, True),
    "prod": (lambda x: (1 + x / 4096).prod(1), torch.float64, 1e-9, True),
    "int_sum": (lambda x: (x * 100).to(torch.int64).sum(1), torch.float32, 0, True),
    "bf16_sum": (lambda x: x.bfloat16().sum(1), torch.float32, 0.2, True),
    "amax": (lambda x: x.amax(1), torch.float32, 0, False),
    "any": (lambda x: (x > 3.5).any(1), torch.float32, 0, False),
    "sum_and_max": (lambda x: (x.sum(1), x.max(1).values), torch.float32, 1e-4, False),
    "sum_of_product": (lambda x: (x * x.flip(0)).sum(1), torch.float32, 1e-3, False),
    "rows_times_one_row": (lambda x: (x * x[1]).sum(1), torch.float32, 1e-3, True),  # a vector the caches hold
}


@pytest.mark.parametrize("shape", [(64, 1024), (37, 1031), (19, 2053)])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
@pytest.mark.parametrize("case", list(ROW_CASES))
def test_row_reductions_in_streams_match_eager(case: str, nthreads: int, shape, tmp_path: Path, threads) -> None:
    torch.set_num_threads(nthreads)
    fn, dtype, atol, streams = ROW_CASES[case]
    x = torch.randn(shape, dtype=dtype)
    x[3, 5] = float("nan") if case in ("amax", "sum") else x[3, 5]  # NaN rows stay NaN (max propagates it)
    source = _run(fn, (x,), tmp_path, atol=atol)
    streamed = streams and shape[0] >= 4 * 2 * nthreads
    assert (ROWS_MARK in source) == streamed, source


def test_row_streams_with_a_symbolic_row_count(tmp_path: Path, threads) -> None:
    """Compiled at 64 rows, called at 3 and 101: threads with fewer rows than streams, and none."""
    torch.set_num_threads(2)
    def fn(x):
        return x.sum(1) * 2

    sizes = [(3, 1100), (101, 1100), (1, 1100)]
    source = _run(fn, (torch.randn(64, 1100),), tmp_path, atol=1e-4, dynamic_rows=True,
                  again=[(torch.randn(s),) for s in sizes])
    assert ROWS_MARK in source, source


@pytest.mark.parametrize("numel", [1 << 16, 100_003, 1_000_001])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_full_reductions_in_streams_match_eager(numel: int, nthreads: int, tmp_path: Path, threads) -> None:
    torch.set_num_threads(nthreads)
    x = torch.randn(numel, dtype=torch.float64)
    source = _run(lambda t: (t.sum(), (t * t).mean()), (x,), tmp_path, atol=1e-9)
    assert FULL_MARK in source, source


def test_full_reduction_of_fewer_elements_than_a_step(tmp_path: Path) -> None:
    """Chunks shorter than one step of every stream reduce in the scalar tail alone."""
    x = torch.randn(4, 50)
    _run(lambda t: t.sum(), (x,), tmp_path, atol=1e-5)
    x = torch.randn(3000)
    _run(lambda t: t.sum(), (x,), tmp_path, atol=1e-4)


@pytest.mark.parametrize("case, fn", [
    ("welford", lambda x: torch.var_mean(x, 1)),
    ("argmax", lambda x: x.argmax(1)),
    ("short_rows", lambda x: x[:, :512].sum(1)),
    ("softmax", lambda x: torch.softmax(x, 1)),
    ("full_amax", lambda x: x.abs().amax()),
    ("full_sum_of_two_runs", lambda x: (x[:32] * x[32:]).sum()),
])
def test_other_reductions_read_along_one_stream(case: str, fn, tmp_path: Path, threads) -> None:
    torch.set_num_threads(2)
    source = _run(fn, (torch.randn(64, 1024),), tmp_path, atol=1e-5)
    assert ROWS_MARK not in source and FULL_MARK not in source, source


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
def test_few_row_products_read_the_matrix_once_in_streams(rows: int, nthreads: int, tmp_path: Path, threads) -> None:
    """A decoding step's linear layer reads its weight rows in streams (the vector is the same
    for every row: the caches hold it). (1, 4096) x (4096, 4096)^T, one thread, whole calls:
    5.28 -> 2.74 ms, eager 3.61; two threads 2.71 -> 1.39, eager 3.86. Two to four rows (a
    small batch) sum column by column with every row inside each stream's step, the matrix
    read once: (2, 4096) x (4096, 4096)^T one thread, weight cold, 8.2 -> 3.7 ms (eager 7.7).
    Five rows summing more than 1024 products go to the GEMM library."""
    torch.set_num_threads(nthreads)
    v, w = torch.randn(rows, 2053), torch.randn(300, 2053)  # (a scalar tail; streams past a thread's rows)
    source = _run(lambda v, w: torch.tanh(torch.nn.functional.linear(v, w)), (v, w), tmp_path, atol=1e-3)
    assert (ROWS_MARK in source) == (rows <= 4), source
    if 2 <= rows <= 4:  # each stream's step runs every row
        assert f"xo1 < {rows}; xo1++)" in source, source


@pytest.mark.parametrize("nthreads", [1, 2])
def test_sub_rows_in_streams_finish_with_their_epilogue(nthreads: int, tmp_path: Path, threads) -> None:
    """A mean over the columns of a matrix times each of 3 rows, plus 1: the per-(row, sub-row)
    result kept in a local slot of its own, divided and stored after the streams."""
    torch.set_num_threads(nthreads)
    w, x = torch.randn(300, 2053), torch.randn(3, 2053)
    source = _run(lambda w, x: (w[:, None, :] * x[None]).mean(-1) + 1, (w, x), tmp_path, atol=1e-4)
    assert ROWS_MARK in source and "mi_local0[mi_s * 3 + xo1]" in source, source
