"""One capability object per target kind, asked instead of kind strings."""

from __future__ import annotations

import torch

from dmlshim import capabilities, config
from dmlshim.target import Target


def test_each_kind_answers_for_itself():
    cfg = config.load({"device": "cpu"}, environ={})
    cpu = capabilities.of(Target("cpu", 1, "test"), cfg)
    dml = capabilities.of(Target("dml", 2, "test", float64=[True, False]), cfg)
    emu = capabilities.of(Target("emulated-dml", 1, "test"), cfg)
    bugs = config.load({"device": "cpu", "emulator_gaps": "fallback,bug-bn-stats"}, environ={})
    emu_bug = capabilities.of(Target("emulated-dml", 1, "test"), bugs)
    assert cpu.has_float64(0) and cpu.has_bf16() and not cpu.known_bugs()
    assert dml.has_float64(0) and not dml.has_float64(1) and not dml.has_bf16()
    assert torch.bfloat16 not in dml.autocast_dtypes_allowed()
    # every adapter has the real wheel's bugs, each with a guard kernel; the emulator too, plus
    # the BatchNorm one (older releases) only behind its opt-in switch
    from dmlshim.patches.guard_kernels import KERNEL_GUARDS

    assert set(dml.known_bugs()) == set(KERNEL_GUARDS)
    assert set(emu.known_bugs()) == set(KERNEL_GUARDS)
    assert not emu.has_float64(0)  # the emulator's float64 gap is on by default
    assert emu_bug.has_float64(0) and set(emu_bug.known_bugs()) == set(KERNEL_GUARDS) | {"bn_stats"}
    assert capabilities.of(None).kind == "cpu" and dml.directml and not cpu.directml
