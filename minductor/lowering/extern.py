"""Extern calls: mm/addmm/bmm/baddbmm/convolution write into buffers the wrapper plans,
and ``fallback`` runs any aten op minductor does not lower."""
from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

from minductor import metrics
from minductor.ir.layout import FixedLayout, FlexibleLayout, channels_last_order, is_channels_last, strides_in_order
from minductor.ir.nodes import (
    ExternKernelAlloc,
    ExternKernelOut,
    FallbackKernel,
    IRNode,
    Loops,
    MultiOutput,
    Pointwise,
    StorageBox,
    TensorBox,
)
from minductor.ir.views import contiguous_copy, realize_input
from minductor.lowering.registry import aten, register_lowering, to_dtype
from minductor.runtime.cache import half_in_float32
from minductor.runtime.helpers import mm_onednn
from minductor.sizevars import to_expr
from minductor.virtualized import V


def layout_of(val: torch.Tensor) -> FixedLayout:
    """The layout of a fake result; a buffer's offset is 0 (wrapper tensors start there)."""
    return FixedLayout(val.device, val.dtype, tuple(to_expr(s) for s in val.shape), tuple(to_expr(s) for s in val.stride()))


def _realize_args(obj: Any) -> Any:
    if isinstance(obj, IRNode):
        return realize_input(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_realize_args(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _realize_args(v) for k, v in obj.items()}
    return obj


def extern_out(op: Any, *args: Any, dtype: torch.dtype | None = None, val: torch.Tensor | None = None,
               **kwargs: Any) -> TensorBox:
    """Call ``op`` (an ``.out`` overload) writing into a newly planned buffer (of the node's
    dtype, or ``dtype``; of the node's fake result's layout, or ``val``'s)."""
    layout = layout_of(V.graph.current_node.meta["val"] if val is None else val)
    node = ExternKernelOut(name="", layout=FixedLayout(layout.device, dtype or layout.dtype, layout.size, layout.stride),
                           op=op, args=_realize_args(args), kwargs=_realize_args(kwargs))
    V.graph.register_buffer(node)
    return TensorBox.create(node)


@register_lowering(aten.mm)
def mm(a: TensorBox, b: TensorBox, val: torch.Tensor | None = None) -> TensorBox:
    """``a @ b``; ``val``: the product's fake result where the node being lowered is not this
    product (a convolution run as one)."""
    product = _vector_product(a, b)
    if product is not None:
        return product
    if _half_as_float(a, b):
        return to_dtype(mm(to_dtype(a, torch.float32), to_dtype(b, torch.float32), _as_float32(val) if val is not None else None),
                        torch.float16)
    if _onednn_mm(a, b):
        from minductor.lowering.views import permute

        # oneDNN's inner product computes a @ w.t(): w is b transposed, a view (any strides)
        a = _contiguous(a)
        if not sympy.sympify(a.get_size()[1]).is_Integer:  # the run-time helper handles k == 0
            return extern_alloc(mm_onednn, a, permute(b, [1, 0]), val=val)
        return extern_alloc(torch.ops.mkldnn._linear_pointwise.default, a, permute(b, [1, 0]), None, "none", [], "", val=val)
    return extern_out(aten.mm.out, a, b, dtype=a.get_dtype(), val=val)


def _vector_product(a: TensorBox, b: TensorBox, wide_result: bool = False, streamed_only: bool = False) -> TensorBox | None:
    """``a @ b`` (batched or not) with one or two output rows or columns (a batch-1 linear layer,
    a decoding step's projections and its attention over the cache, ``v @ M``) as a sum of products, summed in float32 at least: it reads each
    element of the matrix once, where a GEMM library pays its per-call cost (``w @ x`` at
    1024^2 through oneDNN: 90 us, eager 58; a row of sums streams the matrix). Two rows of
    short sums read the matrix twice, from cache, still faster (a batch-2 linear 4096x1024:
    287 -> 217 us); four that way were slower than oneDNN (318 against 420 us), so 3 to
    ``FEW_ROWS`` rows sum column by column, every row of a column in turn, while the matrix's
    row is in L1; 2 to ``SUB_ROWS_MAX`` rows of sums of ``WIDE_ROW`` or more do so reading the
    matrix in streams (``cpp_read_streams``). With ``wide_result``, the sums stay float32 (a
    bias added before the one rounding); with ``streamed_only``, only products that read the
    matrix in streams or have one output row or column are sums."""
    from minductor.codegen.cpp_read_streams import SUB_ROWS_MAX, sub_rows_stream  # (the kernel shapes these sums take)
    from minductor.codegen.loop_shapes import WIDE_ROW
    from minductor.lowering.pointwise import mul
    from minductor.lowering.reduction import sum_
    from minductor.lowering.views import permute, view

    *batch, m, k = (sympy.sympify(e) for e in a.get_size())
    n = sympy.sympify(b.get_size()[-1])
    if not (m.is_Integer and k.is_Integer and n.is_Integer) or int(k) < 2:
        return None
    # long sums of a few rows read the matrix in streams, all rows of a column in each step
    # (cpp_read_streams.sub_rows): column by column at any depth, from 2 rows
    itemsize = min(a.get_dtype().itemsize, b.get_dtype().itemsize)
    streams = (not batch and int(k) >= WIDE_ROW and int(n) >= FEW_ROWS_MIN_COLS and int(m) <= SUB_ROWS_MAX
               and sub_rows_stream(itemsize, int(m)))
    # (column by column: the matrix read along its depth, so not one stored along its columns
    # (a weight gradient's (k, n) activations): LeViT's 8x96 @ 96x256 read its matrix 256
    # floats apart, 274 us; a GEMM call takes a few)
    few_rows = int(m) <= FEW_ROWS and int(n) >= FEW_ROWS_MIN_COLS and (int(k) <= FEW_ROWS_MAX_DEPTH or streams) \
        and not _stored_along_columns(b)
    if min(int(m), int(n)) > 2 and not few_rows:
        return None
    if streamed_only and min(int(m), int(n)) > 1 and not streams:
        return None
    dtype = a.get_dtype()
    if not dtype.is_floating_point or b.get_dtype() != dtype:
        return None
    if int(m) <= 2 or few_rows:
        a = _computed_once(a)
    if int(n) <= 2:
        b = _computed_once(b)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    a, b = to_dtype(a, wide), to_dtype(b, wide)
    one, lead = sympy.Integer(1), len(batch)
    if int(m) == 1:  # (..., k, 1) * (..., k, n), summed over k
        out = sum_(mul(view(a, [*batch, k, one]), b), [lead], keepdim=True)
    elif int(n) == 1:  # (..., m, k) * (..., 1, k), summed over k
        out = sum_(mul(a, view(b, [*batch, one, k])), [lead + 1], keepdim=True)
    elif (int(m) <= 2 and not streams) or not few_rows:  # (..., m, k, 1) * (..., 1, k, n), summed over k
        out = sum_(mul(view(a, [*batch, m, k, one]), view(b, [*batch, one, k, n])), [lead + 1])
    else:  # (..., n, 1, k) * (..., 1, m, k), summed over k: column by column, the rows inside
        b_t = permute(b, [*range(lead), lead + 1, lead])
        out = sum_(mul(view(b_t, [*batch, n, one, k]), view(a, [*batch, one, m, k])), [lead + 2])
        out = permute(out, [*range(lead), lead + 1, lead])
    return out if wide_result else to_dtype(out, dtype)


def _stored_along_columns(b: TensorBox) -> bool:
    """Whether matrix ``b`` (..., k, n) is a buffer (or a view of one) whose columns are
    contiguous, its depth ``k`` strided."""
    layout = _buffer_layout(b)
    return isinstance(layout, FixedLayout) and layout.stride[-1] == 1 and layout.stride[-2] != 1


def _buffer_layout(x: TensorBox) -> Any:
    """The layout of the buffer ``x`` holds, or of the strided view it is (else None)."""
    data = x.data
    return getattr(data.data if isinstance(data, StorageBox) else data, "layout", None)


def _strides_follow(layout: FixedLayout, order: tuple[int, ...]) -> bool:
    """Whether ``layout``'s elements lie in dim ``order`` (strides of size-1 dims do not matter)."""
    want = strides_in_order(layout.size, order)
    return all(size == 1 or have == need for size, have, need in zip(layout.size, layout.stride, want))


def _computed_once(x: TensorBox) -> TensorBox:
    """An operand that a sum of products reads whole for each column (or row) of the other, as
    a contiguous buffer: fused into the product, whatever computes it ran again for every
    column. LeViT's hardswish of a transposed view under an 8x512 @ 512x256 product ran 256
    times (1.0 ms; 0.02 computed once)."""
    arg = realize_input(x)
    if arg.layout.is_contiguous():
        return x
    return TensorBox(StorageBox(contiguous_copy(arg, frozenset({"clone"}))))


def _half_as_float(a: TensorBox, b: TensorBox) -> bool:
    """Whether a half product (or convolution) runs in float32 (``cache.half_in_float32``): on a
    CPU without native half GEMM, eager's is ~75x slower."""
    return half_in_float32(a.get_device(), (a.get_dtype(), b.get_dtype()))


def _contiguous(a: TensorBox) -> IRNode:
    """``a`` as a contiguous buffer, copied by our own kernel where it is a view of other strides.
    oneDNN's inner product takes any weight strides but copies a non-contiguous input with
    aten's ``contiguous()``: a weight gradient's ``dy.t() @ x`` copied its transposed 1024x1024
    ``dy.t()`` in 1.4-1.5 ms a call (a transformer block's training step: 1.5 of 20 ms in such
    copies), where our tiled copy takes 0.11 ms."""
    arg = realize_input(a)
    return arg if arg.layout.is_contiguous() else contiguous_copy(a, frozenset({"clone"}))


# Products with 3 to FEW_ROWS rows (a small batch's linear layer), at least FEW_ROWS_MIN_COLS
# columns and at most FEW_ROWS_MAX_DEPTH summed are sums too, column by column with the rows
# inside (the matrix's row in L1 for all of them): batch-4 linear 4096x1024 336 -> 191 us,
# batch-8 527 -> 366, 1024x1024 129 -> 56 and 117 -> 95 against oneDNN; summing 4096, equal at
# 4 rows, 8% slower at 8 (11008x4096: 7.5 ms against 6.9)
FEW_ROWS = 8
FEW_ROWS_MIN_COLS = 256
FEW_ROWS_MAX_DEPTH = 1024

ONEDNN_MIN_MACS = 1 << 20  # smaller products pay more in oneDNN's per-call cost than they gain ("auto": see
# runtime/cache.onednn_auto_min_macs)


def _onednn_mm(a: TensorBox, b: TensorBox) -> bool:
    """Whether ``a @ b`` runs on oneDNN (``config.cpu_gemm``; "auto": where it beats MKL, see
    ``onednn_gemm_pays_off``): float32 on CPU with C++ kernels, a static non-zero output width, a reduced width
    that is symbolic (a weight gradient's batch, checked at run time: oneDNN rejects an
    empty reduction) or a non-zero integer, at least ``ONEDNN_MIN_MACS`` multiply-adds at the
    size hints (under "auto", ``onednn_auto_min_macs``)."""
    from minductor import config
    from minductor.runtime.cache import onednn_auto_min_macs, onednn_gemm_pays_off

    if config.cpu_gemm == "mkl" or (config.cpu_gemm == "auto" and not onednn_gemm_pays_off()):
        return False
    if config.cpu_gemm not in ("auto", "onednn"):
        raise config.ConfigError(f"config.cpu_gemm (MINDUCTOR_CPU_GEMM) is {config.cpu_gemm!r}: use 'auto', 'mkl' or 'onednn'")
    if a.get_device().type != "cpu" or a.get_dtype() != torch.float32 or b.get_dtype() != torch.float32:
        return False
    if config.cpu_backend != "cpp":  # Triton kernels on CPU tensors keep mm.out for the matmul template
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    m, k, n = (sympy.sympify(e) for e in (*a.get_size(), b.get_size()[1]))
    if not (n.is_Integer and int(n) > 0 and (not k.is_number or (k.is_Integer and int(k) > 0))):
        return False
    least = onednn_auto_min_macs() if config.cpu_gemm == "auto" else ONEDNN_MIN_MACS
    return V.graph.sizevars.hint(m) * V.graph.sizevars.hint(k) * int(n) >= least


def extern_alloc(op: Any, *args: Any, val: torch.Tensor | None = None) -> TensorBox:
    """Call ``op``, which allocates its result: a buffer of the fake result's layout (the node's,
    or ``val``'s) and the first argument's dtype (the wrapper asserts them where sizes are static)."""
    layout = layout_of(V.graph.current_node.meta["val"] if val is None else val)
    layout = FixedLayout(layout.device, args[0].get_dtype(), layout.size, layout.stride)
    node = ExternKernelAlloc(name="", layout=layout, op=op, args=_realize_args(args))
    V.graph.register_buffer(node)
    return TensorBox.create(node)


@register_lowering(aten.bmm)
def bmm(a: TensorBox, b: TensorBox) -> TensorBox:
    product = _vector_product(a, b)  # (attention's scores and values for one query while decoding)
    if product is not None:
        return product
    if _half_as_float(a, b):
        return to_dtype(bmm(to_dtype(a, torch.float32), to_dtype(b, torch.float32)), torch.float16)
    return extern_out(aten.bmm.out, a, b, dtype=a.get_dtype())


@register_lowering(aten.addmm)
def addmm(bias: TensorBox, a: TensorBox, b: TensorBox, *, beta: Any = 1, alpha: Any = 1) -> TensorBox:
    """``bias + a @ b``. For C++ kernels, a vector bias becomes a pointwise add after ``mm``,
    which fuses into the kernel that next reads the product (GELU, a residual add):
    ``addmm.out`` would first copy the broadcast bias into the output and then have the GEMM
    read it back (beta=1)."""
    if _half_as_float(a, b) and isinstance(bias, IRNode):
        return _half_as_float_with_bias(mm(to_dtype(a, torch.float32), to_dtype(b, torch.float32)), bias, beta, alpha)
    if beta == 1 and alpha == 1 and isinstance(bias, IRNode):
        from minductor.lowering.registry import lowerings

        if _bias_in_epilogue(bias, a):
            return lowerings[aten.add.Tensor](mm(a, b), bias)
        # a 16-bit linear layer of one row, or of a few read in streams: the sums in float32,
        # the bias added before the one rounding, as the GEMM's epilogue does (a batch-1
        # bfloat16 decoding step's MLP went to aten's addmm, reading its weights at 9 GB/s on
        # one thread; 3-4 bf16 rows of 1024 summed column by column on one stream: 1.13x
        # slower than aten's)
        product = _vector_product(a, b, wide_result=True, streamed_only=True) \
            if _bias_in_epilogue(bias, a, (torch.bfloat16, torch.float16)) else None
        if product is not None:
            return to_dtype(lowerings[aten.add.Tensor](product, bias), a.get_dtype())
    return extern_out(aten.addmm.out, bias, a, b, beta=beta, alpha=alpha)


def _half_as_float_with_bias(product: TensorBox, bias: TensorBox, beta: Any, alpha: Any) -> TensorBox:
    """``beta * bias + alpha * product`` of a float32 product, in float32, rounded to half once."""
    from minductor.lowering.registry import lowerings

    add, mul = lowerings[aten.add.Tensor], lowerings[aten.mul.Tensor]
    scaled = product if alpha == 1 else mul(product, alpha)
    bias = to_dtype(bias, torch.float32)
    return to_dtype(add(scaled, bias if beta == 1 else mul(bias, beta)), torch.float16)


def _bias_in_epilogue(bias: Any, a: TensorBox, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)) -> bool:
    from minductor import config

    return (isinstance(bias, IRNode) and len(bias.get_size()) == 1 and a.get_device().type == "cpu"
            and config.cpu_backend == "cpp" and a.get_dtype() in dtypes and bias.get_dtype() == a.get_dtype())


