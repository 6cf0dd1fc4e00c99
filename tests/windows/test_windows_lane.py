"""The Windows lane: dmlshim on the real Windows CPython 3.11.9 under wine (.ci/windows-lane).

Runs only with ``--windows-python PATH`` (tests/conftest.py). What runs here:
- the runner-vs-python matrix of tests/test_runner_matrix.py, on Windows python: exit statuses
  as a Windows parent reads them (all 32 bits), an uncaught Ctrl-C (python's
  STATUS_CONTROL_C_EXIT), a crash (an access violation), ``-m``, ``-c``, paths with spaces and
  backslashes, ``sys.argv``;
- children on the CPU target (DataLoader spawn workers, ``mp.spawn``, a subprocess, torchrun
  with gloo), bad input, ``import dmlshim``, the report;
- the real DirectML.dll on wine 8's d3d12 (lavapipe; no DXIL, so inference kernels only): the
  doctor (and the probe it prints), an inference CNN through ``python -m dmlshim`` with default options,
  compared with the CPU. With ``DMLSHIM_WINDOWS_D3D12`` (wine 9 or newer) every test here runs
  on that real D3D12 library instead, and test_windows_d3d12.py trains there.
Each Windows process imports torch in ~15 s on 2 cores: the cases are few and run in parallel
where they can.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import pytest

from tests.helpers import CORPUS, describe, losses, sitecustomize_logger
from tests.test_runner_matrix import CHILD_SUBSET, _compare, _run, cases, make_tree
from tests.windows.wine import MSVC_RUNTIME, STATUS_ACCESS_VIOLATION, STATUS_CONTROL_C_EXIT

SCRIPTS = Path(__file__).with_name("scripts")
TORCH_TIMEOUT = 600


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("matrix"))


def _probe_lines(stdout: str) -> Dict[str, tuple]:
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "child":
            out[parts[1]] = (parts[2], parts[3])
    return out


# -- runner vs python ------------------------------------------------------------------------

def test_windows_python_reports_windows_statuses(win, tree):
    # the matrix compares something real: these are Windows python's own statuses
    by_name = {c.name: c for c in cases(tree, win)}
    names = ("keyboard-interrupt", "crash", "exit-above-int32", "exit-ntstatus", "exit-2-32",
             "folder-with-spaces", "uncaught-exception")
    got = {n: _run(by_name[n].args, by_name[n], {}, tree, win) for n in names}
    assert got["keyboard-interrupt"].returncode == STATUS_CONTROL_C_EXIT
    assert "KeyboardInterrupt" in got["keyboard-interrupt"].stderr
    assert got["crash"].returncode == STATUS_ACCESS_VIOLATION
    assert got["exit-above-int32"].returncode == 0xFFFFFFFF  # C's exit(int) of 0xC000013A
    assert got["exit-ntstatus"].returncode == STATUS_CONTROL_C_EXIT
    assert got["exit-2-32"].returncode == 0xFFFFFFFF
    assert got["uncaught-exception"].returncode == 1
    spaces = got["folder-with-spaces"]
    assert spaces.returncode == 0, describe(spaces)
    assert r"\\a folder with spaces\\the probe.py', 'x y', 'C:\\a\\b']" in spaces.stdout


@pytest.mark.parametrize("mode", ["cpu", "disabled"])
def test_runner_matches_windows_python(win, tree, mode):
    # every case of the matrix; DMLSHIM_DEVICE=cpu spares each runner run DirectML's probe
    # (a process that imports torch_directml: ~25 s here), default options are tested below;
    # disabled: the cases without torch of the runner's child path
    mode_env: Dict[str, Optional[str]] = (
        {"DMLSHIM_DISABLE": "1"} if mode == "disabled" else {"DMLSHIM_DEVICE": "cpu"})
    subset = CHILD_SUBSET if mode == "disabled" else None
    problems = _compare(tree, mode_env, {}, subset, python=win)
    assert not problems, "\n".join(problems)


def test_runner_with_default_options_matches_windows_python(win, tree):
    # auto: the runner probes DirectML (it finds the adapter) before it starts the interpreter.
    # One case at a time: each probe imports torch_directml (~25 s), and a probe slower than
    # dmlshim's 60 s limit (several at once on 2 cores) reads as an unusable adapter.
    for case in ("keyboard-interrupt", "crash"):
        problems = _compare(tree, {}, {}, {case}, python=win)
        assert not problems, "\n".join(problems)


# -- bad input, import dmlshim, the report ---------------------------------------------------

@pytest.mark.parametrize("how", ["flag", "variable"])
def test_bad_option_exits_2_with_one_line(win, tree, how):
    script = win.path(tree / "exit3.py")
    if how == "flag":
        args, env = ["-m", "dmlshim", "--device", "bogus", script], win.env()
    else:
        args, env = ["-m", "dmlshim", script], win.env(DMLSHIM_DEVICE="bogus")
    proc = win.run(args, env, tree)
    assert proc.returncode == 2, describe(proc)
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, describe(proc)
    assert "DMLSHIM_DEVICE" in proc.stderr and "bogus" in proc.stderr, describe(proc)


def test_import_dmlshim_and_the_report(win, tmp_path):
    report = tmp_path / "run report.json"
    code = ("import dmlshim, torch\n"
            "x = torch.ones(2, 3, device='cuda') * 2\n"
            "print(dmlshim.is_installed(), torch.cuda.is_available(), x.sum().item())\n")
    proc = win.run(["-c", code], win.env(DMLSHIM_DEVICE="cpu", DMLSHIM_REPORT=win.path(report)),
                   tmp_path, timeout=TORCH_TIMEOUT)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["True", "True", "12.0"], describe(proc)
    data = json.loads(report.read_text(encoding="utf-8"))
    assert data["target"]["kind"] == "cpu", data["target"]
    assert data["outcome"] is not None and data["process"], data


def test_a_users_sitecustomize_runs_once_under_the_runner(win, tmp_path):
    # the runner waits for a child interpreter here (no exec): the startup hook keeps its own
    # interpreter from running the user's sitecustomize, which runs once, in the script's
    site, log = sitecustomize_logger(tmp_path, win.path)
    env = win.env(DMLSHIM_DEVICE="cpu")
    env["PYTHONPATH"] = win.pathsep.join([env["PYTHONPATH"], win.path(site)])
    for args in (["script.py"], ["-m", "dmlshim", "script.py"]):
        log.write_text("")
        proc = win.run(args, env, tmp_path, timeout=TORCH_TIMEOUT)
        assert proc.returncode == 0 and proc.stdout.split() == ["script"], describe(proc)
        assert log.read_text().splitlines() == ["['script.py']"], args


def test_every_process_loads_microsofts_cpp_runtime(win, tmp_path):
    # wine 8 prefers its builtin msvcp140 & co. to Microsoft's beside python.exe; a crash seen here
    # must be one a Windows user would meet (tests/windows/wine.py: MSVC_RUNTIME)
    proc = win.run(["-c", "import torch; print(torch.ones(2).sum().item())"],
                   win.env(WINEDEBUG="+loaddll"), tmp_path, timeout=TORCH_TIMEOUT)
    assert proc.returncode == 0 and "2.0" in proc.stdout, describe(proc)
    loaded: Dict[str, set] = {}
    for line in proc.stderr.splitlines():
        # 0024:trace:loaddll:build_module Loaded L"Z:\...\msvcp140.dll" at ...: native
        if ":loaddll:" in line and " Loaded " in line:
            name = line.split('"')[1].rsplit("\\", 1)[-1].lower()
            loaded.setdefault(name, set()).add(line.rsplit(":", 1)[-1].strip())
    # torch loads these three; the rest of Microsoft's runtime, where loaded, natively too
    for dll in ("msvcp140.dll", "vcruntime140.dll", "vcruntime140_1.dll"):
        assert dll in loaded, (dll, sorted(loaded))
    for dll in (name + ".dll" for name in MSVC_RUNTIME):
        assert loaded.get(dll, {"native"}) == {"native"}, (dll, loaded[dll], describe(proc))


# -- children on the CPU target --------------------------------------------------------------

def test_every_kind_of_child_carries_the_shim(win, tmp_path):
    # Windows has spawn only: DataLoader workers, mp.spawn and a subprocess each start python
    proc = win.run(["-m", "dmlshim", win.path(CORPUS / "dist" / "children.py"),
                    "--methods", "spawn"], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                   timeout=TORCH_TIMEOUT)
    assert proc.returncode == 0, describe(proc)
    probes = _probe_lines(proc.stdout)
    kinds = ["parent", "dataloader-spawn", "mp.spawn", "subprocess"]
    assert sorted(probes) == sorted(kinds), describe(proc)
    for kind in kinds:
        assert probes[kind] == ("True", "cpu"), f"{kind}: {probes[kind]}" + describe(proc)


def test_dataloader_spawn_workers_train_like_native(win, tmp_path):
    args = [win.path(CORPUS / "dataloader_workers.py"), "--spawn", "--epochs", "1",
            "--workers", "1"]
    native = win.run(args, win.env(), CORPUS, timeout=TORCH_TIMEOUT)
    assert native.returncode == 0, describe(native)
    shimmed = win.run(["-m", "dmlshim", *args], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                      timeout=TORCH_TIMEOUT)
    assert shimmed.returncode == 0, describe(shimmed)
    assert losses(shimmed.stdout) == losses(native.stdout) != []


def test_torchrun_gloo_ranks_train_like_native(win, tmp_path):
    # ddp_torchrun.py is written for NCCL and falls back to gloo where CUDA is missing, as
    # many scripts do; torch 2.4's Windows build has no libuv for the rendezvous store
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              win.path(CORPUS / "dist" / "ddp_torchrun.py")]
    env = {"USE_LIBUV": "0"}
    native = win.run(launch, win.env(**env), tmp_path, timeout=TORCH_TIMEOUT)
    assert native.returncode == 0, describe(native)
    shimmed = win.run(["-m", "dmlshim", *launch], win.env(DMLSHIM_DEVICE="cpu", **env),
                      tmp_path, timeout=TORCH_TIMEOUT)
    assert shimmed.returncode == 0, describe(shimmed)
    assert losses(shimmed.stdout) == losses(native.stdout) != [], describe(shimmed)


# -- the real DirectML.dll on wine's d3d12 ---------------------------------------------------

def test_the_doctor_and_the_probe_find_the_adapter(win, tmp_path):
    # the doctor prints the probe's answer (a subprocess that imports torch_directml)
    # the doctor's training step runs on the CPU target here: on wine's d3d12 (no DXIL) the
    # wheel's training kernels fail or hang (the step on dml ran past 9 minutes); the probe,
    # which imports the real DirectML.dll and finds the adapter, is what this lane checks
    proc = win.run(["-m", "dmlshim", "--doctor"], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                   timeout=TORCH_TIMEOUT)
    assert "usable:          yes (torch_directml adapter found; probed in a subprocess)" \
        in proc.stdout, describe(proc)
    assert "adapter 0:       llvmpipe" in proc.stdout, describe(proc)
    assert "auto picks:      dml (llvmpipe" in proc.stdout, describe(proc)
    # wine's d3d12 lacks DXIL, so kernels DirectML runs with DXIL shaders only fail there (a
    # training step's, cross entropy's); the doctor's verdict on the kernels it tries is not
    # the adapter's: it may say ok (0) or name the failing kernels (1), the adapter is found
    assert proc.returncode in (0, 1) and "result: " in proc.stdout, describe(proc)


def test_inference_cnn_on_the_adapter_matches_the_cpu(win, tmp_path):
    script = win.path(SCRIPTS / "cnn_inference.py")
    report = tmp_path / "report.json"
    on_dml = win.run(["-m", "dmlshim", script], win.env(DMLSHIM_REPORT=win.path(report)),
                     tmp_path, timeout=TORCH_TIMEOUT)
    assert on_dml.returncode == 0, describe(on_dml)
    assert json.loads(report.read_text(encoding="utf-8"))["target"]["kind"] == "dml"
    on_cpu = win.run(["-m", "dmlshim", script], win.env(DMLSHIM_DEVICE="cpu"), tmp_path,
                     timeout=TORCH_TIMEOUT)
    assert on_cpu.returncode == 0, describe(on_cpu)
    got, expected = _outputs(on_dml.stdout), _outputs(on_cpu.stdout)
    assert len(got) == len(expected) == 40, describe(on_dml)
    assert got != [0.0] * 40
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5, (got, expected)


def _outputs(stdout: str):
    return [float.fromhex(line.split()[1]) for line in stdout.splitlines()
            if line.startswith("out ")]
