"""The scheduler: dependencies, dead-node elimination, fusion, order and last use.

Each pass is a named method; ``Scheduler.__init__`` runs the ones that must always run
and ``fuse_nodes`` runs fusion, so the pipeline can dump the IR before and after it.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import networkx as nx
import sympy

from minductor.ir.nodes import ComputedBuffer, ExternKernel, MultiOutput
from minductor.scheduler.deps import MemoryDep, StarDep
from minductor.scheduler.fusion import can_fuse, fused_outer, score_fusion
from minductor.scheduler.nodes import BaseSchedulerNode, ExternSchedulerNode, FusedGroup, SchedulerNode, group_outer

FUSION_ROUNDS = 10

Unit = FusedGroup | ExternSchedulerNode


class Scheduler:
    def __init__(self, graph) -> None:
        self.graph = graph
        self.nodes: list[BaseSchedulerNode] = self.create_nodes()
        self.compute_dependencies()
        self.eliminate_dead_nodes()
        self.units: list[Unit] = [
            FusedGroup([n], group_outer(n)) if isinstance(n, SchedulerNode) else n for n in self.nodes
        ]
        self.topological_sort()
        self.last_use: dict[str, int] = {}
        self.compute_last_usage()

    # -- passes --------------------------------------------------------------------------

    def create_nodes(self) -> list[BaseSchedulerNode]:
        out: list[BaseSchedulerNode] = []
        for i, buf in enumerate(self.graph.buffers):
            if isinstance(buf, ComputedBuffer):
                out.append(SchedulerNode(buf, i))
            elif isinstance(buf, (ExternKernel, MultiOutput)):
                out.append(ExternSchedulerNode(buf, i))
            else:
                raise TypeError(f"cannot schedule {buf}")
        return out

    def compute_dependencies(self) -> None:
        """Order constraints between nodes, in creation (program) order: read-after-write,
        and for a node that writes into another buffer (a mutation) also write-after-write
        and write-after-read on that buffer, so later readers see the mutated value."""
        last_writer: dict[str, str] = {}
        readers: dict[str, set[str]] = {}
        for node in self.nodes:
            node.deps = {last_writer[r] for r in node.read_names() if r in last_writer}
            target = getattr(node.node, "mutates", None)
            if target is not None:
                node.deps |= readers.get(target, set()) - {node.get_name()}
            for r in node.read_names():
                readers.setdefault(r, set()).add(node.get_name())
            written = target or node.get_name()
            last_writer[written] = node.get_name()
            if target is not None:
                readers[target] = set()

    def output_names(self) -> set[str]:
        from minductor.ir.nodes import IRNode, storage_name

        return {storage_name(o) for o in self.graph.graph_outputs if isinstance(o, IRNode)}

    def eliminate_dead_nodes(self) -> None:
        """Drop kernels whose results nobody reads (fallbacks stay: they may have effects), and
        stores into a buffer of ours that nobody reads afterwards (a scatter or a cat slice)."""
        live = self.output_names()
        kept: list[BaseSchedulerNode] = []
        for node in reversed(self.nodes):
            target = getattr(node.node, "mutates", None)
            side_effects = (isinstance(node, ExternSchedulerNode) and node.has_side_effects()) or bool(
                target and (target in live or target in self.graph.graph_inputs)
            )
            if node.get_name() in live or side_effects:
                kept.append(node)
                live |= node.read_names()
            elif isinstance(node, ExternSchedulerNode) and isinstance(node.node, MultiOutput):
                continue
        self.nodes = list(reversed(kept))

    def dependency_graph(self) -> nx.DiGraph:
        unit_of = {}
        for i, unit in enumerate(self.units):
            for node in unit.nodes if isinstance(unit, FusedGroup) else [unit]:
                unit_of[node.get_name()] = i
        g = nx.DiGraph()
        g.add_nodes_from(range(len(self.units)))
        for i, unit in enumerate(self.units):
            for dep in unit.dep_names():
                if dep in unit_of and unit_of[dep] != i:
                    g.add_edge(unit_of[dep], i)
        return g

    def topological_sort(self) -> None:
        g = self.dependency_graph()
        order = list(nx.lexicographical_topological_sort(g, key=lambda i: self.units[i].order))
        self.units = [self.units[i] for i in order]

    def fuse_nodes(self) -> None:
        """Greedy fusion by score, repeated until nothing more fuses."""
        for _ in range(FUSION_ROUNDS):
            if not self._fuse_round():
                break
        self.topological_sort()
        self.compute_last_usage()

    def _fuse_round(self) -> bool:
        groups = [u for u in self.units if isinstance(u, FusedGroup)]
        if len(groups) < 2:
            return False
        sizes = self._buffer_bytes()
        by_buffer: dict[str, list[FusedGroup]] = {}
        for g in groups:
            for name in g.read_names() | g.write_names():
                by_buffer.setdefault(name, []).append(g)
        pairs = {(id(a), id(b)): (a, b) for users in by_buffer.values() for a, b in itertools.combinations(users, 2)}
        ranked = sorted(pairs.values(), key=lambda p: score_fusion(p[0], p[1], sizes), reverse=True)
        # One dependency graph for the round, its nodes contracted as groups fuse (rebuilding it
        # and re-sorting the units after each fusion made scheduling quadratic: RWKV's unrolled
        # time loop, 4065 nodes, took 35 s to schedule). The units are sorted once, at the end.
        graph = self.dependency_graph()
        key = {id(u): i for i, u in enumerate(self.units)}
        units: dict[int, Unit] = dict(enumerate(self.units))
        fresh = itertools.count(len(self.units))
        fused = False
        for a, b in ranked:
            if id(a) not in key or id(b) not in key:
                continue
            merged = self._try_fuse(a, b, graph, key, fresh)
            if merged is not None:
                k = key[id(merged)]
                del units[key.pop(id(a))], units[key.pop(id(b))]
                units[k] = merged
                fused = True
        if fused:
            self.units = list(units.values())
            self.topological_sort()
        return fused

    def _try_fuse(self, a: FusedGroup, b: FusedGroup, graph: nx.DiGraph, key: dict[int, int],
                  fresh: Iterator[int]) -> FusedGroup | None:
        """Fuse ``a`` and ``b`` if legal; ``graph`` (units keyed by ``key[id(unit)]``) then
        holds the fused group in their place, under a key drawn from ``fresh``."""
        ia, ib = key[id(a)], key[id(b)]
        if nx.has_path(graph, ib, ia):
            a, b, ia, ib = b, a, ib, ia
        between = any(nx.has_path(graph, s, ib) for s in graph.successors(ia) if s != ib)
        if not can_fuse(a, b, between):
            return None
        outer = fused_outer(a, b)
        assert outer is not None
        merged = FusedGroup(sorted(a.nodes + b.nodes, key=lambda n: n.order), outer)
        im = next(fresh)
        graph.add_node(im)
        graph.add_edges_from((p, im) for p in itertools.chain(graph.predecessors(ia), graph.predecessors(ib)) if p not in (ia, ib))
        graph.add_edges_from((im, s) for s in itertools.chain(graph.successors(ia), graph.successors(ib)) if s not in (ia, ib))
        graph.remove_nodes_from((ia, ib))
        key[id(merged)] = im
        return merged

    def compute_last_usage(self) -> None:
        """Index of the last unit that reads or writes each buffer (its free point)."""
        self.last_use = {}
        for i, unit in enumerate(self.units):
            for name in unit.read_names() | unit.write_names():
                self.last_use[name] = i

    # -- helpers -------------------------------------------------------------------------

    def _buffer_bytes(self) -> dict[str, int]:
        out = {}
        for buf in itertools.chain(self.graph.buffers, self.graph.graph_inputs.values()):
            layout = getattr(buf, "layout", None)
            if layout is None:
                continue
            numel = layout.numel()
            out[buf.name] = int(numel) * layout.dtype.itemsize if numel.is_Integer else 0
        return out

    def kernel_groups(self) -> Iterable[FusedGroup]:
        return (u for u in self.units if isinstance(u, FusedGroup))

    def debug_str(self) -> str:
        lines = []
        for unit in self.units:
            if isinstance(unit, FusedGroup):
                lines.append(f"{unit!r}")
                for n in unit.nodes:
                    lines.append(f"  {n.node}")
                    rw = n.read_writes
                    lines.append(f"    reads: {sorted(map(str, rw.reads))}")
                    lines.append(f"    writes: {sorted(map(str, rw.writes))}")
            else:
                lines.append(f"{unit!r}: {unit.node}")
        return "\n".join(lines) + "\n"


__all__ = ["MemoryDep", "Scheduler", "StarDep", "sympy"]
