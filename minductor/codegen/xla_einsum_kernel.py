"""The JAX function for one einsum: ``jnp.einsum`` accumulating floats in fp32 (or fp64)."""
from __future__ import annotations

import functools

import torch

from minductor.codegen.xla import XlaComputation, base_namespace, needs_x64

_LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})


@functools.cache
def einsum_computation(equation: str, dtypes: tuple[torch.dtype, ...], out_dtype: torch.dtype) -> XlaComputation:
    """One cached computation per (equation, dtypes); jax.jit caches per shape inside it."""
    name = f"einsum_{abs(hash((equation, dtypes, out_dtype))) % 10**8:08d}"
    args = ", ".join(f"x{i}" for i in range(len(dtypes)))
    acc = ""
    if out_dtype in _LOW_PRECISION:
        acc = ", preferred_element_type=jnp.float32"  # like bmm: accumulate in fp32, round once
    lines = [
        f"def {name}({args}):",
        f"    out = jnp.einsum({equation!r}, {args}{acc})",
        f"    return (out.astype(jnp.{_jnp_name(out_dtype)}),)",
    ]
    return XlaComputation(name, "\n".join(lines) + "\n", base_namespace(), needs_x64([*dtypes, out_dtype]))


def _jnp_name(dtype: torch.dtype) -> str:
    return {torch.bool: "bool_"}.get(dtype, str(dtype).removeprefix("torch."))


__all__ = ["einsum_computation"]
