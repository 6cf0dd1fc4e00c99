"""Hugging Face ``Trainer`` (tiny GPT-2 and BERT from configs) through ``python -m dmlshim``.

The Trainer chooses ``cuda`` by itself when CUDA is available. On the CPU target its losses, what
it logs (``logging_steps=1``: loss, grad_norm, learning_rate, train_loss, eval_loss) and the
trained parameters equal a native ``use_cpu=True`` run bit for bit; ``fp16=True`` is the same
run, since under ``DMLSHIM_AMP=off`` (the default) CUDA autocast regions compute in float32 and
the GradScaler is a disabled one. On the emulator they are equal within fwcommon.EMULATOR_REL.
"""

import pytest

pytest.importorskip("transformers")

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
    assert_equal_logged(proc, ref)
    assert_equal_params(proc, ref)


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
    assert_close_logged(proc, ref)
    assert_close_params(proc, ref, rel=EMULATOR_REL)


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)])
def test_auto_find_batch_size_keeps_a_batch_that_fits(device):
    # accelerate's find_executable_batch_size wraps the training loop; nothing runs out of
    # memory here, so the first batch size is kept and training is the plain one
    ref = native(SCRIPT, "--cpu")
    proc = shimmed(SCRIPT, "--auto-batch", device=device)
    assert printed(proc, "batch") == "4", printed(proc, "batch")
    if device == "cpu":
        assert_equal_losses(proc, ref)
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        assert_close_losses(proc, ref)
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)


@pytest.mark.emulator
def test_logged_losses_catch_what_the_wheel_did_to_the_trainers_accumulator():
    # Issue 39: on the wheel, `tr_loss -= tr_loss` (the Trainer's reset of its loss accumulator
    # after each log) computed tr_loss + tr_loss, so each logged loss was the step's plus twice
    # the last logged one, while training was right. The emulator reproduces that
    # (emulator gap inplace-alias) once dmlshim's guards are off: the losses the model computed
    # and the trained parameters still match the native run, and only the comparison of what
    # the Trainer logged tells that the user read garbage.
    ref = native(SCRIPT, "--cpu")
    proc = shimmed(SCRIPT, device="emulated-dml",
                   options={"guards": "off", "emulator-gaps": "inplace-alias"})
    assert_close_losses(proc, ref)
    assert_close_params(proc, ref, rel=EMULATOR_REL)
    got, want = logged(proc, ["loss"]), logged(ref, ["loss"])
    # the wheel's pattern: logged[k] = loss[k] + 2 logged[k-1] (steps 1, 2, ...)
    steps = sorted(s for _, s in want)
    for prev, step in zip(steps, steps[1:]):
        expected = want[("loss", step)] + 2 * got[("loss", prev)]
        assert got[("loss", step)] == pytest.approx(expected, rel=1e-5), (step, got, want)
    with pytest.raises(AssertionError, match="loss at step 2"):
        assert_close_logged(proc, ref)
