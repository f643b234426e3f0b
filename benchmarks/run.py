"""The benchmark suite: speed, compile latency and peak memory vs eager and TorchInductor."""
from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

import torch

import minductor
from minductor.bench.memory import minductor_peak_bytes, peak_bytes
from minductor.bench.runner import measure_bandwidth, run_workload
from minductor.bench.workloads import WORKLOADS, Block

COMPILE_CHILD = r"""
import json, sys, time, torch
backend, case = sys.argv[1], sys.argv[2]
def f3(x): return (x.sin() + 1) * 2
def f50(x):
    for i in range(25):
        x = (x * 1.01 + 0.1).tanh()
        if i % 5 == 0:
            x = x - x.mean(-1, keepdim=True)
    return x
def recurrence64(key, value, first, decay):
    # RWKV's time-mixing loop, unrolled by Dynamo: ~1000 small nodes in one graph
    num, den, mx, out = torch.zeros(2, 128), torch.zeros(2, 128), torch.full((2, 128), -1e38), torch.zeros_like(key)
    for t in range(key.shape[1]):
        k, v = key[:, t], value[:, t]
        mo = torch.maximum(mx, k + first)
        e1, e2 = torch.exp(mx - mo), torch.exp(k + first - mo)
        out[:, t] = (e1 * num + e2 * v) / (e1 * den + e2)
        ms = torch.maximum(mx + decay, k)
        e1, e2 = torch.exp(mx + decay - ms), torch.exp(k - ms)
        num, den, mx = e1 * num + e2 * v, e1 * den + e2, ms
    return out
mlp = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(4)])
start = time.perf_counter()
if case == "mlp_fw_bw":
    torch.compile(mlp, backend=backend)(torch.randn(64, 256)).sum().backward()
elif case == "recurrence64":
    torch.compile(recurrence64, backend=backend)(torch.randn(2, 64, 128), torch.randn(2, 64, 128), torch.randn(128), -torch.rand(128))
else:
    torch.compile({"pointwise3": f3, "ops50": f50}[case], backend=backend)(torch.randn(64, 256))
print(json.dumps(time.perf_counter() - start))
"""


WARM_RUNS = 5
COLD_RUNS = 3


def bench_speed(with_inductor: bool, names: list[str]) -> None:
    bandwidth = measure_bandwidth()
    print(f"== speed ({torch.get_num_threads()} threads; streaming bandwidth {bandwidth:.1f} GB/s)")
    for name in names:
        fn, make_args = WORKLOADS[name]
        with torch.no_grad():
            report = run_workload(name, fn, make_args(), with_inductor=with_inductor, bandwidth=bandwidth)
        print("\n".join(report.lines()), flush=True)


