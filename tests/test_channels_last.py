"""Convolutions in CPU inference graphs run channels-last (NHWC); the pointwise ops after
them keep that layout, and pointwise kernels loop in the order of their output's memory."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from minductor import config, metrics


def _compile(fn: Callable[..., Any], *args: torch.Tensor, tmp_path: Path, grad: bool = False) -> str:
    """Compile with a debug dump; results (and output strides) must match eager. Returns the wrapper."""
    with config.patch(debug=True, debug_dir=str(tmp_path)), torch.set_grad_enabled(grad):
        out = torch.compile(fn, backend="minductor")(*args)
        torch.testing.assert_close(out, fn(*args), rtol=1e-4, atol=1e-4, check_stride=True)
    return next(tmp_path.glob("graph_*/output_code.py")).read_text()


def _conv_inputs(code: str) -> list[str]:
    return re.findall(r"torch\.convolution\((\w+),", code)


def _allocation(code: str, name: str) -> str:
    """The wrapper line that creates buffer ``name`` (an allocation, a reuse, or an extern call)."""
    return next(line.strip() for line in code.split("\ndef call")[1].splitlines()
                if line.strip().startswith(f"{name} = "))


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 8, 3, padding=1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.c2(F.relu(self.bn(self.c1(x))))).mean((2, 3))


def test_convolutions_take_channels_last_inputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ConvBlock().eval()
    model.bn.running_mean.normal_()
    model.bn.running_var.uniform_(0.5, 2)
    code = _compile(model, torch.randn(2, 3, 20, 24), tmp_path=tmp_path)
    first, second = _conv_inputs(code)
    # the NCHW input is copied to NHWC once; the second conv reads the BN/ReLU kernel's output,
    # which stays NHWC (and takes the first conv's storage in place)
    assert re.search(rf"{first} = .*\(2, 3, 20, 24\), \(1440, 1, 72, 3\)", _allocation(code, first)), code
    assert "reuse in place" in _allocation(code, second), code
    assert code.count("assert_size_stride(buf") == 2  # each conv's NHWC output checked at run time


def test_a_channels_last_input_is_not_copied(tmp_path: Path) -> None:
    conv = torch.nn.Conv2d(4, 8, 3).eval()
    x = torch.randn(2, 4, 12, 12).to(memory_format=torch.channels_last)
    code = _compile(lambda x: conv(x).relu(), x, tmp_path=tmp_path)
    (arg,) = _conv_inputs(code)
    assert arg.startswith("arg"), code  # the graph input itself
    # the ReLU, and the 3x3 weight's channels-last copy (aten's convolution copies it itself,
    # slower: (64, 64, 3, 3) 27 us a call)
    assert metrics.generated_kernel_count == 2


def test_conv_output_returned_with_eager_strides(tmp_path: Path) -> None:
    """Eager returns NCHW for an NCHW input: the NHWC result is stored back in NCHW."""
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()
    _compile(lambda x: conv(x) * 2, torch.randn(1, 3, 10, 10), tmp_path=tmp_path)


class ConvReturned(ConvBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn(self.c1(x)))
        return y, self.c2(y).mean((2, 3))


def _saved_strides(code: str) -> list[tuple[int, ...]]:
    """Strides a backward wrapper asserts for its 4-D inputs."""
    found = re.findall(r"assert_size_stride\((\w+), \(\d+, \d+, \d+, \d+\), \((\d+), (\d+), (\d+), (\d+)\)", code)
    return [tuple(int(s) for s in strides) for _, *strides in found]


def test_training_graphs_run_convolutions_channels_last(tmp_path: Path) -> None:
    """The forward keeps its channels-last activations for the backward (AOTAutograd compiles
    the backward for the strides the forward reports); what the user sees has eager's
    strides; the convolution backward gets channels-last output gradients (no aten copy)."""
    torch.manual_seed(0)
    model = ConvReturned().train()
    x = torch.randn(2, 3, 12, 12)
    y, pooled = model(x)
    (y.square().mean() + pooled.sum()).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        y2, pooled2 = torch.compile(model, backend="minductor")(x)
        torch.testing.assert_close(y2, y, rtol=1e-4, atol=1e-4, check_stride=True)  # NCHW, as eager
        with torch.profiler.profile() as prof:
            (y2.square().mean() + pooled2.sum()).backward()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-4)
    backward = next(tmp_path.glob("graph_*_backward/output_code.py")).read_text()
    saved = _saved_strides(backward)
    assert any(s[1] == 1 for s in saved), backward  # channels-last activations from the forward
    # the user's NCHW gradient of y is copied channels-last first, the layout of the saved
    # activations the batch norm backward reduces it with
    copy = re.search(r"(buf\d+) = empty_strided\(\(2, 16, 12, 12\), \(2304, 1, 192, 16\).*\n.*cpp_\w+\(tangents_1\.data_ptr\(\), \1\.data_ptr\(\)\)", backward)
    assert copy, backward
    copies = [e for e in prof.events() if e.name == "aten::copy_" and e.cpu_parent is not None
              and e.cpu_parent.name == "aten::convolution_backward"]
    assert not copies, [e.cpu_parent.name for e in copies]


@pytest.mark.parametrize("shape", [(2, 16, 9, 7), (1, 3, 32, 32)])
def test_pointwise_loops_follow_the_output_memory_order(shape: tuple[int, ...], tmp_path: Path) -> None:
    """A channels-last pointwise result loops over channels innermost (stride 1)."""
    x = torch.randn(shape).to(memory_format=torch.channels_last)
    code = _compile(lambda x: (x * 2).sigmoid(), x, tmp_path=tmp_path)
    kernel = code.split('extern "C"')[1]
    loops = re.findall(r"for \(int64_t (\w+) = 0; \w+ < (\d+); \w+\+\+\)", kernel)
    assert loops and int(loops[-1][1]) == shape[1], kernel  # innermost: the channels


def test_per_channel_values_of_a_channels_last_kernel_are_tabled(tmp_path: Path) -> None:
    """Batch norm after a conv runs over NHWC with the channels innermost: 1/sqrt(var + eps) is
    computed once per channel into a table before the loops, not once per pixel."""
    conv, bn = torch.nn.Conv2d(3, 16, 3, padding=1).eval(), torch.nn.BatchNorm2d(16).eval()
    conv2 = torch.nn.Conv2d(16, 16, 3, padding=1).eval()
    bn.running_var.uniform_(0.5, 2.0)
    bn.running_mean.normal_()
    x = torch.randn(2, 3, 32, 32)
    _compile(lambda x: conv2(F.relu(bn(conv(x)))).mean((2, 3)), x, tmp_path=tmp_path)  # bn's output stays NHWC
    sources = [p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp")]
    (source,) = [s for s in sources if "sqrt" in s]
    prologue, loops = source.split("#pragma omp parallel for", 1) if "#pragma omp parallel for" in source else source.split("for (int64_t xo0", 1)
    assert "mi_table0[16]" in prologue and "mi_c_sqrt" in prologue, source
    assert re.search(r"auto tmp\d+ = mi_table0\[xo\d\];", loops), source


def test_values_that_vary_with_an_outer_loop_are_not_tabled(tmp_path: Path) -> None:
    # y[n, h, w, c] * exp(x[n, h, w, c]): the costly value depends on every loop, nothing to table
    conv, conv2 = torch.nn.Conv2d(3, 16, 3, padding=1).eval(), torch.nn.Conv2d(16, 16, 3, padding=1).eval()
    w = torch.randn(16, 1, 1)
    _compile(lambda x: conv2(torch.exp(conv(x)) * torch.sqrt(w.abs() + 1)).mean((2, 3)), torch.randn(2, 3, 16, 16),
             tmp_path=tmp_path)
    sources = "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp"))
    assert "mi_table0_fn" in sources and "mi_table1" not in sources  # sqrt(|w| + 1) only, never the exp
    assert not re.search(r"mi_table0_fn = [^}]*mi_exp", sources, re.S), sources


@pytest.mark.parametrize("shape", [(2, 3, 40, 50), (1, 4, 7, 9), (3, 8, 33, 17)], ids=["rgb", "tiny", "eight"])
def test_few_channels_vectorize_along_pixels(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """NCHW -> NHWC with at most 8 channels: the loop over pixels vectorizes and the one over
    channels runs inside it (a 3-long vector loop was 4-5x slower); results match eager."""
    torch._dynamo.reset()
    x = torch.randn(shape)
    _compile(lambda x: x.contiguous(memory_format=torch.channels_last) * 2, x, tmp_path=tmp_path)
    kernel = next(tmp_path.glob("graph_*/cpp_*.cpp")).read_text()
    simd_loop = kernel[kernel.index("#pragma omp simd"):]
    channels = f"< {shape[1]}; "
    assert channels not in simd_loop.splitlines()[1] and channels in simd_loop.splitlines()[3]



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_training_batch_norm_tables_its_rsqrt(dtype: torch.dtype, tmp_path: Path) -> None:
    """A training batch norm over NHWC clamps its batch variance at 0 with a templated call
    (``mi_maximum<...>(var, 0)``) before the rsqrt: the table rewrite once took the template for
    a variable and left the rsqrt per pixel (a bf16 kernel at (8, 16, 64, 64): 348 -> 235 us).
    Values and running statistics match eager."""
    bn, ref = torch.nn.BatchNorm2d(16).to(dtype).train(), torch.nn.BatchNorm2d(16).to(dtype).train()
    x = torch.randn(4, 16, 12, 12).to(dtype).contiguous(memory_format=torch.channels_last)
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        got = torch.compile(lambda x: F.relu(bn(x)), backend="minductor")(x)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, F.relu(ref(x)), rtol=tol, atol=tol)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=tol, atol=tol)
    (source,) = [p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp") if "relu" in p.name]
    prologue, loops = source.split("#pragma omp parallel for", 1) if "#pragma omp parallel for" in source else source.split("for (int64_t xo0", 1)
    assert "mi_rsqrt(" in prologue and not re.search(r"auto tmp\d+ = mi_rsqrt", loops), source


def _strided_simd_stores(source: str) -> list[str]:
    """Stores in an innermost ``omp simd`` loop whose index steps more than one element per
    iteration of the loop's variable (walking memory across, not along). (A loop vectorized
    outside the innermost one, over few channels, is left out.)"""
    found = []
    for match in re.finditer(r"#pragma omp simd[^\n]*\n\s*for \(int64_t (\w+) = [^\n]*\n", source):
        var, depth, end = match[1], 0, match.end()
        for line in source[end:].splitlines():
            if line.lstrip().startswith("for ("):
                break
            depth += line.count("{") - line.count("}")
            store = re.match(r"\s*(?:out_ptr|in_out_ptr)\d+\[(.+)\] = ", line)
            if store and re.search(rf"(\d+)L\*{var}\b", store[1]):
                found.append(line.strip())
            if depth <= 0 and "}" in line:
                break
    return found


class ConvPoolNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32)
        self.c2 = torch.nn.Conv2d(32, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)).mean()


def test_a_training_step_of_batch_norm_and_max_pool_walks_channels_last_memory_along(tmp_path: Path) -> None:
    """A channels-last training step: the pool's values and indices are stored channels-last,
    as eager's (stored contiguous, the indices turned the fused batch-norm/ReLU/pool kernel's
    loops to walk pixels innermost, 32 floats apart: 8.2 ms for a kernel now 0.5-0.7 ms at
    (32, 32, 64, 64)); every pointwise loop of a kernel of several loops stores along memory;
    the batch norm's backward reduction over (N, H, W) splits the images across threads.
    Gradients match eager."""
    torch.manual_seed(0)
    # as many images as channels: the running statistics' update shares the batch loop with the
    # normalization and the pool, in a kernel of several loops
    model, x = ConvPoolNet().train(), torch.randn(32, 3, 8, 8)
    reference = [p.grad for p in (model(x).backward(), *model.parameters())[1:]]
    model.zero_grad()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.compile(model, backend="minductor")(x).backward()
    for p, g in zip(model.parameters(), reference):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-4)
    sources = {p.name: p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp")}
    strided = {n: _strided_simd_stores(s) for n, s in sources.items()}
    assert not any(strided.values()), strided
    forward = next(tmp_path.glob("graph_*_forward/output_code.py")).read_text()
    assert re.search(r"empty_strided\(\(32, 32, 4, 4\), \(512, 1, 128, 32\), device=mi_cpu, dtype=torch.int64\)", forward), forward
    assert any("max_pool2d_backward" in n and "sum" in n and "_partial[" in s for n, s in sources.items()), list(sources)


def test_squeeze_excitation_scales_pixels_with_the_channels_innermost(tmp_path: Path) -> None:
    """x * sigmoid(mean over pixels) over a channels-last tensor: one kernel, whose pixel loop
    runs outside a loop over the channel lanes (unit stride; with the lanes outside, each walked
    the pixels 512 bytes apart: 8.9 ms against 0.33 at (8, 128, 56, 56)) and whose sigmoid runs
    once per channel into a lane array, not once per pixel."""
    x = torch.randn(2, 48, 10, 12).to(memory_format=torch.channels_last)
    _compile(lambda x: x * x.mean((2, 3), keepdim=True).sigmoid(), x, tmp_path=tmp_path)
    (source,) = [p.read_text() for p in tmp_path.glob("graph_*/cpp_fused_*.cpp")]
    assert re.search(r"auto mi_lane0_fn = \[&\]\(int64_t mi_lane\) \{[^}]*mi_sigmoid", source), source
    pixels = re.search(r"for \(int64_t (xi\d) = 0; \1 < 120; \1\+\+\)\n\s*\{\n\s*#pragma omp simd\n\s*for \(int64_t mi_lane", source)
    assert pixels and not _strided_simd_stores(source), source


class UpConcatConv(torch.nn.Module):
    """A U-Net decoder step: upsample, concatenate the skip connection, convolve, group norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.GroupNorm(4, 8)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(x, scale_factor=2)
        return F.silu(self.norm(self.conv(torch.cat([up, skip], 1))))


