"""Bytes held by the emulated adapters, counted per CPU storage (a view shares its storage).

Every emulated tensor keeps its data in a CPU tensor (its "elem"). Storages are keyed by the
identity of their c10 StorageImpl (``untyped_storage()._cdata``), which survives resize_ (the
data pointer does not). Each elem holding a storage adds a reference; a weakref callback on the
elem drops it, and the storage's bytes leave the count when its last elem dies. The weakref is on
the CPU elem, never on the emulated tensor, because torch.utils.swap_tensors (used by
``torch.__future__.set_swap_module_params_on_conversion``) refuses tensors with weakrefs.

A limit (``DMLSHIM_EMULATOR_MEMORY``, per adapter) makes a new storage that would pass it
raise torch-directml's out-of-memory error; the count is only compared where a storage is
added or grows, so tensors within the limit pay one comparison.
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import torch

# storage key -> [adapter index, nbytes, live elem count]
_storages: Dict[int, List[int]] = {}
# id(weakref) -> (weakref, storage key). Keyed by id: weakrefs to one tensor compare equal
# through the tensor's __eq__, which is elementwise.
_refs: Dict[int, Tuple[weakref.ref, int]] = {}
_current: List[int] = []
_peak: List[int] = []
# Live bytes each adapter may hold (None: unlimited).
_limit: Optional[int] = None


def oom_message(nbytes: int) -> str:
    """torch-directml 0.2.5's allocator message (a string in its native extension)."""
    return (f"Could not allocate tensor with {nbytes} bytes. There is not enough GPU video "
            "memory available!")


def set_limit(nbytes: Optional[int]) -> None:
    global _limit
    _limit = nbytes


def limit() -> Optional[int]:
    return _limit


def resize(count: int) -> None:
    while len(_current) < count:
        _current.append(0)
        _peak.append(0)


def _release(ref: weakref.ref) -> None:
    item = _refs.pop(id(ref), None)
    if item is None:
        return
    key = item[1]
    entry = _storages.get(key)
    if entry is None:
        return
    entry[2] -= 1
    if entry[2] <= 0:
        del _storages[key]
        _current[entry[0]] -= entry[1]


def track(elem: torch.Tensor, index: int) -> None:
    """Count ``elem``'s storage against adapter ``index`` for as long as ``elem`` lives."""
    storage = elem.untyped_storage()
    key = storage._cdata
    entry = _storages.get(key)
    if entry is None:
        nbytes = storage.nbytes()
        if _limit is not None and _current[index] + nbytes > _limit:
            raise RuntimeError(oom_message(nbytes))
        _storages[key] = [index, nbytes, 1]
        _current[index] += nbytes
        if _current[index] > _peak[index]:
            _peak[index] = _current[index]
    else:
        entry[2] += 1
    ref = weakref.ref(elem, _release)
    _refs[id(ref)] = (ref, key)


def refresh(elem: torch.Tensor) -> None:
    """Re-read the size of ``elem``'s storage after an in-place resize."""
    entry = _storages.get(elem.untyped_storage()._cdata)
    if entry is None:
        return
    nbytes = elem.untyped_storage().nbytes()
    if nbytes != entry[1]:
        if _limit is not None and nbytes > entry[1] and _current[entry[0]] + nbytes - entry[1] > _limit:
            raise RuntimeError(oom_message(nbytes))
        _current[entry[0]] += nbytes - entry[1]
        entry[1] = nbytes
        if _current[entry[0]] > _peak[entry[0]]:
            _peak[entry[0]] = _current[entry[0]]


def allocated(index: Optional[int]) -> int:
    return sum(_current) if index is None else _current[index]


def max_allocated(index: Optional[int]) -> int:
    return sum(_peak) if index is None else _peak[index]


def reset_peak(index: Optional[int]) -> None:
    for i in range(len(_peak)) if index is None else (index,):
        _peak[i] = _current[i]
