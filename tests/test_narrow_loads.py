"""Reductions that stream their input through cheap arithmetic ask GCC for 256-bit vectors
where those stream faster from memory (Zen 4: runtime/cache.narrow_loads_stream_faster).
The CPU test is forced on here, so the choice of kernels and their results are checked on
any machine; the generated code is compared with eager."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minductor import config
from minductor.codegen import cpp_unit
from minductor.runtime import cache

PRAGMA = '#pragma GCC target("prefer-vector-width=256")'

STREAMING = {
    "row_sum": (lambda x, y: x.sum(1), 1e-4),
    "full_sum": (lambda x, y: x.sum(), 1e-3),
    "row_mean": (lambda x, y: x.mean(1), 1e-5),
    "row_amax": (lambda x, y: x.amax(1), 0),
    "masked_row_sum": (lambda x, y: x.masked_fill(y > 0, 0.0).sum(-1), 1e-4),
    "squared_error": (lambda x, y: ((x - y) ** 2).mean(), 1e-5),
    "abs_sum": (lambda x, y: x.abs().sum(), 1e-3),
}
OTHERS = {
    "softmax": lambda x, y: torch.softmax(x, -1),
    "layer_norm": lambda x, y: F.layer_norm(x, (x.shape[-1],)),
    "column_sum": lambda x, y: x.sum(0),
    "logsumexp": lambda x, y: torch.logsumexp(x, 1),
    "sum_and_scaled_copy": lambda x, y: (x.sum(), x * 2),  # a store along the reduced elements
}


def _compiled_source(fn, x, y, tmp_path: Path, atol: float = 1e-5) -> str:
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path), aot_cache=False):
        got = torch.compile(fn, backend="minductor")(x, y)
    torch.testing.assert_close(got, fn(x, y), atol=atol, rtol=1e-5)
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))


@pytest.fixture
def narrow_cpu(monkeypatch):
    monkeypatch.setattr(cpp_unit, "narrow_loads_stream_faster", lambda: True)


@pytest.mark.parametrize("case", list(STREAMING))
def test_streaming_reductions_ask_for_256_bit_vectors(case: str, tmp_path: Path, narrow_cpu) -> None:
    fn, atol = STREAMING[case]
    x, y = torch.randn(64, 1000), torch.randn(64, 1000)
    source = _compiled_source(fn, x, y, tmp_path, atol=max(atol, 1e-5))
    assert source.count(PRAGMA) == 1 and source.count("#pragma GCC pop_options") == 1, source


@pytest.mark.parametrize("case", list(OTHERS))
def test_compute_bound_and_column_kernels_keep_the_native_width(case: str, tmp_path: Path, narrow_cpu) -> None:
    source = _compiled_source(OTHERS[case], torch.randn(64, 1000), torch.randn(64, 1000), tmp_path, atol=1e-4)
    assert "cpp_fused" in source and PRAGMA not in source


def test_without_the_cpu_no_kernel_asks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cpp_unit, "narrow_loads_stream_faster", lambda: False)
    source = _compiled_source(STREAMING["row_sum"][0], torch.randn(64, 1000), torch.randn(64, 1000), tmp_path, atol=1e-4)
    assert "cpp_fused" in source and PRAGMA not in source


@pytest.mark.skipif(not cache.avx512_enabled(config.cxx), reason="needs a CPU whose -march=native enables AVX-512 (zmm)")
def test_the_pragma_keeps_the_row_sum_off_zmm_registers(tmp_path: Path, narrow_cpu) -> None:
    """The pragma reaches the loop OpenMP outlines: its additions run on ymm registers."""
    source = _compiled_source(STREAMING["row_sum"][0], torch.randn(64, 4096), torch.randn(64, 4096), tmp_path, atol=1e-4)
    asm = tmp_path / "k.s"
    src = tmp_path / "k.cpp"
    src.write_text(source)
    subprocess.run([config.cxx, *cache.compiler_flags(config.cxx), "-S", str(src), "-o", str(asm)], check=True)
    adds = re.findall(r"vaddps\s+[^\n]*", asm.read_text())
    assert any("%ymm" in a for a in adds) and not any("%zmm" in a for a in adds), adds


@pytest.mark.parametrize(("vendor", "family", "expected"), [("AuthenticAMD", "25", True), ("AuthenticAMD", "26", False),
                                                            ("GenuineIntel", "6", False)])
def test_only_zen_4_streams_faster_with_narrow_loads(monkeypatch, on_cpu, vendor: str, family: str, expected: bool) -> None:
    monkeypatch.setattr(cache, "avx512_enabled", lambda cxx: True)
    assert on_cpu(cache.narrow_loads_stream_faster, {"vendor_id": vendor, "cpu family": family}) is expected
