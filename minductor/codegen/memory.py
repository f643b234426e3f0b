"""Memory planning for the wrapper: allocate at first write, free at last use, and hand a
freed buffer to a later allocation of the same device, dtype and storage size
(``buf3 = buf1  # reuse``) instead of allocating: fresh large buffers cost page faults.

A freed buffer is kept for reuse only while a later allocation of its kind is still to
come and holding it until then keeps every step under the plan's peak (``_Timeline``).

Across calls, large CPU allocations take their storage from a slot of the graph's
``BufferPool`` (``mi_pool.take(slot, ...)``), which hands back last call's storage once nothing
holds it any more (runtime/buffer_pool.py) -- but only those whose storage can be held for the
whole call without raising the plan's peak (``_choose_pooled``): the pool saves page faults,
never memory at the peak.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

import sympy
import torch

from minductor import config, metrics
from minductor.codegen.common import py_index, py_shape
from minductor.ir.layout import FixedLayout
from minductor.ir.nodes import Buffer, ComputedBuffer, ExternKernelAlloc, ExternKernelOut, FallbackKernel, InputBuffer
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.fusion import inner_vars, reads_only_at
from minductor.scheduler.nodes import ExternSchedulerNode, FusedGroup
from minductor.virtualized import V

Key = tuple[str, torch.dtype, "int | sympy.Expr"]  # numel: symbolic under dynamic shapes


@dataclasses.dataclass
class UnitPlan:
    allocs: list[str]  # wrapper lines before the unit runs
    frees: list[str]   # wrapper lines after it


class PoolSlots:
    """Numbers the allocation sites that take their storage from the graph's ``BufferPool``."""

    def __init__(self, enabled: bool = True) -> None:
        self.count = 0
        self.enabled = enabled and config.reuse_buffers_across_calls

    def candidate_bytes(self, buf: Buffer) -> int:
        """Storage bytes of a buffer the pool could hold (CPU, large), else 0; of a symbolic
        size, its bytes at the size hints, and at least ``pool_min_bytes``: the pool decides
        at run time (``BufferPool.take``), so a graph compiled at a small hint (and served by
        the graph cache for every size) still keeps its large buffers across calls."""
        lay = buf.layout
        if not (self.enabled and lay.device.type == "cpu" and lay.offset == 0):
            return 0
        numel = lay.storage_numel()
        if not sympy.sympify(numel).is_number:
            return max(V.graph.sizevars.hint(numel) * lay.dtype.itemsize, config.pool_min_bytes)
        nbytes = int(numel) * lay.dtype.itemsize
        return nbytes if nbytes >= config.pool_min_bytes else 0

    def alloc_line(self, buf: Buffer) -> str:
        lay = buf.layout
        self.count += 1
        nbytes = py_index(sympy.expand(lay.storage_numel() * lay.dtype.itemsize))
        return f"{buf.name} = mi_pool.take({self.count - 1}, {py_shape(lay.size)}, {py_shape(lay.stride)}, {lay.dtype}, {nbytes})"


@dataclasses.dataclass
class _Site:
    """A fresh allocation of the plan: its storage lives from unit ``start`` to unit ``end``."""
    buf: Buffer
    start: int
    end: int
    nbytes: int  # 0 unless the pool could hold it (of a symbolic size: at the size hints)

    @property
    def symbolic(self) -> bool:
        return not self.buf.layout.storage_numel().is_Integer


def _choose_pooled(sites: list[_Site], n_units: int) -> set[int]:
    """Sites whose storage the pool keeps across calls, without raising the planned peak.

    A pooled storage is held for the whole call (and between calls); the others only while
    live. Largest first (the page faults saved grow with the size), a site is taken when the
    peak of the resulting timeline stays at the plan's own peak. A site of symbolic size only
    when it is live through the whole call anyway: which step peaks may change with the sizes."""
    sizes = [s.nbytes for s in sites]
    live = [0] * max(n_units, 1)
    for s in sites:
        for t in range(s.start, min(s.end, n_units - 1) + 1):
            live[t] += s.nbytes
    peak, held, chosen = max(live), 0, set()
    for i in sorted(range(len(sites)), key=lambda i: -sizes[i]):
        s = sites[i]
        if not s.nbytes or (s.symbolic and (s.start > 0 or s.end < n_units - 1)):
            continue
        without = [v - (s.nbytes if s.start <= t <= s.end else 0) for t, v in enumerate(live)]
        if held + s.nbytes + max(without) <= peak:
            held += s.nbytes
            live = without
            chosen.add(i)
    return chosen


