"""Transparent huge pages for large fresh CPU buffers.

A fresh large allocation is an ``mmap`` whose pages fault on first write, one 4 KB page at a
time, each zeroed by the kernel. On a 2-core VM (AMD EPYC) writing 32 MB into a fresh buffer
took 12.5 ms, against 0.8 ms into one already faulted; with the buffer's 2 MB-aligned
interior advised ``MADV_HUGEPAGE`` before that first write, 2.2 ms (one fault per 2 MB).
The buffer pool (``buffer_pool.py``) spares the faults of the buffers it keeps across calls;
the others, above all the outputs a training step hands to autograd (saved activations,
gradients), are fresh on every call, and their allocation lines go through ``empty_huge``.

Only Linux with transparent huge pages in ``madvise`` mode is asked: under ``always`` large
mappings get them without asking, under ``never`` not at all. Advice on memory the allocator
hands out again (already faulted) only marks it for the kernel's background collapsing.
``config.huge_page_min_bytes = 0`` (``MINDUCTOR_HUGE_PAGE_MIN_BYTES=0``) turns this off.
"""
from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from minductor import config

HUGE_PAGE = 2 << 20
CPU = torch.device("cpu")  # named on every allocation: a default device set by the user must not move them
MADV_HUGEPAGE = 14
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:
    """libc's ``madvise`` where advising huge pages changes anything, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mode = THP_MODE.read_text()
    except OSError:
        return None
    if "[madvise]" not in mode:
        return None
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge(ptr: int, nbytes: int) -> bool:
    """Ask for huge pages over the 2 MB-aligned part of ``[ptr, ptr + nbytes)``; whether asked."""
    madvise = _madvise()
    start, end = -(-ptr // HUGE_PAGE) * HUGE_PAGE, (ptr + nbytes) // HUGE_PAGE * HUGE_PAGE
    if madvise is None or end <= start:
        return False
    return madvise(start, end - start, MADV_HUGEPAGE) == 0


def empty_huge(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """``torch.empty_strided`` on the CPU, on huge pages when ``nbytes`` is large enough (the
    wrapper's allocation of a large buffer, static or symbolic in size)."""
    tensor = torch.empty_strided(size, stride, dtype=dtype, device=CPU)
    if 0 < config.huge_page_min_bytes <= nbytes:
        advise_huge(tensor.data_ptr(), nbytes)
    return tensor
