"""CUDA AMP under the shim: autocast regions and GradScaler (DMLSHIM_AMP=off | fp16)."""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
import torch.amp.autocast_mode as autocast_mode
import torch.amp.grad_scaler as grad_scaler
from helpers import REPO, describe, losses, run_native, run_shim
from test_serialization import save_as_if_on_cuda

import dmlshim
from dmlshim import patching

CUDA_WARNING = "CUDA is not available"

# Every way a CUDA script opens an autocast region.
REGIONS = {
    "torch.cuda.amp.autocast()": lambda: torch.cuda.amp.autocast(),
    "torch.autocast('cuda')": lambda: torch.autocast("cuda"),
    "torch.autocast(device_type='cuda', dtype=float16)":
        lambda: torch.autocast(device_type="cuda", dtype=torch.float16),
    "torch.amp.autocast('cuda')": lambda: torch.amp.autocast("cuda"),
    "torch.cuda.amp.autocast(dtype=bfloat16)": lambda: torch.cuda.amp.autocast(dtype=torch.bfloat16),
}


def matmul_dtype(make_region, device="cuda"):
    a = torch.randn(4, 4, device=device)
    with make_region():
        return (a @ a).dtype


def recorded(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


def test_without_the_shim_torch_warns_and_disables():
    # What a CPU-only torch does with CUDA AMP: the reason the shim answers these calls.
    dtype, messages = recorded(lambda: matmul_dtype(REGIONS["torch.autocast('cuda')"], "cpu"))
    assert dtype is torch.float32 and any(CUDA_WARNING in m for m in messages)
    scaler, messages = recorded(lambda: torch.amp.GradScaler("cuda"))
    assert not scaler.is_enabled() and scaler.state_dict() == {}
    assert any(CUDA_WARNING in m for m in messages)


@pytest.mark.parametrize("region", list(REGIONS))
def test_off_regions_run_float32_without_cuda_warnings(shim, region):
    shim(device="cpu")
    dtype, messages = recorded(lambda: matmul_dtype(REGIONS[region]))
    assert dtype is torch.float32
    assert not [m for m in messages if CUDA_WARNING in m or "bfloat16" in m], messages


def test_off_decorator_and_user_disabled_region(shim):
    shim(device="cpu")

    @torch.autocast("cuda")
    def f(a):
        return a @ a

    out, messages = recorded(lambda: f(torch.randn(3, 3, device="cuda")))
    assert out.dtype is torch.float32 and not messages
    with torch.autocast("cuda", enabled=False):
        assert not torch.is_autocast_enabled("cuda")


def train_step(model, opt, scaler, x, y):
    opt.zero_grad()
    with torch.autocast("cuda"):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    return loss, scaled


def test_off_gradscaler_is_a_working_disabled_scaler(shim):
    shim(device="cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    (scaler, old), messages = recorded(lambda: (torch.amp.GradScaler("cuda"),
                                                torch.cuda.amp.GradScaler(init_scale=1024.0)))
    assert not [m for m in messages if CUDA_WARNING in m], messages
    for _ in range(3):
        loss, scaled = train_step(model, opt, scaler, x, y)
        assert scaled is loss  # a disabled scaler returns its input
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)  # step() ran optimizer.step() with unscaled gradients
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled()
    assert scaler.state_dict() == {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                   "growth_interval": 2000, "_growth_tracker": 0}
    assert old.state_dict()["scale"] == 1024.0
    cuda_state = {"scale": 8192.0, "growth_factor": 3.0, "backoff_factor": 0.25,
                  "growth_interval": 100, "_growth_tracker": 42}
    old.load_state_dict(cuda_state)
    assert old.state_dict() == cuda_state
    old.load_state_dict({})  # what a disabled scaler wrote
    assert old.state_dict() == cuda_state
    with pytest.raises(KeyError, match="GradScaler.load_state_dict"):
        old.load_state_dict({"scale": 1.0})
    off = torch.amp.GradScaler("cuda", enabled=False)  # the script's own choice stays torch's
    assert off.state_dict() == {} and off.load_state_dict(cuda_state) is None
    with pytest.raises(AssertionError, match="growth factor"):
        torch.amp.GradScaler("cuda", growth_factor=0.5)


def test_gradscaler_state_from_a_cuda_checkpoint(shim):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    state = {"scale": 2048.0, "growth_factor": 2.0, "backoff_factor": 0.5,
             "growth_interval": 2000, "_growth_tracker": 5}
    buf = io.BytesIO()
    save_as_if_on_cuda({"model": model.state_dict(), "scaler": state}, buf)
    shim(device="cpu")
    ckpt = torch.load(io.BytesIO(buf.getvalue()))
    scaler = torch.cuda.amp.GradScaler()
    scaler.load_state_dict(ckpt["scaler"])
    assert scaler.state_dict() == state
    out = io.BytesIO()
    torch.save({"scaler": scaler.state_dict()}, out)  # written here, resumes on CUDA as saved
    assert torch.load(io.BytesIO(out.getvalue()))["scaler"] == state