def plan_written_over(graph: Any, units: list[Any], last_use: dict[str, int], outputs: set[str],
                      local: set[str] | frozenset[str] = frozenset()) -> dict[int, dict[str, str]]:
    """Kernel outputs stored over an input that dies in the same kernel (``in_out_ptr``), by
    unit: {output: dying input}. The output then takes the input's storage: no allocation,
    and the data stays in cache (an epilogue over a matmul result, softmax, a residual add).

    Legal when the input is a buffer of ours (not a graph input, constant or output, not
    aliased by a fallback's view), its last use is this kernel, it has the output's device,
    dtype and storage size, and every read of it in the kernel is at exactly the element the
    output's store writes in the same iteration of the shared loops, by a node that runs no
    later than the storing one (an earlier loop block of the same outer iteration, or the
    same block before the store)."""
    candidates = _overwritable(graph, units, outputs, local)
    planned: dict[int, dict[str, str]] = {}
    for i, unit in enumerate(units):
        if not isinstance(unit, FusedGroup) or unit.has_mutation() or unit.has_scan():
            continue
        # inputs dying here, and values this kernel stores and reads back itself (the exp of a
        # softmax, read by its sum and its division: the division's output takes its storage)
        dying = sorted(n for n in unit.read_names() | set(unit.names()) if last_use.get(n) == i and n in candidates)
        taken: set[str] = set()
        for pos, writer in enumerate(unit.nodes):
            out = writer.node.name
            if writer.is_reduction() or out in local or out in taken or _key(writer.node.layout) is None:
                continue
            for name in dying:
                if name != out and _key(candidates[name].layout) == _key(writer.node.layout) \
                        and _reads_only_where_written(unit, pos, name, len(unit.outer)) \
                        and _stored_where_written(unit, pos, name, len(unit.outer)):
                    planned.setdefault(i, {})[out] = name
                    dying.remove(name)
                    taken |= {name, out}
                    break
    return planned


def _overwritable(graph: Any, units: list[Any], outputs: set[str], local: set[str] | frozenset[str]) -> dict[str, Buffer]:
    """Buffers whose storage is ours to write over once they die: kernel outputs, extern
    ``.out`` results, allocating externs (convolution) and a backward's donated inputs; never
    other graph inputs, constants or outputs, nor storages a fallback's view may alias."""
    found: dict[str, Buffer] = {}
    for unit in units:
        bufs = allocated_buffers(unit)
        if isinstance(unit, ExternSchedulerNode) and isinstance(unit.node, ExternKernelAlloc):
            bufs = [unit.node]
        found |= {b.name: b for b in bufs if b.layout is not None and b.layout.offset == 0}
    donated = _donated(graph)
    found |= donated
    blocked = outputs | set(graph.constants) | (set(graph.graph_inputs) - set(donated)) | set(local) \
        | _no_reuse(graph, units)
    return {name: buf for name, buf in found.items() if name not in blocked}


def _donated(graph: Any) -> dict[str, Buffer]:
    """A backward's donated inputs (``graph.donated_inputs``): saved tensors nothing else holds
    once the backward has read them, written over and reused like our own buffers."""
    return {name: graph.graph_inputs[name] for name in sorted(getattr(graph, "donated_inputs", ()))
            if name in graph.graph_inputs and graph.graph_inputs[name].layout.offset == 0}


def _reads_only_where_written(group: FusedGroup, writer_pos: int, name: str, n_outer: int) -> bool:
    writer = group.nodes[writer_pos]
    writes = [d for d in writer.read_writes.writes if d.name == writer.node.name]
    if len(writes) != 1 or not isinstance(writes[0], MemoryDep):
        return False
    return reads_only_at(group, name, writes[0].index, inner_vars(writer, n_outer), n_outer, range(writer_pos + 1))


def _stored_where_written(group: FusedGroup, writer_pos: int, name: str, n_outer: int) -> bool:
    """A value this kernel stores itself must be stored by an earlier pointwise node, at the
    element the writer stores (so it is read back before the writer overwrites it)."""
    stores = [(pos, d) for pos, n in enumerate(group.nodes) for d in n.read_writes.writes if d.name == name]
    if not stores:
        return True  # an input from outside the kernel
    if any(group.nodes[pos].is_reduction() for pos, _ in stores):
        return False  # a reduction result the kernel may keep in a local, never allocated
    writer = group.nodes[writer_pos]
    target = next(d for d in writer.read_writes.writes if d.name == writer.node.name).index
    for pos, dep in stores:
        if pos >= writer_pos or not isinstance(dep, MemoryDep):
            return False
        inner, writer_inner = inner_vars(group.nodes[pos], n_outer), inner_vars(writer, n_outer)
        if [size for _, size in inner] != [size for _, size in writer_inner]:
            return False
        if sympy.expand(dep.index.xreplace({v: w for (v, _), (w, _) in zip(inner, writer_inner)}) - target) != 0:
            return False
    return True


