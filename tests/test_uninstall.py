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
        from dmlshim import emulator

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
