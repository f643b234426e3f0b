"""Pointwise loops of an outer-lane kernel (a reduction over the outer dims of a tile of
contiguous columns) that run over dims of their own: lanes innermost.

Squeeze-and-excitation over a channels-last tensor sums each image's channels over its pixels
(lanes across the channels, contiguous), then scales every pixel by its channel's
``sigmoid(mean)``. With the lane loop outside the pixel loop, each lane walked the image's
pixels 512 bytes apart, once per channel: 8.9 ms for a (8, 128, 56, 56) kernel whose data
take 0.2 ms to stream. The pixel loops now run outside and the lanes inside (unit stride).
What depends on the lane alone (the channel's scale) is computed once per tile into a lane
array before the pixel loops, not once per pixel.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from minductor.codegen.common import CodeBuffer, cpp_index
from minductor.codegen.cpp_stream import hoist_invariant_lines
from minductor.ir.indexing import affine_coeffs

if TYPE_CHECKING:
    from minductor.codegen.cpp import CppKernel
    from minductor.codegen.loop_shapes import MergedDims


def emit_lane_step(kernel: CppKernel, code: CodeBuffer, lane_loop: str, bind: str) -> None:
    """One step of an outer-lane reduction: the lane loop over the body, what does not depend
    on the lane run once before it (an embedding bag's row index and its check: per lane, GCC
    gathered the row, 288 us for 512 bags of 16 rows of 256; 58 hoisted)."""
    hoisted, rest = hoist_invariant_lines(kernel.body.lines, {str(kernel.tile_var)})
    for line in hoisted:
        code.writeline(line.strip())
    code.writeline("#pragma omp simd")
    code.writeline(lane_loop)
    with code.indent():
        code.writeline(bind)
        if hoisted:
            for line in rest:
                code.writeline(line.strip())
        else:
            code.splice(kernel.body)


def lanes_go_inside(kernel: CppKernel, pw: MergedDims) -> bool:
    """Whether the body stores along the tile variable at unit stride (and nowhere else)."""
    tile = kernel.tile_var
    if not pw.variables or not kernel.body_stores:
        return False
    for _, index, _ in kernel.body_stores:
        coeffs = affine_coeffs(index, [tile, *pw.variables])
        if coeffs is None or coeffs[tile] != 1:
            return False
    return True


def emit_lanes_inside(kernel: CppKernel, code: CodeBuffer, pw: MergedDims, lane_loop: str, bind: str) -> None:
    """The loops over ``pw`` around an ``omp simd`` loop over the lanes; the body's lines that
    depend on no ``pw`` variable fill lane arrays first (``mi_laneN``, one per value the rest of
    the body reads)."""
    body = [line.strip() for line in kernel.body.lines]
    hoisted, rest = hoist_invariant_lines(body, {str(v) for v in pw.variables})
    if any(line.startswith("mi_bad") for line in hoisted):  # (checks stay where they reduce)
        hoisted, rest = [], body
    # of those, the ones that vary with the lane; the others (constants) run once, as they are
    scalars, per_lane = hoist_invariant_lines(hoisted, str(kernel.tile_var))
    for line in scalars:
        code.writeline(line)
    read = {name for line in rest for name in re.findall(r"\btmp\d+\b", line)}
    used = [name for line in per_lane if (name := line.split(" = ", 1)[0].removeprefix("auto ")) in read]
    replaced = {}
    for k, name in enumerate(used):
        array = f"mi_lane{k}"
        code.writeline(f"auto {array}_fn = [&](int64_t mi_lane) {{")
        with code.indent(open_brace=False):
            code.writeline(bind)
            for line in per_lane:
                code.writeline(line)
            code.writeline(f"return {name};")
        code.writeline("};")
        code.writeline(f"alignas(64) mi_table_t<decltype({array}_fn(0))> {array}[{kernel.outer_lanes}];")
        code.writeline("#pragma omp simd")
        code.writeline(f"{lane_loop} {array}[mi_lane] = {array}_fn(mi_lane);")
        replaced[name] = array
    for var, size in zip(pw.variables, pw.sizes):
        code.writeline(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++)")
        code.writeline("{")
        code._indent += 1
    checks = any(line.startswith("mi_bad") for line in rest)  # (an index's bounds check)
    code.writeline("#pragma omp simd" + (" reduction(|:mi_bad)" if checks else ""))
    code.writeline(lane_loop)
    with code.indent():
        code.writeline(bind)
        for name, array in replaced.items():
            code.writeline(f"auto {name} = {array}[mi_lane];")
        for line in rest:
            code.writeline(line)
    for _ in pw.variables:
        code._indent -= 1
        code.writeline("}")
