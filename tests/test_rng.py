"""Random numbers generated inside the kernels (lowering/random.py, minductor_random.h): the
generator is Threefry-2x32-20 (known answers), and compiled rand, randn, dropout and
bernoulli have the right distributions, repeat under a seed, differ between calls, fuse, and
agree wherever one tensor's elements are recomputed."""
from __future__ import annotations

import ctypes
import math
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import config, metrics


@pytest.fixture(autouse=True)
def fresh() -> Any:
    torch._dynamo.reset()
    metrics.reset()
    yield
    torch._dynamo.reset()


def test_threefry_known_answers() -> None:
    """Random123's known-answer vectors of Threefry-2x32-20 (key, counter) -> output."""
    from minductor.runtime.cache import compile_cpp

    source = """#include "minductor_prelude.h"
extern "C" void threefry(const uint32_t* key, uint32_t* x) { mi_threefry2x32(key[0], key[1], x[0], x[1]); }
"""
    fn = ctypes.CDLL(str(compile_cpp(source, "mi_threefry_kat"))).threefry
    cases = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
             ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
             ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]
    for key, counter, expected in cases:
        k, x = (ctypes.c_uint32 * 2)(*key), (ctypes.c_uint32 * 2)(*counter)
        fn(k, x)
        assert (x[0], x[1]) == expected, [hex(v) for v in x]


def _compiled(fn: Any) -> Any:
    return torch.compile(fn, backend="minductor", dynamic=False)


def test_rand_is_uniform_and_generated_in_the_kernel() -> None:
    n = 1 << 20
    out = _compiled(lambda x: torch.rand_like(x))(torch.empty(n))
    assert not metrics.fallback_ops, metrics.fallback_ops
    assert out.dtype == torch.float32 and 0 <= out.min() and out.max() < 1
    sigma = math.sqrt(1 / 12 / n)
    assert abs(out.mean().item() - 0.5) < 5 * sigma
    assert abs(out.var().item() - 1 / 12) < 0.002
    counts = torch.histc(out, bins=64, min=0, max=1)  # chi-square, 63 degrees of freedom
    chi2 = (((counts - n / 64) ** 2) / (n / 64)).sum().item()
    assert chi2 < 63 + 6 * math.sqrt(2 * 63), chi2
    neighbours = torch.corrcoef(torch.stack([out[:-1], out[1:]]))[0, 1].item()  # consecutive elements
    assert abs(neighbours) < 5 / math.sqrt(n), neighbours


def test_randn_is_standard_normal() -> None:
    n = 1 << 20
    out = _compiled(lambda: torch.randn(1024, 1024))()
    assert not metrics.fallback_ops, metrics.fallback_ops
    assert abs(out.mean().item()) < 5 / math.sqrt(n)
    assert abs(out.std().item() - 1) < 0.005
    assert abs(((out.abs() > 2).float().mean().item()) - 0.0455) < 0.002  # the normal's two tails
    kurtosis = (out ** 4).mean().item()
    assert abs(kurtosis - 3) < 0.05, kurtosis


def test_seeded_runs_repeat_and_calls_differ() -> None:
    f = _compiled(lambda x: (torch.rand_like(x), torch.randn(7)))
    x = torch.empty(1000)
    torch.manual_seed(3)
    first = f(x)
    second = f(x)
    torch.manual_seed(3)
    again = f(x)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
    assert torch.corrcoef(torch.stack([first[0], second[0]]))[0, 1].abs() < 0.15