def bench_compile(with_inductor: bool) -> None:
    """Cold compile (fresh process, empty caches) of minductor and TorchInductor; minductor warm
    (a second fresh process over the first one's cache); Dynamo alone (backend "eager")."""
    print("== compile latency (first call, fresh process; cold = empty caches, warm = caches of a previous process)")

    # children cache bytecode as a normal install does (pip compiles torch's at install time;
    # an editable minductor writes its own on first import, unless PYTHONDONTWRITEBYTECODE)
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def child(backend: str, case: str, cache: str) -> float:
        env = dict(base_env, MINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", COMPILE_CHILD, backend, case], env=env,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    compileall.compile_dir(os.path.dirname(minductor.__file__), quiet=1)  # as pip does at install
    subprocess.run([sys.executable, "-c", "import torch, minductor.graph, torch._inductor.compile_fx"],
                   env=base_env, check=True)  # warm the OS file cache
    for case in ["pointwise3", "ops50", "mlp_fw_bw", "recurrence64"]:
        with tempfile.TemporaryDirectory() as root:
            caches = [os.path.join(root, str(i)) for i in range(COLD_RUNS)]
            colds = [child("minductor", case, cache) for cache in caches]  # each in empty caches
            # warm runs reuse the last cold run's caches; a child's start-up moves by ~0.3 s
            # between runs, so warm and Dynamo alone alternate
            dynamo, warm = zip(*[(child("eager", case, caches[-1]), child("minductor", case, caches[-1]))
                                 for _ in range(WARM_RUNS)])
        extra = [w - d for d, w in zip(dynamo, warm)]
        cold = statistics.median(colds)
        row = [f"dynamo alone {statistics.median(dynamo):.2f} s",
               f"minductor cold {cold:.2f} s (median of {COLD_RUNS}; {min(colds):.2f} to {max(colds):.2f})",
               f"warm {statistics.median(warm):.2f} s ({statistics.median(extra):+.2f} s over dynamo, "
               f"median of {WARM_RUNS} pairs; {min(extra):+.2f} to {max(extra):+.2f})"]
        if with_inductor:
            with tempfile.TemporaryDirectory() as tmp:
                inductor = child("inductor", case, tmp)
            row.append(f"inductor cold {inductor:.2f} s (minductor/inductor {cold / inductor:.2f})")
        print(f"{case}: " + " | ".join(row), flush=True)


def bench_memory(size: int = 2048) -> None:
    """Every suite workload (forward, size ``size``) and a training step: eager vs minductor
    with and without the cross-call buffer pool (config.reuse_buffers_across_calls)."""
    from minductor.bench.workloads import make_workloads

    print(f"== peak memory of a steady-state call (profiler allocation events + bytes held by buffer pools), n={size}")
    rows = [("workload", "eager MB", "minductor MB (pool)", "minductor MB (no pool)")]
    cases = [(name, fn, make()) for name, (fn, make) in make_workloads(size).items()]
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256))
    cases.append(("mlp_train_step", lambda x: mlp(x).square().mean().backward(), (torch.randn(1024, 256),)))
    block = ResBlock()
    cases.append(("resnet_block_train_step", lambda x: block(x).square().mean().backward(), (torch.randn(8, 64, 32, 32),)))
    for name, fn, args in cases:
        grad = name.endswith("train_step")
        with torch.set_grad_enabled(grad):
            eager = peak_bytes(fn, *args)
            pooled = minductor_peak_bytes(fn, args, pool=True)
            plain = minductor_peak_bytes(fn, args, pool=False)
        rows.append((name, f"{eager / 1e6:.1f}", f"{pooled / 1e6:.1f} ({pooled / eager:.2f}x)",
                     f"{plain / 1e6:.1f} ({plain / eager:.2f}x)"))
        print(" | ".join(rows[-1]), flush=True)


class ResBlock(torch.nn.Module):
    """A ResNet basic block: 3x3 convolution, batch norm, ReLU, twice, and the residual."""

    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        conv = lambda: torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)  # noqa: E731
        self.c1, self.b1, self.c2, self.b2 = conv(), torch.nn.BatchNorm2d(channels), conv(), torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


def bench_training(with_inductor: bool) -> None:
    """Forward + backward + SGD step; static and dynamic minductor, eager, TorchInductor."""
    import copy

    from minductor.bench.runner import interleaved_medians

    print("== training step (forward + backward + SGD with momentum; interleaved rounds, medians)")
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256))
    cases = [("mlp", mlp, torch.randn(256, 256)), ("transformer_block", Block(), torch.randn(8, 128, 256)),
             ("resnet_block", ResBlock(), torch.randn(8, 64, 32, 32))]
    for name, model, x in cases:
        variants = [("eager", None), ("minductor", {"backend": "minductor"}),
                    ("minductor_dynamic", {"backend": "minductor", "dynamic": True})]
        if with_inductor:
            variants.append(("inductor", {}))
        torch._dynamo.reset()
        steps = {}
        for label, kwargs in variants:  # each variant compiles its own copy; all stay compiled
            m = copy.deepcopy(model)
            opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
            run = m if kwargs is None else torch.compile(m, **kwargs)
            _train_step(run, opt, x)
            steps[label] = lambda run=run, opt=opt: _train_step(run, opt, x)
        times = {label: t.median for label, t in interleaved_medians(steps, 2.0).items()}
        row = [f"{label} {t * 1e3:.2f} ms" for label, t in times.items()]
        ratios = [f"{times['eager'] / times['minductor']:.2f}x eager",
                  f"dynamic/static {times['minductor_dynamic'] / times['minductor']:.2f}"]
        if "inductor" in times:
            ratios.append(f"{times['inductor'] / times['minductor']:.2f}x inductor")
        print(f"{name}: " + " | ".join(row) + " (" + ", ".join(ratios) + ")", flush=True)


