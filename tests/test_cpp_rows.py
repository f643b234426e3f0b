"""Row scratch (codegen/cpp_rows.py): a pointwise value a row kernel stores and reads back in the
same row (softmax's exp) lives in a row-sized stack array, is stored and reduced in one loop,
and the output becomes a plain store that may stream; the exp loop prefetches the next row.

Every case compares with eager; the source checks say which path the kernel took.
"""
from __future__ import annotations

import re

import pytest
import torch

from minductor import config


def compiled(fn, *args, tmp_path, dynamic: bool = False, tol: float | None = None, **flags) -> str:
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path), **flags):
        got = torch.compile(fn, backend="minductor", dynamic=dynamic)(*args)
    torch.testing.assert_close(got, fn(*args), equal_nan=True, rtol=tol, atol=tol)
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("graph_*/cpp_*.cpp")))


def loop_functions(code: str) -> list[str]:
    return re.findall(r"MI_LOOP_FN void \w+\(.*?\n}\n}", code, flags=re.S)


@pytest.mark.parametrize("shape", [(64, 1000), (8, 4096), (3, 5, 77)], ids=["tail", "row4096", "3d"])
def test_softmax_keeps_its_exp_in_a_row_scratch(tmp_path, shape) -> None:
    x = torch.randn(shape) * 4
    code = compiled(lambda x: torch.softmax(x, -1), x, tmp_path=tmp_path)
    row = shape[-1]
    assert f"float mi_row0[{row}];" in code
    assert "in_out_ptr" not in code  # the output no longer takes the exps' storage
    # the exp is stored and summed in one loop, which prefetches the next row's input where its
    # lanes span a 64-byte line (the 77-wide rows take 8 lanes)
    (exp_loop,) = [f for f in loop_functions(code) if "mi_row0[ri0] =" in f]
    assert "tmp_acc" in exp_loop
    assert (f"__builtin_prefetch(&in_ptr0[{row} + mi_base" in exp_loop) == (row >= 1000)


def test_softmax_output_streams_once_it_is_no_longer_read_back(tmp_path) -> None:
    x = torch.randn(40, 600)
    code = compiled(lambda x: torch.softmax(x, -1), x, tmp_path=tmp_path, stream_store_min_bytes=1, stream_store_min_footprint=0)
    assert "mi_row0" in code and "mi_stream_store(" in code
    off = compiled(lambda x: torch.softmax(x, -1), x, tmp_path=tmp_path / "off", stream_store_min_bytes=1, stream_store_min_footprint=0, row_scratch=False)
    assert "mi_row0" not in off and "in_out_ptr0" in off and "mi_stream_store(" not in off


def test_float64_and_special_values(tmp_path) -> None:
    x = torch.randn(16, 130, dtype=torch.float64)
    assert "double mi_row0[130];" in compiled(lambda x: torch.softmax(x, -1), x, tmp_path=tmp_path)
    y = torch.randn(6, 50)
    y[0, 3], y[1, :] = float("nan"), float("-inf")
    y[2, 7] = float("inf")
    assert "mi_row0" in compiled(lambda y: torch.softmax(y, -1), y, tmp_path=tmp_path / "special")


