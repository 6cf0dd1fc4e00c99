"""The emulated DirectML device (emulated_dml): identity, fidelity switches, CPU parity.

Runs in-process on torch 2.13 and torch 2.4.1 (where the first run builds the emulator's small
C++ device guard into the torch extensions cache).
"""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import emulated_dml as emulator
from emulated_dml import _fallback

ROOT = Path(__file__).resolve().parents[1]
F64 = "The GPU device does not support Double (Float64) operations!"

# The autograd engine sizes its device queues at the first backward() of the process: install
# the emulator's device guard while tests are collected, before any test (of any file) runs one.
if "torch_directml" not in sys.modules:
    try:
        emulator.install_device_guard()
    except emulator.EmulatorError:  # e.g. no compiler on torch < 2.5: the fixture reports it
        pass


@pytest.fixture
def emu():
    before = (emulator.device_count(), emulator.switches()) if emulator.is_registered() else None
    emulator.register(2, emulator.GAPS)
    emulator.reset_fallback_counts()
    assert emulator.autograd_ready(), "a backward() ran before the emulator's device guard existed"
    yield emulator
    if before is not None:
        emulator.register(*before)
    else:
        emulator.set_switches(emulator.GAPS)


def fallback_warnings(caught):
    return [str(w.message) for w in caught if "DML backend" in str(w.message)]


def warning_text(op):
    return (f"The operator '{op}' is not currently supported on the DML backend and will fall "
            "back to run on the CPU. This may have performance implications.")


# -- identity, transfers, printing ----------------------------------------------------------


def test_device_identity_and_adapters(emu):
    dev = emu.device(1)
    assert dev == torch.device("privateuseone", 1) and emu.device() == torch.device("privateuseone:0")
    assert emu.device_count() == 2 and torch.privateuseone.device_count() == 2
    x = torch.zeros(3, device="privateuseone:1")
    assert x.device.type == "privateuseone" and x.device.index == 1 and emu.is_emulated(x)
    assert not emu.is_emulated(torch.zeros(3))
    for bad in (lambda: emu.device(2), lambda: torch.zeros(1, device="privateuseone:2"),
                lambda: torch.ones(1).to("privateuseone:5")):
        with pytest.raises(IndexError, match="out of range: 2 emulated DirectML adapter"):
            bad()
    with pytest.raises(emulator.EmulatorError, match="unknown switch"):
        emu.set_switches(["fallback", "nonsense"])
    emu.register(3)  # idempotent: only the count changes
    assert emu.device_count() == 3 and torch.zeros(1, device="privateuseone:2").device.index == 2


def test_round_trips_and_host_access(emu):
    dev = emu.device(0)
    for t in (torch.randn(3, 4), torch.arange(6).reshape(2, 3), torch.tensor([True, False]),
              torch.randn(5).half(), torch.randn(4, 6)[:, ::2]):
        on = t.to(dev)
        assert on.dtype == t.dtype and on.shape == t.shape and torch.equal(on.cpu(), t)
        assert torch.equal(on.to("privateuseone:1").to(dev).cpu(), t)
    made = torch.tensor([[1.5, 2.5]], device=dev)
    assert made.device == dev and made.tolist() == [[1.5, 2.5]]
    assert made.sum().item() == 4.0 and f"{made.sum():.2f}" == "4.00"
    with pytest.raises(TypeError, match="privateuseone:0 device type tensor to numpy"):
        made.numpy()
    assert made.cpu().numpy().tolist() == [[1.5, 2.5]]
    assert repr(torch.arange(3, device=dev)) == "tensor([0, 1, 2], device='privateuseone:0')"
    emu.set_switches(["fallback"])  # printing floats converts to double on the device (#430)
    assert repr(made) == "tensor([[1.5000, 2.5000]], device='privateuseone:0')"
    param = nn.Linear(2, 1).to(dev).weight
    assert repr(param).startswith("Parameter containing:\ntensor([[")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        made + torch.ones(1, 2)
    with pytest.raises(RuntimeError, match="privateuseone:0 and privateuseone:1"):
        made + made.to("privateuseone:1")
    assert torch.equal((made + torch.tensor(1.0)).cpu(), made.cpu() + 1)  # CPU scalars are fine


