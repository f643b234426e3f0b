"""IR verifier: structural invariants checked after lowering and after scheduling.

Cheap (linear in the graph), so compile_graph always runs it: a violation is a compiler
bug, reported with the offending node before any code is generated from it.
"""
from __future__ import annotations

from typing import Any

from minductor.ir.layout import FixedLayout
from minductor.ir.nodes import ComputedBuffer, ExternKernel, MultiOutput


class IRVerificationError(AssertionError):
    """An invariant of the IR does not hold (a minductor bug)."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise IRVerificationError(f"minductor IR verification failed: {message}")


def verify_graph(graph: Any) -> None:
    """After lowering: names are unique, layouts are consistent, reads precede writes."""
    known = set(graph.graph_inputs)
    for buf in graph.buffers:
        _check(buf.name not in known, f"buffer name {buf.name} defined twice")
        layout = buf.layout
        if layout is not None:
            _check(isinstance(layout, FixedLayout), f"{buf.name} has no layout")
            _check(len(layout.size) == len(layout.stride), f"{buf.name}: size {layout.size} vs stride {layout.stride}")
        if isinstance(buf, ComputedBuffer) and buf.mutates is not None:
            _check(buf.mutates in known, f"{buf.name} mutates {buf.mutates}, which is not defined before it")
        if isinstance(buf, (ExternKernel, MultiOutput)):
            for name in buf.get_read_names():
                _check(name in known, f"{buf.name} reads {name} before it is defined")
        known.add(buf.name)


def verify_schedule(scheduler: Any) -> None:
    """After fusion: every unit runs after the units it depends on; reads are of buffers
    that exist by then; a fused group's nodes agree on its outer loops."""
    from minductor.scheduler.nodes import FusedGroup

    position: dict[str, int] = {}
    for i, unit in enumerate(scheduler.units):
        nodes = unit.nodes if isinstance(unit, FusedGroup) else [unit]
        for node in nodes:
            position[node.get_name()] = i
    available = set(scheduler.graph.graph_inputs)
    for i, unit in enumerate(scheduler.units):
        for dep in unit.dep_names():
            _check(position.get(dep, -1) < i, f"unit {i} ({unit!r}) runs before its dependency {dep}")
        if isinstance(unit, FusedGroup):
            n_outer = len(unit.outer)
            for node in unit.nodes:
                _check(node.pw_ranges[:n_outer] == list(unit.outer), f"{node!r} does not share outer loops {unit.outer}")
        missing = unit.read_names() - available - unit.write_names()
        _check(not missing, f"unit {i} ({unit!r}) reads {sorted(missing)} before they are written")
        available |= unit.write_names()
        available |= {n.get_name() for n in (unit.nodes if isinstance(unit, FusedGroup) else [unit])}
