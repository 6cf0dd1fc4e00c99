"""Out of memory on DirectML: the emulator's cap (DMLSHIM_EMULATOR_MEMORY), the wheel's error,
``except torch.cuda.OutOfMemoryError`` under the shim, and the frameworks' batch-size finders.

In-process (the ``shim`` fixture) on one emulated adapter capped at a few MiB; the frameworks'
finders run only where the framework is installed.
"""

from __future__ import annotations

import ast
import gc
import re
import subprocess
import sys

import pytest
import torch
from helpers import REPO, clean_env, describe, neutral_cwd

import emulated_dml as emulator
from dmlshim.patches import oom
from emulated_dml import _memory

pytestmark = pytest.mark.emulator

MIB = 2**20
WHEEL_TEXT = "There is not enough GPU video memory available!"
# the per-step paths, which the translation leaves alone: no frame on them, capped or not
OOM_ATTRIBUTES = [(torch.autograd, "backward"), (torch.autograd, "grad"),
                  (torch.optim.Optimizer, "__init_subclass__"), (torch.optim.Adam, "step"),
                  (torch.optim.SGD, "step")]


def test_bad_emulator_memory_exits_2_with_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    runs = [
        subprocess.run([sys.executable, "-m", "dmlshim", "--emulator-memory", "12x", str(script)],
                       env=clean_env(), capture_output=True, text=True, timeout=120),
        subprocess.run([sys.executable, "-m", "dmlshim", str(script)],
                       env=clean_env(DMLSHIM_EMULATOR_MEMORY="0"), capture_output=True, text=True,
                       timeout=120),
    ]
    for proc, value in zip(runs, ("12x", "0")):
        assert proc.returncode == 2, describe(proc)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "DMLSHIM_EMULATOR_MEMORY" in lines[0] and repr(value) in lines[0] \
            and "MiB" in lines[0], describe(proc)
        assert "ran" not in proc.stdout
    help_proc = subprocess.run([sys.executable, "-m", "dmlshim", "--help"], env=clean_env(),
                               capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert "--emulator-memory / DMLSHIM_EMULATOR_MEMORY" in help_proc.stdout + help_proc.stderr


def test_emulator_without_the_shim_raises_the_wheels_error():
    emulator.register(1, emulator.GAPS)
    dev = emulator.device(0)
    gc.collect()
    base = emulator.memory_allocated(0)
    _memory.set_limit(base + 1 * MIB)
    try:
        keep = torch.empty(MIB // 8, device=dev)  # 0.5 MiB: fits
        with pytest.raises(RuntimeError) as info:
            torch.empty(MIB // 4 + 1, device=dev)  # 1 MiB + 4 bytes more: does not
        assert type(info.value) is RuntimeError  # as torch-directml: a plain RuntimeError
        assert str(info.value) == (f"Could not allocate tensor with {(MIB // 4 + 1) * 4} bytes. "
                                   f"{WHEEL_TEXT}")
        assert emulator.memory_allocated(0) == base + MIB // 2  # the failed one was not counted
        del keep
    finally:
        _memory.set_limit(None)
    assert emulator.memory_allocated(0) == base


def accepted_by_the_frameworks(args) -> bool:
    """The tests accelerate's should_reduce_batch_size and Lightning's is_oom_error make."""
    return (len(args) == 1 and " out of memory." in args[0] and "CUDA" in args[0]
            and WHEEL_TEXT in args[0])


def run_case(case: str, mib: int, timeout: float = 600):
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "scripts" / "oom_cases.py"), case,
                           str(mib)], env=clean_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=neutral_cwd())
    assert proc.returncode == 0, describe(proc)
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "result" and len(parts) == 3:
            out[parts[1]] = parts[2]
    return out, proc


