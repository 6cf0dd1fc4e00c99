"""torch.distributed for scripts written for NCCL: nccl -> gloo, staging through the CPU on
DirectML, DDP, DataParallel; torchrun and mp.spawn launches with 2 processes.

The launches cost several seconds each on a 2-core machine, so there are few of them: one
native torchrun run as the reference, the same script under the shim on the CPU target and on
emulated-dml, a shimmed launcher, and the mp.spawn script on both targets.
"""

from __future__ import annotations

import re
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import CORPUS, clean_env, describe, losses, run_native, run_shim

DIST = CORPUS / "dist"
LAUNCH_TIMEOUT = 600  # two ranks importing torch on a loaded 2-core machine


def _params(stdout: str) -> dict:
    return dict(re.findall(r"^params (\d+) ([0-9a-f]{40})$", stdout, re.M))


# -- pure rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("requested, cpu, dml", [
    ("nccl", "gloo", "dmlshim"),
    ("NCCL", "gloo", "dmlshim"),
    ("gloo", "gloo", "dmlshim"),
    (None, "gloo", "dmlshim"),
    ("cuda:nccl,cpu:gloo", "gloo", "dmlshim"),
    ("mpi", "mpi", "mpi"),
    ("cpu:gloo,cuda:ucc", "cpu:gloo,cuda:ucc", "cpu:gloo,cuda:ucc"),
])
def test_actual_backend(requested, cpu, dml):
    from dmlshim.patches.distributed import actual_backend

    assert actual_backend(requested, SimpleNamespace(directml=False)) == cpu
    assert actual_backend(requested, SimpleNamespace(directml=True)) == dml


# -- in-process, one rank -----------------------------------------------------------------

@pytest.fixture
def one_rank():
    import torch.distributed as dist

    def init(backend, **kwargs):
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)

    try:
        yield init
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["nccl", "cuda:nccl,cpu:gloo"])
def test_nccl_script_on_cpu_gets_gloo_and_is_told_nccl(shim, one_rank, backend):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    shim(device="cpu")
    assert dist.is_nccl_available() and dist.is_backend_available("nccl")
    one_rank(backend, device_id=torch.device("cuda", 0))
    assert dist.get_backend() == backend
    assert c10d._world.pg_map[c10d._get_default_group()][0] == "gloo"  # what torch sees
    assert dist.get_backend(dist.new_group([0])) == backend  # a subgroup inherits the answer
    assert dist.get_backend(dist.new_group([0], backend="nccl")) == "nccl"
    t = torch.ones(3, device="cuda")
    dist.all_reduce(t)
    dist.barrier()
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_ddp_device_ids_and_set_device_on_cpu(shim, one_rank):
    import torch.nn as nn

    shim(device="cpu")
    one_rank("nccl")
    torch.cuda.set_device(1)  # rank 1 of a torchrun job on a machine with one "GPU"
    model = nn.Linear(4, 2).cuda(1)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[1], output_device=1)
    assert ddp.device_ids is None
    ddp(torch.randn(3, 4, device="cuda")).sum().backward()
    assert model.weight.grad is not None


def test_staging_group_runs_every_collective_through_the_cpu(shim, one_rank):
    # Stage every tensor, CPU ones included: the staging path, without a DirectML device.
    import torch.distributed as dist
    from torch.distributed import Backend

    from dmlshim import events
    from dmlshim.patches.distributed import StagingProcessGroup

    shim(device="cpu")  # the session whose records count the staged collectives
    staged = []

    def create(store, rank, size, timeout):
        return StagingProcessGroup(store, rank, size, timeout,
                                   stage=lambda t: staged.append(t.shape) or True)

    saved = (list(Backend.backend_list), dict(Backend.backend_capability),
             dict(Backend.backend_type_map), dict(Backend._plugins),
             dict(Backend.default_device_backend_map))
    Backend.register_backend("stagetest", create, devices=["cpu"])
    try:
        one_rank("stagetest")
        t = torch.tensor([2.0, 3.0])
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        out = [torch.zeros(2)]
        dist.all_gather(out, t)
        flat = torch.zeros(2)
        with warnings.catch_warnings():  # deprecated in torch 2.13 for all_gather_single,
            warnings.simplefilter("ignore", FutureWarning)  # which torch 2.4 lacks
            dist.all_gather_into_tensor(flat, t)
        dist.barrier()
        objs = [None]
        dist.all_gather_object(objs, {"rank": 0})
        assert t.tolist() == out[0].tolist() == flat.tolist() == [2.0, 3.0]
        assert objs == [{"rank": 0}]
        model = torch.nn.Linear(3, 1)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.randn(4, 3)).sum().backward()
        assert model.weight.grad is not None
        assert events.notes["distributed.staged.allreduce"] >= 2  # the script's + DDP's bucket
        assert events.notes["distributed.staged.broadcast"] >= 2  # the script's + DDP's start
        assert staged
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        Backend.backend_list[:] = saved[0]
        for current, old in zip((Backend.backend_capability, Backend.backend_type_map,
                                 Backend._plugins, Backend.default_device_backend_map),
                                saved[1:]):
            current.clear()
            current.update(old)
        del Backend.STAGETEST


