"""The C++ kernel cache: compile, load, hit, report errors, survive a fresh process."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import vectorization_report

from minductor import config, metrics
from minductor.runtime import cache

ARANGE = 'extern "C" void k(float* out, long n){for(long i=0;i<n;i++) out[i]=i;}\n'


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path):
    metrics.reset()
    with config.patch(cache_dir=str(tmp_path / "cache")):
        yield tmp_path / "cache"


def run_arange(fn, n: int = 37) -> torch.Tensor:
    out = torch.empty(n)
    fn(ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(n))
    return out


def test_compile_load_and_run() -> None:
    so = cache.compile_cpp(ARANGE, "k")
    assert so.exists() and so.with_suffix(".cpp").read_text() == ARANGE
    assert so.with_suffix(".cpp") == cache.cpp_source_path(ARANGE, "k")
    out = run_arange(cache.load_cpp_kernel(so, "k"))
    torch.testing.assert_close(out, torch.arange(37, dtype=torch.float32))
    assert (metrics.cache_hits, metrics.cache_misses) == (0, 1)


def test_second_compile_is_a_cache_hit(fresh_cache: Path) -> None:
    first = cache.compile_cpp(ARANGE, "k")
    second = cache.compile_cpp(ARANGE, "k")
    assert first == second and fresh_cache in first.parents
    assert (metrics.cache_hits, metrics.cache_misses) == (1, 1)


def test_key_depends_on_source_and_layout() -> None:
    key = cache.cache_key(ARANGE)
    assert key != cache.cache_key(ARANGE.replace("i;", "2*i;"))
    path = cache.cpp_source_path(ARANGE, "k")
    assert path.parent.name == key and path.parent.parent.name == key[:2]
    assert path.parent.parent.parent.name == "cpp"


def test_compile_and_load_many_in_order() -> None:
    sources = [(ARANGE.replace('"C" void k', f'"C" void k{i}').replace("=i;", f"=i+{i};"), f"k{i}") for i in range(3)]
    with config.patch(compile_threads=3):
        fns = cache.compile_and_load_many(sources)
    for i, fn in enumerate(fns):
        torch.testing.assert_close(run_arange(fn), torch.arange(37, dtype=torch.float32) + i)
    assert metrics.cache_misses == 3
    assert cache.compile_and_load_many(sources[:1])[0] is fns[0]  # in-process memo: no reload


def test_many_kernels_compile_in_batches(fresh_cache: Path) -> None:
    """Five kernels with two compile threads: two g++ runs, each .so holding several kernels."""
    sources = [(ARANGE.replace('"C" void k', f'"C" void k{i}').replace("=i;", f"=i+{i};"), f"k{i}") for i in range(5)]
    cache._loaded.clear()  # the in-process memo outlives the cache directory of other tests
    with config.patch(compile_threads=2):
        fns = cache.compile_and_load_many(sources)
    for i, fn in enumerate(fns):
        torch.testing.assert_close(run_arange(fn), torch.arange(37, dtype=torch.float32) + i)
    assert metrics.cache_misses == 5
    assert len(list(fresh_cache.rglob("*.so"))) == 2
    cache._loaded.clear()  # a new process: the batches come from disk
    with config.patch(compile_threads=2):
        again = cache.compile_and_load_many(sources)
    torch.testing.assert_close(run_arange(again[4]), torch.arange(37, dtype=torch.float32) + 4)
    assert metrics.cache_hits == 5


def test_failing_batch_reports_the_failing_kernel() -> None:
    bad = 'extern "C" void bad(float* out){ out[0] = ; }\n'
    sources = [(ARANGE, "k"), (bad, "bad"), (ARANGE.replace('"C" void k', '"C" void k2'), "k2")]
    cache._loaded.clear()
    with config.patch(compile_threads=1), pytest.raises(cache.CppCompileError) as info:
        cache.compile_and_load_many(sources)
    assert str(cache.cpp_source_path(bad, "bad")) in str(info.value)
    assert cache.cpp_source_path(ARANGE, "k").with_suffix(".so").exists()  # compiled alone after the batch failed


def test_syntax_error_raises_with_path_and_compiler_output() -> None:
    bad = 'extern "C" void bad(float* out){ out[0] = ; }\n'
    with pytest.raises(cache.CppCompileError) as info:
        cache.compile_cpp(bad, "bad")
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert str(cache.cpp_source_path(bad, "bad")) in message
    assert "error" in message and "bad" in message and "MINDUCTOR_DEBUG=1" in message
    assert not cache.cpp_source_path(bad, "bad").with_suffix(".so").exists()


CHILD = """
import json
from minductor import metrics
from minductor.runtime.cache import compile_and_load_many
compile_and_load_many([(%r, "k")])
print(json.dumps({"hits": metrics.cache_hits, "misses": metrics.cache_misses}))
"""


def test_fresh_process_hits_the_disk_cache(fresh_cache: Path) -> None:
    cache.compile_cpp(ARANGE, "k")
    env = {**os.environ, "MINDUCTOR_CACHE_DIR": str(fresh_cache)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD % ARANGE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts == {"hits": 1, "misses": 0}


def _intel_avx2() -> bool:
    try:
        info = open("/proc/cpuinfo").read(1 << 16)
    except OSError:
        return False
    return "GenuineIntel" in info and " avx2" in info


@pytest.mark.skipif(not _intel_avx2(), reason="gathers are enabled for Intel CPUs with AVX2 only")
def test_strided_masked_loads_vectorize_with_our_flags(tmp_path: Path) -> None:
    """A 3x3/2 max-pool kernel (stride-2 loads under padding masks) must vectorize with the
    flags kernels compile with, whatever -mtune -march=native picks (GCC 12's "generic"
    tuning never emits gathers: that kernel then ran scalar, 12x slower)."""
    with config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        torch.compile(lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1), backend="minductor")(torch.randn(2, 8, 32, 32))
    source = next((tmp_path / "dump").glob("graph_*/cpp_fused_max_pool2d_*.cpp"))
    report = vectorization_report(source, tmp_path)
    assert "loop vectorized" in report, report[-2000:]


@pytest.mark.parametrize("state, flags", [("[enabled]", ["-mno-avx512fp16"]), ("[disabled]", [])])
def test_avx512fp16_is_turned_off_where_native_enables_it(monkeypatch: pytest.MonkeyPatch, state: str, flags: list[str]) -> None:
    """GCC 12 with AVX512-FP16 dropped float -> half -> float roundings of an unrolled loop."""
    out = f"  -mavx512f                   \t\t[enabled]\n  -mavx512fp16                \t\t{state}\n"
    monkeypatch.setattr(cache, "_native_target", lambda cxx: out)
    assert cache.isa_flags("g++") == flags


def test_half_round_trip_of_a_padded_row_rounds_every_element() -> None:
    # the kernel GCC 12 miscompiled with -mavx512fp16: 4 of the 5 values of each row unrounded
    fn = lambda x: torch.nn.functional.pad(x.half(), (2, 0)).float()  # noqa: E731
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(torch.compile(fn, backend="minductor")(x), fn(x), atol=0, rtol=0)


def test_compiler_probes_are_kept_on_disk_per_binary(tmp_path: Path, fresh_cache: Path) -> None:
    """A probe of the compiler runs once per binary (a changed binary runs it again)."""
    fake = tmp_path / "fake-cxx"
    log = tmp_path / "runs"

    def write(version: str) -> None:
        fake.write_text(f"#!/bin/sh\necho run >> {log}\necho {version}\n")
        fake.chmod(0o755)

    write("v1")
    probe = cache._probe.__wrapped__  # past the in-process memo, as a new process would be
    assert probe(str(fake), "--version") == "v1\n" and probe(str(fake), "--version") == "v1\n"
    assert log.read_text().count("run") == 1
    assert list((fresh_cache / "toolchain").iterdir())
    write("version-2")  # another size: another binary
    assert probe(str(fake), "--version") == "version-2\n"
    assert log.read_text().count("run") == 2
    assert probe(str(tmp_path / "missing-cxx"), "--version") == ""


def _chain50(x: torch.Tensor) -> torch.Tensor:
    for i in range(25):
        x = (x * 1.01 + 0.1).tanh()
        if i % 5 == 0:
            x = x - x.mean(-1, keepdim=True)
    return x


def test_a_lone_large_kernel_compiles_in_parallel_parts(fresh_cache: Path, monkeypatch) -> None:
    """A 50-op chain fuses into one kernel of ~400 lines: with two compile threads its loop
    functions compile as two object files at once, linked into one library. The same source
    also compiles as one unit (as a dump's .cpp does by hand). Both match eager."""
    runs: list[list[str]] = []
    real = cache._run_cxx
    monkeypatch.setattr(cache, "_run_cxx", lambda cmd, *rest: (runs.append(cmd), real(cmd, *rest))[1])
    x = torch.randn(64, 256)
    expected = _chain50(x)
    cache._loaded.clear()
    torch._dynamo.reset()
    with config.patch(compile_threads=2):
        torch.testing.assert_close(torch.compile(_chain50, backend="minductor")(x), expected)
    assert metrics.generated_kernel_count == 1
    sources = list(fresh_cache.rglob("*.cpp"))
    assert len(sources) == 1 and cache.source_parts(sources[0].read_text()) == 2
    assert sorted(a for cmd in runs for a in cmd if a.startswith("-DMI_PART=")) == ["-DMI_PART=0", "-DMI_PART=1"]
    assert len(runs) == 3  # two parts, one link

    runs.clear()
    cache._loaded.clear()
    torch._dynamo.reset()
    monkeypatch.setattr(cache, "source_parts", lambda source: 1)
    with config.patch(compile_threads=2, cache_dir=str(fresh_cache / "whole"), aot_cache=False):
        torch.testing.assert_close(torch.compile(_chain50, backend="minductor")(x), expected)
    assert len(runs) == 1 and not any(a.startswith("-DMI_PART") for a in runs[0])
    assert "MI_IN_PART(1)" in next((fresh_cache / "whole").rglob("*.cpp")).read_text()


def test_loaded_kernels_take_plain_ints() -> None:
    """Given its source, a kernel's parameter types are declared: a 64-bit data pointer and a
    size pass as Python ints (undeclared, ctypes would pass a pointer as a 32-bit C int)."""
    source = '#include <cstdint>\nextern "C" void k(const float* __restrict__ a, float* out, const int64_t n, double s)' \
             '{for(long i=0;i<n;i++) out[i]=a[i]*s;}\n'
    fn, = cache.compile_and_load_many([(source, "k")])
    a, out = torch.randn(4099), torch.empty(4099)
    fn(a.data_ptr(), out.data_ptr(), 4099, 0.5)
    torch.testing.assert_close(out, a * 0.5)
    assert a.data_ptr() >= 1 << 32  # the pointer did not fit a C int


def test_a_kernel_parameter_of_unknown_type_is_an_error() -> None:
    source = 'extern "C" void k(float* out, unsigned short n){for(int i=0;i<n;i++) out[i]=i;}\n'
    with pytest.raises(cache.CppCompileError, match="kernel k takes a parameter 'unsigned short n' of no known type"):
        cache.compile_and_load_many([(source, "k")])


def test_kernels_repeated_by_layers_compile_once(tmp_path: Path) -> None:
    """Layers that repeat give kernels whose code differs only in names and comments: each
    code is compiled once and the wrapper calls its twins through the first (and every
    layer's result is still right: the twins take their own buffers)."""
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()) for _ in range(4)]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(32, 64)
    cache._loaded.clear()
    with torch.no_grad(), config.patch(debug=True, debug_dir=str(tmp_path / "dump")):
        out = torch.compile(model, backend="minductor")(x)
        torch.testing.assert_close(out, model(x))
    (code,) = [p.read_text() for p in (tmp_path / "dump").glob("graph_*/output_code.py")]
    sources, twins = code.count("_source = r'''"), code.count("  # the same code")
    assert twins >= 3 and sources + twins == metrics.generated_kernel_count, code
    assert metrics.cache_misses == sources