DYNAMIC_WORKLOADS = ["pointwise6", "transpose_add", "softmax", "layer_norm", "sum_dim0", "sum_dim1", "full_sum", "cumsum"]


def _own_code(fn: Any) -> Any:
    """``fn`` with a code object of its own: Dynamo keeps compiled frames per code object, so
    variants compiled from one function would find (and run) each other's graphs."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def bench_dynamic(with_inductor: bool) -> None:
    """Dynamic shapes as a user meets them: a graph compiled with ``dynamic=True`` on a small
    input (Dynamo's size hint, as when a dim turns dynamic after a small batch) and run at the
    suite's size, against the static graph, eager and TorchInductor compiled the same way."""
    from minductor.bench.runner import interleaved_medians
    from minductor.bench.workloads import make_workloads

    print("== dynamic shapes (compiled at 8x8, run at 4096x4096; interleaved rounds, medians)")
    small = make_workloads(8)
    for name in DYNAMIC_WORKLOADS:
        fn, make_args = WORKLOADS[name]
        args, small_args = make_args(), small[name][1]()
        torch._dynamo.reset()
        static = torch.compile(_own_code(fn), backend="minductor")
        calls = {"eager": fn, "minductor": static, "minductor_dynamic": torch.compile(_own_code(fn), backend="minductor", dynamic=True)}
        if with_inductor:
            calls["inductor_dynamic"] = torch.compile(_own_code(fn), dynamic=True)
        with torch.no_grad():
            for label, call in calls.items():
                if label.endswith("dynamic"):
                    call(*small_args)
                torch.testing.assert_close(call(*args), fn(*args), rtol=1e-3, atol=1e-3)
            times = {label: t.median for label, t in interleaved_medians(
                {label: (lambda call=call: call(*args)) for label, call in calls.items()}, 1.5 * len(calls)).items()}
        row = " | ".join(f"{label} {t * 1e3:.2f} ms" for label, t in times.items())
        ratios = [f"dynamic/static {times['minductor_dynamic'] / times['minductor']:.2f}",
                  f"dynamic {times['eager'] / times['minductor_dynamic']:.2f}x eager"]
        if with_inductor:
            ratios.append(f"{times['inductor_dynamic'] / times['minductor_dynamic']:.2f}x inductor dynamic")
        print(f"{name}: {row} ({', '.join(ratios)})", flush=True)


def bench_overhead(with_inductor: bool) -> None:
    """What a compiled call costs beyond its kernel: ``x.sum(1)`` on a tiny and on a large input,
    for eager, Dynamo alone (backend "eager"), minductor, minductor's wrapper called directly
    (no Dynamo guards or AOTAutograd wrappers) and TorchInductor. On the large input the
    difference to eager is what a row sum at eager's speed loses to the per-call path."""
    from minductor.bench.runner import interleaved_medians
    from minductor.runtime import loader

    print("== per-call overhead of x.sum(1) (interleaved rounds, medians)")
    for n in (8, 4096):
        x = torch.randn(n, n)
        wrappers: list = []
        original = loader.load_wrapper
        loader.load_wrapper = lambda module, dump: wrappers.append(original(module, dump)) or wrappers[-1]
        torch._dynamo.reset()
        try:
            calls = {"eager": lambda: x.sum(1), "dynamo": torch.compile(lambda x: x.sum(1), backend="eager"),
                     "minductor": torch.compile(lambda x: x.sum(1), backend="minductor")}
            with torch.no_grad():
                calls["dynamo"](x), calls["minductor"](x)
        finally:
            loader.load_wrapper = original
        dynamo, compiled, (wrapper,) = calls["dynamo"], calls["minductor"], wrappers
        direct = getattr(wrapper, "direct", None)  # what Dynamo calls (codegen/wrapper.py: call_direct)
        calls.update(dynamo=lambda: dynamo(x), minductor=lambda: compiled(x),
                     wrapper=(lambda: direct(x)) if direct is not None else (lambda: wrapper([x])))
        if with_inductor:
            inductor = torch.compile(lambda x: x.sum(1))
            with torch.no_grad():
                inductor(x)
            calls["inductor"] = lambda: inductor(x)
        with torch.no_grad():
            times = interleaved_medians(calls, 2.0, rounds=7)
        print(f"{n}x{n}: " + " | ".join(f"{name} {t.median * 1e6:.1f} us" for name, t in times.items()), flush=True)
        before, inside, after = _split_call(lambda x: x.sum(1), x)
        print(f"    minductor's call: {before:.1f} us until our wrapper starts (Dynamo guards, AOTAutograd), {inside:.1f} us "
              f"in it, {after:.1f} us after it returns", flush=True)


def _split_call(fn: Any, x: torch.Tensor, calls: int = 300) -> tuple[float, float, float]:
    """Medians (us) of the time before minductor's wrapper starts, inside it and after it
    returns, over ``calls`` calls of ``fn`` compiled, on ``x``. On a large input the Python before and
    after runs slower, since the kernel streamed the input through the caches the interpreter's
    code and data were in (x.sum(1) at 4096^2 on a Xeon VM: 67 + 36 us against 15 + 4 at 8x8)."""
    from minductor.runtime import loader

    marks: list[tuple[float, float]] = []
    original = loader.load_wrapper

    def timing(inner: Any) -> Any:
        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            out = inner(*args)
            marks.append((start, time.perf_counter()))
            return out

        return timed

    def load(module: Any, dump: Any) -> Any:
        inner = original(module, dump)
        timed = timing(inner)
        timed._boxed_call = True  # type: ignore[attr-defined]
        if getattr(inner, "direct", None) is not None:  # the call Dynamo makes (direct_call.py)
            timed.direct = timing(inner.direct)  # type: ignore[attr-defined]
        return timed

    loader.load_wrapper = load
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend="minductor")
        with torch.no_grad():
            compiled(x)
    finally:
        loader.load_wrapper = original
    parts: list[list[float]] = [[], [], []]
    with torch.no_grad():
        for _ in range(calls):
            marks.clear()
            start = time.perf_counter()
            compiled(x)
            end = time.perf_counter()
            (enter, leave), = marks
            for part, value in zip(parts, (enter - start, leave - enter, end - leave)):
                part.append(value * 1e6)
    b, i, a = (statistics.median(p) for p in parts)
    return b, i, a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--only", choices=["speed", "training", "dynamic", "compile", "memory", "overhead"])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    ns = parser.parse_args()
    if ns.only in (None, "speed"):
        bench_speed(not ns.no_inductor, ns.workloads)
    if ns.only in (None, "training"):
        bench_training(not ns.no_inductor)
    if ns.only in (None, "dynamic"):
        bench_dynamic(not ns.no_inductor)
    if ns.only in (None, "compile"):
        bench_compile(not ns.no_inductor)
    if ns.only in (None, "memory"):
        bench_memory()
    if ns.only in (None, "overhead"):
        bench_overhead(not ns.no_inductor)


if __name__ == "__main__":
    main()