def test_ops_are_bit_identical_to_cpu(emu):
    dev = emu.device(0)
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    img, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    cases = [
        lambda x, y, i, k: x @ y,
        lambda x, y, i, k: F.conv2d(i, k, padding=1),
        lambda x, y, i, k: F.log_softmax(x, 1),
        lambda x, y, i, k: x[y > 0],
        lambda x, y, i, k: x.t().contiguous().view(-1)[3:9],
        lambda x, y, i, k: torch.cat([x, y]).var(0),
        lambda x, y, i, k: x.clone().add_(y, alpha=0.5).mul_(2),
        # (out= of the result's shape: the wheel's out= kernels do not resize, test_dml_facts)
        lambda x, y, i, k: torch.add(x, y, out=torch.empty(8, 8, device=x.device)),
        lambda x, y, i, k: torch.sort(x, 1)[1],
        lambda x, y, i, k: F.max_pool2d(i, 2),
    ]
    for case in cases:
        on_cpu = case(a, b, img, w)
        on_dev = case(a.to(dev), b.to(dev), img.to(dev), w.to(dev))
        assert on_dev.device == dev and on_dev.shape == on_cpu.shape
        assert torch.equal(on_dev.cpu(), on_cpu)


def test_directml_convolution_kernels_map_to_cpu_ones(emu):
    # convolution_overrideable/_backward_overrideable are torch-directml's convolution kernels
    # (what PyTorch's composites call for PrivateUse1); the CPU has none of its own.
    dev = emu.device(0)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    conv_args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    out = torch.ops.aten.convolution_overrideable(x.to(dev), w.to(dev), None, *conv_args)
    ref = torch.ops.aten.convolution(x, w, None, *conv_args)
    assert torch.equal(out.cpu(), ref)
    grads = torch.ops.aten.convolution_backward_overrideable(
        ref.to(dev), x.to(dev), w.to(dev), *conv_args, [True, True, True])
    refs = torch.ops.aten.convolution_backward(ref, x, w, [3], *conv_args, [True, True, True])
    assert all(torch.equal(g.cpu(), r) for g, r in zip(grads, refs))


# -- training parity and the Parameter trap -------------------------------------------------


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x):
        return self.fc(self.drop(F.relu(self.bn(self.conv(x)))).flatten(1))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 6, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


MODELS = {"mlp": (mlp, (4, 8)), "cnn": (CNN, (4, 1, 8, 8)), "lstm": (LSTMNet, (4, 5, 5))}