def test_emulated_dml_collectives_and_ddp_on_device_tensors(shim, one_rank):
    import torch.distributed as dist
    import torch.nn as nn

    from dmlshim import events
    from dmlshim.patches.distributed import StagingProcessGroup

    shim(device="emulated-dml")
    one_rank("nccl")
    assert isinstance(dist.group.WORLD, StagingProcessGroup)
    assert dist.get_backend() == "nccl"
    t = torch.full((3,), 2.0, device="cuda")
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    gathered = [torch.zeros(3, device="cuda")]
    dist.all_gather(gathered, t)
    assert t.device.type == gathered[0].device.type == "privateuseone"
    assert gathered[0].tolist() == [2.0, 2.0, 2.0]
    reduced = events.notes["distributed.ddp.all_reduce"]
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).cuda()
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0], output_device=0)
    out = ddp(torch.randn(6, 4, device="cuda"))
    assert out.device.type == "privateuseone"
    out.sum().backward()
    assert model[0].weight.grad.device.type == "privateuseone"
    assert events.notes["distributed.ddp.all_reduce"] == reduced + 1


def _ddp_model():
    import torch.nn as nn

    torch.manual_seed(3)
    return nn.ModuleDict({"body": nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)),
                          "head": nn.Linear(6, 2), "unused": nn.Linear(2, 2)})


def _ddp_forward(module, x):
    return module["head"](module["body"](x)).square().mean()


def test_ddp_backward_on_storage_less_device_with_guards_off_fails_like_the_wheel(shim, one_rank):
    # torch's Reducer reads gradient storage (is_alias_of); torch-directml has none (fact 8)
    import torch.nn as nn

    shim(device="emulated-dml", guards="off")
    one_rank("nccl")
    model = nn.Linear(3, 1).cuda()
    with pytest.raises(NotImplementedError, match="^Cannot access storage of OpaqueTensorImpl$"):
        model.weight.untyped_storage()
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    assert type(ddp) is nn.parallel.DistributedDataParallel
    with pytest.raises(RuntimeError, match="Cannot access storage of OpaqueTensorImpl"):
        ddp(torch.randn(4, 3, device="cuda")).sum().backward()


class _Wrapper(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return _ddp_forward(self.inner, x)


def test_device_ddp_on_adapter_one_no_sync_and_unused_parameters(shim, one_rank):
    import torch.nn as nn

    from dmlshim import events

    reference = _ddp_model()
    xs = [torch.randn(5, 4) for _ in range(3)]
    for x in xs:  # two accumulated micro-batches and one more, as below
        _ddp_forward(reference, x).backward()
    shim(device="emulated-dml:2")
    one_rank("nccl")
    torch.cuda.set_device(1)
    model = _Wrapper(_ddp_model()).cuda(1)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[1], output_device=1,
                                              find_unused_parameters=True)
    assert isinstance(ddp, nn.parallel.DistributedDataParallel) and ddp.module is model
    assert "DistributedDataParallel(" in repr(ddp)
    assert list(ddp.state_dict())[0].startswith("module.inner.")
    before = events.notes["distributed.ddp.all_reduce"]
    with ddp.no_sync():
        ddp(xs[0]).backward()  # a CPU batch goes to the adapter device_ids names
        ddp(xs[1]).backward()
    assert events.notes["distributed.ddp.all_reduce"] == before
    ddp(xs[2]).backward()
    assert events.notes["distributed.ddp.all_reduce"] == before + 1
    inner = model.inner
    assert inner["unused"].weight.grad is None  # unused on every rank: untouched
    for (name, p), ref in zip(inner.named_parameters(), reference.parameters()):
        if ref.grad is None:
            continue
        assert p.grad.device == torch.device("privateuseone", 1), name
        assert torch.allclose(p.grad.cpu(), ref.grad, atol=1e-6), name
    for b, ref in zip(inner.buffers(), reference.buffers()):
        assert torch.equal(b.cpu(), ref), "running statistics"