@register_lowering(aten.baddbmm)
def baddbmm(bias: TensorBox, a: TensorBox, b: TensorBox, *, beta: Any = 1, alpha: Any = 1) -> TensorBox:
    if _half_as_float(a, b) and isinstance(bias, IRNode):
        return _half_as_float_with_bias(bmm(to_dtype(a, torch.float32), to_dtype(b, torch.float32)), bias, beta, alpha)
    return extern_out(aten.baddbmm.out, bias, a, b, beta=beta, alpha=alpha)


@register_lowering(aten.convolution)
def convolution(x: TensorBox, weight: TensorBox, bias: Any, stride: Any, padding: Any, dilation: Any,
                transposed: bool, output_padding: Any, groups: int) -> TensorBox:
    """An allocating aten call. In CPU inference graphs the input goes channels-last first
    (oneDNN's direct NHWC convolutions: 4-12x faster than NCHW on a 3-channel input here);
    the output is then channels-last too, and the pointwise ops after it keep that layout."""
    return _convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                        val=V.graph.current_node.meta["val"])


def _convolution(x: TensorBox, weight: TensorBox, bias: Any, *args: Any, val: torch.Tensor) -> TensorBox:
    if _half_as_float(x, weight):  # (as half products: eager's half convolution took 233 ms, float32 4.1)
        bias = to_dtype(bias, torch.float32) if isinstance(bias, IRNode) else bias
        out = _convolution(to_dtype(x, torch.float32), to_dtype(weight, torch.float32), bias, *args,
                           val=_as_float32(val))
        return to_dtype(out, torch.float16)
    as_rows = _pointwise_conv1d_as_product(x, weight, bias, *args, val=val)
    if as_rows is not None:
        return as_rows
    if channels_last_conv(x):
        as_product = _pointwise_conv_as_mm(x, weight, bias, *args, val=val)
        if as_product is not None:
            return as_product
        x, weight = require_channels_last(x), _weight_channels_last(weight)
    args = _realize_args((x, weight, bias, *args))
    val = _replay_with_layouts(aten.convolution.default, args, {}, val)
    node = ExternKernelAlloc(name="", layout=layout_of(val), op=aten.convolution.default, args=args)
    V.graph.register_buffer(node)
    return TensorBox.create(node)


