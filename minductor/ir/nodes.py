"""IR nodes: lazy loops, buffers, and the boxes lowerings pass around.

``TensorBox(StorageBox(data))``: a TensorBox is the handle a lowering returns (views are
swapped in at this level); a StorageBox is the identity of one storage. Unrealized
``Pointwise`` data is inlined into consumers through its loader; ``realize()`` turns it
into a ``ComputedBuffer`` that the scheduler will turn into a kernel.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import sympy
import torch

from minductor.ir.indexing import make_vars
from minductor.ir.layout import FixedLayout, FlexibleLayout
from minductor.ir.ops import TRANSCENDENTAL, DefaultHandler, ops
from minductor.virtualized import V

Expr = sympy.Expr
Loader = Callable[[Sequence[Expr]], Any]

# Costly bodies used more than once are computed once into a buffer; cheap ones are inlined.
REALIZE_OPCOUNT_THRESHOLD = 30
REALIZE_READS_THRESHOLD = 4
# Any body larger than this is realized even with one user, to bound compile time; index math
# (a bicubic upsample's weights: 82 of its 97 ops) counts in a bound four times as large.
MAX_INLINE_OPCOUNT = 96


class IRNode:
    """Base of everything a lowering can hold: sizes, dtype, device and a loader."""

    origins: frozenset[str] = frozenset()

    def get_size(self) -> list[Expr]:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Loader:
        raise NotImplementedError

    def get_numel(self) -> Expr:
        return sympy.Mul(*self.get_size()) if self.get_size() else sympy.Integer(1)

    def is_realized(self) -> bool:
        return False


@dataclasses.dataclass(eq=False)
class Loops(IRNode):
    device: torch.device
    dtype: torch.dtype
    inner_fn: Callable[..., Any]
    ranges: list[Expr]
    origins: frozenset[str] = frozenset()
    # dims outermost to innermost for the buffer it is realized into (None: contiguous); a
    # pointwise value over a channels-last input keeps channels-last, so no kernel transposes
    stride_order: tuple[int, ...] | None = None

    def get_size(self) -> list[Expr]:
        return self.ranges

    def get_dtype(self) -> torch.dtype:
        return self.dtype

    def get_device(self) -> torch.device:
        return self.device

    def opcount(self) -> OpCount:
        """What one evaluation of the body executes, inlined producers included."""
        counter = _CountingHandler()
        with V.set_ops(counter):
            self._run_for_count()
        return OpCount(counter.ops, counter.loads, counter.transcendental, counter.all_ops, counter.indirect)

    def _run_for_count(self) -> None:
        self.inner_fn(make_vars("i", len(self.ranges)))


@dataclasses.dataclass(eq=False)
class Pointwise(Loops):
    def make_loader(self) -> Loader:
        return self.inner_fn

    def __str__(self) -> str:
        return f"Pointwise({self.dtype}, ranges={self.ranges}, origins={sorted(self.origins)})"


@dataclasses.dataclass(eq=False)
class Reduction(Loops):
    """``inner_fn(index, rindex)`` combined over ``reduction_ranges`` by ``reduction_type``.

    ``welford_reduce`` yields (mean, m2, weight); ``output_index`` picks which one this
    node stores, so a var_mean is three buffers with one body that fuse into one loop.
    """

    src_dtype: torch.dtype = torch.float32
    reduction_ranges: list[Expr] = dataclasses.field(default_factory=list)
    reduction_type: str = "sum"
    output_index: int | None = None

    def make_loader(self) -> Loader:
        raise RuntimeError("a Reduction is read through its realized buffer")

    def _run_for_count(self) -> None:
        self.inner_fn(make_vars("i", len(self.ranges)), make_vars("r", len(self.reduction_ranges)))

    def __str__(self) -> str:
        return (
            f"Reduction({self.reduction_type}, {self.dtype}, ranges={self.ranges}, "
            f"reduction_ranges={self.reduction_ranges}, origins={sorted(self.origins)})"
        )


@dataclasses.dataclass(eq=False)
class Scan(Loops):
    """A running combine along ``ranges[scan_dim]``: ``carry = combine_fn(carry, inner_fn(index))``
    from ``init``, and each position stores ``carry[output_index]`` (cast to ``dtype``).

    ``inner_fn(index)`` and ``combine_fn(carry, values)`` work on tuples of values of
    ``carry_dtypes`` (cummax carries (value, index)); nodes built from one ``Scan`` share
    ``inner_fn`` and ``combine_fn`` and become one kernel. Codegen: codegen/cpp_scan.py.
    """

    scan_dim: int = 0
    init: tuple[Any, ...] = ()
    carry_dtypes: tuple[torch.dtype, ...] = ()
    combine_fn: Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]] = None  # type: ignore[assignment]
    output_index: int = 0

    def make_loader(self) -> Loader:
        raise RuntimeError("a Scan is read through its realized buffer")

    def outer_ranges(self) -> list[Expr]:
        return self.ranges[: self.scan_dim] + self.ranges[self.scan_dim + 1:]

    def full_index(self, index: Sequence[Expr], scan_index: Expr) -> list[Expr]:
        """The output index of outer position ``index`` at ``scan_index`` along the scan."""
        return list(index[: self.scan_dim]) + [scan_index] + list(index[self.scan_dim:])

    def _run_for_count(self) -> None:
        self.inner_fn(make_vars("i", len(self.ranges)))

    def __str__(self) -> str:
        return (
            f"Scan({self.dtype}, ranges={self.ranges}, dim={self.scan_dim}, output={self.output_index}, "
            f"origins={sorted(self.origins)})"
        )


class OpCount(NamedTuple):
    ops: int  # operations on loaded data
    loads: int
    transcendental: int  # transcendental operations on loaded data
    all_ops: int  # index math included
    indirect: int  # loads through a computed index (gathers)


class _CountingHandler(DefaultHandler):
    """Counts the distinct operations one evaluation of a body executes, as codegen's CSE
    leaves them: a value inlined twice (the gather an upsample's lerp reads in two places) is
    computed once. Values computed from the iteration indices and constants alone (index math
    such as an upsample's source coordinate) count only in ``all_ops``: codegen computes them
    once per loop or per kernel (hoisted, or a table of the innermost variable), not once per
    element."""

    def __init__(self) -> None:
        self.ops = 0  # ops on loaded data
        self.all_ops = 0
        self.loads = 0
        self.transcendental = 0
        self.indirect = 0  # loads through a computed index
        self._values: dict[Any, _Counted] = {}

    def _value(self, key: Any, data: bool) -> tuple[_Counted, bool]:
        """The value of ``key``, and whether it is new."""
        try:
            old = self._values.get(key)
        except TypeError:  # an unhashable argument: never shared
            key, old = object(), None
        if old is not None:
            return old, False
        value = self._values[key] = _Counted(len(self._values), data)
        return value, True

    def _default(self, name: str, args: tuple[Any, ...]) -> Any:
        data = any(isinstance(a, _Counted) and a.data for a in args)
        value, new = self._value((name, args), data)
        if new:
            self.all_ops += 1
            self.ops += data
            self.transcendental += data and name in TRANSCENDENTAL
        return value

    def load(self, name: str, index: Expr) -> Any:
        value, new = self._value(("load", name, index), True)
        self.loads += new
        return value

    def indirect_indexing(self, x: Any, size: Expr, check: bool = True, wrap: bool = True) -> Expr:
        self.indirect += 1
        return sympy.Symbol(f"mi_count{x.id}" if isinstance(x, _Counted) else "mi_count", integer=True)

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> Any:
        value = body()
        self.all_ops += 1
        self.ops += isinstance(value, _Counted) and value.data
        return value

    def reduction(self, dtype: Any, src_dtype: Any, reduction_type: str, value: Any) -> Any:
        self.all_ops += 1
        self.ops += 1
        out = _Counted(-1, True)
        return (out, out, out) if reduction_type == "welford_reduce" else out


@dataclasses.dataclass(frozen=True)
class _Counted:
    """A value _CountingHandler has seen: its id, and whether it is computed from loaded data."""

    id: int
    data: bool


# ---------------------------------------------------------------------------------------
# Buffers


@dataclasses.dataclass(eq=False)
class Buffer(IRNode):
    name: str
    layout: FixedLayout

    def get_size(self) -> list[Expr]:
        return list(self.layout.size)

    def get_stride(self) -> list[Expr]:
        return list(self.layout.stride)

    def get_dtype(self) -> torch.dtype:
        return self.layout.dtype

    def get_device(self) -> torch.device:
        return self.layout.device

    def is_realized(self) -> bool:
        return True

    def make_loader(self) -> Loader:
        self.freeze_layout()  # a reader now depends on these strides
        indexer = self.layout.make_indexer()
        name = self.name

        def loader(index: Sequence[Expr]) -> Any:
            return ops.load(name, indexer(index))

        return loader

    def freeze_layout(self) -> FixedLayout:
        if isinstance(self.layout, FlexibleLayout):
            self.layout = self.layout.freeze()
        return self.layout

    def get_read_names(self) -> list[str]:
        return []

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self.layout})"


@dataclasses.dataclass(eq=False)
class InputBuffer(Buffer):
    """A graph input; its layout is the example tensor's, addressed from its first element
    (kernels get its data pointer)."""


@dataclasses.dataclass(eq=False)
class ComputedBuffer(Buffer):
    """A buffer whose contents a generated kernel computes from ``data``."""

    data: Loops = None  # type: ignore[assignment]
    # name of an existing buffer this node writes into instead of its own storage (scatter,
    # copy_ into an input); the node then owns no memory and ``layout`` is the target's
    mutates: str | None = None
    store_mode: str | None = None
    # loop dims whose iterations store to different elements (every dim of a scatter but the
    # scattered one, which indexes the target directly): a scatter's loops over them may run in
    # parallel, each element's updates staying in one thread in eager's order
    write_apart: frozenset[int] = frozenset()
    # ``mutates`` is stored only at elements no other node writes (a concatenation's input into
    # its slice of the output): the node may share a kernel with the others, in any order
    own_slice: bool = False

    def store_name(self) -> str:
        return self.mutates or self.name

    @property
    def origins(self) -> frozenset[str]:  # type: ignore[override]
        return self.data.origins

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def is_scan(self) -> bool:
        return isinstance(self.data, Scan)

    def get_ranges(self) -> tuple[list[Expr], list[Expr]]:
        if isinstance(self.data, Scan):
            return self.data.outer_ranges(), [self.data.ranges[self.data.scan_dim]]
        if isinstance(self.data, Reduction):
            return list(self.data.ranges), list(self.data.reduction_ranges)
        return list(self.data.ranges), []

    def store_body(self, index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        """Run the body under the current handler, storing into this buffer."""
        data = self.data
        if self.mutates is not None:
            # the body stores itself (its index may be indirect); it returns nothing
            return data.inner_fn(index)
        if isinstance(data, Scan):
            # the reads and the write of one step (codegen/cpp_scan.py emits the loop itself)
            full = data.full_index(index, rindex[0])
            values = data.inner_fn(full)
            carry = data.combine_fn(values, values)
            return ops.store(self.name, self.layout.make_indexer()(full), carry[data.output_index])
        out_index = self.layout.make_indexer()(index)
        if isinstance(data, Reduction):
            value = ops.reduction(data.dtype, data.src_dtype, data.reduction_type, data.inner_fn(index, rindex))
            if data.output_index is not None:
                value = value[data.output_index]
            return ops.store_reduction(self.name, out_index, value)
        return ops.store(self.name, out_index, data.inner_fn(index))

    def __str__(self) -> str:
        return f"ComputedBuffer({self.name}, {self.layout}, {self.data})"


# ---------------------------------------------------------------------------------------
# Boxes


@dataclasses.dataclass(eq=False)
class StorageBox(IRNode):
    data: IRNode

    def get_size(self) -> list[Expr]:
        return self.data.get_size()

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Loader:
        return self.data.make_loader()

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    @property
    def origins(self) -> frozenset[str]:  # type: ignore[override]
        return self.data.origins if isinstance(self.data, Loops) else frozenset()

    def realize(self) -> Buffer:
        if isinstance(self.data, Loops):
            order = self.data.stride_order
            layout = (FlexibleLayout.in_order(self.data.device, self.data.dtype, self.data.get_size(), order) if order
                      else FlexibleLayout.contiguous(self.data.device, self.data.dtype, self.data.get_size()))
            buf = ComputedBuffer(name="", layout=layout, data=self.data)
            V.graph.register_buffer(buf)
            self.data = buf
        assert isinstance(self.data, Buffer), self.data
        return self.data

    def realize_if_costly(self, users: int) -> None:
        """Realization policy for a value with ``users`` consumers: inline it into each (it is
        recomputed there), unless it is big, or several read it and it is costly: many ops, many
        loads, or a transcendental one (GELU before a layer norm, the exp of a softmax: stored
        once and read back, usually by later loops of the same kernel, then written over). Index
        math is not part of the cost: a bilinear upsample's gathers count ~35 index ops each,
        and storing the two read twice wrote two outputs' worth of intermediates (a kernel of
        10.3 ms for an (8, 64, 112, 112) output, where eager's whole call takes 3.8)."""
        if not isinstance(self.data, Pointwise):
            return
        n_ops, n_loads, n_transcendental, all_ops, _ = self.data.opcount()
        if n_ops > MAX_INLINE_OPCOUNT or all_ops > 4 * MAX_INLINE_OPCOUNT or users > 1 and (
                n_ops > REALIZE_OPCOUNT_THRESHOLD or n_loads > REALIZE_READS_THRESHOLD or n_transcendental):
            self.realize()


@dataclasses.dataclass(eq=False)
class TensorBox(IRNode):
    data: IRNode  # StorageBox, or a view over one

    @staticmethod
    def create(data: IRNode) -> TensorBox:
        return TensorBox(StorageBox(data))

    def get_size(self) -> list[Expr]:
        return self.data.get_size()

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Loader:
        return self.data.make_loader()

    @property
    def origins(self) -> frozenset[str]:  # type: ignore[override]
        return self.data.origins

    def storage_box(self) -> StorageBox | None:
        """The storage under this handle, through any views (None: a view of no storage)."""
        storage = self.data
        while not isinstance(storage, StorageBox):
            storage = getattr(storage, "base", None)
            if storage is None:
                return None
        return storage

    def realize(self) -> None:
        """Realize the storage under this handle (views stay views)."""
        storage = self.storage_box()
        if storage is not None:
            storage.realize()

    def __str__(self) -> str:
        return f"TensorBox({self.data})"


# ---------------------------------------------------------------------------------------
# Externs: aten calls the wrapper makes directly.


@dataclasses.dataclass(eq=False)
class ExternKernel(Buffer):
    """A call into an aten op from the wrapper. ``args``/``kwargs`` hold IR buffers or views
    where the op takes tensors, and plain Python values elsewhere."""

    op: Any = None  # torch._ops.OpOverload
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def input_nodes(self) -> list[IRNode]:
        return [a for a in _flatten((self.args, self.kwargs)) if isinstance(a, IRNode)]

    def get_read_names(self) -> list[str]:
        names = []
        for node in self.input_nodes():
            names.append(storage_name(node))
        return names

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self.op}, reads={self.get_read_names()})"


