"""Fusion legality (``can_fuse``) and priority (``score_fusion``), kept apart."""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import sympy

from minductor import config
from minductor.ir.indexing import affine_coeffs, make_vars, value_range
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.nodes import PARALLEL_THRESHOLD, FusedGroup, SchedulerNode
from minductor.virtualized import V

Expr = sympy.Expr


def fused_outer(a: FusedGroup, b: FusedGroup) -> list[Expr] | None:
    """The shared outer loops of a fusion of ``a`` and ``b``, or None if they have none.

    A group with a reduction fixes its outer loops to the reduction's output ranges; a
    pointwise-only group may shorten its outer loops to a prefix, moving the rest inside.
    Two pointwise-only groups one of which reads the other's output share their longest
    common prefix: a producer's rows, read back within the row by a consumer of other inner
    ranges (the window sums of a pooling's first pass), then stay in the kernel; and so do
    two that write slices of one buffer (a concatenation's inputs of different widths: each
    output row is written whole by one thread).
    """
    oa, ob = list(a.outer), list(b.outer)
    ra, rb = a.has_reduction(), b.has_reduction()
    if ra and rb:
        return oa if oa == ob else None
    if ra or rb:
        fixed, other = (oa, ob) if ra else (ob, oa)
        return fixed if other[: len(fixed)] == fixed else None
    if oa == ob:
        return oa
    short, long_ = (oa, ob) if len(oa) < len(ob) else (ob, oa)
    if long_[: len(short)] == short and short:
        return short
    common = next((i for i, (x, y) in enumerate(zip(oa, ob)) if x != y), len(short))
    vertical = a.write_names() & b.read_names() or b.write_names() & a.read_names()
    slices = a.write_names() & b.write_names()  # (of one buffer: _mutations_fuse decides)
    return short[:common] if common and (vertical or slices) else None


def _rename(
    index: Expr, node: SchedulerNode, n_outer: int, with_reduction: bool = True
) -> tuple[Expr, list[sympy.Symbol], dict[sympy.Symbol, Expr]]:
    """Express a dep index in (outer vars o*, this node's inner vars) terms.

    A reduction stores once per outer iteration, so its reduction variables are not inner
    variables of its write (``with_reduction=False``)."""
    xs = make_vars("x", len(node.pw_ranges))
    rs = make_vars("r", len(node.red_ranges))
    outer = make_vars("o", n_outer)
    inner_pw = xs[n_outer:]
    sub = {x: o for x, o in zip(xs, outer)}
    inner = list(inner_pw) + (list(rs) if with_reduction else [])
    ranges = dict(zip(inner_pw, node.pw_ranges[n_outer:])) | dict(zip(rs, node.red_ranges))
    return index.xreplace(sub), inner, ranges


def _dense_image(coeffs: dict[sympy.Symbol, Expr], ranges: dict[sympy.Symbol, Expr]) -> bool:
    """Whether ``sum(c*v)`` over the ranges covers exactly ``0..numel-1`` (a dense block)."""
    # (symbolic strides order by their hints; the check below is exact either way)
    pairs = sorted(((c, ranges[v]) for v, c in coeffs.items() if ranges[v] != 1),
                   key=lambda pair: V.graph.sizevars.hint(pair[0]))
    expected = sympy.Integer(1)
    for c, size in pairs:
        if c != expected:
            return False
        expected = expected * size
    return True


def read_within_iteration(write: MemoryDep, wnode: SchedulerNode, read: MemoryDep, rnode: SchedulerNode, n_outer: int) -> bool:
    """Whether, for each outer iteration, ``read`` only touches what ``write`` stored in it."""
    w, w_inner, w_ranges = _rename(write.index, wnode, n_outer, with_reduction=False)
    r, r_inner, r_ranges = _rename(read.index, rnode, n_outer)
    outer = make_vars("o", n_outer)
    wc = affine_coeffs(w, list(outer) + w_inner)
    if wc is None:
        return sympy.expand(w - r) == 0 and not w_inner and not r_inner
    if not w_inner:  # one element per iteration (a reduction's result): read at exactly it
        rc = affine_coeffs(r, list(outer) + r_inner)
        if rc is None or any(wc[o] != rc[o] for o in outer):
            return False
        w_zero = w.xreplace({v: 0 for v in list(outer) + w_inner})
        r_zero = r.xreplace({v: 0 for v in list(outer) + r_inner})
        return all(rc[v] == 0 for v in r_inner) and sympy.expand(w_zero - r_zero) == 0
    return _reads_in_span(w, wc, w_inner, w_ranges, r, r_ranges, outer)