@register_lowering(aten.convolution_backward)
def convolution_backward(grad_output: TensorBox, x: TensorBox, weight: TensorBox, *args: Any) -> Any:
    """aten's, with the output's gradient and the input channels-last when the forward ran
    so: oneDNN would otherwise reorder them with aten copies, where ours fuse into the kernel
    that computes the gradient (or copy in a tiled kernel: a saved graph input is the user's
    NCHW tensor, and a transposed convolution's backward of (8, 64, 56, 56) by 2x2 at stride 2
    with it NCHW and the gradient channels-last took 11.9 ms, two 1.7 ms aten copies in it)."""
    val = V.graph.current_node.meta["val"]
    if _half_as_float(x, weight) and grad_output.get_dtype() == torch.float16:
        grads = fallback(aten.convolution_backward.default,
                         (*(to_dtype(t, torch.float32) for t in (grad_output, x, weight)), *args), {}, _as_float32(val))
        return type(grads)(to_dtype(g, torch.float16) if isinstance(g, IRNode) else g for g in grads)
    as_rows = _pointwise_conv1d_backward_as_products(grad_output, x, weight, *args, val=val)
    if as_rows is not None:
        return as_rows
    if channels_last_conv(x):
        x, grad_output = require_channels_last(x), require_channels_last(grad_output)
    return fallback(aten.convolution_backward.default, (grad_output, x, weight, *args), {}, val)


