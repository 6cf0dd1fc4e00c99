"""Process-wide emulator state: adapter count, fidelity switches, registration flag.

Kept in one small module so the hot dispatch path reads plain attributes (no locks, no
lookups through the public package) and so tests can see what register() did.
"""

from __future__ import annotations

from typing import Iterable

import torch

# The switch names (GAPS on by default, BUGS opt-in, ALIASES their former names): one table with
# dmlshim.config, which validates DMLSHIM_EMULATOR_GAPS with it before torch is imported.
from dmlshared.emulator_switches import ALIASES, ALL_SWITCHES, BUGS, GAPS


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
    fallback_warn_once: bool = True
    eye: bool = True
    mul_bool: bool = True
    nll_none_backward: bool = True
    masked_fill_uint8: bool = True
    masked_fill_mode: bool = True

    @property
    def masked_fill_any(self) -> bool:  # one handler models both masked_fill_ gaps
        return self.masked_fill_uint8 or self.masked_fill_mode
    reflect_pad: bool = True
    channels_last: bool = True
    layer_norm_nobias: bool = True
    maxpool_flat_indices: bool = True
    out_resize: bool = True
    resize: bool = True
    unique_counts: bool = True
    scatter_partial: bool = True
    out_unsafe: bool = True
    flip_negative_dims: bool = True
    bn_mixed_backward: bool = True
    gather_scatter_negative_dim: bool = True
    rsub_float_number: bool = True
    split_empty: bool = True
    non_blocking_to_host: bool = True
    sub_empty: bool = True
    gather_empty: bool = True
    cat_empty: bool = True
    slice_empty: bool = True
    inplace_alias: bool = True
    readback_gil: bool = True  # modelled in _guard.cpp (pushed there by _sync_registrations)
    bug_bn_stats: bool = False
    bug_nll_ignore: bool = False
    bug_scatter_add: bool = False
    bug_ce_2d_none: bool = False
    bug_bilinear: bool = False
    # derived: one handler models both wrong nll backwards (see _ops._nll_backward_gap)
    nll_backward_any: bool = True
    scatter_any: bool = True
    gather_any: bool = True
    nll_forward_any: bool = False
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
    return frozenset(ALIASES.get(n, n) for n in names)


def apply_switches(names: frozenset) -> None:
    state.switches = names
    state.fallback = "fallback" in names
    state.float64 = "float64" in names
    state.autocast = "autocast" in names
    state.generator = "generator" in names
    for name in GAPS[4:] + BUGS:  # the hot-path flag of "mul-bool" is state.mul_bool
        setattr(state, name.replace("-", "_"), name in names)
    state.nll_backward_any = state.nll_none_backward or state.bug_nll_ignore
    state.gather_any = state.gather_scatter_negative_dim or state.gather_empty
    state.scatter_any = state.scatter_partial or state.bug_scatter_add \
        or state.gather_scatter_negative_dim
    state.nll_forward_any = state.bug_nll_ignore or state.bug_ce_2d_none


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
