"""The XLA path's runtime: generated JAX functions, jitted, called on torch tensors via DLPack.

JAX is an optional extra (``pip install minductor[xla]``) and costs over a second to import,
so it is imported only when the first XLA computation is built. An ``XlaComputation`` holds
the generated source (what is dumped is what runs), the ``jax.jit`` of it, and converts
tensors zero-copy in and out. 64-bit dtypes run with JAX's x64 mode on for that call, so
int64/float64 are computed exactly rather than truncated to 32 bits.
"""
from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("minductor")

_X64_DTYPES = frozenset({torch.int64, torch.float64, torch.complex128})
_warned_missing = False


@functools.cache
def jax_available() -> bool:
    """True when ``jax`` imports; the first failure warns once and the XLA path falls back to aten."""
    try:
        import jax
        import jax.numpy  # noqa: F401
    except ImportError as e:
        warn_missing(str(e))
        return False
    return True


def warn_missing(reason: str) -> None:
    global _warned_missing
    if not _warned_missing:
        _warned_missing = True
        warnings.warn(f"minductor: JAX is not available ({reason}); scan and einsum run through aten instead. "
                      "Install the extra with `pip install minductor[xla]`.", stacklevel=3)


def needs_x64(dtypes: Sequence[torch.dtype]) -> bool:
    return any(d in _X64_DTYPES for d in dtypes)


def to_jax(t: torch.Tensor) -> Any:
    """Zero-copy when the strides are compact (any permutation); otherwise a contiguous copy first."""
    import jax

    if t.requires_grad:
        t = t.detach()
    try:
        return jax.dlpack.from_dlpack(t)
    except Exception:  # noqa: BLE001 - broadcast or sliced strides: DLPack in XLA needs a compact buffer
        return jax.dlpack.from_dlpack(t.contiguous())


def to_torch(a: Any) -> torch.Tensor:
    return torch.from_dlpack(a)


def jax_dtype(dtype: torch.dtype) -> Any:
    import jax.numpy as jnp

    return {
        torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
        torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32, torch.int16: jnp.int16,
        torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    }[dtype]


class XlaComputation:
    """A generated JAX function, jitted once; called with and returning torch tensors.

    ``source`` defines ``name``; ``namespace`` supplies the names it uses (jnp, lax, op helpers).
    The call returns a tuple of tensors (one per output of the function).
    """

    def __init__(self, name: str, source: str, namespace: dict[str, Any], x64: bool) -> None:
        import jax

        self.name = name
        self.source = source
        self.x64 = x64
        scope = dict(namespace)
        try:
            exec(compile(source, f"<minductor xla {name}>", "exec"), scope)  # noqa: S102 - our generated code
        except SyntaxError as e:
            raise AssertionError(f"generated JAX source does not parse: {e}\n{source}") from e
        self.fn: Callable[..., Any] = scope[name]
        self.jitted = jax.jit(self.fn)

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import jax

        with jax.enable_x64(self.x64):
            outs = self.jitted(*[to_jax(t) for t in tensors])
        return tuple(to_torch(o) for o in outs)

    def stablehlo(self, specs: Sequence[tuple[Sequence[int], torch.dtype]]) -> str:
        """The lowered StableHLO for inputs of these shapes and dtypes (for debug dumps)."""
        import jax

        with jax.enable_x64(self.x64):
            structs = [jax.ShapeDtypeStruct(tuple(shape), jax_dtype(dtype)) for shape, dtype in specs]
            return self.jitted.lower(*structs).as_text()


def base_namespace() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    return {"jax": jax, "jnp": jnp, "lax": jax.lax}


__all__ = ["XlaComputation", "base_namespace", "jax_available", "jax_dtype", "needs_x64", "to_jax", "to_torch"]
