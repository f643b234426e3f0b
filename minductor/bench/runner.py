"""Side-by-side timing of a workload: eager, minductor, TorchInductor, and each kernel."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import benchmark

from minductor import config, metrics


@dataclasses.dataclass
class KernelTiming:
    """One kernel's median time and the bytes it moves: each buffer it reads and each it writes
    once (STREAM's convention; a buffer updated in place counts twice)."""

    name: str
    seconds: float
    bytes_moved: int
    note: str = ""  # why there is no timing (a Triton kernel on CPU runs in the interpreter)
    bytes_written: int = 0
    reference_gbps: float = 0.0  # the STREAM rate measured in alternation with this kernel (CPU)
    includes_restore: bool = False  # an in-place kernel whose restore could not be told from noise

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def reference_note(self) -> str:
        restore = " (upper bound: includes the in-place restore, which noise hid)" if self.includes_restore else ""
        return (f" ({self.reference_gbps:.1f} GB/s alongside)" if self.reference_gbps else "") + restore

    def pct_of(self, bandwidth: float) -> float:
        """% of the streaming rate measured alongside this kernel, else of ``bandwidth``."""
        reference = self.reference_gbps or bandwidth
        return 100 * self.gbps / reference if reference else 0.0


@dataclasses.dataclass
class WorkloadReport:
    name: str
    eager: float
    minductor: float
    inductor: float | None
    kernels: list[KernelTiming]
    bandwidth: float  # machine GB/s
    compile_seconds: float = 0.0  # minductor's first call (cold unless the kernel cache is warm)
    inductor_compile_seconds: float | None = None
    correct: bool = True
    spread: float = 0.0  # interquartile range of minductor's timing, seconds
    fallback_ops: list[str] = dataclasses.field(default_factory=list)  # aten ops run as extern fallbacks

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "eager_ms": self.eager * 1e3, "minductor_ms": self.minductor * 1e3,
            "inductor_ms": None if self.inductor is None else self.inductor * 1e3,
            "speedup_vs_eager": self.eager / self.minductor,
            "speedup_vs_inductor": None if self.inductor is None else self.inductor / self.minductor,
            "minductor_compile_s": self.compile_seconds, "inductor_compile_s": self.inductor_compile_seconds,
            "minductor_spread_ms": self.spread * 1e3, "correct": self.correct, "bandwidth_gbps": self.bandwidth,
            "fallback_ops": self.fallback_ops,
            "kernels": [
                {"name": k.name, "us": k.seconds * 1e6, "bytes": k.bytes_moved, "bytes_written": k.bytes_written,
                 "gbps": k.gbps, "pct_bandwidth": k.pct_of(self.bandwidth), "reference_gbps": k.reference_gbps}
                for k in self.kernels
            ],
        }

    def lines(self) -> list[str]:
        out = [f"{self.name}: {'' if self.correct else 'MISMATCH vs eager | '}eager {self.eager * 1e3:.3f} ms | minductor {self.minductor * 1e3:.3f} ms "
               f"({self.eager / self.minductor:.2f}x eager)"
               + (f" | inductor {self.inductor * 1e3:.3f} ms ({self.inductor / self.minductor:.2f}x inductor)"
                  if self.inductor else "")]
        for k in self.kernels:
            if k.note:
                out.append(f"    {k.name}: {k.note}")
                continue
            out.append(f"    {k.name}: {k.seconds * 1e6:9.1f} us  {k.bytes_moved / 1e6:8.2f} MB  "
                       f"{k.gbps:6.1f} GB/s  {k.pct_of(self.bandwidth):5.1f}% of bandwidth{k.reference_note}")
        return out


def median_time(fn: Callable[[], Any], min_run_time: float = 0.5) -> float:
    return measure(fn, min_run_time).median


def measure(fn: Callable[[], Any], min_run_time: float = 0.5) -> Any:
    """A torch.utils.benchmark Measurement (median, iqr) of ``fn`` after warm-up."""
    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