def _reads_in_span(w: Expr, wc: dict[sympy.Symbol, Expr], w_inner: list[sympy.Symbol], w_ranges: dict[sympy.Symbol, Expr],
                   r: Expr, r_ranges: dict[sympy.Symbol, Expr], outer: Sequence[sympy.Symbol]) -> bool:
    """``read_within_iteration`` for a write of a dense block per iteration: the read is affine
    in the outer variables like the write, and the range of the rest (affine or not in the
    inner variables: a window's start, ``FloorDiv(o*IN, OUT)``) lies inside the block."""
    r = sympy.expand(r)
    rest = r - sum((r.coeff(o, 1) * o for o in outer), sympy.Integer(0))
    if any(r.coeff(o, 1) != wc[o] or sympy.expand(rest).has(o) for o in outer) \
            or not _dense_image({v: wc[v] for v in w_inner}, w_ranges):
        return False
    lo, hi = value_range(sympy.expand(rest - w.xreplace({v: 0 for v in [*outer, *w_inner]})), r_ranges)
    return (lo is not None and hi is not None and sympy.sympify(lo >= 0) is sympy.true
            and sympy.sympify(hi < sympy.Mul(*[w_ranges[v] for v in w_inner])) is sympy.true)


def inner_vars(node: SchedulerNode, n_outer: int) -> list[tuple[sympy.Symbol, sympy.Expr]]:
    """A node's loop variables past the group's shared outer loops, with their ranges."""
    xs = make_vars("x", len(node.pw_ranges))[n_outer:]
    rs = make_vars("r", len(node.red_ranges))
    return list(zip(xs, node.pw_ranges[n_outer:])) + list(zip(rs, node.red_ranges))


def reads_only_at(group: FusedGroup, name: str, index: sympy.Expr, inner: list[tuple[sympy.Symbol, sympy.Expr]],
                  n_outer: int, positions: range) -> bool:
    """Whether every read of ``name`` in ``group`` is by a node at one of ``positions``, over
    the same inner ranges, at ``index`` (in the canonical variables ``inner``): the element the
    same iteration stored."""
    for reader_pos, reader in enumerate(group.nodes):
        for dep in reader.read_writes.reads:
            if dep.name != name:
                continue
            if reader_pos not in positions or not isinstance(dep, MemoryDep):
                return False
            theirs = inner_vars(reader, n_outer)
            if [s for _, s in theirs] != [s for _, s in inner]:
                return False
            renamed = dep.index.xreplace({v: w for (v, _), (w, _) in zip(theirs, inner)})
            if sympy.expand(renamed - index) != 0:
                return False
    return True


def reads_only_where_it_writes(group: FusedGroup, mutation: SchedulerNode) -> bool:
    """Whether every read in ``group`` of the buffer ``mutation`` stores into is of the element
    that its store writes in the same iteration (a pointwise node over the same ranges), or
    there is no such read."""
    target = mutation.node.mutates
    if not any(target in n.read_writes.read_names() for n in group.nodes):
        return True
    writes = [d for d in mutation.read_writes.writes if d.name == target]
    if len(writes) != 1 or not isinstance(writes[0], MemoryDep) or mutation.is_reduction():
        return False
    return reads_only_at(group, target, writes[0].index, inner_vars(mutation, 0), 0, range(len(group.nodes)))


def _mutations_fuse(a: FusedGroup, b: FusedGroup) -> bool:
    """Groups storing into buffers they do not own (mutations) fuse only when each such store
    is a plain one (not a scatter: no indirect or combining store, no reduction) and either
    - updates a graph input, no two store into one input, and every read of an updated input
      in either group is of the element stored there in the same iteration: the kernel reads
      each old value before overwriting it (an optimizer step updating a parameter and its two
      moments in one pass); or
    - writes its own slice of a buffer of ours that neither group reads (a concatenation's
      inputs: their loops share the outer ones, and inputs they read in common are read once,
      the rotate-half of rotary embeddings reads ``x`` for both halves). Slices over the same
      ranges that read nothing in common stay apart: their one loop would store to several
      places of the buffer, which does not stream (``cpp_stream.stream_store``; three
      (4096, 1024) inputs concatenated ran 29% slower in one kernel).
    A scatter into a buffer of ours keeps a kernel of its own."""
    muts = [n for n in a.nodes + b.nodes if n.node.mutates]
    if not muts:
        return True
    if any(n.node.store_mode is not None or n.is_reduction() or n.is_scan()
           or not all(isinstance(d, MemoryDep) for d in n.read_writes.writes) for n in muts):
        return False
    merged = FusedGroup(a.nodes + b.nodes, [])
    inputs = [n for n in muts if n.node.mutates in V.graph.graph_inputs]
    slices = [n for n in muts if n.node.mutates not in V.graph.graph_inputs]
    if any(not n.node.own_slice or n.node.mutates in _data_reads(merged) for n in slices):
        return False
    if slices and a.outer == b.outer and not (_data_reads(a) & _data_reads(b)):
        return False  # one loop storing to several places of the buffer: none streams, nothing read once
    targets = [n.node.mutates for n in inputs]
    return len(set(targets)) == len(targets) and all(reads_only_where_it_writes(merged, n) for n in inputs)