def _pointwise_conv1d_backward_as_products(grad_output: TensorBox, x: TensorBox, weight: TensorBox, bias_sizes: Any,
                                           stride: Any, padding: Any, dilation: Any, transposed: bool,
                                           output_padding: Any, groups: int, output_mask: Any,
                                           val: Any) -> tuple[Any, ...] | None:
    """The backward of a convolution ``_pointwise_conv1d_as_product`` runs as products (its input
    saved (N, L, C), as that forward keeps it), as products too: over the rows of channels,
    the input's gradient ``dy @ W`` and the weight's ``dy^T @ x`` (per group a batch of one
    ``bmm``), the bias's a sum. aten's backward copied the saved input and the gradient of each
    group: SqueezeBERT's training step spent 3.2 ms in its copies."""
    from minductor.lowering.registry import lowerings
    from minductor.lowering.views import permute, view

    shape = _conv1d_as_rows(x, weight, stride, padding, dilation, transposed, groups) \
        if grad_output.get_dtype() == torch.float32 else None
    if shape is None:
        return None
    n, c, length, c_out = shape
    cg, og, rows_n = c // groups, c_out // groups, n * length
    _rows_of_channels(grad_output)  # (a value not yet laid out: as rows; stored (N, C, L): copied below)
    dy = view(permute(grad_output, [0, 2, 1]), [rows_n, c_out])
    xs = view(permute(x, [0, 2, 1]), [rows_n, c])
    w = view(weight, [c_out, c])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if groups == 1:
            gi = mm(dy, w, val=_fake_like(val[0], val[0].shape[0] * val[0].shape[2], c))
        else:
            gi = _grouped_rows_product(permute(view(dy, [rows_n, groups, og]), [1, 0, 2]), view(w, [groups, og, cg]),
                                       rows_n, groups, cg, x)
        grad_input = permute(view(gi, [n, length, c]), [0, 2, 1])
    if output_mask[1]:
        if groups == 1:
            gw = mm(permute(dy, [1, 0]), xs, val=_fake_like(val[1], c_out, c))
        else:
            gw = extern_out(aten.bmm.out, permute(view(dy, [rows_n, groups, og]), [1, 2, 0]),
                            permute(view(xs, [rows_n, groups, cg]), [1, 0, 2]), val=_fake_like(val[1], groups, og, cg))
        grad_weight = view(gw, [c_out, cg, 1])
    if output_mask[2]:
        grad_bias = lowerings[aten.sum.dim_IntList](grad_output, [0, 2])
    return grad_input, grad_weight, grad_bias


