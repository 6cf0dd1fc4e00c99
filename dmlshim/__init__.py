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


def _started_as_runner() -> bool:
    """True while `python -m dmlshim` imports this package, before its __main__ runs.

    The runner installs with the CLI options itself. `import dmlshim` inside another
    `python -m pkg` must still install, so look at the interpreter's own command line.
    """
    orig = getattr(sys, "orig_argv", None)  # Python >= 3.10
    if orig is None:
        return sys.argv[:1] == ["-m"]
    args = iter(orig[1:])
    for arg in args:
        if arg == "-m":
            return next(args, "") in ("dmlshim", "dmlshim.__main__")
        if arg.startswith("-m"):
            return arg[2:] in ("dmlshim", "dmlshim.__main__")
        if arg in ("-W", "-X", "-Q"):
            next(args, None)
            continue
        if not arg.startswith("-") or arg == "-c":
            return False
    return False


def _autoinstall() -> None:
    if _started_as_runner():
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
