"""Hot paths stay cold: dmlshim frames per train step, counted (not timed) with sys.setprofile.

benchmarks/hotpath_frames.py does the counting in a fresh process per target; the budget is
issue 15's: at most one shim frame per plain step on the CPU target (two on the emulator, where
torch's multi-tensor Adam makes its own ``torch.tensor(..., device="cpu")`` each step), at most
four per entry-point call the script makes itself, and no stack walk on torch's per-step paths.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, clean_env

BUDGET = {"cpu": 1, "emulated-dml": 2}
# On DirectML the step's F.cross_entropy (ignore_index=-100, PyTorch's default) goes through
# the guard for negative ignore indices (one frame per call, issue 22): counted apart.
NLL_GUARD = "patches/guard_kernels.py:_nll_forward"


def _guard_frames(device: str, functions: dict) -> float:
    frames = functions.get(NLL_GUARD, 0)
    if device == "emulated-dml":
        assert frames == 1, functions
    return frames


@pytest.mark.parametrize("device", sorted(BUDGET))
def test_frames_per_step(device):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "hotpath_frames.py"), "--one", device,
         "--json", "--steps", "10", "--warmup", "3"],
        capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, moves = r["plain"], r["moves"]
    assert plain["shim_per_step"] - _guard_frames(device, plain["functions"]) <= BUDGET[device], \
        plain["functions"]
    assert r["per_entry_point_call"] <= 4, moves["functions"]
    walks = [f for f in list(plain["functions"]) + list(moves["functions"])
             if f.endswith((":called_from_torch", ":caller_module", ":_call_site"))]
    assert not walks, walks
    # the moves really went through the shim (a count of 0 would mean nothing was measured)
    assert moves["functions"].get("events.py:redirected") == 3, moves["functions"]


def test_oom_translation_costs_one_frame_each_for_backward_and_step_only_when_capped():
    """A capped emulated adapter can run out of memory like real DirectML: the translation of
    its untyped error wraps backward and the optimizer step (one frame each), nothing else."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "hotpath_frames.py"), "--one", "emulated-dml",
         "--json", "--steps", "10", "--warmup", "3", "--emulator-memory", "4096"],
        capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain = json.loads(proc.stdout.strip().splitlines()[-1])["plain"]
    assert plain["functions"].get("patches/oom.py:_translating") == 2, plain["functions"]
    assert plain["shim_per_step"] - _guard_frames("emulated-dml", plain["functions"]) \
        == BUDGET["emulated-dml"] + 2, plain["functions"]