def test_a_concatenation_feeding_a_convolution_is_stored_channels_last(tmp_path: Path) -> None:
    """The concatenation is written channels-last in the first place (no transposing copy for
    the convolution), and the training forward saves it so for the convolution's backward,
    which oneDNN would otherwise reorder; group norm's statistics read it channel by channel.
    Gradients match eager's."""
    torch.manual_seed(0)
    model = UpConcatConv()
    x, skip = torch.randn(2, 8, 32, 32), torch.randn(2, 8, 64, 64)  # (a cat large enough for slices)
    model(x, skip).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        y = torch.compile(model, backend="minductor")(x, skip)
        torch.testing.assert_close(y, model(x, skip), rtol=1e-4, atol=1e-4, check_stride=True)
        y.square().mean().backward()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-4)
    forward = next(tmp_path.glob("graph_*_forward/output_code.py")).read_text()
    backward = next(tmp_path.glob("graph_*_backward/output_code.py")).read_text()
    assert "assert_size_stride(cat, (2, 16, 64, 64), (65536, 1, 1024, 16), 'cat')" in backward, backward
    conv_input = _conv_inputs(forward)[0]
    assert "(65536, 1, 1024, 16)" in _allocation(forward, conv_input), forward  # the cat itself


def test_transposed_convolutions_run_channels_last(tmp_path: Path) -> None:
    """A transposed convolution reads its input channels-last too (oneDNN's NCHW one was 15x
    slower at (8, 64, 56, 56), 2x2 at stride 2), and its backward gets the saved graph input
    (the user's NCHW tensor) copied channels-last with the gradient (NCHW, oneDNN copied the
    gradient inside it: 11.9 ms for (8, 64, 56, 56), 5.5 without)."""
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
    x = torch.randn(2, 8, 10, 12)
    code = _compile(lambda x: conv(x).relu(), x, tmp_path=tmp_path / "inference")
    (arg,) = _conv_inputs(code)
    assert re.search(rf"{arg} = .*\(2, 8, 10, 12\), \(960, 1, 96, 8\)", _allocation(code, arg)), code
    xg = x.clone().requires_grad_()

    def grads(x: torch.Tensor) -> Any:  # (the loss in the graph: its gradient kernel writes channels-last)
        return torch.autograd.grad(conv(x).relu().square().sum(), [x, *conv.parameters()])

    expected = grads(xg)
    with config.patch(debug=True, debug_dir=str(tmp_path / "training")):
        got = torch.compile(grads, backend="minductor")(xg)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    backward = next((tmp_path / "training").glob("graph_*_backward/output_code.py")).read_text()
    grad, saved = re.search(r"convolution_backward\.default\((\w+), (\w+),", backward).groups()
    for name in (grad, saved):  # both channels-last: allocated so, or an input asserted so that they reuse
        line = _allocation(backward, name)
        reused = re.match(rf"{name} = (\w+); del \1", line)
        if reused:
            line = re.search(rf"assert_size_stride\({reused.group(1)}, .*", backward).group(0)
        assert re.search(r"\(2, \d+, \d+, \d+\), \(\d+, 1, \d+, \d+\)", line), backward


