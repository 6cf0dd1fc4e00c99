"""diffusers (UNet2DModel with accelerate fp16), a nanoGPT-style loop (``LayerNorm(bias=False)``,
``torch.compile`` on and off) and TensorBoard's ``SummaryWriter.add_graph`` through
``python -m dmlshim``, each against the script told to use the CPU: losses, what the framework
logged (diffusers' ``accelerator.log``, nanoGPT's ``estimate_loss``, TensorBoard's scalars read
back from its event files) and the trained parameters (diffusers' EMA too).
"""

import pytest
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

DEVICES = ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)]


@pytest.mark.parametrize("device", DEVICES)
def test_diffusers_unet_accelerate_fp16(device):
    pytest.importorskip("diffusers")
    ref = native("diffusers_unet.py", "--cpu", "--mixed-precision", "no")
    proc = shimmed("diffusers_unet.py", "--mixed-precision", "fp16", device=device)
    assert_cuda_device(proc)
    if device == "cpu":
        assert_equal_losses(proc, ref)
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        assert_close_losses(proc, ref)
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compile"])
def test_nanogpt_loop(device, compile_):
    flags = ("--compile",) if compile_ else ()
    # nanoGPT fuses AdamW only on CUDA; the native run fuses too, so both take one optimizer path
    ref = native("nanogpt.py", "--device", "cpu", "--fused", "on", *flags)
    proc = shimmed("nanogpt.py", *flags, device=device)
    assert_cuda_device(proc)
    if device == "cpu":
        # torch.compile stays on on the CPU target: Inductor in both runs
        assert_equal_losses(proc, ref)
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        # torch.compile gives the eager model on DirectML; the fused AdamW flag is dropped there
        # (torch-directml has no fused kernels), so the reference is the native eager, unfused run
        ref = native("nanogpt.py", "--device", "cpu")
        assert_close_losses(proc, ref)
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)


@pytest.mark.parametrize("device", DEVICES)
def test_tensorboard_add_graph(tmp_path, device):
    pytest.importorskip("tensorboard")
    (tmp_path / "native").mkdir()
    # The emulator's tensors are a Python subclass, and torch.jit.trace cannot trace a
    # convolution through one ("Cannot insert a Tensor that requires grad as a constant"); the
    # real wheel's are C++ tensors. On the emulator the graph is an MLP's: still add_graph's
    # trace check calling .double() (DMLSHIM_FLOAT64=auto) on an adapter without float64.
    model = ("--model", "cnn" if device == "cpu" else "mlp")
    ref = native("tensorboard_graph.py", "--device", "cpu", *model, cwd=tmp_path / "native")
    proc = shimmed("tensorboard_graph.py", *model, device=device, cwd=tmp_path)
    assert_cuda_device(proc)
    assert printed(proc, "graph") == printed(ref, "graph") != "0", proc.stdout + proc.stderr[-3000:]
    assert printed(proc, "events") == "1"
    if device == "cpu":
        assert_equal_losses(proc, ref)
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        assert_close_losses(proc, ref)
        # the events hold float32: the values as the emulator's run computed them, rounded once
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)
