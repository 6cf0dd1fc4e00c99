"""dmlshim: run unmodified CUDA PyTorch scripts on DirectML (torch-directml) or the CPU.

``import dmlshim`` at the top of a script installs every patch with the options from the
environment (``DMLSHIM_*``); ``DMLSHIM_DISABLE=1`` makes the import a no-op. ``python -m dmlshim``
does the same for a script it runs. See README.md.
"""

from __future__ import annotations

import sys

__version__ = "0.1.0"

from dmlshim.api import current_target, get_original, install, is_installed, uninstall  # noqa: E402

__all__ = ["install", "uninstall", "is_installed", "get_original", "current_target", "__version__"]


def _autoinstall() -> None:
    # `python -m dmlshim` imports this package before its own __main__ parses the CLI;
    # the runner installs with the CLI options itself (sys.argv[0] is "-m" while it starts).
    if sys.argv[:1] == ["-m"]:
        return
    from dmlshim import config

    try:
        cfg = config.load()
    except config.ConfigError as err:
        config.exit_on_error(err)
    if cfg.disabled:
        return
    from dmlshim.target import TargetError

    try:
        install(_config=cfg)
    except TargetError as err:
        print(str(err), file=sys.stderr)
        raise SystemExit(2)


_autoinstall()
