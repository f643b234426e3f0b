"""Block sizes and warps for a Triton kernel, from its sizes (hints for symbolic ones).

Rows up to ``PERSISTENT_RNUMEL`` that are known at compile time are reduced in one block
(persistent); longer or symbolic rows loop over ``LOOPED_RBLOCK`` chunks. ``XBLOCK`` then
fills a block of about ``BLOCK_ELEMENTS`` elements. One warp covers 32 threads; we give a
warp to every 256 elements of a block, up to 8.
"""
from __future__ import annotations

import dataclasses

import sympy

from minductor.virtualized import V

PERSISTENT_RNUMEL = 1024
LOOPED_RBLOCK = 512
BLOCK_ELEMENTS = 4096
POINTWISE_XBLOCK = 1024
TILE = 64


@dataclasses.dataclass
class BlockConfig:
    xblock: int
    rblocks: list[int | None]  # per loop; None for an x-only loop
    looped: list[bool]
    num_warps: int
    int64: bool  # index math needs 64 bits


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pick_config(xnumel: sympy.Expr, inner_numels: list[sympy.Expr], two_d: bool, reductions: list[bool],
                tiled: bool = False) -> BlockConfig:
    """``tiled``: a transposing pointwise kernel, covered by ``TILE x TILE`` blocks."""
    hint = V.graph.sizevars.hint
    if tiled:
        rn = int(hint(inner_numels[0]))
        rblock = min(TILE, next_power_of_2(rn))
        xblock = min(TILE, next_power_of_2(int(hint(xnumel))))
        return BlockConfig(xblock, [rblock], [rn > rblock], 4, int(hint(xnumel)) * rn >= 2**31)
    xn = max(1, int(hint(xnumel)))
    rblocks: list[int | None] = []
    looped: list[bool] = []
    for numel, is_red in zip(inner_numels, reductions):
        rn = int(hint(numel))
        if not two_d or (rn == 1 and not is_red and numel.is_Integer):
            rblocks.append(None)
            looped.append(False)
        elif numel.is_Integer and rn <= PERSISTENT_RNUMEL:
            rblocks.append(next_power_of_2(rn))
            looped.append(False)
        else:
            rblocks.append(min(LOOPED_RBLOCK, next_power_of_2(rn)))
            looped.append(True)
    widest = max([b for b in rblocks if b is not None], default=1)
    if two_d:
        xblock = min(next_power_of_2(xn), max(1, BLOCK_ELEMENTS // widest))
    else:
        xblock = min(next_power_of_2(xn), POINTWISE_XBLOCK)
    elements = xblock * widest
    num_warps = min(8, max(1, next_power_of_2(elements // 256)))
    big = xn * max([int(hint(n)) for n in inner_numels] or [1]) >= 2**31
    return BlockConfig(xblock, rblocks, looped, num_warps, big)


MAX_CANDIDATES = 12


def candidate_configs(base: dict[str, int], num_warps: int, limits: dict[str, int],
                      min_block: int = 1) -> list[dict[str, int]]:
    """Autotuning candidates around the heuristic ``base``: each block in ``limits`` halved or
    doubled (within ``[min_block, limit]``), crossed with half and double the warps. The
    heuristic configuration comes first (it is what runs when nothing can be timed)."""
    first = base | {"num_warps": num_warps}
    found = [first]
    warps = [w for w in (num_warps, num_warps // 2, num_warps * 2) if 1 <= w <= 8]
    for name, limit in limits.items():
        for block in (base[name] // 2, base[name] * 2):
            if not min_block <= block <= max(limit, min_block):
                continue
            for w in warps:
                found.append(base | {name: block, "num_warps": w})
    for w in warps[1:]:
        found.append(base | {"num_warps": w})
    unique = [dict(t) for t in dict.fromkeys(tuple(c.items()) for c in found)]
    return unique[:MAX_CANDIDATES]


__all__ = ["BlockConfig", "candidate_configs", "next_power_of_2", "pick_config"]
