"""What a script sees of ``torch.accelerator`` under dmlshim: its names, their parameters, and
the answers of each call, for one target.

``python tests/scripts/accelerator_reference.py`` on torch 2.13 writes
``tests/data/accelerator_reference.json``; tests/test_cuda_api.py checks that torch 2.13 still
gives exactly that, and that every other torch gives what is right for it: torch 2.4.1
(dmlshim's stand-in module) all of it; a torch with a ``torch.accelerator`` of its own (2.6 and
later) the names it has, with its parameters, answering as 2.13 does, and the names it lacks
absent (torch 2.11 has no ``empty_host_cache``).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "accelerator_reference.json"
TARGETS = ("cpu", "emulated-dml:2")


class Absent(Exception):
    """A name of torch 2.13's ``torch.accelerator`` that the torch in use lacks."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def shape(obj: Any) -> List[str]:
    """``name KIND[=default]`` of each parameter (annotations left out)."""
    params = list(inspect.signature(obj).parameters.values())
    return [f"{p.name} {p.kind.name}" + ("" if p.default is p.empty else f"={p.default!r}")
            for p in params]


def emulated_names() -> Dict[str, Any]:
    """``{"name" | "memory.name": dmlshim's emulation}``: the names dmlshim answers."""
    from dmlshim.patches import cuda_api

    out: Dict[str, Any] = {**cuda_api.ACCELERATOR, **cuda_api.ACCELERATOR_CLASSES}
    out.update({"memory." + name: fn for name, fn in cuda_api.ACCELERATOR_MEMORY.items()})
    return out


def lookup(path: str) -> Any:
    """``torch.accelerator.<path>`` (``memory.x``: of ``torch.accelerator.memory``), or
    :class:`Absent`."""
    import torch

    owner: Any = torch.accelerator
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part, None)
    if owner is None or not hasattr(owner, name):
        raise Absent(path)
    return getattr(owner, name)


def signatures() -> Dict[str, Any]:
    """Parameters of the names dmlshim answers that ``torch.accelerator`` has now."""
    out: Dict[str, Any] = {}
    for path in sorted(emulated_names()):
        try:
            out[path] = shape(lookup(path))
        except Absent:
            pass
    return out


def native_signatures() -> Optional[Dict[str, Any]]:
    """:func:`signatures` of torch itself (before install), None before torch 2.6."""
    import torch

    return signatures() if hasattr(torch, "accelerator") else None


def emulation_signatures() -> Dict[str, Any]:
    """The parameters dmlshim's emulations take (torch 2.13's)."""
    return {path: shape(fn) for path, fn in sorted(emulated_names().items())}


# the keys of the block of answers that allocates and reads the memory counters
MEMORY_KEYS = (
    "memory_allocated grows by (4096 bytes allocated)", "max_memory_allocated grows by",
    "memory_allocated after del", "memory_reserved == memory_allocated",
    "memory_stats is a dict with allocated_bytes.all.current", "get_memory_info",
    "top-level memory_allocated is memory.memory_allocated's answer",
    "reset_accumulated_memory_stats")


def answers(target: str) -> Dict[str, Any]:
    """Call every emulated name once (the shim must be installed for ``target``). An answer
    that needs a name the torch in use lacks is ``{"absent": name}``."""
    import torch

    acc = lookup
    exact_memory = target.startswith("emulated-dml")
    out: Dict[str, Any] = {}

    def answer(key: str, call: Callable[[], Any]) -> None:
        try:
            out[key] = call()
        except Absent as missing:
            out[key] = {"absent": missing.path}

    answer("is_available", lambda: acc("is_available")())
    answer("current_accelerator", lambda: str(acc("current_accelerator")()))
    answer("current_accelerator(check_available=True)",
           lambda: str(acc("current_accelerator")(check_available=True)))
    answer("device_count", lambda: acc("device_count")())
    answer("current_device_index", lambda: acc("current_device_index")())
    answer("synchronize", lambda: acc("synchronize")())
    answer("synchronize(0)", lambda: acc("synchronize")(0))
    answer("get_device_capability", lambda: acc("get_device_capability")())
    answer("tensor on current_accelerator()",
           lambda: torch.ones(1, device=acc("current_accelerator")()).device.type)
    answer("memory.empty_cache", lambda: acc("memory.empty_cache")())
    answer("memory.empty_host_cache", lambda: acc("memory.empty_host_cache")())

    last = acc("device_count")() - 1

    def set_last() -> int:
        acc("set_device_index")(last)
        index = acc("current_device_index")()
        acc("set_device_index")(0)
        return index

    def in_block() -> int:
        with acc("device_index")(last):
            return acc("current_device_index")()

    answer("set_device_index(last) -> current_device_index", set_last)
    answer("device_index(last) -> current_device_index", in_block)
    answer("after device_index block", lambda: acc("current_device_index")())
    answer("current_stream type", lambda: type(acc("current_stream")()).__name__)

    def memory() -> Dict[str, Any]:
        acc("memory.reset_peak_memory_stats")()
        allocated = acc("memory.memory_allocated")
        before = allocated(0)
        x = torch.empty(1024, dtype=torch.float32, device="cuda:0")
        grown = allocated(0) - before
        peak = acc("memory.max_memory_allocated")(0) - before
        del x
        freed = allocated(0) - before
        stats = acc("memory_stats")(0)
        free, total = acc("memory.get_memory_info")(0)
        return dict(zip(MEMORY_KEYS, (
            grown if exact_memory else grown >= 0,
            peak if exact_memory else peak >= 0,
            freed if exact_memory else "-",
            acc("memory_reserved")(0) == acc("memory_allocated")(0),
            isinstance(stats, dict) and "allocated_bytes.all.current" in stats,
            [type(free).__name__, type(total).__name__, 0 <= free <= total],
            acc("memory_allocated")() == allocated(),
            acc("memory.reset_accumulated_memory_stats")(),
        )))

    try:
        out.update(memory())
    except Absent as missing:
        out.update({key: {"absent": missing.path} for key in MEMORY_KEYS})
    return out


def record() -> Dict[str, Any]:
    """The torch in use, its own ``torch.accelerator`` (``native``: None before 2.6), what the
    shim shows of it (``signatures``), what the emulations take (``emulations``) and the
    answers on each target (``targets``)."""
    import torch

    import dmlshim

    result: Dict[str, Any] = {"torch": torch.__version__.split("+")[0],
                              "native": native_signatures(),
                              "emulations": emulation_signatures(), "targets": {}}
    for target in TARGETS:
        dmlshim.install(device=target)
        try:
            if "signatures" not in result:
                result["signatures"] = signatures()
            result["targets"][target] = answers(target)
        finally:
            dmlshim.uninstall()
    return result


if __name__ == "__main__":
    os.environ["DMLSHIM_DISABLE"] = "1"  # this process installs and uninstalls explicitly
    sys.path.insert(0, str(REFERENCE.parent.parent.parent))
    data = record()
    kept = {k: data[k] for k in ("torch", "signatures", "targets")}  # torch 2.13's, as recorded
    REFERENCE.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {REFERENCE} (torch {data['torch']})")