def _conv1d_as_rows(x: TensorBox, weight: TensorBox, stride: Any, padding: Any, dilation: Any, transposed: bool,
                    groups: int) -> tuple[sympy.Expr, int, sympy.Expr, int] | None:
    """(N, C, L, C_out) of a kernel-1 conv1d (stride 1, no padding, float32, CPU C++ kernels,
    static channels) whose input is stored (N, L, C), laid out so where still open: the
    convolution (and its backward) then runs as products of rows of channels; else None."""
    from minductor import config

    sizes = [sympy.sympify(e) for e in (*x.get_size(), *weight.get_size())]
    if (transposed or len(sizes) != 6 or x.get_device().type != "cpu" or config.cpu_backend != "cpp"
            or list(stride) != [1] or list(padding) != [0] or list(dilation) != [1]
            or x.get_dtype() != torch.float32 or weight.get_dtype() != torch.float32
            or not all(e.is_Integer for e in sizes[1:2] + sizes[3:]) or sizes[5] != 1
            or int(sizes[1]) % groups or int(sizes[3]) % groups or not _rows_of_channels(x)):
        return None
    return sizes[0], int(sizes[1]), sizes[2], int(sizes[3])


def _fake_like(like: torch.Tensor, *size: Any) -> torch.Tensor:
    """A fake contiguous result of ``size`` in ``like``'s fake mode, of its dtype and device."""
    with like.fake_mode:
        return like.new_empty(size)


