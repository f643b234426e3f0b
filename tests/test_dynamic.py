"""Dynamic shapes: one compiled graph serves many sizes, with SymPy sizes end to end."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minductor import config, metrics
from minductor.bench.workloads import Block


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    metrics.reset()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_mlp_many_batch_sizes_one_graph() -> None:
    model = MLP().eval()
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for batch in [2, 3, 7, 16, 31, 64]:  # primes exercise vector and thread tails
            x = torch.randn(batch, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_transformer_block_batch_and_sequence_one_graph() -> None:
    torch.manual_seed(0)
    model = Block(dim=32, heads=2).eval()
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for batch, seq in [(2, 7), (3, 64), (5, 131), (2, 300), (64, 9)]:
            x = torch.randn(batch, seq, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_size_one_adds_at_most_one_specialized_graph() -> None:
    model = MLP().eval()
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for batch in [4, 1, 9, 1]:
            x = torch.randn(batch, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled <= 2


def test_automatic_dynamic_recompiles_once() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2, -1).sum(0)

    compiled = torch.compile(fn, backend="minductor")  # dynamic=None: static first, then dynamic
    for batch in [8, 13, 29, 41]:
        x = torch.randn(batch, 19)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-5)
    assert metrics.graphs_compiled == 2


@pytest.mark.parametrize("fn", [
    lambda x: (x.sin() + 1).relu().sum(-1),
    lambda x: x.reshape(-1).amax(0) + x.argmax(),
    lambda x: F.layer_norm(x, (x.shape[-1],)) * 2,
    lambda x: x.t() + 1,
    lambda x: x[1:, ::2].exp(),
    lambda x: torch.cat([x, x * 2], 0).mean(),
    lambda x: x.var(0, keepdim=True) - x,
], ids=["chain_sum", "reshape_amax_argmax", "layer_norm", "transpose", "slice_step", "cat_mean", "var"])
def test_symbolic_kernels_on_prime_sizes(fn) -> None:
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for rows, cols in [(5, 3), (11, 9), (23, 17)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1


def test_training_step_dynamic_batch() -> None:
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    for batch in [3, 8, 17]:
        x = torch.randn(batch, 32)
        eager(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    assert metrics.graphs_compiled == 2  # forward and backward, once each


def test_batch_norm_training_with_symbolic_sizes_compiles() -> None:
    # the running variance's correction n / (n - 1), n the symbolic count per channel, is a
    # symbolic float: once a reason to run both graphs through aten
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="minductor", dynamic=True)
    for batch in [2, 5, 9]:
        x = torch.randn(batch, 3, 10, 10)
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
        eager(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager[1].buffers(), model[1].buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert metrics.graphs_compiled == 2  # forward and backward, once each, through our kernels


@pytest.mark.parametrize("heads", [4, None], ids=["static_heads", "symbolic_heads"])
def test_reshape_of_symbolic_dims_is_a_view(heads) -> None:
    """Merging symbolic dims of a contiguous buffer ((b, h, t, d) -> (b*h, t, d), as attention
    does before bmm) is a strided view, not a copy kernel: the dims group by symbolically equal
    products (s0 < 4*s0 decided on the size hints), and ``s*64*FloorDiv(v, 4) * 4 +
    s*64*ModularIndexing(v, 1, 4)`` recombines to ``s*64*v`` with a symbolic stride."""
    def fn(x, y):
        b, h, t, d = x.shape
        return torch.bmm((x * 2).view(b * h, t, d), y)

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for b, h, t in [(3, heads or 5, 10), (2, heads or 6, 7)]:  # distinct sizes: no duck sizing
        x, y = torch.randn(b, h, t, 64), torch.randn(b * h, 64, 8)
        torch.testing.assert_close(compiled(x, y), fn(x, y), rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1
    assert metrics.generated_kernel_count == 1  # the multiply; the reshape is a view


def test_transformer_training_graphs_dynamic_like_static() -> None:
    """Under dynamic shapes the attention's head reshapes stay views: the forward and backward
    graphs of a transformer block have as many kernels as with static shapes."""
    torch.manual_seed(0)
    counts = {}
    for dynamic in (False, True):
        torch._dynamo.reset()
        metrics.reset()
        model = Block(dim=32, heads=2)
        compiled = torch.compile(model, backend="minductor", dynamic=dynamic)
        x = torch.randn(2, 9, 32)
        compiled(x).square().mean().backward()
        counts[dynamic] = metrics.generated_kernel_count
    assert counts[True] == counts[False], counts


def test_recombine_with_symbolic_coefficient() -> None:
    import sympy

    from minductor.ir.indexing import FloorDiv, ModularIndexing, index_symbol, simplify_index

    v, s = index_symbol("v0"), sympy.Symbol("s0", integer=True, positive=True)
    expr = 256 * s * FloorDiv(v, 4) + 64 * s * ModularIndexing(v, 1, 4)
    assert sympy.expand(simplify_index(expr, {v: 4 * s}) - 64 * s * v) == 0


def test_symbolic_transpose_takes_tiles_for_any_runtime_size(tmp_path) -> None:
    """With symbolic sizes whose hints are large, a transposed operand takes the staged 2-D
    tiles (the attention key's (b, t, h, d) -> (b, h, d, t) copy ran 280 us as a strided loop,
    86 us tiled, as static); the tiles' partial edges serve any size the graph later sees,
    smaller than one tile included."""
    from minductor import config

    fn = lambda x, y: x.t() + y * 2  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        compiled = torch.compile(fn, backend="minductor", dynamic=True)
        for rows, cols in [(300, 260), (7, 5), (129, 513), (1, 200)]:
            x, y = torch.randn(rows, cols), torch.randn(cols, rows)
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert metrics.graphs_compiled <= 2  # a size-1 dim may specialize once
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    assert "mi_t0" in code and "mi_transpose16(" in code


@pytest.mark.parametrize("case", ["layer_norm", "softmax"])
def test_symbolic_rows_keep_their_stats_in_locals_and_outputs_in_the_pool(case, tmp_path) -> None:
    """Under dynamic shapes a row's mean/rstd (max/sum) stay in locals as with static ones (the
    stores' index ``s1*x0 + x1`` scales an outer variable by a size), the softmax keeps its exp
    row in a row scratch, and the output comes from the graph's buffer pool, which hands a
    storage back only at its own size."""
    from minductor import config

    w, b = torch.randn(96), torch.randn(96)
    fn = {"layer_norm": lambda x: F.layer_norm(x, (96,), w, b), "softmax": lambda x: x.softmax(-1)}[case]
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        compiled = torch.compile(fn, backend="minductor", dynamic=True)
        outs = {}
        for shape in [(6, 300, 96), (5, 100, 96), (6, 300, 96), (5, 100, 96)]:
            x = torch.randn(shape)
            out = compiled(x)
            torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)
            assert out.untyped_storage().nbytes() == out.numel() * 4
            assert all(out.data_ptr() != o.data_ptr() for o in outs.values())  # outputs alive: never shared
            outs[len(outs)] = out
    assert metrics.graphs_compiled == 1
    code = next(tmp_path.glob("graph_*/output_code.py")).read_text()
    assert "kept in a local" in next(tmp_path.glob("graph_*/cpp_*.cpp")).read_text()
    assert metrics.buffers_allocated == 1, code  # only the output
    assert "mi_pool.take(0, (s" in code, code
    # the input check compares with the bound sizes (torch's C++ check), not None placeholders
    checks = [line for line in code.splitlines() if "assert_size_stride(arg" in line]
    assert any("(s" in line for line in checks) and not any("None" in line for line in checks), checks
    if case == "softmax":
        assert "mi_row0" in next(tmp_path.glob("graph_*/cpp_*.cpp")).read_text()  # the exp row: a row scratch


def test_symbolic_buffers_reused_across_kernels_when_provably_under_the_peak(tmp_path) -> None:
    """A freed buffer serves a later allocation of the same symbolic storage size (as static
    ones do), and an output takes a dying input's storage at an equal symbolic storage size:
    the transformer block's training graphs reuse storages under dynamic shapes, and
    a hold is taken only where a unit's live bytes cover it at every size."""
    import sympy

    from minductor import config
    from minductor.codegen.memory import _covers

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert _covers(4 * s0 * s1 + 8 * s0, 4 * s0 * s1) and _covers(4 * s0 * s1, 4 * s0 * s1)
    assert not _covers(4 * s0 * s1, 4 * s0 * s1 + 1) and not _covers(4 * s0 * s1, 8 * s0)  # s1 may be 1
    torch.manual_seed(0)
    model = Block(dim=32, heads=2)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        compiled = torch.compile(copy.deepcopy(model), backend="minductor", dynamic=True)
        for t in (9, 17):
            x = torch.randn(2, t, 32, requires_grad=True)
            out = compiled(x)
            out.square().mean().backward()
            ref_x = x.detach().clone().requires_grad_()
            ref = model(ref_x)
            ref.square().mean().backward()
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-4)
            model.zero_grad()
    assert metrics.buffers_reused >= 4
    codes = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/output_code.py"))
    assert "(s" in codes and "# reuse\n" in codes and "# reuse in place\n" in codes


