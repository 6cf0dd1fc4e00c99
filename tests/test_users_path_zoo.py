"""The model zoo on the path a user with a DirectML adapter takes (issue 21, "Done when").

``python -m dmlshim benchmarks/zoo/train.py --model M`` with default options inside the WSL
harness (tests/helpers.on_users_path: ``/dev/dxg``, WSL's libraries in the loader cache, the
stand-in ``torch_directml`` as the wheel), so ``auto`` finds the wheel and its adapter and the
guards, decompositions, fallback counting and AMP policy run as they do for that user. Default
options mean float32 (``DMLSHIM_AMP=off``: the script's float16 autocast computes in float32 and
its GradScaler is a disabled one). Each model trains with target ``dml`` in the JSON report, no
CPU fallback (the first step, printed by the script, and the report's count of the wheel's
fallback warnings), finite losses equal to a native CPU run's within float32 rounding, and no
no-gradient alarm. The emulated-dml matrix (test_decompose_zoo) runs the same emulator without
the wheel's path; this one catches what differs on it (detection, guards, the wheel's rules).
"""

from __future__ import annotations

import json
import math

import pytest
from helpers import (
    REAL_D3D12,
    REAL_REL,
    REPO,
    describe,
    first_difference,
    gradient_alarms,
    losses,
    run_native,
    run_shim,
    users_adapter_name,
    users_lane,
)

ZOO = REPO / "benchmarks" / "zoo" / "train.py"
STEPS = 3  # the warm-up step (its fallbacks printed by the script), then two counted steps
TIMEOUT = 600.0  # a framework import and a few steps on the emulator, on a loaded CI machine
if REAL_D3D12 is not None:  # lavapipe runs every kernel on the CPU (YOLOv8: ~8 minutes)
    TIMEOUT *= 3
# The list: ResNet-50 and ViT (timm), GPT-2 and BERT (transformers), UNet (diffusers),
# an LSTM language model (torch) and YOLOv8n (ultralytics), all tiny configs, no download.
MODELS = ["resnet50", "vit", "gpt2", "bert", "unet", "lstm_lm", "yolov8n"]
# The emulator runs each op's CPU kernel; decompositions and the fused LSTM cell that dmlshim
# computes from element-wise ops round differently: float32 noise over a few steps, far below
# what a skipped update or a wrong kernel does (as in test_decompose_zoo).
REL = 1e-4

pytestmark = [pytest.mark.slow, pytest.mark.users_path]


def _on_the_adapter(model: str, tmp_path, amp: str):
    report = tmp_path / "report.json"
    proc = run_shim(ZOO, "--model", model, "--steps", str(STEPS), device=None,
                    wsl=users_lane(), timeout=TIMEOUT,
                    env={"DMLSHIM_REPORT": str(report), "OMP_NUM_THREADS": "1",
                         "DMLSHIM_AMP": amp})
    assert proc.returncode == 0, describe(proc)
    assert "device cuda" in proc.stdout, describe(proc)  # the script took its CUDA branch
    rep = json.loads(report.read_text(encoding="utf-8"))
    assert rep["target"]["kind"] == "dml", describe(proc)  # auto found the wheel's adapter
    assert rep["target"]["names"] == [users_adapter_name()], rep["target"]
    assert rep["cpu_fallbacks"]["total"] == 0, rep["cpu_fallbacks"]
    got = losses(proc.stdout)
    assert len(got) == STEPS and all(math.isfinite(v) for v in got), describe(proc)
    return proc, got


@pytest.mark.parametrize("model", MODELS)
def test_zoo_model_trains_in_fp32_on_the_adapter(model, tmp_path):
    proc, got = _on_the_adapter(model, tmp_path, "off")
    assert "scaler_enabled 0" in proc.stdout, describe(proc)  # float32: a disabled scaler
    if REAL_D3D12 is None:  # the emulator counts the first step's fallbacks exactly
        assert "warmup_fallbacks {}" in proc.stdout, describe(proc)
    native = run_native(ZOO, "--model", model, "--steps", str(STEPS),
                        env={"OMP_NUM_THREADS": "1"}, timeout=TIMEOUT)
    assert native.returncode == 0, describe(native)
    expected = losses(native.stdout)
    rel = REL if REAL_D3D12 is None else REAL_REL
    assert got == pytest.approx(expected, rel=rel), first_difference(got, expected)
    assert not gradient_alarms(proc.stderr), describe(proc)  # every parameter trains natively


@pytest.mark.parametrize("model", MODELS)
def test_zoo_model_trains_under_amp_fp16_on_the_adapter(model, tmp_path):
    # DMLSHIM_AMP=fp16: the script's float16 autocast computes in float16 on the adapter and its
    # GradScaler is a real one; finite losses (float16 is not float32's numbers), no fallback
    proc, _ = _on_the_adapter(model, tmp_path, "fp16")
    assert "scaler_enabled 1" in proc.stdout, describe(proc)
    assert not gradient_alarms(proc.stderr), describe(proc)
