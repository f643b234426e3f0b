"""Large CPU buffers of one compiled graph, kept across calls.

A fresh large CPU allocation is an ``mmap`` whose pages fault (and are zeroed by the kernel)
on first write: writing 64 MB into a fresh buffer costs ~25 ms on a 2-core machine, four
times the write itself. The wrapper therefore takes each large buffer from a slot of the
graph's ``BufferPool``: when the storage the slot handed out last time is no longer held by
anyone (its use count is the pool's own reference), the next call gets a new tensor on the
same storage; otherwise a fresh buffer is allocated and remembered instead.

A graph output is thus still a tensor nobody else can observe: its storage is reused only
after every tensor on it has died. Each slot keeps at most ``KEEP`` storages, so in a loop
``y = f(x)`` (the previous ``y`` alive during the call) two storages alternate. The cost is
memory held between calls (at most ``KEEP`` buffers per slot, only buffers of at least
``config.pool_min_bytes``); ``config.reuse_buffers_across_calls = False`` turns it off.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import torch

from minductor import config
from minductor.runtime.huge_pages import CPU, empty_huge

_use_count = torch._C._storage_Use_Count
KEEP = 2


class BufferPool:
    """Per-graph slots of reusable storages, one slot per allocation site of the wrapper."""

    def __init__(self, slots: int) -> None:
        self.slots: list[list[torch.UntypedStorage]] = [[] for _ in range(slots)]
        self.lock = threading.Lock()
        _pools.add(self)

    def take(self, slot: int, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
        """A tensor of ``size``/``stride`` on a storage nobody else holds (uninitialized); below
        ``config.pool_min_bytes`` (a symbolic size, small this call), a fresh one, not kept."""
        if nbytes < config.pool_min_bytes:
            return torch.empty_strided(size, stride, dtype=dtype, device=CPU)
        with self.lock:
            kept = self.slots[slot]
            for storage in kept:
                # 1: only the pool holds it; the size check catches a storage resized by its user
                if _use_count(storage._cdata) == 1 and storage.nbytes() == nbytes:
                    return torch.empty(0, dtype=dtype, device=CPU).set_(storage, 0, size, stride)
            tensor = empty_huge(size, stride, dtype, nbytes)
            if len(kept) >= KEEP:
                kept.pop(0)
            kept.append(tensor.untyped_storage())
            return tensor

    def clear(self) -> None:
        with self.lock:
            for kept in self.slots:
                kept.clear()


_pools: weakref.WeakSet[BufferPool] = weakref.WeakSet()


def live_pools() -> list[BufferPool]:
    return list(_pools)


def held_bytes(pools: Sequence[BufferPool] | None = None) -> int:
    """Bytes of the storages the given (default: all live) pools keep, each storage once: memory
    graphs hold between calls, which an allocation profiler does not see when a call reuses it."""
    seen: dict[int, int] = {}
    for pool in live_pools() if pools is None else pools:
        with pool.lock:
            for kept in pool.slots:
                for storage in kept:
                    seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
