"""Peak memory of one call, eager or compiled, from the profiler's raw allocation events."""
from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minductor import config
from minductor.runtime.buffer_pool import held_bytes, live_pools


def peak_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Peak of live bytes allocated during one call, from the profiler's raw allocation and free
    events in time order (its per-op figures attribute frees to enclosing ops and double count)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def minductor_peak_bytes(fn: Callable[..., Any], args: Sequence[Any], pool: bool = True) -> int:
    """Peak bytes of a steady-state call: new allocations (profiler) plus what the graphs'
    buffer pools hold from the previous calls (reused without an allocation event)."""
    torch._dynamo.reset()
    gc.collect()
    earlier = {id(p) for p in live_pools()}
    with config.patch(reuse_buffers_across_calls=pool):
        compiled = torch.compile(fn, backend="minductor")
        compiled(*args)
        compiled(*args)
    held = held_bytes([p for p in live_pools() if id(p) not in earlier])
    return held + peak_bytes(compiled, *args)
