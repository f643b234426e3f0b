"""Loop-nest shapes shared by the kernel generators: nodes grouped into loops, contiguous
dims merged, the order of a pointwise nest, and how many accumulator lanes or tile columns a
reduction uses."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import sympy
import torch

from minductor import config
from minductor.codegen.common import cpp_index
from minductor.ir.indexing import FloorDiv, ModularIndexing, affine_coeffs, index_symbol, make_vars, simplify_index
from minductor.runtime.cache import avx512_enabled
from minductor.scheduler.deps import MemoryDep, StarDep, is_indirect
from minductor.scheduler.fusion import reads_only_where_it_writes
from minductor.scheduler.nodes import PARALLEL_THRESHOLD, FusedGroup, SchedulerNode
from minductor.virtualized import V

Expr = sympy.Expr

# independent accumulators per reduction: at least one AVX2 vector of float, and up to four
# vectors (long_row_lanes: MAX_LANES, twice that on AVX-512) on long rows, where more
# independent add chains keep up with memory. x.sum(1) at 4096^2 on an AMD EPYC (Zen 5),
# kernels alone in alternation, three runs: 32 lanes 975-983 us, 64 lanes 834-860 (eager
# 957-972; a full sum's 64 lanes over the same bytes: 894-912)
LANES = 8
MAX_LANES = 32
# Welford's update chains a subtract and a multiply-add per value on each lane's mean, twice the
# latency of a sum's add: long rows take 8 AVX-512 vectors of lanes (mean and m2: 16 of the 32
# registers). Measured at 4096^2 on a Xeon, kernels alone, interleaved: layer_norm 3.8-4.1 ->
# 3.6-3.7 ms, layer_norm(x + r) 5.6-7.0 -> 5.2-6.2 ms with 128 lanes (256 spill: 5.6-6.2 ms).
# AVX2's 16 registers keep MAX_LANES.
WELFORD_LANES = 128
WIDE_ROW = 1024  # the least row that takes MAX_LANES or WELFORD_LANES
# a reduced row at most this long is one vector loop with a lane per element
SHORT_ROW = 64
# outer-lane reductions over at least this many rows split the rows across threads, each
# thread reducing tiles of up to SPLIT_ROWS_TILE columns (16 KB of float accumulators: L1)
SPLIT_ROWS_MIN = 256
SPLIT_ROWS_TILE = 4096
# rows each pass of a split-rows tile reduces, the accumulator held in a register across them
ROW_GROUP = 4
# outer-lane mode (reducing along a strided dim): columns per tile. Each row of a tile is a
# contiguous run of that many values; runs of a whole page (1024 floats) let the hardware
# prefetcher stream each thread's rows (x.sum(0) at 4096x4096: 64 -> 2.85 ms, 1024 -> 1.57 ms)
OUTER_LANE_WIDTHS = (1024, 256, 64)
# edge of the 2-D tiles used when a pointwise kernel reads a transposed buffer (x.t() + y at 4096:
# 64 -> 20.3 ms, 32 -> 28.5 ms with gathers on an AVX-512 Xeon)
TILE = 64
# with the transposed operand staged by a register transpose, a tile of STAGED_ROWS x
# STAGED_COLS (rows along the operand's contiguous dim) is staged whole before its rows are
# computed: the operand is then read in runs of STAGED_ROWS values per row and the others in
# runs of STAGED_COLS, and each row of the tile streams its output (x.t() + y at 4096 on a Xeon,
# family 6 model 207, streamed: 16x1024 strips of 16x16 blocks 17.1-18.1 ms (12 streamed),
# whole tiles 64x64 9.5-10.1, 128x128 6.4-7.4, 256x256 6.0-6.1, 256x128 5.2-5.9, 512x128
# 5.8-6.9, 1024x64 7.1-7.4; 256x128 with ordinary stores 12.8-13.3; torch.add(out=) 6.5-8.2).
# On an AMD EPYC (Zen 5), kernels alone in alternation, staging with prefetches two lines
# ahead (StagedTile.PREFETCH_AHEAD): 512x128 3.28-3.29 ms, 256x256 4.46-4.55, 512x64 3.74-3.80,
# 1024x64 3.77-3.79 (256x128 without the prefetches: 3.53-3.57; a STREAM add: 1.8 ms). The
# staging's cost is its reads of short runs: a tile's operand rows alone (no stores) read at
# 1.30 ms in 1024-value runs, 1.37 in 512-value runs, against 1.17 ms for one sequential pass.
# So 1024 rows when the L2 holds the stage twice over (Zen 5, 1 MB L2, whole calls, alternating
# processes, three rounds: 512x128 5.03-5.15 ms, 1024x128 4.89-4.92; a C++ harness, kernels
# alone in alternation: 4.83-4.87 and 4.67-4.72, STREAM add 3.39). A stage that fills the L2
# or spills to L3 is slower (1024x256 at 1 MB: 4.82; 1024x1024: 7.2 ms).
STAGED_ROWS = 1024
STAGED_COLS = 128
# the stages of one tile together, on the thread's stack; at most half the L2 (stage_budget)
STAGE_BYTES = 512 * 1024
# a pure pointwise nest whose innermost loop runs at most SMALL_INNER iterations (RGB channels
# last) vectorizes its second-innermost loop instead, the innermost one unrolled, in parallel
# chunks of SMALL_INNER_CHUNK: NCHW -> NHWC of a (2, 3, 256, 256) input ran 135-169 us with the
# 3-long loop vectorized and 31 us so (eager: 245-297 us) on a Xeon (family 6 model 207)
SMALL_INNER = 8
SMALL_INNER_CHUNK = 1024
# a scatter whose innermost loop it writes apart (index_add along dim 0 over feature columns)
# but not its outer ones splits that loop into per-thread chunks of at least this many columns
SCATTER_CHUNK_MIN = 64
LINE = 16  # floats per 64-byte line


@dataclasses.dataclass
class Loop:
    """Nodes sharing one inner loop nest inside the outer loops."""

    nodes: list[SchedulerNode]
    pw_inner: list[Expr]
    red: list[Expr]

    def key(self) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
        return tuple(self.pw_inner), tuple(self.red)


def pure_pointwise(loops: Sequence[Loop]) -> bool:
    """One loop nest of elementwise nodes only (a reduction over size-1 dims has no reduced
    loop left, but still accumulates)."""
    return (len(loops) == 1 and not loops[0].pw_inner and not loops[0].red
            and not any(n.is_reduction() for n in loops[0].nodes))


@dataclasses.dataclass
class MergedDims:
    """Loop dims after merging contiguous ones: loop variables, sizes, and the substitution
    that maps original variables onto them."""

    variables: list[sympy.Symbol]
    sizes: list[Expr]
    substitution: dict[sympy.Symbol, Expr]


def merge_dims(variables: Sequence[sympy.Symbol], sizes: Sequence[Expr], exprs: Sequence[Expr], prefix: str) -> MergedDims:
    """Merge adjacent dims ``i, i+1`` when every index uses them as one flat dim."""
    groups: list[list[int]] = []
    coeffs = [affine_coeffs(e, list(variables)) for e in exprs]
    for i in range(len(variables)):
        if groups and _mergeable(groups[-1][-1], i, variables, sizes, coeffs):
            groups[-1].append(i)
        else:
            groups.append([i])
    new_vars = [index_symbol(f"{prefix}{i}") for i in range(len(groups))]
    sub: dict[sympy.Symbol, Expr] = {}
    new_sizes = []
    for var, group in zip(new_vars, groups):
        size = sympy.Integer(1)
        for i in group:
            size = size * sizes[i]
        new_sizes.append(size)
        # v_last -> merged var, others -> 0: valid because each index is c * (flat index)
        for i in group[:-1]:
            sub[variables[i]] = sympy.Integer(0)
        sub[variables[group[-1]]] = var
    return MergedDims(new_vars, new_sizes, sub)


def split_and_merge_dims(variables: Sequence[sympy.Symbol], sizes: Sequence[Expr], exprs: Sequence[Expr],
                         prefix: str) -> MergedDims:
    """``merge_dims``, after splitting each dim that the indices cut at one point ``c`` (only
    through ``FloorDiv(v, c)`` and ``ModularIndexing(v, 1, c)``, ``c`` dividing its static size)
    into an outer dim of ``size / c`` and an inner one of ``c``. A read of heads merged back into
    a row (``8192*(x2 / 64) + x2 % 64``) is then a contiguous run per inner loop instead of a
    gather: a transformer backward's cat slice of a gradient ran 47 -> 16 us (kernel alone, interleaved)."""
    split_vars, split_sizes, pre = [], [], {}
    for v, size in zip(variables, sizes):
        cut = _single_cut(v, exprs)
        if cut is None or not size.is_Integer or size % cut or not 1 < cut < size:
            split_vars.append(v)
            split_sizes.append(size)
            continue
        hi, lo = index_symbol(f"{v.name}_hi"), index_symbol(f"{v.name}_lo")
        split_vars += [hi, lo]
        split_sizes += [size // cut, sympy.Integer(cut)]
        pre[v] = cut * hi + lo
    if not pre:
        return merge_dims(variables, sizes, exprs, prefix)
    ranges = dict(zip(split_vars, split_sizes))
    merged = merge_dims(split_vars, split_sizes, [simplify_index(sympy.expand(sympy.sympify(e).xreplace(pre)), ranges) for e in exprs], prefix)
    sub = {v: (pre[v].xreplace(merged.substitution) if v in pre else merged.substitution[v]) for v in variables}
    return MergedDims(merged.variables, merged.sizes, sub)


def _single_cut(v: sympy.Symbol, exprs: Sequence[Expr]) -> int | None:
    cuts = set()
    for e in exprs:
        for atom in sympy.sympify(e).atoms(FloorDiv, ModularIndexing):
            if not atom.has(v):
                continue
            if atom.args[0] != v or not all(a.is_Integer for a in atom.args[1:]):
                return None
            if isinstance(atom, FloorDiv):
                cuts.add(int(atom.args[1]))
            elif atom.args[1] == 1:
                cuts.add(int(atom.args[2]))
            else:
                return None
    return cuts.pop() if len(cuts) == 1 else None


def mutation_loops(group: FusedGroup, dims: MergedDims) -> tuple[bool, int, bool, bool]:
    """For a kernel that stores into another buffer: whether it scatters, how many leading
    loops of ``dims`` may run in parallel, whether its innermost loop may be split into
    parallel chunks instead (the rest then running inside each chunk), and whether its loops
    may run in parallel at all.

    A scatter (indirect or combining store) runs its updates of each element in one thread in
    eager's order, and without `omp simd`, which would promise that no two lanes store to one
    place. Loops over dims it writes apart (``ComputedBuffer.write_apart``: the rows of a
    scatter along dim 1, the feature columns of an ``index_add`` along dim 0) may run in
    parallel (its combining store reads the target only at the element it writes). A plain
    store into a buffer it does not read (a cat's slice) runs in parallel, and so does one
    whose kernel reads the buffer only at the element it stores there in the same iteration
    (an optimizer's in-place update)."""
    muts = [n for n in group.nodes if n.node.mutates]
    scatters = any(n.node.store_mode is not None or any(isinstance(d, StarDep) for d in n.read_writes.writes) for n in muts)
    if scatters:
        apart = _apart_loops(group, dims)
        depth = next((i for i, a in enumerate(apart) if not a), len(apart))
        inner = depth == 0 and len(apart) > 1 and apart[-1] and _chunks(dims.sizes[-1]) > 1
        return True, depth, inner, depth > 0 or inner
    return False, 0, False, all(reads_only_where_it_writes(group, n) for n in muts)


def parallel_decision(work: Expr) -> tuple[bool, str]:
    """(whether the kernel's loops are parallel, the run-time condition of their OpenMP ``if``
    clause or ""): static work decides at compile time; symbolic work at run time. A graph
    compiled when a dynamic dim was small (Dynamo's hint, and the graph cache that serves it
    for every size) would otherwise run every later size on one thread: x.sum(1) at 4096²,
    compiled at 4x4, took 2.9 ms against 1.5 ms."""
    if work.is_number:
        return int(work) >= PARALLEL_THRESHOLD, ""
    return True, f"{cpp_index(work)} >= {PARALLEL_THRESHOLD}"


# the shorter side of a transpose that 2-D tiles pay for: (8, 64, 32, 32) to channels-last,
# 462 -> 55 us with tiles (64 channels against 1024 pixels); 3 channels stay untiled
MIN_TILE_EDGE = 16
# the longer side: batched transposes of (32, 64) planes ((4096, 32, 64).transpose(-1, -2) * 2:
# 2.9-4.1 -> 1.0-2.1 ms; (8, 64, 32, 64) 149-191 -> 67-74 us; was 128) and a 2x upsample into
# a channels-last concatenation, (w/2 = 32) x (64 channels) planes (1.74 -> 0.18 ms)
MIN_TILE_LONG_EDGE = TILE


def tile_sizes(a: Expr, b: Expr) -> bool:
    """Whether a transpose of runs ``a`` and ``b`` long is worth 2-D tiles (codegen's choice,
    which fusion anticipates)."""
    low, high = sorted(planning_size(s, 2 * TILE) for s in (a, b))
    return low >= MIN_TILE_EDGE and high >= MIN_TILE_LONG_EDGE


def planning_size(size: Expr, floor: int) -> int:
    """``size`` for choosing a loop's shape: a static size as it is; a symbolic one at its hint,
    but at least ``floor``, the least size the larger shape is chosen for. A dynamic dim varies,
    and one compiled graph (which the graph cache also serves for every size) keeps the shapes
    chosen at the hint Dynamo recorded, often the small size that made the dim dynamic. Shapes
    chosen for large sizes cost small ones little; shapes chosen for small sizes ran large
    ones up to 6.5x slower (x.sum(0) at 4096^2 on 8-column tiles)."""
    size = sympy.sympify(size)
    return int(size) if size.is_number else max(V.graph.sizevars.hint(size), floor)


def inner_chunk(size: Expr) -> int | str:
    """Columns per parallel chunk of a scatter's innermost loop split across threads: a
    thread's share in whole lines, at least SCATTER_CHUNK_MIN; of a symbolic size, the same
    computed at run time (a C expression). Chunks of the hint's width ran index_put of 8192
    rows into 4096x1024, compiled at 8x8, in 64-column chunks: 4.28 against 2.79 ms static."""
    threads = max(1, torch.get_num_threads())
    size = sympy.sympify(size)
    if size.is_number:
        return max(SCATTER_CHUNK_MIN, -(-int(size) // threads // LINE) * LINE)
    step = threads * LINE
    return f"mi_max_i64({SCATTER_CHUNK_MIN}, ({cpp_index(size)} + {step - 1}) / {step} * {LINE})"


def _chunks(size: Expr) -> int:
    """How many chunks ``inner_chunk`` cuts a loop of ``size`` into; a symbolic loop counts as
    cut (its chunks are a thread's share at any size)."""
    chunk = inner_chunk(size)
    return -(-int(size) // chunk) if isinstance(chunk, int) else 2


def _apart_loops(group: FusedGroup, dims: MergedDims) -> list[bool]:
    """Per loop of ``dims``: whether a lone scatter node's iterations write apart along it
    (every dim merged into it is in ``ComputedBuffer.write_apart``)."""
    if len(group.nodes) != 1 or not group.nodes[0].node.write_apart:
        return [False] * len(dims.variables)
    node = group.nodes[0]
    members: dict[sympy.Symbol, list[int]] = {}
    pending: list[int] = []
    for i, var in enumerate(make_vars("x", len(node.pw_dims))):  # merged dims map all but their last to 0
        target = dims.substitution.get(var)
        if target == 0:
            pending.append(i)
        elif isinstance(target, sympy.Symbol):
            members[target], pending = pending + [i], []
        else:
            return [False] * len(dims.variables)
    return [var in members and all(node.pw_dims[i] in node.node.write_apart for i in members[var]) for var in dims.variables]


def _mergeable(i: int, j: int, variables: Sequence[sympy.Symbol], sizes: Sequence[Expr], coeffs: list) -> bool:
    vi, vj = variables[i], variables[j]
    for c in coeffs:
        if c is None:
            return False
        if c[vi] != c[vj] * sizes[j]:
            return False
    return True


def in_store_order(dims: MergedDims, nodes: Sequence[SchedulerNode]) -> MergedDims:
    """The loops of a pointwise kernel (any order is valid) ordered like the memory of the
    first store, largest stride outermost: a channels-last output (strides ``HWC, 1, WC, C``)
    then has its channel loop innermost, stride 1, instead of ``W`` at stride ``C``."""
    writes = [d for n in nodes for d in n.read_writes.writes if isinstance(d, MemoryDep)]
    if len(dims.variables) < 2 or not writes:
        return dims
    coeffs = affine_coeffs(writes[0].index.xreplace(dims.substitution), dims.variables)
    if coeffs is None:
        return dims
    # symbolic strides order by their size hints: the stride-1 loop comes last at every size
    # (any order is correct; x.t() + 1 over symbolic sizes ran 70x slower column by column)
    stride = [sympy.sympify(coeffs[v]) for v in dims.variables]
    order = _memory_order(stride)
    if stride[order[-1]] != 1:
        return dims  # no loop the store walks at stride 1
    order = _unread_loops_outside(order, dims, nodes)
    if order == sorted(order):
        return dims  # already in order
    return MergedDims([dims.variables[i] for i in order], [dims.sizes[i] for i in order], dims.substitution)


def reduction_read_order(variables: Sequence[sympy.Symbol], sizes: Sequence[Expr],
                         nodes: Sequence[SchedulerNode]) -> list[int]:
    """The order of a reduction's loops (positions in ``variables``): like the memory of the
    largest buffer it reads, largest stride outermost, when that one has a stride-1 loop. Any
    order sums, maxes and Welford-combines the same elements; an arg reduction keeps its
    loops (its ties take the first index). Summing a channels-last (8, 32, 112, 112) tensor
    walked it 32 floats apart (1.34 ms; in memory order, one merged loop: 0.08)."""
    order = list(range(len(variables)))
    if len(variables) < 2 or any(n.is_reduction() and n.node.data.reduction_type in ("argmax", "argmin") for n in nodes):
        return order
    reads = [d for n in nodes for d in n.read_writes.reads if isinstance(d, MemoryDep)
             and any(d.index.has(v) for v in variables)]
    if not reads:
        return order
    hint = V.graph.sizevars.hint
    largest = max(reads, key=lambda d: hint(sympy.Mul(*V.graph.get_buffer(d.name).get_size()))
                  * V.graph.get_dtype(d.name).itemsize)
    coeffs = affine_coeffs(largest.index, list(variables))
    if coeffs is None:
        return order
    stride = [sympy.sympify(coeffs[v]) for v in variables]
    return _memory_order(stride) if any(s == 1 for s in stride) else order


def _memory_order(stride: Sequence[Expr]) -> list[int]:
    """Loop positions by the strides an access walks them with: largest outermost, stride 1
    innermost (symbolic strides ordered by their size hints)."""
    return sorted(range(len(stride)), key=lambda i: (stride[i] == 1, -V.graph.sizevars.hint(stride[i])))


def _unread_loops_outside(order: list[int], dims: MergedDims, nodes: Sequence[SchedulerNode]) -> list[int]:
    """The loops no read depends on (a repeat: a 2x nearest upsample's second copy of each
    column) moved outside the others but the innermost, when that puts a loop some read walks
    at stride 1 next to the innermost one that it walks with a stride: the transpose 2-D tiles
    stage (an upsample into a channels-last concatenation: 1.7 ms gathered from 64 lines 4 KB
    apart, one L1 set, per pixel)."""
    ranges = dict(zip(dims.variables, dims.sizes))
    reads = [affine_coeffs(simplify_index(d.index.xreplace(dims.substitution), ranges), dims.variables)
             for n in nodes for d in n.read_writes.reads if isinstance(d, MemoryDep)]
    reads = [c for c in reads if c is not None]
    if len(order) < 3 or not reads:
        return order
    inner = dims.variables[order[-1]]
    unread = [i for i in order[:-1] if all(c[dims.variables[i]] == 0 for c in reads)]
    moved = unread + [i for i in order[:-1] if i not in unread] + order[-1:]
    second = dims.variables[moved[-2]]
    if moved == order or not any(c[second] == 1 and c[inner] not in (0, 1) for c in reads):
        return order
    return moved

def linear_index(variables: Sequence[sympy.Symbol], sizes: Sequence[Expr]) -> Expr:
    out: Expr = sympy.Integer(0)
    stride: Expr = sympy.Integer(1)
    for v, s in reversed(list(zip(variables, sizes))):
        out = out + v * stride
        stride = stride * s
    return out

def joins(loop: Loop, node: SchedulerNode) -> bool:
    """Whether ``node`` can run in ``loop``'s iteration (it reads nothing the loop has not
    finished writing by the time the same iteration reaches it)."""
    written = {}
    for n in loop.nodes:
        for d in n.read_writes.writes:
            written[d.name] = (n, d)
    for dep in node.read_writes.reads:
        if dep.name not in written:
            continue
        writer, wdep = written[dep.name]
        if writer.is_reduction() or not isinstance(dep, MemoryDep) or not isinstance(wdep, MemoryDep):
            return False
        if sympy.expand(dep.index - wdep.index) != 0:
            return False
    return True


def wide_lanes(row: Expr, lanes: int, whole_range: bool, welford: bool) -> int:
    """For a row of symbolic length: the lanes of a second main loop, taken at run time on rows
    of at least WIDE_ROW, as a static row of that length would get them (0: none). The narrow
    lanes a symbolic row keeps for short rows left layer_norm at 4096^2, compiled at 8x8, 1.51x
    slower than the static graph's 128 Welford lanes, and softmax 1.27x (16 lanes against 32;
    AMD EPYC)."""
    if whole_range or row.is_number:
        return 0
    wide = WELFORD_LANES if welford and avx512_enabled(config.cxx) else long_row_lanes()
    return wide if wide > lanes else 0


def vector_bytes() -> int:
    """The width of the vector registers kernels use: 64 bytes on AVX-512, else 32 (AVX2)."""
    return 64 if avx512_enabled(config.cxx) else 32


def long_row_lanes() -> int:
    """The accumulator lanes of a long row: four vectors of float."""
    return 4 * vector_bytes() // 4


def inner_lanes(row: Expr, whole_range: bool = False, welford: bool = False, min_lanes: int = 0) -> tuple[int, int]:
    """Accumulator lanes for a reduction over rows of ``row`` elements, and the slots of the
    lane arrays: more lanes hide the add latency on long rows (more yet for ``welford``, on
    AVX-512), fewer keep the final combine cheap on short ones. A constant row of at most
    SHORT_ROW is one vector loop with a lane per element and no scalar tail; its slots are
    padded to a power of two (with the identity) for the pairwise combine (a 20-wide pooling
    window: 16 + 4 lanes instead of 8 + 8 + 4). A symbolic row has at least 16 lanes. A row
    of 128 or more takes at least ``min_lanes`` (``narrow_lanes``: a vector of the bools it
    reads): GCC 12 vectorized a 16-lane loop that read a bool mask in 8-byte vectors, two floats
    at a time (a masked attention softmax at (8, 4, 128, 128), kernel alone: 1016 -> 156 us with 64 lanes)."""
    if whole_range:  # a full reduction: every thread streams a long chunk
        return 2 * MAX_LANES, 2 * MAX_LANES
    if row.is_Integer and 1 < int(row) <= SHORT_ROW:
        return int(row), 1 << (int(row) - 1).bit_length()
    # a symbolic row gets at least a vector of lanes: at a hint of 4, softmax at 4096^2 ran 1.6x
    # slower on 8 lanes; on rows of 8, 32 lanes ran 4x slower than 8, and 16 about 1.6x
    size = planning_size(row, 128)
    if welford and size >= WIDE_ROW and avx512_enabled(config.cxx):
        return WELFORD_LANES, WELFORD_LANES
    lanes = long_row_lanes() if size >= WIDE_ROW else 16 if size >= 128 else LANES  # 16: one AVX-512 vector
    if size >= 128:
        lanes = max(lanes, min_lanes)
    return lanes, lanes


def narrow_lanes(dtypes: Iterable[torch.dtype]) -> int:
    """The lanes a fixed-width loop over values of ``dtypes`` needs to fill a vector register
    with the narrowest of them, if it is under 4 bytes (a bool mask); else 0. With 16 lanes, GCC 12
    vectorized a loop that selected under a loaded bool in 8-byte vectors (see inner_lanes); a
    bfloat16 softmax over rows of 256 ran 361 us at 16 lanes and 266 at 32 (4096 rows, kernels
    alone in alternation, AMD EPYC)."""
    itemsize = min((dtype.itemsize for dtype in dtypes), default=4)
    return vector_bytes() // itemsize if itemsize < 4 else 0


def loop_narrow_lanes(loop: Loop) -> int:
    """``narrow_lanes`` of the values a loop block reads and writes."""
    deps = [d for node in loop.nodes for d in node.read_writes.reads | node.read_writes.writes if isinstance(d, MemoryDep)]
    return narrow_lanes(V.graph.get_dtype(d.name) for d in deps)


def line_step(dtypes: Iterable[torch.dtype]) -> int:
    """Values a streamed loop over ``dtypes`` computes per step: a 64-byte line of float, or the
    lines that make a vector of its narrowest values (``narrow_lanes``)."""
    return max(LINE, narrow_lanes(dtypes))


def outer_lane_width(width: int, threads: int, other_outer: int = 1) -> int:
    """Columns per tile when reducing along a strided dim: as wide as leaves every thread a
    tile (wider rows stream better), whole cache lines at least, single vectors on narrow data.
    ``other_outer`` parallel iterations outside the tiled dim (a batch) give threads work too:
    16 channels of 2 images on 2 threads are one 16-wide tile per image, not two 8-wide tiles
    that each read half of every cache line."""
    tiles = -(-max(threads, 1) // max(other_outer, 1))
    for lanes in OUTER_LANE_WIDTHS:
        if width >= lanes * tiles or (lanes == OUTER_LANE_WIDTHS[-1] and width >= lanes * 16):
            return lanes
    for lanes in (32, 16):
        if width >= lanes * tiles:
            return lanes
    return LANES


def vectorizes_outside(sizes: Sequence[Expr]) -> bool:
    """Whether a pure pointwise nest of these sizes vectorizes its second-innermost loop."""
    inner, second = sizes[-1], sizes[-2]
    return isinstance(inner, sympy.Integer) and int(inner) <= SMALL_INNER and planning_size(second, 4 * int(inner)) >= 4 * int(inner)


def outer_lane_var(group: FusedGroup, outer: MergedDims) -> sympy.Symbol | None:
    """The outer variable to vectorize across, for reductions whose input is contiguous
    along an outer dim rather than the reduced one (``x.sum(0)``); None otherwise."""
    if not outer.variables or not group.has_reduction():
        return None
    n_outer = len(group.outer)
    x_last = index_symbol(f"x{n_outer - 1}")
    if outer.substitution.get(x_last) != outer.variables[-1]:
        return None
    contiguous_outer = False
    for node in group.nodes:
        if not node.is_reduction() or not node.red_ranges:
            continue
        r_last = index_symbol(f"r{len(node.red_ranges) - 1}")
        # (a read through an indirect index, a row of a table per reduction step: an
        # embedding bag's rows, contiguous along the outer dim, count as reads too)
        indirect = [e for e in node.read_writes.index_exprs if is_indirect(e)]
        for index in [dep.index for dep in node.read_writes.reads if isinstance(dep, MemoryDep)] + indirect:
            coeffs = affine_coeffs(index, [x_last, r_last])
            if coeffs is None:
                along_r = affine_coeffs(index, [r_last])
                if along_r is not None and along_r[r_last] == 1 and index.has(x_last):
                    # contiguous along the reduced dim, its row found by div/mod of the outer
                    # index (a window of a rolled image): lanes across rows would gather
                    return None
                continue
            if coeffs[x_last] == 0:
                continue  # the same for every outer index: a broadcast, not a stream
            if coeffs[r_last] == 1:
                return None
            contiguous_outer |= coeffs[x_last] == 1
    return outer.variables[-1] if contiguous_outer else None
