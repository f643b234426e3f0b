"""GRU and einsum on the XLA path vs eager and TorchInductor.

GRU (input 64, hidden 128, batch 32) at sequence lengths 32/128/512, inference: compile time
(first call, fresh process, empty caches) and median run time, for eager ``torch.nn.GRU``,
TorchInductor (``allow_rnn``: the recurrence is unrolled) and minductor's scan path
(``minductor.nn.GRU``). Then einsum shapes from attention and bilinear layers: median run time
of minductor (one XLA contraction where it contracts enough work, ``config.einsum_xla_min_work``;
natively below) vs TorchInductor and eager.

    python benchmarks/gru.py                   # everything (TorchInductor at 512 takes minutes)
    python benchmarks/gru.py --skip-inductor-above 128
    python benchmarks/gru.py --only einsum
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

GRU_CHILD = r"""
import json, sys, time, statistics, torch
backend, seq, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
torch._dynamo.config.allow_rnn = True
if backend == "minductor":
    import minductor
    model = minductor.nn.GRU(64, 128, batch_first=True)
else:
    model = torch.nn.GRU(64, 128, batch_first=True)
x = torch.randn(32, seq, 64)
fn = model if backend == "eager" else torch.compile(model, backend=backend)
with torch.no_grad():
    start = time.perf_counter()
    fn(x)
    compile_s = time.perf_counter() - start
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
print(json.dumps({"compile_s": compile_s, "run_ms": 1e3 * statistics.median(times)}))
"""

EINSUMS = {
    "attention_scores": ("bhqd,bhkd->bhqk", [(8, 8, 128, 64), (8, 8, 128, 64)]),
    "attention_values": ("bhqk,bhkd->bhqd", [(8, 8, 128, 128), (8, 8, 128, 64)]),
    "bilinear": ("bi,oij,bj->bo", [(64, 128), (64, 128, 128), (64, 128)]),
    "projection": ("bsd,hd->bsh", [(16, 256, 256), (1024, 256)]),
}


def run_gru(seqs: list[int], skip_inductor_above: int, reps: int) -> None:
    print("== GRU(64 -> 128), batch 32, inference: compile time (first call, fresh process) and median run time")
    for seq in seqs:
        row = []
        for backend in ("eager", "inductor", "minductor"):
            if backend == "inductor" and seq > skip_inductor_above:
                row.append(f"{backend}: skipped")
                continue
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, MINDUCTOR_CACHE_DIR=tmp, TORCHINDUCTOR_CACHE_DIR=tmp)
                out = subprocess.run([sys.executable, "-c", GRU_CHILD, backend, str(seq), str(reps)], env=env,  # noqa: PLW1510
                                     capture_output=True, text=True)
            if out.returncode != 0:
                row.append(f"{backend}: failed ({out.stderr.strip().splitlines()[-1][:120]})")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            row.append(f"{backend}: compile {r['compile_s']:.2f} s, run {r['run_ms']:.2f} ms")
        print(f"seq {seq:4d} | " + " | ".join(row), flush=True)


def run_einsum(reps: int) -> None:
    import statistics
    import time

    import torch

    print("== einsum: median run time (ms)")
    for name, (equation, shapes) in EINSUMS.items():
        args = [torch.randn(s) for s in shapes]

        def fn(*xs: torch.Tensor, equation: str = equation) -> torch.Tensor:
            return torch.einsum(equation, *xs)

        row = []
        for backend in ("eager", "inductor", "minductor"):
            torch._dynamo.reset()
            f = fn if backend == "eager" else torch.compile(fn, backend=backend)
            with torch.no_grad():
                for _ in range(3):
                    f(*args)
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    f(*args)
                    times.append(time.perf_counter() - t)
            row.append((backend, 1e3 * statistics.median(times)))
        inductor = dict(row)["inductor"]
        cells = " | ".join(f"{b} {ms:.3f}" for b, ms in row)
        print(f"{name:17s} {equation:18s} | {cells} | minductor/inductor {dict(row)['minductor'] / inductor:.2f}x",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["gru", "einsum"])
    parser.add_argument("--seqs", default="32,128,512")
    parser.add_argument("--skip-inductor-above", type=int, default=10**9,
                        help="skip TorchInductor for longer sequences (it unrolls the recurrence: minutes at 512)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.only != "einsum":
        run_gru([int(s) for s in args.seqs.split(",")], args.skip_inductor_above, args.reps)
    if args.only != "gru":
        run_einsum(args.reps * 5)


if __name__ == "__main__":
    main()
