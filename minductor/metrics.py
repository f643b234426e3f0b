"""Process-wide counters, for tests and reports. ``reset()`` clears them in place."""

from __future__ import annotations

from collections import Counter

# Graphs that went through the whole pipeline (aten fallbacks for whole graphs not counted).
graphs_compiled: int = 0
# Kernels generated (all backends).
generated_kernel_count: int = 0
# Kernels generated per backend: "cpp", "triton", "xla".
kernels_by_backend: Counter[str] = Counter()
# aten ops that ran as FallbackKernel, by name.
fallback_ops: Counter[str] = Counter()
# Compiled graphs loaded from the graph cache (their other counters are added as if compiled).
graph_cache_hits: int = 0
# Kernel compiles served from / missing in the on-disk cache.
cache_hits: int = 0
cache_misses: int = 0
# Buffers the generated wrappers allocate, and allocations served by a freed buffer instead.
buffers_allocated: int = 0
buffers_reused: int = 0
# Inference graphs handed to Dynamo without AOTAutograd's runtime wrapper (direct_call.py).
direct_graphs: int = 0
# Graphs that ran through aten after an internal error compiling them (config.strict off).
internal_errors: int = 0


def reset() -> None:
    """Zero every counter; Counter objects are cleared in place so references stay valid."""
    global graphs_compiled, generated_kernel_count, cache_hits, cache_misses, buffers_allocated, buffers_reused
    global graph_cache_hits, direct_graphs, internal_errors
    graphs_compiled = 0
    internal_errors = 0
    direct_graphs = 0
    graph_cache_hits = 0
    generated_kernel_count = 0
    cache_hits = 0
    cache_misses = 0
    buffers_allocated = 0
    buffers_reused = 0
    kernels_by_backend.clear()
    fallback_ops.clear()
