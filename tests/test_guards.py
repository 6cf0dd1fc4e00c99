"""Guards against torch-directml 0.2.5's silent wrong results, tested against the emulator's
reproductions (its default gaps nll-none-backward and mul-bool, and the opt-in bug-bn-stats;
tests/test_dml_facts.py covers every guard against its fact).

Training with backward on the emulator runs in a subprocess: the autograd engine of a process
that already ran a CPU backward has no device queue for a backend registered later.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import clean_env, describe

import dmlshim
from dmlshim import api, capabilities, config, patching
from dmlshim.kernels.guards.passthrough import EXCLUDE, INCLUDE, NOT_HERE, OTHER
from dmlshim.kernels.guards.records import BY_NAME, GUARDS
from dmlshim.patches.guards import active_guards
from dmlshim.target import Target

BUGS = "all,bug-bn-stats"
# the old names of two default gaps are still accepted
ALIASES = "fallback,float64,autocast,generator,bug-ce-none,bug-mul-bool,bug-bn-stats"

CHECKS = r"""
import dmlshim  # installs from DMLSHIM_* in the environment
import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from dmlshim import events

out = {}
torch.manual_seed(0)

# cross_entropy(reduction="none"): loss and gradient against the CPU
x_cpu = torch.randn(6, 5)
t_cpu = torch.tensor([0, 1, 4, -100, 2, 3])
x3_cpu = torch.randn(2, 5, 3)
t3_cpu = torch.randint(0, 5, (2, 3))
w_cpu = torch.rand(5)
cases = {
    "plain": (x_cpu, t_cpu, {}),
    "weight_ignore_smooth": (x_cpu, t_cpu, {"weight": w_cpu, "label_smoothing": 0.1}),
    "spatial": (x3_cpu, t3_cpu, {}),
    "probabilities": (x_cpu, torch.softmax(torch.randn(6, 5), 1), {"label_smoothing": 0.2}),
}
for name, (xc, tc, kw) in cases.items():
    ref_x = xc.clone().requires_grad_()
    ref = F.cross_entropy(ref_x, tc, reduction="none", **kw)
    (ref * torch.arange(1.0, ref.numel() + 1).view_as(ref)).sum().backward()
    dx = xc.cuda().requires_grad_()
    dkw = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in kw.items()}
    loss = F.cross_entropy(dx, tc.cuda(), reduction="none", **dkw)
    (loss * torch.arange(1.0, ref.numel() + 1).view_as(ref).cuda()).sum().backward()
    out["ce_" + name] = {
        "loss_equal": torch.equal(loss.detach().cpu(), ref.detach()),
        "grad_equal": torch.equal(dx.grad.cpu(), ref_x.grad),
        "grad_nonzero": bool(dx.grad.abs().sum() > 0),
    }
module_loss = nn.CrossEntropyLoss(reduction="none")(x_cpu.cuda().requires_grad_(), t_cpu.cuda())
out["ce_module_has_grad_fn"] = module_loss.grad_fn is not None
mean_x = x_cpu.cuda().requires_grad_()
F.cross_entropy(mean_x, t_cpu.cuda()).backward()  # reduction="mean" is not affected
ref_x = x_cpu.clone().requires_grad_()
F.cross_entropy(ref_x, t_cpu).backward()
out["ce_mean_grad_equal"] = torch.equal(mean_x.grad.cpu(), ref_x.grad)

# float_tensor *= bool_tensor
a = torch.randn(8)
mask = a > 0
y = a.cuda()
y *= mask.cuda()
ref = a.clone()
ref *= mask
out["mul_dtype"] = str(y.dtype)
out["mul_equal"] = y.dtype == ref.dtype and torch.equal(y.cpu(), ref)
z = torch.ones(4).cuda()
z *= torch.full((4,), 2.0).cuda()
out["mul_float_ok"] = torch.equal(z.cpu(), torch.full((4,), 2.0))

# BatchNorm running statistics, with momentum and with cumulative averaging
for momentum in (0.1, None):
    key = "bn_" + ("momentum" if momentum else "cumulative")
    bn_cpu = nn.BatchNorm2d(3, momentum=momentum)
    bn_dev = nn.BatchNorm2d(3, momentum=momentum).cuda()
    outs_equal = True
    for step in range(3):
        xb = torch.randn(4, 3, 5, 5) * (step + 1) + step
        o_cpu = bn_cpu(xb)
        o_dev = bn_dev(xb.cuda())
        outs_equal = outs_equal and torch.allclose(o_dev.cpu(), o_cpu, atol=1e-5)
    out[key] = {
        "mean_close": torch.allclose(bn_dev.running_mean.cpu(), bn_cpu.running_mean, atol=1e-5),
        "var_close": torch.allclose(bn_dev.running_var.cpu(), bn_cpu.running_var, atol=1e-5),
        "updated": not torch.equal(bn_dev.running_mean.cpu(), torch.zeros(3)),
        "batches": int(bn_dev.num_batches_tracked),
        "outputs_close": bool(outs_equal),
    }
    bn_dev.eval()
    bn_cpu.eval()
    xe = torch.randn(2, 3, 5, 5)
    out[key]["eval_close"] = torch.allclose(bn_dev(xe.cuda()).cpu(), bn_cpu(xe), atol=1e-5)

