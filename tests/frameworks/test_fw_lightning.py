"""Lightning through ``python -m dmlshim``: ``Trainer(accelerator="gpu", devices=1)``,
``precision="16-mixed"``, and ``devices=2`` (DDP, one process per device, launched by
Lightning itself) on ``emulated-dml:2``.

Native references: ``accelerator="cpu"`` with ``devices=1`` (32-true: under ``DMLSHIM_AMP=off``
16-mixed computes in float32 with a disabled scaler) and ``devices=2`` (DDP over gloo). Each
run's losses, what ``self.log`` handed the logger (each step's loss and the epoch's mean, synced
across processes) and the trained parameters are compared.
"""

import pytest

pytest.importorskip("lightning")

from fwcommon import (  # noqa: E402
    EMULATOR_REL,
    assert_close_logged,
    assert_close_losses,
    assert_close_params,
    assert_cuda_device,
    assert_equal_logged,
    assert_equal_losses,
    assert_equal_params,
    native,
    printed,
    printed_hex,
    shimmed,
)
from helpers import describe  # noqa: E402

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
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        assert_close_losses(proc, ref)
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)


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
    assert_equal_logged(proc, ref)
    assert_equal_params(proc, ref)


@pytest.mark.emulator
def test_ddp_sync_dist_logging_on_two_emulated_adapters(tmp_path):
    # Lightning, told the backend is nccl, syncs self.log(sync_dist=True) values with
    # ReduceOp.AVG, which NCCL has for every dtype and gloo has not (torch 2.4.1's gloo none at
    # all, 2.14.1's none for int64: Lightning's cumulated batch size); dmlshim averages as NCCL
    # does, on the gloo that runs the script's NCCL (found here, issue 39)
    (tmp_path / "native").mkdir()
    # natively Lightning sees gloo and syncs a mean as a SUM divided by the world size
    ref = native(SCRIPT, "--accelerator", "cpu", "--devices", "2", "--sync-dist",
                 cwd=tmp_path / "native")
    assert printed(ref, "world") == "2", describe(ref)
    proc = shimmed(SCRIPT, "--devices", "2", "--sync-dist", device="emulated-dml:2",
                   cwd=tmp_path)
    assert printed(proc, "world") == "2", describe(proc)
    assert_equal_losses(proc, ref)
    # the synced values: the mean of the two ranks' losses, on both sides summed by gloo
    assert_equal_logged(proc, ref)
    assert_equal_params(proc, ref)
