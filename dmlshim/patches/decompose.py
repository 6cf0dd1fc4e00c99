"""Keep training on the device: take common training paths off torch-directml's CPU fallback.

On DirectML (real or emulated) with ``DMLSHIM_DECOMPOSE=on`` (the default):

* device kernels for the operators torch-directml 0.2.5 runs on the CPU on common training
  paths (optimizer updates, GroupNorm backward, LSTM/GRU cells, embedding bags, 1-D nearest
  upsampling, losses, activations, scans, pooling, sampling, matrix-vector products,
  GradScaler's unscale step), registered for ``PrivateUse1`` through ``torch.library``
  (see :mod:`dmlshim.kernels.decompositions`; each is registered only where its operator really falls
  back in this process). Uninstall destroys the ``torch.library`` registrations;
* transformer inference: ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` take a
  "fast path" in eval mode (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``)
  for PrivateUse1 tensors, which torch-directml lacks; the fast path is switched off
  (``torch.backends.mha.set_fastpath_enabled(False)``), so inference runs the same device ops
  as training. Restored at uninstall;
* optimizers: torch.optim defaults to the ``foreach`` implementation for PrivateUse1
  parameters. On torch >= 2.4 the ``_foreach_*`` ops are composites over per-tensor ops, which
  run on the device (with the ``lerp`` kernel here), so nothing changes. On a torch where they
  would fall back (torch 2.3 and torch-directml 0.2.2-0.2.4: #604, #626), the default becomes
  the single-tensor path: PrivateUse1 is dropped from torch's list of foreach-capable devices
  (an explicit ``foreach=True`` is kept).
"""

from __future__ import annotations

import logging
from typing import Callable, List

import torch

from dmlshim import events
from dmlshim.kernels.decompositions import falls_back, register
from dmlshim.patching import Owns, Patch

log = logging.getLogger("dmlshim")

# The eval-mode fast paths of nn.TransformerEncoderLayer / nn.MultiheadAttention.
MHA_FASTPATH_OPS = ("aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention")
# What the optimizers' foreach paths call most; if these fall back, the foreach path does.
FOREACH_OPS = ("aten::_foreach_add_.List", "aten::_foreach_mul_.Scalar",
               "aten::_foreach_lerp_.Scalar", "aten::_foreach_addcmul_.Scalar")
# Where torch looks up its foreach-capable devices: optimizer defaults, clip_grad_norm_ & co.
FOREACH_DEVICE_LISTS = ("torch.optim.optimizer", "torch.utils._foreach_utils")


def foreach_falls_back() -> bool:
    """Whether the optimizers' ``_foreach_*`` ops would run on the CPU for PrivateUse1 here."""
    return any(falls_back(op) for op in FOREACH_OPS)


def mha_fastpath_falls_back() -> bool:
    return any(falls_back(op) for op in MHA_FASTPATH_OPS)


def _without_privateuse1(original: Callable[[], List[str]]) -> Callable[[], List[str]]:
    def foreach_kernels_supported_devices() -> List[str]:
        name = torch._C._get_privateuse1_backend_name()
        return [d for d in original() if d != name]

    foreach_kernels_supported_devices.__wrapped__ = original  # type: ignore[attr-defined]
    return foreach_kernels_supported_devices


class DecomposePatch(Patch):
    name = "decompose"
    owns = tuple(Owns(m, ("_get_foreach_kernels_supported_devices",)) for m in FOREACH_DEVICE_LISTS)

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        if config.decompose != "on":
            return
        registration = register()
        self.on_undo(registration.remove)
        if registration.ops:
            events.note("decompose.device_kernels", len(registration.ops))
            log.debug("dmlshim: %d device kernel(s) replace CPU fallbacks", len(registration.ops))
        self._mha_fastpath()
        if foreach_falls_back():
            self._single_tensor_optimizers()

    def _mha_fastpath(self) -> None:
        mha = getattr(torch.backends, "mha", None)
        if mha is None or not hasattr(mha, "set_fastpath_enabled") or not mha_fastpath_falls_back():
            return
        previous = mha.get_fastpath_enabled()
        if not previous:
            return
        mha.set_fastpath_enabled(False)
        self.on_undo(lambda: mha.set_fastpath_enabled(previous))
        events.note("decompose.mha_fastpath_off")

    def _single_tensor_optimizers(self) -> None:
        import importlib

        for modname in FOREACH_DEVICE_LISTS:
            try:
                module = importlib.import_module(modname)
            except ImportError:
                continue
            original = getattr(module, "_get_foreach_kernels_supported_devices", None)
            if original is None:
                continue
            self.replace(module, "_get_foreach_kernels_supported_devices",
                         _without_privateuse1(original))
        events.note("decompose.foreach_off")
        log.debug("dmlshim: _foreach_* ops fall back here; optimizers default to foreach=False")
