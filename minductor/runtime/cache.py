"""Compile C++ kernels with g++ into a content-addressed on-disk cache, and load them.

Layout: ``<config.cache_dir>/cpp/<key[:2]>/<key>/<kernel_name>.{cpp,so}`` where ``key`` hashes
the source, the compiler flags and version, the CPU and the prelude headers. Concurrent
processes serialize on a file lock per key; the ``.so`` appears atomically (``os.replace``),
so its existence means a finished compile.

The kernels of one graph that miss the cache compile together: ``compile_threads`` translation
units at most, each holding several kernels, because every g++ run has a fixed cost (~0.16 s
of driver, front-end start-up and linking here) that would otherwise be paid per kernel. Such
a unit is cached under the key of its concatenated source; a unit that fails to compile falls
back to one compile per kernel, so an error still names its kernel. A graph with one large
kernel splits that kernel's loop functions over parallel units instead (``MI_PART``), linked
into one library.

What the compiler says of itself (version, what ``-march=native`` resolves to, where libmvec
is) is probed once per compiler binary and CPU and kept in ``<cache_dir>/toolchain/``.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from minductor import config, metrics

INCLUDE_DIR: Path = Path(__file__).parents[1] / "codegen" / "include"
# -fno-loop-unroll-and-jam: -O3 jams two iterations of a reduction's outer loop (the
# per-row Welford loop of layer_norm) into one, and the jammed `omp simd` loop no longer
# vectorizes on AVX2; the scalar loop made layer_norm at 4096^2 run 15 ms instead of 8 on a
# Zen 3 VM. Our inner loops are already the vectorized ones, so jamming never helps them.
_BASE_FLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=c++17",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-loop-unroll-and-jam",
    "-ffp-contract=off",
    "-w",
]
CXX_FLAGS: list[str] = [*_BASE_FLAGS, f"-I{INCLUDE_DIR}"]

_ERROR_CHARS = 4000
_loaded: dict[tuple[str, str], Callable[..., None]] = {}  # (key, kernel_name) -> function
_metrics_lock = threading.Lock()


class CppCompileError(RuntimeError):
    """The C++ compiler rejected a generated kernel."""


@functools.cache
def _toolchain_fingerprint(cxx: str) -> str:
    """Compiler version, flags and CPU: everything besides the source that shapes the .so."""
    version = _probe(cxx, "--version") or "unavailable"
    info = cpu_info()  # -march=native: a shared cache must not mix CPUs
    cpu = info.get("flags") or info.get("Features", "")
    return "\n".join([cxx, version, " ".join([*_BASE_FLAGS, *tune_flags(cxx), *isa_flags(cxx)]), platform.machine(), cpu])


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (vendor_id, cpu family, model, flags...);
    empty where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read(1 << 16).split("\n\n")[0]
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in first.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def l2_cache_bytes() -> int | None:
    """The first processor's level-2 data cache, in bytes (None where sysfs does not say)."""
    return cache_bytes("2")


def last_level_cache_bytes() -> int | None:
    """The first processor's last-level cache (level 3, else 2), in bytes (None if unknown)."""
    return cache_bytes("3") or cache_bytes("2")


