"""torch 2.4 compatibility of the emulator's parameters.

In torch 2.4, ``_ParameterMeta.__instancecheck__`` makes *every* class using that metaclass
accept a custom tensor flagged ``_is_param`` — ``UninitializedParameter`` included — so DDP
refuses emulated parameters as "uninitialized". torch 2.5 limited the rule to ``Parameter``
itself; this applies the same fix on torch 2.4. Real torch-directml parameters are plain
Parameters and never hit it, so it is installed only with the emulator.
"""

from __future__ import annotations

import torch
from torch.nn import parameter as _parameter

_original = None


def fix_parameter_instancecheck() -> None:
    global _original
    meta = _parameter._ParameterMeta
    if _original is not None or torch.__version__ >= "2.5":
        return
    if "__instancecheck__" not in vars(meta):
        return
    _original = vars(meta)["__instancecheck__"]
    base_check = torch._C._TensorMeta.__instancecheck__

    def __instancecheck__(cls, instance):  # noqa: N807 - the metaclass hook
        if base_check(cls, instance):
            return True
        return cls is _parameter.Parameter and isinstance(instance, torch.Tensor) \
            and getattr(instance, "_is_param", False)

    meta.__instancecheck__ = __instancecheck__


def restore_parameter_instancecheck() -> None:
    global _original
    if _original is not None:
        _parameter._ParameterMeta.__instancecheck__ = _original
        _original = None
