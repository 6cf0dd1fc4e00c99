"""Hugging Face ``Trainer`` (tiny GPT-2 and BERT from configs) through ``python -m dmlshim``.

The Trainer chooses ``cuda`` by itself when CUDA is available. On the CPU target its losses
equal a native ``use_cpu=True`` run bit for bit; ``fp16=True`` is the same run, since under
``DMLSHIM_AMP=off`` (the default) CUDA autocast regions compute in float32 and the GradScaler is
a disabled one. On the emulator they are equal within fwcommon.EMULATOR_REL.
"""

import pytest

pytest.importorskip("transformers")

from fwcommon import (  # noqa: E402
    assert_close_losses,
    assert_cuda_device,
    assert_equal_losses,
    native,
    printed,
    printed_hex,
    shimmed,
)

SCRIPT = "hf_trainer.py"


@pytest.mark.parametrize("model,flags", [("gpt2", ()), ("gpt2", ("--fp16",)), ("bert", ("--fp16",))],
                         ids=["gpt2-fp32", "gpt2-fp16", "bert-fp16"])
def test_trainer_on_cpu_target_equals_native_cpu(model, flags):
    ref = native(SCRIPT, "--model", model, "--cpu")
    proc = shimmed(SCRIPT, "--model", model, *flags, device="cpu")
    assert_cuda_device(proc)
    assert_equal_losses(proc, ref)
    assert printed_hex(proc, "eval") == printed_hex(ref, "eval")


@pytest.mark.emulator
@pytest.mark.parametrize("model,flags", [("gpt2", ("--fp16",)), ("bert", ())],
                         ids=["gpt2-fp16", "bert-fp32"])
def test_trainer_on_emulated_dml(model, flags):
    ref = native(SCRIPT, "--model", model, "--cpu")
    proc = shimmed(SCRIPT, "--model", model, *flags, device="emulated-dml")
    assert_cuda_device(proc)
    assert_close_losses(proc, ref)
    # evaluation runs under torch.no_grad in eval mode on the device
    assert printed_hex(proc, "eval") == pytest.approx(printed_hex(ref, "eval"), rel=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)])
def test_auto_find_batch_size_keeps_a_batch_that_fits(device):
    # accelerate's find_executable_batch_size wraps the training loop; nothing runs out of
    # memory here, so the first batch size is kept and training is the plain one
    ref = native(SCRIPT, "--cpu")
    proc = shimmed(SCRIPT, "--auto-batch", device=device)
    assert printed(proc, "batch") == "4", printed(proc, "batch")
    if device == "cpu":
        assert_equal_losses(proc, ref)
    else:
        assert_close_losses(proc, ref)
