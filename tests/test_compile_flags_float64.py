"""torch.compile on DirectML, fused/capturable optimizer flags, and DMLSHIM_FLOAT64."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import dmlshim
from dmlshim import api, events, patching
from dmlshim.patches import float64 as float64_patch
from dmlshim.patches.optim_flags import optimizer_classes

F64 = torch.float64
DML = torch.device("privateuseone", 0)


def patch_named(name):
    return next(p for p in api._patches.patches if p.name == name)  # type: ignore[union-attr]


def sites(api_name):
    return [s for s in events.call_sites() if s.api == api_name]


# -- torch.compile ---------------------------------------------------------------------------

@pytest.mark.emulator
def test_compile_returns_the_eager_model_on_directml(shim):
    script_fn = torch.jit.script
    shim(device="emulated-dml", log="info")
    events.reset()
    model = torch.nn.Linear(3, 2).cuda()
    assert torch.compile(model) is model
    assert torch.compile(model, mode="max-autotune", fullgraph=True) is model
    assert torch.compiler.compile(model) is model

    def f(x):
        return x * 2

    assert torch.compile(f) is f
    assert torch.compile(mode="reduce-overhead")(f) is f

    @torch.compile
    def g(x):
        return x + 1

    assert g.__name__ == "g" and not hasattr(g, "_torchdynamo_orig_callable")
    model.compile()  # nn.Module.compile() goes through torch.compile
    out = model(torch.ones(1, 3, device="cuda"))
    assert out.device == DML
    assert torch.jit.script is script_fn and not patching.is_patched(torch.jit, "script")
    assert events.api_counts["torch.compile"] == 7
    assert len(sites("torch.compile")) == 7  # one info line per call site


def test_compile_untouched_on_cpu_target(shim):
    original = torch.compile
    shim(device="cpu")
    assert torch.compile is original and not patching.is_patched(torch, "compile")


@pytest.mark.emulator
def test_compile_uninstall_restores():
    original = torch.compile
    dmlshim.install(device="emulated-dml")
    try:
        assert torch.compile is not original
    finally:
        dmlshim.uninstall()
    assert torch.compile is original and vars(torch)["compile"] is original


# -- fused / capturable ----------------------------------------------------------------------

def params():
    return [torch.nn.Parameter(torch.randn(3, 3, device="cuda"))]


def test_cpu_target_keeps_fused_drops_capturable(shim):
    shim(device="cpu", log="info")
    events.reset()
    opt = torch.optim.AdamW(params(), fused=True, capturable=True)
    assert opt.defaults["fused"] is True and opt.defaults["capturable"] is False
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    opt.step()  # natively on the CPU, capturable=True fails here
    rms = torch.optim.RMSprop(params(), 0.01, 0.99, 1e-8, 0, 0, False, True)  # positional
    assert rms.defaults["capturable"] is False
    asgd = torch.optim.ASGD(params(), capturable=True)
    assert asgd.defaults["capturable"] is False
    sgd = torch.optim.SGD(params(), lr=0.1, fused=True)
    assert sgd.defaults["fused"] is True


@pytest.mark.emulator
def test_directml_drops_fused_and_capturable_once_per_site(shim):
    shim(device="emulated-dml", log="info")
    events.reset()

    class MyAdamW(torch.optim.AdamW):
        def __init__(self, ps):
            super().__init__(ps, lr=1e-3, fused=True)

    for _ in range(3):
        opt = torch.optim.AdamW(params(), lr=1e-3, fused=True)
        assert opt.defaults["fused"] is False
    assert MyAdamW(params()).defaults["fused"] is False
    for cls in (torch.optim.Adam, torch.optim.SGD, torch.optim.Adagrad):
        assert cls(params(), lr=0.1, fused=True).defaults["fused"] is False
    assert torch.optim.Adam(params(), capturable=True).defaults["capturable"] is False
    assert torch.optim.NAdam(params(), capturable=True).defaults["capturable"] is False
    adamw_sites = sites("torch.optim.AdamW")
    assert len(adamw_sites) == 2 and sorted(s.count for s in adamw_sites) == [1, 3]
    assert all(s.tag == "dropped" for s in adamw_sites)
    assert events.api_counts["torch.optim.Adam"] == 2  # fused and capturable calls; not MyAdamW


def test_optim_flags_wrap_only_the_optimizer_classes():
    before = {cls: vars(cls)["__init__"] for cls, _ in optimizer_classes()}
    base_init = vars(torch.optim.Optimizer)["__init__"]
    dmlshim.install(device="cpu")
    try:
        mine = {(id(o), n) for o, n in [(cls, "__init__") for cls in before]}
        flags = patch_named("optim_flags")
        assert set(flags._keys) <= mine and flags._keys
        assert (id(torch.optim.Optimizer), "__init__") not in set(flags._keys)
    finally:
        dmlshim.uninstall()
    assert all(vars(cls)["__init__"] is init for cls, init in before.items())
    assert vars(torch.optim.Optimizer)["__init__"] is base_init


# -- float64 ---------------------------------------------------------------------------------

@pytest.mark.emulator
def test_float64_keep_fails_like_directml(shim):
    shim(device="emulated-dml", float64="keep")
    assert not patch_named("float64")._keys and not patch_named("float64")._undo
    with pytest.raises(RuntimeError, match="does not support Double"):
        torch.zeros(2, dtype=F64, device="cuda")
    with pytest.raises(RuntimeError, match="does not support Double"):
        torch.from_numpy(np.ones(3)).cuda()


@pytest.mark.emulator
def test_float64_float32_downcasts_at_every_entry_point(shim):
    shim(device="emulated-dml", float64="float32")
    host = torch.from_numpy(np.arange(4.0))
    assert host.dtype is F64
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("ignore")
        made = {
            "cuda": host.cuda(),
            "cuda0": host.cuda(0),
            "to_str": host.to("cuda"),
            "to_device_kw": host.to(device=torch.device("cuda", 0), non_blocking=True),
            "to_dtype": host.to("cuda", F64),
            "to_dtype_kw": host.float().to(device="cuda", dtype=F64),
            "device_to_double": host.float().cuda().to(F64),
            "double": host.float().cuda().double(),
            "zeros": torch.zeros(2, dtype=F64, device="cuda"),
            "full": torch.full((2,), 1.5, dtype=F64, device="cuda"),
            "tensor_np": torch.tensor(np.arange(3.0), device="cuda"),
            "as_tensor_np": torch.as_tensor(np.arange(3.0), device="cuda"),
            "as_tensor_pos": torch.as_tensor(np.arange(3.0), F64, "cuda"),
            "zeros_like": torch.zeros_like(host, device="cuda"),
            "new_zeros": host.float().cuda().new_zeros(2, dtype=F64),
        }
    for name, t in made.items():
        assert t.device == DML and t.dtype is torch.float32, name
    assert torch.equal(made["cuda"].cpu(), host.float())
    leaf = torch.tensor(np.ones(2), device="cuda", requires_grad=True)
    assert leaf.is_leaf and leaf.requires_grad and leaf.dtype is torch.float32
    # host tensors and other dtypes are untouched
    assert host.double().dtype is F64 and torch.zeros(2, dtype=F64).dtype is F64
    assert torch.arange(3, device="cuda").dtype is torch.int64
    assert torch.tensor([1, 2], device="cuda").dtype is torch.int64
    model = torch.nn.Linear(2, 2).double().cuda()
    assert model.weight.dtype is torch.float32 and model.weight.device == DML
    model = torch.nn.Linear(2, 2).cuda().double()
    assert model.weight.dtype is torch.float32


@pytest.mark.emulator
def test_float64_default_dtype_and_one_warning_per_site(shim):
    shim(device="emulated-dml", float64="float32")
    old = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for _ in range(3):
                z = torch.zeros(2, device="cuda")
            full_int = torch.full((2,), 3, device="cuda")
            ar = torch.arange(0.0, 1.0, 0.5, device="cuda")
    finally:
        torch.set_default_dtype(old)
    assert z.dtype is torch.float32 and ar.dtype is torch.float32
    assert full_int.dtype is torch.int64
    ours = [w for w in caught if "DMLSHIM_FLOAT64" in str(w.message)]
    assert len(ours) == 2 and all(w.filename == __file__ for w in ours), \
        [(str(w.message), w.lineno) for w in caught]


@pytest.mark.emulator
def test_float64_nothing_installed_when_the_adapter_has_float64(shim):
    shim(device="emulated-dml", float64="float32", emulator_gaps="fallback")
    assert not patch_named("float64")._keys and not patch_named("float64")._undo
    assert torch.zeros(2, dtype=F64, device="cuda").dtype is F64


def test_adapters_without_float64_follow_the_target():
    from dmlshim import capabilities, config
    from dmlshim.target import Target

    def lacking(target, cfg):
        return float64_patch.adapters_without_float64(capabilities.of(target, cfg))

    cfg = config.load({"device": "cpu"})
    dml = Target("dml", 2, "test", float64=[True, False])
    assert lacking(dml, cfg) == {1}
    emu_cfg = config.load({"device": "emulated-dml", "emulator_gaps": "none"})
    emu = Target("emulated-dml", 2, "test")
    assert lacking(emu, emu_cfg) == frozenset()
    assert lacking(emu, cfg) == {0, 1}  # gaps "all"


@pytest.mark.emulator
def test_float64_layers_are_removed_exactly():
    names = ["to", "cuda", "double", "new_zeros"]
    before = {n: (vars(torch.Tensor).get(n), getattr(torch.Tensor, n)) for n in names}
    zeros = torch.zeros
    dmlshim.install(device="emulated-dml", float64="float32")
    try:
        devices_to = patching.get_original(torch.Tensor, "to")
        assert devices_to is before["to"][1]
        assert patch_named("float64")._undo  # layered on the device patch's wrappers
    finally:
        dmlshim.uninstall()
    for n in names:
        assert vars(torch.Tensor).get(n) is before[n][0] and getattr(torch.Tensor, n) is before[n][1]
    assert torch.zeros is zeros and not patching._originals
