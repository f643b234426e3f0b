"""``minductor.nn.GRU``: ``torch.nn.GRU`` whose recurrence is one scan per layer and direction.

Compiled with ``backend="minductor"`` each scan is one ``jax.lax.scan``, so compile time does
not grow with sequence length (unrolling the recurrence into the graph does). The parameters
are ``torch.nn.GRU``'s own (names, shapes, state_dict). The input projection of all steps is
one matmul before the scan; the body computes ``h @ W_hh^T`` and the gates.

With ``minductor.config.scan_rnn = True``, ``rewrite_gru`` makes graphs that call a plain
``torch.nn.GRU`` (``torch._VF.gru``) take the same path.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

__all__ = ["GRU", "gru_scan", "rewrite_gru"]

_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"minductor.nn.GRU: {reason}; running torch.nn.GRU's own forward instead", stacklevel=3)


class GRU(torch.nn.GRU):
    """A drop-in ``torch.nn.GRU`` (same constructor, parameters and outputs) run as scans.

    Dynamo refuses to trace RNN modules unless ``torch._dynamo.config.allow_rnn`` is set, so
    constructing this module sets it (plain ``torch.nn.GRU`` is then traced too; with
    ``minductor.config.scan_rnn`` it also becomes scans instead of an unrolled graph).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        torch._dynamo.config.allow_rnn = True

    def forward(self, input: Any, hx: torch.Tensor | None = None) -> Any:
        reason = self._unsupported(input)
        if reason is not None:
            _warn_once(reason)
            return super().forward(input, hx)
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(0 if self.batch_first else 1)
            hx = hx.unsqueeze(1) if hx is not None else None
        if hx is None:
            batch = input.shape[0 if self.batch_first else 1]
            hx = torch.zeros(self.num_layers * (2 if self.bidirectional else 1), batch, self.hidden_size,
                             dtype=input.dtype, device=input.device)
        if torch.compiler.is_compiling():
            # Dynamo records one opaque call (tracing scans through Dynamo costs seconds per
            # scan); minductor's backend turns it into scans before AOTAutograd (``rewrite_gru``)
            out, h_n = minductor_gru(input, hx, list(self._flat_weights), self.bias, self.num_layers, 0.0, False,
                                     self.bidirectional, self.batch_first)
        else:
            out, h_n = gru_scan(input, hx, list(self._flat_weights), self.bias, self.num_layers, self.bidirectional,
                                self.batch_first, _minductor_scan)
        if unbatched:
            out, h_n = out.squeeze(0 if self.batch_first else 1), h_n.squeeze(1)
        return out, h_n

    def _unsupported(self, input: Any) -> str | None:
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            return "PackedSequence input is not supported"
        if self.dropout > 0 and self.training and self.num_layers > 1:
            return "dropout between layers in training is not supported"
        if getattr(self, "proj_size", 0):
            return "proj_size is not supported"
        return None


def _layer_params(params: Sequence[torch.Tensor], has_biases: bool, index: int) -> tuple[Any, ...]:
    per = 4 if has_biases else 2
    w_ih, w_hh, *biases = params[index * per:(index + 1) * per]
    return (w_ih, w_hh, *(biases if has_biases else (None, None)))


def _gru_step(h: torch.Tensor, gi: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor | None) -> tuple[Any, Any]:
    gh = F.linear(h, w_hh, b_hh)
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    h_new = n + z * (h - n)  # (1 - z) * n + z * h
    return h_new, h_new.clone()  # the scan op forbids an output aliasing another


def _direction(x: torch.Tensor, h0: torch.Tensor, params: tuple[Any, ...], reverse: bool,
               scan: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
    w_ih, w_hh, b_ih, b_hh = params
    gi = F.linear(x, w_ih, b_ih)  # every step's input projection in one matmul
    h_last, ys = scan(h0, gi, w_hh, b_hh, reverse)
    return ys, h_last


def _minductor_scan(h0: torch.Tensor, gi: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor | None,
                    reverse: bool) -> Any:
    from minductor._scan import scan

    return scan(lambda h, g: _gru_step(h, g, w_hh, b_hh), h0, gi, reverse=reverse)


def gru_scan(input: torch.Tensor, hx: torch.Tensor, params: Sequence[torch.Tensor], has_biases: bool,
             num_layers: int, bidirectional: bool, batch_first: bool,
             scan: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.gru.input`` (without dropout) with one scan per layer and direction;
    ``scan(h0, gi, w_hh, b_hh, reverse) -> (h_last, ys)`` runs one direction's recurrence."""
    x = input.transpose(0, 1) if batch_first else input
    dirs = 2 if bidirectional else 1
    finals = []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            index = layer * dirs + d
            ys, h_last = _direction(x, hx[index], _layer_params(params, has_biases, index), d == 1, scan)
            outs.append(ys)
            finals.append(h_last)
        x = outs[0] if dirs == 1 else torch.cat(outs, -1)
    out = x.transpose(0, 1) if batch_first else x
    return out, torch.stack(finals)


# -- config.scan_rnn: plain torch.nn.GRU in compiled graphs -----------------------------


def _hop_scan(h0: torch.Tensor, gi: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor | None,
              reverse: bool) -> Any:
    """The scan op itself, weights as additional inputs (graphs traced by AOTAutograd, past Dynamo)."""
    from torch._higher_order_ops.scan import scan_op

    if reverse:
        gi = gi.flip(0)
    if b_hh is None:
        carry, ys = scan_op(lambda h, g, w: list(_gru_step(h, g, w, None)), [h0], [gi], additional_inputs=(w_hh,))
    else:
        carry, ys = scan_op(lambda h, g, w, b: list(_gru_step(h, g, w, b)), [h0], [gi],
                            additional_inputs=(w_hh, b_hh))
    return carry, (ys.flip(0) if reverse else ys)  # the op returns its outputs flat: carries, then ys


def _gru_input(input: torch.Tensor, hx: torch.Tensor, params: Sequence[torch.Tensor], has_biases: bool,
               num_layers: int, dropout: float, train: bool, bidirectional: bool,
               batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if dropout > 0 and train and num_layers > 1:
        return torch._VF.gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return gru_scan(input, hx, params, has_biases, num_layers, bidirectional, batch_first, _hop_scan)


@torch._dynamo.allow_in_graph
def minductor_gru(input: torch.Tensor, hx: torch.Tensor, params: list[torch.Tensor], has_biases: bool,
                  num_layers: int, dropout: float, train: bool, bidirectional: bool,
                  batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``minductor.nn.GRU`` in Dynamo's graph: ``aten.gru`` semantics, always rewritten to scans
    by minductor's backend (other backends run it as ``torch._VF.gru``)."""
    return torch._VF.gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)


def rewrite_gru(gm: torch.fx.GraphModule, *, all_grus: bool = True) -> int:
    """Replace ``torch._VF.gru`` / ``aten.gru.input`` calls in Dynamo's graph by the scan GRU:
    every call with ``all_grus`` (``config.scan_rnn``), else those of ``minductor.nn.GRU``."""
    targets = {torch._VF.gru, torch.gru, torch.ops.aten.gru.input} if all_grus else set()
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and (node.target in targets or node.target is minductor_gru) \
                and len(node.args) == 9 and not node.kwargs:
            node.target = _gru_input
            count += 1
    if count:
        gm.recompile()
    return count