out["notes"] = {k: v for k, v in events.notes.items() if k.startswith("guard.")}
print("RESULT " + json.dumps(out))
"""


def run_checks(guards: str, gaps: str = BUGS):  # noqa: D103
    env = clean_env(DMLSHIM_DEVICE="emulated-dml", DMLSHIM_EMULATOR_GAPS=gaps,
                    DMLSHIM_GUARDS=guards)
    proc = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


CE_CASES = ["plain", "weight_ignore_smooth", "spatial"]


@pytest.mark.emulator
def test_emulator_reproduces_the_bugs_without_guards():
    r = run_checks("off", ALIASES)
    # nll_loss backward with reduction="none" uses grad_output[0] for every row (#739, #740):
    # wrong under the non-uniform upstream gradient used here
    for case in CE_CASES:
        assert r["ce_" + case]["loss_equal"] and not r["ce_" + case]["grad_equal"], r
    assert r["mul_dtype"] == "torch.bool" and not r["mul_equal"]  # #686, #737
    assert not r["bn_momentum"]["updated"] and not r["bn_cumulative"]["updated"]  # #362
    assert r["notes"] == {}


@pytest.mark.emulator
def test_guards_give_cpu_results_on_the_buggy_device():
    r = run_checks("on")
    for case in CE_CASES + ["probabilities"]:
        assert r["ce_" + case] == {"loss_equal": True, "grad_equal": True,
                                   "grad_nonzero": True}, (case, r)
    assert r["ce_module_has_grad_fn"] and r["ce_mean_grad_equal"]
    assert r["mul_dtype"] == "torch.float32" and r["mul_equal"] and r["mul_float_ok"]
    for key in ("bn_momentum", "bn_cumulative"):
        assert r[key] == {"mean_close": True, "var_close": True, "updated": True, "batches": 3,
                          "outputs_close": True, "eval_close": True}, (key, r)
    notes = r["notes"]
    # the nll cases' backward ("mean" and probabilities pass through); the spatial one is
    # computed with its forward (reduction none: where and sum, which autograd differentiates)
    assert notes["guard.nll_none"] == 2 and notes["guard.nll"] == 1
    assert notes["guard.mul_bool"] == 1  # the float *= float call passes through
    assert notes["guard.bn_stats"] == 6  # training calls only


def test_which_guards_are_active():
    on = config.load({"device": "cpu"})
    off = config.load({"device": "cpu", "guards": "off"})
    kernels = tuple(g.name for g in GUARDS if g.name != "bn_stats")
    dml = Target("dml", 1, "test")
    # real DirectML: every kernel guard; the BatchNorm one never (#362 is not in 0.2.5)
    assert active_guards(capabilities.of(dml, on), on) == kernels
    assert active_guards(capabilities.of(dml, off), off) == ()
    emu = Target("emulated-dml", 1, "test")
    assert active_guards(capabilities.of(emu, on), on) == kernels  # they key off the target, not the gaps,
    # except the max-pool one: it converts the wheel's flattened indices, so it needs them
    none = config.load({"device": "cpu", "emulator_gaps": "none"})
    gapless = tuple(g for g in kernels if g != "max_pool_indices")
    assert active_guards(capabilities.of(emu, none), none) == gapless
    bn = config.load({"device": "cpu", "emulator_gaps": "fallback,bug-bn-stats"})
    assert active_guards(capabilities.of(emu, bn), bn) == gapless + ("bn_stats",)
    assert active_guards(capabilities.of(dml, bn), bn) == kernels
    assert active_guards(capabilities.of(Target("cpu", 1, "test"), on), on) == ()


GUARDED_OPS = ("aten::eye.m_out", "aten::mul.Tensor", "aten::nll_loss_backward",
               "aten::masked_fill_.Scalar", "aten::reflection_pad2d",
               "aten::native_layer_norm_backward", "aten::flip")


def _device_kernels():
    # replacements on PrivateUse1, input fixes above autograd (see records.Guard.key)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return {op for op in GUARDED_OPS
            if has(op, "PrivateUse1") or has(op, "AutogradPrivateUse1")}


@pytest.mark.emulator
def test_guards_install_only_their_kernels_and_uninstall(shim):
    batch_norm, imul = F.batch_norm, torch.Tensor.__imul__
    assert _device_kernels() == set()
    shim(device="emulated-dml", guards="off")
    guards = next(p for p in api._patches.patches if p.name == "guards")  # type: ignore[union-attr]
    assert guards.active == () and not guards._keys and not guards._undo
    assert _device_kernels() == set()
    dmlshim.uninstall()
    shim(device="emulated-dml")  # kernels for the device only: no Python entry point wrapped
    assert _device_kernels() == set(GUARDED_OPS)
    assert F.batch_norm is batch_norm and torch.Tensor.__imul__ is imul
    dmlshim.uninstall()
    assert _device_kernels() == set()
    shim(device="emulated-dml", emulator_gaps=BUGS)
    assert F.batch_norm is not batch_norm and _device_kernels() == set(GUARDED_OPS)
    dmlshim.uninstall()
    assert F.batch_norm is batch_norm and not patching.is_patched(F, "batch_norm")
    assert _device_kernels() == set()
    shim(device="cpu", emulator_gaps=BUGS)  # the CPU has none of these bugs
    assert F.batch_norm is batch_norm and _device_kernels() == set()


@pytest.mark.emulator
def test_view_replay_is_on_for_directml_only_and_uninstall_restores_it(shim):
    # the wheel's views report storage offset 0, so autograd must replay view ops in the
    # backward of a write into a view (tests/test_real_wheel.py shows the wheel's wrong
    # gradients; the emulator's tensors, a Python subclass, always get view replay from torch)
    replay = torch._C._is_view_replay_enabled
    assert not replay()
    shim(device="emulated-dml")
    assert replay()
    dmlshim.uninstall()
    assert not replay()
    shim(device="emulated-dml", guards="off")
    assert not replay()
    dmlshim.uninstall()
    shim(device="cpu")
    assert not replay()
    dmlshim.uninstall()
    torch._C._set_view_replay_enabled(True)  # the script's own setting is kept
    try:
        shim(device="emulated-dml")
        dmlshim.uninstall()
        assert replay()
    finally:
        torch._C._set_view_replay_enabled(False)


@pytest.mark.emulator
def test_the_emulator_judges_a_read_back_below_the_guard(shim, monkeypatch):
    """The emulator's readback-gil check stands below autograd, where the wheel's kernel would
    be entered, so it judges the guard readback_gil's own read back (the guard replaces nothing
    of it): the guard's passes; a kernel in its place that read back holding the GIL fails."""
    shim(device="emulated-dml")
    t = torch.tensor([3, 1], device="cuda").max()
    assert torch.zeros(2, t, device="cuda").shape == (2, 3)  # the parser reads t, GIL held
    assert t.item() == 3 and int(t) == 3
    dmlshim.uninstall()

    def holding_the_gil(self):
        # torch's argument parser reads ``self`` as a number while it holds the GIL
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return torch._C._VariableFunctions.full((), self).item()

    monkeypatch.setitem(BY_NAME["readback_gil"].kernels, "_local_scalar_dense", holding_the_gil)
    shim(device="emulated-dml")
    t = torch.tensor([3, 1], device="cuda").max()
    for read in (lambda: torch.zeros(2, t, device="cuda"), t.item):
        with pytest.raises(RuntimeError, match="gap readback-gil"):
            read()


