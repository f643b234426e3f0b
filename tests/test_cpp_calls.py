"""sin/cos calls made in batches apart from the inline math around them (codegen/cpp_calls.py):
results match eager, NaN, inf and huge arguments included, in plain, streamed and tiny
loops, with sizes that leave partial blocks and partial lines."""
from __future__ import annotations

import pytest
import torch

from minductor import config
from minductor.runtime.cache import libmvec_installed

# sin/cos are calls (and batched) only with glibc's libmvec (x86-64 Linux); elsewhere they are
# inline and the same programs must match eager without batches
LIBMVEC = config.libmvec and libmvec_installed(config.cxx)


def compiled_code(fn, *args, tmp_path, min_bytes: int = 1 << 24) -> str:
    torch._dynamo.reset()
    with config.patch(debug=True, debug_dir=str(tmp_path), stream_store_min_bytes=min_bytes, stream_store_min_footprint=0):
        got = torch.compile(fn, backend="minductor")(*args)
    torch.testing.assert_close(got, fn(*args), equal_nan=True)
    return "\n".join(p.read_text() for p in tmp_path.glob("graph_*/cpp_*.cpp"))


def special(shape) -> torch.Tensor:
    x = torch.randn(shape) * 4
    flat = x.view(-1)
    # huge arguments only with libmvec: the prelude's own sin/cos lose them (the xfail in
    # test_transcendental_accuracy.py), batched or not
    huge = 1e30 if LIBMVEC else 1e5
    flat[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), huge, -huge / 3, 0.0])
    return x


@pytest.mark.parametrize("shape", [(7,), (100, 37), (300, 129), (3, 50, 70), (70000,)])
@pytest.mark.parametrize("min_bytes", [1, 1 << 24], ids=["streamed", "plain"])
def test_batched_calls_match_eager(tmp_path, shape, min_bytes) -> None:
    x, y = special(shape), torch.randn(shape)
    code = compiled_code(lambda x, y: ((x.sin() + 1) * 2).exp().relu() - y, x, y, tmp_path=tmp_path / "a", min_bytes=min_bytes)
    assert ("mi_call0[" in code) == LIBMVEC
    # two calls, one nested in the other's argument chain, and inline math between
    code = compiled_code(lambda x: x.cos().tanh() * (x * 2).sin().cos() + x.sin().sigmoid(), x,
                         tmp_path=tmp_path / "b", min_bytes=min_bytes)
    assert ("mi_call2[" in code) == LIBMVEC


def test_what_makes_no_batches(tmp_path) -> None:
    x = torch.randn(100, 37)
    # a call and no other math; other dtypes; a reduction
    assert "mi_call0" not in compiled_code(lambda x: x.sin() * 2 + 1, x, tmp_path=tmp_path / "a")
    assert "mi_call0" not in compiled_code(lambda x: (x.sin() * 2).exp(), x.double(), tmp_path=tmp_path / "b")
    assert "mi_call0" not in compiled_code(lambda x: x.sin().exp().sum(-1), x, tmp_path=tmp_path / "c")


def test_no_batch_for_a_call_on_a_value_the_body_stored(tmp_path) -> None:
    """A fused producer's output read back as a call's argument: the block of calls would run
    before the body's stores (it read the buffer uninitialized: NaNs in a softmax backward)."""
    def fn(x, g):
        e = (x - x.amax(1, keepdim=True)).exp()  # stored, read back by the second node
        return e, (g * 1.5) * (e / e.sum(1, keepdim=True)).cos() * e
    x, g = torch.randn(2, 1, 10), torch.randn(2, 1, 10)
    code = compiled_code(fn, x, g, tmp_path=tmp_path)
    assert "mi_call0[" not in code
