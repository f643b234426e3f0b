"""Memory planning for the wrapper: allocate at first write, free at last use, and hand a
freed buffer to a later allocation of the same device, dtype and storage size
(``buf3 = buf1  # reuse``) instead of allocating: fresh large buffers cost page faults.

A freed buffer is kept for reuse only while a later allocation of its kind is still to
come, so holding it never outlasts the moment eager would have allocated anew.

Across calls, each remaining large CPU allocation takes its storage from a slot of the
graph's ``BufferPool`` (``mi_pool.take(slot, ...)``), which hands back last call's storage
once nothing holds it any more (runtime/buffer_pool.py).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch

from minductor import config, metrics
from minductor.codegen.common import py_index
from minductor.ir.layout import FixedLayout
from minductor.ir.nodes import Buffer, ComputedBuffer, ExternKernelOut, FallbackKernel
from minductor.scheduler.nodes import ExternSchedulerNode, FusedGroup

Key = tuple[str, torch.dtype, int]


@dataclasses.dataclass
class UnitPlan:
    allocs: list[str]  # wrapper lines before the unit runs
    frees: list[str]   # wrapper lines after it


class PoolSlots:
    """Numbers the allocation sites that take their storage from the graph's ``BufferPool``."""

    def __init__(self) -> None:
        self.count = 0

    def alloc_line(self, buf: Buffer) -> str:
        lay = buf.layout
        numel = lay.storage_numel()
        nbytes = int(numel) * lay.dtype.itemsize if numel.is_Integer else 0
        static = all(sympy_int(e) for e in (*lay.size, *lay.stride, lay.offset))
        if not (config.reuse_buffers_across_calls and static and lay.device.type == "cpu"
                and nbytes >= config.pool_min_bytes and lay.offset == 0):
            return _alloc_line(buf)
        self.count += 1
        return f"{buf.name} = mi_pool.take({self.count - 1}, {_shape(lay.size)}, {_shape(lay.stride)}, {lay.dtype}, {nbytes})"


def sympy_int(expr: Any) -> bool:
    return getattr(expr, "is_Integer", isinstance(expr, int))


def _shape(values: Any) -> str:
    items = [py_index(v) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _key(layout: FixedLayout) -> Key | None:
    numel = layout.storage_numel()
    if not numel.is_Integer or int(numel) == 0:
        return None
    return (str(layout.device), layout.dtype, int(numel))


def allocated_buffers(unit: Any) -> list[Buffer]:
    """Buffers the wrapper allocates before ``unit`` runs."""
    if isinstance(unit, FusedGroup):
        return [n.node for n in unit.nodes if not n.node.mutates]
    if isinstance(unit, ExternSchedulerNode) and isinstance(unit.node, ExternKernelOut):
        return [unit.node]
    return []


def _no_reuse(graph: Any, units: list[Any]) -> set[str]:
    """Storages a fallback's output may alias (a view op we do not lower): never recycled."""
    from minductor.ir.nodes import storage_name

    out: set[str] = set()
    for unit in units:
        node = getattr(unit, "node", None)
        if isinstance(node, FallbackKernel) and _returns_alias(node.op):
            out |= {storage_name(n) for n in node.input_nodes()}
    return out


def _returns_alias(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def plan_memory(graph: Any, units: list[Any], last_use: dict[str, int], outputs: set[str],
                slots: PoolSlots | None = None) -> list[UnitPlan]:
    slots = slots or PoolSlots()
    allocs_by_unit = [allocated_buffers(u) for u in units]
    ours = {b.name: b for bufs in allocs_by_unit for b in bufs}
    no_reuse = _no_reuse(graph, units)
    upcoming: collections.Counter[Key] = collections.Counter()
    for bufs in allocs_by_unit:
        for b in bufs:
            key = _key(b.layout)
            if key is not None:
                upcoming[key] += 1
    pool: dict[Key, list[str]] = collections.defaultdict(list)
    frees_at: dict[int, list[str]] = collections.defaultdict(list)
    for name, i in last_use.items():
        if name not in outputs and name not in graph.constants:
            frees_at[i].append(name)
    plans = []
    for i, bufs in enumerate(allocs_by_unit):
        allocs = []
        for b in bufs:
            key = _key(b.layout)
            if key is not None:
                upcoming[key] -= 1
            if key is not None and pool[key]:
                allocs.append(_reuse_line(b, pool[key].pop(), ours))
                metrics.buffers_reused += 1
            else:
                allocs.append(slots.alloc_line(b))
                metrics.buffers_allocated += 1
        frees = []
        for name in sorted(frees_at.get(i, [])):
            buf = ours.get(name)
            key = _key(buf.layout) if buf is not None else None
            if key is not None and name not in no_reuse and isinstance(buf, (ComputedBuffer, ExternKernelOut)) \
                    and len(pool[key]) < upcoming[key]:
                pool[key].append(name)
            else:
                frees.append(name)
        plans.append(UnitPlan(allocs, [f"del {', '.join(frees)}"] if frees else []))
    return plans


def _alloc_line(buf: Buffer) -> str:
    lay = buf.layout
    return (
        f"{buf.name} = empty_strided({_shape(lay.size)}, {_shape(lay.stride)}, "
        f"device={str(lay.device)!r}, dtype={lay.dtype})"
    )


def _reuse_line(buf: Buffer, old: str, ours: dict[str, Buffer]) -> str:
    lay, old_lay = buf.layout, ours[old].layout
    if tuple(lay.size) == tuple(old_lay.size) and tuple(lay.stride) == tuple(old_lay.stride) and lay.offset == 0:
        return f"{buf.name} = {old}; del {old}  # reuse"
    return f"{buf.name} = reinterpret_tensor({old}, {_shape(lay.size)}, {_shape(lay.stride)}, 0); del {old}  # reuse"
