"""One owner per entry point, as data: each patch declares what it may change (``Patch.owns``,
gevent.monkey's ``__implements__``), ``Patch.replace``/``wrap`` refuse anything else, and no
two patches declare the same attribute.
"""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch

from dmlshim import api, patching
from dmlshim.patching import Owns

# declared owners that live in optional modules; imported here so they can be resolved
for _name in ("torch.distributed", "torch.distributed.distributed_c10d", "torch.fft",
              "torch.nested", "torch.multiprocessing.spawn", "torch.utils._foreach_utils"):
    importlib.import_module(_name)


def _resolved(owns: Owns):
    return patching.resolve(owns.owner)


def _names_meet(a: Owns, b: Owns) -> bool:
    return a.names == "*" or b.names == "*" or bool(set(a.names) & set(b.names))


def _owners_meet(a: Owns, b: Owns) -> bool:
    x, y = _resolved(a), _resolved(b)
    if x is None or y is None:  # a framework that is not installed: compare the names
        return a.owner == b.owner and a.subclasses == b.subclasses
    if not a.subclasses and not b.subclasses:
        return x is y
    if a.subclasses and b.subclasses:  # they share subclasses when one base contains the other
        return isinstance(x, type) and isinstance(y, type) and (issubclass(x, y) or issubclass(y, x))
    base, other = (x, y) if a.subclasses else (y, x)
    return isinstance(other, type) and other is not base and issubclass(other, base)


def test_every_declaration_names_something_real():
    for cls in api.patch_classes():
        assert isinstance(cls.owns, tuple), cls
        for owns in cls.owns:
            assert isinstance(owns, Owns), (cls, owns)
            resolved = _resolved(owns)
            if owns.owner.split(".")[0] in ("accelerate", "lightning", "pytorch_lightning"):
                continue  # frameworks: resolved when they are imported
            if owns.owner.startswith("torch.accelerator") and not hasattr(torch, "accelerator"):
                continue  # torch < 2.6: the shim adds its own torch.accelerator
            assert resolved is not None, (cls.name, owns.owner)
            if owns.names != "*" and not owns.subclasses:
                # at least one declared name exists on this torch (versions differ in the rest)
                assert any(hasattr(resolved, n) for n in owns.names), (cls.name, owns)


def test_no_two_patches_own_the_same_attribute():
    classes = api.patch_classes()
    clashes = []
    for p, q in itertools.combinations(classes, 2):
        for a in p.owns:
            for b in q.owns:
                if _names_meet(a, b) and _owners_meet(a, b):
                    clashes.append((p.name, a, q.name, b))
    assert not clashes, clashes


def test_a_patch_cannot_change_what_it_does_not_declare():
    class Rogue(patching.Patch):
        name = "rogue"
        owns = (Owns("torch.nn.functional", ("relu",)),)

        def _install(self, caps, config):
            self.wrap(torch.nn.functional, "gelu", lambda w, i, a, k: w(*a, **k))

    rogue = Rogue()
    before = torch.nn.functional.gelu
    with pytest.raises(RuntimeError, match=r"rogue patch changes torch\.nn\.functional\.gelu"):
        rogue.install(None, None)
    assert torch.nn.functional.gelu is before and not rogue.installed


@pytest.mark.parametrize("options", [
    {"device": "cpu"},
    {"device": "emulated-dml:2", "emulator_memory": "4096", "amp": "fp16"},
    {"device": "emulated-dml", "optimizer": "reset", "check": "2"},
])
def test_what_each_install_changed_is_owned_by_that_patch_alone(shim, options):
    shim(**options)
    seen = 0
    for patch in api.session().patches.patches:
        for key in patch._keys:
            owner, name = patching._originals[key][:2]
            owners = [p.name for p in api.session().patches.patches
                      if any(o.covers(owner, name) for o in p.owns)]
            assert owners == [patch.name], (patching._dotted(owner), name, owners)
            seen += 1
    assert seen > 100  # the factories, torch.cuda, ... really were looked at