def test_static_rows_beyond_the_cap_use_memory_and_dynamic_rows_a_scratch(tmp_path) -> None:
    """A static row above the cap stays in memory; a symbolic one takes a scratch sized at the
    cap, with a heap array for longer rows at run time (tests/test_dynamic.py runs those)."""
    from minductor.codegen.cpp_rows import ROW_SCRATCH_MAX_BYTES

    wide = torch.randn(3, ROW_SCRATCH_MAX_BYTES // 4 + 16)
    assert "mi_row" not in compiled(lambda x: torch.softmax(x, -1), wide, tmp_path=tmp_path / "wide")
    x = torch.randn(12, 300)
    dyn = compiled(lambda x: torch.softmax(x, -1), x, tmp_path=tmp_path / "dyn", dynamic=True)
    assert f"mi_row0_stack[{ROW_SCRATCH_MAX_BYTES // 4}]" in dyn and "__builtin_malloc(" in dyn


def test_values_read_elsewhere_in_the_row_stay_in_the_row_unfolded(tmp_path) -> None:
    """A value read back at another element of the row stays in the row scratch, but its loop
    is not folded into the sum's (the element read may not be stored yet there)."""
    x = torch.randn(20, 64)

    def flipped(x):  # the exp read back at another element of the row
        e = x.exp()
        return e / e.sum(-1, keepdim=True) + e.flip(-1)

    code = compiled(flipped, x, tmp_path=tmp_path / "flip")
    assert "mi_row0[63 - xi0]" in code or re.search(r"mi_row0\[63L? - \w+\]", code), code
    assert len(loop_functions(code)) == 3, code  # exp, sum, output: the exp loop stands alone


def test_values_read_outside_stay_in_memory(tmp_path) -> None:
    x = torch.randn(20, 64)

    def returned(x):  # the exp is also a graph output
        e = (x * 2).exp()
        return e / e.sum(-1, keepdim=True), e

    assert "mi_row" not in compiled(returned, x, tmp_path=tmp_path / "out")


def test_a_row_scratch_read_by_two_later_loops(tmp_path) -> None:
    x = torch.randn(32, 200)

    def f(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        s = e.sum(-1, keepdim=True)
        return e / s + (e * e).sum(-1, keepdim=True)

    assert "mi_row0" in compiled(f, x, tmp_path=tmp_path)


def random_row_program(rng):
    """A random chain of row-wise steps over one input that returns only its last value, so
    the values in between are internal to the kernel: costly pointwise values read by a row
    reduction and again later are the row scratch's candidates."""
    steps = [(rng.choice(["unary", "reduce", "reduce", "mix"]), rng.random()) for _ in range(rng.randint(2, 6))]

    def program(x):
        first = x
        for kind, p in steps:
            if kind == "unary":
                x = [torch.exp, torch.tanh, torch.sin, torch.sigmoid][int(p * 4)](x * 0.5)
            elif kind == "reduce":
                red = [lambda t: t.sum(-1, keepdim=True), lambda t: t.amax(-1, keepdim=True),
                       lambda t: t.mean(-1, keepdim=True)][int(p * 3)](x)
                x = x / (red.abs() + 1) if p < 0.5 else x - red
            else:
                x = x * first + 1
        return x

    return program


@pytest.mark.parametrize("seed", range(10))
def test_random_row_programs_match_eager(tmp_path, seed) -> None:
    import random

    rng = random.Random(seed)
    program = random_row_program(rng)
    x = torch.randn(rng.choice([3, 16]), rng.choice([7, 33, 128, 300]))
    # (chains of exp and division amplify float32 rounding; the error is the same either way)
    compiled(program, x, tmp_path=tmp_path, tol=1e-4)
    compiled(program, x, tmp_path=tmp_path / "off", tol=1e-4, row_scratch=False)


def test_random_row_programs_use_the_row_scratch(tmp_path) -> None:
    """At least some of the random programs above take the row scratch path (else they would
    test nothing new)."""
    import random

    used = 0
    for seed in range(10):
        rng = random.Random(seed)
        program = random_row_program(rng)
        x = torch.randn(rng.choice([3, 16]), rng.choice([7, 33, 128, 300]))
        used += "mi_row0" in compiled(program, x, tmp_path=tmp_path / str(seed), tol=1e-4)
    assert used >= 2, used


@pytest.mark.parametrize("name", ["strided_within_row", "next_row", "shifted_past_row"])
def test_a_consumer_of_other_inner_ranges_shares_the_row_only_within_it(name: str, tmp_path) -> None:
    """A pointwise consumer whose inner ranges differ from its producer's fuses over their
    common outer loops only when it reads the producer within the row the same iteration
    stored: then the producer's row lives in a row scratch. Reads of another row, or past
    the row's end, keep the producer in memory; results match eager either way."""
    x = torch.randn(6, 128)
    fns = {
        "strided_within_row": (lambda x: (y := x.exp() * 2)[:, ::18] + y[:, 1::18], True),
        "next_row": (lambda x: (y := x.exp() * 2)[1:, ::2] + y[:-1, ::2], False),
        "shifted_past_row": (lambda x: (x.exp() * 2).reshape(-1)[64:-64].reshape(5, 128)[:, ::2], False),
    }
    fn, shared = fns[name]
    code = compiled(fn, x, tmp_path=tmp_path)
    assert ("one row of it" in code) == shared, code


def test_a_costly_value_broadcast_many_times_is_computed_once(tmp_path) -> None:
    """A relative-position bias gathered from its table and added to every window's scores
    (Swin) is gathered once into a buffer, not again at each of the 64 windows: one kernel
    gathers (49 x 49 x 8 elements), the softmax's kernel reads the buffer; results match
    eager. A bias used once per element (no repeat) stays inlined."""
    from minductor import config

    def fn(s: torch.Tensor, t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return (s + t[i].permute(2, 0, 1)).softmax(-1)

    s, t, i = torch.randn(64, 8, 49, 49), torch.randn(169, 8), torch.randint(0, 169, (49, 49))
    with config.patch(debug=True, debug_dir=str(tmp_path / "repeat")), torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(s, t, i), fn(s, t, i))
    sources = [p.read_text() for p in (tmp_path / "repeat").glob("graph_*/cpp_*.cpp")]
    gathering = [src for src in sources if "static_cast<uint64_t>" in src]  # (an index's bounds check)
    assert len(sources) == 2 and len(gathering) == 1 and "mi_exp(" not in gathering[0], sources
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path / "once")), torch.no_grad():
        s1 = torch.randn(1, 8, 49, 49)
        torch.testing.assert_close(torch.compile(fn, backend="minductor")(s1, t, i), fn(s1, t, i))
    (source,) = [p.read_text() for p in (tmp_path / "once").glob("graph_*/cpp_*.cpp")]
    assert "mi_exp(" in source and "static_cast<uint64_t>" in source