@pytest.mark.parametrize("count", [1, 2])
def test_data_parallel_on_emulated_adapters(shim, count):
    import torch.nn as nn

    shim(device=f"emulated-dml:{count}")
    torch.manual_seed(0)
    reference = nn.Linear(5, 3)
    x = torch.randn(8, 5)
    expected = reference(x)
    model = nn.DataParallel(nn.Linear(5, 3), device_ids=list(range(count)))
    model.module.load_state_dict(reference.state_dict())
    model = model.cuda()
    out = model(x.cuda())
    assert out.device == torch.device("privateuseone", 0)
    assert torch.allclose(out.cpu(), expected, atol=1e-6)
    assert isinstance(model, nn.DataParallel) and model.module.weight.device == out.device


def test_uninstall_restores_every_distributed_attribute(shim):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed import Backend

    import dmlshim

    names = ("init_process_group", "new_group", "get_backend", "is_nccl_available",
             "is_backend_available")
    before = {(o.__name__, n): getattr(o, n) for o in (dist, c10d) for n in names}
    ddp_init = torch.nn.parallel.DistributedDataParallel.__init__
    dp_init = torch.nn.DataParallel.__init__
    store_init = vars(dist.TCPStore)["__init__"]
    registry = (list(Backend.backend_list), dict(Backend.default_device_backend_map),
                dict(Backend.backend_capability), dict(Backend._plugins))
    shim(device="emulated-dml")
    assert "dmlshim" in Backend.backend_list
    dmlshim.uninstall()
    for (owner, name), value in before.items():
        assert getattr(sys.modules[owner], name) is value, name
    assert torch.nn.parallel.DistributedDataParallel.__init__ is ddp_init
    assert torch.nn.DataParallel.__init__ is dp_init
    assert vars(dist.TCPStore)["__init__"] is store_init
    assert (list(Backend.backend_list), dict(Backend.default_device_backend_map),
            dict(Backend.backend_capability), dict(Backend._plugins)) == registry
    assert not hasattr(Backend, "DMLSHIM")


# -- TCPStore: libuv where torch has it -----------------------------------------------------
# torch 2.4's Windows wheels lack the libuv backend every launcher's store asks for; there the
# shim gives the stores the socket backend (tests/windows/test_windows_distributed.py). Linux
# torch has libuv: the stores must stay exactly as asked.

_STORES = """
import datetime, sys
import torch.distributed as dist
if sys.argv[1:] == ["shim"]:
    import dmlshim
    dmlshim.install(device="cpu")
kinds = []
for kw in ({}, {"use_libuv": True}, {"use_libuv": False}):
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, **kw)
    store.set("k", "v")
    kinds.append((store.libuvBackend, store.get("k").decode()))
positional = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30), False,
                           False, None, False)
kinds.append((positional.libuvBackend, None))
print(kinds)
if sys.argv[1:] == ["shim"]:
    from dmlshim import current, events
    print(current.session.patch("distributed").store_backend.has_libuv,
          dict(events.summary_dict()["api_counts"]).get("TCPStore(use_libuv)"))
"""


