"""torch.inference_mode() on DirectML (fact 9 of the real wheel): the emulator's
``inference-mode`` gap reproduces the wheel's error; the shim runs inference mode as no_grad.

The script is a timm-style validation loop (tests/corpus/inference_validate.py): trained
parameters and buffers made outside the region, then conv2d, batch_norm, linear, ``expand`` and
``.data`` inside it.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import describe, run_native, run_shim

SCRIPT = "inference_validate.py"
ERROR = "RuntimeError: Cannot set version_counter for inference tensor"


def test_validate_loop_under_inference_mode_matches_the_cpu_on_emulated_dml():
    native = run_native(SCRIPT)
    assert native.returncode == 0, describe(native)
    shimmed = run_shim(SCRIPT, device="emulated-dml")
    assert shimmed.returncode == 0, describe(shimmed)
    # outputs bit for bit, and what the script is told: inference mode on inside the region,
    # off in inference_mode(False) and after it, gradients off inside
    assert shimmed.stdout == native.stdout
    assert "inside True grad False" in shimmed.stdout
    assert "nested False grad True" in shimmed.stdout
    assert "requires_grad False" in shimmed.stdout


def test_validate_loop_with_guards_off_fails_like_the_wheel():
    proc = run_shim(SCRIPT, device="emulated-dml", options={"guards": "off"})
    assert proc.returncode == 1, describe(proc)
    assert ERROR in proc.stderr, describe(proc)
    assert "out 0" not in proc.stdout  # the first batch already fails


def _device_objects():
    import torch.nn as nn

    conv = nn.Conv2d(1, 2, 3).cuda()
    bn = nn.BatchNorm2d(2).cuda().eval()
    lin = nn.Linear(4, 2).cuda()
    x = torch.randn(2, 1, 5, 5, device="cuda")
    feat = torch.randn(2, 2, 3, 3, device="cuda")
    return {
        "conv2d": lambda: conv(x),
        "batch_norm": lambda: bn(feat),
        "linear": lambda: lin(torch.randn(3, 4, device="cuda")),
        "expand": lambda: x.expand(2, 1, 5, 5),
        ".data": lambda: lin.weight.data,
        "add": lambda: x + 1,
    }


def test_emulator_gap_refuses_tensors_made_outside_the_region(shim):
    shim(device="emulated-dml", guards="off")
    ops = _device_objects()
    with torch.inference_mode():
        inside = torch.ones(3, device="cuda")
        assert (inside * 2).sum().item() == 6.0  # tensors made inside the region work
        for op in ops.values():
            with pytest.raises(RuntimeError, match="^Cannot set version_counter for inference"):
                op()
    with torch.no_grad():  # no_grad works on the wheel
        for op in ops.values():
            op()


def test_without_the_gap_only_views_fail(shim):
    # torch itself refuses views of normal tensors made in inference mode on a Python device
    shim(device="emulated-dml", guards="off", emulator_gaps="fallback")
    ops = _device_objects()
    with torch.inference_mode():
        for name in ("conv2d", "batch_norm", "linear", "add"):
            ops[name]()


def test_shim_answers_the_script_and_torch_sees_the_truth(shim):
    shim(device="emulated-dml")
    ops = _device_objects()
    weight = torch.nn.Parameter(torch.ones(2, device="cuda"))
    torch_view: dict = {}

    @torch.inference_mode()
    def decorated():
        return torch.is_inference_mode_enabled()

    with torch.inference_mode():
        results = {name: op() for name, op in ops.items()}
        assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
        exec("seen = torch.is_inference_mode_enabled()",  # as code inside the torch package
             {"__name__": "torch._dmlshim_test", "torch": torch}, torch_view)
        out = weight * 2
    assert torch_view["seen"] is False
    assert not out.requires_grad and not out.is_inference()
    assert all(not r.requires_grad for r in results.values())
    assert decorated() is True
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()


def test_uninstall_restores_inference_mode(shim):
    import dmlshim

    cls = torch.autograd.grad_mode.inference_mode
    before = (cls.__dict__["__enter__"], cls.__dict__["__exit__"], torch.is_inference_mode_enabled)
    shim(device="emulated-dml")
    assert cls.__dict__["__enter__"] is not before[0]
    dmlshim.uninstall()
    assert (cls.__dict__["__enter__"], cls.__dict__["__exit__"],
            torch.is_inference_mode_enabled) == before
    with torch.inference_mode():
        assert torch.is_inference_mode_enabled()
