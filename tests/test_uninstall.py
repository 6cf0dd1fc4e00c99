"""install() is idempotent and uninstall() restores every patched attribute to the original."""

from __future__ import annotations

import pytest
import torch

import dmlshim
from dmlshim import api, patching

# A few attributes checked by name, whatever the registry says.
KNOWN = [
    (torch.Tensor, "to"), (torch.Tensor, "cuda"), (torch.Tensor, "is_cuda"),
    (torch.Tensor, "pin_memory"), (torch.Tensor, "new_zeros"), (torch.nn.Module, "to"),
    (torch.nn.Module, "cuda"), (torch, "zeros"), (torch, "tensor"), (torch, "Generator"),
    (torch, "set_default_device"), (torch.cuda, "is_available"), (torch.cuda, "Event"),
    (torch.cuda, "device_count"), (torch.utils.data.DataLoader, "__init__"),
]


def snapshot(pairs):
    return {(id(o), n): (o, n, vars(o).get(n, "<absent>"), getattr(o, n)) for o, n in pairs}


def check_restored(snap):
    for owner, name, own, looked_up in snap.values():
        assert vars(owner).get(name, "<absent>") is own, f"{owner!r}.{name} not restored"
        assert getattr(owner, name) is looked_up, f"{owner!r}.{name} is not the original"


TARGETS = ["cpu", "emulated-dml"]


@pytest.mark.parametrize("device", TARGETS)
def test_every_patched_attribute_is_restored(device):
    if device == "emulated-dml":
        # Registering a PrivateUse1 backend is permanent in a torch process (torch cannot
        # unregister it), and with it the emulator's torch.Generator routing; what install()
        # patches on top must still come back exactly.
        import emulated_dml as emulator

        emulator.register(1)
    before = snapshot(KNOWN)
    dmlshim.install(device=device)
    try:
        patched = [(rec[0], rec[1]) for rec in patching._originals.values()]
        assert len(patched) > 100  # devices, cuda_api and the other areas
        assert all(patching.is_patched(o, n) for o, n in KNOWN)
        originals = {(id(rec[0]), rec[1]): rec for rec in patching._originals.values()}
        changed = [(o, n) for o, n in KNOWN if getattr(o, n) is not before[(id(o), n)][3]]
        assert len(changed) == len(KNOWN)
    finally:
        dmlshim.uninstall()
    check_restored(before)
    assert not patching._originals
    for owner, name, own, original in originals.values():
        assert vars(owner).get(name, patching._MISSING) is own
        assert getattr(owner, name) is original


def test_install_is_idempotent_and_reinstall_changes_options():
    try:
        t1 = dmlshim.install(device="cpu")
        n = len(patching._originals)
        names = api.installed_patches()
        assert dmlshim.install(device="cpu") is t1
        assert len(patching._originals) == n and api.installed_patches() == names
        dmlshim.install(device="cpu", log="info")
        assert len(patching._originals) == n
        assert dmlshim.is_installed()
    finally:
        dmlshim.uninstall()
    dmlshim.uninstall()  # a second uninstall is harmless
    assert not dmlshim.is_installed() and not patching._originals


def test_each_patch_uninstalls_on_its_own():
    before = {(id(r[0]), r[1]) for r in patching._originals.values()}
    assert not before
    dmlshim.install(device="cpu")
    try:
        for patch in reversed(api._patches.patches):  # type: ignore[union-attr]
            if not patch.installed:
                continue
            keys = list(patch._keys)
            recs = [patching._originals[k] for k in keys]
            patch.uninstall()
            patch.uninstall()  # idempotent
            for owner, name, _own, original in recs:
                assert getattr(owner, name) is original, f"{patch.name}: {owner!r}.{name}"
                assert (id(owner), name) not in patching._originals
    finally:
        dmlshim.uninstall()


def test_behaviour_is_back_to_native_after_uninstall():
    dmlshim.install(device="cpu")
    assert torch.zeros(1, device="cuda").device.type == "cpu"
    dmlshim.uninstall()
    assert torch.cuda.is_available() is False
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")