def _data_reads(group: FusedGroup) -> set[str]:
    """The buffers ``group``'s nodes load from (not a mutation's target, which they only store to)."""
    return set().union(*(n.read_writes.read_names() for n in group.nodes))


def can_fuse(a: FusedGroup, b: FusedGroup, nodes_between: bool) -> bool:
    """Legality: ``b`` runs after ``a`` in the fused kernel (``a`` never reads ``b``).

    ``nodes_between``: whether some other group depends on ``a`` and feeds ``b`` (a cycle).
    """
    if nodes_between or not _mutations_fuse(a, b):
        return False
    if a.has_scan() or b.has_scan():
        return scan_siblings(a, b)
    outer = fused_outer(a, b)
    if outer is None:
        return False
    n_outer = len(outer)
    if n_outer == 0 and len(_big_nests(a.nodes + b.nodes)) > 1 and not _one_pass(a, b):
        return False
    if any(_transposes_memo(n) for n in a.nodes + b.nodes) and not _one_pointwise_nest(a.nodes + b.nodes):
        return False
    if any(len(n.pw_ranges) < n_outer for n in a.nodes + b.nodes):
        return False
    if any(n.is_reduction() and len(n.pw_ranges) != n_outer for n in a.nodes + b.nodes):
        return False
    writes = {d.name: (d, n) for n in a.nodes for d in n.read_writes.writes if isinstance(d, MemoryDep)}
    for rnode in b.nodes:
        for dep in rnode.read_writes.reads:
            if dep.name not in writes:
                continue
            if not isinstance(dep, MemoryDep):
                return False
            wdep, wnode = writes[dep.name]
            if not read_within_iteration(wdep, wnode, dep, rnode, n_outer):
                return False
    return True


def _big_nests(nodes: Sequence[SchedulerNode]) -> set[tuple[tuple[Expr, ...], tuple[Expr, ...]]]:
    """The distinct loop nests (pointwise and reduction ranges) of ``nodes`` big enough for
    all threads (or of symbolic size). Under no shared outer loop (a full reduction's group)
    each nest is a pass of its own over its data: fusing two big ones saves no memory traffic
    and leaves the second on one thread, since the kernel's threads go to its full
    reduction (a conv's relu saved for backward and the mean over its max pool: 22 ms fused)."""
    nests = set()
    for n in nodes:
        work = sympy.Mul(*n.pw_ranges, *n.red_ranges)
        if not work.is_number or int(work) >= PARALLEL_THRESHOLD:
            nests.add((tuple(n.pw_ranges), tuple(n.red_ranges)))
    return nests


def _one_pass(a: FusedGroup, b: FusedGroup) -> bool:
    """A full reduction and pointwise siblings over the same elements, neither reading the
    other (``((x - y) ** 2).sum()`` and ``x - y`` saved for backward): C++ codegen stores
    the pointwise values inside the reduction's loop, each thread over its chunk, in one pass
    over the inputs (``cpp_split_rows.fold_siblings``)."""
    nodes = a.nodes + b.nodes
    if nodes[0].node.get_device().type != "cpu" or config.cpu_backend != "cpp":
        return False  # (a Triton full reduction runs as few programs: the pointwise would too)
    reductions = [n for n in nodes if n.is_reduction()]
    if not reductions or any(n.is_scan() or n.node.mutates for n in nodes):
        return False
    red = tuple(reductions[0].red_ranges)
    if any(tuple(n.red_ranges) != red or n.pw_ranges for n in reductions):
        return False
    pointwise = [n for n in nodes if not n.is_reduction()]
    if any(tuple(n.pw_ranges) != red for n in pointwise):
        return False
    written = {d.name for n in nodes for d in n.read_writes.writes}
    return not any(d.name in written for n in nodes for d in n.read_writes.reads)


