"""The device rule (dmlshim.devicemap) and every entry point that applies it, on the CPU target."""

from __future__ import annotations

import pytest
import torch

from dmlshim import api, capabilities, config, current, devicemap, events
from dmlshim.target import Target

CPU = torch.device("cpu")


@pytest.fixture
def two_adapters():
    """The rule alone: a session (no patches) whose target has two (pretend) DirectML adapters."""
    target = Target("dml", 2, "test")
    caps = capabilities.of(target)
    shim = api.Shim(target, config.load({}), caps, events.EventLog(),
                    devices=devicemap.DeviceMap(caps))
    before = current.switch(shim)
    try:
        yield
    finally:
        current.switch(before)


@pytest.mark.parametrize("arg, index", [
    ("cuda", None), ("cuda:0", 0), ("cuda:1", 1), (torch.device("cuda"), None),
    (torch.device("cuda", 1), 1), (torch.device("cuda:0"), 0),
])
def test_cuda_values_are_recognised(arg, index):
    assert devicemap.cuda_index(arg) == index
    assert devicemap.is_cuda_device(arg)


@pytest.mark.parametrize("arg", [
    "cpu", "meta", "cudax", "cuda:", "cuda:a", "/data/cuda/model.pt", "my_cuda_run", "CUDA",
    "cuda_checkpoint.pt", torch.device("cpu"), torch.device("meta"), 0, 1, None, 1.0, True,
])
def test_other_values_are_not_cuda(arg):
    assert devicemap.cuda_index(arg) is False
    assert devicemap.map_device(arg) is arg


def test_ints_only_where_torch_reads_them_as_ordinals(two_adapters):
    assert devicemap.map_device(1) == 1
    assert devicemap.map_device(1, int_is_cuda=True) == torch.device("privateuseone", 1)
    assert devicemap.map_device(True, int_is_cuda=True) is True  # bool is not an ordinal


def test_ordinals_map_to_adapters(two_adapters):
    assert devicemap.map_device("cuda") == torch.device("privateuseone", 0)
    assert devicemap.map_device("cuda:1") == torch.device("privateuseone", 1)
    assert devicemap.map_device(torch.device("cuda", 1)) == torch.device("privateuseone", 1)
    devicemap.set_current_index(1)
    assert devicemap.map_device("cuda") == torch.device("privateuseone", 1)


def test_out_of_range_ordinal_is_a_clear_error(two_adapters):
    with pytest.raises(devicemap.DeviceMapError, match=r"cuda:2 requested .* 2 DirectML adapter"):
        devicemap.map_device("cuda:2")


def test_ranks_share_adapters_when_launched_per_rank(two_adapters):
    devicemap.set_wrap_ordinals(True)
    assert devicemap.map_device("cuda:3") == torch.device("privateuseone", 1)


def test_inactive_rule_changes_nothing():
    assert current.session is None
    assert devicemap.map_device("cuda") == "cuda"


# -- entry points, installed on the CPU target ----------------------------------------------

def test_tensor_and_module_conversions(shim):
    shim(device="cpu")
    x = torch.ones(2)
    assert x.cuda().device == CPU
    assert x.cuda(0).device == CPU
    assert x.cuda(device="cuda:0", non_blocking=True).device == CPU
    assert x.to("cuda").device == CPU
    assert x.to(torch.device("cuda", 0), torch.float64).dtype == torch.float64
    assert x.to(device="cuda", dtype=torch.float16).dtype == torch.float16
    assert x.to(0).device == CPU
    assert x.to(torch.float16).dtype == torch.float16  # dtype-only calls untouched
    m = torch.nn.Linear(2, 2)
    assert m.cuda() is m and m.weight.device == CPU
    assert m.to("cuda:0") is m
    assert m.to(device=torch.device("cuda")) is m
    assert m.to_empty(device="cuda").weight.device == CPU