def train(name, device, optimizer, steps=3, **opt_kwargs):
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make().to(device)  # the optimizer is built AFTER the move
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01, **opt_kwargs)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **opt_kwargs)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(*shape).to(device), torch.randint(0, 3, (shape[0],)).to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()], model


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_training_is_bit_identical_to_cpu(emu, name, optimizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses, params, model = train(name, emu.device(0), optimizer)
    # The device's optimizers take the foreach path (as on DirectML): compare with it on the CPU.
    ref_losses, ref_params, _ = train(name, "cpu", optimizer, foreach=True)
    assert losses == ref_losses
    assert all(torch.equal(p, q) for p, q in zip(params, ref_params))
    if name == "cnn":
        assert torch.equal(model.bn.running_mean.cpu(), _.bn.running_mean)
    # Adam's lerp is the op torch-directml 0.2.5 runs on the CPU (#675), once per parameter.
    counts = emu.fallback_counts()
    n = len(params) * 3
    assert counts == ({"aten::lerp.Scalar_out": n} if optimizer == "adam" else {})


def test_lstm_fused_cell_falls_back_and_fails_like_directml(emu):
    _fallback.rearm_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(NotImplementedError, match="_thnn_fused_lstm_cell"):
            train("lstm", emu.device(0), "sgd")
    assert fallback_warnings(caught) == [warning_text("aten::_thnn_fused_lstm_cell")]
    assert emu.fallback_counts() == {"aten::_thnn_fused_lstm_cell": 1}


def test_lstm_trains_when_the_fallback_gap_is_off(emu):
    emu.set_switches(["float64"])
    losses, params, _ = train("lstm", emu.device(0), "adam")
    ref_losses, ref_params, _ = train("lstm", "cpu", "adam", foreach=True)
    # PyTorch's LSTM takes the fused-cell algorithm for PrivateUse1 tensors (as on DirectML)
    # and oneDNN/the unfused cell on the CPU: equal up to float rounding, not bit for bit.
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert emu.fallback_counts() == {}


def test_parameter_replacement_trap(emu):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # built BEFORE the move
    old = [p for p in model.parameters()]
    before = [p.detach().clone() for p in old]
    assert not torch._has_compatible_shallow_copy_type(old[0], old[0].to(emu.device()))
    model.to(emu.device())
    assert all(p is not q for p, q in zip(model.parameters(), old))
    assert all(isinstance(p, nn.Parameter) and p.device.type == "privateuseone"
               for p in model.parameters())
    model(torch.randn(4, 3, device=emu.device())).sum().backward()
    opt.step()  # steps the dead CPU tensors: no gradient there, nothing changes
    assert all(torch.equal(p.detach(), q) for p, q in zip(old, before))
    live = [p.detach().cpu().clone() for p in model.parameters()]
    opt.step()
    assert all(torch.equal(p.detach().cpu(), q) for p, q in zip(model.parameters(), live))
    # device -> device conversions keep the Parameter (shallow-copy compatible), -> cpu not
    weight = model.weight
    assert model.half().weight is weight and weight.dtype is torch.float16
    assert model.cpu().weight is not weight
    assert emu.fallback_counts() == {}


def test_optimizers_take_the_foreach_path_on_the_device(emu):
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = list(nn.Linear(2, 2).to(emu.device()).parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, True)
    assert _default_to_fused_or_foreach(list(nn.Linear(2, 2).parameters()), False) == (False, False)


def test_deepcopy_and_checkpoints(emu):
    model = nn.Sequential(nn.Linear(3, 2)).to(emu.device())
    clone = copy.deepcopy(model)
    assert clone[0].weight is not model[0].weight and isinstance(clone[0].weight, nn.Parameter)
    assert torch.equal(clone[0].weight.cpu(), model[0].weight.cpu())
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    # newer torch has an allow-listed rebuild for PrivateUse1 tensors (weights_only loads)
    safe = hasattr(torch._utils, "_rebuild_device_tensor_from_cpu_tensor")
    state = torch.load(buf, **({} if safe else {"weights_only": False}))
    assert state["0.weight"].device == emu.device() and torch.equal(state["0.weight"].cpu(),
                                                                   model[0].weight.cpu())


# -- fidelity switches -----------------------------------------------------------------------


def reported(name):
    return next(op for op in _fallback.REPORTED_FALLBACKS if op.name == name)


def trigger_reported_ops(dev):
    """Run each reported op once on ``dev``; return {reported name: ran}."""
    x = torch.rand(4, 6, device=dev)
    params = [torch.ones(2, 2, device=dev), torch.ones(3, device=dev)]
    runs = {
        "aten::lerp.Scalar_out": lambda: torch.lerp(x, x * 2, 0.5),
        "aten::cumprod.out": lambda: torch.cumprod(x, 1),
        "aten::binary_cross_entropy": lambda: F.binary_cross_entropy(x, x),
        "aten::normal.Tensor_Tensor": lambda: torch.normal(x, x),
        "aten::eye.m_out": lambda: torch.eye(3, 4, device=dev),
        "aten::_linalg_solve_ex.result": lambda: torch.linalg.solve(
            torch.eye(2).to(dev) * 2, torch.ones(2, 1, device=dev)),
        "aten::count_nonzero.dim_IntList": lambda: torch.count_nonzero(x),
        "aten::upsample_nearest1d.out": lambda: F.interpolate(x[None], scale_factor=2),
        "aten::_embedding_bag": lambda: nn.EmbeddingBag(5, 3).to(dev)(
            torch.tensor([[0, 1], [2, 3]], device=dev)),
        "aten::native_group_norm_backward": lambda: F.group_norm(
            x.view(2, 4, 3).requires_grad_(), 2).sum().backward(),
        "aten::multinomial": lambda: torch.multinomial(x[0], 2),
        "aten::std_mean.correction": lambda: torch.std_mean(x, 1),
        "aten::native_dropout_backward": lambda: F.dropout(
            x.clone().requires_grad_(), 0.5).sum().backward(),
        "aten::_foreach_add_.List": lambda: torch._foreach_add_(params, params),
        "aten::_foreach_mul_.Scalar": lambda: torch._foreach_mul_(params, 0.5),
        "aten::_foreach_lerp_.Scalar": lambda: torch._foreach_lerp_(params, params, 0.5),
    }
    for run in runs.values():
        run()
    return runs


def test_fallback_gap_matches_the_reported_table(emu):
    _fallback.rearm_warnings()
    dev = emu.device(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = trigger_reported_ops(dev)
        torch.cumprod(torch.ones(3, device=dev), 0)  # a second time: counted, not warned
    counts = emu.fallback_counts()
    expected = {op.name for op in _fallback.REPORTED_FALLBACKS
                if op.falls_back_in_0_2_5 and op.name in runs}
    assert set(counts) == expected, counts
    assert counts["aten::cumprod.out"] == 2 and counts["aten::lerp.Scalar_out"] == 1 + 2
    # one TORCH_WARN_ONCE site for every op: the first fallback of the process warns, no other
    assert fallback_warnings(caught) == [warning_text("aten::lerp.Scalar_out")]
    # without the fallback-warn-once gap: once per operator
    emu.set_switches([s for s in emu.GAPS if s != "fallback-warn-once"])
    _fallback.rearm_warnings()
    emu.reset_fallback_counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trigger_reported_ops(dev)
        torch.cumprod(torch.ones(3, device=dev), 0)
    assert sorted(fallback_warnings(caught)) == sorted(warning_text(op) for op in expected)
    assert all(op.issues for op in _fallback.REPORTED_FALLBACKS)
    assert reported("aten::_foreach_add_.List").issues == (604,)
    # off: same results, nothing counted, nothing said
    emu.reset_fallback_counts()
    emu.set_switches(["float64"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trigger_reported_ops(dev)
        assert torch.equal(torch.cumprod(torch.arange(1.0, 5.0, device=dev), 0).cpu(),
                           torch.tensor([1.0, 2.0, 6.0, 24.0]))
    assert emu.fallback_counts() == {} and fallback_warnings(caught) == []


def test_kernel_hook_takes_ops_off_the_fallback(emu):
    dev = emu.device(0)
    calls = []

    def lerp_out(self, end, weight, *, out):
        calls.append("lerp")
        result = self + (end - self) * weight
        out.resize_(result.shape)
        return out.copy_(result)

    emu.register_device_kernel("lerp.Scalar_out", lerp_out)
    try:
        model = nn.Linear(3, 2).to(dev)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 3, device=dev)).sum().backward()
        opt.step()
        x = torch.ones(3, device=dev)
        assert torch.equal(torch.lerp(x, x * 0, 0.25).cpu(), torch.full((3,), 0.75))
        assert emu.fallback_counts() == {} and len(calls) == 3
    finally:
        assert emu.unregister_device_kernel("lerp.Scalar_out")
    torch.lerp(x, x, 0.5)
    assert emu.fallback_counts() == {"aten::lerp.Scalar_out": 1} and len(calls) == 3
    # a kernel registered directly through torch.library counts the same
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("cumprod", lambda self, dim, *, dtype=None: self * 0 + 7, "PrivateUse1")
    try:
        assert torch.equal(torch.cumprod(x, 0).cpu(), torch.full((3,), 7.0))
        assert "aten::cumprod.out" not in emu.fallback_counts()
    finally:
        lib._destroy()
    torch.cumprod(x, 0)
    assert emu.fallback_counts()["aten::cumprod.out"] == 1


def test_float64_switch(emu):
    dev = emu.device(0)
    x = torch.ones(2, device=dev)
    for make in (lambda: torch.zeros(2, dtype=torch.float64, device=dev),
                 lambda: torch.ones(2, dtype=torch.float64).to(dev), lambda: x.double(),
                 lambda: x.sum(dtype=torch.float64), lambda: repr(x)):
        with pytest.raises(RuntimeError) as err:
            make()
        assert str(err.value) == F64
    assert not torch.privateuseone.has_float64_support(0)
    assert x.to("cpu", torch.float64).dtype is torch.float64 and x.sum().item() == 2.0
    emu.set_switches(["fallback"])
    assert torch.privateuseone.has_float64_support(0)
    y = torch.ones(2, dtype=torch.float64).to(dev)
    assert y.dtype is torch.float64 and (y * 2).sum().item() == 4.0 and "1." in repr(x)


def test_autocast_switch(emu):
    dev = emu.device(0)
    a = torch.randn(4, 4, device=dev)
    # torch-directml 0.2.5 on torch 2.4.1: accepted, then no AutocastPrivateUse1 kernel
    with pytest.raises(NotImplementedError, match="AutocastPrivateUse1"):
        with torch.autocast("privateuseone"):
            a @ a
    with pytest.raises(NotImplementedError, match="AutocastPrivateUse1"):
        with torch.autocast(device_type="privateuseone", dtype=torch.float16):
            F.relu(a)
    with pytest.warns(UserWarning, match="target dtype is not supported"):
        with torch.autocast("privateuseone", dtype=torch.bfloat16):
            assert (a @ a).dtype is torch.float32
    assert (a @ a).dtype is torch.float32  # outside a region nothing changes
    emu.set_switches(["fallback", "float64"])
    model = nn.Linear(4, 3).to(dev)
    with torch.autocast("privateuseone"):
        out = model(a)
        loss = F.cross_entropy(out, torch.zeros(4, dtype=torch.long, device=dev))
        assert (a @ a).dtype is torch.float16 and F.softmax(a, 1).dtype is torch.float32
    assert out.dtype is torch.float16 and loss.dtype is torch.float32
    loss.backward()
    assert model.weight.grad.dtype is torch.float32
    emu.set_switches(emu.GAPS)
    with pytest.raises(NotImplementedError, match="AutocastPrivateUse1"):
        with torch.autocast("privateuseone"):
            a @ a


def test_generator_switch(emu):
    dev = emu.device(1)
    cpu_gen = torch.Generator().manual_seed(5)
    expected = torch.randn(3, generator=cpu_gen)
    g = torch.Generator(device="privateuseone:1")
    assert g.device == torch.device("cpu") and isinstance(g, torch.Generator)
    assert torch.equal(torch.randn(3, device=dev, generator=g.manual_seed(5)).cpu(), expected)
    emu.set_switches(["fallback"])
    g = torch.Generator(device="privateuseone:1")
    assert g.device == dev and isinstance(g, torch.Generator)
    assert torch.equal(torch.randn(3, device=dev, generator=g.manual_seed(5)).cpu(), expected)
    assert torch.Generator().device.type == "cpu"
    with pytest.raises(IndexError):
        torch.Generator(device="privateuseone:7")
    torch.manual_seed(3)  # calls torch.privateuseone.manual_seed_all: CPU generator, as DML
    assert torch.equal(torch.rand(2, device=dev).cpu(), torch.manual_seed(3) and torch.rand(2))


def test_wrong_result_gaps_and_the_bn_bug(emu):
    # (tests/test_dml_facts.py checks every gap against the CPU in detail)
    dev = emu.device(0)

    def ce_none_grad():
        logits = torch.randn(4, 3, device=dev, requires_grad=True)
        target = torch.tensor([0, 1, 2, 0], device=dev)
        loss = F.cross_entropy(logits, target, reduction="none")
        (loss * torch.tensor([0.0, 1.0, 2.0, 3.0], device=dev)).sum().backward()
        return logits.grad.abs().sum().item()

    def mul_bool():
        x = torch.tensor([-3.4e38, 2.0], device=dev)
        mask = x > 0
        y = x * mask
        x *= mask
        return y.dtype, x.dtype, x.tolist()

    def bn_stats():
        bn = nn.BatchNorm1d(2).to(dev)
        bn(torch.randn(8, 2, device=dev) + 5)
        return bn.running_mean.abs().sum().item()

    # the defaults, as on the wheel: grad_output[0] == 0 for every row; bool products
    assert ce_none_grad() == 0.0 and bn_stats() > 0
    assert mul_bool() == (torch.bool, torch.bool, [False, True])
    assert (torch.ones(2, device=dev) * torch.ones(2, device=dev)).dtype is torch.float32
    emu.set_switches([s for s in emu.GAPS if s not in ("nll-none-backward", "mul-bool")])
    assert ce_none_grad() > 0
    assert mul_bool() == (torch.float32, torch.float32, [-0.0, 2.0])
    emu.set_switches(["fallback", "bug-ce-none", "bug-mul-bool"])  # the old names
    assert emu.switches() == {"fallback", "nll-none-backward", "mul-bool"}
    assert ce_none_grad() == 0.0
    emu.set_switches(emu.GAPS + ("bug-bn-stats",))
    assert bn_stats() == 0.0
    emu.set_switches(emu.GAPS)
    assert bn_stats() > 0


def test_memory_counters(emu):
    import gc

    gc.collect()
    base0, base1 = emu.memory_allocated(0), emu.memory_allocated(1)
    emu.reset_peak_memory_stats()
    x = torch.empty(1000, device=emu.device(0))
    views = [x.view(10, 100), x[:10], x.t() if x.dim() == 2 else x[::2]]  # share the storage
    assert emu.memory_allocated(0) - base0 == 4000
    y = torch.empty(10, dtype=torch.int64, device=emu.device(1))
    assert emu.memory_allocated(1) - base1 == 80
    assert emu.memory_allocated() == emu.memory_allocated(0) + emu.memory_allocated(1)
    del x, views
    gc.collect()
    assert emu.memory_allocated(0) == base0 and emu.max_memory_allocated(0) - base0 == 4000
    emu.reset_peak_memory_stats(0)
    assert emu.max_memory_allocated(0) == base0
    z = torch.empty(0, device=emu.device(0))
    # in-place growth is counted (an out= kernel that sizes its output, as the wheel's arange:
    # its resize_ cannot grow a tensor)
    torch.arange(250, out=z)
    assert emu.memory_allocated(0) - base0 == 1000
    del y, z
    emu.synchronize()
    emu.synchronize(1)


def test_register_refused_beside_torch_directml_and_late_registration():
    code = textwrap.dedent("""
        import sys, types
        import torch
        sys.modules["torch_directml"] = types.ModuleType("torch_directml")
        import emulated_dml as emulator
        try:
            emulator.register()
        except emulator.EmulatorError as err:
            print("refused:", err)
        print("registered:", emulator.is_registered())
        del sys.modules["torch_directml"]
        torch.ones(1, requires_grad=True).sum().backward()  # the engine starts without it
        emulator.register()
        print("autograd:", emulator.autograd_ready())
    """)
    env = dict(os.environ, DMLSHIM_DISABLE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "refused: dmlshim emulator: torch_directml is already imported" in proc.stdout
    assert "registered: False" in proc.stdout
    assert "autograd: False" in proc.stdout


def test_the_guard_build_says_so_when_it_builds_and_every_checkout_shares_it(tmp_path,
                                                                             monkeypatch):
    """The first emulated-dml run of a torch version compiles _guard.cpp (half a minute or
    more): one line says so, and only then. The compile command names a copy of the source in
    torch's build folder, the same for every checkout, so checkouts sharing the cache do not
    rebuild it for each other (torch's ninja build is stood in for: the real one takes minutes)."""
    import logging

    from torch.utils import cpp_extension

    from emulated_dml import _backend

    if _backend.shutil.which(os.environ.get("CXX", "g++")) is None \
            and _backend.shutil.which("c++") is None:
        pytest.fail("no C++ compiler: the emulator's guard cannot be built here")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    loads = []

    def build(name, sources, build_directory=None, **kwargs):
        loads.append((name, list(sources), build_directory))
        Path(build_directory, name + _backend._EXTENSION_SUFFIX).write_bytes(b"")  # the result
        return "guard module"

    monkeypatch.setattr(cpp_extension, "load", build)
    messages = []

    class Records(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Records(logging.WARNING)
    logger = logging.getLogger("dmlshim")
    logger.addHandler(handler)
    try:
        assert _backend._build_cpp_guard() == "guard module"
        assert len(messages) == 1 and "building the emulator's C++ device guard" in messages[0]
        assert _backend._build_cpp_guard() == "guard module"  # built: nothing said
        assert len(messages) == 1, messages
    finally:
        logger.removeHandler(handler)
    assert loads[0] == loads[1]
    (name, (source,), folder) = loads[0]
    assert Path(source).parent == Path(folder) and str(tmp_path) in folder
    assert Path(source).read_bytes() == (ROOT / "emulated_dml" / "_guard.cpp").read_bytes()
