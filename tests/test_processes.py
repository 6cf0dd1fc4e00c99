"""Child processes carry the shim: DataLoader workers, multiprocessing, mp.spawn, subprocesses.

In-process tests check the environment a shimmed process hands its children and that
uninstall() takes it back; subprocess tests run scripts that start every kind of child and
ask each child what CUDA looks like to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Tuple

import pytest

from tests.helpers import (
    CORPUS,
    REPO,
    clean_env,
    describe,
    losses,
    run_native,
    run_shim,
    sitecustomize_logger,
)

CHILDREN = CORPUS / "dist" / "children.py"
TIMEOUT = 240
STARTUP_PTH = "dmlshim-startup.pth"  # setup.py's startup hook


def _probe_lines(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "child":
            out[parts[1]] = (parts[2], parts[3])
    return out


def _python(args, env, cwd=None):
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


# -- the environment handed to children ---------------------------------------------------

def test_install_exports_bootstrap_and_options_and_uninstall_restores_environ(shim):
    import dmlshim
    from dmlshim.bootstrap import BOOTSTRAP_DIR

    before = dict(os.environ)
    shim(device="cpu", optimizer="reset", report="/tmp/parent-report.json")
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == BOOTSTRAP_DIR
    assert os.environ["DMLSHIM_BOOTSTRAP"].startswith("1;")  # on, with the record to undo
    assert os.environ["DMLSHIM_DEVICE"] == "cpu"
    assert os.environ["DMLSHIM_OPTIMIZER"] == "reset"
    assert os.environ["DMLSHIM_DISABLE"] == "0"  # the test process has DMLSHIM_DISABLE=1
    assert os.environ["DMLSHIM_REPORT"] == "/tmp/parent-report.json"  # children: report.<pid>
    dmlshim.uninstall()
    assert dict(os.environ) == before


def test_child_sees_its_environment_byte_for_byte_and_still_carries_the_shim(monkeypatch, shim):
    import dmlshim

    # empty entries (the working directory on sys.path) and unset-vs-empty survive
    path = os.pathsep.join([str(REPO), "", "/nonexistent", ""])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("DMLSHIM_LOG", "")
    before = dict(os.environ)
    shim(device="cpu")
    code = ("import os, sys\n"
            "print(repr(os.environ.get('PYTHONPATH')), os.environ.get('DMLSHIM_DISABLE'),"
            " os.environ.get('DMLSHIM_DEVICE'), repr(os.environ.get('DMLSHIM_LOG')),"
            " 'DMLSHIM_BOOTSTRAP' in os.environ, any('bootstrap' in p for p in sys.path))\n"
            "import torch\nprint(torch.cuda.is_available())\n")
    proc = _python(["-c", code], dict(os.environ))
    assert proc.returncode == 0, describe(proc)
    first, second = proc.stdout.splitlines()
    # what this process had before install(): DMLSHIM_DISABLE=1 (conftest), no DMLSHIM_DEVICE
    assert first.split() == [repr(path), "1", "None", "''", "False", "False"], first
    assert second == "True"  # and the child still carries the shim (its options were inherited)
    dmlshim.uninstall()
    assert dict(os.environ) == before


def test_runner_started_by_a_shimmed_process_keeps_its_options(shim):
    # the child's bootstrap takes the exported options out of the script's view (which has this
    # process's DMLSHIM_DISABLE=1); the runner must still see them
    shim(device="emulated-dml:2")
    code = "import torch, dmlshim; print(dmlshim.is_installed(), dmlshim.current_target().count)"
    proc = _python(["-m", "dmlshim", "-c", code], dict(os.environ))
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["True", "2"]


def test_child_environment_record_round_trips_any_value():
    from dmlshim import config
    from dmlshim.bootstrap.sitecustomize import MARKER, undo
    from dmlshim.childenv import ChildEnvironment

    assert MARKER == config.INTERNAL_BY_NAME["bootstrap"].env
    odd = "a;b=c%3B%25 ünï;=;%"
    for base in ({}, {"PYTHONPATH": "", "DMLSHIM_LOG": odd, MARKER: odd},
                 {"PYTHONPATH": os.pathsep + odd + os.pathsep, "DMLSHIM_DEVICE": ""}):
        child = ChildEnvironment({"DMLSHIM_LOG": "debug", "DMLSHIM_DEVICE": None,
                                  "DMLSHIM_REPORT": odd})
        env = child.build(base)
        assert env["PYTHONPATH"].split(os.pathsep)[0] == child.path_prefixes["PYTHONPATH"]
        seen = dict(env)
        inherited = undo(seen, env[MARKER])
        assert seen == base, (base, seen)
        assert inherited["DMLSHIM_LOG"] == "debug" and inherited["DMLSHIM_REPORT"] == odd
        assert inherited.get("DMLSHIM_DEVICE") is None and "DMLSHIM_DEVICE" not in env


def test_uninstall_keeps_what_the_program_changed_meanwhile(shim):
    import dmlshim
    from dmlshim.bootstrap import BOOTSTRAP_DIR

    before_path = os.environ.get("PYTHONPATH")
    shim(device="cpu")
    os.environ["DMLSHIM_LOG"] = "debug"
    os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"] + os.pathsep + "/opt/extra"
    try:
        dmlshim.uninstall()
        assert os.environ["DMLSHIM_LOG"] == "debug"
        entries = os.environ["PYTHONPATH"].split(os.pathsep)
        assert BOOTSTRAP_DIR not in entries and entries[-1] == "/opt/extra"
    finally:
        os.environ.pop("DMLSHIM_LOG", None)
        if before_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before_path


def test_patched_launchers_are_the_originals_after_uninstall(shim):
    import torch.multiprocessing as tmp

    import dmlshim

    spawn_mod = sys.modules["torch.multiprocessing.spawn"]
    originals = (spawn_mod.start_processes, tmp.start_processes)
    shim(device="cpu")
    assert spawn_mod.start_processes is not originals[0]
    dmlshim.uninstall()
    assert spawn_mod.start_processes is originals[0]
    assert tmp.start_processes is originals[1]


def test_spawn_launcher_marks_children_for_rank_ordinals(monkeypatch, shim):
    # (monkeypatch first: it is undone after the shim's uninstall)
    # mp.spawn children call torch.cuda.set_device(rank): they must wrap ordinals, the parent
    # goes back to strict ordinals afterwards.
    import torch.multiprocessing as tmp

    from dmlshim import devicemap

    seen = {}

    def fake_start(*args, **kwargs):
        seen["env"] = os.environ.get("DMLSHIM_WRAP_ORDINALS")
        seen["flag"] = devicemap.active().wrap_ordinals

    spawn_mod = sys.modules["torch.multiprocessing.spawn"]
    monkeypatch.setattr(spawn_mod, "start_processes", fake_start)
    shim(device="cpu")
    assert devicemap.active().wrap_ordinals is False
    tmp.spawn(print, nprocs=2)
    assert seen == {"env": "1", "flag": True}
    assert devicemap.active().wrap_ordinals is False
    assert "DMLSHIM_WRAP_ORDINALS" not in os.environ


# -- the bootstrap itself (children that never import torch stay cheap) -------------------

def test_bootstrap_chains_an_existing_sitecustomize_and_skips_children_without_torch(tmp_path):
    from dmlshim.bootstrap import BOOTSTRAP_DIR

    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = clean_env(DMLSHIM_BOOTSTRAP="1", DMLSHIM_DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, str(other), env["PYTHONPATH"]])
    code = ("import os, sys; print(os.environ.get('CHAINED'), 'torch' in sys.modules, "
            "'dmlshim' in sys.modules, any(p.endswith('bootstrap') for p in sys.path))")
    proc = _python(["-c", code], env, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["yes", "False", "False", "False"], describe(proc)


def _probe_child(env, cwd=None):
    proc = _python([str(CHILDREN), "--probe", "child"], env, cwd=cwd)
    assert proc.returncode == 0, describe(proc)
    return _probe_lines(proc.stdout)["child"]


def test_subprocess_of_an_installed_shim_carries_it_and_disable_wins(shim, tmp_path):
    import dmlshim

    # install() in this process (not the runner) exports everything the child needs; the child
    # finds dmlshim through the bootstrap even though it is not on the child's own path.
    shim(device="cpu")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env["PYTHONPATH"].split(os.pathsep) if Path(p) != REPO)
    assert _probe_child(env, cwd=tmp_path) == ("True", "cpu")
    available, where = _probe_child(dict(env, DMLSHIM_DISABLE="1"), cwd=tmp_path)
    assert available == "False" and where.startswith("error:")  # no CUDA, no shim
    dmlshim.uninstall()
    # nothing leaks: what uninstall() leaves in os.environ is tested above, and without the
    # switch the bootstrap does nothing even if the folder is still on PYTHONPATH
    assert "DMLSHIM_BOOTSTRAP" not in os.environ


def test_python_dash_m_child_carries_the_shim(shim, tmp_path):
    # `python -m pkg` imports pkg (and torch) while sys.argv[0] is still "-m"
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import torch\n")
    (pkg / "__main__.py").write_text(textwrap.dedent("""
        import torch
        print("probe", torch.cuda.is_available(), torch.zeros(1, device="cuda").device)
    """))
    shim(device="cpu")
    proc = _python(["-m", "probepkg"], dict(os.environ), cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["probe", "True", "cpu"]


# -- every kind of child, through the runner ----------------------------------------------

ALL_KINDS = ["parent", "dataloader-fork", "dataloader-spawn", "dataloader-forkserver",
             "mp.spawn", "subprocess"]


@pytest.mark.parametrize("device, args, kinds, expected", [
    ("cpu", (), ALL_KINDS, "cpu"),
    # Fresh interpreters on emulated-dml are covered by the DataLoader, hogwild and DDP tests;
    # here the fork worker, which inherits the registered emulator instead of starting one.
    ("emulated-dml", ("--methods", "fork", "--no-fresh"), ["parent", "dataloader-fork"],
     "privateuseone:0"),
])
def test_every_kind_of_child_carries_the_shim(device, args, kinds, expected, tmp_path):
    proc = run_shim(CHILDREN, *args, device=device, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    probes = _probe_lines(proc.stdout)
    assert sorted(probes) == sorted(kinds), describe(proc)
    for kind in kinds:
        assert probes[kind] == ("True", expected), f"{kind}: {probes[kind]}" + describe(proc)


@pytest.mark.parametrize("device", ["cpu", "emulated-dml"])
def test_dataloader_spawn_workers_train_like_native(device, tmp_path):
    args = ("--spawn", "--epochs", "1", "--workers", "1")
    native = run_native("dataloader_workers.py", *args, timeout=TIMEOUT, cwd=CORPUS)
    assert native.returncode == 0, describe(native)
    shimmed = run_shim("dataloader_workers.py", *args, device=device, timeout=TIMEOUT,
                       cwd=tmp_path)
    assert shimmed.returncode == 0, describe(shimmed)
    assert losses(shimmed.stdout) == losses(native.stdout) != []


# -- hogwild: torch.multiprocessing with spawn and a shared model --------------------------

def _evals(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "eval":
            out[parts[1]] = float.fromhex(parts[2])
    return out


@pytest.mark.parametrize("device", ["cpu", "emulated-dml"])
def test_hogwild_workers_update_the_parents_shared_model(device, tmp_path):
    proc = run_shim("dist/hogwild.py", "--num-processes", "2", device=device, timeout=300,
                    cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    workers = [line for line in proc.stdout.splitlines() if line.startswith("worker ")]
    assert len(workers) == 2, describe(proc)
    evals = _evals(proc.stdout)
    # the parent evaluates its own model object after join(): it improved only if the
    # workers' optimizer steps landed in memory the parent shares
    assert evals["after"] < evals["before"], describe(proc)
    if device == "emulated-dml":
        assert "share_memory(): DirectML memory cannot be shared" in proc.stderr


# -- DirectML tensors and modules across processes (in-process parts) ----------------------

def test_directml_tensor_sent_to_another_process_arrives_as_a_copy_on_the_adapter(shim):
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch

    import dmlshim

    before = dict(ForkingPickler._extra_reducers)
    shim(device="emulated-dml:2")
    t = torch.arange(4.0, device="cuda:1")
    p = torch.nn.Parameter(torch.ones(3, device="cuda"))
    data = ForkingPickler.dumps((t, p, torch.ones(2)))  # what a spawn child / a Queue receives
    got_t, got_p, got_cpu = pickle.loads(data)
    assert got_t.device == torch.device("privateuseone", 1) and got_t.tolist() == t.tolist()
    assert isinstance(got_p, torch.nn.Parameter) and got_p.requires_grad
    assert got_p.device == torch.device("privateuseone", 0)
    assert got_cpu.device.type == "cpu"
    dmlshim.uninstall()
    after = ForkingPickler._extra_reducers
    assert set(after) == set(before) and all(after[k] is before[k] for k in before)


def test_share_memory_on_directml_keeps_the_module_in_cpu_shared_memory(shim):
    import torch
    import torch.nn as nn

    import dmlshim

    original = nn.Module.share_memory
    shim(device="emulated-dml")
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).cuda()
    assert model.share_memory() is model
    assert all(p.device.type == "cpu" and p.is_shared() for p in model.parameters())
    out = model(torch.randn(5, 3, device="cuda"))
    assert out.device == torch.device("privateuseone", 0)  # back where the input came from
    assert model(torch.randn(5, 3)).device.type == "cpu"  # CPU input: nothing moves
    dmlshim.uninstall()
    assert nn.Module.share_memory is original


# -- a launcher that never imports torch ---------------------------------------------------

LAUNCHER = textwrap.dedent("""
    import multiprocessing, os, subprocess, sys
    {first_line}

    def spawned():
        import torch
        print("child mp-spawn", torch.cuda.is_available(), flush=True)

    if __name__ == "__main__":
        print("launcher", sorted(os.environ.items()), flush=True)
        subprocess.run([sys.executable, "train.py", "subprocess"], check=True)
        os.system(f'"{{sys.executable}}" train.py os.system')
        # a child that never imports torch starts the one that does: children of children
        subprocess.run([sys.executable, "-c", "import subprocess, sys; "
                        "subprocess.run([sys.executable, 'train.py', 'grandchild'])"], check=True)
        p = multiprocessing.get_context("spawn").Process(target=spawned)
        p.start()
        p.join()
