"""Large fresh CPU buffers on transparent huge pages (runtime/huge_pages.py): the wrapper
allocates the buffers the pool does not keep (a training step's outputs) through
``empty_huge``, which advises their 2 MB-aligned interior before the first write."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minductor import config
from minductor.runtime import huge_pages
from minductor.runtime.huge_pages import HUGE_PAGE, advise_huge, empty_huge

ADVISABLE = huge_pages._madvise() is not None
needs_madvise_mode = pytest.mark.skipif(
    not ADVISABLE, reason="transparent huge pages are not in madvise mode here (Linux only), so nothing is advised")


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@needs_madvise_mode
def test_a_large_buffer_is_advised_and_a_small_one_is_not() -> None:
    big = empty_huge((1024, 2048), (2048, 1), torch.float32, 8 << 20)
    start = -(-big.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    assert "hg" in _vm_flags(start)
    big.fill_(1.5)  # the advice changes no value
    assert big.sum().item() == 1.5 * 1024 * 2048
    small = empty_huge((256,), (1,), torch.float32, 1024)
    assert "hg" not in _vm_flags(small.data_ptr())


def test_no_advice_without_a_whole_aligned_huge_page() -> None:
    assert not advise_huge(HUGE_PAGE + 64, HUGE_PAGE)  # the aligned part is empty
    with config.patch(huge_page_min_bytes=0):
        t = empty_huge((1 << 22,), (1,), torch.float32, 16 << 20)
    assert t.shape == (1 << 22,) and t.stride() == (1,) and t.dtype == torch.float32


@pytest.mark.parametrize("min_bytes, call", [(4 << 20, "empty_huge("), (0, "empty_strided(")])
def test_training_outputs_take_huge_pages(min_bytes: int, call: str, tmp_path: Path) -> None:
    """The 8 MB gradient of a training step is allocated by ``empty_huge`` (``empty_strided``
    with the flag off), and values and gradients match eager."""
    x = torch.randn(8, 16, 128, 128, requires_grad=True)
    fn = lambda t: (torch.nn.functional.gelu(t) * 2).sum()  # noqa: E731
    with config.patch(debug=True, debug_dir=str(tmp_path), huge_page_min_bytes=min_bytes):
        out = torch.compile(fn, backend="minductor")(x)
        out.backward()
    grad, x.grad = x.grad, None
    ref = fn(x)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-2)
    torch.testing.assert_close(grad, x.grad)
    backward = next(tmp_path.glob("graph_*_backward/output_code.py")).read_text()
    assert f"buf0 = {call}(8, 16, 128, 128)" in backward, backward


@pytest.mark.parametrize("min_bytes", [4 << 20, 0])
def test_buffers_stay_on_the_cpu_under_another_default_device(min_bytes: int) -> None:
    """A default device set by the user does not move the wrapper's CPU buffers: pooled,
    huge-page and plain ones (a meta buffer's null pointer crashed the kernel)."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x * 2).sin()
        return y + 1, y.sum(0)

    x = torch.randn(2048, 1024)
    torch._dynamo.reset()
    with config.patch(huge_page_min_bytes=min_bytes):
        compiled = torch.compile(fn, backend="minductor")
        torch.set_default_device("meta")
        try:
            got = compiled(x)
        finally:
            torch.set_default_device(None)
    assert all(g.device.type == "cpu" for g in got)
    torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=1e-3)  # (a sum over 2048 rows, in another order)
