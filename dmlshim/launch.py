"""How dmlshim starts in a process: one path for ``import dmlshim``, the bootstrap and the runner.

``import dmlshim`` calls :func:`launch`; the bootstrap imports dmlshim once torch is imported
(so it calls :func:`launch` too); the runner calls :func:`configure` to validate the options
before it replaces itself with the interpreter. All read the options the same way
(:func:`environment`) and fail the same way: one line on stderr, exit status 2.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

from dmlshim import config

REPORT_VALID = "a file path in an existing, writable folder (empty: no report)"


def environment() -> Mapping[str, str]:
    """``os.environ`` as the launching process set it up.

    The bootstrap gives the script its own environment back and keeps the ``DMLSHIM_*`` values
    the runner (or a shimmed parent) exported in ``sitecustomize.inherited``; those count here.
    """
    boot = sys.modules.get("sitecustomize")
    inherited = getattr(boot, "inherited", None)
    if not isinstance(inherited, dict) or not getattr(boot, "active", False):
        return os.environ
    env = dict(os.environ)
    for name, value in inherited.items():
        if name.startswith(config.ENV_PREFIX):
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    return env


def _check_report_path(cfg: config.Config) -> None:
    """A report that cannot be written must stop the run before it starts, not at its end."""
    raw = cfg.report
    if not raw:
        return
    path = os.path.abspath(raw)
    folder = os.path.dirname(path)
    if os.path.isdir(path) or (os.path.exists(path) and not os.access(path, os.W_OK)) \
            or not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise config.ConfigError(config.OPTIONS_BY_NAME["report"].env, raw, REPORT_VALID)


def configure(overrides: Optional[Mapping[str, object]] = None, source: str = "cli",
              environ: Optional[Mapping[str, str]] = None) -> config.Config:
    """The options in force, validated (raises :class:`dmlshim.config.ConfigError`)."""
    cfg = config.load(overrides, source=source, environ=environment() if environ is None
                      else environ)
    if not cfg.disabled:
        _check_report_path(cfg)
    return cfg


def launch():
    """Install dmlshim with the options from the environment, unless disabled.

    Returns the Target, or None when ``DMLSHIM_DISABLE=1`` (then no other option is read). A
    bad option or an unusable target prints one line and raises ``SystemExit(2)``.
    """
    env = environment()
    disable = config.OPTIONS_BY_NAME["disable"]
    try:
        # disabled is inert: DMLSHIM_DISABLE is the one option read then
        if env.get(disable.env) and disable.parse(env[disable.env]) == "1":
            return None
        cfg = configure(environ=env)
    except config.ConfigError as err:
        config.exit_on_error(err)
    from dmlshim import api, target

    cache = env.get(target.PROBE_CACHE_ENV)
    if cache is not None:  # the runner's DirectML probe, so this process need not repeat it
        os.environ.setdefault(target.PROBE_CACHE_ENV, cache)
    try:
        return api.install(_config=cfg)
    except target.TargetError as err:
        print(str(err), file=sys.stderr)
        raise SystemExit(2) from None