def test_tcpstores_keep_libuv_where_torch_has_it(tmp_path):
    script = tmp_path / "stores.py"
    script.write_text(_STORES)
    native = run_native(str(script), cwd=tmp_path)
    assert native.returncode == 0, describe(native)
    assert native.stdout.splitlines() == [
        "[(True, 'v'), (True, 'v'), (False, 'v'), (False, None)]"], describe(native)
    shimmed = run_native(str(script), "shim", cwd=tmp_path)
    assert shimmed.returncode == 0, describe(shimmed)
    # the same backends, the answer remembered, no request changed
    assert shimmed.stdout.splitlines() == native.stdout.splitlines() + ["True None"], \
        describe(shimmed)


@pytest.mark.parametrize("args, kwargs, asks", [
    (("h", 1), {}, True),
    (("h", 1), {"use_libuv": False}, False),
    (("h", 1, 2, True, None, True, False, None, False), {}, False),
    (("h", 1, 2, True, None, True, False, None, True), {}, True),
])
def test_a_libuv_request_is_read_and_dropped_where_it_was_made(args, kwargs, asks):
    from dmlshim.patches import _store

    assert _store._asks_for_libuv(args, kwargs) is asks
    new_args, new_kwargs = _store._without_libuv(args, kwargs)
    assert not _store._asks_for_libuv(new_args, new_kwargs)
    assert len(new_args) == len(args) and new_args[:8] == args[:8]


# -- torchrun and mp.spawn, 2 processes ---------------------------------------------------
# Each DDP run is checked three ways: its ranks end with the same parameters, its losses equal a
# native gloo run's (bit for bit: the emulator computes with the CPU's kernels and DDP's
# arithmetic, grad / world summed over ranks, is kept), and rank 0's checkpoint equals, within
# float32 rounding, one process trained on the same global batches (ddp_reference.py). On
# emulated-dml:2 every rank has its own adapter and the emulator refuses storage access, as
# torch-directml does (fact 8), so torch's Reducer cannot run there.

def _torchrun(*args, device=None, launcher=("torchrun",), timeout=LAUNCH_TIMEOUT, **extra):
    import subprocess

    env = clean_env(**({"DMLSHIM_DEVICE": device} if device else {}), **extra)
    if launcher == ("torchrun",):
        cmd = [str(_torchrun_exe())]
    else:
        cmd = [sys.executable, *launcher]
    cmd += ["--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, env=env, cwd=str(DIST), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _torchrun_exe():
    from pathlib import Path

    exe = Path(sys.executable).with_name("torchrun")
    return exe if exe.exists() else "torchrun"


@pytest.fixture(scope="module")
def native_torchrun(tmp_path_factory):
    proc = _torchrun("ddp_torchrun.py")
    assert proc.returncode == 0, describe(proc)
    return proc


def _reference(script: str, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("reference") / f"{script}.pt"
    # ddp_torchrun.py steps once per batch (the reference's --accum 1)
    proc = run_native(DIST / "ddp_reference.py", script, "--accum", "1", "--save", str(ckpt))
    assert proc.returncode == 0, describe(proc)
    return losses(proc.stdout), torch.load(ckpt, map_location="cpu")


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory):
    return _reference("torchrun", tmp_path_factory)


@pytest.fixture(scope="module")
def spawn_reference(tmp_path_factory):
    return _reference("spawn", tmp_path_factory)


def _flat_state(state) -> dict:
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in _flat_state(value).items()})
        elif isinstance(value, torch.Tensor):
            out[key] = value
    return out


def _check_against_reference(proc, ckpt, reference):  # ckpt None: losses only
    ref_losses, ref_state = reference
    got = losses(proc.stdout)
    assert len(got) == len(ref_losses) > 0, describe(proc)
    # float32 rounding: DDP sums grad/2 over ranks, the reference backpropagates loss/2
    assert got == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), describe(proc)
    if ckpt is None:
        return
    state = _flat_state(torch.load(ckpt, map_location="cpu"))  # loads without dmlshim
    expected = _flat_state(ref_state)
    assert state.keys() == expected.keys()
    for key, value in state.items():
        assert value.device.type == "cpu", key
        assert torch.allclose(value.double(), expected[key].double(), rtol=1e-5, atol=1e-6), key


