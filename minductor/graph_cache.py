"""A cache of whole compiled graphs, so a warm start skips lowering, scheduling and codegen.

An entry is the generated wrapper module of one aten graph (its C++ kernels are compiled
through the kernel cache when the module loads, as on a miss). Its key hashes everything the
generated source depends on: the aten graph's code (and its subgraphs'), the sizes, strides,
dtypes and devices of the inputs and of the tensors the graph holds, size hints of symbolic
inputs, the graph kind, minductor's flags, minductor's own sources, the torch version, and
for graphs with einsum or scan (the XLA path) whether JAX is available.

Entries live in ``<cache_dir>/graphs/`` as JSON; writes are atomic (``os.replace``), so a
reader sees a whole entry or none. Graphs calling Python callables (XLA computations) and
debug runs (``config.debug``: the dump wants every stage) are never cached. What compiling
the graph added to ``minductor.metrics`` is stored with the entry and added again on a hit,
so counters read the same either way; ``metrics.graph_cache_hits`` counts the hits.

``CompiledGraph`` is what the backend's compilers return: the loaded graph and, when it can be
cached, its entry and constants. It is an ``OutputCode``, so AOTAutograd's own cache stores it
whole inside its entry (keyed by Dynamo's graph, before AOTAutograd traces it): a warm start
then skips AOTAutograd's tracing and partitioning too (see ``backend.py``).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
from torch._inductor.output_code import OutputCode

from minductor import config, direct_call, metrics

FORMAT = 3
# flags that change where things go or how fast, never what is generated
_NOT_KEYED = frozenset({"debug", "debug_dir", "cache_dir", "compile_threads", "aot_cache"})
_COUNTERS = ("graphs_compiled", "generated_kernel_count", "buffers_allocated", "buffers_reused")


@dataclasses.dataclass
class CachedGraph:
    source: str  # the wrapper module
    kernels: list[dict[str, Any]]  # its KernelCode fields, kernel by kernel
    constants: dict[str, str]  # wrapper name -> the graph module attribute it binds
    metrics: dict[str, Any]  # what compiling the graph added to minductor.metrics
    output_strides: list[list[int] | None] | None = None  # CompiledGraph.output_strides

    def load(self, constants: dict[str, Any]) -> Callable[[list[Any]], Any]:
        """The graph's ``call``, its constants bound; counts as a hit in ``minductor.metrics``."""
        from minductor.runtime import loader

        call = loader.load_wrapper(loader.WrapperModule(self.source, self.kernel_codes(), constants), None)
        replay_metrics(self.metrics)
        return call

    def kernel_codes(self) -> list[Any]:
        from minductor.codegen.common import KernelCode

        return [KernelCode(**{**k, "local_buffers": frozenset(k["local_buffers"]),
                               "triton_signature": tuple(k["triton_signature"]) if k["triton_signature"] else None})
                for k in self.kernels]


@dataclasses.dataclass
class CompiledGraph(OutputCode):
    """One compiled aten graph: a boxed callable (it takes the argument list and empties it).

    ``not_cached`` says why AOTAutograd's cache must not store the graph (it then bypasses
    the whole compile); ``entry`` is None for graphs our own cache does not hold either.
    Pickled, a graph keeps its entry and constants and drops the loaded module; ``post_compile``
    loads it again (kernels through the kernel cache).
    """
    kind: str
    call: Callable[[list[Any]], Any] | None
    entry: CachedGraph | None
    constants: dict[str, Any]
    not_cached: str = ""
    # inference graphs: the argument count when AOTAutograd's runtime wrapper would add
    # nothing around the graph, so Dynamo may call it directly (direct_call.py)
    direct_arity: int | None = None
    # each output's strides as compiled (None: not a tensor or not static). A forward graph's
    # saved tensors may differ from eager's (channels-last activations): AOTAutograd compiles
    # the backward for these strides when the forward compiler reports them
    output_strides: list[Any] | None = None

    @classmethod
    def uncached(cls, kind: str, call: Callable[[list[Any]], Any], reason: str,
                 output_strides: list[Any] | None = None) -> CompiledGraph:
        return cls(kind, call, None, {}, reason, output_strides=output_strides)

    def __post_init__(self) -> None:
        # AOTAutograd passes the argument list itself; an instance attribute, so the wrapper
        # Dynamo's disable() puts around a backward copies it
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        assert self.call is not None, "minductor: a CompiledGraph ran before post_compile loaded it"
        return self.call(args)

    def prepare_for_serialization(self) -> None:
        if self.entry is None or self.not_cached:
            raise BypassAOTAutogradCache(f"minductor: {self.kind} graph not cached: {self.not_cached}")
        self.call = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        if self.call is None:
            assert self.entry is not None
            self.call = self.entry.load(self.constants)
        direct_call.note(self)
        self.report_output_strides()

    def report_output_strides(self) -> None:
        """Tell AOTAutograd the strides of a forward graph's outputs (TracingContext's list,
        which it sets up around the forward compiler and reads for the backward's inputs)."""
        context = torch._guards.TracingContext.try_get()
        if (self.kind == "forward" and self.output_strides is not None and context is not None
                and context.output_strides is not None and not context.output_strides):
            context.output_strides.extend(tuple(s) if s is not None else None for s in self.output_strides)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass  # Triton kernels are in the entry's source