_TRANSPOSES: weakref.WeakKeyDictionary[SchedulerNode, bool] = weakref.WeakKeyDictionary()


def _transposes_memo(node: SchedulerNode) -> bool:
    """``_transposes``, once per node (``can_fuse`` asks for every candidate pair)."""
    if node not in _TRANSPOSES:
        _TRANSPOSES[node] = _transposes(node)
    return _TRANSPOSES[node]


def _transposes(node: SchedulerNode) -> bool:
    """A pointwise node, big enough for 2-D tiles, that reads transposed what it writes: with
    its dims merged as codegen merges them, some read is contiguous along another dim than the
    write. Alone, or with pointwise nodes over the same ranges, C++ codegen loops over tiles and
    stages the transposed operand (``codegen/cpp_tiles.py``); in a kernel of several loop nests
    it would not, and every element would be a strided load:
    - a weight gradient's ``dy.t()`` copy (of a 256x1024 ``dy``) fused with the bias gradient's
      column sum of ``dy`` took 281 us; apart, the tiled copy 33 us and the sum 16;
    - group_norm applied to an NCHW input into a channels-last output (for a convolution), fused
      with the per-sample scale and shift it reads (8x64x32x32): 181 us; apart, ~60."""
    from minductor.codegen.loop_shapes import (  # (import cycle)
        MIN_TILE_EDGE,
        MIN_TILE_LONG_EDGE,
        merge_dims,
        tile_sizes,
    )

    if node.is_reduction() or node.is_scan():
        return False
    writes = [d for d in node.read_writes.writes if isinstance(d, MemoryDep)]
    reads = [d for d in node.read_writes.reads if isinstance(d, MemoryDep)]
    if not writes:
        return False
    ranges = [(v, s) for v, s in writes[0].var_ranges if s != 1]
    if len(ranges) < 2 or all(d.index == writes[0].index for d in reads):
        return False  # (cheap answers first: the rest costs ~2 ms a node in SymPy)
    numel = sympy.Mul(*(s for _, s in ranges))
    if numel.is_Integer and int(numel) < MIN_TILE_EDGE * MIN_TILE_LONG_EDGE:
        return False  # too small for tiles along any two of its dims
    dims = merge_dims([v for v, _ in ranges], [s for _, s in ranges], [d.index for d in writes + reads], "t")
    size = dict(zip(dims.variables, dims.sizes))

    def contiguous_dim(dep: MemoryDep) -> tuple[sympy.Symbol | None, dict[sympy.Symbol, Expr] | None]:
        coeffs = affine_coeffs(dep.index.xreplace(dims.substitution), dims.variables)
        return (None if coeffs is None else next((v for v in dims.variables if coeffs[v] == 1), None)), coeffs

    w_dim, _ = contiguous_dim(writes[0])
    if w_dim is None:
        return False
    for dep in reads:
        r_dim, coeffs = contiguous_dim(dep)
        if r_dim is not None and r_dim != w_dim and coeffs[w_dim] != 0 and tile_sizes(size[w_dim], size[r_dim]):
            return True  # (a read constant along the write's dim is a broadcast, not a transpose)
    return False


def _one_pointwise_nest(nodes: Sequence[SchedulerNode]) -> bool:
    return all(not n.is_reduction() and not n.is_scan() for n in nodes) and len({tuple(n.pw_ranges) for n in nodes}) == 1


def scan_siblings(a: FusedGroup, b: FusedGroup) -> bool:
    """Scans are kernels of their own; only the outputs of one scan (cummax's values and
    indices) share one."""
    nodes = a.nodes + b.nodes
    if not all(n.is_scan() for n in nodes):
        return False
    first = nodes[0].node.data
    return all(n.node.data.combine_fn is first.combine_fn and n.node.data.inner_fn is first.inner_fn for n in nodes)


def score_fusion(a: FusedGroup, b: FusedGroup, buffer_bytes: dict[str, int]) -> tuple[int, int, int]:
    """Priority: bytes of memory traffic saved, then vertical before horizontal, then proximity."""
    shared = (a.write_names() & b.read_names()) | (b.write_names() & a.read_names())
    common_reads = a.read_names() & b.read_names()
    saved = sum(buffer_bytes.get(n, 0) for n in shared | common_reads)
    return saved, int(bool(shared)), -abs(a.order - b.order)


__all__ = ["Sequence", "can_fuse", "fused_outer", "score_fusion"]
