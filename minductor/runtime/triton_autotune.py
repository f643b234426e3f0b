"""Optional autotuning of Triton kernels (``config.triton_autotune``): on the first call for a
given kernel and size key, launch the kernel under each candidate block configuration, time it
and keep the fastest for every later call.

Timing is only meaningful on a GPU (``triton.testing.do_bench``). For other tensors nothing
is timed and the heuristic configuration (always the first candidate) runs, unless a test
installs a timer with ``set_timer`` -- then every candidate really runs (in Triton's
interpreter on CPU), so the selection loop and each configuration's correctness are tested
without a GPU. Kernels whose launch is not idempotent (atomic adds, buffers updated in place)
are never autotuned: repeated benchmark launches would change their results.
"""
from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("minductor")

Config = dict[str, int]
Timer = Callable[[Callable[[], None]], float]

_winners: dict[tuple[Any, ...], Config] = {}
_timer: Timer | None = None
_noted_untimed = False


def set_timer(timer: Timer | None) -> None:
    """Time candidates with ``timer(run) -> seconds`` on any device (tests); ``None`` restores
    the default (``do_bench`` on a GPU, no timing elsewhere)."""
    global _timer
    _timer = timer


def clear_cache() -> None:
    _winners.clear()


def _gpu_timer(run: Callable[[], None]) -> float:
    from triton.testing import do_bench

    return float(do_bench(run, warmup=5, rep=20))


def _pick_timer(args: Sequence[Any]) -> Timer | None:
    if _timer is not None:
        return _timer
    if any(getattr(a, "is_cuda", False) for a in args):
        return _gpu_timer
    _note_untimed()
    return None


def _note_untimed() -> None:
    """Say once per process that the flag has no effect here (printed when ``config.debug`` is on)."""
    global _noted_untimed
    if _noted_untimed:
        return
    _noted_untimed = True
    from minductor import config

    message = ("minductor: triton_autotune is on, but these Triton kernels do not run on a GPU: "
               "nothing is timed, the heuristic block sizes run")
    log.info(message)
    if config.debug:
        print(message, file=sys.stderr)


def _time(timer: Timer, launch: Callable[[Config], None], cfg: Config) -> float:
    """The time of one candidate; infinite when it does not fit the device (a bigger block can need
    more shared memory than the GPU has: a 128x128 fp32 matmul tile needs 128 KiB, sm_86 has 99 KiB)."""
    from triton.runtime.errors import OutOfResources

    try:
        return timer(lambda: launch(cfg))
    except OutOfResources as e:
        log.info("minductor: autotune candidate %s skipped: %s", cfg, e)
        return math.inf


def autotune_launch(name: str, kernel: Any, grid: Callable[[Config], tuple[int, ...]], args: Sequence[Any],
                    candidates: Sequence[Config]) -> None:
    """Launch ``kernel`` with the best of ``candidates`` (each a dict of its block constexprs and
    ``num_warps``) for the size key of ``args`` (its integer arguments), timing them on the first call."""
    key = (name, *(a for a in args if isinstance(a, int)))

    def launch(cfg: Config) -> None:
        kernel[grid(cfg)](*args, **cfg)

    best = _winners.get(key)
    if best is None:
        timer = _pick_timer(args)
        if timer is None or len(candidates) == 1:
            best = candidates[0]
        else:
            times = [_time(timer, launch, cfg) for cfg in candidates]
            if all(t == math.inf for t in times):
                raise RuntimeError(f"minductor: no block configuration of Triton kernel {name} fits the device: "
                                   f"{list(candidates)}; set minductor.config.triton_autotune = False")
            best = candidates[min(range(len(candidates)), key=times.__getitem__)]
            log.info("minductor: autotuned %s: %s (%s)", name, best,
                     ", ".join(f"{c}: {t:.4g}" for c, t in zip(candidates, times)))
        _winners[key] = best
    launch(best)


__all__ = ["autotune_launch", "clear_cache", "set_timer"]