def test_a_full_reduction_reads_a_channels_last_tensor_in_memory_order(tmp_path: Path) -> None:
    """Summing every element of a channels-last tensor walks its memory contiguously (one
    merged loop), not in NCHW order 32 floats apart."""
    x = torch.randn(2, 32, 20, 24).to(memory_format=torch.channels_last)
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.testing.assert_close(torch.compile(lambda x: x.relu().square().sum(), backend="minductor")(x),
                                   x.relu().square().sum(), rtol=1e-5, atol=1e-3)
    source = next(tmp_path.glob("graph_*/cpp_*.cpp")).read_text()
    reads = re.findall(r"in_ptr0\[([^\]]+)\]", source)
    assert reads and all(re.fullmatch(r"ri0", r.strip()) for r in reads), source


class Bottleneck(torch.nn.Module):
    """1x1 reduce, 3x3, 1x1 expand, a strided 1x1 shortcut, and a squeeze-and-excitation's 1x1s
    over pooled pixels: every 1x1 here is small."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce, self.conv = torch.nn.Conv2d(32, 8, 1, bias=False), torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.expand, self.shortcut = torch.nn.Conv2d(8, 64, 1), torch.nn.Conv2d(32, 64, 1, stride=2, bias=False)
        self.squeeze, self.excite = torch.nn.Conv2d(64, 16, 1), torch.nn.Conv2d(16, 64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(F.relu(self.conv(F.relu(self.reduce(x)))))
        y = y * torch.sigmoid(self.excite(F.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        return F.relu(y + self.shortcut(x))


def test_small_pointwise_convolutions_run_as_products(tmp_path: Path) -> None:
    """A 1x1 convolution whose product is too small for oneDNN's (its per-call cost: HF ResNet's
    (4, 32, 16, 16) -> 8 channels 34.7 us a call) is a product of the channels-last pixels (every
    stride-th) and the weight: only the 3x3 stays a convolution; results and strides as eager."""
    torch.manual_seed(0)
    code = _compile(Bottleneck().eval(), torch.randn(4, 32, 15, 16), tmp_path=tmp_path)
    assert len(_conv_inputs(code)) == 1, code
    assert "torch.mm(" in code, code


def test_large_pointwise_convolutions_stay_convolutions(tmp_path: Path) -> None:
    """A 1x1 convolution big enough for oneDNN stays its convolution ((8, 64, 56, 56) -> 256
    as an inner product: 0.80-0.89x)."""
    conv = torch.nn.Conv2d(64, 256, 1).eval()
    code = _compile(conv, torch.randn(2, 64, 40, 40), tmp_path=tmp_path)
    assert len(_conv_inputs(code)) == 1 and "torch.mm(" not in code, code


def test_pointwise_convolutions_as_products_train(tmp_path: Path) -> None:
    """The forward's 1x1 products keep their gradients: the backward computes them as aten's
    convolution backward does."""
    torch.manual_seed(0)
    forward, _ = _train_like_eager(Bottleneck().train(), torch.randn(2, 32, 8, 8, requires_grad=True), tmp_path)
    assert len(_conv_inputs(forward)) == 1, forward


def _train_like_eager(model: torch.nn.Module, x: torch.Tensor, tmp_path: Path) -> tuple[str, str]:
    """A compiled training step's gradients (of the parameters and ``x``) match eager's; the
    forward's and the backward's wrappers."""
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    with config.patch(debug=True, debug_dir=str(tmp_path)):
        torch.compile(model, backend="minductor")(x).square().mean().backward()
    for got, want in zip([p.grad for p in model.parameters()] + [x.grad], expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return tuple(next(tmp_path.glob(f"graph_*_{kind}/output_code.py")).read_text() for kind in ("forward", "backward"))


class PointwiseConv1d(torch.nn.Module):
    """SqueezeBERT's layers: kernel-1 conv1d over a (batch, length, channels) activation read
    transposed, grouped and not, one with its input computed (a flexible layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Conv1d(64, 64, 1, groups=4)
        self.up = torch.nn.Conv1d(64, 96, 1, bias=False)
        self.down = torch.nn.Conv1d(96, 48, 1, groups=2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.permute(0, 2, 1)
        return self.down(F.gelu(self.up(self.q(x) + x))).permute(0, 2, 1)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_pointwise_conv1d_of_transposed_rows_runs_as_products(grad: bool, tmp_path: Path) -> None:
    """A kernel-1 conv1d of an input stored (N, L, C) is a product of its rows of channels (per
    group a batch of a ``bmm`` writing the group's columns): no aten convolution, which copies
    such an input and each group (SqueezeBERT's grouped layers: 189 -> 99 us), in the forward
    or the backward; results, strides and gradients as eager's."""
    torch.manual_seed(0)
    model = PointwiseConv1d()
    h = torch.randn(2, 24, 64, requires_grad=grad)
    if not grad:
        code = _compile(model, h, tmp_path=tmp_path)
        assert not _conv_inputs(code) and code.count("torch.bmm(") == 2, code
        return
    forward, backward = _train_like_eager(model, h, tmp_path)
    assert not _conv_inputs(forward) and forward.count("torch.bmm(") == 2, forward
    # the backward's products too: each input's gradient dy @ W and weight's dy^T @ x
    assert "convolution_backward" not in backward and backward.count("torch.bmm(") == 4, backward


def test_pointwise_conv1d_over_symbolic_lengths(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = PointwiseConv1d().eval()
    fn = torch.compile(model, backend="minductor", dynamic=True)
    with torch.no_grad():
        for length in (24, 37, 5):
            h = torch.randn(3, length, 64)
            torch.testing.assert_close(fn(h), model(h), rtol=1e-4, atol=1e-4)


def test_pointwise_conv1d_of_channels_first_storage_stays_a_convolution(tmp_path: Path) -> None:
    """An input stored (N, C, L) (a graph input) would need a transposing copy to be rows: aten's
    convolution reads it as it is."""
    conv = torch.nn.Conv1d(32, 16, 1, groups=2).eval()
    code = _compile(conv, torch.randn(2, 32, 20), tmp_path=tmp_path)
    assert len(_conv_inputs(code)) == 1, code
