"""The op vocabulary is closed: every handler implements every op."""
from __future__ import annotations

import pytest

from minductor.codegen.cpp_ops import CppOps
from minductor.ir.ops import ALL_OPS, DefaultHandler, Ops


@pytest.mark.parametrize("handler", [Ops, DefaultHandler, CppOps])
def test_handler_implements_every_op(handler: type) -> None:
    missing = sorted(op for op in ALL_OPS if not callable(getattr(handler, op, None)))
    assert not missing, f"{handler.__name__} lacks {missing}"


def test_codegen_handler_defines_ops_itself() -> None:
    # CppOps must not lean on a default: a missing op would emit nothing
    inherited = sorted(op for op in ALL_OPS if op not in vars(CppOps))
    assert not inherited, inherited