def bandwidth_probes(numel: int = 1 << 24, device: str = "cpu") -> dict[str, float]:
    """The machine's streaming rates over ``numel``-float arrays, GB/s counted as STREAM does.

    On CPU: STREAM loops compiled like minductor's kernels (``bench/stream.py``). On a GPU: a
    copy into an existing buffer (2 arrays), an out= add (3) and a sum (1), each the fastest
    of five short medians."""
    if device == "cpu":
        from minductor.bench.stream import stream_probes

        return stream_probes(numel)
    a, b, c = (torch.randn(numel, device=device) for _ in range(3))
    probes = {"copy": (lambda: c.copy_(a), 2), "add": (lambda: torch.add(a, b, out=c), 3), "read": (lambda: a.sum(), 1)}
    return {name: streams * numel * a.element_size() / min(median_time(fn, 0.2) for _ in range(5)) / 1e9
            for name, (fn, streams) in probes.items()}


def streaming_bandwidth(probes: dict[str, float]) -> float:
    """The reference of ``% of bandwidth``: the best rate that streams into an existing buffer
    (copy, add, triad, and copy/add with streaming stores). A kernel that only reads (a
    reduction) may exceed it."""
    return max(v for name, v in probes.items() if name != "read")


def streaming_reference(numel: int = 1 << 24) -> Reference:
    """The loops ``streaming_bandwidth`` takes the best of (all but read), for ``time_kernels``."""
    from minductor.bench.stream import stream_loops

    return {name: loop for name, loop in stream_loops(numel).items() if name != "read"}


def measure_bandwidth(numel: int = 1 << 24, device: str = "cpu") -> float:
    return streaming_bandwidth(bandwidth_probes(numel, device))


def run_workload(name: str, fn: Callable[..., Any], args: Sequence[Any], *, with_inductor: bool = True,
                 bandwidth: float | None = None, min_run_time: float = 0.5,
                 reference: Reference | None = None) -> WorkloadReport:
    """Compile ``fn`` with minductor (and TorchInductor), check results, time all three
    and every generated C++ kernel in isolation."""
    torch._dynamo.reset()
    graphs: list[tuple[Any, list[Any]]] = []
    fallbacks_before, errors_before = collections.Counter(metrics.fallback_ops), metrics.internal_errors
    with tempfile.TemporaryDirectory() as tmp, config.patch(debug=True, debug_dir=tmp), _record_graphs(graphs):
        compiled = torch.compile(fn, backend="minductor")
        start = time.perf_counter()
        result = compiled(*args)
        compile_s = time.perf_counter() - start
        correct = _matches(result, fn(*args))
    kernels = [t for module, graph_args in graphs for t in time_kernels(module, graph_args, min_run_time / 5, reference)]
    # timed: a compile outside the recording (its kernels from the cache), so the recording
    # wrapper is not in the path Dynamo calls
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="minductor")
    compiled(*args)
    contenders: dict[str, Callable[[], Any]] = {"eager": lambda: fn(*args), "minductor": lambda: compiled(*args)}
    ind_compile = None
    if with_inductor:
        inductor = torch.compile(fn)  # its own cache entries: the minductor ones stay
        start = time.perf_counter()
        inductor(*args)
        ind_compile = time.perf_counter() - start
        contenders["inductor"] = lambda: inductor(*args)
    times = interleaved_medians(contenders, min_run_time)
    mind = times["minductor"]
    return WorkloadReport(name, times["eager"].median, mind.median, times["inductor"].median if with_inductor else None,
                          kernels, bandwidth or measure_bandwidth(), compile_s, ind_compile, correct, mind.iqr,
                          sorted(str(op) for op in collections.Counter(metrics.fallback_ops) - fallbacks_before)
                          + ["a whole graph (internal error)"] * (metrics.internal_errors - errors_before))


# results compared with eager: 1e-3, or about two units in the last place of a 16-bit float (a
# bfloat16 layer_norm rounds 46 of 1M values the other way, from float32 statistics summed in
# another order)
_TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _matches(result: Any, expected: Any) -> bool:
    outs = result if isinstance(result, (tuple, list)) else [result]
    tol = max((_TOLERANCE.get(t.dtype, 1e-3) for t in outs if isinstance(t, torch.Tensor)), default=1e-3)
    try:
        torch.testing.assert_close(result, expected, rtol=tol, atol=tol)
        return True
    except AssertionError:
        return False