def test_symbolic_rows_take_the_row_scratch_and_longer_rows_the_heap(tmp_path) -> None:
    """A softmax over a symbolic row keeps its exp row in a stack array (sized at
    ROW_SCRATCH_MAX_BYTES) as static rows do; a row longer than that at run time takes a heap
    array instead, and the results match eager either way."""
    from minductor import config
    from minductor.codegen.cpp_rows import ROW_SCRATCH_MAX_BYTES

    fn = lambda x: x.softmax(-1) * 2  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        compiled = torch.compile(fn, backend="minductor", dynamic=True)
        cap = ROW_SCRATCH_MAX_BYTES // 4
        for shape in [(5, 300), (3, 7), (2, cap), (3, cap + 1), (2, 3 * cap + 5), (4, 300)]:
            x = torch.randn(shape) * 4
            torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-6)
    assert metrics.graphs_compiled == 1
    code = next(tmp_path.glob("graph_*/cpp_*.cpp")).read_text()
    assert f"float mi_row0_stack[{cap}];" in code and "__builtin_malloc(" in code and "__builtin_free(mi_row0)" in code
    assert metrics.buffers_allocated == 1  # the output: the exp row is never a buffer


_RUN_TIME_PARALLEL = {
    "row_sum": lambda x: x.sum(1),
    "column_amax": lambda x: x.amax(0),
    "full_sum": lambda x: x.sum(),
    "pointwise": lambda x: torch.sin(x) * 2 + 1,
    "softmax": lambda x: torch.softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "cumsum_rows": lambda x: x.cumsum(1),
    "cumsum_columns": lambda x: x.cumsum(0),
    "transpose_add": lambda x: x.t() + 1,
    "index_put_rows": lambda x: torch.zeros_like(x).index_put(((x[:, 0] > 0).long(),), x, accumulate=True),
}


