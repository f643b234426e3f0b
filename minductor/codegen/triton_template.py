"""The Triton matmul template: ``mm``/``addmm``/``bmm`` as a blocked ``tl.dot`` kernel with the
pointwise group that consumes its result fused in as an epilogue (bmm: one batch per program
along the grid's third axis).

The lowering keeps mm/addmm/bmm extern calls; the wrapper asks ``plan_templates`` which of them to
generate here instead (Triton selected, float32/float16, static sizes, strided inputs). A
template whose result is read only by the very next pointwise group over the same
``M x N`` range -- elementwise, with nothing in between touching its inputs -- is emitted at that
group's place, the epilogue reading the accumulator instead of memory; the mm result is stored
only if someone else reads it. Everything else stays an extern (aten) call.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from minductor import config
from minductor.codegen.common import CodeBuffer, KernelCode
from minductor.codegen.triton import LoopState, TritonKernel, triton_index
from minductor.codegen.triton_heuristics import next_power_of_2
from minductor.codegen.triton_ops import TV, TritonOps
from minductor.ir.indexing import make_vars
from minductor.ir.nodes import Buffer, ExternKernelOut
from minductor.ir.views import ReinterpretView
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.nodes import ExternSchedulerNode, FusedGroup
from minductor.virtualized import V

aten = torch.ops.aten
# bfloat16 stays an extern call: Triton's interpreter multiplies bf16 blocks as raw bits, so a
# bf16 template could not be tested on CPU
_DTYPES = (torch.float32, torch.float16)
X, R = frozenset({"x"}), frozenset({"r"})


@dataclasses.dataclass
class TemplatePlan:
    mm: ExternKernelOut
    epilogue: FusedGroup | None
    store_mm: bool

    def input_names(self) -> set[str]:
        return {n.data.name if isinstance(n, ReinterpretView) else n.name
                for n in self.mm.args if isinstance(n, (Buffer, ReinterpretView))}


def _operand(node: Any) -> tuple[str, list[int], list[int], int] | None:
    """(buffer name, size, stride, offset) of a static strided operand, else None."""
    if isinstance(node, ReinterpretView):
        name, layout = node.data.name, node.layout
    elif isinstance(node, Buffer):
        name, layout = node.name, node.layout
    else:
        return None
    values = [*layout.size, *layout.stride, layout.offset]
    if not all(sympy.sympify(v).is_Integer for v in values):
        return None
    return name, [int(s) for s in layout.size], [int(s) for s in layout.stride], int(layout.offset)


def template_fits(node: Any) -> bool:
    if not isinstance(node, ExternKernelOut) or node.op not in (aten.mm.out, aten.addmm.out, aten.bmm.out):
        return False
    device = node.get_device()
    if device.type != "cuda" and config.cpu_backend != "triton":
        return False
    mats = node.args[-2:]
    ops = [_operand(m) for m in mats]
    rank = 3 if node.op is aten.bmm.out else 2
    if any(o is None or len(o[1]) != rank for o in ops) or node.get_dtype() not in _DTYPES:
        return False
    if rank == 3 and ops[0][1][0] != ops[1][1][0]:
        return False
    if any(m.get_dtype() != node.get_dtype() for m in mats) or ops[0][1][-1] == 0:
        return False
    if node.op is aten.addmm.out:
        bias = _operand(node.args[0])
        if bias is None or bias[0] is None or not isinstance(node.kwargs.get("beta", 1), (int, float)):
            return False
    return all(sympy.sympify(s).is_Integer for s in node.layout.size)


def _epilogue_fits(mm: ExternKernelOut, group: FusedGroup) -> bool:
    size = [int(s) for s in mm.layout.size]
    if group.has_reduction() or group.has_mutation() or 1 in size or list(group.outer) != [sympy.Integer(s) for s in size]:
        return False
    want = mm.layout.make_indexer()(make_vars("x", len(size)))
    for node in group.nodes:
        if node.pw_ranges != group.outer:
            return False
        for dep in node.read_writes.reads:
            if dep.name == mm.name and (not isinstance(dep, MemoryDep) or sympy.expand(dep.index - want) != 0):
                return False
    return True


def plan_templates(units: list[Any], outputs: set[str]) -> dict[int, TemplatePlan]:
    """Unit index -> the template emitted there (an mm unit, or the epilogue group it joins)."""
    plans: dict[int, TemplatePlan] = {}
    for i, unit in enumerate(units):
        if not isinstance(unit, ExternSchedulerNode) or not template_fits(unit.node):
            continue
        mm = unit.node
        inputs = TemplatePlan(mm, None, True).input_names()
        readers = [j for j, u in enumerate(units) if j != i and mm.name in u.read_names()]
        target = None
        for j in range(i + 1, len(units)):
            u = units[j]
            if isinstance(u, FusedGroup) and mm.name in u.read_names():
                target = j if _epilogue_fits(mm, u) and j not in plans else None
                break
            if mm.name in u.read_names() or u.write_names() & inputs:
                break
        if target is None:
            plans[i] = TemplatePlan(mm, None, True)
        else:
            store = mm.name in outputs or len(readers) > 1
            plans[i] = TemplatePlan(mm, None, False)  # emitted later, at the epilogue
            plans[target] = TemplatePlan(mm, units[target], store)
    return plans


class TritonTemplateKernel(TritonKernel):
    """One ``[BLOCK_M, BLOCK_N]`` output tile per program: a K loop of ``tl.dot``, then the epilogue."""

    def __init__(self, plan: TemplatePlan, index: int) -> None:
        group = plan.epilogue or FusedGroup([], list(plan.mm.layout.size))
        super().__init__(group, index)
        self.plan = plan

    def generate(self) -> KernelCode:
        mm = self.plan.mm
        *batch, m, n = (int(s) for s in mm.layout.size)
        a_name, _, sa, a_off = _operand(mm.args[-2])
        b_name, _, sb, b_off = _operand(mm.args[-1])
        k = int(_operand(mm.args[-2])[1][-1])
        bm, bn, bk = (min(64, max(16, next_power_of_2(s))) for s in (m, n, k))
        self.two_d, self.n_outer = True, 2
        state = LoopState("RBLOCK0", False, CodeBuffer(), CodeBuffer(), CodeBuffer())
        self.loop, self.out = state, state.body
        # bmm: x0 is the batch (one per program along grid axis 2, a scalar), rows and columns follow
        *zs, xm, xn = make_vars("x", 2 + len(batch))
        for v, s, d in [*((z, b, frozenset()) for z, b in zip(zs, batch)), (xm, m, X), (xn, n, R)]:
            self.range_of[v] = sympy.Integer(s)
            self.var_dims[v.name] = d
        a, b = self.args.input(a_name), self.args.input(b_name)
        za = "".join(f"{z} * {st} + " for z, st in zip(zs, sa[:-2]))
        zb = "".join(f"{z} * {st} + " for z, st in zip(zs, sb[:-2]))
        precision = ', input_precision="ieee"' if mm.get_dtype() == torch.float32 else ""
        body = state.body
        body.writeline("acc = tl.zeros([XBLOCK, RBLOCK0], tl.float32)")
        body.writeline(f"for koffset in range(0, {k}, KBLOCK):")
        body.writeline("    kindex = koffset + tl.arange(0, KBLOCK)")
        body.writeline(f"    a = tl.load({a} + ({a_off} + {za}{xm} * {sa[-2]} + kindex[None, :] * {sa[-1]}), "
                       f"xmask & (kindex[None, :] < {k}), other=0)")
        body.writeline(f"    b = tl.load({b} + ({b_off} + {zb}kindex[:, None] * {sb[-2]} + {xn} * {sb[-1]}), "
                       f"(kindex[:, None] < {k}) & rmask, other=0)")
        body.writeline(f"    acc += tl.dot(a, b{precision})")
        with V.set_ops(TritonOps(self)), V.set_kernel(self):
            value = self._mm_value(TV("acc", torch.float32, X | R), xm, xn)
            index = mm.layout.make_indexer()([*zs, xm, xn])
            if self.plan.epilogue is None or self.plan.store_mm:
                self.store(mm.name, index, value, None)
            self.store_cache[(mm.name, self.index_str(index)[0])] = V.ops.to_dtype(value, mm.get_dtype())
            for node in self.group.nodes:
                node.run([*zs, xm, xn], [])
        return self._render(state, [*zs, xm, xn], batch, m, n, bm, bn, bk)

    def _mm_value(self, acc: TV, x0: sympy.Symbol, x1: sympy.Symbol) -> TV:
        mm = self.plan.mm
        if mm.op is not aten.addmm.out:
            return acc
        alpha, beta = mm.kwargs.get("alpha", 1), mm.kwargs.get("beta", 1)
        name, size, stride, offset = _operand(mm.args[0])
        # the bias broadcasts against [M, N] from the right
        full = [0] * (2 - len(size)) + stride
        sizes = [1] * (2 - len(size)) + size
        index = offset + sum(st * v for st, v, s in zip(full, (x0, x1), sizes) if s != 1)
        ops = V.ops
        value = acc if alpha == 1 else ops.mul(acc, ops.constant(alpha, torch.float32))
        bias = ops.load(name, index)
        if beta == 0:
            return value
        return ops.add(value, bias if beta == 1 else ops.mul(bias, ops.constant(beta, torch.float32)))

    def _render(self, state: LoopState, xs: list[sympy.Symbol], batch: list[int], m: int, n: int,
                bm: int, bn: int, bk: int) -> KernelCode:
        origins = sorted({o for nd in self.group.nodes for o in nd.node.origins} | {"mm"})[:6]
        name = "triton_tem_fused_" + "_".join([*origins, str(self.index)])
        buffers = self.args.call_order()
        params = [arg for _, arg, _ in buffers] + ["XBLOCK: tl.constexpr", "RBLOCK0: tl.constexpr", "KBLOCK: tl.constexpr"]
        src = CodeBuffer()
        for line in self._imports():
            src.writeline(line)
        src.writeline("@triton.jit")
        src.writeline(f"def {name}({', '.join(params)}):")
        with src.indent(open_brace=False):
            src.writeline(f"# matmul {self.plan.mm.name}{' + epilogue ' + ', '.join(self.group.names()) if self.group.nodes else ''}")
            *zs, xm, xn = xs
            for z in zs:
                src.writeline(f"{z} = tl.program_id(2)")
            src.writeline("xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
            src.writeline(f"xmask = xindex < {m}")
            src.writeline(f"{xm} = xindex")
            src.writeline("rindex = tl.program_id(1) * RBLOCK0 + tl.arange(0, RBLOCK0)[None, :]")
            src.writeline(f"rmask = rindex < {n}")
            src.writeline(f"{xn} = rindex")
            src.splice(state.body)
        grid = f"(triton.cdiv({m}, {bm}), triton.cdiv({n}, {bn}){''.join(f', {b}' for b in batch)})"
        args = [buf for buf, _, _ in buffers] + [f"XBLOCK={bm}", f"RBLOCK0={bn}", f"KBLOCK={bk}", "num_warps=4"]
        call = f"{name}[{grid}]({', '.join(args)})"
        if self.autotunable(src.getvalue()):
            from minductor.codegen.triton import autotune_call
            from minductor.codegen.triton_heuristics import candidate_configs

            limits = {"XBLOCK": min(128, max(16, next_power_of_2(m))), "RBLOCK0": min(128, max(16, next_power_of_2(n)))}
            grid_fn = f"lambda c: (triton.cdiv({m}, c['XBLOCK']), triton.cdiv({n}, c['RBLOCK0']){''.join(f', {b}' for b in batch)})"
            candidates = candidate_configs({"XBLOCK": bm, "RBLOCK0": bn, "KBLOCK": bk}, 4, limits, min_block=16)
            call = autotune_call(name, src.getvalue(), grid_fn, [buf for buf, _, _ in buffers], candidates)
        if m == 0 or n == 0 or 0 in batch:
            call = "pass  # empty matmul"
        return self.kernel_code(name, src.getvalue(), call, [], {"XBLOCK": bm, "RBLOCK0": bn, "KBLOCK": bk})


def codegen_template(plan: TemplatePlan, index: int) -> KernelCode:
    return TritonTemplateKernel(plan, index).generate()


__all__ = ["TemplatePlan", "codegen_template", "plan_templates", "template_fits", "triton_index"]