""")
TRAIN = textwrap.dedent("""
    import os, sys
    seen = sorted(os.environ.items())  # before torch: the environment a child script is given
    import torch
    print("child", sys.argv[1], torch.cuda.is_available(), flush=True)
    print("environ", sys.argv[1], seen, flush=True)
""")


def test_a_launcher_without_torch_passes_the_shim_to_its_whole_process_tree(tmp_path):
    """ddtrace-run and opentelemetry-instrument cover the process tree: so does the runner,
    whether the launcher imports torch or not; the launcher and its children see the
    environment plain python gives them."""
    (tmp_path / "train.py").write_text(TRAIN)
    runs = {}
    for name, via, first_line in (("no-torch", "python", ""), ("no-torch", "runner", ""),
                                  ("torch", "runner", "import torch")):
        (tmp_path / f"launch_{name}.py").write_text(LAUNCHER.format(first_line=first_line))
        args = ["-m", "dmlshim"] if via == "runner" else []
        proc = _python([*args, f"launch_{name}.py"], clean_env(DMLSHIM_DEVICE="cpu"),
                       cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
        runs[name, via] = proc.stdout.splitlines()

    def lines(name, via, head):
        return sorted(line for line in runs[name, via] if line.startswith(head + " "))

    kinds = ["grandchild", "mp-spawn", "os.system", "subprocess"]
    assert lines("no-torch", "python", "child") == [f"child {k} False" for k in kinds], runs
    for name in ("no-torch", "torch"):  # with or without `import torch` in the launcher
        assert lines(name, "runner", "child") == [f"child {k} True" for k in kinds], runs
    # the environment of the launcher and of each child is plain python's until it imports torch
    # (from then on the shim exports itself in os.environ for its children)
    for head in ("launcher", "environ"):
        assert lines("no-torch", "runner", head) == lines("no-torch", "python", head)


def test_a_users_sitecustomize_runs_once_in_a_runner_started_by_a_shimmed_process(shim, tmp_path):
    """The runner's own interpreter is not the script's: there the bootstrap leaves the user's
    sitecustomize to the interpreter the runner becomes, which runs it once, as python does."""
    site, log = sitecustomize_logger(tmp_path)
    shim(device="cpu")  # this process's children carry the bootstrap, first on PYTHONPATH
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["PYTHONPATH"], str(REPO),
                                                       str(site)]))
    for args in (["script.py"], ["-m", "dmlshim", "script.py"]):
        log.write_text("")
        proc = _python(args, env, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout == "script\n", describe(proc)
        assert log.read_text().splitlines() == ["['script.py']"], args


def _environment_with_the_hook(root: Path) -> Tuple[Path, Path]:
    """A virtual environment in ``root`` holding this checkout as ``pip install -e .`` installs
    it: the startup hook (dmlshim-startup.pth, byte for byte), a path entry to the checkout and
    the ``dmlshim`` console script in pip's form; this interpreter's packages (wrapt) on a path
    entry too, without their .pth files (an installed dmlshim's hook among them).
    -> (its python, its console script)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   capture_output=True, timeout=TIMEOUT)
    bindir = root / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / Path(sys.executable).name
    site_dir = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=TIMEOUT).stdout.strip())
    shutil.copyfile(REPO / STARTUP_PTH, site_dir / STARTUP_PTH)
    ours = sysconfig.get_paths()
    # "_" sorts before "d": on sys.path before the hook's line imports _dmlshim_startup, as an
    # editable install's own __editable__ .pth is
    (site_dir / "_dmlshim_checkout.pth").write_text(
        "\n".join(dict.fromkeys([str(REPO), ours["purelib"], ours["platlib"]])) + "\n")
    console = bindir / "dmlshim"
    console.write_text(f"#!{python}\nimport re\nimport sys\nfrom dmlshim.__main__ import main\n"
                       "if __name__ == '__main__':\n"
                       "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                       "    sys.exit(main())\n")
    console.chmod(0o755)
    return python, console


def test_a_users_sitecustomize_runs_once_under_the_runner_and_its_console_script(tmp_path):
    """``python -m dmlshim`` (and ``dmlshim``) is two interpreters where python is one: the
    startup hook (dmlshim-startup.pth, installed with the package) keeps the runner's own from
    running the user's sitecustomize, so it runs once, in the script's, as with python.

    The hook works only where pip puts it, beside the packages (python reads .pth files there,
    not on PYTHONPATH; from a checkout on PYTHONPATH without an install the runner's interpreter
    runs the user's sitecustomize too, and there is no console script). So the runs go through
    an environment holding this checkout's hook as pip installs it, which a bare checkout can
    make too; where dmlshim is installed in this interpreter (README's set-up), its hook must be
    there, the checkout's file."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    installed = sorted(purelib.glob("dmlshim-*.dist-info"))
    if installed:  # setup.py installs the hook with the package (pip install . and -e .)
        hook = purelib / STARTUP_PTH
        assert hook.is_file(), f"{hook} is missing beside {installed[0].name}"
        assert hook.read_bytes() == (REPO / STARTUP_PTH).read_bytes(), hook
    python, console = _environment_with_the_hook(tmp_path / "env")
    site, log = sitecustomize_logger(tmp_path)
    env = clean_env(DMLSHIM_DEVICE="cpu", PYTHONPATH=str(site))
    runs = {"python": [str(python), "script.py"],
            "runner": [str(python), "-m", "dmlshim", "script.py"],
            "console script": [str(console), "script.py"]}
    for name, cmd in runs.items():
        log.write_text("")
        proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
        assert proc.returncode == 0 and proc.stdout == "script\n", (name, describe(proc))
        assert log.read_text().splitlines() == ["['script.py']"], name
