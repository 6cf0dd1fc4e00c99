"""The Windows lane on a real D3D12 library: torch-directml's Windows DirectML.dll on
vkd3d-proton (D3D12 on Vulkan, over Mesa's lavapipe through wine's winevulkan), which compiles
DirectML's DXIL shaders, so training kernels run (wine's own d3d12 runs inference kernels
only: test_windows_lane.py).

Runs only with ``--windows-d3d12`` (.ci/windows-lane with ``DMLSHIM_WINDOWS_D3D12=DIR``, on
wine 9 or newer): the ``--windows-python`` folder's d3d12.dll is emulated_dml/windows/d3d12.c's,
beside the library's own. Every run here uses default options
(the adapter is found, not named) unless it says ``DMLSHIM_DEVICE=cpu``: the same script on the
same Windows python on the CPU is the reference (dmlshim on the CPU target computes what plain
python does: tests/test_corpus.py). A Windows process under wine imports torch in ~15 s and
the probe of DirectML takes another; training on lavapipe under wine is slow, so the scripts
are the small ones.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import List, Tuple

import pytest

from tests.helpers import (
    CORPUS,
    REAL_REL,
    REPO,
    describe,
    gradient_alarms,
    losses,
    with_import_line,
)

TIMEOUT = 900
ADAPTER = "llvmpipe"  # lavapipe's Vulkan device, as DXGI names it under wine


def _on_the_adapter(report: Path) -> dict:
    data = json.loads(report.read_text(encoding="utf-8"))
    assert data["target"]["kind"] == "dml", data["target"]
    assert data["target"]["names"][0].startswith(ADAPTER), data["target"]
    assert data["cpu_fallbacks"]["total"] == 0, data["cpu_fallbacks"]
    return data


def test_the_doctor_says_the_adapter_trains(win, tmp_path):
    # the doctor's training step (conv, training-mode batch norm, cross entropy, backward,
    # AdamW) on the device, compared with the CPU: what wine's own d3d12 cannot run
    proc = win.run(["-m", "dmlshim", "--doctor"], win.env(), tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0, describe(proc)
    assert f"adapter 0:       {ADAPTER}" in proc.stdout, describe(proc)
    assert f"auto picks:      dml ({ADAPTER}" in proc.stdout, describe(proc)


_EPOCH = re.compile(r"^epoch (\d+): train loss ([0-9.]+)  val acc ([0-9.]+) ")


def _epochs(stdout: str) -> List[Tuple[float, float]]:
    return [(float(m.group(2)), float(m.group(3)))
            for m in map(_EPOCH.match, stdout.splitlines()) if m]


def test_the_example_cuda_script_trains_on_the_adapter(win, tmp_path):
    # README's example, unchanged: .cuda(), DataLoader spawn workers with pin_memory, CUDA
    # events, a checkpoint reloaded with map_location="cuda:0"; two epochs
    script = win.path(REPO / "examples" / "train_cnn.py")
    report = tmp_path / "report.json"
    on_dml = win.run(["-m", "dmlshim", script], win.env(DMLSHIM_REPORT=win.path(report)),
                      tmp_path, timeout=TIMEOUT)
    assert on_dml.returncode == 0, describe(on_dml)
    _on_the_adapter(report)
    assert f"GPU: {ADAPTER}" in on_dml.stdout, describe(on_dml)
    assert "checkpoint saved and reloaded" in on_dml.stdout, describe(on_dml)
    assert not gradient_alarms(on_dml.stderr), describe(on_dml)
    on_cpu = win.run(["-m", "dmlshim", script], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                      timeout=TIMEOUT)
    assert on_cpu.returncode == 0, describe(on_cpu)
    got, want = _epochs(on_dml.stdout), _epochs(on_cpu.stdout)
    assert len(got) == len(want) == 2, describe(on_dml)
    assert all(math.isfinite(loss) for loss, _ in got)
    assert got[1][0] < got[0][0] / 2, got  # it learns: the second epoch's loss far lower
    # the printed figures have 4 (loss) and 3 (accuracy) decimals; another device's float32
    # moves them by a few units of the last place, a skipped update or a wrong kernel by far more
    for (loss, acc), (cpu_loss, cpu_acc) in zip(got, want):
        assert loss == pytest.approx(cpu_loss, rel=5 * REAL_REL, abs=2e-4), (got, want)
        assert acc == pytest.approx(cpu_acc, abs=0.01), (got, want)


@pytest.mark.parametrize("via", ["runner", "import"])
def test_a_cuda_script_trains_on_the_adapter_like_the_cpu(win, via, tmp_path):
    # tests/corpus/cnn.py (conv, batch norm, dropout, max pooling, Adam, StepLR, a validation
    # pass, a best checkpoint), one epoch, by the runner and by `import dmlshim`; each loss
    # printed exactly, as the real-wheel lane compares it on Linux
    args = ["--epochs", "1"]
    report = tmp_path / "report.json"
    if via == "runner":
        cmd = ["-m", "dmlshim", win.path(CORPUS / "cnn.py"), *args]
    else:
        copy = tmp_path / "cnn.py"
        copy.write_text(with_import_line((CORPUS / "cnn.py").read_text(encoding="utf-8")),
                        encoding="utf-8")
        cmd = [win.path(copy), *args]
    on_dml = win.run(cmd, win.env(DMLSHIM_REPORT=win.path(report)), tmp_path,
                      timeout=TIMEOUT)
    assert on_dml.returncode == 0, describe(on_dml)
    _on_the_adapter(report)
    assert not gradient_alarms(on_dml.stderr), describe(on_dml)
    on_cpu = win.run(cmd, win.env(DMLSHIM_DEVICE="cpu"), tmp_path, timeout=TIMEOUT)
    assert on_cpu.returncode == 0, describe(on_cpu)
    got, want = losses(on_dml.stdout), losses(on_cpu.stdout)
    assert len(got) == len(want) > 10 and all(math.isfinite(v) for v in got), describe(on_dml)
    assert got == pytest.approx(want, rel=REAL_REL), (got, want)