def test_except_cuda_oom_catches_it_at_entry_points_and_the_wheels_error_elsewhere():
    got, proc = run_case("except", 5)
    for where in ["factory", "Tensor.cuda"]:
        assert got.get(where) == "DirectMLOutOfMemoryError", (where, describe(proc))
        args = ast.literal_eval(got[where + ":text"])
        assert accepted_by_the_frameworks(args), (where, args)
        assert re.search(r"Tried to allocate \d+\.\d\d MiB\.", args[0]), args
    # in forward, backward and the optimizer's step the shim has no frame (none is paid per
    # step): the wheel's own RuntimeError, as torch-directml, which translate() converts
    for where, nbytes in (("forward", 2 * MIB), ("backward", None), ("optimizer-step", None)):
        assert got.get(where) == "RuntimeError", (where, describe(proc))
        text = ast.literal_eval(got[where + ":text"])[0]
        assert text.startswith("Could not allocate tensor with ") and text.endswith(WHEEL_TEXT), \
            text
        if nbytes is not None:
            assert text == f"Could not allocate tensor with {nbytes} bytes. {WHEEL_TEXT}", text
        translated = oom.translate(RuntimeError(text))
        assert isinstance(translated, torch.cuda.OutOfMemoryError)
        assert accepted_by_the_frameworks(translated.args), translated.args
    assert got["allocated-after"] == "0", describe(proc)  # the failed steps leaked nothing


@pytest.mark.parametrize("memory", ["", "1"])
def test_no_frame_on_backward_or_step_capped_or_not(shim, memory):
    before = {(owner, name): vars(owner).get(name) for owner, name in OOM_ATTRIBUTES}
    shim(device="emulated-dml", emulator_memory=memory)
    assert {(owner, name): vars(owner).get(name) for owner, name in OOM_ATTRIBUTES} == before
    assert not oom.is_patched(torch.autograd, "backward")
    assert not oom.is_patched(torch.optim.Adam, "step")


def test_a_caught_oom_frees_the_scripts_objects_without_the_garbage_collector(shim):
    """As native CUDA's: once the script's ``except`` ends, nothing of the shim's translation
    holds the error, so its traceback's frames (the script's model, optimizer, batch) go with
    their last reference, not at the next collection (a cycle would keep them)."""
    import weakref

    shim(device="emulated-dml", emulator_memory="1")

    class Model(torch.nn.Linear):
        pass

    def step():
        model = Model(2, 2)  # a local of the frame the OOM's traceback passes through
        torch.zeros(MIB, device="cuda")  # 4 MiB: does not fit
        return model

    def run():
        try:
            step()
        except torch.cuda.OutOfMemoryError as err:
            return weakref.ref(err.__traceback__.tb_next.tb_frame.f_locals["model"])
        raise AssertionError("no OOM")

    enabled = gc.isenabled()
    gc.disable()
    try:
        ref = run()
        assert ref() is None, gc.get_referrers(ref())  # freed by reference counting alone
    finally:
        if enabled:
            gc.enable()


def test_uninstall_lifts_the_cap(shim):
    shim(device="emulated-dml", emulator_memory="1")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.zeros(MIB, device="cuda")  # 4 MiB
    import dmlshim

    dmlshim.uninstall()
    assert _memory.limit() is None
    x = torch.zeros(MIB, device=emulator.device(0))  # on an uncapped adapter
    assert x.device.type == "privateuseone"
    wheel = RuntimeError(_memory.oom_message(16))
    assert oom.translate(wheel) is not wheel and isinstance(oom.translate(wheel), torch.OutOfMemoryError)


def test_accelerate_find_executable_batch_size_settles_on_a_smaller_batch():
    pytest.importorskip("accelerate")
    got, proc = run_case("accelerate", 8)
    tried = [int(v) for v in got["tried"].split(",")]
    settled = int(got["settled"])
    assert tried[0] == 2048 and settled == tried[-1] < 2048 and len(tried) > 1, describe(proc)
    assert got["settled-fits"] == "True" and got["double-fits"] == "False", describe(proc)
    assert got["recognises-wheel-error"] == "True", describe(proc)


def test_hf_trainer_auto_find_batch_size_settles_on_a_smaller_batch():
    pytest.importorskip("transformers")
    got, proc = run_case("hf", 8)
    assert got["device"] == "privateuseone:0" and got["steps"] == "2", describe(proc)
    assert int(got["settled"]) < 4096, describe(proc)
    assert got["recognises-wheel-error"] == "True", describe(proc)


def test_lightning_scale_batch_size_settles_below_the_batch_that_ran_out():
    pytest.importorskip("lightning")
    got, proc = run_case("lightning", 8)
    assert got["device"] == "privateuseone:0", describe(proc)
    settled = int(got["settled"])
    # power mode doubles from 64 until a batch runs out of memory, then keeps the last that ran
    assert 64 <= settled < 64 * 2**9, describe(proc)
    assert f"Batch size {2 * settled} failed" in proc.stdout + proc.stderr, describe(proc)
    assert got["recognises-wheel-error"] == "True", describe(proc)