@dataclasses.dataclass
class Timing:
    median: float  # seconds: the median of the per-round medians
    iqr: float  # spread of the per-round medians


def interleaved_medians(contenders: dict[str, Callable[[], Any]], min_run_time: float, rounds: int = 5) -> dict[str, Timing]:
    """Time every contender in ``rounds`` alternating rounds (a torch.utils.benchmark median
    each): on a shared machine whose speed drifts, one contender timed after another would
    see different machines; interleaved, each ratio compares like with like."""
    medians: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            medians[name].append(median_time(run, min_run_time / rounds))
    out = {}
    for name, values in medians.items():
        q = torch.tensor(values).quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64).float())
        out[name] = Timing(float(q[1]), float(q[2] - q[0]))
    return out


# a C++ kernel call; kernels with indirect indexing reset and check their error flag around it
_CALL = re.compile(r"^\s*(?:mi_err = [^;]*; )?(cpp_\w+)\((.*?)\)(?:; check_index_error\(.*\))?$")
_TRITON_CALL = re.compile(r"^\s*(triton_\w+)\[.*\]\((.*)\)$")
NEEDS_GPU = "timing needs a GPU (ran once in Triton's interpreter; result checked against eager)"


@contextlib.contextmanager
def _record_graphs(graphs: list[tuple[Any, list[Any]]]) -> Iterator[None]:
    """Record each compiled graph's wrapper source and the arguments of its first call."""
    from minductor.runtime import loader

    original = loader.load_wrapper

    def load(module: Any, dump: Any) -> Any:
        call = original(module, dump)

        def recording(args: list[Any]) -> Any:
            if len(graphs) < len(seen) + 1 and id(call) not in seen:
                seen.add(id(call))
                graphs.append((module, [a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
            return call(args)

        recording._boxed_call = True  # type: ignore[attr-defined]
        return recording

    seen: set[int] = set()
    loader.load_wrapper = load
    try:
        yield
    finally:
        loader.load_wrapper = original


# name -> (a call, the bytes it moves): streaming loops timed in alternation with each kernel
Reference = dict[str, tuple[Callable[[], Any], int]]


def time_kernels(module: Any, args: Sequence[Any], min_run_time: float, reference: Reference | None = None) -> list[KernelTiming]:
    """Run a wrapper statement by statement on a graph's inputs; time each kernel call alone.

    With ``reference`` (STREAM copy/add/triad), each C++ kernel is timed in alternating rounds
    with those loops, and its ``reference_gbps`` is their best rate in the same rounds: on a
    shared VM whose memory bandwidth drifts by 2x within minutes, a kernel's % of a bandwidth
    measured at start-up says more about the neighbours than about the kernel."""
    source = module.source
    namespace: dict[str, Any] = {"__name__": "minductor_bench", "constants": module.constants}
    exec(compile(source, "<output_code>", "exec"), namespace)  # noqa: S102 - our own generated code
    lines = _call_lines(source)
    local: dict[str, Any] = {"args": list(args)}
    out = []
    for line in lines:
        if line.startswith("return"):
            break
        triton_match = _TRITON_CALL.match(line)
        if triton_match:
            out.append(_time_triton(triton_match.group(1), line, namespace, local))
            continue
        match = _CALL.match(line)
        if match:
            name = match.group(1)
            buffers = [b for b in re.findall(r"\b(\w+)\.data_ptr\(\)", match.group(2)) if b in local]
            roles = pointer_roles(namespace.get(f"{name}_source", ""), name)
            moved, written = _bytes(buffers, roles, local)
            run, restore = _fresh_inputs(lambda line=line: exec(line, namespace, local), buffers, roles, local)  # noqa: S102
            # the kernel, its restore and the STREAM loops in alternating rounds: timed one after
            # another on a busy 2-core machine, a restore once came out slower than kernel + restore
            contenders = {"kernel": run} | ({"restore": restore} if restore else {})
            contenders |= {n: call for n, (call, _) in (reference or {}).items()}
            times = interleaved_medians(contenders, min_run_time, rounds=3)
            rate = max((nbytes / times[n].median / 1e9 for n, (_, nbytes) in (reference or {}).items()), default=0.0)
            seconds, with_restore = times["kernel"].median, False
            if restore:
                if times["kernel"].median > times["restore"].median:
                    seconds -= times["restore"].median
                else:  # noise larger than the kernel: report the call with its restore, an upper bound
                    with_restore = True
            out.append(KernelTiming(name, seconds, moved, bytes_written=written, reference_gbps=rate,
                                    includes_restore=with_restore))
        else:
            exec(line, namespace, local)  # noqa: S102
    return out


def _call_lines(source: str) -> list[str]:
    """The statements ``call(args)`` runs, in order: its own, then those of ``call_direct``
    where it hands over to it (the parameters have the names ``call`` unpacked them into)."""
    def stripped(text: str) -> list[str]:
        return [line.strip() for line in text.split("\n") if line.strip()]

    lines = stripped(source.split("def call(args):\n")[1].split("\ncall._boxed_call")[0])
    if lines and lines[-1].startswith("return call_direct("):
        body = source.split("def call_direct(")[1].split(":\n", 1)[1].split("\ndef call(args):")[0]
        lines = lines[:-1] + stripped(body)
    return lines


def _fresh_inputs(call: Callable[[], Any], buffers: list[str], roles: list[str],
                  local: dict[str, Any]) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """(the call, a restore or None): a kernel that updates a buffer in place (``in_out_ptr``) starts
    every timed call from the values the graph gave it, restored by a copy that is timed alone
    and subtracted. Repeated on its own output, a GELU backward's multiply drifted into
    denormal floats and ran 3x slower (1366 against 435 us). The last call leaves one update,
    as the graph does, for the kernels after it."""
    if len(roles) != len(buffers):
        return call, None
    updated = [local[b] for b, role in zip(buffers, roles) if role == "rw"]
    saved = [t.clone() for t in updated]

    def restore() -> None:
        for t, s in zip(updated, saved):
            t.copy_(s)

    def run() -> None:
        restore()
        call()

    return (run, restore) if updated else (call, None)


def pointer_roles(source: str, name: str) -> list[str]:
    """For each buffer pointer of C++ kernel ``name``, in signature order: "r" (``const``),
    "w" (``out_ptr``) or "rw" (``in_out_ptr``). Empty when the source is not at hand."""
    from minductor.runtime.cache import kernel_parameters

    roles = []
    for param in kernel_parameters(source, name) or []:
        if "*" not in param or param.endswith("mi_err"):
            continue
        roles.append("r" if param.startswith("const ") else "rw" if "in_out_ptr" in param else "w")
    return roles


def _bytes(buffers: list[str], roles: list[str], local: dict[str, Any]) -> tuple[int, int]:
    """(bytes read + written, bytes written) of a kernel call over ``buffers``."""
    sizes = [local[b].untyped_storage().nbytes() for b in buffers]
    if len(roles) != len(sizes):  # unknown roles: every buffer counted once, as read
        return sum(sizes), 0
    moved = sum(size * (2 if role == "rw" else 1) for size, role in zip(sizes, roles))
    return moved, sum(size for size, role in zip(sizes, roles) if role != "r")


def _time_triton(name: str, line: str, namespace: dict[str, Any], local: dict[str, Any]) -> KernelTiming:
    """A Triton launch: ``triton.testing.do_bench`` on a GPU; on CPU it runs once, untimed."""
    tensors = [v for k, v in local.items() if isinstance(v, torch.Tensor) and re.search(rf"\b{k}\b", line)]
    moved = sum(t.untyped_storage().nbytes() for t in tensors)
    if not any(t.is_cuda for t in tensors):
        exec(line, namespace, local)  # noqa: S102
        return KernelTiming(name, float("nan"), moved, NEEDS_GPU)
    from triton.testing import do_bench

    ms = do_bench(lambda: exec(line, namespace, local))  # noqa: S102
    return KernelTiming(name, ms / 1e3, moved)


def compile_seconds(fn: Callable[..., Any], args: Sequence[Any], backend: str) -> float:
    torch._dynamo.reset()
    start = time.perf_counter()
    torch.compile(fn, backend=backend)(*args)
    return time.perf_counter() - start