def test_a_bias_costly_to_compute_broadcast_twice_is_computed_once(tmp_path) -> None:
    """A bias interpolated from its table and gathered (BEiT's: ~100 operations an element;
    here bicubic), added to the scores of each of 2 images: the interpolated table is computed
    once into a buffer before the gather reads it (``realize_if_gathered``), and the gather, a
    cheap one now, stays in the softmax, as a gather from a stored table (a row picked per
    element, repeated twice) does. Results match eager."""
    import torch.nn.functional as F

    from minductor import config

    def costly(s: torch.Tensor, t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        table = F.interpolate(t.t().reshape(1, 3, 13, 13), size=(15, 15), mode="bicubic").reshape(3, 225).t()
        return (s + table[i].permute(2, 0, 1)).softmax(-1)

    def cheap(s: torch.Tensor, t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return (s + t[i].permute(2, 0, 1)).softmax(-1)

    s, i = torch.randn(2, 3, 65, 65), torch.randint(0, 169, (65, 65))
    for name, fn, t, realized in [("costly", costly, torch.randn(169, 3), True), ("cheap", cheap, torch.randn(169, 3), False)]:
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / name)), torch.no_grad():
            torch.testing.assert_close(torch.compile(fn, backend="minductor")(s, t, i), fn(s, t, i))
        sources = [p.read_text() for p in (tmp_path / name).glob("graph_*/cpp_*.cpp")]
        softmax = [src for src in sources if "mi_exp(" in src]
        assert len(softmax) == 1 and len(sources) == 1 + realized, sources
        # the bicubic weights (A = -0.75) computed once a table element (15x15), not at every
        # gathered position (65x65)
        assert not any("0.75" in src and ("< 65;" in src or "< 4225;" in src) for src in sources), sources


