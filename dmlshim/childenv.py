"""The environment that makes a new interpreter carry the shim, and its exact undo.

One object for the runner (the environment it execs the interpreter with) and for a shimmed
process (what its children inherit while the shim is installed). It puts dmlshim/bootstrap
first on ``PYTHONPATH``, sets variables, and writes ``DMLSHIM_BOOTSTRAP``: a record of what it
changed, so that the child's bootstrap gives the script the environment it would have had
without dmlshim, byte for byte (empty ``PYTHONPATH`` entries, unset versus empty), and so that
:meth:`ChildEnvironment.restore` does the same in this process. The record's format is read by
``undo`` in dmlshim/bootstrap/sitecustomize.py, which cannot import dmlshim.
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, MutableMapping, Optional

from dmlshim.bootstrap import BOOTSTRAP_DIR
from dmlshim.bootstrap.sitecustomize import MARKER, undo


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace(";", "%3B").replace("=", "%3D")


def _encode(value: Optional[str]) -> str:
    return "-" if value is None else "+" + _escape(value)


class ChildEnvironment:
    """``values``: variables to set (``None`` removes one); ``path_prefixes``: path-list
    variables that get a folder put first: ``PYTHONPATH`` the bootstrap, nothing else (never
    ``LD_LIBRARY_PATH``: torch_directml's folder there shadows WSL's DirectML libraries)."""

    def __init__(self, values: Mapping[str, Optional[str]]) -> None:
        self.values = dict(values)
        self.path_prefixes: Dict[str, str] = {"PYTHONPATH": BOOTSTRAP_DIR}
        self._marker: Optional[str] = None

    def apply_to(self, environ: MutableMapping[str, str]) -> str:
        """Change ``environ`` in place; return the marker written to it."""
        records: List[str] = []
        for name, new in self.values.items():
            old = environ.get(name)
            if old == new:
                continue
            if new is None:
                environ.pop(name, None)
            else:
                environ[name] = new
            records.append(f"V{_escape(name)}={_encode(old)}={_encode(new)}")
        for name, folder in self.path_prefixes.items():
            old = environ.get(name)
            if old is not None and old.split(os.pathsep)[0] == folder:
                continue  # already first (a program that set it up itself)
            environ[name] = folder if old is None else folder + os.pathsep + old
            records.append(f"P{_escape(name)}={_escape(folder)}={'-' if old is None else '+'}")
        records.append(f"M={_encode(environ.get(MARKER))}")
        marker = ";".join(["1", *records])
        environ[MARKER] = marker
        return marker

    def build(self, base: Mapping[str, str]) -> Dict[str, str]:
        """A new environment: ``base`` with this one applied (for ``os.execve``/``Popen``)."""
        env = dict(base)
        self.apply_to(env)
        return env

    def apply(self) -> None:
        """Apply to ``os.environ``, for this process's children, until :meth:`restore`."""
        self._marker = self.apply_to(os.environ)

    def restore(self) -> None:
        """Put ``os.environ`` back; a variable the program changed since keeps its value."""
        if self._marker is not None:
            undo(os.environ, self._marker)
            self._marker = None


__all__ = ["ChildEnvironment", "MARKER"]
