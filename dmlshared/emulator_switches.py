"""The emulator's fidelity switches: the names ``DMLSHIM_EMULATOR_GAPS`` accepts.

One table for both sides: the emulator (``emulated_dml._state``) keeps a hot-path flag per
switch, and ``dmlshim.config`` validates the option with it before torch is imported (so this
module imports nothing). A guard's record (``dmlshim.kernels.guards.records``) names the switch
that reproduces its bug.
"""

from __future__ import annotations

from typing import Dict, Tuple

# Gaps of torch-directml 0.2.5 reproduced by default (each observed on the real wheel, wrong
# results included: dmlshim's guards are tested against them).
GAPS: Tuple[str, ...] = (
    "fallback", "float64", "autocast", "generator", "fallback-warn-once", "eye", "mul-bool",
    "nll-none-backward", "masked-fill-uint8", "reflect-pad", "channels-last",
    "layer-norm-nobias", "storage", "inference-mode", "bfloat16", "maxpool-flat-indices",
    "out-resize", "resize", "unique-counts", "scatter-partial",
    "masked-fill-mode", "out-unsafe", "flip-negative-dims", "bn-mixed-backward",
    "gather-scatter-negative-dim", "rsub-float-number", "split-empty",
    "non-blocking-to-host", "sub-empty", "gather-empty", "readback-gil",
    "cat-empty", "slice-empty", "inplace-alias", "full-float")
# Opt-in: #362 (not reproduced by 0.2.5) and the wrong results seen on the software D3D12
# adapter only (facts file: they may be the translation layer's, not the wheel's).
BUGS: Tuple[str, ...] = ("bug-bn-stats", "bug-nll-ignore", "bug-scatter-add", "bug-ce-2d-none",
                         "bug-bilinear")
# Former opt-in names of two gaps that are now on by default: still accepted, never listed.
ALIASES: Dict[str, str] = {"bug-ce-none": "nll-none-backward", "bug-mul-bool": "mul-bool"}
ALL_SWITCHES: Tuple[str, ...] = GAPS + BUGS + tuple(ALIASES)
