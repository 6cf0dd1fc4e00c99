"""dmlshim: run unmodified CUDA PyTorch scripts on DirectML (torch-directml) or the CPU.

``import dmlshim`` at the top of a script installs every patch with the options from the
environment (``DMLSHIM_*``); ``DMLSHIM_DISABLE=1`` makes the import a no-op. See README.md.
"""

from __future__ import annotations

import sys
from typing import Any

__version__ = "0.1.0"

__all__ = ["install", "uninstall", "is_installed", "get_original", "current_target", "__version__"]

_API = ("install", "uninstall", "is_installed", "get_original", "current_target")


def __getattr__(name: str) -> Any:
    # The API lives in dmlshim.api, which imports torch: `python -m dmlshim` must not.
    if name in _API:
        from dmlshim import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dmlshim' has no attribute {name!r}")


_pending = None  # the TorchImportHook of an install deferred while `python -m` finds its module


def _launch() -> None:
    from dmlshim import launch

    launch.launch()


def runner_started() -> None:
    """The runner's signal (``python -m dmlshim``): install nothing in this process.

    The runner only validates the options and replaces itself with the interpreter; the install
    that ``import dmlshim`` deferred (below) is cancelled.
    """
    global _pending
    if _pending is not None:
        _pending.remove()
        _pending = None


if sys.argv[:1] == ["-m"] and "torch" not in sys.modules:
    # `python -m` is still looking for its module (sys.argv[0] is "-m" until it is found): the
    # module may be the runner, which says so (runner_started), or a package importing dmlshim
    # on its way to the script; there the shim installs once torch is imported, as the
    # bootstrap's does.
    from dmlshim.bootstrap.sitecustomize import TorchImportHook

    _pending = TorchImportHook(_launch)
    sys.meta_path.insert(0, _pending)
else:
    _launch()