@pytest.mark.parametrize("name", sorted(_RUN_TIME_PARALLEL))
def test_kernels_over_symbolic_sizes_choose_threads_at_run_time(tmp_path, name) -> None:
    """Compiled while its dims were tiny (Dynamo's hint, which the graph cache then serves
    for every size), a kernel still runs large sizes on every thread: each parallel construct
    carries an OpenMP ``if`` on the run-time work instead of being left out at compile time."""
    from minductor import config

    fn = _RUN_TIME_PARALLEL[name]
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        compiled = torch.compile(fn, backend="minductor", dynamic=True)
        for shape in [(3, 5), (301, 257), (2, 40000)]:
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-3)
    assert metrics.graphs_compiled == 1
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    pragmas = [line.strip() for line in code.splitlines() if line.strip().startswith("#pragma omp parallel")]
    assert pragmas, code
    # a region of per-thread partials gets its thread count from mi_nt, one below the threshold
    assert all((" if(" in p and ">= 32768)" in p) or "num_threads(mi_nt)" in p for p in pragmas), pragmas
    if any("num_threads(mi_nt)" in p for p in pragmas):
        assert re.search(r"const int mi_nt = !\(.* >= 32768\) \? 1 : ", code), code


_HINT_FREE = {
    "column_amax": lambda t, u: t.amax(0),
    "pointwise": lambda t, u: torch.sin(t) * 2 + 1,
    "transpose_keeps_layout": lambda t, u: t.t() + 1,
    "transpose_add": lambda t, u: t.t() + u,
    "cumsum_rows": lambda t, u: t.cumsum(1),
    "cumsum_columns": lambda t, u: t.cumsum(0),
    "full_sum": lambda t, u: t.sum(),
    "index_put_rows": lambda t, u: torch.zeros_like(t).index_put(((t[:, 0] > 0).long(),), t, accumulate=True),
}


def _dynamic_kernels(fn, shape, tmp_path) -> str:
    """The C++ of ``fn`` compiled with dynamic shapes at ``shape``, its size symbols renamed in
    order of appearance (Dynamo numbers them per compile)."""
    from minductor import config

    torch._dynamo.reset()
    t, u = torch.randn(shape), torch.randn(shape[::-1])
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(fn, backend="minductor", dynamic=True)(t, u), fn(t, u),
                                   rtol=1e-4, atol=1e-3)
    code = "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_*.cpp")))
    names: dict[str, str] = {}
    return re.sub(r"\b[su]\d+\b", lambda m: names.setdefault(m.group(0), f"S{len(names)}"), code)


