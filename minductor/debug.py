"""Debug dumps: with ``config.debug`` each compiled graph gets a folder of its artifacts.

``<config.debug_dir>/graph_<NNN>_<kind>/`` holds fx_graph.py, ir_pre_fusion.txt,
ir_post_fusion.txt, output_code.py and every kernel's source.
"""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

from minductor import config

log = logging.getLogger("minductor")
_graph_counter = itertools.count()


class GraphDump:
    """One graph's dump folder; created (and announced) on construction."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.path: Path = _make_unique_dir(Path(config.debug_dir), f"graph_{next(_graph_counter):03d}_{kind}")
        message = f"minductor: writing debug dump of {kind} graph to {self.path}"
        log.warning(message)
        if log.hasHandlers() or not log.isEnabledFor(logging.WARNING):
            print(message, file=sys.stderr)  # else logging's last-resort handler already printed it

    def write(self, filename: str, text: str) -> Path:
        """Write ``text`` to ``filename`` inside the dump folder and return the file's path."""
        path = self.path / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


def _make_unique_dir(parent: Path, name: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    for i in itertools.count():
        path = (parent / (name if i == 0 else f"{name}_{i}")).resolve()
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def maybe_graph_dump(kind: str) -> GraphDump | None:
    """A new ``GraphDump`` when ``config.debug`` is on, else None."""
    return GraphDump(kind) if config.debug else None
