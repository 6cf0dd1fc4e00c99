"""torch.cuda.* as user code sees it under the shim (CPU target)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

import dmlshim
from dmlshim.patches import cuda_api


def test_queries(shim):
    shim(device="cpu")
    assert torch.cuda.is_available()
    assert torch.cuda.is_initialized()
    assert torch.cuda.device_count() == 1
    assert torch.cuda.current_device() == 0
    torch.cuda.set_device(0)
    torch.cuda.set_device("cuda:0")
    assert isinstance(torch.cuda.get_device_name(0), str) and torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(0)
    assert props.name == torch.cuda.get_device_name(0)
    assert props.total_memory > 2**26
    assert (props.major, props.minor) == torch.cuda.get_device_capability() == (0, 0)
    assert props.multi_processor_count >= 1
    assert torch.backends.cudnn.is_available()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    torch.backends.cuda.matmul.allow_tf32 = True


def test_memory_calls_are_plausible(shim):
    shim(device="cpu")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    big = torch.ones(64, 1024, 1024)  # 256 MiB, touched
    after = torch.cuda.memory_allocated()
    assert isinstance(before, int) and before > 0
    assert after - before > 200 * 2**20
    assert torch.cuda.max_memory_allocated() >= after
    del big
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    assert torch.cuda.memory_reserved() > 0
    assert "allocated_bytes.all.current" in torch.cuda.memory_stats()
    assert "MiB" in torch.cuda.memory_summary()
    torch.cuda.empty_cache()


def test_events_time_on_the_host_clock(shim):
    shim(device="cpu")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    torch.cuda.synchronize()
    assert 15 <= start.elapsed_time(end) < 2000
    assert end.query()
    untimed = torch.cuda.Event()
    untimed.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        untimed.elapsed_time(end)


def test_streams_and_device_contexts(shim):
    shim(device="cpu")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() == s
        x = torch.ones(2, device="cuda") * 2
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    s.wait_stream(torch.cuda.current_stream())
    s.synchronize()
    ev = s.record_event()
    assert ev.query()
    with torch.cuda.device(0):
        assert torch.cuda.current_device() == 0
    with torch.cuda.nvtx.range("step"):
        torch.cuda.nvtx.range_push("fwd")
        torch.cuda.nvtx.range_pop()
    assert x.tolist() == [2.0, 2.0]


def test_rng_calls_seed_the_generator_the_target_uses(shim):
    shim(device="cpu")
    torch.cuda.manual_seed_all(5)
    a = torch.rand(3, device="cuda")
    torch.cuda.manual_seed(5)
    assert torch.equal(a, torch.rand(3, device="cuda"))
    state = torch.cuda.get_rng_state()
    b = torch.rand(2)
    torch.cuda.set_rng_state(state)
    assert torch.equal(b, torch.rand(2))
    assert torch.cuda.initial_seed() == 5


def test_unsupported_apis_raise_with_a_workaround(shim):
    shim(device="cpu")
    with pytest.raises(cuda_api.UnsupportedCudaAPI, match=r"torch\.cuda\.CUDAGraph .* eagerly"):
        torch.cuda.CUDAGraph()
    with pytest.raises(cuda_api.UnsupportedCudaAPI, match="utilization"):
        torch.cuda.utilization()
    model = torch.nn.Linear(2, 2)
    assert torch.cuda.make_graphed_callables(model, (torch.ones(1, 2),)) is model


def test_every_public_torch_cuda_name_is_classified():
    names = cuda_api.public_names()
    groups = [set(cuda_api.EMULATED), set(cuda_api.EMULATED_CLASSES), set(cuda_api.UNSUPPORTED),
              set(cuda_api.ACCEPTED), set(cuda_api.LEGACY_TENSOR_TYPES)]
    for name in sorted(names):
        hits = sum(name in g for g in groups)
        assert hits == 1, f"torch.cuda.{name} is in {hits} groups (must be exactly one)"


def test_torch_code_gets_the_real_answers(shim):
    shim(device="cpu")
    import torch.utils.data._utils.pin_memory  # noqa: F401  (a torch module calling torch.cuda)

    # Run is_available from a function whose globals claim to be a torch module.
    glb = {"__name__": "torch._fake_internal", "torch": torch}
    exec("def probe():\n    return torch.cuda.is_available(), torch.cuda.device_count()", glb)
    assert glb["probe"]() == (False, 0)
    assert (torch.cuda.is_available(), torch.cuda.device_count()) == (True, 1)


def _reference_module():
    spec = importlib.util.spec_from_file_location(
        "accelerator_reference", Path(__file__).parent / "scripts" / "accelerator_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_accelerator_answers_are_right_for_the_torch_in_use():
    """torch.accelerator under the shim, on the CPU and on two emulated adapters, against torch
    2.13 under the shim (recorded in tests/data by tests/scripts/accelerator_reference.py; on
    torch 2.13 itself all of it must still be equal). Each other torch gets what is right for
    it: before 2.6 (2.4.1), dmlshim's stand-in, with all of 2.13's names and parameters; from
    2.6 on, torch's own module, so the names that torch has, with its parameters (which the
    emulations must take), answering as on 2.13, and the names it lacks left absent, as a
    script calling one finds them on CUDA (torch 2.11 has no empty_host_cache)."""
    ref_mod = _reference_module()
    reference = json.loads(ref_mod.REFERENCE.read_text(encoding="utf-8"))
    got = ref_mod.record()
    native = got["native"]
    assert set(got["emulations"]) == set(reference["signatures"])  # the reference is complete
    if native is None:  # the stand-in: 2.13's module
        assert got["signatures"] == got["emulations"] == reference["signatures"]
    else:
        assert got["signatures"] == native  # wrapped in place: torch's names and parameters
        taken = {name: got["emulations"][name] for name in native}
        assert taken == native, "an emulation's parameters are not this torch's"
    for target, answers in got["targets"].items():
        expected = reference["targets"][target]
        assert set(answers) == set(expected), target
        for key, answer in answers.items():
            if isinstance(answer, dict) and set(answer) == {"absent"}:
                assert native is not None and answer["absent"] not in native, (target, key)
            else:
                assert answer == expected[key], (target, key, answer, expected[key])
    if got["torch"] == reference["torch"]:
        assert got["signatures"] == reference["signatures"]
        assert got["targets"] == reference["targets"]


def test_accelerator_exists_only_under_the_shim(shim):
    native = getattr(torch, "accelerator", None)
    before = {name: getattr(native, name) for name in dir(native)} if native is not None else None
    shim(device="cpu")
    importlib.import_module("torch.accelerator")  # importable under the shim on every torch
    memory = importlib.import_module("torch.accelerator.memory")

    assert torch.accelerator.current_accelerator().type == "cuda"
    assert memory.memory_allocated() == torch.accelerator.memory_allocated()
    dmlshim.uninstall()
    if native is None:  # torch < 2.6: gone again, as torch has it
        assert not hasattr(torch, "accelerator")
        assert "torch.accelerator" not in sys.modules and "torch.accelerator.memory" not in sys.modules
        with pytest.raises(ImportError):
            importlib.import_module("torch.accelerator")
    else:
        assert {name: getattr(torch.accelerator, name) for name in dir(torch.accelerator)} == before


def test_legacy_typed_constructors(shim):
    shim(device="cpu")
    Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
    valid = Tensor(4, 1).fill_(1.0)
    assert valid.shape == (4, 1) and valid.dtype == torch.float32 and valid.device.type == "cpu"
    assert torch.cuda.LongTensor([1, 2]).tolist() == [1, 2]
    assert isinstance(valid, torch.cuda.FloatTensor)
    assert not isinstance(valid, torch.cuda.LongTensor)
    assert torch.ones(2).type(torch.cuda.DoubleTensor).dtype == torch.float64
    assert torch.ones(2).type("torch.cuda.HalfTensor").dtype == torch.float16
    assert torch.ones(2).type(torch.int32).dtype == torch.int32
    assert torch.ones(2).type() == "torch.FloatTensor"