@pytest.mark.parametrize("name", sorted(_HINT_FREE))
def test_kernel_shapes_over_symbolic_sizes_do_not_depend_on_a_small_hint(tmp_path, name) -> None:
    """A graph compiled at a tiny size (the hint Dynamo recorded when the dim turned dynamic,
    and the graph cache then serves the graph for every size) gets the kernels a large hint
    gives: loop order, tiles, streaming stores, scan tiles, split rows, scatter chunks. Shapes chosen from the
    tiny hint ran 4096^2 up to 70x slower (x.t() + 1 walked its output column by column)."""
    fn = _HINT_FREE[name]
    small = _dynamic_kernels(fn, (3, 5), tmp_path / "small")
    large = _dynamic_kernels(fn, (300, 4096), tmp_path / "large")
    assert small == large


def test_row_reductions_over_a_symbolic_row_use_at_least_a_vector_of_lanes(tmp_path) -> None:
    code = _dynamic_kernels(lambda t, u: torch.softmax(t, -1), (3, 5), tmp_path)
    lanes = {int(n) for n in re.findall(r"float tmp_acc\d+_lanes\[(\d+)\];", code)}
    assert lanes and min(lanes) >= 16, code


def test_a_graph_compiled_at_a_small_hint_keeps_its_large_buffers_across_calls(tmp_path) -> None:
    """Whether a buffer of symbolic size comes from the graph's pool is decided per call: at a
    tiny hint a 64 MB output would otherwise fault its pages in on every call (x.sin() * 2 + 1
    at 4096^2: 26.5 against 4.8 ms), and a tiny one is not kept."""
    from minductor import config
    from minductor.runtime.buffer_pool import held_bytes, live_pools

    compiled = torch.compile(lambda t: torch.sin(t) * 2 + 1, backend="minductor", dynamic=True)
    small, large = torch.randn(3, 5), torch.randn(512, 1024)
    # other tests' graphs may still be alive; held here, so no new pool can take one's address
    earlier = live_pools()
    with config.patch(debug=True, debug_dir=str(tmp_path)):  # (no graph cache: a module of our own)
        torch.testing.assert_close(compiled(small), torch.sin(small) * 2 + 1)
    pools = [p for p in live_pools() if all(p is not q for q in earlier)]  # this graph's
    assert len(pools) == 1
    first = compiled(large)
    assert held_bytes(pools) == large.numel() * 4
    first_ptr = first.data_ptr()
    del first
    again = compiled(large)  # the storage nobody holds any more comes back
    assert again.data_ptr() == first_ptr
    torch.testing.assert_close(again, torch.sin(large) * 2 + 1)
    compiled(small)
    assert held_bytes(pools) == large.numel() * 4  # the tiny output was not kept


@pytest.mark.parametrize("fn", [
    lambda x: x[:, 0] * 2,
    lambda x: x[:, -1] * 2,
    lambda x: x[-1] + 1,
    lambda x: x.select(1, 1).sum(),
], ids=["first_column", "last_column", "last_row", "select_sum"])
def test_select_along_a_symbolic_dim(fn) -> None:
    """Selecting one index of a dynamic dim (``x[:, 0]``, ``x[:, -1]``) is a view at any size;
    it used to fail to compile (the lowering read the dim's size as an int)."""
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for shape in [(3, 5), (7, 9), (2, 40000)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))
    assert metrics.graphs_compiled == 1


@pytest.mark.parametrize("fn", [
    lambda x: torch.diagonal(x, 2) * 2,
    lambda x: torch.diagonal(x, -1, 1, 2) + 1,
    lambda x: torch.trace(x[0]),
    lambda x: x.unfold(1, 2, 1) + 1,
    lambda x: x.unfold(-1, 4, 3).sum(-1),
], ids=["diagonal", "diagonal_below", "trace", "unfold", "unfold_step"])
def test_diagonal_and_unfold_of_symbolic_dims(fn) -> None:
    """A diagonal's length (``min(rows, cols - offset)``) and unfold's window count
    (``(n - size) // step + 1``) over dynamic dims are symbolic; the lowerings read the dims
    as ints and failed to compile (``torch.trace``, ``torch.stft``)."""
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for shape in [(3, 5, 7), (4, 9, 6), (2, 6, 6), (5, 11, 13)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))
    assert not metrics.fallback_ops