def test_factories_and_constructors(shim):
    shim(device="cpu")
    for make in (
        lambda: torch.zeros(2, device="cuda"),
        lambda: torch.ones(2, device=torch.device("cuda:0")),
        lambda: torch.empty(2, device=0),
        lambda: torch.full((2,), 3.0, device="cuda"),
        lambda: torch.rand(2, device="cuda"),
        lambda: torch.randn(2, device="cuda"),
        lambda: torch.randint(0, 5, (2,), device="cuda"),
        lambda: torch.randperm(4, device="cuda"),
        lambda: torch.arange(3, device="cuda"),
        lambda: torch.linspace(0, 1, 3, device="cuda"),
        lambda: torch.eye(2, device="cuda"),
        lambda: torch.tensor([1.0], device="cuda"),
        lambda: torch.as_tensor([1.0], device="cuda"),
        lambda: torch.empty_strided((2,), (1,), device="cuda"),
        lambda: torch.zeros_like(torch.ones(2), device="cuda"),
        lambda: torch.randn_like(torch.ones(2), device="cuda:0"),
        lambda: torch.ones(2).new_zeros(3, device="cuda"),
        lambda: torch.ones(2).new_tensor([1.0], device="cuda"),
        lambda: torch.nn.Linear(2, 2, device="cuda").weight,
        lambda: torch.nn.Conv2d(1, 1, 3, device="cuda").weight,
    ):
        assert make().device == CPU


def test_default_device_context_and_setter(shim):
    shim(device="cpu")
    with torch.device("cuda"):
        assert torch.zeros(1).device == CPU
        assert torch.nn.Linear(1, 1).weight.device == CPU
    torch.set_default_device("cuda")
    try:
        assert torch.zeros(1).device == CPU
    finally:
        torch.set_default_device(None)
    with torch.device("meta"):  # non-CUDA devices keep working (primed constructor list)
        assert torch.zeros(1).device.type == "meta"


def test_generator_on_cuda_becomes_cpu(shim):
    shim(device="cpu")
    g = torch.Generator(device="cuda")
    g.manual_seed(3)
    assert g.device == CPU
    assert isinstance(g, torch.Generator)
    assert isinstance(torch.default_generator, torch.Generator)
    a = torch.rand(3, generator=g)
    g.manual_seed(3)
    assert torch.equal(a, torch.rand(3, generator=g))


def test_pin_memory_is_a_no_op(shim):
    shim(device="cpu")
    x = torch.ones(2)
    assert x.pin_memory() is x
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2, pin_memory=True,
                                         pin_memory_device="cuda")
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert loader.pin_memory is False


def test_user_checks_take_the_cuda_branch(shim):
    """What a script sees on a CUDA machine, it sees under the shim."""
    shim(device="cpu")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert device.type == "cuda"  # construction is not rewritten
    x = torch.ones(2).to(device)
    assert x.is_cuda  # user code: on the (stand-in) GPU
    # On CUDA, x.device is cuda:0, which != torch.device("cuda") (index None): same here.
    assert (x.device == torch.device("cuda")) is False
    assert str(device) == "cuda"


def test_torch_internals_keep_seeing_the_truth(shim):
    shim(device="cpu")
    from dmlshim.patching import get_original

    assert torch.cuda.is_available() is True  # user code
    assert get_original(torch.cuda, "is_available")() is False
    # torch's own code asks the real question: GradScaler disables itself without CUDA
    # (the AMP patch decides what the script sees); the is_cuda property answers torch honestly.
    import torch.nn.utils.rnn as rnn

    assert rnn.__name__.startswith("torch.")
    x = torch.ones(1)
    assert torch._C.TensorBase.is_cuda.__get__(x) is False


def test_file_paths_containing_cuda_are_never_rewritten(shim, tmp_path):
    shim(device="cpu")
    path = tmp_path / "cuda"
    path.mkdir()
    torch.save(torch.ones(1), str(path / "cuda:0.pt"))
    assert torch.load(str(path / "cuda:0.pt")).tolist() == [1.0]