@functools.cache
def cache_bytes(wanted: str) -> int | None:
    """The first processor's data cache of level ``wanted``, in bytes (None where sysfs does not
    say)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", size)
        if level == wanted and kind in ("Unified", "Data") and match:
            return int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[match[2]]
    return None


@functools.cache
def _probe(cxx: str, *args: str) -> str:
    """``cxx args``'s stdout ("" if it cannot run), kept on disk per compiler binary and CPU:
    the three probes cost 40-65 ms of subprocesses, which every warm process paid."""
    binary = shutil.which(cxx)
    if binary is None:
        return ""
    stat = os.stat(binary)
    info = cpu_info()
    key = hashlib.sha256(repr((os.path.realpath(binary), stat.st_size, stat.st_mtime_ns, args, info.get("model name"),
                               info.get("flags") or info.get("Features"))).encode()).hexdigest()
    path = Path(config.cache_dir) / "toolchain" / f"{key}.json"
    try:
        return json.loads(path.read_text())["stdout"]
    except (OSError, ValueError, KeyError):
        pass
    try:
        out = subprocess.run([binary, *args], capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump({"args": list(args), "stdout": out}, f)
        os.replace(f.name, path)
    except OSError:  # a read-only cache dir: probe again next time
        pass
    return out


def _native_target(cxx: str) -> str:
    """``cxx -march=native -Q --help=target``: the target options native resolves to ("" if none)."""
    return _probe(cxx, "-march=native", "-Q", "--help=target")


def _native_tune(cxx: str) -> str:
    """What ``-mtune`` ``-march=native`` resolves to ("generic" for a CPU ``cxx`` does not know)."""
    out = _native_target(cxx)
    return next((line.split()[-1] for line in out.splitlines() if line.strip().startswith("-mtune=")), "")


def isa_flags(cxx: str) -> list[str]:
    """``-mno-avx512fp16`` where ``-march=native`` enables AVX512-FP16 (Sapphire Rapids and
    later). Kernels compute half values in float32, so they lose nothing, and GCC 12 with it
    dropped the float -> _Float16 -> float rounding of an unrolled loop: 4 of the 5 elements of a
    padded row were copied unrounded (``F.pad(x.half(), (2, 0))`` off by up to 4e-4)."""
    return ["-mno-avx512fp16"] if native_enables(cxx, "-mavx512fp16") else []


@functools.cache
def avx512_enabled(cxx: str) -> bool:
    """Whether ``-march=native`` gives kernels AVX-512 (32 vector registers of 16 floats)."""
    return native_enables(cxx, "-mavx512f")


def native_enables(cxx: str, option: str) -> bool:
    """Whether ``-march=native`` turns ``option`` (an ISA extension) on."""
    return bool(re.search(rf"^\s*{re.escape(option)}\s+\[enabled\]", _native_target(cxx), re.MULTILINE))


def gathers_enabled(cxx: str) -> bool:
    """Whether vectorized kernels may use gather loads: a known CPU's tuning, or ours."""
    return _native_tune(cxx) not in ("generic", "") or bool(tune_flags(cxx))