ROW_KERNELS = {
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "softmax": lambda x: x.softmax(-1),
    "var_mean": lambda x: torch.var_mean(x, -1),
    "argmax_sum": lambda x: (x.argmax(-1), x.sum(-1)),
}


@pytest.mark.parametrize("name", list(ROW_KERNELS))
def test_symbolic_rows_take_wide_lanes_when_long(name: str, tmp_path) -> None:
    """A row of symbolic length has two main loops, the wide lanes a static row of 1024 or more
    would get (128 for Welford on AVX-512, else four vectors: 64 or 32) and the narrow ones, chosen per row at run
    time; results match eager on both sides of the threshold, at odd lengths, from one graph."""
    from minductor import config

    fn = ROW_KERNELS[name]
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.no_grad():
        compiled = torch.compile(fn, backend="minductor", dynamic=True)
        for rows, n in [(3, 8), (5, 1023), (4, 1024), (3, 4099), (2, 300)]:
            x = torch.randn(rows, n)
            x[0, n // 3] = 50.0  # a clear argmax
            got, want = compiled(x), fn(x)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert metrics.graphs_compiled == 1
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    assert re.search(r"const int64_t mi_wl = \w+ >= 1024 \? (32|64|128) : 16;", code), code
    assert re.search(r"if \(mi_wl == (32|64|128)\)", code) and "mi_base += 16)" in code, code


def test_size_arithmetic_dynamo_writes_as_sym_sum_is_a_size_not_a_fallback() -> None:
    """``t.expand(t.shape[0], ..., t.shape[2])`` of a strided slice makes Dynamo emit
    ``torch.sym_sum((-2, (s + 1) // 2))``: its value is the size expression (with minductor's
    FloorDiv), not an aten fallback whose SymInt later reached the C++ printer."""
    def fn(t: torch.Tensor) -> torch.Tensor:
        t = t[:, :, ::2][:, :, 1:-1].cumsum(1)
        t = t.unsqueeze(2).expand(t.shape[0], t.shape[1], 3, t.shape[2])
        return F.pad(t, [1, 2]).var(3, keepdim=True, correction=0) * 1.5
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for shape in [(29, 36, 37), (5, 7, 12)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))
    assert not metrics.fallback_ops, metrics.fallback_ops