def _grouped_rows_product(a: TensorBox, b: TensorBox, rows: sympy.Expr, groups: int, cols: int, like: TensorBox) -> TensorBox:
    """``bmm(a, b)`` of (groups, rows, k) by (groups, k, cols), each group's result written to
    its columns of one (rows, groups * cols) buffer: a (rows, groups * cols) view of it."""
    from minductor.lowering.views import permute, view

    layout = FixedLayout(like.get_device(), torch.float32, (sympy.Integer(groups), rows, sympy.Integer(cols)),
                         (sympy.Integer(cols), sympy.Integer(groups * cols), sympy.Integer(1)))
    node = ExternKernelOut(name="", layout=layout, op=aten.bmm.out, args=_realize_args((a, b)), kwargs={})
    V.graph.register_buffer(node)
    return view(permute(TensorBox.create(node), [1, 0, 2]), [rows, groups * cols])


def _as_float32(val: Any) -> Any:
    """A graph's fake result(s) as float32, same shapes and strides."""
    def convert(t: torch.Tensor) -> torch.Tensor:
        with t.fake_mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=torch.float32, device=t.device)
    return pytree.tree_map_only(torch.Tensor, convert, val)


def _pointwise_conv_as_mm(x: TensorBox, weight: TensorBox, bias: Any, stride: Any, padding: Any, dilation: Any,
                          transposed: bool, output_padding: Any, groups: int, val: torch.Tensor) -> TensorBox | None:
    """A 1x1 convolution (no padding, no groups, float32) of a channels-last input as a product:
    the input's pixels (every ``stride``-th) are rows of channels, ``(N*H*W, C_in) @ (C_in, C_out)``,
    whose result is the output channels-last. oneDNN's convolution pays a per-call cost that
    dwarfs a small layer's work (HF ResNet's bottlenecks at (4, 32, 16, 16) -> 8 channels: 34.7
    us channels-last, 13.5 through aten's NCHW GEMM path; as a product a few); larger products
    go to oneDNN's inner product or MKL as ``mm`` decides, and few pixels (a squeeze-and-
    excitation's pooled 1x1 maps) sum as few-row products."""
    from minductor.lowering.registry import lowerings
    from minductor.lowering.views import permute, slice_, view

    sizes = [sympy.sympify(e) for e in (*x.get_size(), *weight.get_size())]
    if (transposed or groups != 1 or any(p != 0 for p in padding) or any(d != 1 for d in dilation)
            or x.get_dtype() != torch.float32 or weight.get_dtype() != torch.float32
            or not all(e.is_Integer for e in sizes) or sizes[6:] != [1, 1]):
        return None
    n, c = int(sizes[0]), int(sizes[1])
    c_out, h, w = int(sizes[4]), int(val.shape[2]), int(val.shape[3])
    pixels = permute(require_channels_last(x), [0, 2, 3, 1])  # (N, H, W, C_in), contiguous
    for dim, step in ((1, stride[0]), (2, stride[1])):
        pixels = slice_(pixels, dim, 0, None, step)
    rows, weights = view(pixels, [n * h * w, c]), permute(view(weight, [c_out, c]), [1, 0])
    if _onednn_mm(rows, weights):
        return None
    if any(step != 1 for step in stride):  # (every stride-th pixel, gathered by a copy kernel named for the convolution)
        rows = TensorBox(StorageBox(contiguous_copy(rows, frozenset({"convolution"}))))
    out = mm(rows, weights, val=_fake_like(val, n * h * w, c_out))
    if isinstance(bias, IRNode):
        out = lowerings[aten.add.Tensor](out, bias)
    return permute(view(out, [n, h, w, c_out]), [0, 3, 1, 2])