@functools.cache
def vector_gathers_pay_off() -> bool:
    """Whether a loop of data-dependent loads (``torch.gather``) should be vectorized with
    gather instructions. Not on AMD families 23 and 25 before Zen 4 (Zen 1 to Zen 3), whose
    gathers cost more than the scalar loads they replace: on a Zen 3 VM the gather kernel of
    the suite ran 10-12 ms as a scalar loop and 14.5-16 ms vectorized, while eager's scalar
    loop ran 14 ms. Zen 4 (family 25 with AVX-512) gathers faster: on a Zen 4 VM that kernel's
    whole call took 2.23 ms vectorized against 3.58 scalar, and a softmax over rows plus a
    relative-position bias gathered from a table 1.63 against 3.42 (one process, alternating)."""
    info = cpu_info()
    zen4 = info.get("cpu family") == "25" and "avx512f" in info.get("flags", "").split()
    return not (info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") in ("23", "25") and not zen4)


@functools.cache
def narrow_loads_stream_faster() -> bool:
    """Whether a loop that streams its input from memory reads it faster with 256-bit loads
    than with 512-bit ones: AMD family 25 with AVX-512 (Zen 4, whose AVX-512 loads are split
    in two). On a Zen 4 VM, a row sum of 4096x4096 floats with 2 threads ran 13-17% faster
    over ymm registers than over zmm in a C harness (eager's AVX2 sum loop was as fast as
    the ymm one), and the suite's contiguous reductions 3-17% faster (a full sum, row sums
    and means, a squared-error mean); column sums and compute-bound kernels lost with them
    (softmax's row kernel 22%), so only a reduction kernel of loads and cheap arithmetic
    asks for them (codegen/cpp_unit.streams_reads)."""
    info = cpu_info()
    return info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25" and avx512_enabled(config.cxx)


@functools.cache
def prefetch_beside_streaming_stores() -> bool:
    """Whether a loop that writes with streaming stores may also prefetch the next row it will
    read (``codegen/cpp_rewrites.prefetch_next_rows``). Not on AMD family 25 with AVX-512 (Zen 4;
    Zen 3 was not measured): on a Zen 4 VM, layer_norm at 4096^2 (a Welford loop, then the normalization streaming the
    row out) ran 3.96-4.37 ms with those prefetches and 2.88-3.41 without (kernels alone, one
    process, in shuffled rounds; on a Xeon VM they had taken it from 3.3-3.6 ms to 2.8-3.1).
    Prefetches in a loop of transcendental math are kept there: softmax's exp loop with them
    3.6-3.9 ms, without 5.0-5.3."""
    info = cpu_info()
    zen4 = info.get("cpu family") == "25" and "avx512f" in info.get("flags", "").split()
    return not (info.get("vendor_id") == "AuthenticAMD" and zen4)


@functools.cache
def native_half_gemm() -> bool:
    """Whether the CPU multiplies half matrices natively (AVX512-FP16 or AMX-FP16). Without,
    eager's half GEMM takes a slow path: a (1024, 256) @ (256, 768) half product took 144 ms on
    an AMD EPYC (family 26), the same product in float32 and rounded 1.9 ms."""
    flags = cpu_info().get("flags", "").split()
    return "avx512_fp16" in flags or "amx_fp16" in flags


def half_in_float32(device: torch.device, dtypes: Iterable[torch.dtype]) -> bool:
    """Whether a half product, convolution or attention on ``device`` (operands of ``dtypes``)
    runs in float32 and rounds to half once: C++ kernels on a CPU without native half GEMM.
    Eager's half ones accumulate in float32 and round once too; the float32 copies of the
    operands (twice their bytes) are the price."""
    return (device.type == "cpu" and config.cpu_backend == "cpp" and all(d == torch.float16 for d in dtypes)
            and not native_half_gemm())


@functools.cache
def onednn_gemm_pays_off() -> bool:
    """Whether float32 matrix products should run on oneDNN rather than MKL: on x86 CPUs not
    made by Intel, where MKL's dispatch takes a slower path. On an AMD EPYC (family 26), MKL's
    sgemm ran 2.0-2.2x slower than oneDNN's matmul from 256^3 to 2048^3, for every operand
    layout of a linear layer's forward and backward; below ~2^20 multiply-adds oneDNN's
    per-call cost wins instead (64^3: MKL 6 us, oneDNN 14 us)."""
    info = cpu_info()
    return platform.machine() in ("x86_64", "AMD64") and info.get("vendor_id") not in (None, "GenuineIntel")


@functools.cache
def onednn_auto_min_macs() -> int:
    """The least product (multiply-adds) ``cpu_gemm="auto"`` sends to oneDNN: 2^20 (below,
    oneDNN's per-call cost outweighs MKL's slow path), but 2^24 on AMD family 25 (Zen 4
    measured), whose MKL path is not slow: MKL ahead up to 2^24 (a Swin layer's 512x48 @ 48x144
    75 us against 91, 256^3 171 against 182), oneDNN from 2^25 (512x256 @ 256x256 398 against
    419 us, 1024^3 10.1 against 11.2 ms)."""
    info = cpu_info()
    return 1 << 24 if info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25" else 1 << 20


@functools.cache
def tune_flags(cxx: str) -> list[str]:
    """Vector gathers back on for an Intel CPU that ``cxx`` does not recognize: its
    ``-march=native`` then tunes for "generic", which (GCC 12) never emits gathers, so loops
    with strided or masked loads stay scalar, with a data-dependent branch per element: a
    3x3/2 max-pool kernel ran 28.5 ms instead of 2.4 ms on such a CPU (an AVX-512 Xeon that
    GCC 12 takes for icelake-client). Only gathers: a whole concrete ``-mtune`` (icelake-server)
    fixed that kernel too but made others up to 1.6x slower (sin/exp chains, column sums)."""
    if _native_tune(cxx) != "generic":
        return []
    info = cpu_info()
    intel_avx2 = info.get("vendor_id") == "GenuineIntel" and "avx2" in info.get("flags", "").split()
    return ["-mtune-ctrl=use_gather"] if intel_avx2 else []


@functools.cache
def libmvec_installed(cxx: str) -> bool:
    """Whether the C++ compiler can link glibc's vector math library (x86-64 Linux): it prints
    the library's full path only when the file is on its search path (a probe kept on disk:
    the path must still exist)."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False
    path = _probe(cxx, "-print-file-name=libmvec.so").strip()
    return os.path.isabs(path) and os.path.exists(path)


def _math_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) of the math library kernels call: with libmvec the prelude
    routes float32 sin/cos through its vector functions."""
    if config.libmvec and libmvec_installed(config.cxx):
        return ["-DMI_LIBMVEC"], ["-lmvec"]
    return [], []


def toolchain_fingerprint(cxx: str) -> str:
    compile_flags, link_flags = _math_flags()
    return "\n".join([_toolchain_fingerprint(cxx), *compile_flags, *link_flags])


def compiler_flags(cxx: str) -> list[str]:
    """Flags before the source file: everything but the libraries to link."""
    return [*CXX_FLAGS, *tune_flags(cxx), *isa_flags(cxx), *_math_flags()[0]]


def link_flags() -> list[str]:
    """Flags after the source file (libraries)."""
    return _math_flags()[1]


def _header_digest() -> str:
    h = hashlib.sha256()
    if INCLUDE_DIR.is_dir():
        for path in sorted(INCLUDE_DIR.iterdir()):
            if path.is_file():
                h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: str) -> str:
    """sha256 of the source, the compiler (flags, version, CPU) and the include headers."""
    h = hashlib.sha256()
    for part in (source, toolchain_fingerprint(config.cxx), _header_digest()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _key_dir(key: str) -> Path:
    return Path(config.cache_dir) / "cpp" / key[:2] / key


def cpp_source_path(source: str, kernel_name: str) -> Path:
    """Where the ``.cpp`` for ``source`` lives in the cache (for dumps and error messages)."""
    return _key_dir(cache_key(source)) / f"{kernel_name}.cpp"


def _count(hit: bool, kernels: int = 1) -> None:
    with _metrics_lock:
        if hit:
            metrics.cache_hits += kernels
        else:
            metrics.cache_misses += kernels


def compile_cpp(source: str, kernel_name: str) -> Path:
    """Return the path of the compiled ``.so`` for ``source``, compiling it on a cache miss."""
    return _compile(source, kernel_name, cache_key(source))


def _compile(source: str, kernel_name: str, key: str, kernels: int = 1, parts: int = 1) -> Path:
    cpp = _key_dir(key) / f"{kernel_name}.cpp"
    so = cpp.with_suffix(".so")
    if so.exists():
        _count(hit=True, kernels=kernels)
        return so
    _count(hit=False, kernels=kernels)
    cpp.parent.mkdir(parents=True, exist_ok=True)
    with open(cpp.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not so.exists():  # another process may have finished it while we waited
            cpp.write_text(source)
            _run_compiler(cpp, so, kernel_name, parts)
    return so


_PART = re.compile(r"^#if MI_IN_PART\((\d+)\)$", re.M)


def source_parts(source: str) -> int:
    """How many translation units the kernel's source may be split into (see MI_PART in the prelude)."""
    return 1 + max(map(int, _PART.findall(source)), default=0)


def _run_compiler(cpp: Path, so: Path, kernel_name: str, parts: int = 1) -> None:
    """Compile ``cpp`` into ``so``: in one g++ run, or ``parts`` object files compiled in
    parallel (``-DMI_PART=k``) and then linked."""
    fd, tmp = tempfile.mkstemp(dir=cpp.parent, prefix=f".{kernel_name}.", suffix=".so.tmp")
    os.close(fd)
    flags = compiler_flags(config.cxx)
    objs = [f"{tmp}.{k}.o" for k in range(parts)] if parts > 1 else []
    try:
        if objs:
            with ThreadPoolExecutor(parts, thread_name_prefix="minductor-cxx") as pool:
                for future in [pool.submit(_run_cxx, [config.cxx, *flags, f"-DMI_PART={k}", "-c", str(cpp), "-o", obj],
                                           kernel_name, cpp) for k, obj in enumerate(objs)]:
                    future.result()
            _run_cxx([config.cxx, *flags, *objs, "-o", tmp, *link_flags()], kernel_name, cpp)
        else:
            _run_cxx([config.cxx, *flags, str(cpp), "-o", tmp, *link_flags()], kernel_name, cpp)
        os.replace(tmp, so)
    finally:
        for path in [tmp, *objs]:
            if os.path.exists(path):
                os.unlink(path)


def _run_cxx(cmd: list[str], kernel_name: str, cpp: Path) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise CppCompileError(
            f"minductor: cannot run the C++ compiler {config.cxx!r} for kernel {kernel_name} ({cpp}): {e}; "
            "install g++ or set MINDUCTOR_CXX to a C++17 compiler with OpenMP"
        ) from e
    if proc.returncode != 0:
        raise CppCompileError(_error_message(kernel_name, cpp, cmd, proc.stderr or proc.stdout))


def _error_message(kernel_name: str, cpp: Path, cmd: list[str], output: str) -> str:
    if len(output) > _ERROR_CHARS:
        output = output[:_ERROR_CHARS] + f"\n... ({len(output) - _ERROR_CHARS} more characters)"
    return (
        f"minductor: C++ compile of kernel {kernel_name} failed\n"
        f"  source:  {cpp}\n"
        f"  command: {' '.join(cmd)}\n"
        f"{output.rstrip()}\n"
        "this is a minductor bug: please report it with the file above; "
        "set MINDUCTOR_DEBUG=1 to dump the whole graph"
    )


def load_cpp_kernel(so_path: Path, name: str, source: str | None = None) -> Callable[..., None]:
    """The ``extern "C"`` function ``name``. Given its ``source``, it takes Python ints for its
    parameters (``with_argtypes``); else pass ``c_void_p`` / ``c_int64`` objects."""
    fn = getattr(ctypes.CDLL(str(so_path)), name)
    fn.restype = None
    return fn if source is None else with_argtypes(fn, source, name)


def kernel_parameters(source: str, name: str) -> list[str] | None:
    """The parameter declarations of the ``extern "C"`` function ``name`` in ``source``, in
    order (``const float* __restrict__ in_ptr0``, ``const int64_t s0``); None if it has none."""
    match = re.search(rf'extern "C" void {re.escape(name)}\(([^)]*)\)', source)
    return None if match is None else [p.strip() for p in match.group(1).split(",") if p.strip()]


def with_argtypes(fn: Any, source: str, name: str) -> Any:
    """Declare kernel ``name``'s parameter types (pointers, int64 sizes), so the wrapper passes
    data pointers and sizes as plain ints: building a ``c_void_p`` per argument on every call
    cost 2-3 us of a 22 us call of a small graph after a kernel that streamed 64 MB."""
    params = kernel_parameters(source, name)
    if params is None:
        raise CppCompileError(f"minductor: kernel {name}: no extern \"C\" entry function in its source")
    types = []
    for param in params:
        scalar = re.fullmatch(r"(?:const )?(\w+) \w+", param)
        if "*" in param:
            types.append(ctypes.c_void_p)
        elif scalar is not None and scalar.group(1) in _SCALARS:
            types.append(_SCALARS[scalar.group(1)])
        else:  # undeclared, a 64-bit pointer or size would go through ctypes as a 32-bit C int
            raise CppCompileError(f"minductor: kernel {name} takes a parameter {param!r} of no known type")
    fn.argtypes = types
    return fn


_SCALARS = {"int64_t": ctypes.c_int64, "long": ctypes.c_long, "int": ctypes.c_int, "double": ctypes.c_double,
            "float": ctypes.c_float}


def compile_and_load_many(items: list[tuple[str, str]]) -> list[Callable[..., None]]:
    """Compile ``(source, kernel_name)`` pairs (misses in parallel, batched) and load them, in order."""
    keys = [(cache_key(source), name) for source, name in items]
    todo = {k: source for k, (source, _) in zip(keys, items) if k not in _loaded}
    misses: dict[tuple[str, str], str] = {}
    for k, source in todo.items():
        so = _key_dir(k[0]) / f"{k[1]}.so"
        if so.exists():  # compiled alone before
            _count(hit=True)
            _loaded[k] = load_cpp_kernel(so, k[1], source)
        else:
            misses[k] = source
    if misses:
        _compile_all(misses)
    return [_loaded[k] for k in keys]


def _batches(todo: dict[tuple[str, str], str]) -> list[list[tuple[tuple[str, str], str]]]:
    """Split the kernels into at most ``compile_threads`` contiguous batches of similar size."""
    jobs = list(todo.items())
    count = max(1, min(config.compile_threads, len(jobs)))
    size = -(-len(jobs) // count)
    return [jobs[i:i + size] for i in range(0, len(jobs), size)]


def _compile_batch(batch: list[tuple[tuple[str, str], str]], parts: int = 1) -> None:
    if len(batch) == 1:
        (key, name), source = batch[0]
        _loaded[(key, name)] = load_cpp_kernel(_compile(source, name, key, parts=parts), name, source)
        return
    source = "\n".join(src for _, src in batch)
    name = f"mi_batch_{batch[0][0][1]}_{len(batch)}"
    try:
        so = _compile(source, name, cache_key(source), kernels=len(batch))
    except CppCompileError:
        for item in batch:  # compile alone: the error then names the kernel that fails
            _compile_batch([item])
        return
    lib = ctypes.CDLL(str(so))
    for key, src in batch:
        fn = getattr(lib, key[1])
        fn.restype = None
        _loaded[key] = with_argtypes(fn, src, key[1])


def _compile_all(todo: dict[tuple[str, str], str]) -> None:
    batches = _batches(todo)
    if len(batches) == 1:
        # a lone kernel still uses the threads if its source is split into parts
        parts = source_parts(batches[0][0][1]) if len(todo) == 1 else 1
        _compile_batch(batches[0], parts=parts if parts <= config.compile_threads else 1)
        return
    with ThreadPoolExecutor(len(batches), thread_name_prefix="minductor-cxx") as pool:
        for future in [pool.submit(_compile_batch, b) for b in batches]:
            future.result()
