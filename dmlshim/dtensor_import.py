"""Keep torch's ``weights_only`` allow-list as a CUDA run has it under ``emulated-dml``.

torch >= 2.5 imports ``torch.distributed.tensor`` at the first dispatch through a tensor
subclass (its C++ dispatcher looks up the DTensor class), and that module adds the DTensor
classes to the ``weights_only`` allow-list (``torch.serialization.add_safe_globals``). The
emulator's tensors are such a subclass, so a script that never touches DTensor would load
checkpoints with a wider allow-list than on CUDA. This finder waits for that import: when it
comes from torch's C++ (no ``import`` statement and no ``importlib.import_module`` of the
script or a library asked for it), the allow-list is put back as it was just before.
"""

from __future__ import annotations

import dis
import importlib
import os
import sys
from typing import Any, Optional

MODULE = "torch.distributed.tensor"
_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
_IMPORTLIB_INIT = os.path.abspath(importlib.__file__)


def _asked_for_by_python() -> bool:
    """Whether the import running now comes from an ``import`` statement or import_module."""
    frame = sys._getframe(1)
    here = os.path.abspath(__file__)
    while frame is not None:
        fname = frame.f_code.co_filename
        if fname.startswith("<frozen") or os.path.abspath(fname) == here:
            frame = frame.f_back  # type: ignore[assignment]
            continue
        if os.path.abspath(fname) == _IMPORTLIB_INIT:
            return True
        code = frame.f_code.co_code
        return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _IMPORT_NAME
    return False


class _Loader:
    def __init__(self, loader: Any, finder: AllowListGuard) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.finder.remove()
        from torch import _weights_only_unpickler as wou

        explicit = _asked_for_by_python()
        before = getattr(wou, "_marked_safe_globals_set", None)
        self.loader.exec_module(module)
        if not explicit and isinstance(before, set):
            wou._marked_safe_globals_set = set(before)


class AllowListGuard:
    """A one-shot ``sys.meta_path`` finder for ``torch.distributed.tensor``.

    ``find_spec`` has the shape of the bootstrap's torch finder (dmlshim/bootstrap/
    sitecustomize.py) on purpose: the bootstrap imports nothing (not even dmlshim) before torch
    is imported, so the two cannot share a helper."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name: str, path: Optional[Any] = None, target: Any = None):
        if name != MODULE or self._finding:
            return None
        self._finding = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, self)
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> Optional[AllowListGuard]:
    """Put a guard first on ``sys.meta_path`` (None: torch.distributed.tensor is imported
    already, a guard is there, or torch is older than 2.5); the caller (api.Shim) removes it at uninstall."""
    if MODULE in sys.modules or any(isinstance(f, AllowListGuard) for f in sys.meta_path):
        return None
    import torch

    if torch.torch_version.TorchVersion(torch.__version__) < (2, 5):
        # torch 2.4's C++ never imports it (libtorch_python names no torch.distributed.tensor):
        # a finder there would only be asked about every failed import, torch.cuda.amp's
        # find_spec("torch_xla") in each autocast region included
        return None
    guard = AllowListGuard()
    sys.meta_path.insert(0, guard)
    return guard
