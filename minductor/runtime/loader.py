"""Loading a generated wrapper module: the one place every compiled graph becomes callable
(fresh from codegen, or from either cache), so a warm start need not import the code
generators. The benchmark runner and tests hook ``load_wrapper`` here to see each module."""
from __future__ import annotations

import dataclasses
import itertools
import linecache
from collections.abc import Callable
from typing import Any

import torch

DUMPED_CONSTANTS = "constants.pt"
_module_counter = itertools.count()


@dataclasses.dataclass
class WrapperModule:
    source: str
    kernels: list[Any]  # codegen.common.KernelCode, kernel by kernel
    constants: dict[str, Any]  # tensors and callables the graph holds, bound by name at load


def load_wrapper(module: WrapperModule, dump: Any) -> Callable[[list[Any]], Any]:
    """Compile the kernels (in parallel, through the cache) and return ``call``."""
    if dump is not None:
        path = dump.write("output_code.py", module.source)
        for kernel in module.kernels:
            dump.write(f"{kernel.name}{kernel.file_suffix}", kernel.source)
        tensors = {k: v for k, v in module.constants.items() if isinstance(v, torch.Tensor)}
        if tensors:  # what output_code.py reads when it runs on its own (helpers.dumped_constants)
            torch.save(tensors, path.parent / DUMPED_CONSTANTS)
        filename = str(path)
    else:
        filename = f"<minductor output_code {next(_module_counter)}>"
    # Triton reads a kernel's source through linecache (inspect.getsourcelines)
    linecache.cache[filename] = (len(module.source), None, module.source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": "minductor_output_code", "constants": module.constants}
    exec(compile(module.source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace["call"]
