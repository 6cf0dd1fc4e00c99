"""accelerate through ``python -m dmlshim``: the README loop (``Accelerator()`` chooses the GPU,
fp16 mixed precision) and ``accelerate launch --multi_gpu --num_processes 2``, whose ranks
inherit the shim (``python -m dmlshim -m accelerate.commands.launch ...``).

Native references: the same loop with ``Accelerator(cpu=True)``, and ``accelerate launch`` of
two CPU processes (gloo): the two-process losses (the mean of the two ranks' half-batch losses)
round differently from one process's full batch, so each is compared with its own kind. Each
run's losses, what it logged through ``accelerator.log`` and the trained parameters are compared.
"""

import pytest

pytest.importorskip("accelerate")

from fwcommon import (  # noqa: E402
    EMULATOR_REL,
    assert_close_logged,
    assert_close_losses,
    assert_close_params,
    assert_cuda_device,
    assert_equal_logged,
    assert_equal_losses,
    assert_equal_params,
    free_port,
    native,
    printed,
    printed_hex,
    run_module,
    script,
    shimmed,
)

SCRIPT = "accelerate_loop.py"


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)])
def test_accelerator_loop_fp16(device):
    ref = native(SCRIPT, "--cpu")
    proc = shimmed(SCRIPT, "--mixed-precision", "fp16", device=device)
    assert_cuda_device(proc)
    if device == "cpu":
        assert_equal_losses(proc, ref)
        assert printed_hex(proc, "params") == printed_hex(ref, "params")
        assert_equal_logged(proc, ref)
        assert_equal_params(proc, ref)
    else:
        assert_close_losses(proc, ref)
        assert_close_logged(proc, ref)
        assert_close_params(proc, ref, rel=EMULATOR_REL)


def _launch(tmp_path, device, *script_args):
    args = ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), str(script(SCRIPT)), *script_args]
    return run_module(args, device=device, cwd=tmp_path)


@pytest.fixture(scope="module")
def native_launch(tmp_path_factory):
    proc = _launch(tmp_path_factory.mktemp("native-launch"), None, "--cpu")
    assert printed(proc, "procs") == "2", proc.stdout
    return proc


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml:2", marks=pytest.mark.emulator)])
def test_accelerate_launch_two_processes(tmp_path, native_launch, device):
    # emulated-dml:2: one adapter per rank, DDP's gradient all-reduce staged through gloo
    proc = _launch(tmp_path, device)
    assert printed(proc, "procs") == "2", proc.stdout + proc.stderr[-3000:]
    assert_cuda_device(proc)
    assert_equal_losses(proc, native_launch)
    assert printed_hex(proc, "params") == printed_hex(native_launch, "params")
    assert_equal_logged(proc, native_launch)
    assert_equal_params(proc, native_launch)