def test_a_costly_mask_without_gathers_broadcast_is_computed_once(tmp_path) -> None:
    """Swin's shifted-window attention mask (an image of region ids from slice assignments,
    partitioned into windows, pairwise differences turned into 0 or -100: ~41 operations an
    element, no gather) is added to the scores of every image and head: computed once into a
    buffer (BROADCAST_REALIZE_DIRECT_OPS), not in each pass of the softmax (HF Swin's masked
    softmax kernels 111 and 57 us -> 39 and 20). A cheap broadcast (a bias) stays inlined."""
    from minductor import config

    def shifted(scores: torch.Tensor) -> torch.Tensor:
        img = torch.zeros(1, 8, 8, 1)
        cnt = 0
        for h in (slice(0, -4), slice(-4, -2), slice(-2, None)):
            for w in (slice(0, -4), slice(-4, -2), slice(-2, None)):
                img[:, h, w, :] = cnt
                cnt += 1
        win = img.view(1, 2, 4, 2, 4, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16)
        mask = win.unsqueeze(1) - win.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        return (scores.view(2, 4, 3, 16, 16) + mask.unsqueeze(1).unsqueeze(0)).softmax(-1)

    def biased(scores: torch.Tensor) -> torch.Tensor:
        return (scores.view(2, 4, 3, 16, 16) + torch.arange(16.0)).softmax(-1)

    scores = torch.randn(8, 3, 16, 16)
    for name, fn in [("mask", shifted), ("bias", biased)]:
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / name)), torch.no_grad():
            torch.testing.assert_close(torch.compile(fn, backend="minductor")(scores), fn(scores))
        sources = [p.read_text() for p in (tmp_path / name).glob("graph_*/cpp_*.cpp")]
        (softmax,) = [src for src in sources if "mi_exp(" in src]
        if name == "mask":  # the mask's kernel of its own, the softmax reading it
            assert "-100" not in softmax and any("-100" in src for src in sources), sources
        else:
            assert len(sources) == 1, sources


def test_transcendental_tables_repeated_over_outer_dims_are_computed_once(tmp_path) -> None:
    """Rotary embeddings' cos and sin tables ((positions, dims), from an outer product of
    positions and frequencies) multiply q and k of every image and head. Inlined, each was
    evaluated again at every element of q and k (HF Llama's forward: four 1.5-1.7 ms kernels,
    8.1 ms of kernels in all, 1.9 after): computed once into a table when read through a view
    by several users (the unsqueeze the layers share) and when one broadcast repeats it along
    outer dims. A sigmoid gate per (image, channel), repeated along the inner dims, stays in
    its consumer's kernel (evaluated once per row there), as does a value per head repeated
    over images (once per image and head). Results match eager."""
    from minductor import config

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., 32:], x[..., :32]), -1)

    def shared(q: torch.Tensor, k: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = torch.cat((f, f), -1)
        cos, sin = (emb.cos() * 1.0).unsqueeze(1), (emb.sin() * 1.0).unsqueeze(1)
        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin

    def single(q: torch.Tensor, k: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return q * torch.cat((f, f), -1).cos().unsqueeze(1) + k

    def gate(q: torch.Tensor, k: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return q * torch.sigmoid(k[:, :, :1, :1]) + k

    def per_head(q: torch.Tensor, k: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        # (a value per head, repeated over images outside it: evaluated once per (image, head))
        return q * torch.exp(f[0, :4, :1]).unsqueeze(-1) + k

    q, k = torch.randn(4, 4, 128, 64), torch.randn(4, 4, 128, 64)
    f = torch.arange(128.0)[None, :, None] * torch.rand(1, 1, 32)
    for name, fn in [("shared", shared), ("single", single), ("gate", gate), ("per_head", per_head)]:
        torch._dynamo.reset()
        with config.patch(debug=True, debug_dir=str(tmp_path / name)), torch.no_grad():
            torch.testing.assert_close(torch.compile(fn, backend="minductor")(q, k, f), fn(q, k, f))
        sources = [p.read_text() for p in (tmp_path / name).glob("graph_*/cpp_*.cpp")]
        if name in ("gate", "per_head"):
            assert len(sources) == 1 and ("sigmoid" if name == "gate" else "mi_exp(") in sources[0], sources
            continue
        (tables,) = [src for src in sources if "mi_cos(" in src]
        # a kernel of the table alone: it reads f, not q or k
        assert "in_ptr0" in tables and "in_ptr1" not in tables, tables
        assert ("mi_sin(" in tables) == (name == "shared"), tables
