"""Guards against torch-directml 0.2.5's wrong results and failures (``DMLSHIM_GUARDS=on|off``).

On DirectML (real, or the emulator, which reproduces each of them) this patch installs what the
guards' records (:mod:`dmlshim.kernels.guards.records`) hold for the guards the target needs
(``caps.known_bugs()``): device kernels through ``torch.library`` for the key each record's
kind names (input fixes above autograd, replacements on PrivateUse1: CPU tensors never see
them), the wrappers of the few Python entry points a guard needs (``Tensor.add_`` with an
alpha; ``F.batch_norm`` on the emulator's opt-in ``bug-bn-stats`` switch), the policy of
``Tensor.to`` that makes a non-blocking copy to the host block, and autograd's view replay.
Uninstall destroys the registrations and undoes the rest, which brings the wheel's own kernels
and torch's settings back.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, Tuple

import torch

from dmlshim import conversions
from dmlshim.kernels.guards.records import BY_NAME, GUARDS, kernels_of
from dmlshim.patching import Owns, Patch, resolve

log = logging.getLogger("dmlshim")


def active_guards(caps: Any, config: Any) -> Tuple[str, ...]:
    """The guards to install on ``caps``'s target, in the records' order."""
    if config.guards != "on":
        return ()
    bugs = caps.known_bugs()
    return tuple(g.name for g in GUARDS if g.name in bugs)


def _owned() -> Tuple[Owns, ...]:
    """The entry points the guards' records wrap, one declaration per owner."""
    names: Dict[str, Tuple[str, ...]] = {}
    for g in GUARDS:
        for w in g.wraps:
            names[w.owner] = names.get(w.owner, ()) + (w.name,)
    return tuple(Owns(owner, attrs) for owner, attrs in names.items())


class GuardsPatch(Patch):
    name = "guards"
    owns = _owned()

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        self.active = active = active_guards(caps, config)
        for name in active:
            log.info("guard %s on (%s)", name, BY_NAME[name].source)
        kernels = kernels_of(active)
        if kernels:
            self._register([(op, fn, key) for op, (fn, key) in kernels.items()])
        for name in active:
            guard = BY_NAME[name]
            for w in guard.wraps:
                self.wrap(resolve(w.owner), w.name, w.factory(caps.device_type))
            if guard.policy is not None:
                self.on_undo(conversions.add_policy(guard.policy.name,
                                                    guard.policy.factory(caps.device_type)))
            if guard.setting is not None:
                self.on_undo(guard.setting())

    def _register(self, kernels) -> None:
        lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - destroyed on uninstall
        self.on_undo(lib._destroy)  # (private on torch 2.4.1 and 2.13 alike)
        with warnings.catch_warnings():
            # replacing the wheel's own kernel is the point: no "Overriding a previously
            # registered kernel" warning for the user
            warnings.simplefilter("ignore")
            for op, fn, key in kernels:
                lib.impl(op, fn, key)
