"""2-D tiles for transposed pointwise access. Where the compiler emits no vector gathers, the
transposed operand is staged per tile; with gathers it is loaded with its stride.

Sizes are not multiples of the tile edge, so edge tiles are partial; a masked (padded) read
of the transposed operand must not be staged (its loads may only run where the mask holds).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen import cpp


def compiled_code(fn, *args, tmp_path) -> str:
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(fn, backend="minductor")(*args)
    torch.testing.assert_close(got, fn(*args))
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))


@pytest.mark.parametrize("gathers", [True, False], ids=["gathers", "no_gathers"])
def test_transposed_operands_are_staged_without_gathers(tmp_path, monkeypatch, gathers: bool) -> None:
    monkeypatch.setattr(cpp, "gathers_enabled", lambda cxx: gathers)
    code = compiled_code(lambda x, y: x.t() + y, torch.randn(200, 131), torch.randn(131, 200), tmp_path=tmp_path / "a")
    assert "mi_t1 += 64" in code  # 2-D tiles
    assert ("mi_stage0" in code) == (not gathers)
    code = compiled_code(lambda x, y: x.transpose(1, 2) * y + x.transpose(1, 2).exp(),
                         torch.randn(3, 150, 133), torch.randn(3, 133, 150), tmp_path=tmp_path / "b")
    assert ("mi_stage0" in code) == (not gathers) and "mi_stage1" not in code  # one staged block serves both reads
    compiled_code(lambda x, y: (x.t() + y).half(), torch.randn(130, 67).half(), torch.randn(67, 130).half(),
                  tmp_path=tmp_path / "c")


def test_masked_transposed_reads_are_not_staged(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cpp, "gathers_enabled", lambda cxx: False)
    code = compiled_code(lambda x, y: F.pad(x.t(), (1, 1, 1, 1)) + y, torch.randn(200, 300), torch.randn(302, 202),
                         tmp_path=tmp_path / "pad")
    assert "mi_stage" not in code
