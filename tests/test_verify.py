"""The IR verifier accepts what the pipeline builds and rejects a broken schedule."""
from __future__ import annotations

import pytest
import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from minductor.graph import GraphLowering
from minductor.ir.verify import IRVerificationError, verify_graph, verify_schedule
from minductor.scheduler import Scheduler
from minductor.virtualized import V


def lowered(fn, *args):
    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*args)
    graph = GraphLowering(gm, args)
    with V.set_graph(graph):
        graph.run(*args)
        verify_graph(graph)
        scheduler = Scheduler(graph)
        scheduler.fuse_nodes()
        verify_schedule(scheduler)
    return graph, scheduler


def test_pipeline_output_verifies() -> None:
    x = torch.randn(8, 16)
    lowered(lambda x: (torch.mm(x.softmax(-1), x.t()) + 1).sum(0), x)


def test_reordered_schedule_is_rejected() -> None:
    x = torch.randn(8, 16)
    graph, scheduler = lowered(lambda x: torch.mm(x.exp(), x.t()).relu(), x)
    assert len(scheduler.units) >= 3
    scheduler.units.reverse()
    with V.set_graph(graph), pytest.raises(IRVerificationError, match="runs before its dependency"):
        verify_schedule(scheduler)
