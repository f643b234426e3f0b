"""Bounds checks of indirect indices in C++ kernels. An index that changes along the innermost
loop (gather) is checked without a branch, so the loop vectorizes; one that is the same for the
whole inner loop (an embedding row) is read and checked once, before the loop, which reads the
row contiguously. Either way an out-of-range index raises like eager, and scatters stay serial."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import vectorization_report

from minductor import config
from minductor.runtime.cache import vector_gathers_pay_off


def _kernel(fn: Callable[..., Any], *args: torch.Tensor, tmp_path: Path, **tol: float) -> Path:
    """Compile with a dump, compare with eager; the last C++ kernel's source file."""
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(*args), fn(*args), **tol)
    return sorted(tmp_path.glob("graph_*/cpp_fused_*.cpp"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))[-1]


def _vectorized(source: Path, tmp_path: Path) -> bool:
    return "loop vectorized" in vectorization_report(source, tmp_path)


def test_gather_check_is_branch_free_and_vectorizes(tmp_path: Path) -> None:
    """Vectorized with gather instructions where they pay off; a plain loop (no ``omp simd``,
    nothing the compiler vectorizes) on CPUs whose gathers are slower than scalar loads."""
    x, i = torch.randn(16, 300), torch.randint(0, 300, (16, 200))
    source = _kernel(lambda x, i: torch.gather(x, 1, i) * 2, x, i, tmp_path=tmp_path)
    code = source.read_text()
    assert "mi_bad |=" in code and "mi_err[0] = 1" not in code
    if vector_gathers_pay_off():
        assert "reduction(|:mi_bad)" in code and _vectorized(source, tmp_path)
    else:
        assert "omp simd" not in code and not re.search(r"\bv\w*gather", _disassembly(source, tmp_path))