@dataclasses.dataclass(eq=False)
class ExternKernelOut(ExternKernel):
    """An aten ``.out`` call writing into a buffer the wrapper plans (mm, addmm, bmm...)."""


@dataclasses.dataclass(eq=False)
class ExternKernelAlloc(ExternKernel):
    """An aten call that allocates its own output (convolution: aten picks the fastest path
    and layout itself; the ``.out`` variant can be slower)."""


@dataclasses.dataclass(eq=False)
class FallbackKernel(ExternKernel):
    """An op minductor does not lower: the wrapper calls aten and takes what it returns.
    With several outputs ``layout`` is None and ``MultiOutput`` nodes pick them out."""


@dataclasses.dataclass(eq=False)
class MultiOutput(Buffer):
    """Element ``indices`` of a multi-output fallback's result."""

    parent: FallbackKernel = None  # type: ignore[assignment]
    indices: tuple[int, ...] = ()

    def get_read_names(self) -> list[str]:
        return [self.parent.name]


def storage_name(node: IRNode) -> str:
    """Name of the buffer that holds ``node``'s data (through views)."""
    while not isinstance(node, Buffer):
        node = getattr(node, "data", None) if not hasattr(node, "base") else node.base
        if node is None:
            raise RuntimeError("not a realized value")
    return node.name


def _flatten(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return list(itertools.chain.from_iterable(_flatten(o) for o in obj))
    if isinstance(obj, dict):
        return list(itertools.chain.from_iterable(_flatten(o) for o in obj.values()))
    return [obj]