def _pointwise_conv1d_as_product(x: TensorBox, weight: TensorBox, bias: Any, stride: Any, padding: Any, dilation: Any,
                                 transposed: bool, output_padding: Any, groups: int,
                                 val: torch.Tensor) -> TensorBox | None:
    """A kernel-1 ``conv1d`` (stride 1, no padding, float32, CPU) of an input stored with its
    channels innermost, (N, L, C) -- the transpose of a (batch, length, channels) activation, as
    SqueezeBERT's and ConvBERT's pointwise convolutions, a conformer's, read theirs -- or not yet
    laid out (then it is, so), as a product over its positions: ``(N*L, C) @ (C, C_out)``, per
    group a batch of one (``bmm`` writing each group's columns of one (N*L, C_out) buffer). The
    output is (N, C_out, L) with its channels innermost, as the input. aten's convolution copies
    such an input contiguous, and with groups narrows and copies each group and concatenates the
    results: SqueezeBERT's layers (2, 256 -> 256, 128) in 4 groups 189 us a call against 99 as a
    product, 1024 -> 256 in 4 groups 1178 against 364, 256 -> 256 ungrouped 401 against 329 (one
    thread). An input stored (N, C, L) stays aten's (its rows would need a transposing copy)."""
    from minductor.lowering.registry import lowerings
    from minductor.lowering.views import permute, view

    shape = _conv1d_as_rows(x, weight, stride, padding, dilation, transposed, groups)
    if shape is None:
        return None
    n, c, length, c_out = shape
    rows = view(permute(x, [0, 2, 1]), [n * length, c])  # (N*L, C): a view of the (N, L, C) storage
    cg, og = c // groups, c_out // groups
    if groups == 1:
        out = mm(rows, permute(view(weight, [c_out, c]), [1, 0]), val=_fake_like(val, val.shape[0] * val.shape[2], c_out))
    else:  # group g's rows of channels times its (C/g, C_out/g) weight
        out = _grouped_rows_product(permute(view(rows, [n * length, groups, cg]), [1, 0, 2]),
                                    permute(view(weight, [groups, og, cg]), [0, 2, 1]), n * length, groups, og, x)
    if isinstance(bias, IRNode):
        out = lowerings[aten.add.Tensor](out, bias)
    return permute(view(out, [n, length, c_out]), [0, 2, 1])


def _rows_of_channels(x: TensorBox) -> bool:
    """Whether (N, C, L) ``x`` is stored (N, L, C), made so where its layout is still open."""
    order = (0, 2, 1)
    if _lay_out_if_open(x, order):
        return True
    if isinstance(x.data, StorageBox) and not isinstance(_buffer_layout(x), FixedLayout):
        return False
    return _strides_follow(realize_input(x).layout, order)  # a buffer or a view: of (N, L, C) storage?


def _lay_out_if_open(x: TensorBox, order: tuple[int, ...]) -> bool:
    """Store ``x`` in dim ``order`` where its layout is still open (an unrealized value is
    realized so, a buffer of flexible strides takes them); whether it was."""
    data = x.data
    if isinstance(data, StorageBox) and isinstance(data.data, Loops) and type(data.data) is Pointwise:
        data.data.stride_order = order
        data.realize()
        return True
    buf = data.data if isinstance(data, StorageBox) else data
    layout = getattr(buf, "layout", None)
    if type(layout) is FlexibleLayout:
        buf.layout = FlexibleLayout.in_order(layout.device, layout.dtype, layout.size, order)
        return True
    return False


def channels_last_conv(x: TensorBox) -> bool:
    """Whether a convolution reads ``x`` (or a tensor of its kind) channels-last. Transposed
    ones too: oneDNN's NCHW transposed convolution of (8, 64, 56, 56) by 2x2 at stride 2
    took 17.2 ms, channels-last 1.1."""
    return (x.get_device().type == "cpu" and len(x.get_size()) == 4
            and x.get_dtype() in (torch.float32, torch.bfloat16)
            and all(sympy.sympify(s).is_Integer for s in x.get_size()) and torch.backends.mkldnn.is_available())


def _weight_channels_last(weight: TensorBox) -> TensorBox:
    """A channels-last convolution's weight, copied channels-last by our kernel unless its
    elements already lie so (a 1x1 filter's contiguous weight: strides of size-1 dims do not
    matter). aten's convolution would copy it itself, slower: (64, 64, 3, 3) 27 us a call of a
    (4, 64, 4, 4) convolution, one thread, where the copy kernel takes a few; TorchInductor copies
    the weights the same way."""
    layout, order = _buffer_layout(weight), channels_last_order(len(weight.get_size()))
    if isinstance(layout, FixedLayout) and order is not None and _strides_follow(layout, order):
        return weight
    return require_channels_last(weight)


def require_channels_last(x: TensorBox) -> TensorBox:
    """``x`` stored channels-last: an unrealized value is realized that way, anything else
    is copied (a pointwise kernel) unless it already is."""
    order = channels_last_order(len(x.get_size()))
    if _lay_out_if_open(x, order):
        return x
    layout = _buffer_layout(x)
    if isinstance(layout, FixedLayout) and is_channels_last(layout):
        return x
    copy = Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), list(x.get_size()),
                     origins=x.origins | {"convolution"}, stride_order=order)
    box = TensorBox.create(copy)
    box.data.realize()
    return box


