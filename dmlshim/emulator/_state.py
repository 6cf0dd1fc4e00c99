"""Process-wide emulator state: adapter count, fidelity switches, registration flag.

Kept in one small module so the hot dispatch path reads plain attributes (no locks, no
lookups through the public package) and so tests can see what register() did.
"""

from __future__ import annotations

from typing import Iterable

import torch

# Gaps of torch-directml 0.2.5 that are reproduced by default, and wrong-result bugs that are
# reproduced only when asked for (they make results differ from the CPU on purpose). The names
# are the ones dmlshim.config accepts for DMLSHIM_EMULATOR_GAPS.
GAPS = ("fallback", "float64", "autocast", "generator")
GAPS += ("storage", "inference-mode", "bfloat16")  # facts 8, 9, 6 of the real wheel
BUGS = ("bug-ce-none", "bug-mul-bool", "bug-bn-stats")
ALL_SWITCHES = GAPS + BUGS


class EmulatorError(RuntimeError):
    """The emulator cannot be registered or used as asked."""


class EmulatorIndexError(EmulatorError, IndexError):
    """A device index outside the emulated adapters (an IndexError too, like a bad list index)."""


class _State:
    registered: bool = False
    count: int = 1
    switches: frozenset = frozenset(GAPS)
    # Hot-path copies of the switches (attribute reads are cheaper than set lookups).
    fallback: bool = True
    float64: bool = True
    autocast: bool = True
    generator: bool = True
    storage: bool = True
    inference_mode: bool = True
    bfloat16: bool = True
    bug_ce_none: bool = False
    bug_mul_bool: bool = False
    bug_bn_stats: bool = False
    current_index: int = 0
    devices: tuple = (torch.device("privateuseone", 0),)


state = _State()


def parse_switches(switches: Iterable[str]) -> frozenset:
    if isinstance(switches, str):
        # A single comma list ("fallback,float64") is accepted as a convenience.
        switches = [s for s in switches.split(",") if s.strip()]
    names = frozenset(s.strip().lower() for s in switches)
    unknown = sorted(names - set(ALL_SWITCHES))
    if unknown:
        raise EmulatorError(
            f"dmlshim emulator: unknown switch(es) {', '.join(unknown)}; "
            f"valid: {', '.join(ALL_SWITCHES)}"
        )
    return names


def apply_switches(names: frozenset) -> None:
    state.switches = names
    state.fallback = "fallback" in names
    state.float64 = "float64" in names
    state.autocast = "autocast" in names
    state.generator = "generator" in names
    state.storage = "storage" in names
    state.inference_mode = "inference-mode" in names
    state.bfloat16 = "bfloat16" in names
    state.bug_ce_none = "bug-ce-none" in names
    state.bug_mul_bool = "bug-mul-bool" in names
    state.bug_bn_stats = "bug-bn-stats" in names


def set_count(count: int) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise EmulatorError(f"dmlshim emulator: count must be an int >= 1, got {count!r}")
    state.count = count
    state.devices = tuple(torch.device("privateuseone", i) for i in range(count))
    if state.current_index >= count:
        state.current_index = 0


def check_index(index: int | None) -> int:
    """The adapter index to use for ``index`` (None: the current one); raises when out of range."""
    if index is None:
        return state.current_index
    if index < 0 or index >= state.count:
        raise EmulatorIndexError(
            f"dmlshim emulator: device index {index} is out of range: "
            f"{state.count} emulated DirectML adapter(s), valid indices 0..{state.count - 1}"
        )
    return index
