"""The machine's memory bandwidth, measured with STREAM loops (copy, add, triad, and a pure
read) compiled by minductor's own C++ toolchain, so the reference does not depend on how well
aten implements ``copy_`` or ``sum``. Rates count bytes as STREAM does: each array read or
written once (a copy moves 2 streams, an add 3).

A stored cache line may or may not cost a read first (write-allocate): here (an AVX-512 Xeon
VM) a pure read of 256 MB ran at 27 GB/s while a copy moved 23 GB/s, i.e. 34 GB/s if stores
were read first, so stores evidently skip that read and no traffic model is applied.

Kernels write large float32 outputs with streaming (non-temporal) stores (codegen/cpp_stream.py),
which move more bytes per second than ordinary stores here; copy_nt and add_nt are the same
loops with such stores, so the reference is the best a kernel could do either way."""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from minductor.runtime.cache import compile_cpp

_SOURCE = r"""
#include "minductor_prelude.h"
extern "C" void mi_stream_read(const float* __restrict__ a, float* __restrict__ out, int64_t n) {
    float s = 0.0f;
    #pragma omp parallel for simd schedule(static) reduction(+:s)
    for (int64_t i = 0; i < n; i++) s += a[i];
    out[0] = s;
}
extern "C" void mi_stream_copy(const float* __restrict__ a, float* __restrict__ c, int64_t n) {
    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) c[i] = a[i];
}
extern "C" void mi_stream_add(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int64_t n) {
    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}
extern "C" void mi_stream_triad(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int64_t n) {
    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) c[i] = a[i] + 3.0f * b[i];
}
// streaming stores: c 64-byte aligned, n a multiple of 16
extern "C" void mi_stream_copy_nt(const float* __restrict__ a, float* __restrict__ c, int64_t n) {
    #pragma omp parallel
    {
        #pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < n; i += 16) {
            alignas(64) float line[16];
            #pragma omp simd
            for (int64_t l = 0; l < 16; l++) line[l] = a[i + l];
            mi_stream_store(c + i, line);
        }
        mi_stream_fence();
    }
}
extern "C" void mi_stream_add_nt(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int64_t n) {
    #pragma omp parallel
    {
        #pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < n; i += 16) {
            alignas(64) float line[16];
            #pragma omp simd
            for (int64_t l = 0; l < 16; l++) line[l] = a[i + l] + b[i + l];
            mi_stream_store(c + i, line);
        }
        mi_stream_fence();
    }
}
"""
# loop -> arrays it moves
_STREAMS = {"read": 1, "copy": 2, "add": 3, "triad": 3, "copy_nt": 2, "add_nt": 3}


@functools.cache
def _library() -> ctypes.CDLL:
    return ctypes.CDLL(str(compile_cpp(_SOURCE, "mi_stream")))


@functools.cache
def stream_loops(numel: int = 1 << 26) -> dict[str, tuple[Callable[[], None], int]]:
    """The STREAM loops over ``numel``-float arrays the process keeps: name -> (a call, the bytes
    it moves as STREAM counts them)."""
    lib = _library()
    a, b, c = (torch.ones(numel) for _ in range(3))
    out = torch.zeros(1)
    n = ctypes.c_int64(numel)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731 - the calls hold the tensors, not bare pointers
    calls = {
        "read": lambda: lib.mi_stream_read(p(a), p(out), n),
        "copy": lambda: lib.mi_stream_copy(p(a), p(c), n),
        "add": lambda: lib.mi_stream_add(p(a), p(b), p(c), n),
        "triad": lambda: lib.mi_stream_triad(p(a), p(b), p(c), n),
        "copy_nt": lambda: lib.mi_stream_copy_nt(p(a), p(c), n),
        "add_nt": lambda: lib.mi_stream_add_nt(p(a), p(b), p(c), n),
    }
    assert c.data_ptr() % 64 == 0 and numel % 16 == 0, "streaming stores need whole aligned lines"
    return {name: (call, _STREAMS[name] * numel * 4) for name, call in calls.items()}


def stream_probes(numel: int = 1 << 26, timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, float]:
    """GB/s of each loop over ``numel``-float arrays. ``timer(fn)`` returns seconds per call."""
    from minductor.bench.runner import median_time

    timer = timer or (lambda fn: min(median_time(fn, 0.2) for _ in range(3)))
    return {name: moved / timer(call) / 1e9 for name, (call, moved) in stream_loops(numel).items()}