@pytest.mark.parametrize("shape", [(5, 3), (64, 700), (3000, 37)])
def test_column_partials_over_a_symbolic_width_that_is_a_sum(shape, tmp_path) -> None:
    """Column sums over a padded symbolic width ``3 + s1``, split across threads: the per-thread
    partials were allocated and indexed as ``mi_nt * 3 + s1`` (no parentheses). Reads and writes
    agreed, so values matched while the writes ran past the allocation (heap corruption, a crash
    some calls later); the partials' extents are checked in the source too."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, [1, 2]).sum(0)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        x = torch.randn(shape)
        torch.testing.assert_close(torch.compile(fn, backend="minductor", dynamic=True)(x), fn(x), rtol=1e-4, atol=1e-4)
    source = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))
    extents = re.findall(r"_partial = new float\[mi_nt \* ([^\]]*)\]", source)
    assert extents and all(re.fullmatch(r"\w+|\(.*\)", e) for e in extents), extents


@pytest.mark.parametrize("name", ["slice", "strided_slice_cat", "cat_slices"])
def test_slices_of_symbolic_sizes_agree_with_dynamos_sizes(name) -> None:
    """A slice's clamped length (``Max(0, s0 - 2)``) is Dynamo's ``s0 - 2`` once the size's lower
    bound decides the clamp; where two expressions of one size remain, they broadcast (the
    backward's tangent against the slice failed to compile: "cannot be broadcast together")."""
    fns = {
        "slice": lambda t: t[1:-1].contiguous().sin() * 1.5,
        "strided_slice_cat": lambda t: torch.cat([t[::2], t[::2] * 2])[1:-1].softmax(0),
        "cat_slices": lambda t: F.pad(torch.cat([t.unsqueeze(0).expand(2, -1)] * 2).var(0, keepdim=True), [1, 2])
        .amax(0).softmax(0),
    }
    fn = fns[name]
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for n in (36, 33, 17):
        x = torch.randn(n, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        out, ref = compiled(x), fn(xr)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        grad = torch.randn_like(ref)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)


def test_arange_to_a_symbolic_size_is_int64() -> None:
    """``arange`` with an integer symbolic bound is int64 as in eager: it was float32, so a roll
    (decomposed into an index_select through ``(arange(n) + shift) % n``) handed aten a float index."""
    fns = {"roll": lambda t: t.roll(1, 1) * 2, "roll_neg": lambda t: t.roll(-2, 0).sin(),
           "arange": lambda t: t + torch.arange(t.shape[1]), "arange_dtype": lambda t: torch.arange(t.shape[0])}
    compiled = {name: torch.compile(fn, backend="minductor", dynamic=True) for name, fn in fns.items()}
    for shape in ((3, 5), (4, 7), (6, 2)):
        x = torch.randn(shape)
        for name, fn in fns.items():
            got, ref = compiled[name](x), fn(x)
            assert got.dtype == ref.dtype, (name, got.dtype, ref.dtype)
            torch.testing.assert_close(got, ref, msg=lambda m, n=name: f"{n}: {m}")


def test_roll_by_symbolic_shifts_of_either_sign() -> None:
    """A roll by ``-(s0 // 2)`` (fftshift's backward) was taken modulo the size with C's ``%``,
    which keeps the sign: it read before the tensor. A shift of either sign (``s0 - 5``) goes to
    aten."""
    fns = {"neg": lambda t: t.roll(-(t.shape[0] // 2), 0) * 2, "pos": lambda t: t.roll(t.shape[1] // 2, 1) * 2,
           "either": lambda t: t.roll(t.shape[0] - 5, 0) * 2, "fftshift": lambda t: torch.fft.fftshift(t) * 2}
    compiled = {name: torch.compile(fn, backend="minductor", dynamic=True) for name, fn in fns.items()}
    for shape in ((9, 10), (4, 7), (6, 3)):
        x = torch.randn(shape, requires_grad=True)
        grad = torch.randn(shape)
        for name, fn in fns.items():
            torch.testing.assert_close(compiled[name](x), fn(x), msg=lambda m, n=name: f"{n}: {m}")
            got, = torch.autograd.grad(compiled[name](x), x, grad)
            ref, = torch.autograd.grad(fn(x), x, grad)
            torch.testing.assert_close(got, ref, msg=lambda m, n=name: f"{n}'s gradient: {m}")


def test_roll_by_an_integer_argument_of_either_sign() -> None:
    """Under ``dynamic=True`` an int argument is a symbol too, and unlike a size it may be
    negative: a roll by it (``roll(x, -1, 0)``) was taken for a nonnegative shift and read
    before the tensor."""
    compiled = torch.compile(lambda t, s: t.roll(s, 0) * 2, backend="minductor", dynamic=True)
    for shift, n in ((-1, 5), (2, 5), (-7, 6), (3, 4)):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x, shift), x.roll(shift, 0) * 2, msg=lambda m, s=shift: f"{s}: {m}")


def test_arange_with_symbolic_bounds_counts_down_and_from_a_symbolic_start() -> None:
    """XLNet's relative positions ``arange(t, -t, -1.0, dtype=int64)`` over a dynamic length:
    a negative (or integral float) step fell back to aten, and a symbolic start failed to
    compile (a symbol printed as a C++ constant)."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        down = torch.arange(t, -t, -1.0, dtype=torch.int64).float()
        up = torch.arange(-t, t, 1.0, dtype=torch.int64).float()
        return (x.sum() + down[:, None] * up + torch.arange(2 * t, 0, -3).sum()
                + torch.arange(t, 3 * t, 2, dtype=torch.float32).sum())

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for t in (5, 8, 13):
        x = torch.randn(2, t)
        torch.testing.assert_close(compiled(x), fn(x))
    assert not metrics.fallback_ops


def test_arange_with_a_symbolic_bound_and_a_float_one_rounds_its_length_up() -> None:
    """``arange(t, 10.5)`` over a symbolic ``t`` has ``ceil(10.5 - t)`` elements: the length
    was the span ``10.5 - t`` itself, a float size that failed to compile."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.shape[0]
        return (torch.arange(t, 10.5, dtype=torch.float32), torch.arange(0.5, t, 2),
                torch.arange(t, -2.5, -2, dtype=torch.float64))

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for t in (3, 4, 7):
        x = torch.randn(t)
        torch.testing.assert_close(compiled(x), fn(x))
    assert not metrics.fallback_ops


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
def test_var_of_a_symbolic_count_with_a_fractional_or_symbolic_correction() -> None:
    """``var(x, 1, correction=1.3)`` divides by ``n - 1.3``: over a symbolic ``n`` that was
    the integer ``n - 1`` (wrong values), and an integer correction passed as an argument (a
    symbol under dynamic=True) failed to compile."""
    def fn(x: torch.Tensor, c: int) -> tuple[torch.Tensor, ...]:
        return (*torch.var_mean(x, 1, correction=1.3), x.var(None, correction=c), x.std((0, 2), correction=0.5),
                x.var(2, correction=9.5, keepdim=True))

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for shape, c in (((5, 6, 7), 2), ((4, 3, 9), -1), ((2, 5, 3), 40)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x, c), fn(x, c), equal_nan=True)


