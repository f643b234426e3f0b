"""2-D tiles for transposed pointwise access. A transposed operand of 4-byte values is staged
per 16x16 block by a register transpose (``mi_transpose16``); other dtypes are staged by a
scalar copy where the compiler emits no vector gathers and loaded with their stride where it does.

Sizes are not multiples of the tile edge, so edge tiles are partial; a masked (padded) read
of the transposed operand must not be staged (its loads may only run where the mask holds).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen import cpp_tiles
from minductor.runtime import cache


def compiled_code(fn, *args, tmp_path) -> str:
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(*args)
    torch.testing.assert_close(got, fn(*args))
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))


@pytest.mark.parametrize("gathers", [True, False], ids=["gathers", "no_gathers"])
def test_transposed_operands_are_staged(tmp_path, monkeypatch, gathers: bool) -> None:
    monkeypatch.setattr(cpp_tiles, "gathers_enabled", lambda cxx: gathers)
    code = compiled_code(lambda x, y: x.t() + y, torch.randn(200, 131), torch.randn(131, 200), tmp_path=tmp_path / "a")
    rows, cols = cpp_tiles.staged_tile_shape(200, 131, 4, 1, torch.get_num_threads())  # (eager: x.t()'s layout)
    # whole tiles staged, full blocks in registers
    assert f"mi_t0 += {rows})" in code and f"mi_t1 += {cols})" in code and "mi_transpose16(" in code
    assert f"float mi_stage0[{rows}][{cols}];" in code
    # the operand read along the tile's rows (x: the output takes x.t()'s layout) is prefetched
    # PREFETCH_ROWS rows ahead, one prefetch per line of a row; the staged one (y) is prefetched
    # by its staging, PREFETCH_AHEAD elements on along each of a block's 16 source rows
    ahead = 131 * cpp_tiles.PREFETCH_ROWS
    prefetches = [line.strip() for line in code.splitlines() if "__builtin_prefetch" in line]
    staging = "for (int mi_p = 0; mi_p < 16; mi_p++) __builtin_prefetch(&in_ptr1[200L*mi_a + mi_b + mi_t0 + 200L*mi_t1]"
    assert prefetches[0] == f"{staging} + mi_p * 200 + {cpp_tiles.StagedTile.PREFETCH_AHEAD}, 0, 0);", prefetches
    assert prefetches[1:] == [f"__builtin_prefetch(&in_ptr0[{ahead + k} + mi_t1 + 131L*xo1], 0, 0);"
                              for k in range(0, cols, 16)], prefetches
    code = compiled_code(lambda x, y: x.transpose(1, 2) * y + x.transpose(1, 2).exp(),
                         torch.randn(3, 150, 133), torch.randn(3, 133, 150), tmp_path=tmp_path / "b")
    assert "mi_stage0" in code and "mi_stage1" not in code  # one staged block serves both reads
    code = compiled_code(lambda y, x, b: y + x.t() * b[:, None], torch.randn(150, 200), torch.randn(200, 150),
                         torch.randn(150), tmp_path=tmp_path / "r")
    assert "mi_stage0" in code and "mi_stage1" not in code  # a per-row value is read as is, not staged
    code = compiled_code(lambda x, y: x.t() * 3 + y, torch.randint(-9, 9, (160, 144), dtype=torch.int32),
                         torch.randint(-9, 9, (144, 160), dtype=torch.int32), tmp_path=tmp_path / "i")
    assert "mi_transpose16(" in code
    code = compiled_code(lambda x, y: (x.t() + y).half(), torch.randn(150, 133).half(), torch.randn(133, 150).half(),
                         tmp_path=tmp_path / "c")
    assert ("mi_stage0" in code) == (not gathers) and "mi_transpose16(" not in code
    code = compiled_code(lambda x, y: x.t() + y, torch.randn(140, 150, dtype=torch.float64),
                         torch.randn(150, 140, dtype=torch.float64), tmp_path=tmp_path / "d")
    assert ("mi_stage0" in code) == (not gathers) and "mi_transpose16(" not in code
    # mixed: a 4-byte transposed operand in registers, a 2-byte one by scalar copies
    code = compiled_code(lambda x, h, y: y + x.t() + h.t(), torch.randn(150, 140), torch.randn(150, 140).half(),
                         torch.randn(140, 150), tmp_path=tmp_path / "m")
    assert "mi_transpose16(" in code and code.count("alignas(64)") == (1 if gathers else 2)


def test_staged_tile_shape() -> None:
    """STAGED_ROWS x STAGED_COLS on large inputs; smaller when the stages would exceed
    STAGE_BYTES or there would be fewer than four tiles per thread; always multiples of 16."""
    big = 512 * 1024
    assert cpp_tiles.staged_tile_shape(4096, 4096, 4, 1, 2, big) == (cpp_tiles.STAGED_ROWS, cpp_tiles.STAGED_COLS) == (1024, 128)
    assert cpp_tiles.staged_tile_shape(4096, 4096, 4, 1, 2, big // 2) == (512, 128)  # a 512 KB L2
    assert cpp_tiles.staged_tile_shape(4096, 4096, 16, 1, 2, big) == (256, 128)  # four float stages
    for rows, cols, lead, threads in [(131, 200, 1, 2), (150, 133, 3, 2), (128, 128, 1, 8), (5000, 130, 1, 2)]:
        r, c = cpp_tiles.staged_tile_shape(rows, cols, 4, lead, threads)
        assert r % 16 == 0 and c % 16 == 0 and r * c * 4 <= cpp_tiles.stage_budget()
        assert lead * -(-rows // r) * -(-cols // c) >= 4 * threads or (r, c) == (16, 16)


def test_stage_budget_is_half_the_l2(monkeypatch) -> None:
    """The stage stays in L2 beside the streamed operands: half the L2, at most STAGE_BYTES,
    and the 512-row tiles' 256 KB where the L2's size is unknown."""
    for l2, budget in [(2 << 20, cpp_tiles.STAGE_BYTES), (1 << 20, 512 * 1024), (512 * 1024, 256 * 1024), (None, 256 * 1024)]:
        monkeypatch.setattr(cpp_tiles, "l2_cache_bytes", lambda: l2)
        assert cpp_tiles.stage_budget() == budget
    size = cache.l2_cache_bytes()
    assert size is None or size >= 64 * 1024


@pytest.mark.parametrize("shape", [(129, 131), (300, 257), (1000, 140), (140, 1000), (4, 150, 170)])
def test_staged_tiles_match_eager(shape) -> None:
    """Full and partial tiles and blocks, leading dims, two transposed operands, 4-byte ints."""
    torch._dynamo.reset()
    x, y = torch.randn(shape), torch.randn(shape)
    fn = lambda x, y: x.transpose(-1, -2) * 2 + y.transpose(-1, -2).contiguous().transpose(-1, -2).transpose(-1, -2).exp()
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, y), fn(x, y))
    g = lambda a, b: a.transpose(-1, -2) + b
    a = torch.randint(-99, 99, shape, dtype=torch.int32)
    b = torch.randint(-99, 99, shape[:-2] + shape[-2:][::-1], dtype=torch.int32)
    torch.testing.assert_close(torch.compile(g, backend="minductor")(a, b), g(a, b))


def test_masked_transposed_reads_are_not_staged(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cpp_tiles, "gathers_enabled", lambda cxx: False)
    code = compiled_code(lambda x, y: F.pad(x.t(), (1, 1, 1, 1)) + y, torch.randn(200, 300), torch.randn(302, 202),
                         tmp_path=tmp_path / "pad")
    assert "mi_stage" not in code


def test_reads_constant_along_the_inner_loop_do_not_tile(tmp_path) -> None:
    """An index vector (index_select) or a per-row value read along the outer dim is a
    broadcast, not a transpose: plain row loops, no 2-D tiles."""
    code = compiled_code(lambda x, i: x.index_select(0, i) * 2, torch.randn(200, 150), torch.randint(0, 200, (180,)),
                         tmp_path=tmp_path / "a")
    assert "mi_t1" not in code
    code = compiled_code(lambda x, b: x + b[:, None], torch.randn(200, 150), torch.randn(200), tmp_path=tmp_path / "b")
    assert "mi_t1" not in code


@pytest.mark.parametrize("shape", [(8, 64, 32, 64), (512, 16, 64)])
def test_small_planes_transpose_in_tiles(shape: tuple[int, ...], tmp_path) -> None:
    """Batched transposes of planes whose longer side is 64 stage their tiles (a strided read
    at a 4 KB stride maps every line of a pixel to one L1 set)."""
    code = compiled_code(lambda x: x.transpose(-1, -2).contiguous() * 2, torch.randn(shape), tmp_path=tmp_path)
    assert "mi_transpose16(" in code, code


def test_an_upsample_into_a_channels_last_buffer_transposes_in_tiles(tmp_path) -> None:
    """A 2x nearest upsample stored channels-last: the loops that repeat each source row and
    column go outside, so the source's rows meet the channels in 2-D tiles."""
    x = torch.randn(2, 64, 32, 32)
    code = compiled_code(lambda x: F.interpolate(x, scale_factor=2).contiguous(memory_format=torch.channels_last),
                         x, tmp_path=tmp_path)
    assert "mi_transpose16(" in code, code


def test_a_transposed_read_through_a_computed_index_is_not_staged() -> None:
    """A transposed operand picked by an index tensor (Falcon's fused query/key/value) is read
    where the body computed the index, not staged ahead of it (its fill loop named an index
    the body had not computed yet, and the kernel failed to compile)."""
    def fn(x: torch.Tensor, i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 1, i).squeeze(1).transpose(-1, -2) * 2 + y

    x, i, y = torch.randn(2, 6, 64, 128), torch.tensor([4]), torch.randn(2, 128, 64)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x, i, y), fn(x, i, y))
    with pytest.raises(IndexError):
        torch.compile(fn, backend="minductor")(x, torch.tensor([6]), y)
