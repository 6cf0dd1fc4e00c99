"""dmlshim: run unmodified CUDA PyTorch scripts on DirectML (torch-directml) or the CPU.

``import dmlshim`` at the top of a script installs every patch with the options from the
environment (``DMLSHIM_*``); ``DMLSHIM_DISABLE=1`` makes the import a no-op. See README.md.
"""

from __future__ import annotations

import sys
from typing import Any

from dmlshim._version import __version__

__all__ = ["install", "uninstall", "is_installed", "get_original", "current_target", "__version__"]

_API = ("install", "uninstall", "is_installed", "get_original", "current_target")


def __getattr__(name: str) -> Any:
    # The API lives in dmlshim.api, which imports torch: `python -m dmlshim` must not.
    if name in _API:
        from dmlshim import api

        return getattr(api, name)
    raise AttributeError(f"module 'dmlshim' has no attribute {name!r}")


def __dir__() -> list:
    # the API (lazy: not in globals() until asked for) and the module's own dunders, not the
    # names this file imports for itself (sys, Any, annotations)
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__")})


def _launch() -> None:
    from dmlshim import launch

    launch.launch()


def runner_started() -> None:
    """The runner's signal (``python -m dmlshim``): install nothing in this process.

    The runner only validates the options and replaces itself with the interpreter; the install
    that ``import dmlshim`` deferred (below) is cancelled.
    """
    from dmlshim.bootstrap.sitecustomize import TorchImportHook

    for finder in list(sys.meta_path):
        if isinstance(finder, TorchImportHook) and finder.callback is _launch:
            finder.remove()


if sys.argv[:1] == ["-m"] and "torch" not in sys.modules:
    # `python -m` is still looking for its module (sys.argv[0] is "-m" until it is found): the
    # module may be the runner, which says so (runner_started), or a package importing dmlshim
    # on its way to the script; there the shim installs once torch is imported, as the
    # bootstrap's does.
    from dmlshim.bootstrap.sitecustomize import TorchImportHook

    sys.meta_path.insert(0, TorchImportHook(_launch))
else:
    _launch()