@pytest.mark.parametrize("name", ["interpolate_nearest", "interpolate_bilinear", "mse_loss", "group_norm"])
def test_size_arithmetic_in_floats_and_symbolic_fill_values(name: str) -> None:
    """Interpolation by a scale factor sizes its output as ``TruncToInt(1.5*ToFloat(s0))``, which
    is a FloorDiv of rationals here (it reached the C++ printer); an MSE loss's and a group norm's
    backward fill a tensor with a symbolic element count (``scalar_tensor(s0*s1)``)."""
    fns = {
        "interpolate_nearest": lambda t: F.interpolate(t, scale_factor=1.5, mode="nearest").sum(),
        "interpolate_bilinear": lambda t: (F.interpolate(t, scale_factor=1.5, mode="bilinear") ** 2).sum(),
        "mse_loss": lambda t: F.mse_loss(t, torch.zeros_like(t)),
        "group_norm": lambda t: (F.group_norm(t, 3) ** 2).sum(),
    }
    fn = fns[name]
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for shape in [(2, 3, 8, 9), (1, 3, 5, 7), (3, 6, 4, 11)]:
        x = torch.randn(shape, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        out, ref = compiled(x), fn(xr)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        out.backward()
        ref.backward()
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)


def test_a_fallback_laid_out_after_its_inputs_is_restrided_to_the_traced_layout(tmp_path) -> None:
    """The CPU flash attention (a fallback at these lengths) returns ``empty_like(query)``.
    Dynamo traced a query laid out (b, t, h, d) (the projection's transposed view), so the
    graph views the output's transpose as contiguous; our kernel lays the query out (b, h, t,
    d). With symbolic sizes the output's layout is not rederived from ours: the wrapper puts
    the result in the traced layout (a Llama-style model called at a second sequence length
    gave wrong results before)."""
    def attn(x, wq, wk, wv, wo):
        b, t, c = x.shape
        q, k, v = ((x @ w.t()).view(b, t, 4, 64).transpose(1, 2) for w in (wq, wk, wv))
        y = F.scaled_dot_product_attention(q * 1.5 + 0.25, k, v)
        return y.transpose(1, 2).contiguous().reshape(b, t, c) @ wo.t()

    torch.manual_seed(0)
    ws = [torch.randn(256, 256) / 16 for _ in range(4)]
    metrics.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        compiled = torch.compile(attn, backend="minductor", dynamic=True)
        for t in (200, 300, 257):
            x = torch.randn(1, t, 256)
            torch.testing.assert_close(compiled(x, *ws), attn(x, *ws), rtol=1e-4, atol=1e-4)
    assert metrics.fallback_ops["aten._scaled_dot_product_flash_attention_for_cpu"] >= 1
    code = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/output_code.py"))
    assert re.search(r"= restride\(buf\d+, ", code), code


