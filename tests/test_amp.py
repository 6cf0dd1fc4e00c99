"""CUDA AMP under the shim: autocast regions and GradScaler (DMLSHIM_AMP=off | fp16)."""

from __future__ import annotations

import io
import json
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
def test_emulator_off_regions_run_float32(shim):
    shim(device="emulated-dml")
    dtype, messages = recorded(lambda: matmul_dtype(REGIONS["torch.cuda.amp.autocast()"]))
    assert dtype is torch.float32 and not [m for m in messages if "dmlshim" in m or CUDA_WARNING in m]
    a = torch.randn(3, 3, device="cuda", dtype=torch.float16)
    with torch.autocast("cuda"):
        assert torch.softmax(a, 1).dtype is torch.float32 and (a @ a).dtype is torch.float32
    assert not torch.amp.GradScaler("cuda").is_enabled()


# -- DMLSHIM_AMP=fp16 on (emulated) DirectML: CUDA's autocast on the device ----------------------

def _small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 5))


def _forward(net, region, x, y):
    with region():
        conv = net[0](x)
        out = net[3](net[2](net[1](conv)))
        loss = torch.nn.functional.cross_entropy(out, y)
    return conv, out, loss


@pytest.mark.emulator
@pytest.mark.parametrize("region", [r for r in REGIONS if "bfloat16" not in r])
def test_fp16_regions_autocast_on_the_device_like_cpu_autocast(shim, region):
    # The emulator keeps its "autocast" gap (no AutocastPrivateUse1 kernels, as the wheel);
    # the shim's kernels fill it. Reference: the same net under the CPU's float16 autocast.
    shim(device="emulated-dml", amp="fp16")
    import emulated_dml as emulator

    assert "autocast" in emulator.switches()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 3, 8, 8, generator=g), torch.tensor([1, 3])
    ref = _forward(_small_net(), lambda: torch.autocast("cpu", dtype=torch.float16), x, y)
    net = _small_net().cuda()
    emulator.reset_fallback_counts()
    (conv, out, loss), messages = recorded(lambda: _forward(net, REGIONS[region], x.cuda(),
                                                             y.cuda()))
    assert not [m for m in messages if "#454" in m or CUDA_WARNING in m], messages
    assert (conv.dtype, out.dtype, loss.dtype) == (torch.float16, torch.float16, torch.float32)
    assert conv.device.type == "privateuseone" and out.device.type == "privateuseone"
    for got, want in zip((conv, out, loss), ref):
        assert want.dtype is got.dtype
        torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1.5e-3, rtol=1.5e-3)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() and p.grad.dtype is torch.float32
               for p in net.parameters())
    assert emulator.fallback_counts() == {}


