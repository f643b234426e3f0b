"""config flags and patch(), metrics.reset(), debug dump folders."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from minductor import config, debug, metrics


def test_patch_sets_and_restores() -> None:
    before = config.debug
    with config.patch(debug=not before, compile_threads=1):
        assert config.debug is (not before) and config.compile_threads == 1
    assert config.debug is before


def test_patch_restores_on_error_and_rejects_unknown_flags() -> None:
    before = config.cxx
    with pytest.raises(ValueError), config.patch(cxx="clang++"):
        raise ValueError
    assert config.cxx == before
    with pytest.raises(AttributeError, match="no_such_flag"), config.patch(no_such_flag=1):
        pass


def test_metrics_reset_in_place() -> None:
    counter = metrics.fallback_ops
    metrics.fallback_ops["aten.sort"] += 1
    metrics.kernels_by_backend["cpp"] += 2
    metrics.cache_hits = metrics.graphs_compiled = 5
    metrics.reset()
    assert metrics.fallback_ops is counter and not counter and not metrics.kernels_by_backend
    assert metrics.cache_hits == metrics.graphs_compiled == metrics.generated_kernel_count == 0


def test_graph_dump_folders(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with config.patch(debug=False):
        assert debug.maybe_graph_dump("forward") is None
    with config.patch(debug=True, debug_dir=str(tmp_path)), caplog.at_level(logging.WARNING, "minductor"):
        first = debug.maybe_graph_dump("forward")
        second = debug.maybe_graph_dump("backward")
    assert first is not None and second is not None
    assert first.path.is_absolute() and first.path.parent == tmp_path.resolve()
    assert first.path.name.startswith("graph_") and first.path.name.endswith("_forward")
    assert first.path != second.path and second.path.name.endswith("_backward")
    assert str(first.path) in caplog.text
    written = first.write("output_code.py", "x = 1\n")
    assert written == first.path / "output_code.py" and written.read_text() == "x = 1\n"


def test_graph_dump_never_reuses_a_folder(tmp_path: Path) -> None:
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        a = debug.GraphDump("inference")
    next_number = int(a.path.name.split("_")[1]) + 1
    (tmp_path / f"graph_{next_number:03d}_inference").mkdir()  # e.g. left over from an earlier run
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        b = debug.GraphDump("inference")
    assert b.path.exists() and b.path.name.endswith("_inference_1")