def test_fp16_on_cpu_target_autocasts_and_scales(shim):
    shim(device="cpu", amp="fp16")
    for name in ("torch.cuda.amp.autocast()", "torch.autocast('cuda')", "torch.amp.autocast('cuda')"):
        dtype, messages = recorded(lambda region=REGIONS[name]: matmul_dtype(region))
        assert dtype is torch.float16, name
        assert not [m for m in messages if CUDA_WARNING in m], messages
    assert matmul_dtype(REGIONS["torch.cuda.amp.autocast(dtype=bfloat16)"]) is torch.bfloat16
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=256.0)
    assert scaler.is_enabled()
    x, y = torch.randn(8, 4, device="cuda"), torch.randn(8, 2, device="cuda")
    before = model.weight.detach().clone()
    loss, scaled = train_step(model, opt, scaler, x, y)
    assert loss.dtype is torch.float32  # mse_loss autocasts to float32
    assert torch.allclose(scaled, loss * 256.0)
    assert not torch.equal(before, model.weight)
    assert scaler.state_dict()["scale"] == 256.0


def test_fp16_custom_fwd_sees_the_real_autocast_device(shim):
    shim(device="cpu", amp="fp16")

    class Double(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a):
            ctx.seen = (a.dtype, torch.is_autocast_enabled("cpu"))
            return a * 2

        @staticmethod
        @torch.cuda.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    a = torch.randn(2, 2, device="cuda", dtype=torch.float16, requires_grad=True)
    with torch.autocast("cuda"):
        out = Double.apply(a)
    assert out.dtype is torch.float32
    out.sum().backward()
    assert a.grad is not None


