"""The machine's memory bandwidth, measured with STREAM loops (copy, add, triad, and a pure
read) compiled by minductor's own C++ toolchain, so the reference does not depend on how well
aten implements ``copy_`` or ``sum``. Rates count bytes as STREAM does: each array read or
written once (a copy moves 2 streams, an add 3).

A stored cache line may or may not cost a read first (write-allocate): here (an AVX-512 Xeon
VM) a pure read of 256 MB ran at 27 GB/s while a copy moved 23 GB/s, i.e. 34 GB/s if stores
were read first, so stores evidently skip that read and no traffic model is applied."""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from minductor.runtime.cache import compile_cpp

_SOURCE = r"""
#include <stdint.h>
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
"""
# loop -> arrays it moves
_STREAMS = {"read": 1, "copy": 2, "add": 3, "triad": 3}


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
    }
    return {name: (call, _STREAMS[name] * numel * 4) for name, call in calls.items()}


def stream_probes(numel: int = 1 << 26, timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, float]:
    """GB/s of each loop over ``numel``-float arrays. ``timer(fn)`` returns seconds per call."""
    from minductor.bench.runner import median_time

    timer = timer or (lambda fn: min(median_time(fn, 0.2) for _ in range(3)))
    return {name: moved / timer(call) / 1e9 for name, (call, moved) in stream_loops(numel).items()}
