"""What a script sees of ``torch.accelerator`` under dmlshim: its names, their parameters, and
the answers of each call, for one target.

``python tests/scripts/accelerator_reference.py`` on torch 2.13 writes
``tests/data/accelerator_reference.json``; tests/test_cuda_api.py checks that torch 2.13 still
gives exactly that, and that torch 2.4.1 (dmlshim's stand-in module) gives the same.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "accelerator_reference.json"
TARGETS = ("cpu", "emulated-dml:2")


def shape(obj: Any) -> List[str]:
    """``name KIND[=default]`` of each parameter (annotations left out)."""
    params = list(inspect.signature(obj).parameters.values())
    return [f"{p.name} {p.kind.name}" + ("" if p.default is p.empty else f"={p.default!r}")
            for p in params]


def signatures() -> Dict[str, Any]:
    """Parameters of the names dmlshim answers, in torch.accelerator and .memory."""
    import torch

    from dmlshim.patches import cuda_api

    out: Dict[str, Any] = {}
    for prefix, owner, names in (
            ("", torch.accelerator, list(cuda_api.ACCELERATOR) + list(cuda_api.ACCELERATOR_CLASSES)),
            ("memory.", torch.accelerator.memory, list(cuda_api.ACCELERATOR_MEMORY))):
        for name in sorted(names):
            out[prefix + name] = shape(getattr(owner, name))
    return out


def answers(target: str) -> Dict[str, Any]:
    """Call every emulated name once (the shim must be installed for ``target``)."""
    import torch

    acc = torch.accelerator
    exact_memory = target.startswith("emulated-dml")
    out: Dict[str, Any] = {
        "is_available": acc.is_available(),
        "current_accelerator": str(acc.current_accelerator()),
        "current_accelerator(check_available=True)": str(acc.current_accelerator(check_available=True)),
        "device_count": acc.device_count(),
        "current_device_index": acc.current_device_index(),
        "synchronize": acc.synchronize(),
        "synchronize(0)": acc.synchronize(0),
        "get_device_capability": acc.get_device_capability(),
        "tensor on current_accelerator()": torch.ones(1, device=acc.current_accelerator()).device.type,
        "memory.empty_cache": acc.memory.empty_cache(),
        "memory.empty_host_cache": acc.memory.empty_host_cache(),
    }
    last = acc.device_count() - 1
    acc.set_device_index(last)
    out["set_device_index(last) -> current_device_index"] = acc.current_device_index()
    acc.set_device_index(0)
    with acc.device_index(last):
        out["device_index(last) -> current_device_index"] = acc.current_device_index()
    out["after device_index block"] = acc.current_device_index()
    out["current_stream type"] = type(acc.current_stream()).__name__

    acc.memory.reset_peak_memory_stats()
    before = acc.memory.memory_allocated(0)
    x = torch.empty(1024, dtype=torch.float32, device="cuda:0")
    grown = acc.memory.memory_allocated(0) - before
    peak = acc.memory.max_memory_allocated(0) - before
    del x
    freed = acc.memory.memory_allocated(0) - before
    stats = acc.memory_stats(0)
    free, total = acc.memory.get_memory_info(0)
    out.update({
        "memory_allocated grows by (4096 bytes allocated)": grown if exact_memory else grown >= 0,
        "max_memory_allocated grows by": peak if exact_memory else peak >= 0,
        "memory_allocated after del": freed if exact_memory else "-",
        "memory_reserved == memory_allocated": acc.memory_reserved(0) == acc.memory_allocated(0),
        "memory_stats is a dict with allocated_bytes.all.current":
            isinstance(stats, dict) and "allocated_bytes.all.current" in stats,
        "get_memory_info": [type(free).__name__, type(total).__name__, 0 <= free <= total],
        "top-level memory_allocated is memory.memory_allocated's answer":
            acc.memory_allocated() == acc.memory.memory_allocated(),
        "reset_accumulated_memory_stats": acc.memory.reset_accumulated_memory_stats(),
    })
    return out


def record() -> Dict[str, Any]:
    import torch

    import dmlshim

    result: Dict[str, Any] = {"torch": torch.__version__.split("+")[0], "targets": {}}
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
    REFERENCE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {REFERENCE} (torch {data['torch']})")
