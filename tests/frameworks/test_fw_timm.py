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
    ref_eval, got_eval = printed(ref, "eval").split(), printed(proc, "eval")
    assert got_eval is not None, proc.stdout + proc.stderr[-3000:]
    got_eval = got_eval.split()
    if device == "cpu":
        assert_equal_losses(proc, ref)
        assert got_eval == ref_eval
    else:
        assert_close_losses(proc, ref)
        assert float.fromhex(got_eval[0]) == pytest.approx(float.fromhex(ref_eval[0]), rel=1e-5)
        assert got_eval[1] == ref_eval[1]  # top-1 accuracy