LAYOUT = r"""
import dmlshim, torch
conv = torch.nn.Conv2d(3, 4, 3)
try:
    conv.to("cuda", memory_format=torch.channels_last)
    print("RESULT moved", conv.weight.device.type)
except RuntimeError as err:
    print("RESULT refused", err)
"""


@pytest.mark.emulator
@pytest.mark.parametrize("guards", ["on", "off"])
def test_guards_off_leaves_memory_format_to_the_wheel(guards):
    """DMLSHIM_GUARDS=off is raw: the channels-last rewrite is a guard too, so the wheel's
    refusal shows (the emulator's channels-last gap, the wheel's text)."""
    env = clean_env(DMLSHIM_DEVICE="emulated-dml", DMLSHIM_GUARDS=guards)
    proc = subprocess.run([sys.executable, "-c", LAYOUT], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    if guards == "on":
        assert line == "RESULT moved privateuseone", line
    else:
        assert line == ("RESULT refused 'memory_format' argument is must be Contiguous for DML "
                        "tensors"), line


@pytest.mark.emulator
@pytest.mark.parametrize("dim,keepdim", [(1, False), ((0, 1), True), (-1, True)])
def test_logsumexp_on_the_strict_device_matches_the_cpu(shim, dim, keepdim):
    # the composite's empty sum.out result is not resized on the wheel (out-resize gap): the
    # guard computes it from functional ops; values and gradient are the CPU's
    shim(device="emulated-dml")
    torch.manual_seed(0)
    x = torch.randn(4, 6, 3)
    x[0, 0, 0] = float("-inf")
    ref = x.clone().requires_grad_(True)
    expect = torch.logsumexp(ref, dim, keepdim)
    expect.sum().backward()
    dev = x.to("cuda").requires_grad_(True)
    got = torch.logsumexp(dev, dim, keepdim)
    got.sum().backward()
    assert got.device.type == "privateuseone" and got.shape == expect.shape
    torch.testing.assert_close(got.cpu(), expect.detach())
    torch.testing.assert_close(dev.grad.cpu(), ref.grad)
