"""TCPStore where torch was built without its libuv backend (torch 2.4's Windows wheels).

torch 2.4 made libuv the TCPStore's default backend: ``TCPStore(..., use_libuv=True)`` is the
constructor's default, and every store torch's own launchers create asks for it — the static
rendezvous of ``torchrun``/``python -m torch.distributed.run`` (and of ``accelerate launch``,
which runs it), the agent store the ranks join, ``init_process_group`` with ``env://`` or
``tcp://`` (Lightning's DDP strategy). torch's Windows wheels are built without that backend,
so each of them stops with ``RuntimeError: use_libuv was requested but PyTorch was build
without libuv support``. ``USE_LIBUV=0`` reaches only ``env://``/``tcp://`` (torch reads it in
``rendezvous._get_use_libuv_from_query_dict``), not the stores created without ``use_libuv``,
whose C++ default it cannot change; torch itself defaults to the other backend on Windows only
from 2.6 on. A CUDA script's launch must not need the user to know this.

So the one place every one of those requests meets the build, ``TCPStore.__init__``, gets the
backend the build has: the legacy one (the socket server ``USE_LIBUV=0`` selects, what the
Windows build always runs) — only where torch says it lacks libuv. torch 2.4 has no query for
that: the store's constructor is what reports it, refusing ``use_libuv=True`` with the error
above before it opens a socket. The first libuv request of a process therefore runs exactly as
asked; a build with libuv answers it (nothing changes, ever, on such a build: the success is
remembered and later requests pass straight through), a build without it refuses, and only
then is the request repeated without libuv — and later ones made without it at once.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, Optional, Sequence, Tuple

from dmlshim import events

log = logging.getLogger("dmlshim")

# TCPStore.__init__(host_name, port, world_size, is_master, timeout, wait_for_workers,
# multi_tenant, master_listen_fd, use_libuv): use_libuv's position (self not counted)
_USE_LIBUV_AT = 8
# torch 2.4: "... was build without libuv support"; later releases: "built"
_NO_LIBUV = re.compile(r"use_libuv was requested but PyTorch was buil[dt] without libuv support")

def _asks_for_libuv(args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    value = args[_USE_LIBUV_AT] if len(args) > _USE_LIBUV_AT else kwargs.get("use_libuv", True)
    return bool(value)


def _without_libuv(args: Sequence[Any],
                   kwargs: Dict[str, Any]) -> Tuple[Sequence[Any], Dict[str, Any]]:
    if len(args) > _USE_LIBUV_AT:
        args = (*args[:_USE_LIBUV_AT], False, *args[_USE_LIBUV_AT + 1:])
    else:
        kwargs = {**kwargs, "use_libuv": False}
    return args, kwargs


class StoreBackend:
    """The wrapper of ``TCPStore.__init__`` (see the module's docstring), and what this
    process's torch answered: :attr:`has_libuv` (None: no store has asked for libuv yet). One per
    session (the distributed patch holds it), so an uninstall forgets the answer with the rest."""

    def __init__(self) -> None:
        self.has_libuv: Optional[bool] = None

    def __call__(self, wrapped: Any, instance: Any, args: Sequence[Any],
                 kwargs: Dict[str, Any]) -> Any:
        if self.has_libuv is not False:
            if self.has_libuv or not _asks_for_libuv(args, kwargs):
                return wrapped(*args, **kwargs)
            try:
                result = wrapped(*args, **kwargs)
            except RuntimeError as error:
                if not _NO_LIBUV.search(str(error)):
                    raise
                self.has_libuv = False
                log.info("this torch's TCPStore has no libuv backend (torch %s: %s); its stores "
                         "use the socket backend (what USE_LIBUV=0 selects)", _torch_version(),
                         error)
            else:
                self.has_libuv = True
                return result
        elif not _asks_for_libuv(args, kwargs):
            return wrapped(*args, **kwargs)
        events.redirected("TCPStore(use_libuv)", True, False)
        args, kwargs = _without_libuv(args, kwargs)
        return wrapped(*args, **kwargs)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
