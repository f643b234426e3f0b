"""Compiled graphs in AOTAutograd's cache, so a warm start skips AOTAutograd's tracing too.

Our graph cache (``graph_cache.py``) is keyed by the aten graphs AOTAutograd produces: a hit
still pays for tracing Dynamo's graph into them and partitioning (0.2-0.4 s of a warm start).
AOTAutograd's own cache is keyed by Dynamo's graph, before any of that, and stores its runtime
wrappers with the compiled graphs. We use it with three settings, for our compile only:

- ``bundled_autograd_cache``: the entry holds our ``CompiledGraph``s themselves (the default
  mode looks each graph up in TorchInductor's FX graph cache by a key only it writes).
- The backward graph compiles lazily, at its first run, as usual; AOTAutograd writes the
  entry right after, inside the same compile-callback scope. So the backward compiler takes
  the settings again and a Dynamo end-of-compile callback drops them (``holding_settings``);
  without them the entry would not be bundled, i.e. not written.
- Our own key function. Torch's hashes the same Dynamo graph, inputs and AOTAutograd
  settings, plus TorchInductor's config, and imports TorchInductor's code generator to do
  it (about 1.2 s, on every compile, measured with ``-X importtime``). Ours keeps the
  AOTAutograd part of the key (``AOTAutogradCacheDetails``, its pickler and checks) and puts
  minductor's compiler state (sources, flags, toolchain) where TorchInductor's was. Without
  that state the key would not tell our entries from another backend's.

Entries live in our cache dir (``<cache_dir>/aotautograd/``, where torch's cache dir would
hold TorchInductor's), so ``MINDUCTOR_CACHE_DIR`` places all of minductor's caches.
``MINDUCTOR_AOT_CACHE=0`` or ``torch.compiler.config.force_disable_caches`` turns this off;
debug runs never use it (a hit would skip the dump).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import torch
from torch._dynamo.callback import callback_handler
from torch._functorch import config as functorch_config
from torch._functorch._aot_autograd import autograd_cache
from torch._functorch._aot_autograd.autograd_cache import (
    AOTAUTOGRAD_CACHE_PREFIX,
    AOTAutogradCacheDetails,
    AOTAutogradCachePickler,
    BypassAOTAutogradCache,
)
from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional, triton_kernel_wrapper_mutation

from minductor import config
from minductor.graph_cache import CompiledGraph, compiler_state, xla_state


class _KeyDetails(AOTAutogradCacheDetails):
    """AOTAutograd's key details with minductor's compiler state in TorchInductor's place."""

    def get_triton_source_codes_from_gm(self, gm: torch.fx.GraphModule) -> list[str]:
        # user Triton kernels would key by their source; we do not cache such graphs
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule) and any(
                    module.graph.find_nodes(op="call_function", target=target)
                    for target in (triton_kernel_wrapper_functional, triton_kernel_wrapper_mutation)):
                raise BypassAOTAutogradCache("minductor: graph calls user-defined Triton kernels")
        return []

    def _init_fx_graph_hash_details(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                                    fx_config: Any) -> None:
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.cache_key_tag = torch.compiler.config.cache_key_tag
        self.deterministic_algorithms_settings = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]
        )
        self.minductor = [*compiler_state(), *xla_state(gm)]


def cache_key(mod: Any, example_inputs: Sequence[Any], aot_config: Any,
              compiler_config_extra: Any = None) -> tuple[str, list[str]]:
    """Stands in for ``autograd_cache.autograd_cache_key`` (same signature and checks)."""
    gm = mod.gm if isinstance(mod, torch._dynamo.utils.GmWrapper) else mod
    with autograd_cache.sanitize_gm_for_cache(gm):
        autograd_cache.check_cacheable(gm)
        details = _KeyDetails(gm, example_inputs, aot_config, {})
        return AOTAUTOGRAD_CACHE_PREFIX + AOTAutogradCachePickler(gm).get_hash(details), []


_held = False  # settings() is in force


@contextlib.contextmanager
def settings() -> Iterator[None]:
    """While AOTAutograd compiles one of our graphs: bundled entries, our key, our cache dir."""
    global _held
    with functorch_config.patch(bundled_autograd_cache=True), \
            mock.patch.object(autograd_cache, "autograd_cache_key", cache_key), \
            mock.patch.object(autograd_cache, "cache_dir", lambda: config.cache_dir):
        _held = True
        try:
            yield
        finally:
            _held = False


def serializable(compile_fn: Callable[..., Any]) -> SerializableAOTDispatchCompiler:
    """``compile_fn`` as a compiler whose ``CompiledGraph``s AOTAutograd's cache may store."""
    return SerializableAOTDispatchCompiler(CompiledGraph, compile_fn)


def holding_settings(compile_backward: Callable[..., Any]) -> Callable[..., Any]:
    """The backward compiler. Compiled lazily (outside ``settings()``), the backward is
    followed by AOTAutograd writing the entry, before the compile's end callbacks run: it
    takes the settings until then."""
    def compile_fn(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        if not _held:
            stack = contextlib.ExitStack()
            stack.enter_context(settings())

            def release(args: Any) -> None:
                callback_handler.remove_end_callback(release)
                stack.close()

            callback_handler.register_end_callback(release)
        return compile_backward(gm, example_inputs)

    return compile_fn