def tangent_in_saved_layout(box: TensorBox, example: torch.Tensor, inputs: list[Any]) -> TensorBox:
    """A backward graph's incoming NCHW gradient, copied channels-last (a tiled kernel) when a
    saved activation of its shape is channels-last: the user's gradient of a channels-last
    convolution's output, which the batch norm backward reduces together with the saved
    activations. Read mixed, each per-channel sum is strided in one of them (ResNet block, 8x64x32x32
    training step: that kernel took 1.15 ms; copy and sums ~0.1 ms)."""
    cl = torch.channels_last
    if (example.dim() != 4 or example.device.type != "cpu" or example.dtype not in (torch.float32, torch.bfloat16)
            or not _static(example) or not example.is_contiguous() or example.is_contiguous(memory_format=cl)):
        return box  # (convolutions run channels-last at static sizes only; no guards on symbolic ones)
    if any(isinstance(t, torch.Tensor) and _static(t) and t.shape == example.shape and t.is_contiguous(memory_format=cl)
           and not t.is_contiguous() for t in inputs):
        return require_channels_last(box)
    return box


def _static(t: torch.Tensor) -> bool:
    return not any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def fallback(op: Any, args: Any, kwargs: Any, val: Any) -> Any:
    """Run ``op`` through aten: a graph never fails to compile because an op is missing."""
    metrics.fallback_ops[str(op.overloadpacket if hasattr(op, "overloadpacket") else op)] += 1
    args, kwargs = _realize_args(args), _realize_args(kwargs)
    val = _replay_with_layouts(op, args, kwargs, val)
    layout = layout_of(val) if isinstance(val, torch.Tensor) else None
    node = FallbackKernel(name="", layout=layout, op=op, args=args, kwargs=kwargs)  # type: ignore[arg-type]
    V.graph.register_buffer(node)
    if isinstance(val, torch.Tensor):
        return TensorBox.create(node)
    return _pick_outputs(node, val, ())


def _replay_with_layouts(op: Any, args: Any, kwargs: Any, val: Any) -> Any:
    """The fallback's result as aten computes it from the inputs' layouts in *this* graph.

    The graph's fake result assumed eager's input strides; minductor may lay an intermediate
    out differently, and ops like sort or slice_scatter keep their input's strides. Rerun the
    op on fake tensors with minductor's layouts; keep ``val`` when that is not possible
    (symbolic layouts, an op fake tensors cannot run) or gives other shapes or dtypes.
    """
    leaves = [v for v in pytree.tree_leaves(val) if isinstance(v, torch.Tensor)]
    mode = getattr(leaves[0], "fake_mode", None) if leaves else None
    inputs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, IRNode)]
    if mode is None or not inputs:
        return val
    try:
        with mode:
            fake_args, fake_kwargs = pytree.tree_map_only(IRNode, _fake_of, (args, kwargs))
            out = op(*fake_args, **fake_kwargs)
    except Exception:  # noqa: BLE001 - any failure: keep the graph's own result
        return val
    out_leaves, spec = pytree.tree_flatten(out)
    val_leaves, val_spec = pytree.tree_flatten(val)
    if spec != val_spec or any(
        isinstance(v, torch.Tensor) != isinstance(o, torch.Tensor)
        or isinstance(v, torch.Tensor) and (v.shape != o.shape or v.dtype != o.dtype or v.device != o.device)
        for v, o in zip(val_leaves, out_leaves)
    ):
        return val
    return out


def _fake_of(node: IRNode) -> torch.Tensor:
    """A fake tensor with ``node``'s size, strides and offset (raises if any is symbolic)."""
    layout = node.layout  # a realized buffer or a ReinterpretView
    exprs = [*layout.size, *layout.stride, layout.offset, layout.storage_numel()]
    if not all(sympy.sympify(e).is_Integer for e in exprs):
        raise ValueError("symbolic layout")
    base = torch.empty_strided((int(layout.storage_numel()),), (1,), dtype=layout.dtype, device=layout.device)
    return base.as_strided([int(s) for s in layout.size], [int(s) for s in layout.stride], int(layout.offset))


def _pick_outputs(node: FallbackKernel, val: Any, indices: tuple[int, ...]) -> Any:
    if isinstance(val, torch.Tensor):
        out = MultiOutput(name="", layout=layout_of(val), parent=node, indices=indices)
        V.graph.register_buffer(out)
        return TensorBox.create(out)
    if isinstance(val, (list, tuple)):
        return type(val)(_pick_outputs(node, v, indices + (i,)) for i, v in enumerate(val))
    return val
