"""Lowerings, registered on import of their thematic modules."""
from minductor.lowering import (  # noqa: F401
    constructors,
    extern,
    indexing,
    pads,
    pointwise,
    random,
    reduction,
    scan,
    scatter,
    views,
    windows,
    xla,
)
from minductor.lowering.registry import SUPPORTED_DTYPES, Unsupported, lowerings

__all__ = ["SUPPORTED_DTYPES", "Unsupported", "lowerings"]
