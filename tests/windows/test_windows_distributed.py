"""Distributed launches on Windows torch 2.4.1, which has no libuv for TCPStore (issue 39).

Every store torch 2.4's launchers and ``env://`` create asks for libuv, so natively each of
these stops at rendezvous with ``use_libuv was requested but PyTorch was build without libuv
support`` unless the user knows the workaround (``USE_LIBUV=0``, and ``--standalone`` or
``--rdzv_backend c10d`` for the launchers). Through dmlshim (dmlshim/patches/_store.py) each runs
as the user wrote it: ``python -m dmlshim -m torch.distributed.run`` with and without
``--standalone``, torchrun's own launcher (what the ``torchrun`` console script runs; the lane's
python, unpacked wheels, has no console scripts) starting ``-m dmlshim`` ranks,
``init_process_group(init_method="env://")`` in ranks started by hand, ``accelerate launch``, and
Lightning's DDP strategy. Each: two ranks on the CPU target, their parameters equal, and losses
and parameters equal to the native run with the workaround. Where the lane has a real D3D12
library (``DMLSHIM_WINDOWS_D3D12``: wine's own d3d12 cannot train), the launches run again with
dmlshim's default target, the DirectML adapter (both ranks on the one adapter there is, rank N
taking adapter N mod count): the ranks' parameters equal, the losses within the real lane's
tolerance of the native CPU run's (the adapter's float32 rounding). Lightning's ``devices=2``
on ``accelerator="gpu"`` needs two adapters (as two GPUs), and the lane has one.
"""

from __future__ import annotations

import re
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.helpers import CORPUS, REAL_REL, describe, losses

SCRIPTS = Path(__file__).with_name("scripts")
DIST = CORPUS / "dist"
TIMEOUT = 600
NO_LIBUV = "use_libuv was requested but PyTorch was build without libuv support"
# what a user of torch 2.4.1 on Windows has to know without dmlshim
WORKAROUND = {"USE_LIBUV": "0"}


def _port() -> int:
    # wine's sockets are the host's: a port free here is free for the Windows processes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(stdout: str) -> Dict[str, str]:
    return dict(re.findall(r"^params (\d+) ([0-9a-f]{40})$", stdout, re.M))


def _check_like_native(proc, native, ranks: int = 2) -> None:
    assert proc.returncode == 0, describe(proc)
    params = _params(proc.stdout)
    assert sorted(params) == [str(r) for r in range(ranks)], describe(proc)
    assert len(set(params.values())) == 1, describe(proc)  # every rank holds the same weights
    assert params == _params(native.stdout), describe(proc)
    assert losses(proc.stdout) == losses(native.stdout) != [], describe(proc)


def _check_on_the_adapter(win, launch, native, ranks: int = 2) -> None:
    """Where the lane has a real D3D12 library: ``launch(env)`` with dmlshim's default target
    trains the ranks on the adapter, in sync, near the native CPU run."""
    if not win.native_dlls:
        return
    proc = launch(win.env(DMLSHIM_DEVICE=None, DMLSHIM_LOG="info"))
    assert proc.returncode == 0, describe(proc)
    assert "dmlshim: target dml" in proc.stderr, describe(proc)  # every rank on the adapter
    params = _params(proc.stdout)
    assert sorted(params) == [str(r) for r in range(ranks)], describe(proc)
    assert len(set(params.values())) == 1, describe(proc)  # the ranks' weights in sync
    assert losses(proc.stdout) == pytest.approx(losses(native.stdout), rel=REAL_REL), \
        describe(proc)
    assert losses(native.stdout), describe(native)


# -- torchrun ---------------------------------------------------------------------------------

def _torchrun_args(win, *launcher: str) -> List[str]:
    return ["-m", "torch.distributed.run", *launcher, "--nproc_per_node=2",
            win.path(DIST / "ddp_torchrun.py")]


@pytest.fixture(scope="module")
def native_torchrun(win, tmp_path_factory):
    # the workaround: the standalone rendezvous (c10d backend: no libuv asked for) and
    # USE_LIBUV=0 for the store the ranks join
    proc = win.run(_torchrun_args(win, "--standalone"), win.env(**WORKAROUND),
                   tmp_path_factory.mktemp("native-torchrun"), timeout=TIMEOUT)
    assert proc.returncode == 0, describe(proc)
    return proc


def test_torchrun_static_rendezvous_fails_natively_and_trains_through_the_shim(
        win, tmp_path, native_torchrun):
    launch = _torchrun_args(win, "--master_port", str(_port()))
    native = win.run(launch, win.env(), tmp_path, timeout=TIMEOUT)
    assert native.returncode != 0 and NO_LIBUV in native.stderr, describe(native)
    proc = win.run(["-m", "dmlshim", *launch], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                   timeout=TIMEOUT)
    _check_like_native(proc, native_torchrun)
    assert "backend nccl nccl_available True" in proc.stdout, describe(proc)  # ranks shimmed
    _check_on_the_adapter(win, lambda env: win.run(
        ["-m", "dmlshim", *_torchrun_args(win, "--master_port", str(_port()))], env, tmp_path,
        timeout=TIMEOUT), native_torchrun)


