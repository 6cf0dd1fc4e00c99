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


def _imported_by_runpy_for_runner() -> bool:
    """True while ``python -m dmlshim`` imports this package to find dmlshim/__main__.py.

    runpy imports a package before running its ``__main__``; the runner only validates the
    options and replaces itself with the interpreter, so nothing is installed in it. The frame
    that asks is runpy's own, with the module name it was given (exact, no argv parsing).
    """
    if sys.argv[:1] != ["-m"]:  # python sets argv[0] to "-m" until the module is found
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_get_module_details" \
                and frame.f_globals.get("__name__") == "runpy":
            return frame.f_locals.get("mod_name") in ("dmlshim.__main__", "dmlshim")
        frame = frame.f_back  # type: ignore[assignment]
    return False


if not _imported_by_runpy_for_runner():
    from dmlshim import launch as _launch

    _launch.launch()
