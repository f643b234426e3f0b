"""The Triton matmul template: ``mm``/``addmm``/``bmm`` as a blocked ``tl.dot`` kernel with the
pointwise group that consumes its result fused in as an epilogue.

The lowering keeps these extern calls; the wrapper asks ``plan_templates`` which of them to
generate here instead (Triton selected, float32/float16/bfloat16, static sizes, strided inputs).
A template whose result is read only by the very next pointwise group over the same
``[B x] M x N`` range -- elementwise, with nothing in between touching its inputs -- is emitted at
that group's place, the epilogue reading the accumulator instead of memory; the matmul result is
stored only if someone else reads it. Everything else stays an extern (aten) call.

One program computes one ``[BLOCK_M, BLOCK_N]`` tile (program ids 0 and 1) of one batch entry
(program id 2 for bmm), accumulating in float32. float16 and bfloat16 tiles go to ``tl.dot`` as
they are (tensor-core MMA on a GPU; under Triton's interpreter, runtime/triton_helpers.py widens
bf16 operands of ``tl.dot``, which the interpreter would otherwise multiply as raw bits).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from minductor import config
from minductor.codegen.common import CodeBuffer, KernelCode
from minductor.codegen.triton import LoopState, TritonKernel, autotune_call, triton_index
from minductor.codegen.triton_heuristics import candidate_configs, next_power_of_2
from minductor.codegen.triton_ops import TV, TritonOps
from minductor.ir.indexing import make_vars
from minductor.ir.nodes import Buffer, ExternKernelOut
from minductor.ir.views import ReinterpretView
from minductor.scheduler.deps import MemoryDep
from minductor.scheduler.nodes import ExternSchedulerNode, FusedGroup
from minductor.virtualized import V

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# the templated ops and the rank of their output
# (baddbmm never gets here: the decompositions turn it into bmm and a pointwise epilogue)
_RANK = {aten.mm.out: 2, aten.addmm.out: 2, aten.bmm.out: 3}
_WITH_BIAS = (aten.addmm.out,)
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
    if not isinstance(node, ExternKernelOut) or node.op not in _RANK:
        return False
    device = node.get_device()
    if device.type != "cuda" and config.cpu_backend != "triton":
        return False
    rank = _RANK[node.op]
    mats = node.args[-2:]
    ops = [_operand(m) for m in mats]
    if any(o is None or len(o[1]) != rank for o in ops) or node.get_dtype() not in _DTYPES:
        return False
    if rank == 3 and ops[0][1][0] != ops[1][1][0]:
        return False
    if any(m.get_dtype() != node.get_dtype() for m in mats) or ops[0][1][-1] == 0:
        return False
    if node.op in _WITH_BIAS:
        bias = _operand(node.args[0])
        if bias is None or bias[0] is None or not isinstance(node.kwargs.get("beta", 1), (int, float)):
            return False
    if not all(sympy.sympify(s).is_Integer for s in node.layout.size):
        return False
    # grid axes 1 and 2 (column tiles, batch) are limited to 65535 programs on a GPU
    size = [int(s) for s in node.layout.size]
    return size[-1] <= 64 * 65535 and (rank == 2 or size[0] <= 65535)


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
        self.sizes = [int(s) for s in plan.mm.layout.size]  # [B,] M, N
        self.batched = len(self.sizes) == 3

    def generate(self) -> KernelCode:
        mm = self.plan.mm
        m, n = self.sizes[-2:]
        k = _operand(mm.args[-2])[1][-1]
        bm, bn, bk = (min(64, max(16, next_power_of_2(s))) for s in (m, n, k))
        self.two_d, self.n_outer = True, len(self.sizes)
        state = LoopState("RBLOCK0", False, CodeBuffer(), CodeBuffer(), CodeBuffer())
        self.loop, self.out = state, state.body
        xs = make_vars("x", len(self.sizes))
        for v, s, d in zip(xs, self.sizes, ([frozenset()] if self.batched else []) + [X, R]):
            self.range_of[v] = sympy.Integer(s)
            self.var_dims[v.name] = d
        self._k_loop(state.body, xs, k)
        with V.set_ops(TritonOps(self)), V.set_kernel(self):
            value = self._mm_value(TV("acc", torch.float32, X | R), xs)
            index = mm.layout.make_indexer()(xs)
            if self.plan.epilogue is None or self.plan.store_mm:
                self.store(mm.name, index, value, None)
            self.store_cache[(mm.name, self.index_str(index)[0])] = V.ops.to_dtype(value, mm.get_dtype())
            for node in self.group.nodes:
                node.run(xs, [])
        return self._render(state, bm, bn, bk)

    def _k_loop(self, body: CodeBuffer, xs: list[sympy.Symbol], k: int) -> None:
        mm = self.plan.mm
        rows, cols = xs[-2:]
        a_name, _, sa, a_off = _operand(mm.args[-2])
        b_name, _, sb, b_off = _operand(mm.args[-1])
        a, b = self.args.input(a_name), self.args.input(b_name)
        a_base, b_base = str(a_off), str(b_off)
        if self.batched:
            a_base += f" + {xs[0]} * {sa[0]}"
            b_base += f" + {xs[0]} * {sb[0]}"
        body.writeline("acc = tl.zeros([XBLOCK, RBLOCK0], tl.float32)")
        body.writeline(f"for koffset in range(0, {k}, KBLOCK):")
        body.writeline("    kindex = koffset + tl.arange(0, KBLOCK)")
        body.writeline(f"    a = tl.load({a} + ({a_base} + {rows} * {sa[-2]} + kindex[None, :] * {sa[-1]}), "
                       f"xmask & (kindex[None, :] < {k}), other=0)")
        body.writeline(f"    b = tl.load({b} + ({b_base} + kindex[:, None] * {sb[-2]} + {cols} * {sb[-1]}), "
                       f"(kindex[:, None] < {k}) & rmask, other=0)")
        # fp32 exactly as eager (no tf32); fp16/bf16 tiles straight into the MMA, fp32 accumulator
        precision = ', input_precision="ieee"' if mm.get_dtype() == torch.float32 else ""
        body.writeline(f"    acc += tl.dot(a, b{precision})")

    def _mm_value(self, acc: TV, xs: list[sympy.Symbol]) -> TV:
        mm = self.plan.mm
        if mm.op not in _WITH_BIAS:
            return acc
        alpha, beta = mm.kwargs.get("alpha", 1), mm.kwargs.get("beta", 1)
        name, size, stride, offset = _operand(mm.args[0])
        # the bias broadcasts against the output from the right
        rank = len(xs)
        full = [0] * (rank - len(size)) + stride
        sizes = [1] * (rank - len(size)) + size
        index = offset + sum(st * v for st, v, s in zip(full, xs, sizes) if s != 1)
        ops = V.ops
        value = acc if alpha == 1 else ops.mul(acc, ops.constant(alpha, torch.float32))
        if beta == 0:
            return value
        bias = ops.load(name, index)
        return ops.add(value, bias if beta == 1 else ops.mul(bias, ops.constant(beta, torch.float32)))

    def _offsets_need_int64(self) -> bool:
        """Whether an element offset of an operand or of the result can reach 2**31."""
        mm = self.plan.mm
        extents = [sum((s - 1) * abs(st) for s, st in zip(o[1], o[2])) + o[3]
                   for o in (_operand(a) for a in mm.args[-2:])]
        stride = [int(st) for st in mm.layout.stride]
        extents.append(sum((s - 1) * abs(st) for s, st in zip(self.sizes, stride)))
        return max(extents) >= 2**31

    def _render(self, state: LoopState, bm: int, bn: int, bk: int) -> KernelCode:
        m, n = self.sizes[-2:]
        op = "bmm" if self.batched else "mm"
        origins = sorted({o for nd in self.group.nodes for o in nd.node.origins} | {op})[:6]
        name = "triton_tem_fused_" + "_".join([*origins, str(self.index)])
        buffers = self.args.call_order()
        params = [arg for _, arg, _ in buffers] + ["XBLOCK: tl.constexpr", "RBLOCK0: tl.constexpr", "KBLOCK: tl.constexpr"]
        pid = "tl.program_id({}).to(tl.int64)" if self._offsets_need_int64() else "tl.program_id({})"
        rows, cols = ("x1", "x2") if self.batched else ("x0", "x1")
        src = CodeBuffer()
        for line in self._imports():
            src.writeline(line)
        src.writeline("@triton.jit")
        src.writeline(f"def {name}({', '.join(params)}):")
        with src.indent(open_brace=False):
            epilogue = " + epilogue " + ", ".join(self.group.names()) if self.group.nodes else ""
            src.writeline(f"# {op} {self.plan.mm.name}{epilogue}")
            src.writeline(f"xindex = {pid.format(0)} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
            src.writeline(f"xmask = xindex < {m}")
            src.writeline(f"rindex = {pid.format(1)} * RBLOCK0 + tl.arange(0, RBLOCK0)[None, :]")
            src.writeline(f"rmask = rindex < {n}")
            if self.batched:
                src.writeline(f"x0 = {pid.format(2)}  # batch entry")
            src.writeline(f"{rows} = xindex")
            src.writeline(f"{cols} = rindex")
            src.splice(state.body)
        grid = [f"triton.cdiv({m}, {bm})", f"triton.cdiv({n}, {bn})"] + [str(b) for b in self.sizes[:-2]]
        args = [buf for buf, _, _ in buffers] + [f"XBLOCK={bm}", f"RBLOCK0={bn}", f"KBLOCK={bk}", "num_warps=4"]
        call = f"{name}[({', '.join(grid)})]({', '.join(args)})"
        if self.autotunable(src.getvalue()):
            limits = {"XBLOCK": min(128, max(16, next_power_of_2(m))), "RBLOCK0": min(128, max(16, next_power_of_2(n)))}
            batch = "".join(f", {b}" for b in self.sizes[:-2])
            grid_fn = f"lambda c: (triton.cdiv({m}, c['XBLOCK']), triton.cdiv({n}, c['RBLOCK0']){batch})"
            candidates = candidate_configs({"XBLOCK": bm, "RBLOCK0": bn, "KBLOCK": bk}, 4, limits, min_block=16)
            call = autotune_call(name, src.getvalue(), grid_fn, [buf for buf, _, _ in buffers], candidates)
        if 0 in self.sizes:
            call = "pass  # empty matmul"
        code = self.kernel_code(name, src.getvalue(), call, [], {"XBLOCK": bm, "RBLOCK0": bn, "KBLOCK": bk})
        # an epilogue that absorbs the matmul result: nothing reads it from memory, never allocate it
        absorbed = self.plan.epilogue is not None and not self.plan.store_mm
        code.local_buffers = frozenset({self.plan.mm.name} if absorbed else ())
        return code


def codegen_template(plan: TemplatePlan, index: int) -> KernelCode:
    return TritonTemplateKernel(plan, index).generate()


__all__ = ["TemplatePlan", "codegen_template", "plan_templates", "template_fits", "triton_index"]
