"""Lowerings, registered on import of their thematic modules."""
from minductor.lowering import constructors, extern, indexing, pointwise, reduction, scatter, views, windows, xla  # noqa: F401
from minductor.lowering.registry import SUPPORTED_DTYPES, Unsupported, lowerings

__all__ = ["SUPPORTED_DTYPES", "Unsupported", "lowerings"]