@functools.cache
def _sources_digest() -> str:
    """minductor's own code (Python sources and the C++ prelude) and the torch version."""
    digest = hashlib.sha256(f"{torch.__version__} {sys.version}".encode())
    root = Path(__file__).parent
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.h")]):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def compiler_state() -> list[Any]:
    """What shapes generated code besides the graph: minductor's sources and flags, the
    toolchain and CPU, the default dtype."""
    from minductor.runtime.cache import toolchain_fingerprint

    flags = sorted((name, repr(getattr(config, name))) for name in config.FLAGS - _NOT_KEYED)
    return [FORMAT, _sources_digest(), toolchain_fingerprint(config.cxx), str(torch.get_default_dtype()), flags]


def xla_state(gm: torch.fx.GraphModule) -> list[Any]:
    """einsum and scan lower to XLA, or to aten where JAX is missing."""
    if not _uses_xla(gm):
        return []
    from minductor.codegen.xla import jax_available

    return [("jax", jax_available())]


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
              donated: frozenset[str] = frozenset()) -> str:
    parts: list[Any] = [*compiler_state(), kind, *xla_state(gm), sorted(donated)]
    for name, module in gm.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            parts.append((name, module.code))
    parts.append([_describe(x) for x in example_inputs])
    for node in gm.graph.find_nodes(op="get_attr"):
        parts.append((node.target, _describe(_attribute(gm, node.target))))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _uses_xla(gm: torch.fx.GraphModule) -> bool:
    return any(node.op == "call_function" and (node.target is torch.ops.higher_order.scan
                                               or getattr(node.target, "namespace", None) == "minductor")
               for module in gm.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


def _describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ["tensor", str(x.dtype), str(x.device), [_size(s) for s in x.shape],
                [_size(s) for s in x.stride()], _size(x.storage_offset())]
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ["sym", _size(x)]
    return [type(x).__name__, repr(x)]


def _size(s: Any) -> Any:
    """An int, or a symbolic size as its expression and the hint heuristics read."""
    if isinstance(s, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return [str(s.node.expr), repr(s.node.hint)]
    return s


def _attribute(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _path(key: str) -> Path:
    return Path(config.cache_dir) / "graphs" / key[:2] / f"{key}.json"


def load(key: str) -> CachedGraph | None:
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    return CachedGraph(data["source"], data["kernels"], data["constants"], data["metrics"], data["output_strides"])


def save(key: str, entry: CachedGraph) -> None:
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(dataclasses.asdict(entry), f, default=sorted)  # frozensets as lists
        os.replace(f.name, path)
    except OSError:  # a read-only or full cache dir: compiling still works, uncached
        pass


def constants_of(gm: torch.fx.GraphModule, entry: CachedGraph) -> dict[str, Any]:
    return {name: _attribute(gm, target) for name, target in entry.constants.items()}


def metrics_snapshot() -> dict[str, Any]:
    snap: dict[str, Any] = {name: getattr(metrics, name) for name in _COUNTERS}
    snap["kernels_by_backend"] = dict(metrics.kernels_by_backend)
    snap["fallback_ops"] = dict(metrics.fallback_ops)
    return snap


def metrics_since(before: dict[str, Any]) -> dict[str, Any]:
    now = metrics_snapshot()
    delta: dict[str, Any] = {name: now[name] - before[name] for name in _COUNTERS}
    for name in ("kernels_by_backend", "fallback_ops"):
        delta[name] = dict(Counter(now[name]) - Counter(before[name]))
    return delta


def replay_metrics(delta: dict[str, Any]) -> None:
    for name in _COUNTERS:
        setattr(metrics, name, getattr(metrics, name) + delta[name])
    metrics.kernels_by_backend.update(delta["kernels_by_backend"])
    metrics.fallback_ops.update(delta["fallback_ops"])
    metrics.graph_cache_hits += 1
