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
    # every adapter has the real wheel's bugs (a guard each); the emulator too, but a guard
    # that is right only where its bug is (the max-pool one converts the wheel's flattened
    # indices; the BatchNorm one, #362, is of older releases) only behind that bug's switch
    from dmlshim.kernels.guards.records import GUARDS

    wheel = {g.name for g in GUARDS} - {"bn_stats"}
    assert set(dml.known_bugs()) == wheel and len(wheel) == 25
    assert set(emu.known_bugs()) == wheel
    assert not emu.has_float64(0)  # the emulator's float64 gap is on by default
    assert emu_bug.has_float64(0) and set(emu_bug.known_bugs()) == \
        wheel - {"max_pool_indices"} | {"bn_stats"}
    pools = config.load({"device": "cpu", "emulator_gaps": "maxpool-flat-indices"}, environ={})
    assert "max_pool_indices" in capabilities.of(Target("emulated-dml", 1, "test"),
                                                 pools).known_bugs()
    assert capabilities.of(None).kind == "cpu" and dml.directml and not cpu.directml


def test_capabilities_answer_the_doctor_and_the_optimizer_flags():
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    cfg = config.load({"device": "cpu"}, environ={})
    no_gap = config.load({"device": "cpu", "emulator_gaps": "fallback"}, environ={})
    cpu = capabilities.of(Target("cpu", 1, "test"), cfg)
    dml = capabilities.of(Target("dml", 2, "test", float64=[True, False]), cfg)
    emu = capabilities.of(Target("emulated-dml", 1, "test"), cfg)
    # fused=True is kept exactly where torch has the kernels for the target's device
    assert cpu.has_fused_optimizers() == ("cpu" in _get_fused_kernels_supported_devices())
    assert not dml.has_fused_optimizers() and not emu.has_fused_optimizers()
    assert capabilities.of(Target("cuda", 1, "test"), cfg).has_fused_optimizers()
    # one answer for float64: the summary says what has_float64 says
    assert cpu.float64_summary() == "yes"
    assert dml.float64_summary() == "adapter 0: yes, adapter 1: no"
    assert emu.float64_summary().startswith("no (") and not emu.has_float64(0)
    emu_f64 = capabilities.of(Target("emulated-dml", 1, "test"), no_gap)
    assert emu_f64.float64_summary().startswith("yes (") and emu_f64.has_float64(0)
    assert emu.load_problem() is None and cpu.load_problem() is None
