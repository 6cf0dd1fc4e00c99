"""timm through ``python -m dmlshim``: ``create_loader`` with its prefetcher (normalisation in
``torch.cuda.stream(stream=s)``), a ResNet and a ViT trained with ``--amp``-style autocast and
timm's ``NativeScaler``, validated under ``torch.inference_mode()``.

Native reference: the same run with ``--device cpu`` and no AMP (under ``DMLSHIM_AMP=off``
CUDA autocast computes in float32 and the scaler is a disabled one).
"""

import pytest

pytest.importorskip("timm")

from fwcommon import (  # noqa: E402
    assert_close_losses,
    assert_cuda_device,
    assert_equal_losses,
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
    else:
        assert float.fromhex(got_loss) == pytest.approx(float.fromhex(ref_loss), rel=1e-5)
