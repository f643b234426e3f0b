"""Compile generated Triton kernels ahead of time for a GPU target, with no GPU present.

``python -m minductor.runtime.triton_aot kernels.json`` reads ``[{"name", "source",
"signature", "constexprs"}]`` and compiles each kernel through Triton's real CUDA pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin) for ``sm_80``: a kernel that compiles is valid GPU Triton.
It must run in a process without ``TRITON_INTERPRET`` (the interpreter replaces ``triton.jit``).
"""
from __future__ import annotations

import json
import linecache
import os
import re
import sys
from typing import Any


def compile_for_gpu(name: str, source: str, signature: dict[str, str], constexprs: dict[str, int],
                    arch: int = 80) -> dict[str, Any]:
    """Compile one kernel; returns its stages (``ptx``, ..., ``cubin``) by name."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    filename = f"<triton_aot {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"triton_aot_{name}"}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    fn = namespace[name]
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", arch, 32))
    return dict(compiled.asm)


def mma_kinds(ptx: str) -> list[str]:
    """The tensor-core instructions in a kernel's PTX (``tl.dot`` on fp16/bf16 tiles lowers to them)."""
    return sorted(set(re.findall(r"mma\.sync\.aligned\.[\w.]+", ptx)))


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: ahead-of-time compilation needs the real triton.jit")
    with open(sys.argv[1]) as f:
        kernels = json.load(f)
    failures = 0
    for k in kernels:
        try:
            stages = compile_for_gpu(k["name"], k["source"], k["signature"], k["constexprs"])
            mma = mma_kinds(stages.get("ptx", ""))
            print(f"ok {k['name']}: {' -> '.join(stages)}{'; ' + ' '.join(mma) if mma else ''}")
        except Exception as e:  # report every kernel, fail at the end  # noqa: BLE001
            failures += 1
            print(f"FAILED {k['name']}: {type(e).__name__}: {e}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
