"""The three context-scoped globals of the compiler: ``V.ops``, ``V.graph`` and ``V.kernel``.

IR bodies call ``ops.*``; which handler answers (dependency recorder, printer, C++ emitter)
depends on what is installed here. Everything else is passed explicitly.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class _Virtualized(threading.local):
    def __init__(self) -> None:
        self._ops: Any = None
        self._graph: Any = None
        self._kernel: Any = None

    @property
    def ops(self) -> Any:
        if self._ops is None:
            raise RuntimeError("no ops handler installed: call inside `with V.set_ops(handler)`")
        return self._ops

    @property
    def graph(self) -> Any:
        if self._graph is None:
            raise RuntimeError("no graph installed: call inside `with V.set_graph(graph)`")
        return self._graph

    @property
    def kernel(self) -> Any:
        if self._kernel is None:
            raise RuntimeError("no kernel installed: call inside `with V.set_kernel(kernel)`")
        return self._kernel

    @contextlib.contextmanager
    def set_ops(self, handler: Any) -> Iterator[Any]:
        prior, self._ops = self._ops, handler
        try:
            yield handler
        finally:
            self._ops = prior

    @contextlib.contextmanager
    def set_graph(self, graph: Any) -> Iterator[Any]:
        prior, self._graph = self._graph, graph
        try:
            yield graph
        finally:
            self._graph = prior

    @contextlib.contextmanager
    def set_kernel(self, kernel: Any) -> Iterator[Any]:
        prior, self._kernel = self._kernel, kernel
        try:
            yield kernel
        finally:
            self._kernel = prior


V = _Virtualized()
