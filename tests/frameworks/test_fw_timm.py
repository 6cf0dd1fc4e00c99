"""timm through ``python -m dmlshim``: ``create_loader`` with its prefetcher (normalisation in
``torch.cuda.stream(stream=s)``), a ResNet and a ViT trained with ``--amp``-style autocast and
timm's ``NativeScaler``, validated under ``torch.inference_mode()``.

Native reference: the same run with ``--device cpu`` and no AMP (under ``DMLSHIM_AMP=off``
CUDA autocast computes in float32 and the scaler is a disabled one). Each run's losses, what
timm's train.py logs (its meter's running mean, the summary.csv row) and the trained parameters
(BatchNorm's running statistics included) are compared.
"""

import pytest

pytest.importorskip("timm")

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
    shimmed,
)

SCRIPT = "timm_train.py"


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)])
@pytest.mark.parametrize("model", ["resnet", "vit"])
def test_timm_train_and_validate(model, device):
    ref = native(SCRIPT, "--model", model, "--device", "cpu")
    proc = shimmed(SCRIPT, "--model", model, "--amp", device=device)
    assert_cuda_device(proc)
    if device == "cpu":
        assert_equal_losses(proc, ref)
    else:
        assert_close_losses(proc, ref)
    (ref_loss, ref_top1), (got_loss, got_top1) = printed(ref, "eval").split(), printed(
        proc, "eval").split()
    # validation ran on the device under inference_mode, on tensors made outside it
    assert got_top1 == ref_top1
    if device == "cpu":
        assert got_loss == ref_loss
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        assert float.fromhex(got_loss) == pytest.approx(float.fromhex(ref_loss), rel=1e-5)
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)