def _key(layout: FixedLayout) -> Key | None:
    """Device, dtype and storage numel, symbolic or not: equal keys have equal storage sizes at
    every size, so one buffer's storage may serve the other."""
    numel = layout.storage_numel()
    if numel.is_Integer:
        return None if numel == 0 else (str(layout.device), layout.dtype, int(numel))
    return (str(layout.device), layout.dtype, sympy.expand(numel))


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


class _Timeline:
    """Bytes of the buffers we allocate, live during each unit when each is allocated at its
    first write and freed after its last use: holding a freed buffer for a later reuse is
    allowed only while it keeps every unit at or under this plan's peak.

    Under dynamic shapes the bytes are polynomials in the size symbols, and which unit peaks
    may change with the sizes: a hold is then allowed only where some unit's live bytes
    provably cover it at every size (``_covers``)."""

    def __init__(self, allocs_by_unit: list[list[Buffer]], last_use: dict[str, int], keep: set[str]) -> None:
        n = len(allocs_by_unit)
        self.live: list[Any] = [0] * n
        for i, bufs in enumerate(allocs_by_unit):
            for b in bufs:
                key = _key(b.layout)
                end = n - 1 if b.name in keep else min(last_use.get(b.name, i), n - 1)
                for t in range(i, end + 1):
                    self.live[t] += _nbytes(key)
        self.symbolic = not all(isinstance(v, int) for v in self.live)
        self.peak = 0 if self.symbolic else max(self.live, default=0)
        self.hints = [V.graph.sizevars.hint(v) for v in self.live] if self.symbolic else self.live
        self.alloc_units: dict[Key, list[int]] = collections.defaultdict(list)
        for i, bufs in enumerate(allocs_by_unit):
            for b in bufs:
                key = _key(b.layout)
                if key is not None:
                    self.alloc_units[key].append(i)

    def try_hold(self, key: Key, freed_after: int, waiting: int) -> bool:
        """Hold a buffer freed after unit ``freed_after`` until the allocation of ``key`` it
        will serve (``waiting`` other held buffers of its key are served first)."""
        later = [u for u in self.alloc_units[key] if u > freed_after]
        if len(later) <= waiting:
            return False
        span = range(freed_after + 1, later[waiting])
        nbytes = _nbytes(key)
        if self.symbolic:
            # the units that peak at the size hints: the likeliest to cover the hold
            tops = sorted(range(len(self.live)), key=lambda u: -self.hints[u])[:3]
            if not all(any(_covers(self.live[u], self.live[t] + nbytes) for u in tops) for t in span):
                return False
            for t in span:
                self.hints[t] += V.graph.sizevars.hint(nbytes)
        elif any(self.live[t] + nbytes > self.peak for t in span):
            return False
        for t in span:
            self.live[t] += nbytes
        return True


def _covers(big: Any, small: Any) -> bool:
    """``big >= small`` at every size: their difference, expanded, has no negative coefficient
    (sizes are positive; a conservative test)."""
    return all(c >= 0 for c in sympy.expand(sympy.sympify(big - small)).as_coefficients_dict().values())


def _nbytes(key: Key | None) -> Any:  # an int, or a polynomial in the size symbols
    return 0 if key is None else key[2] * key[1].itemsize


