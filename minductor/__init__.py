"""minductor: a compact compiler backend for ``torch.compile``.

Use it by name, no import needed: ``torch.compile(model, backend="minductor")``.
Public modules: ``minductor.config`` (flags), ``minductor.metrics`` (counters),
``minductor.nn`` (a scan-based ``GRU``); ``minductor.scan(fn, init, xs)`` runs a loop that
compiles to one XLA scan. ``scan`` and ``nn`` load on first use (JAX only when a kernel is built).
"""
from typing import Any

from minductor import config, metrics

__all__ = ["config", "metrics", "nn", "scan"]


def __getattr__(name: str) -> Any:
    if name == "scan":
        from minductor._scan import scan

        return scan
    if name == "nn":
        import importlib

        return importlib.import_module("minductor.nn")
    raise AttributeError(f"module 'minductor' has no attribute {name!r}")
