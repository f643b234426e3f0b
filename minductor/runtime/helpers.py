"""Small functions the generated wrapper calls at run time."""
from __future__ import annotations

from typing import Sequence

import torch


def assert_size_stride(t: torch.Tensor, size: Sequence[int | None], stride: Sequence[int | None], name: str) -> None:
    """Check an input matches the layout the kernels were generated for (None: symbolic)."""
    if t is None:
        return  # an effect token: AOT passes None at run time
    if len(t.shape) != len(size) or any(e is not None and a != e for a, e in zip(t.shape, size)) or any(
        s > 1 and e is not None and a != e for s, a, e in zip(t.shape, t.stride(), stride)
    ):
        raise AssertionError(
            f"minductor: input {name} has size {tuple(t.shape)} and stride {t.stride()}, but the compiled "
            f"graph expects size {tuple(size)} and stride {tuple(stride)}; this is a guard failure, please report it"
        )


def reinterpret_tensor(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    """A strided alias of ``t``; ``offset`` counts elements from ``t``'s first element."""
    return torch.as_strided(t, size, stride, t.storage_offset() + offset)