def plan_memory(graph: Any, units: list[Any], last_use: dict[str, int], outputs: set[str],
                slots: PoolSlots | None = None, local: set[str] | frozenset[str] = frozenset(),
                written_over: dict[int, dict[str, str]] | None = None) -> list[UnitPlan]:
    """``local``: buffers kernels keep in locals (never allocated, never freed).
    ``written_over``: by unit, outputs that take the storage of an input dying there
    (``plan_written_over``): ``buf5 = buf3; del buf3  # reuse in place``, and no free."""
    slots = slots or PoolSlots()
    written_over = written_over or {}
    allocs_by_unit = [[b for b in allocated_buffers(u) if b.name not in local] for u in units]
    last_use = {name: i for name, i in last_use.items() if name not in local}
    ours = {b.name: b for bufs in allocs_by_unit for b in bufs}
    donated = {name: buf for name, buf in _donated(graph).items() if name not in outputs}
    no_reuse = _no_reuse(graph, units)
    upcoming: collections.Counter[Key] = collections.Counter()
    for bufs in allocs_by_unit:
        for b in bufs:
            key = _key(b.layout)
            if key is not None:
                upcoming[key] += 1
    timeline = _Timeline(allocs_by_unit, last_use, outputs | set(graph.constants))
    pool: dict[Key, list[str]] = collections.defaultdict(list)
    frees_at: dict[int, list[str]] = collections.defaultdict(list)
    for name, i in last_use.items():
        if name not in outputs and name not in graph.constants:
            frees_at[i].append(name)
    allocs_of: list[list[str | _Site]] = []
    frees_of: list[list[str]] = []
    sites: list[_Site] = []
    site_of: dict[str, _Site] = {}  # buffer name -> the allocation whose storage it uses
    for i, bufs in enumerate(allocs_by_unit):
        allocs: list[str | _Site] = []
        over = written_over.get(i, {})
        for b in bufs:
            key = _key(b.layout)
            if key is not None:
                upcoming[key] -= 1
            if b.name in over:
                old = over[b.name]
                allocs.append(_reuse_line(b, old, {old: graph.get_buffer(old)}, "reuse in place"))
                if old in site_of:
                    site_of[b.name] = site_of[old]
                metrics.buffers_reused += 1
            elif key is not None and pool[key]:
                old = pool[key].pop()
                allocs.append(_reuse_line(b, old, ours | {old: graph.get_buffer(old)}))
                if old in site_of:  # storage aten allocated (a convolution's output) has no site
                    site_of[b.name] = site_of[old]
                metrics.buffers_reused += 1
            else:
                site = _Site(b, i, len(units), slots.candidate_bytes(b))
                sites.append(site)
                site_of[b.name] = site
                allocs.append(site)
                metrics.buffers_allocated += 1
        frees = []
        for name in sorted(set(frees_at.get(i, [])) - set(over.values())):
            buf = ours.get(name) or donated.get(name)
            key = _key(buf.layout) if buf is not None else None
            if key is not None and name not in no_reuse and isinstance(buf, (ComputedBuffer, ExternKernelOut, InputBuffer)) \
                    and len(pool[key]) < upcoming[key] and timeline.try_hold(key, i, len(pool[key])):
                pool[key].append(name)
            else:
                frees.append(name)
                if name in site_of:
                    site_of[name].end = i
        allocs_of.append(allocs)
        frees_of.append(frees)
    pooled = {id(sites[i]) for i in _choose_pooled(sites, len(units))}

    def line(a: str | _Site) -> str:
        if isinstance(a, str):
            return a
        return slots.alloc_line(a.buf) if id(a) in pooled else _alloc_line(a.buf)

    return [UnitPlan([line(a) for a in allocs], [f"del {', '.join(frees)}"] if frees else [])
            for allocs, frees in zip(allocs_of, frees_of)]


def _alloc_line(buf: Buffer) -> str:
    """A fresh allocation; a large CPU one (or one of symbolic size: decided per call) on huge
    pages (``runtime/huge_pages.py``)."""
    lay = buf.layout
    nbytes = sympy.expand(lay.storage_numel() * lay.dtype.itemsize)
    if lay.device.type == "cpu" and config.huge_page_min_bytes > 0 and \
            (not nbytes.is_number or int(nbytes) >= config.huge_page_min_bytes):
        return f"{buf.name} = empty_huge({py_shape(lay.size)}, {py_shape(lay.stride)}, {lay.dtype}, {py_index(nbytes)})"
    # (the device as an object: parsing 'cpu' cost 5 of 20 us an allocation with cold caches)
    device = "mi_cpu" if lay.device == torch.device("cpu") else repr(str(lay.device))
    return f"{buf.name} = empty_strided({py_shape(lay.size)}, {py_shape(lay.stride)}, device={device}, dtype={lay.dtype})"


def _reuse_line(buf: Buffer, old: str, ours: dict[str, Buffer], comment: str = "reuse") -> str:
    lay, old_lay = buf.layout, ours[old].layout
    if tuple(lay.size) == tuple(old_lay.size) and tuple(lay.stride) == tuple(old_lay.stride) and lay.offset == 0:
        return f"{buf.name} = {old}; del {old}  # {comment}"
    return f"{buf.name} = reinterpret_tensor({old}, {py_shape(lay.size)}, {py_shape(lay.stride)}, 0); del {old}  # {comment}"
