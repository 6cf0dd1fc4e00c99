"""The one pointer to the installation in force.

Every per-installation record (options, target and its capabilities, device map, rewriter rules,
event log, rebind registry, the patches and what they keep) lives on the
:class:`dmlshim.api.Shim` this names, so uninstall() drops it all by dropping the pointer. The
module imports nothing of dmlshim: every layer may read it, none is tied to the API's.

Hot code reads :data:`session` directly (an attribute load, no call); wrappers built by a
patch's install capture the pieces they need from it then.
"""

from __future__ import annotations

from typing import Any, Optional

#: the dmlshim.api.Shim in force: None when nothing is installed; during install() the one
#: being built, so patches see it while they install
session: Optional[Any] = None


def switch(new: Optional[Any]) -> Optional[Any]:
    """Make ``new`` the session in force (None: none); returns the one it replaces."""
    global session
    old, session = session, new
    return old