def _check_ddp_run(proc, native):
    assert proc.returncode == 0, describe(proc)
    params = _params(proc.stdout)
    assert set(params) == {"0", "1"} and params["0"] == params["1"], describe(proc)
    assert losses(proc.stdout) == losses(native.stdout) != [], describe(proc)
    assert params == _params(native.stdout)
    assert "backend nccl nccl_available True" in proc.stdout
    for rank in (0, 1):
        assert re.search(rf"^collectives {rank} broadcast=\[2.0, 2.0\] all_gather=\[0.0, 1.0\]",
                         proc.stdout, re.M), describe(proc)


def test_torchrun_ddp_written_for_nccl_on_cpu(native_torchrun, torchrun_reference, tmp_path):
    proc = _torchrun("-m", "dmlshim", "ddp_torchrun.py", device="cpu")
    _check_ddp_run(proc, native_torchrun)
    _check_against_reference(proc, None, torchrun_reference)
    assert "on=cpu" in proc.stdout


def test_torchrun_ddp_written_for_nccl_on_two_emulated_adapters(native_torchrun,
                                                                 torchrun_reference, tmp_path):
    # python -m torch.distributed.run is torchrun; rank N trains on adapter N
    proc = _torchrun("-m", "dmlshim", "ddp_torchrun.py", device="emulated-dml:2",
                     launcher=("-m", "torch.distributed.run"))
    _check_ddp_run(proc, native_torchrun)
    _check_against_reference(proc, None, torchrun_reference)
    for rank in (0, 1):
        assert re.search(rf"^collectives {rank} .* on=privateuseone:{rank}$", proc.stdout, re.M), \
            describe(proc)


def test_shimmed_launcher_passes_the_shim_to_its_ranks(native_torchrun):
    # python -m dmlshim -m torch.distributed.run train.py: the ranks get it through the
    # bootstrap; two ranks share the one emulated adapter
    proc = _torchrun("ddp_torchrun.py", launcher=("-m", "dmlshim", "--device", "emulated-dml",
                                                  "-m", "torch.distributed.run"))
    _check_ddp_run(proc, native_torchrun)
    assert "on=privateuseone:0" in proc.stdout and "on=privateuseone:1" not in proc.stdout


def test_mp_spawn_ddp_on_cpu_and_two_emulated_adapters(tmp_path, spawn_reference):
    # BatchNorm buffers from rank 0, find_unused_parameters with a head used on even steps
    runs = {}
    for device in ("cpu", "emulated-dml:2"):
        ckpt = tmp_path / f"{device.replace(':', '')}.pt"
        proc = run_shim("dist/ddp_spawn.py", "--nprocs", "2", "--save", str(ckpt),
                        device=device, timeout=LAUNCH_TIMEOUT, cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
        params = _params(proc.stdout)
        assert set(params) == {"0", "1"} and params["0"] == params["1"], describe(proc)
        _check_against_reference(proc, ckpt, spawn_reference)
        runs[device] = proc
    cpu, emulated = runs["cpu"], runs["emulated-dml:2"]
    assert losses(emulated.stdout) == losses(cpu.stdout) != []
    assert _params(emulated.stdout) == _params(cpu.stdout)


@pytest.mark.parametrize("device", ["cpu", "emulated-dml:2"])
def test_reduce_op_avg_averages_as_nccl_does(device):
    # Lightning's self.log(sync_dist=True), told "nccl", averages so; gloo has no AVG
    proc = run_shim("dist/average.py", device=device, timeout=300)
    assert proc.returncode == 0, describe(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("avg ")]
    assert lines == ["avg float [1.5, 3.0, -2.0]",
                     "avg int64 [2, 7, -3] torch.int64",  # 5/2, 14/2, -7/2: toward zero
                     "avg scatter [0.0, 1.5, 3.0, 4.5]"], describe(proc)


def test_reduce_op_avg_on_gloo_asked_for_is_torchs_own():
    # a script that asks for gloo gets gloo's answer, as without dmlshim
    native = run_native(CORPUS / "dist" / "average.py", "--backend", "gloo")
    shimmed = run_shim("dist/average.py", "--backend", "gloo", device="cpu", timeout=300)
    assert "avg float" not in shimmed.stdout, describe(shimmed)
    assert (native.returncode == 0) == (shimmed.returncode == 0), describe(shimmed)
