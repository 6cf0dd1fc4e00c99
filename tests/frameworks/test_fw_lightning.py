"""Lightning through ``python -m dmlshim``: ``Trainer(accelerator="gpu", devices=1)``,
``precision="16-mixed"``, and ``devices=2`` (DDP, one process per device, launched by
Lightning itself) on ``emulated-dml:2``.

Native references: ``accelerator="cpu"`` with ``devices=1`` (32-true: under ``DMLSHIM_AMP=off``
16-mixed computes in float32 with a disabled scaler) and ``devices=2`` (DDP over gloo).
"""

import pytest

pytest.importorskip("lightning")

from fwcommon import (  # noqa: E402
    assert_close_losses,
    assert_cuda_device,
    assert_equal_losses,
    native,
    printed,
    printed_hex,
    shimmed,
)

SCRIPT = "lightning_fit.py"
DEVICES = ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_gpu_accelerator_one_device(tmp_path, device, precision):
    ref = native(SCRIPT, "--accelerator", "cpu")
    proc = shimmed(SCRIPT, "--precision", precision, device=device, cwd=tmp_path)
    assert_cuda_device(proc)
    # the batches really were on the target device
    expected = "cpu" if device == "cpu" else "privateuseone"
    assert printed(proc, "tensors_on") == expected, proc.stdout
    if device == "cpu":
        assert_equal_losses(proc, ref)
        assert printed_hex(proc, "params") == printed_hex(ref, "params")
    else:
        assert_close_losses(proc, ref)


@pytest.mark.emulator
def test_ddp_two_devices_on_two_emulated_adapters(tmp_path):
    (tmp_path / "native").mkdir()
    ref = native(SCRIPT, "--accelerator", "cpu", "--devices", "2", cwd=tmp_path / "native")
    proc = shimmed(SCRIPT, "--devices", "2", device="emulated-dml:2", cwd=tmp_path)
    assert printed(proc, "world") == "2", proc.stdout + proc.stderr[-3000:]
    assert_cuda_device(proc)
    assert printed(proc, "tensors_on") == "privateuseone", proc.stdout
    # gloo sums the same two gradients in both runs: DDP results are bit-identical
    assert_equal_losses(proc, ref)
    assert printed_hex(proc, "params") == printed_hex(ref, "params")