@pytest.mark.emulator
def test_emulator_off_and_fp16_fallback(shim):
    shim(device="emulated-dml")
    dtype, messages = recorded(lambda: matmul_dtype(REGIONS["torch.cuda.amp.autocast()"]))
    assert dtype is torch.float32 and not [m for m in messages if "dmlshim" in m or CUDA_WARNING in m]
    # fp16: torch-directml 0.2.5 cannot autocast (#454; the emulator's "autocast" gap, on by
    # default): float32 with one warning per call site.
    shim(device="emulated-dml", amp="fp16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            assert matmul_dtype(lambda: torch.autocast("cuda")) is torch.float32
    ours = [w for w in caught if "#454" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__, [(w.filename, w.lineno) for w in caught]
    scaler = torch.amp.GradScaler("cuda")
    assert not scaler.is_enabled() and scaler.state_dict()["scale"] == 65536.0


def test_uninstall_restores_amp_entry_points():
    pairs = [(autocast_mode.autocast, "__init__"), (grad_scaler.GradScaler, "__init__"),
             (grad_scaler.GradScaler, "state_dict"), (grad_scaler.GradScaler, "load_state_dict"),
             (torch.amp, "custom_fwd"), (torch.amp, "custom_bwd"),
             (autocast_mode, "custom_fwd"), (autocast_mode, "custom_bwd")]
    before = {(id(o), n): (vars(o).get(n), getattr(o, n)) for o, n in pairs}
    for options in ({"device": "cpu"}, {"device": "cpu", "amp": "fp16"}):
        dmlshim.install(**options)
        try:
            assert all(patching.is_patched(o, n) for o, n in pairs[:4])
            assert all(patching.is_patched(o, n) for o, n in pairs[4:]) == (options.get("amp") == "fp16")
        finally:
            dmlshim.uninstall()
        for o, n in pairs:
            own, looked_up = before[(id(o), n)]
            assert vars(o).get(n) is own and getattr(o, n) is looked_up, (o, n)


# -- the corpus script -----------------------------------------------------------------------

def epoch_means(values, per_epoch=8):
    return [sum(values[i:i + per_epoch]) / per_epoch for i in range(0, len(values), per_epoch)]


def assert_converges(proc):
    got = losses(proc.stdout)
    assert len(got) == 24 and all(math.isfinite(v) for v in got), describe(proc)
    means = epoch_means(got)
    assert means[0] > means[1] > means[2] and means[2] < 0.75 * means[0], (means, describe(proc))
    assert "resumed ok" in proc.stdout, describe(proc)
    assert CUDA_WARNING not in proc.stderr, describe(proc)


def test_amp_train_unmodified_on_cpu_matches_native():
    # torch.compile stays on for the CPU target (Inductor's C++ backend), fused AdamW too.
    native = run_native("amp_train.py", "--resume-check", timeout=600)
    assert native.returncode == 0, describe(native)
    proc = run_shim("amp_train.py", "--resume-check", device="cpu", timeout=600)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines()[0] == "device cuda"
    assert_converges(proc)
    assert losses(proc.stdout) == losses(native.stdout), describe(proc)


@pytest.mark.emulator
def test_amp_train_unmodified_on_emulator():
    proc = run_shim("amp_train.py", "--resume-check", device="emulated-dml", timeout=600,
                    options={"log": "info"})
    assert proc.returncode == 0, describe(proc)
    assert_converges(proc)
    # each dropped CUDA idiom is named once per call site
    for api in ("torch.compile", "torch.optim.AdamW", "GradScaler", "torch.autocast"):
        assert f"{api}(" in proc.stderr, (api, describe(proc))


def test_amp_train_fp16_on_cpu_converges():
    proc = run_shim("amp_train.py", "--no-compile", "--resume-check", device="cpu",
                    options={"amp": "fp16"})
    assert proc.returncode == 0, describe(proc)
    assert_converges(proc)
    scales = [float(line.rsplit("scale ", 1)[1]) for line in proc.stderr.splitlines()
              if line.startswith("epoch ") and "scale " in line]
    assert len(scales) == 3 and all(s > 1.0 for s in scales), describe(proc)  # a real scaler


@pytest.mark.emulator
def test_amp_train_fp16_on_an_adapter_that_can_autocast():
    # The emulator with its "autocast" gap off autocasts on privateuseone; float64 stays
    # missing, so the scaler must keep its float64 reciprocal on the host.
    proc = run_shim("amp_train.py", "--resume-check", device="emulated-dml",
                    options={"amp": "fp16", "emulator-gaps": "fallback,float64,generator"})
    assert proc.returncode == 0, describe(proc)
    assert_converges(proc)
    scales = [line for line in proc.stderr.splitlines() if line.startswith("epoch ")]
    assert len(scales) == 3 and all("scale 1.0" not in line for line in scales), describe(proc)


# -- a float16 batch into a float32 model (issue 13, item 4) ---------------------------------

def _half_input_outputs(stdout):
    dtypes, outs = {}, {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["dtypes"]:
            dtypes[parts[1]] = tuple(parts[2:])
        elif parts[:1] == ["out"]:
            outs.setdefault(parts[1], []).append(float.fromhex(parts[2]))
    return dtypes, outs


# emulated-dml-autocast: an adapter that can autocast (the emulator's "autocast" gap off)
@pytest.mark.parametrize("device,amp", [
    ("cpu", "off"), ("cpu", "fp16"),
    pytest.param("emulated-dml", "off", marks=pytest.mark.emulator),
    pytest.param("emulated-dml", "fp16", marks=pytest.mark.emulator),
    pytest.param("emulated-dml-autocast", "fp16", marks=pytest.mark.emulator)])
def test_half_input_into_float32_model_under_cuda_autocast(device, amp):
    native = run_native(REPO / "tests" / "scripts" / "amp_half_input.py", "--reference")
    assert native.returncode == 0, describe(native)
    _, ref = _half_input_outputs(native.stdout)
    reference = ref["reference"]
    options = {"amp": amp}
    if device == "emulated-dml-autocast":
        device, options["emulator-gaps"] = "emulated-dml", "fallback,float64,generator"
        low = True
    else:
        low = amp == "fp16" and device == "cpu"  # emulated-dml: no autocast (#454), float32
    proc = run_shim(REPO / "tests" / "scripts" / "amp_half_input.py", device=device,
                    options=options)
    assert proc.returncode == 0, describe(proc)
    dtypes, outs = _half_input_outputs(proc.stdout)
    assert len(outs) == 2, describe(proc)
    for name, values in outs.items():
        if low:
            # float16 compute, as on CUDA: within float16's precision of the float32 result
            assert dtypes[name] == ("torch.float16", "torch.float16"), describe(proc)
            assert all(math.isclose(a, b, rel_tol=1e-2, abs_tol=1e-2)
                       for a, b in zip(values, reference)), (values, reference)
        else:
            # "the region computes in float32": the float16 input cast up, same kernels as
            # the CPU reference, so the same bits
            assert dtypes[name] == ("torch.float32", "torch.float32"), describe(proc)
            assert values == reference, (values, reference)
    if amp == "fp16" and not low:
        assert "#454" in proc.stderr, describe(proc)
