"""ultralytics YOLOv8n ``model.train(data=<synthetic dataset>, device=0, amp=True, epochs=1)``
through ``python -m dmlshim``, validation pass included, nothing downloaded (fwcommon.fw_env).

Native reference: ``device="cpu"`` (ultralytics then turns AMP off). On the CPU target its AMP
check also answers False (the parameters are on the CPU), so the runs are the same computation.
On the emulator the AMP check passes and training runs CUDA autocast: under ``DMLSHIM_AMP=off``
in float32 (inputs that ultralytics' validation hands over in float16 computed in float32
too), under ``DMLSHIM_AMP=fp16`` as a real float16 run, which only has to train.

ultralytics asks for AdamW's fused kernel when the model's parameters are on CUDA; on the CPU
target they say they are, so the CPU's fused kernel runs there, and the reference for it is the
native run with that kernel (``--fused-adamw``): the plain native run's parameters lie ~2e-8
apart after the epoch (the same update rounded otherwise), its losses are bit-identical. On
DirectML dmlshim drops the fused flag (torch-directml has no fused kernels): the emulator's
reference is the plain native run. Each run's losses, what ultralytics wrote to results.csv and
the trained parameters of the model and of its EMA are compared.
"""

import math

import pytest

pytest.importorskip("ultralytics")

from fwcommon import (  # noqa: E402
    EMULATOR_REL,
    assert_close_logged,
    assert_close_losses,
    assert_close_params,
    assert_cuda_device,
    assert_equal_logged,
    assert_equal_losses,
    assert_equal_params,
    logged,
    native,
    ok_losses,
    params,
    printed,
    shimmed,
)

SCRIPT = "yolo_train.py"


@pytest.fixture(scope="module")
def native_yolo(tmp_path_factory):
    return native(SCRIPT, "--device", "cpu", cwd=tmp_path_factory.mktemp("yolo-native"))


def test_yolo_train_on_cpu_target(tmp_path):
    (tmp_path / "native").mkdir()
    (tmp_path / "run").mkdir()
    ref = native(SCRIPT, "--device", "cpu", "--fused-adamw", cwd=tmp_path / "native")
    proc = shimmed(SCRIPT, device="cpu", cwd=tmp_path / "run")
    assert_cuda_device(proc)
    assert_equal_losses(proc, ref)
    assert printed(proc, "fitness") == printed(ref, "fitness")
    assert_equal_logged(proc, ref)
    assert_equal_params(proc, ref)


@pytest.mark.emulator
def test_yolo_train_on_emulated_dml(tmp_path, native_yolo):
    proc = shimmed(SCRIPT, device="emulated-dml", cwd=tmp_path)
    assert_cuda_device(proc)
    assert printed(proc, "amp") == "True", proc.stdout
    assert_close_losses(proc, native_yolo)
    assert printed(proc, "fitness") is not None, proc.stdout + proc.stderr[-3000:]
    # results.csv holds numbers rounded to 5 decimals (losses) and 6 significant digits: one
    # unit of the last printed digit apart is the same number
    assert_close_logged(proc, native_yolo, rel=EMULATOR_REL, abs=1e-5)
    assert_close_params(proc, native_yolo, rel=EMULATOR_REL)


@pytest.mark.emulator
def test_yolo_train_on_emulated_dml_with_fp16_amp(tmp_path):
    proc = shimmed(SCRIPT, device="emulated-dml", cwd=tmp_path, options={"amp": "fp16"})
    assert_cuda_device(proc)
    ok_losses(proc)
    fitness = printed(proc, "fitness")
    assert fitness is not None and math.isfinite(float.fromhex(fitness)), proc.stdout
    # what it wrote and what it trained: there and finite (logged, params check both), the
    # float32 master weights of model and EMA alike
    assert {k for k, _ in logged(proc)} >= {"train/box_loss", "train/cls_loss", "train/dfl_loss"}
    digests = params(proc)
    assert {n[4:] for n in digests if n.startswith("ema.")} == {
        n for n in digests if not n.startswith("ema.")}