def _scaler_run(device, region, scaler, steps):
    """Train steps whose loss is inf at the steps in ``steps``; per step: (scale, tracker,
    whether the parameters changed)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2)).to(device)
    seen = []
    for step in range(6):
        before = [p.detach().cpu().clone() for p in model.parameters()]
        opt.zero_grad()
        with region():
            loss = model(x).float().pow(2).mean() * (math.inf if step in steps else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        changed = any(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))
        seen.append((scaler.get_scale(), scaler._get_growth_tracker(), changed))
    return seen, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.emulator
def test_fp16_gradscaler_is_real_and_steps_like_the_cpu_scaler(shim):
    settings = dict(init_scale=2.0 ** 10, growth_interval=2)
    ref, ref_params = _scaler_run("cpu", lambda: torch.autocast("cpu", dtype=torch.float16),
                                  torch.amp.GradScaler("cpu", **settings), steps=(1, 4))
    shim(device="emulated-dml", amp="fp16")
    import emulated_dml as emulator

    emulator.reset_fallback_counts()
    for make in (lambda: torch.amp.GradScaler("cuda", **settings),
                 lambda: torch.cuda.amp.GradScaler(**settings)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp's deprecation
            scaler = make()
        assert scaler.is_enabled()
        got, params = _scaler_run("cuda", lambda: torch.autocast("cuda"), scaler, steps=(1, 4))
        # inf at steps 1 and 4: scale halves and the step is skipped; two clean steps double it
        assert got == ref, (got, ref)
        assert [c for _, _, c in got] == [True, False, True, True, False, True]
        for p, q in zip(params, ref_params):
            torch.testing.assert_close(p, q, atol=2e-3, rtol=2e-3)
    assert emulator.fallback_counts() == {}  # inf checks and unscale on the device


@pytest.mark.emulator
def test_fp16_disabled_region_and_nesting(shim):
    shim(device="emulated-dml", amp="fp16")
    a = torch.randn(4, 4, device="cuda")
    with torch.autocast("cuda"):
        assert (a @ a).dtype is torch.float16
        with torch.autocast("cuda", enabled=False):  # an fp32 island, as on CUDA
            assert (a @ a).dtype is torch.float32
            assert not torch.is_autocast_enabled("privateuseone")
        with torch.cuda.amp.autocast(enabled=False):
            assert torch.mm(a, a).dtype is torch.float32
        assert (a @ a).dtype is torch.float16
    assert (a @ a).dtype is torch.float32 and not torch.is_autocast_enabled("privateuseone")


class _CastCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts += 1
        return func(*args, **(kwargs or {}))


def _recurrent_casts(device, region):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 4, device=device))
    h = torch.randn(2, 4, device=device)
    counts = []
    for _ in range(2):  # two regions: the cache lives for one
        with _CastCounter() as counter, region():
            x = h
            for _ in range(5):
                x = torch.tanh(torch.nn.functional.linear(x, w))
        counts.append(counter.casts)
    return counts


@pytest.mark.emulator
def test_fp16_weight_casts_are_cached_per_region_as_torch_does(shim):
    # A weight used five times in a region is cast once; the next region casts it again.
    ref = _recurrent_casts("cpu", lambda: torch.autocast("cpu", dtype=torch.float16))
    shim(device="emulated-dml", amp="fp16")
    import dmlshared.autocast_kernels as kernels

    assert _recurrent_casts("cuda", lambda: torch.autocast("cuda")) == ref == [2, 2]
    assert kernels._cache == {}  # dropped when the outermost region ended


@pytest.mark.emulator
def test_fp16_bf16_regions_follow_the_bf16_policy(shim):
    a = torch.randn(3, 3)
    for policy, dtype in (("float16", torch.float16), ("float32", torch.float32)):
        shim(device="emulated-dml", amp="fp16", bf16=policy)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = torch.mm(a.cuda(), a.cuda())
                s = torch.softmax(a.cuda().half(), 1)
        assert y.dtype is dtype and s.dtype is torch.float32, policy
        assert any("DMLSHIM_BF16" in str(w.message) for w in caught)
        assert not any("#454" in str(w.message) for w in caught)
        torch.testing.assert_close(y.cpu().float(), a @ a, atol=1e-2, rtol=1e-2)


@pytest.mark.emulator
def test_fp16_kernels_are_cudas_list_for_this_torch(shim):
    # torch registers its CUDA autocast kernels in every build: the device gets that list.
    shim(device="emulated-dml", amp="fp16")
    import dmlshared.autocast_kernels as kernels

    # (aten's: a library such as torchvision registers CUDA autocast kernels for its own ops
    # when a test of this process imported it)
    cuda = {op[len("aten::"):] for op in
            torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
            if op.startswith("aten::")}
    cuda -= set(kernels.CUDA_BACKEND_ONLY)
    cuda |= set(kernels.RNN_LIKE_CUDNN)  # _cudnn_rnn's casts, at the RNNs' composite entry
    assert set(kernels.registered_ops()) == cuda, (cuda ^ set(kernels.registered_ops()))
    assert cuda <= set(kernels.policies())  # a new torch's new entry fails here, named
    ours = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1"))
    assert ours == {"aten::" + op for op in cuda}
    dmlshim.uninstall()
    assert not kernels.registered() and not torch._C._dispatch_get_registrations_for_dispatch_key(
        "AutocastPrivateUse1")


def _cases(stdout):
    return {line.split()[1]: line.split()[2:] for line in stdout.splitlines()
            if line.startswith("case ")}


# torch 2.4.1's CPU kernel, where torch-directml runs grid_sampler_2d, has no float16 (the CPU
# fallback then raises, as on the wheel); newer torch has one.
_CPU_HALF_MISSING = {"grid_sample_16": "raises:RuntimeError"}


@pytest.mark.emulator
def test_fp16_ops_match_cuda_autocast():
    from corpus.amp_cuda_reference import OPS

    proc = run_shim("amp_ops.py", "--values", device="emulated-dml", options={"amp": "fp16"},
                    timeout=600)
    assert proc.returncode == 0, describe(proc)
    got, want = _cases(proc.stdout), _cases(OPS)
    assert set(got) == set(want), describe(proc)
    old_torch = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 5)
    for name, (dtype, *value) in want.items():
        if old_torch and name in _CPU_HALF_MISSING:
            assert got[name] == [_CPU_HALF_MISSING[name]], (name, got[name])
            continue
        assert got[name][0] == dtype, (name, got[name], dtype)
        if value:
            a, b = float(got[name][1]), float(value[0])
            assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-2,
                                                                     abs_tol=1e-2), (name, a, b)
    assert "#454" not in proc.stderr, describe(proc)


def _model_lines(stdout, key):
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == [key]:
            out.setdefault(parts[1], []).append(parts[2:])
    return out


def _model_losses(stdout):
    return {m: [float.fromhex(p[-1]) for p in rows] for m, rows in _model_lines(stdout, "loss").items()}


@pytest.mark.emulator
def test_fp16_models_train_on_the_device_with_zero_fallbacks(tmp_path):
    from corpus.amp_cuda_reference import MODELS

    report = tmp_path / "report.json"
    proc = run_shim("amp_models.py", device="emulated-dml", timeout=600,
                    options={"amp": "fp16", "report": str(report)})
    assert proc.returncode == 0, describe(proc)
    fallbacks = json.loads(report.read_text(encoding="utf-8"))["cpu_fallbacks"]
    assert fallbacks["counting"] == "exact" and fallbacks["total"] == 0, fallbacks
    got = _model_losses(proc.stdout)
    assert set(got) == {"resnet", "gpt", "unet", "lstm"}, describe(proc)
    for model, dtypes in _model_lines(proc.stdout, "dtypes").items():
        assert dtypes == [["float16", "float32"]], (model, dtypes)
    for model, rows in _model_lines(proc.stdout, "scaler").items():
        assert rows[0][0] == "1" and float(rows[0][1]) > 1.0, (model, rows)
    references = {"cuda": (_model_losses(MODELS), 5e-3)}
    for ref in ("cpu16", "cpu32"):
        native = run_native("amp_models.py", "--reference", ref, timeout=600)
        assert native.returncode == 0, describe(native)
        references[ref] = (_model_losses(native.stdout), 5e-3 if ref == "cpu16" else 2e-2)
    for model, values in got.items():
        assert all(math.isfinite(v) for v in values) and values[-1] < values[0], (model, values)
        for ref, (losses_ref, tol) in references.items():
            for a, b in zip(values, losses_ref[model]):
                assert math.isclose(a, b, rel_tol=tol), (model, ref, values, losses_ref[model])


@pytest.mark.emulator
def test_amp_update_scale_on_the_device_matches_cpu(shim):
    shim(device="emulated-dml")
    import emulated_dml as emulator

    emulator.reset_fallback_counts()
    dev = torch.device("privateuseone", 0)
    for scale in (1024.0, 3e38):
        for found, tracker, interval in ((0.0, 0, 3), (1.0, 1, 3), (0.0, 2, 3), (float("nan"), 0, 3)):
            for growth, backoff in ((2.0, 0.5), (1.7, 0.3)):
                cpu = [torch.full((), scale), torch.full((), tracker, dtype=torch.int32)]
                on_dev = [t.to(dev) for t in cpu]
                torch._amp_update_scale_(*cpu, torch.full((), found), growth, backoff, interval)
                torch._amp_update_scale_(*on_dev, torch.full((), found, device=dev), growth,
                                         backoff, interval)
                assert on_dev[1].item() == cpu[1].item(), (scale, found, tracker)
                # torch multiplies in double and rounds; float32 products: exact for powers
                # of two (the defaults), one float32 rounding at most otherwise
                rtol = 0.0 if growth == 2.0 else 2.0 ** -23
                torch.testing.assert_close(on_dev[0].cpu(), cpu[0], rtol=rtol, atol=0)
    assert emulator.fallback_counts() == {}


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
def test_amp_train_fp16_on_the_emulator_converges_with_a_real_scaler(tmp_path):
    # Every torch-directml gap reproduced, "autocast" included (no AutocastPrivateUse1
    # kernels): the shim's kernels autocast, the scaler is real, nothing runs on the CPU.
    report = tmp_path / "report.json"
    proc = run_shim("amp_train.py", "--resume-check", device="emulated-dml",
                    options={"amp": "fp16", "report": str(report)})
    assert proc.returncode == 0, describe(proc)
    assert_converges(proc)
    scales = [line for line in proc.stderr.splitlines() if line.startswith("epoch ")]
    assert len(scales) == 3 and all("scale 1.0" not in line for line in scales), describe(proc)
    assert "#454" not in proc.stderr, describe(proc)
    assert json.loads(report.read_text(encoding="utf-8"))["cpu_fallbacks"]["total"] == 0


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
        low = amp == "fp16"  # emulated-dml: the shim's kernels fill the wheel's gap (#454)
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
    assert "#454" not in proc.stderr, describe(proc)
