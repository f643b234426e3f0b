"""Small functions the generated wrapper calls at run time."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._C._dynamo.guards import _reinterpret_tensor
from torch._C._dynamo.guards import assert_size_stride as _cpp_assert_size_stride


def assert_size_stride(t: torch.Tensor, size: Sequence[int | None], stride: Sequence[int | None], name: str) -> None:
    """Check an input matches the layout the kernels were generated for (None: symbolic).

    A static layout is checked by torch's C++ check first (0.7 us per input against 2.8 for
    the Python one, paid on every call of every graph); the Python check words the error.
    """
    if t is None:
        return  # an effect token: AOT passes None at run time
    if None not in size and None not in stride:  # the C++ check takes ints only
        try:
            _cpp_assert_size_stride(t, size, stride)
            return
        except AssertionError:
            pass
    if len(t.shape) != len(size) or any(e is not None and a != e for a, e in zip(t.shape, size)) or any(
        s > 1 and e is not None and a != e for s, a, e in zip(t.shape, t.stride(), stride)
    ):
        raise AssertionError(
            f"minductor: input {name} has size {tuple(t.shape)} and stride {t.stride()}, but the compiled "
            f"graph expects size {tuple(size)} and stride {tuple(stride)}; this is a guard failure, please report it"
        )


def dumped_constants(module_file: str) -> dict[str, torch.Tensor]:
    """The tensors a graph holds, saved by the debug dump beside its ``output_code.py``
    (``runtime/loader.py``): what the module reads when it runs on its own."""
    from pathlib import Path

    from minductor.runtime.loader import DUMPED_CONSTANTS

    path = Path(module_file).parent / DUMPED_CONSTANTS
    return torch.load(path) if path.exists() else {}


def restride(t: torch.Tensor, size: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    """An aten fallback's result laid out as the compiled graph assumed: ``t`` itself when its
    strides are those (dims of extent 0 or 1 aside), else a copy with them. Such an op's
    output layout may follow its inputs' (the CPU flash attention's is ``empty_like(query)``):
    the graph was traced with eager's input layouts and later views of the result were
    generated for its traced strides, while our inputs may be laid out otherwise."""
    if all(n <= 1 or a == e for n, a, e in zip(size, t.stride(), stride)):
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


def reinterpret_tensor(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    """A strided alias of ``t``; ``offset`` counts elements from ``t``'s first element.

    The alias shares ``t``'s storage without being an autograd view of it (as_strided's
    would be): a graph output made this way left a forward graph's autograd Function as a
    view created inside it, which autograd forbids modifying in place (Hubert's masked
    ``hidden_states[mask] = embed`` after a graph break failed). Cheaper per call, too."""
    return _reinterpret_tensor(t, size, stride, offset)


def mm_onednn(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w.t()`` on oneDNN, for a reduced width known only at run time: an empty reduction,
    which oneDNN rejects, gives the zeros a matrix product gives."""
    if a.shape[1] == 0:
        return a.new_zeros((a.shape[0], w.shape[0]))
    return torch.ops.mkldnn._linear_pointwise.default(a, w, None, "none", [], "")


def rand_strided(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A random tensor with the given size and strides (for standalone wrapper runs)."""
    numel = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
    if dtype == torch.bool:
        storage = torch.rand(numel) > 0.5
    elif dtype.is_floating_point:
        storage = torch.randn(numel, dtype=dtype)
    else:
        storage = torch.randint(0, 8, (numel,), dtype=dtype)
    return torch.as_strided(storage, tuple(size), tuple(stride))


def print_call_time(call: Callable[[list[Any]], Any], make_inputs: Callable[[], list[Any]]) -> None:
    """Time a generated ``call`` on fresh random inputs; print the median."""
    from torch.utils import benchmark

    inputs = make_inputs()
    timer = benchmark.Timer("call(list(inputs))", globals={"call": call, "inputs": inputs},
                            num_threads=torch.get_num_threads())
    median = timer.blocked_autorange(min_run_time=1.0).median
    print(f"{median * 1e3:.3f} ms per call (median)")


def check_dtype(t: torch.Tensor, dtype: torch.dtype, op: str) -> torch.Tensor:
    """``t``, an aten fallback's result, when of the dtype the graph was compiled for. The graph
    takes a fallback's dtype from the op's fake (meta) kernel; where that disagrees with the
    real kernel (``_batch_norm_with_update`` on bfloat16 once said float32 statistics), the
    kernels after it would read its bytes as the other dtype: a clear error instead."""
    if t.dtype != dtype:
        raise RuntimeError(f"minductor: aten fallback {op} returned {t.dtype} where its fake kernel said {dtype}; "
                           "the graph cannot read it. Please report it; backend='aot_eager' runs this graph meanwhile")
    return t


def check_index_error(flag: torch.Tensor | int, kernel: str) -> None:
    """Raise eager's error when a kernel flagged one: 1 = an out-of-range index (gather, index,
    scatter...), 2 = an integer division by zero. ``flag``: the C++ kernel's (an int) or a
    Triton kernel's (a one-element tensor)."""
    code = flag if isinstance(flag, int) else int(flag[0])
    if code & 2:
        raise RuntimeError(f"ZeroDivisionError (minductor: integer division by zero in kernel {kernel}, "
                           "as eager raises for this input)")
    if code:
        raise IndexError(f"minductor: index out of range in kernel {kernel} (an index tensor holds a value outside "
                         "the indexed dimension); eager PyTorch raises the same error for this input")