_COMPARE_EVERYTHING = r"""
import json, os, sys, types
import torch, torch.nn, torch.optim, torch.optim.lr_scheduler
import dmlshim
from dmlshim import api

def owners():
    out = {"torch": torch, "torch.cuda": torch.cuda, "torch.nn": torch.nn,
           "torch.optim": torch.optim, "torch.Tensor": torch.Tensor,
           "torch.Generator": torch.Generator}
    if hasattr(torch, "accelerator"):
        out["torch.accelerator"] = torch.accelerator
    for mod in (torch.nn, torch.optim, torch.optim.lr_scheduler, torch.cuda):
        for value in vars(mod).values():
            if isinstance(value, type) and value.__module__.startswith("torch"):
                out.setdefault(value.__module__ + "." + value.__qualname__, value)
    return out

before_owners = owners()
before = {k: dict(vars(o)) for k, o in before_owners.items()}
dmlshim.install(device=sys.argv[1])
changed_while_installed = sum(
    1 for k, o in before_owners.items() for n, v in vars(o).items() if before[k].get(n) is not v)
dmlshim.uninstall()
left = []
for key, owner in before_owners.items():
    now = vars(owner)
    for name in set(before[key]) | set(now):
        old, new = before[key].get(name, "<absent>"), now.get(name, "<absent>")
        if old is new:
            continue
        if old == "<absent>" and isinstance(new, types.ModuleType):
            continue  # a submodule imported by install(): not a patch
        left.append([key, name])
print("RESULT " + json.dumps({"left": left, "changed": changed_while_installed,
                              "permanent": [[o, n] for o, n, _ in api.PERMANENT]}))
"""


@pytest.mark.parametrize("device", TARGETS)
def test_uninstall_leaves_only_the_permanent_list(device):
    """Every attribute of torch, torch.cuda, torch.nn, torch.optim (and their classes),
    torch.Tensor, torch.Generator and torch.accelerator is the same object after uninstall as
    before install, in a fresh process, except the documented api.PERMANENT entries."""
    import json
    import subprocess
    import sys

    from tests.helpers import clean_env

    proc = subprocess.run([sys.executable, "-c", _COMPARE_EVERYTHING, device],
                          capture_output=True, text=True, env=clean_env(DMLSHIM_DISABLE="1"),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["changed"] > 100  # the comparison looked at what install() patches
    permanent = {tuple(p) for p in result["permanent"]}
    assert {tuple(x) for x in result["left"]} <= permanent, result["left"]


def test_installed_patches_are_the_ones_that_changed_something(shim):
    shim(device="cpu")
    names = api.installed_patches()
    assert "devices" in names and "cuda_api" in names
    for patch in api._patches.patches:
        assert (patch.name in names) == bool(patch._keys or patch._undo), patch.name
    # float64 and guards act only on DirectML: on the CPU they change nothing
    assert "float64" not in names and "guards" not in names


def test_a_patch_module_that_cannot_be_imported_is_an_error(monkeypatch):
    monkeypatch.setattr(api, "PATCH_MODULES", api.PATCH_MODULES + ("dmlshim.patches.renamed",))
    with pytest.raises(ModuleNotFoundError):
        api.patch_classes()


def test_an_attribute_is_wrapped_once(shim):
    shim(device="cpu")

    class Second(patching.Patch):
        name = "second"

        def _install(self, caps, config):
            self.wrap(torch.Tensor, "to", lambda wrapped, instance, args, kwargs: None)

    with pytest.raises(RuntimeError, match="already wrapped"):
        Second().install(api.session().capabilities, None)
    assert torch.ones(1).to("cuda").device.type == "cpu"  # the owner's wrapper is intact



_CYCLES = r"""
import gc, json, sys
import torch
import dmlshim
from dmlshim import api, patching

def live(cls):
    return sum(1 for o in gc.get_objects() if isinstance(o, cls))

def cycles(n):
    for _ in range(n):
        dmlshim.install(device="emulated-dml")
        dmlshim.uninstall()
    gc.collect()
    return {"patches": live(patching.Patch), "sessions": live(api.Shim),
            "hooked": sorted(patching._hooked), "objects": len(gc.get_objects())}

first = cycles(3)  # and the one-time state: modules imported, the emulated device registered
then = cycles(10)
print("RESULT " + json.dumps({"first": first, "then": then, "frameworks": sorted(
    m for m in ("torchvision", "accelerate", "lightning") if m in sys.modules)}))
"""


def test_install_uninstall_cycles_leave_no_patch_alive():
    """Each uninstall drops its patches: the post-import hooks of patches waiting for a framework
    (oom: accelerate/lightning, vision_ops: torchvision) go with them (wrapt cannot unregister a
    hook: dmlshim registers one per module name, and the session keeps what waits)."""
    import json
    import subprocess
    import sys

    from tests.helpers import clean_env

    proc = subprocess.run([sys.executable, "-c", _CYCLES], capture_output=True, text=True,
                          env=clean_env(DMLSHIM_DISABLE="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    r = json.loads(line[len("RESULT "):])
    assert r["frameworks"] == [], r  # none imported: the patches really waited for them
    for state in (r["first"], r["then"]):
        assert state["patches"] == 0 and state["sessions"] == 0, r
        # one hook per module name for the process, registered once (the modules never came)
        assert "torchvision" in state["hooked"] and "accelerate.utils" in state["hooked"], r
    # ten more cycles, no more objects (the leak was about 20 a cycle)
    assert r["then"]["objects"] - r["first"]["objects"] < 10, r
