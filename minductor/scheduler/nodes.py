"""Scheduler nodes: one per buffer-producing IR node, grouped into kernels by fusion."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import sympy

from minductor.ir.indexing import make_vars
from minductor.ir.nodes import Buffer, ComputedBuffer, ExternKernel, MultiOutput
from minductor.scheduler.deps import ReadWrites, StarDep, extract_read_writes

Expr = sympy.Expr

# below this many element-iterations a kernel runs on one thread (the C++ code generator's
# rule; fusion keeps loop nests this big apart when they would share no outer loop)
PARALLEL_THRESHOLD = 32768


class BaseSchedulerNode:
    """A unit the wrapper calls: a generated kernel group or an extern call."""

    order: int
    node: Buffer
    deps: set[str]  # scheduler nodes that must run first (set by Scheduler.compute_dependencies)

    def get_name(self) -> str:
        return self.node.name

    def read_names(self) -> set[str]:
        raise NotImplementedError

    def write_names(self) -> set[str]:
        return {self.node.name}

    def is_kernel(self) -> bool:
        return False


class SchedulerNode(BaseSchedulerNode):
    """A ComputedBuffer with its canonical loop ranges (size-1 dims dropped)."""

    def __init__(self, node: ComputedBuffer, order: int) -> None:
        self.node = node
        self.order = order
        ranges, rranges = node.get_ranges()
        self.full_ranges, self.full_rranges = ranges, rranges
        self.pw_dims = [i for i, s in enumerate(ranges) if s != 1]
        self.red_dims = [i for i, s in enumerate(rranges) if s != 1]
        self.pw_ranges: list[Expr] = [ranges[i] for i in self.pw_dims]
        self.red_ranges: list[Expr] = [rranges[i] for i in self.red_dims]
        xs = make_vars("x", len(self.pw_ranges))
        rs = make_vars("r", len(self.red_ranges))
        var_ranges = dict(zip(xs, self.pw_ranges)) | dict(zip(rs, self.red_ranges))
        self.read_writes: ReadWrites = extract_read_writes(self.run, var_ranges, xs, rs)

    def is_kernel(self) -> bool:
        return True

    def is_reduction(self) -> bool:
        return self.node.is_reduction()

    def is_scan(self) -> bool:
        return self.node.is_scan()

    def run(self, index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        """Run the body with canonical (size-1-free) indices under the current handler."""
        full = [sympy.Integer(0)] * len(self.full_ranges)
        for pos, v in zip(self.pw_dims, index):
            full[pos] = v
        rfull = [sympy.Integer(0)] * len(self.full_rranges)
        for pos, v in zip(self.red_dims, rindex):
            rfull[pos] = v
        return self.node.store_body(full, rfull)

    def read_names(self) -> set[str]:
        names = self.read_writes.read_names()
        return names | {self.node.mutates} if self.node.mutates else names

    def write_names(self) -> set[str]:
        return {self.node.store_name()}

    def __repr__(self) -> str:
        return f"SchedulerNode({self.node.name}, {self.pw_ranges}x{self.red_ranges})"


class ExternSchedulerNode(BaseSchedulerNode):
    """An aten call from the wrapper (extern out, fallback, multi-output pick)."""

    def __init__(self, node: ExternKernel | MultiOutput, order: int) -> None:
        self.node = node
        self.order = order
        self.reads = {StarDep(n) for n in node.get_read_names()}

    def read_names(self) -> set[str]:
        return {d.name for d in self.reads}

    def dep_names(self) -> set[str]:
        return self.deps

    def has_side_effects(self) -> bool:
        from minductor.ir.nodes import FallbackKernel

        return isinstance(self.node, FallbackKernel)

    def __repr__(self) -> str:
        return f"ExternSchedulerNode({self.node.name}, {type(self.node).__name__})"


@dataclasses.dataclass(eq=False)
class FusedGroup:
    """Scheduler nodes that become one kernel; ``outer`` are the loops they all share."""

    nodes: list[SchedulerNode]
    outer: list[Expr]

    @functools.cached_property
    def order(self) -> int:
        return min(n.order for n in self.nodes)

    def names(self) -> list[str]:
        return [n.node.name for n in self.nodes]

    # (a group's nodes never change: fusing makes a new group. Its name sets are computed once;
    # fusion asks for them for every candidate pair of every round)

    def write_names(self) -> set[str]:
        return set(self._writes)

    def read_names(self) -> set[str]:
        return set(self._reads)

    def dep_names(self) -> set[str]:
        return set(self._deps)

    @functools.cached_property
    def _writes(self) -> frozenset[str]:
        return frozenset().union(*(n.write_names() for n in self.nodes))

    @functools.cached_property
    def _reads(self) -> frozenset[str]:
        own = {n.node.name for n in self.nodes if not n.node.mutates}
        return frozenset().union(*(n.read_names() for n in self.nodes)) - own

    @functools.cached_property
    def _deps(self) -> frozenset[str]:
        return frozenset().union(*(n.deps for n in self.nodes)) - {n.node.name for n in self.nodes}

    def has_mutation(self) -> bool:
        return any(n.node.mutates for n in self.nodes)

    def has_reduction(self) -> bool:
        return any(n.is_reduction() for n in self.nodes)

    def has_scan(self) -> bool:
        return any(n.is_scan() for n in self.nodes)

    def __repr__(self) -> str:
        return f"FusedGroup({self.names()}, outer={self.outer})"


def group_outer(node: SchedulerNode) -> list[Expr]:
    """Loops a node shares with others in its kernel: its non-reduction ranges."""
    return list(node.pw_ranges)
