"""``higher_order.scan`` -> ``jax.lax.scan``: the combine subgraph translated op by op.

The generated function reads like the subgraph: one line per aten node, calling the entry of
the ``xla_ops`` table, each result cast to the dtype aten gives it. ``lax.scan`` runs the body
over dim 0 of the xs (the scan op's caller has already moved ``dim`` there and flipped for
``reverse``); additional inputs are closed over. The function returns carries then ys, the
scan op's output order.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from minductor.codegen.xla import XlaComputation, base_namespace, jax_dtype, needs_x64
from minductor.codegen.xla_ops import jax_op

_counter = itertools.count()


class UnsupportedScan(Exception):
    """The combine subgraph has something the table cannot translate (message names it)."""


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bool: "bool_"}.get(dtype, str(dtype).removeprefix("torch."))


class _BodyWriter:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.namespace: dict[str, Any] = {}
        self.lines: list[str] = []
        self.dtypes: list[torch.dtype] = []

    def arg(self, value: Any) -> str:
        if isinstance(value, torch.fx.Node):
            return value.name
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.arg(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, torch.dtype):
            return f"torch.{_dtype_name(value)}"
        if isinstance(value, float):
            return f"float({str(value)!r})"
        if isinstance(value, (bool, int, str)) or value is None:
            return repr(value)
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return "None"
        raise UnsupportedScan(f"argument {value!r} of type {type(value).__name__}")

    def node(self, node: torch.fx.Node) -> None:
        fn = jax_op(node.target)
        if fn is None:
            raise UnsupportedScan(f"op {node.target} has no JAX translation")
        if isinstance(node.target, torch._ops.OpOverload):
            helper = str(node.target).replace(".", "_").replace("::", "_")
        else:
            helper = f"py_{node.target.__name__}"
        self.namespace[helper] = fn
        args = [self.arg(a) for a in node.args]
        args += [f"{k}={self.arg(v)}" for k, v in node.kwargs.items()
                 if k not in ("device", "layout", "pin_memory", "memory_format", "non_blocking")]
        expr = f"{helper}({', '.join(args)})"
        val = node.meta.get("val")
        self._check_val(node, val)
        if isinstance(val, torch.Tensor):
            expr += f".astype(jnp.{_dtype_name(val.dtype)})"
        self.lines.append(f"{node.name} = {expr}")

    def _check_val(self, node: torch.fx.Node, val: Any) -> None:
        for v in torch.utils._pytree.tree_leaves(val):
            if isinstance(v, torch.Tensor):
                try:
                    jax_dtype(v.dtype)
                except KeyError:
                    raise UnsupportedScan(f"{node.format_node()} has dtype {v.dtype}") from None
                if any(not isinstance(s, int) for s in v.shape):
                    raise UnsupportedScan(f"{node.format_node()} has a symbolic shape")
                self.dtypes.append(v.dtype)
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise UnsupportedScan(f"{node.format_node()} produces a symbolic value")


def scan_computation(gm: torch.fx.GraphModule, n_init: int, n_xs: int, n_add: int,
                     input_dtypes: Sequence[torch.dtype]) -> XlaComputation:
    """The JAX computation of ``scan(gm, init[n_init], xs[n_xs], additional[n_add])``."""
    writer = _BodyWriter(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_init + n_xs + n_add:
        raise UnsupportedScan(f"combine graph takes {len(placeholders)} inputs, scan passes {n_init + n_xs + n_add}")
    output = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            writer.node(node)
        elif node.op == "output":
            output = node.args[0]
        elif node.op != "placeholder":
            raise UnsupportedScan(f"{node.op} node {node.format_node()} in the combine graph")
    assert output is not None
    outs = list(output) if isinstance(output, (list, tuple)) else [output]
    if any(not isinstance(o, torch.fx.Node) for o in outs):
        raise UnsupportedScan("combine graph returns a non-tensor")
    name = f"scan_{next(_counter)}"
    carry_names = [p.name for p in placeholders[:n_init]]
    x_names = [p.name for p in placeholders[n_init:n_init + n_xs]]
    add_names = [p.name for p in placeholders[n_init + n_xs:]]
    carry_dtypes = [p.meta["val"].dtype for p in placeholders[:n_init]]
    carries_out = [f"{o.name}.astype(jnp.{_dtype_name(d)})" for o, d in zip(outs[:n_init], carry_dtypes)]
    ys_out = [o.name for o in outs[n_init:]]
    init_args = [f"init{i}" for i in range(n_init)]
    xs_args = [f"xs{i}" for i in range(n_xs)]
    src = [f"def {name}({', '.join([*init_args, *xs_args, *add_names])}):",
           "    def body(carry, x):",
           f"        {_unpack(carry_names)} = carry",
           f"        {_unpack(x_names)} = x",
           *[f"        {line}" for line in writer.lines],
           f"        return {_pack(carries_out)}, {_pack(ys_out)}",
           "",
           f"    carry, ys = lax.scan(body, {_pack(init_args)}, {_pack(xs_args)})",
           "    return (*carry, *ys)",
           ""]
    namespace = base_namespace() | writer.namespace | {"torch": torch}
    x64 = needs_x64([*writer.dtypes, *input_dtypes])
    return XlaComputation(name, "\n".join(src), namespace, x64)


def _unpack(names: Sequence[str]) -> str:
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")" if names else "_"


def _pack(exprs: Sequence[str]) -> str:
    return "(" + ", ".join(exprs) + ("," if len(exprs) == 1 else "") + ")"


__all__ = ["UnsupportedScan", "scan_computation"]