@pytest.mark.parametrize("how", ["shimmed launcher", "torchrun's launcher, shimmed ranks"])
def test_torchrun_standalone_without_the_workaround(win, tmp_path, native_torchrun, how):
    if how == "shimmed launcher":
        args = ["-m", "dmlshim", *_torchrun_args(win, "--standalone")]
    else:  # torchrun --standalone --nproc_per_node=2 -m dmlshim train.py
        args = _torchrun_args(win, "--standalone")
        args[-1:] = ["-m", "dmlshim", args[-1]]
    proc = win.run(args, win.env(DMLSHIM_DEVICE="cpu"), tmp_path, timeout=TIMEOUT)
    _check_like_native(proc, native_torchrun)
    assert "backend nccl nccl_available True" in proc.stdout, describe(proc)
    _check_on_the_adapter(win, lambda env: win.run(args, env, tmp_path, timeout=TIMEOUT),
                          native_torchrun)


# -- init_process_group(init_method="env://"), ranks started by hand --------------------------

def _by_hand(win, cwd: Path, prefix: List[str], **env: Optional[str]):
    cwd.mkdir(exist_ok=True)
    port = str(_port())
    args = [*prefix, win.path(DIST / "ddp_env.py")]

    def rank(r: int):
        rank_env = win.env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2",
                           RANK=str(r), **env)
        return win.run(args, rank_env, cwd, timeout=TIMEOUT)

    with ThreadPoolExecutor(2) as pool:
        ranks = list(pool.map(rank, (0, 1)))
    for proc in ranks:
        assert proc.returncode == 0, describe(proc)
    ranks[0].stdout += ranks[1].stdout  # the params line of rank 1
    return ranks[0]


def test_env_init_in_ranks_started_by_hand(win, tmp_path):
    native = _by_hand(win, tmp_path / "native", [], **WORKAROUND)
    assert "backend gloo device cpu" in native.stdout, describe(native)
    proc = _by_hand(win, tmp_path, ["-m", "dmlshim"], DMLSHIM_DEVICE="cpu")
    assert "backend nccl device cuda:0" in proc.stdout, describe(proc)
    _check_like_native(proc, native)
    _check_on_the_adapter(win, lambda env: _by_hand(win, tmp_path / "adapter", ["-m", "dmlshim"],
                                                    DMLSHIM_DEVICE=None, DMLSHIM_LOG="info"),
                          native)


# -- accelerate launch ------------------------------------------------------------------------

def _accelerate(win, cwd: Path, prefix: List[str], launch: List[str], *script_args: str,
                **env: Optional[str]):
    cwd.mkdir(exist_ok=True)
    args = [*prefix, "-m", "accelerate.commands.launch", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
            str(_port()), *launch, win.path(SCRIPTS / "dist_accelerate.py"), *script_args]
    return win.run(args, win.env(**env), cwd, timeout=TIMEOUT)


def test_accelerate_launch_multi_gpu_two_processes(win, tmp_path):
    # natively: USE_LIBUV=0 and the c10d rendezvous; the script on the CPU (no CUDA here)
    native = _accelerate(win, tmp_path / "native", [],
                         ["--multi_gpu", "--num_processes", "2", "--rdzv_backend", "c10d"],
                         "--cpu", **WORKAROUND)
    assert native.returncode == 0 and "procs 2 device cpu" in native.stdout, describe(native)
    proc = _accelerate(win, tmp_path, ["-m", "dmlshim"], ["--multi_gpu", "--num_processes", "2"],
                       DMLSHIM_DEVICE="cpu")
    assert "procs 2 device cuda:0" in proc.stdout, describe(proc)
    _check_like_native(proc, native)
    _check_on_the_adapter(win, lambda env: _accelerate(
        win, tmp_path / "adapter", ["-m", "dmlshim"], ["--multi_gpu", "--num_processes", "2"],
        DMLSHIM_DEVICE=None, DMLSHIM_LOG="info"), native)


def test_accelerate_launch_num_processes_two_on_one_device(win, tmp_path):
    # without --multi_gpu, accelerate starts several processes only where it sees several GPUs:
    # with one adapter (the CPU target counts as one) it starts one, as natively here (no GPU)
    native = _accelerate(win, tmp_path / "native", [], ["--num_processes", "2"])
    assert native.returncode == 0 and "procs 1 device cpu" in native.stdout, describe(native)
    proc = _accelerate(win, tmp_path, ["-m", "dmlshim"], ["--num_processes", "2"],
                       DMLSHIM_DEVICE="cpu")
    assert "procs 1 device cuda" in proc.stdout, describe(proc)
    _check_like_native(proc, native, ranks=1)


# -- Lightning --------------------------------------------------------------------------------

def test_lightning_ddp_strategy_two_processes(win, tmp_path):
    # Trainer(strategy="ddp", devices=2) on the CPU accelerator: the CPU target has one "GPU",
    # and Lightning, as on a machine with one GPU, refuses devices=2 for accelerator="gpu"
    script = [win.path(SCRIPTS / "dist_lightning.py"), "--accelerator", "cpu"]
    (tmp_path / "native").mkdir()
    native = win.run(script, win.env(**WORKAROUND), tmp_path / "native", timeout=TIMEOUT)
    assert native.returncode == 0 and "world 2" in native.stdout, describe(native)
    proc = win.run(["-m", "dmlshim", *script], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                   timeout=TIMEOUT)
    assert "world 2" in proc.stdout, describe(proc)
    _check_like_native(proc, native)
