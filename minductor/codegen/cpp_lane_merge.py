"""Combining a reduction's accumulator lanes after its lane loop (codegen/cpp.py's lane nests,
and each row of rows reduced in streams, cpp_read_streams.py)."""
from __future__ import annotations

from minductor.codegen.common import CodeBuffer


def emit_pairwise_tree(code: CodeBuffer, array: str, width: int, combine: str) -> None:
    """Fold ``width`` (a power of two) lanes of ``array`` into its element 0 by halving, each
    level one vector op: a chain of lanes - 1 dependent combines cost ~5% of a 4096-wide row
    sum. Levels of constant width become shuffles; a loop over the width went through the stack
    (attention's 128-wide rows: 7% of it). ``combine``: a format of ``{a}`` and ``{b}``."""
    for w in [width >> k for k in range(1, width.bit_length())]:
        pair = combine.format(a=f"{array}[mi_l]", b=f"{array}[mi_l + {w}]")
        code.writeline("#pragma omp simd")
        code.writeline(f"for (int mi_l = 0; mi_l < {w}; mi_l++) {array}[mi_l] = {pair};")


def emit_welford_merge(code: CodeBuffer, acc: str, ctype: str, lanes: int | str, count: str) -> None:
    """Welford lanes (``acc``'s mean and m2 arrays) that have each seen ``count`` values merged
    into lane 0: the mean of the lane means, and the m2s plus ``count`` times the spread of
    those means (no division per lane); the scalar tail then keeps updating lane 0."""
    code.writeline("{")
    with code.indent(open_brace=False):
        code.writeline(f"{ctype} mi_sum = 0, mi_m2 = 0;")
        code.writeline("#pragma omp simd reduction(+:mi_sum)")
        code.writeline(f"for (int mi_l = 0; mi_l < {lanes}; mi_l++) mi_sum += {acc}_mean[mi_l];")
        code.writeline(f"const {ctype} mi_mean = mi_sum / static_cast<{ctype}>({lanes});")
        code.writeline("#pragma omp simd reduction(+:mi_m2)")
        code.writeline(f"for (int mi_l = 0; mi_l < {lanes}; mi_l++) mi_m2 += {acc}_m2[mi_l] + {count} * "
                       f"(({acc}_mean[mi_l] - mi_mean) * ({acc}_mean[mi_l] - mi_mean));")
        code.writeline(f"{acc}_mean[0] = mi_mean; {acc}_m2[0] = mi_m2;")
    code.writeline("}")