def test_a_symbolic_negative_start_counts_from_the_end() -> None:
    """``bias[:, -t:]`` and ``bias.select(1, -t)`` with ``t`` a dynamic size (T5's position
    bias sliced to the query length): the start wraps as in Python. It was clamped as a
    non-negative start (a slice 2t long: the lowering failed on the broadcast after it)."""
    def fn(bias: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        t = q.shape[1]
        return q + bias[:, -t:, :t] + bias.select(1, -t)[:, None, :t]

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for t in (5, 9, 16):
        bias, q = torch.randn(2, 2 * t, 3 * t), torch.randn(2, t, t)
        torch.testing.assert_close(compiled(bias, q), fn(bias, q))


def test_a_pad_to_a_multiple_of_a_window_has_symbolic_widths() -> None:
    """``F.pad(x, (0, (w - t % w) % w))`` with ``t`` a dynamic size (Longformer and Mamba2 pad
    the sequence to a multiple of their attention window / chunk): the widths are symbolic. The
    lowering converted them to ints and failed; a negative width still crops."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        padded = F.pad(x, (0, 0, 0, (8 - t % 8) % 8), value=-1.0)
        return padded.view(x.shape[0], -1, 8, x.shape[2]).sum(2) + F.pad(x, (1, -(t // 4)))[:, :, :4].sum(2, keepdim=True)[:, :1]

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for t in (13, 16, 21):
        x = torch.randn(2, t, 6)
        torch.testing.assert_close(compiled(x), fn(x))
    assert not metrics.fallback_ops


def test_a_slice_from_the_end_of_a_symbolic_dim_broadcasts_at_its_traced_length() -> None:
    """``c[:, :, -1:]`` of a dim whose size is symbolic (a padded length split into chunks of
    32 with ``-1``, as Mamba2's chunked scan does) is one long in the trace; our clamped bounds
    gave ``Max(0, n - Max(0, n - 1))``, which could not broadcast against ``c`` and the compile
    failed. The slice takes the length tracing computed."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        x = F.pad(x, (0, 0, 0, (32 - t % 32) % 32))
        c = x.reshape(x.shape[0], x.shape[1] // 32, -1, x.shape[2]).cumsum(2)
        return (c - c[:, :, -1:, :]).sum(2) + c[:, :, -1]

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for t in (40, 70, 100):
        x = torch.randn(2, t, 4)
        torch.testing.assert_close(compiled(x), fn(x))


def test_an_output_view_of_an_input_with_symbolic_strides_stays_a_view() -> None:
    """``as_strided(x, size, stride)`` with the size and strides graph inputs: checking the
    output's traced strides for density guards ``stride[0] == 1``, which rewrote the traced
    strides but not ours, so they compared unequal and the output was copied. AOTAutograd
    rebuilds an output aliasing an input from our output's strides and storage offset (it does
    not replay views with symbolic arguments): from the copy's offset 0, an input sliced at 5
    read the storage's first elements."""
    def fn(x: torch.Tensor, size: tuple[int, int], stride: tuple[int, int]) -> torch.Tensor:
        return torch.as_strided(x, size, stride)

    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    base = torch.arange(40.0)
    for start in (5, 9):
        x = base[start:start + 10]
        torch.testing.assert_close(compiled(x, (2, 2), (1, 2)), fn(x, (2, 2), (1, 2)))


@pytest.mark.parametrize("case", ["index_add_alpha", "index_fill_value", "scatter_value"])
def test_symbolic_int_scalars_of_scatters(case: str) -> None:
    """Under dynamic=True Dynamo passes int scalars as symbols: index_add's alpha, index_fill's
    and scatter's values reach the kernel as index expressions, not constants (the lowering
    raised "Cannot convert expression to float"); two values, one graph, eager's results."""
    fns = {
        "index_add_alpha": lambda x, i, s, a: torch.index_add(x, 0, i, s, alpha=a),
        "index_fill_value": lambda x, i, s, a: x.index_fill(0, i, a) + s.sum(),
        "scatter_value": lambda x, i, s, a: x.scatter(0, i.unsqueeze(1).expand(-1, 3), a),
    }
    fn = fns[case]
    x, i, s = torch.randn(6, 3), torch.tensor([4, 0, 2]), torch.randn(3, 3)
    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for a in (-3, 5):
        torch.testing.assert_close(compiled(x, i, s, a), fn(x, i, s, a))
    assert metrics.graphs_compiled == 1 and not metrics.fallback_ops, (metrics.graphs_compiled, metrics.fallback_ops)


def test_symbolic_repeat_counts() -> None:
    """repeat/tile whose counts Dynamo passes as symbols (an int argument under dynamic=True,
    or a size) compile to one graph with eager's results (the lowering raised on the symbol)."""
    fn = lambda x, n: (x.repeat(n, 1, 2), x.tile((n, x.shape[0])))
    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(fn, backend="minductor", dynamic=True)
    for shape, n in (((3, 4), 2), ((5, 2), 3)):
        x = torch.randn(shape)
        for got, want in zip(compiled(x, n), fn(x, n)):
            torch.testing.assert_close(got, want)
    assert metrics.graphs_compiled == 1 and not metrics.fallback_ops, (metrics.graphs_compiled, metrics.fallback_ops)