def test_two_random_nodes_are_independent_and_one_node_is_read_alike() -> None:
    """Two rand calls of one shape give other numbers; one rand read transposed, sliced and
    compared in several kernels gives the same numbers everywhere."""
    def fn() -> Any:
        a, b = torch.rand(256, 300), torch.rand(256, 300)
        return a, b, a.t().contiguous() * 2, (a[:, 1:] > 0.5).sum(1), a.sum(0)
    a, b, at2, count, col = _compiled(fn)()
    assert not metrics.fallback_ops, metrics.fallback_ops
    assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]) < 0.02
    torch.testing.assert_close(at2, a.t() * 2, rtol=0, atol=0)
    torch.testing.assert_close(count, (a[:, 1:] > 0.5).sum(1), rtol=0, atol=0)
    torch.testing.assert_close(col, a.sum(0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_rand(dtype: torch.dtype) -> None:
    out = _compiled(lambda x: torch.rand_like(x))(torch.empty(1 << 16, dtype=dtype))
    assert out.dtype == dtype and 0 <= out.min() and out.max() <= 1
    assert abs(out.float().mean().item() - 0.5) < 0.01


def test_dropout_training_fuses_and_its_gradient_follows_its_mask() -> None:
    """Training dropout is one kernel writing the output and the mask; the gradient is the
    mask times 1 / (1 - p), the same elements the forward kept."""
    p = 0.3
    x = torch.randn(512, 256).abs() + 0.1
    xg = x.clone().requires_grad_()
    with config.patch(aot_cache=False):  # (a hit there loads the backward with the forward)
        out = _compiled(lambda x: F.dropout(x, p, training=True))(xg)
    assert metrics.kernels_by_backend["cpp"] == 1 and not metrics.fallback_ops, metrics.fallback_ops
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(xg.grad, kept.float() / (1 - p))


def test_bernoulli_follows_its_probabilities() -> None:
    probs = torch.linspace(0, 1, 64).repeat(4096, 1)
    draws = _compiled(lambda p: torch.bernoulli(p))(probs)
    assert not metrics.fallback_ops, metrics.fallback_ops
    torch.testing.assert_close(draws.mean(0), probs[0], atol=0.03, rtol=0)


def test_fallback_random_keeps_eager_numbers() -> None:
    """With ``config.fallback_random`` nothing random is generated in a kernel."""
    with config.patch(fallback_random=True):
        torch.manual_seed(0)
        out = _compiled(lambda x: F.dropout(x, 0.5, training=True))(torch.ones(100))
    torch.manual_seed(0)
    torch.testing.assert_close(out, F.dropout(torch.ones(100), 0.5, training=True))


def test_triton_kernels_draw_with_triton_philox() -> None:
    """The Triton backend (in its interpreter) generates with ``tl.rand``/``tl.randn``."""
    n = 1 << 16
    with config.patch(cpu_backend="triton"):
        f = _compiled(lambda x: (torch.rand_like(x), torch.randn_like(x), F.dropout(x + 1, 0.25, training=True)))
        torch.manual_seed(5)
        u, z, d = f(torch.zeros(n))
        torch.manual_seed(5)
        again = f(torch.zeros(n))
    assert metrics.kernels_by_backend["triton"] >= 1 and not metrics.kernels_by_backend["cpp"]
    assert not metrics.fallback_ops, metrics.fallback_ops
    torch.testing.assert_close((u, z, d), again, rtol=0, atol=0)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(z.mean().item()) < 5 / math.sqrt(n) and abs(z.std().item() - 1) < 0.02
    assert abs((d == 0).float().mean().item() - 0.25) < 0.02 and torch.all((d == 0) | (d == 1 / 0.75))
    assert abs(torch.corrcoef(torch.stack([u, z]))[0, 1]) < 5 / math.sqrt(n)


def test_random_loops_vectorize(tmp_path) -> None:
    """A loop drawing uniform or normal numbers vectorizes (32-bit adds, rotates and xors)."""
    from tests.conftest import vectorization_report

    path = tmp_path / "k.cpp"
    path.write_text('''#include "minductor_prelude.h"
extern "C" void k0(int64_t seed, float* __restrict__ b, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) b[i] = mi_rand(seed, i);  // LOOP
}
extern "C" void k1(int64_t seed, float* __restrict__ b, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) b[i] = mi_randn(seed, i);  // LOOP
}
''')
    report = vectorization_report(path, tmp_path)
    lines = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if "// LOOP" in line]
    vectorized = {int(n) for n in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    assert set(lines) <= vectorized, report
