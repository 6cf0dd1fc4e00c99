"""Gradient clipping under the shim is torch's, bit for bit, without a frame per parameter
(dmlshim/patches/clip.py, issue 37): on every torch line the total norm and the clipped
gradients equal torch's own function's, for each norm type, foreach choice and dtype mix, and
on one device the shim's frames per call do not grow with the parameters."""

from __future__ import annotations

import math
import sys

import pytest
import torch

import dmlshim
from dmlshim import patching


def _params(n: int, device: str, dtypes=(torch.float32,), scale: float = 1.0):
    g = torch.Generator().manual_seed(n)
    out = []
    for i in range(n):
        dtype = dtypes[i % len(dtypes)]
        p = torch.nn.Parameter(torch.randn(3 + i % 4, 5, generator=g).to(device, dtype))
        p.grad = (torch.randn(p.shape, generator=g) * scale).to(device, dtype)
        out.append(p)
    return out


def torch_clip(params, *args, **kwargs):
    """torch's own clip_grad_norm_ (the function dmlshim's wrapper stands in front of)."""
    from torch.nn.utils import clip_grad

    if hasattr(clip_grad, "_get_total_norm"):  # torch >= 2.6: the total norm's function
        wrapper = clip_grad._get_total_norm
        clip_grad._get_total_norm = patching.get_original(clip_grad, "_get_total_norm")
        try:
            return clip_grad.clip_grad_norm_(params, *args, **kwargs)
        finally:
            clip_grad._get_total_norm = wrapper
    return patching.get_original(torch.nn.utils, "clip_grad_norm_")(params, *args, **kwargs)


def _grads(params):
    return [p.grad.detach().to("cpu", torch.float64).clone() for p in params]


CASES = [(2.0, None, (torch.float32,)), (1.0, None, (torch.float32,)),
         (math.inf, None, (torch.float32,)), (2.0, False, (torch.float32,)),
         (2.0, True, (torch.float32,)), (2.0, None, (torch.float32, torch.float16)),
         (3.0, None, (torch.float32, torch.float64))]


@pytest.mark.parametrize("norm_type,foreach,dtypes", CASES)
@pytest.mark.parametrize("device", ["cpu", "emulated-dml"])
def test_clip_grad_norm_is_torchs(shim, device, norm_type, foreach, dtypes):
    target = "cpu" if device == "cpu" else "privateuseone:0"
    if device != "cpu" and torch.float64 in dtypes:
        dtypes = (torch.float32,)  # DirectML has no float64 (the emulator neither)
    shim(device=device)
    a, b = _params(9, target, dtypes), _params(9, target, dtypes)
    got = torch.nn.utils.clip_grad_norm_(a, 0.5, norm_type=norm_type, foreach=foreach)
    want = torch_clip(b, 0.5, norm_type=norm_type, foreach=foreach)
    assert got.dtype == want.dtype and got.device == want.device
    assert torch.equal(got.cpu(), want.cpu()), (got, want)
    assert all(torch.equal(x, y) for x, y in zip(_grads(a), _grads(b)))


def test_non_finite_and_empty_are_torchs(shim):
    shim(device="cpu")
    params = _params(3, "cpu", scale=math.inf)
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        torch.nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    no_grads = [torch.nn.Parameter(torch.ones(2))]
    assert torch.nn.utils.clip_grad_norm_(no_grads, 1.0).item() == 0.0
    gen = (p for p in _params(4, "cpu"))  # a generator, read once
    assert torch.nn.utils.clip_grad_norm_(gen, 1.0) > 0


@pytest.mark.parametrize("n", [4, 64])
def test_frames_per_call_do_not_grow_with_the_parameters(shim, n):
    shim(device="emulated-dml")
    params = _params(n, "privateuseone:0")
    pkg = dmlshim.__file__.rsplit("__init__.py", 1)[0]
    frames = []

    def profile(frame, event, arg):  # noqa: ARG001
        if event == "call" and frame.f_code.co_filename.startswith(pkg):
            frames.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
    finally:
        sys.setprofile(None)
    # the wrapper, the total norm, the clamped coefficient's one move (Tensor.to): not n
    assert len(frames) <= 4, frames
