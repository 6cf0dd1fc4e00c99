"""The dtype and memory-format rules the device entry points run on DirectML (emulated here):
DMLSHIM_BF16, DMLSHIM_FLOAT64=auto and dropped channels_last. Results are compared with the
same computation on the CPU."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from dmlshim import api, events
from dmlshim.patches.bf16 import Bf16Error

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
DML = torch.device("privateuseone", 0)
pytestmark = pytest.mark.emulator


@pytest.mark.parametrize("policy, expected", [("float32", F32), ("float16", F16)])
def test_bf16_entering_the_device_follows_the_policy(shim, policy, expected):
    events.reset()  # call sites of an earlier parametrization
    shim(device="emulated-dml", bf16=policy, log="info")  # info: call sites are recorded
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    lin = torch.nn.Linear(4, 3)
    ref = lin(x).detach()
    buf = io.BytesIO()
    torch.save({"w": x.to(BF16)}, buf)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        made = {
            "to_dtype": x.cuda().to(BF16),
            "bfloat16": x.cuda().bfloat16(),
            "cuda_of_bf16": x.to(BF16).cuda(),
            "to_cuda_of_bf16": x.to(BF16).to("cuda"),
            "factory": torch.zeros(2, dtype=BF16, device="cuda"),
            "full_like": torch.full_like(x, 2.0, dtype=BF16, device="cuda"),
            "load": torch.load(io.BytesIO(buf.getvalue()), map_location="cuda")["w"],
        }
        model = torch.nn.Linear(4, 3)
        model.load_state_dict(lin.state_dict())
        model = model.to(BF16).cuda()  # from_pretrained(torch_dtype=bf16) then .cuda()
        out = model(x.cuda().to(BF16))
    for name, t in made.items():
        assert t.device == DML and t.dtype is expected, (name, t.dtype)
    assert model.weight.dtype is expected and model.weight.device == DML
    tol = 1e-6 if expected is F32 else 1e-2
    # bf16 on the host loses precision first (x.to(BF16)), then the device dtype is `expected`
    assert torch.allclose(made["cuda_of_bf16"].cpu().float(), x.to(BF16).float(), atol=tol)
    assert torch.allclose(made["to_dtype"].cpu().float(), x.to(expected).float(), atol=tol)
    assert torch.allclose(out.cpu().float(), lin.to(BF16).float()(x.to(BF16).float()).detach(),
                          atol=5e-2)
    assert torch.allclose(made["load"].cpu().float(), x.to(BF16).float(), atol=tol)
    ours = [w for w in caught if "DMLSHIM_BF16" in str(w.message)]
    assert ours and all(w.filename == __file__ for w in ours)
    assert len({w.lineno for w in ours}) == len(ours)  # once per call site
    # one event per call, listed in the report: x.to(BF16).cuda() moved it and converted it
    name = str(expected).replace("torch.", "")
    listed = {(s.api, s.original, s.became) for s in events.call_sites()}
    assert ("Tensor.cuda", "'bfloat16'", f"privateuseone:0, {name}") in listed, listed
    assert ("Tensor.bfloat16", "'bfloat16'", name) in listed, listed
    assert events.api_counts["Tensor.cuda"] == 4  # four .cuda() calls, one event each
    assert torch.cuda.is_bf16_supported() is True
    # host tensors keep bf16
    assert x.to(BF16).dtype is BF16 and torch.zeros(2, dtype=BF16).dtype is BF16
    assert ref.shape == (4, 3)


def test_bf16_autocast_follows_the_policy(shim):
    shim(device="emulated-dml", bf16="float32")
    a = torch.randn(3, 3)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("ignore")
        with torch.autocast("cuda", dtype=BF16):
            y = torch.mm(a.cuda(), a.cuda())
    assert y.dtype is F32 and torch.allclose(y.cpu(), a @ a, atol=1e-5)


def test_bf16_error_names_the_call_site_and_the_option(shim):
    shim(device="emulated-dml", bf16="error")
    assert torch.cuda.is_bf16_supported() is False
    x = torch.randn(2)
    for make in (lambda: x.to(BF16).cuda(), lambda: x.cuda().bfloat16(),
                 lambda: torch.ones(2, dtype=BF16, device="cuda"),
                 lambda: torch.autocast("cuda", dtype=BF16)):
        with pytest.raises(Bf16Error, match=r"test_dtype_layout_rules\.py:\d+.*DMLSHIM_BF16"):
            make()
    assert x.to(BF16).dtype is BF16  # the host is fine


def test_bf16_rule_only_on_directml(shim):
    shim(device="cpu")
    assert "bf16" not in api.installed_patches() and not api.session().rewriters.dtype_rules
    assert torch.randn(2).to(BF16).cuda().dtype is BF16


def test_float64_auto_is_the_default_and_downcasts(shim):
    shim(device="emulated-dml")  # DMLSHIM_FLOAT64=auto, the emulator's float64 gap on
    host = torch.from_numpy(np.arange(4.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        dev = host.cuda()
        # TensorBoard's add_graph traces the model; a trace calling .double() on the device
        traced = torch.jit.trace(lambda t: t.double() * 2, (dev,), check_trace=False)
        doubled = traced(dev)
    assert dev.dtype is F32 and doubled.dtype is F32 and doubled.device == DML
    assert torch.equal(doubled.cpu(), (host * 2).float())
    assert any("DMLSHIM_FLOAT64=auto" in str(w.message) for w in caught)


def test_channels_last_is_dropped_for_the_device(shim):
    events.reset()
    shim(device="emulated-dml", log="info")
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    ref = conv(x).detach()
    model = torch.nn.Conv2d(3, 4, 3)
    model.load_state_dict(conv.state_dict())
    model = model.to("cuda", memory_format=torch.channels_last)
    xd = x.to("cuda", memory_format=torch.channels_last)
    xc = x.cuda(memory_format=torch.channels_last)
    assert model.weight.is_contiguous() and xd.is_contiguous() and xc.is_contiguous()
    assert torch.allclose(model(xd).detach().cpu(), ref, atol=1e-5)
    dropped = [s for s in events.call_sites() if "memory_format=channels_last" in s.original]
    assert {s.api for s in dropped} == {"Tensor.to", "Tensor.cuda"}, events.call_sites()
    assert all(s.became.endswith("contiguous") for s in dropped)
    # Module.to is attributed to the script's line (its tensors' Tensor.to calls)
    assert all(s.file == __file__ for s in dropped)
    # .contiguous(memory_format=...) is untouched, and the CPU keeps channels_last
    assert x.to(memory_format=torch.channels_last).is_contiguous(memory_format=torch.channels_last)


def test_the_cuda_like_paths_are_the_devices_patch_s_with_one_event_per_call(shim):
    # Tensor.type with a legacy CUDA type, Storage.cuda and share_memory_ are wrapped by the
    # devices patch (the areas give it their policies) and run the rules like Tensor.cuda.
    import dmlshim

    events.reset()
    shim(device="emulated-dml:2", log="info")  # float64 gap on: DMLSHIM_FLOAT64=auto downcasts
    devices = next(p for p in api._patches.patches if p.name == "devices")
    for owner, name in ((torch.Tensor, "cuda"), (torch.nn.Module, "cuda"),
                        (torch.Tensor, "type"), (torch.storage._StorageBase, "cuda"),
                        (torch.Tensor, "share_memory_")):
        assert (id(owner), name) in devices._keys, name
    rewriters = api.session().rewriters
    assert set(rewriters.policies) == {"Tensor.type", "Storage.cuda", "Tensor.share_memory_",
                                       "Tensor.to non_blocking"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        double = torch.arange(3, dtype=F64).type(torch.cuda.DoubleTensor)
    half = torch.arange(3.0).type("torch.cuda.HalfTensor")
    assert double.device == DML and double.dtype is F32 and double.tolist() == [0.0, 1.0, 2.0]
    assert half.device == DML and half.dtype is F16
    assert torch.arange(3.0).type(torch.int32).device.type == "cpu"  # torch's own
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(5.0)}, buffer)
    buffer.seek(0)
    # (a DirectML storage exists only inside a load: the tensor is moved after unpickling)
    loaded = torch.load(buffer, map_location=lambda storage, loc: storage.cuda(1))
    assert loaded["w"].device == torch.device("privateuseone", 1)
    assert loaded["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    on_device = torch.ones(2, device="cuda")
    assert on_device.share_memory_() is on_device
    sites = events.call_sites()
    types = sorted((s.original, s.became) for s in sites if s.api == "Tensor.type")
    assert types == [("\"<class 'torch.cuda.DoubleTensor'>, float64\"", "privateuseone:0, float32"),
                     ("'torch.cuda.HalfTensor'", "privateuseone:0")]
    assert [(s.original, s.became) for s in sites if s.api == "Storage.cuda"] == [
        ("1", "privateuseone:1")]
    assert [s.tag for s in sites if s.api == "Tensor.share_memory_"] == ["dropped"]
    assert not [s for s in sites if s.api == "Tensor.to"]  # no second event per call
    dmlshim.uninstall()
    assert not rewriters.policies  # every area took its policy back
