"""minductor's flags: a flat, typed module read from ``MINDUCTOR_*`` environment variables.

Code reads flags at use time (``config.debug``), never ``from minductor.config import debug``,
so ``patch()`` and assignments take effect everywhere.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


class ConfigError(ValueError):
    """A flag holds a value minductor cannot use: raised to the user, never worked around."""


def _env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minductor")


# Write, per compiled graph, the FX graph, IR before/after fusion, kernels and wrapper.
debug: bool = _env_bool("MINDUCTOR_DEBUG")
# An internal error while compiling a graph (a bug of minductor's, a kernel the C++ compiler
# rejects) raises. Off (the default), the graph runs through aten instead and the error is
# logged with its traceback: a model never fails to compile. The tests run strict.
strict: bool = _env_bool("MINDUCTOR_STRICT")
# Where debug dumps go (one ``graph_NNN_<kind>`` folder per compiled graph).
debug_dir: str = os.environ.get("MINDUCTOR_DEBUG_DIR") or "./minductor_debug"
# Content-addressed kernel cache (``<cache_dir>/cpp/<key[:2]>/<key>/``).
cache_dir: str = os.environ.get("MINDUCTOR_CACHE_DIR") or _default_cache_dir()
# Also store compiled graphs in AOTAutograd's cache (``<cache_dir>/aotautograd/``), keyed by
# Dynamo's graph: a warm start then skips AOTAutograd's tracing as well (see aot_cache.py).
aot_cache: bool = _env_bool("MINDUCTOR_AOT_CACHE", True)
# C++ compiler used for CPU kernels.
cxx: str = os.environ.get("MINDUCTOR_CXX") or "g++"
# How many kernels compile at once.
compile_threads: int = _env_int("MINDUCTOR_COMPILE_THREADS", min(os.cpu_count() or 1, 8))
# Code generator for CPU tensors: "cpp", or "triton" (Triton kernels run in Triton's interpreter:
# set TRITON_INTERPRET=1 in the environment before the first kernel loads). CUDA tensors use Triton.
cpu_backend: str = "cpp"
# Compiled graphs that call a GRU (torch.nn.GRU / aten.gru) run it as one scan per layer and
# direction on the XLA path instead of unrolling the recurrence into the graph.
scan_rnn: bool = _env_bool("MINDUCTOR_SCAN_RNN")
# torch.einsum runs as one XLA contraction when it contracts at least this much work (the
# product of its index sizes, multiply-adds); smaller ones, and those that contract nothing
# (broadcast products, traces, transposes), are decomposed by AOTAutograd and lowered here,
# fusing with their neighbours. A call to XLA costs ~150 us on a 2-core CPU (DLPack in and out,
# the jitted dispatch): a matrix-vector einsum at 1024^2 took 212 us against eager's 61, a
# broadcast product 250 against 47, a trace 273 against 5; from 2^28 on it is at most a few %.
# 0 sends every einsum to XLA. (An einsum of three or more operands needs a 16th of it.)
einsum_xla_min_work: int = _env_int("MINDUCTOR_EINSUM_XLA_MIN_WORK", 1 << 28)
# With Triton kernels (CUDA tensors, or cpu_backend "triton"): generate mm/addmm as a Triton
# matmul template with the following pointwise group fused in, where shapes and dtypes allow.
triton_mm_template: bool = True
# Triton kernels try a few block sizes / warp counts on their first call per size and keep the
# fastest (timed with triton.testing.do_bench; GPU only: elsewhere the heuristic config runs).
triton_autotune: bool = _env_bool("MINDUCTOR_TRITON_AUTOTUNE")
# Run random ops (rand, randn, dropout kept whole) through aten so results match eager bit for
# bit; off, rand and randn are generated in the kernels that read them (lowering/random.py).
fallback_random: bool = False
# Check indirect indices (gather, index, scatter...) in generated code and raise IndexError like
# eager; off, an out-of-range index reads or writes out of bounds (faster, for trusted inputs).
bounds_check: bool = _env_bool("MINDUCTOR_BOUNDS_CHECK", True)

# Where glibc's vector math library (libmvec, x86-64 Linux) is installed, float32 sin/cos in C++
# kernels call its vector functions: accurate to 2 ulp for every argument (our own polynomials
# reduce in double and lose huge arguments) and faster (one call per 8 or 16 lanes).
libmvec: bool = _env_bool("MINDUCTOR_LIBMVEC", True)

# Keep large CPU buffers of a graph across calls and reuse one once nothing holds it
# (fresh large buffers page-fault on every call; see runtime/buffer_pool.py).
reuse_buffers_across_calls: bool = _env_bool("MINDUCTOR_REUSE_BUFFERS", True)
# Smallest buffer the pool keeps (smaller ones come from malloc's free lists without faults).
pool_min_bytes: int = _env_int("MINDUCTOR_POOL_MIN_BYTES", 256 * 1024)

# A fresh CPU buffer of at least this many bytes that the pool does not keep (a training step's
# outputs) asks for transparent huge pages before its first write: one page fault per 2 MB
# instead of per 4 KB (see runtime/huge_pages.py). 0 turns it off.
huge_page_min_bytes: int = _env_int("MINDUCTOR_HUGE_PAGE_MIN_BYTES", 4 << 20)

# C++ kernels store a float32 output of at least this many bytes with non-temporal (streaming)
# stores, 64-byte lines that skip the read-for-ownership an ordinary store pays and do not
# displace the inputs from cache (x + y at 4096^2 on a Xeon: 7.0 -> 3.8 ms; at 4 MB a consumer
# reading the output back from cache made them a loss). 0 turns them off.
stream_store_min_bytes: int = _env_int("MINDUCTOR_STREAM_STORE_MIN_BYTES", 16 << 20)

# ... and only in a kernel whose buffers (read and written) take at least this many bytes in
# all; -1: 1.5 times the last-level cache. A kernel that fits in cache finds its inputs there
# on the next call, and the output's reader finds it there, unless the stores bypassed it:
# int8 -> float32 dequantization of 4096x1024 (4 + 16 MB, a 32 MB L3) ran 410-465 us
# streamed, 110-130 us not; at 48 MB and more the streamed stores win (x + y with a 16 MB
# output, 560 against 626 us). Row kernels (with a reduction) stream whatever their footprint
# (cpp_stream.streamable_buffer). 0: the output's size alone decides.
stream_store_min_footprint: int = _env_int("MINDUCTOR_STREAM_STORE_MIN_FOOTPRINT", -1)

# Which library runs float32 matrix products on CPU (mm, and addmm with a vector bias): "mkl"
# (aten's mm.out), "onednn" (oneDNN's matmul, torch.ops.mkldnn._linear_pointwise) or "auto":
# oneDNN on x86 CPUs not made by Intel, where MKL's dispatch takes a slower path (on an AMD
# EPYC, 1024x256 @ 256x1024: MKL 2.39 ms, oneDNN 1.08 ms), MKL elsewhere.
cpu_gemm: str = os.environ.get("MINDUCTOR_CPU_GEMM") or "auto"

# A fused row kernel keeps a pointwise value it stores and reads back within the row (softmax's
# exp) in a row-sized stack array instead of memory (codegen/cpp_rows.py).
row_scratch: bool = _env_bool("MINDUCTOR_ROW_SCRATCH", True)

# The flag names: every annotated module-level variable above.
FLAGS: frozenset[str] = frozenset(__annotations__)


@contextlib.contextmanager
def patch(**overrides: Any) -> Iterator[None]:
    """Temporarily set flags: ``with config.patch(debug=True): ...``."""
    module = sys.modules[__name__]
    for name in overrides:
        if name not in FLAGS:
            raise AttributeError(f"minductor.config has no flag {name!r}")
    saved = {name: getattr(module, name) for name in overrides}
    try:
        for name, value in overrides.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