def test_gather_loops_follow_the_cpus_gather_speed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both choices, whatever this CPU is: `omp simd` on the gather loop exactly when gathers
    pay off, and the same result either way."""
    from minductor.codegen import cpp_unit

    x, i = torch.randn(16, 300), torch.randint(0, 300, (16, 200))
    for fast in (True, False):
        monkeypatch.setattr(cpp_unit, "vector_gathers_pay_off", lambda fast=fast: fast)
        torch._dynamo.reset()
        code = _kernel(lambda x, i: torch.gather(x, 1, i) + 1, x, i, tmp_path=tmp_path / str(fast)).read_text()
        assert ("omp simd" in code) == fast, code


def _disassembly(source: Path, tmp_path: Path) -> str:
    """The object code's instructions (without symbol names, which hold the kernel's name)."""
    import subprocess

    vectorization_report(source, tmp_path)  # compiles k.o with the kernels' flags
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(tmp_path / "k.o")], capture_output=True, text=True,
                         check=True).stdout
    return "\n".join(line.split("\t", 1)[-1] for line in out.splitlines() if line.startswith(" "))


def test_embedding_row_check_runs_once_per_row(tmp_path: Path) -> None:
    """The row's index is read and checked before the row's loop, which reads the row
    contiguously (no gather, no check per element)."""
    w, i = torch.randn(50, 256), torch.randint(0, 50, (40,))
    code = _kernel(F.embedding, i, w, tmp_path=tmp_path).read_text()
    before, loop = code.split("#pragma omp simd", 1)
    assert re.search(r"auto (tmp\d+) = static_cast<uint64_t>\(tmp\d+\) < static_cast<uint64_t>\(50\);\s+mi_bad \|= \1 \? 0 : 1;",
                     before), code
    assert "mi_bad |=" not in loop and "in_ptr0[" not in loop, code


@pytest.mark.parametrize("case", ["gather", "embedding", "index_put"])
def test_out_of_range_raises_in_either_form(case: str) -> None:
    x, w = torch.randn(16, 300), torch.randn(50, 64)
    fns = {
        "gather": (lambda x, i: torch.gather(x, 1, i), (x, torch.full((16, 200), 7).index_fill_(1, torch.tensor([150]), 300))),
        "embedding": (F.embedding, (torch.tensor([3, 50, 1]), w)),
        "index_put": (lambda x, i, v: x.index_put((i,), v, accumulate=True), (x, torch.tensor([2, -17]), torch.randn(2, 300))),
    }
    fn, args = fns[case]
    with pytest.raises(IndexError, match="index out of range"):
        torch.compile(fn, backend="minductor")(*args)


@pytest.mark.parametrize("op", ["scatter_add", "index_put_acc", "scatter_amax"])
def test_scatters_with_duplicate_indices_stay_serial_and_exact(op: str, tmp_path: Path) -> None:
    """Long rows with many duplicate targets: a vectorized loop would lose updates that two
    lanes make to one element. Scatter kernels whose innermost loop runs along the scattered dim
    carry no `omp simd`, and each element's updates run in one thread in order (scatters along
    dim 1 spread their rows over threads; index_put along dim 0 splits its columns, which lanes
    and threads write apart, into chunks); scatter_add and amax match eager exactly (eager's
    order of additions); eager's index_put sums duplicates in another order, so that one is
    compared within float32 rounding."""
    torch.manual_seed(0)
    cases = {
        "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s), torch.randint(0, 8, (8, 4096)), torch.randn(8, 4096)),
        "index_put_acc": (lambda x, i, s: x.index_put((i,), s, accumulate=True), torch.randint(0, 8, (4096,)),
                          torch.randn(4096, 4096)),
        "scatter_amax": (lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), torch.randint(0, 8, (8, 4096)),
                         torch.randn(8, 4096)),
    }
    fn, i, src = cases[op]
    x = torch.randn(8, 4096)
    tol = {"rtol": 1e-5, "atol": 1e-4} if op == "index_put_acc" else {"rtol": 0, "atol": 0}
    scatter = _kernel(fn, x, i, src, tmp_path=tmp_path, **tol).read_text()
    assert ("#pragma omp simd" in scatter) == (op == "index_put_acc") and "collapse" not in scatter, scatter
    assert "#pragma omp parallel" in scatter and ("mi_c0" in scatter) == (op == "index_put_acc"), scatter


@pytest.mark.parametrize("cols", [16, 64, 200, 1000])
def test_gather_prefetches_the_next_row_in_chunks(cols: int, tmp_path: Path) -> None:
    """A gather within rows (row ``xo0`` of ``x`` at the columns ``i`` holds) runs its innermost
    loop in chunks, each prefetching its share of the lines of row ``xo0 + 1``; together the
    chunks cover that whole row. A row of more lines than the loop gathers elements is left
    alone. Results match eager, and an index out of range still raises."""
    from minductor.codegen.cpp_rewrites import GATHER_CHUNK

    x, i = torch.randn(33, 500), torch.randint(0, 500, (33, cols))
    fn = lambda x, i: torch.gather(x, 1, i)  # noqa: E731
    code = _kernel(fn, x, i, tmp_path=tmp_path).read_text()
    found = re.findall(rf"__builtin_prefetch\(&in_ptr\d\[(.*) \+ 16\*\((\d+)\*\(mi_g / {GATHER_CHUNK}\) \+ (\d+)\)\]", code)
    lines = -(-500 // 16)
    if lines > cols:
        assert not found and "mi_g" not in code
        return
    assert found and {base for base, _, _ in found} == {"500 + 500L*xo0"}, found
    chunks = -(-cols // GATHER_CHUNK)
    covered = {int(share) * c + int(k) for _, share, k in found for c in range(chunks)}
    assert set(range(lines)) <= covered
    assert "for (int64_t xo1 = mi_g; xo1 < " in code
    bad = i.clone()
    bad[20, cols - 1] = 500
    with pytest.raises(Exception, match="out of bounds|out of range"):
        torch.compile(fn, backend="minductor")(x, bad)


def test_masked_off_lanes_do_not_trip_the_row_check(tmp_path: Path) -> None:
    """An index_select through ``fmod(i + 2, n)`` (as rolls were decomposed) inside the second
    input of a cat: the masked-off lanes of the first half compute ``i - n < 0`` and a negative
    fmod; the row check holds only under the mask (it raised an IndexError eager does not)."""
    x = torch.randn(5, 6, 3)

    def fn(x: torch.Tensor) -> torch.Tensor:
        rolled = x.index_select(2, torch.fmod(torch.arange(3) + 2, 3))
        return torch.cat([x.transpose(1, 2), F.layer_norm(rolled, (3,)).transpose(1, 2) * 2], 1)

    source = _kernel(fn, x, tmp_path=tmp_path)
    assert re.search(r"auto (tmp\d+) = !\(tmp\d+\) \|\| tmp\d+;\s+mi_bad \|= \1 \? 0 : 1;", source.read_text())  # under its mask


@pytest.mark.parametrize(("vendor", "family", "flags", "fast"), [
    ("AuthenticAMD", "25", "avx2 avx512f", True), ("AuthenticAMD", "25", "avx2", False), ("AuthenticAMD", "23", "avx2", False),
    ("AuthenticAMD", "26", "avx2 avx512f", True), ("GenuineIntel", "6", "avx2", True)])
def test_vector_gathers_pay_off_from_zen_4(on_cpu: Any, vendor: str, family: str, flags: str, fast: bool) -> None:
    """Zen 1 to Zen 3 keep gather loops scalar; Zen 4 (family 25 with AVX-512) vectorizes them."""
    from minductor.runtime import cache

    assert on_cpu(cache.vector_gathers_pay_off, {"vendor_id": vendor, "cpu family": family, "flags": flags}) is fast
