"""ultralytics YOLOv8n ``model.train(data=<synthetic dataset>, device=0, amp=True, epochs=1)``
through ``python -m dmlshim``, validation pass included, nothing downloaded (fwcommon.fw_env).

Native reference: ``device="cpu"`` (ultralytics then turns AMP off). On the CPU target its AMP
check also answers False (the parameters are on the CPU), so the runs are the same computation.
On the emulator the AMP check passes and training runs CUDA autocast: under ``DMLSHIM_AMP=off``
in float32 (inputs that ultralytics' validation hands over in float16 computed in float32
too), under ``DMLSHIM_AMP=fp16`` as a real float16 run, which only has to train.
"""

import math

import pytest

pytest.importorskip("ultralytics")

from fwcommon import (  # noqa: E402
    assert_close_losses,
    assert_cuda_device,
    assert_equal_losses,
    native,
    ok_losses,
    printed,
    shimmed,
)

SCRIPT = "yolo_train.py"


@pytest.fixture(scope="module")
def native_yolo(tmp_path_factory):
    return native(SCRIPT, "--device", "cpu", cwd=tmp_path_factory.mktemp("yolo-native"))


def test_yolo_train_on_cpu_target(tmp_path, native_yolo):
    proc = shimmed(SCRIPT, device="cpu", cwd=tmp_path)
    assert_cuda_device(proc)
    assert_equal_losses(proc, native_yolo)
    assert printed(proc, "fitness") == printed(native_yolo, "fitness")


@pytest.mark.emulator
def test_yolo_train_on_emulated_dml(tmp_path, native_yolo):
    proc = shimmed(SCRIPT, device="emulated-dml", cwd=tmp_path)
    assert_cuda_device(proc)
    assert printed(proc, "amp") == "True", proc.stdout
    assert_close_losses(proc, native_yolo)
    assert printed(proc, "fitness") is not None, proc.stdout + proc.stderr[-3000:]


@pytest.mark.emulator
def test_yolo_train_on_emulated_dml_with_fp16_amp(tmp_path):
    proc = shimmed(SCRIPT, device="emulated-dml", cwd=tmp_path, options={"amp": "fp16"})
    assert_cuda_device(proc)
    ok_losses(proc)
    fitness = printed(proc, "fitness")
    assert fitness is not None and math.isfinite(float.fromhex(fitness)), proc.stdout
