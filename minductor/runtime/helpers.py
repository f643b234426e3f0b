"""Small functions the generated wrapper calls at run time."""
from __future__ import annotations

from typing import Sequence

import torch


def assert_size_stride(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], name: str) -> None:
    """Check an input matches the layout the kernels were generated for."""
    if tuple(t.shape) != tuple(size) or any(
        s > 1 and a != b for s, a, b in zip(size, t.stride(), stride)
    ):
        raise AssertionError(
            f"minductor: input {name} has size {tuple(t.shape)} and stride {t.stride()}, but the compiled "
            f"graph expects size {tuple(size)} and stride {tuple(stride)}; this is a guard failure, please report it"
        )


def reinterpret_tensor(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    """A strided alias of ``t``; ``offset`` counts elements from ``t``'s first element."""
    return torch.as_strided(t, size, stride, t.storage_offset() + offset)
