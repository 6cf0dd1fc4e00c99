"""Device tensors without storage (fact 8 of the real wheel) and bfloat16 on the device (fact 6).

torch-directml's tensors are OpaqueTensorImpls: ``untyped_storage()``, ``storage()`` and every
C++ path that reads storage raise "Cannot access storage of OpaqueTensorImpl". The emulator's
``storage`` gap (on by default) does the same, so everything the shim does with device tensors
is tested under the refusal: checkpoints, ``share_memory_``, DataLoader pinning here, DDP in
test_distributed.py. A bfloat16 tensor on the device aborts the process (the ``bfloat16`` gap).
"""

from __future__ import annotations

import re
import signal

import pytest
import torch

from tests.helpers import describe, run_native, run_shim

MESSAGE = "Cannot access storage of OpaqueTensorImpl"
BF16_LINE = "dml_util.cc:118 Invalid or unsupported data type BFloat16"


def test_storage_gap_refuses_python_and_cpp_storage_access(shim):
    shim(device="emulated-dml:2", guards="off")
    x = torch.arange(4.0, device="cuda:1")
    y = x[1:]  # views and op results are refused too
    for t in (x, y, x * 2, torch.nn.Linear(2, 2).cuda().weight):
        for access in (t.untyped_storage, t.storage, t._typed_storage):
            with pytest.raises(NotImplementedError, match=f"^{MESSAGE}$"):
                access()
        assert not torch._C._has_storage(t)  # what torch's own checks see, as on the wheel
    # the data stays reachable through ops: copies, in-place resizes (of the same element count:
    # the wheel refuses to grow a device tensor), views
    z = torch.empty(6, device="cuda:1").resize_(2, 3).fill_(1.0)
    assert z.shape == (2, 3) and z.sum().item() == 6.0
    assert y.cpu().tolist() == [1.0, 2.0, 3.0]


def test_storage_is_reachable_without_the_gap(shim):
    shim(device="emulated-dml", emulator_gaps="fallback,float64")
    x = torch.arange(4.0, device="cuda")
    x.untyped_storage()  # the wrapper's placeholder storage, no error
    assert torch._C._has_storage(x)


def test_share_memory_and_is_shared_on_device_tensors(shim):
    shim(device="emulated-dml")
    t = torch.ones(3, device="cuda")
    assert t.share_memory_() is t  # a no-op, as for CUDA tensors
    assert t.is_shared() is False  # DirectML memory is not shared between processes
    cpu = torch.ones(2)
    assert cpu.share_memory_().is_shared()


def _checks(stdout: str) -> list:
    lines = [line for line in stdout.splitlines() if line.startswith(("loss ", "check "))]
    return [re.sub(r" on_gpu (True|False)$", "", line) for line in lines]


def test_cuda_script_touching_storage_runs_under_the_refusal(tmp_path):
    # save/load in every map_location form, whole modules, deepcopy, share_memory_,
    # DataLoader(pin_memory=True), clip_grad_norm_: same values as the CPU run
    native_dir, shim_dir = tmp_path / "native", tmp_path / "shim"
    native_dir.mkdir()
    shim_dir.mkdir()
    native = run_native("storage_paths.py", str(native_dir), cached=False)
    assert native.returncode == 0, describe(native)
    shimmed = run_shim("storage_paths.py", str(shim_dir), device="emulated-dml:2")
    assert shimmed.returncode == 0, describe(shimmed)
    assert _checks(shimmed.stdout) == _checks(native.stdout) != []
    assert "on_gpu True" in shimmed.stdout
    # the checkpoint written from device tensors loads in plain torch, on the CPU
    ckpt = torch.load(shim_dir / "ckpt.pt", weights_only=True)
    assert ckpt["model"]["0.weight"].device.type == "cpu"
    assert torch.equal(ckpt["view"], torch.tensor([2.0, 3.0]))


_BF16_SCRIPT = """
import torch
x = torch.ones(2, device="cuda")
print("before", flush=True)
{line}
print("after", flush=True)
"""


@pytest.mark.parametrize("line", [
    "torch.zeros(2, dtype=torch.bfloat16, device='cuda')",
    "x.to(torch.bfloat16)",
])
def test_bfloat16_on_the_device_aborts_the_process(tmp_path, line):
    script = tmp_path / "bf16.py"
    script.write_text(_BF16_SCRIPT.format(line=line))
    proc = run_shim(script, device="emulated-dml", options={"guards": "off"})
    assert proc.returncode in (-signal.SIGABRT, 128 + signal.SIGABRT), describe(proc)
    assert proc.stdout.splitlines() == ["before"], describe(proc)
    assert BF16_LINE in proc.stderr, describe(proc)
    assert "Traceback" not in proc.stderr and "dmlshim: summary" not in proc.stderr


def test_bfloat16_works_without_the_gap(shim):
    shim(device="emulated-dml", emulator_gaps="fallback")
    x = torch.ones(2, device="cuda").to(torch.bfloat16)
    assert x.dtype is torch.bfloat16 and (x * 2).float().cpu().tolist() == [2.0, 2.0]


def test_bfloat16_gap_is_in_all():
    from dmlshim import config

    cfg = config.load({"device": "emulated-dml", "emulator_gaps": "all"})
    assert {"storage", "inference-mode", "bfloat16"} <= set(cfg.emulator_switches())


def test_forward_and_backward_on_every_emulated_adapter(shim):
    # PyTorch's Python device guard (torch >= 2.5) knows one device; the emulator's C++ guard
    # is built on every torch, so adapter 1 and 2 run backward() (DDP rank 1, devices=2)
    import emulated_dml as emulator

    shim(device="emulated-dml:3")
    assert emulator.install_device_guard() == "cpp"
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 2)
    x = torch.randn(5, 4)
    reference(x).square().sum().backward()
    for index in range(3):
        torch.cuda.set_device(index)
        model = torch.nn.Linear(4, 2)
        model.load_state_dict(reference.state_dict())
        model.cuda()
        model(x.cuda()).square().sum().backward()
        assert model.weight.grad.device == torch.device("privateuseone", index)
        assert torch.equal(model.weight.grad.cpu(), reference.weight.grad)
