"""minductor: a compact compiler backend for ``torch.compile``.

Use it by name, no import needed: ``torch.compile(model, backend="minductor")``.
Public modules: ``minductor.config`` (flags), ``minductor.metrics`` (counters).
"""
from minductor import config, metrics

__all__ = ["config", "metrics"]
