"""`python -m dmlshim` behaves like `python script.py`; options are validated in one place."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dmlshim import config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(REPO, "tests", "scripts", "argv_probe.py")


def env(**extra: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    e["PYTHONPATH"] = REPO
    e.update(extra)
    return e


def run(args, cwd=REPO, **extra):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env=env(**extra), timeout=120)


def test_script_sees_what_python_gives_it():
    native = run([PROBE, "0", "x"])
    shimmed = run(["-m", "dmlshim", PROBE, "0", "x"])
    assert shimmed.returncode == native.returncode == 0
    assert shimmed.stdout == native.stdout
    assert "pickled Local" in shimmed.stdout
    assert f"path0 {os.path.realpath(os.path.dirname(PROBE))}" in shimmed.stdout


@pytest.mark.parametrize("code", ["7", "0", "1"])
def test_exit_status_is_the_scripts(code):
    assert run(["-m", "dmlshim", PROBE, code]).returncode == int(code)


def test_uncaught_exception_shows_the_users_traceback_only():
    native = run([PROBE, "raise"])
    shimmed = run(["-m", "dmlshim", PROBE, "raise"])
    assert shimmed.returncode == native.returncode == 1
    assert "ValueError: boom from the script" in shimmed.stderr
    assert "dmlshim" not in shimmed.stderr.replace(PROBE, "")
    assert "runpy" not in shimmed.stderr
    assert shimmed.stderr.count("File ") == native.stderr.count("File ")


def test_missing_script_is_pythons_one_line_and_status_2():
    native = run(["/nonexistent/train.py"])
    shimmed = run(["-m", "dmlshim", "/nonexistent/train.py"])
    assert shimmed.returncode == native.returncode == 2
    assert shimmed.stderr == native.stderr


def test_module_mode():
    native = run(["-m", "pkgmod.main", "a"], cwd=os.path.join(REPO, "tests", "scripts"))
    shimmed = run(["-m", "dmlshim", "-m", "pkgmod.main", "a"],
                  cwd=os.path.join(REPO, "tests", "scripts"))
    assert shimmed.returncode == native.returncode == 3
    assert shimmed.stdout == native.stdout
    missing = run(["-m", "dmlshim", "-m", "no_such_module_xyz"])
    assert missing.returncode == 1 and "No module named" in missing.stderr


@pytest.mark.parametrize("var, value", [
    ("DMLSHIM_DEVICE", "gpu"), ("DMLSHIM_DEVICE", "emulated-dml:0"), ("DMLSHIM_LOG", "loud"),
    ("DMLSHIM_OPTIMIZER", "recreate"), ("DMLSHIM_AMP", "bf16"), ("DMLSHIM_DISABLE", "2"),
    ("DMLSHIM_EMULATOR_GAPS", "fallback,nope"),
])
def test_bad_env_value_exits_2_with_one_line(var, value):
    for args in (["-m", "dmlshim", PROBE], ["-c", "import dmlshim"]):
        proc = run(args, **{var: value})
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert var in lines[0] and repr(value) in lines[0] and "valid values:" in lines[0]


def test_bad_cli_value_names_flag_and_variable():
    proc = run(["-m", "dmlshim", "--optimizer", "nope", PROBE])
    assert proc.returncode == 2
    assert "--optimizer" in proc.stderr and "DMLSHIM_OPTIMIZER" in proc.stderr
    assert "rebind, reset, off" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_wins_over_environment():
    cfg = config.load({"device": "cpu"}, environ={"DMLSHIM_DEVICE": "emulated-dml"})
    assert cfg.device == "cpu" and cfg.sources["device"] == "cli"
    cfg = config.load(environ={"DMLSHIM_DEVICE": "emulated-dml:2"})
    assert cfg.device == "emulated-dml:2" and cfg.sources["device"] == "env"
    assert config.load(environ={}).sources["device"] == "default"


def test_unavailable_directml_request_exits_2():
    proc = run(["-m", "dmlshim", PROBE], DMLSHIM_DEVICE="dml")
    assert proc.returncode == 2
    assert "DMLSHIM_DEVICE=dml" in proc.stderr and "no DirectML adapter" in proc.stderr


def test_disable_makes_import_a_no_op():
    code = "import dmlshim, torch; print(dmlshim.is_installed(), torch.cuda.is_available())"
    assert run(["-c", code], DMLSHIM_DISABLE="1").stdout.split() == ["False", "False"]
    assert run(["-c", code], DMLSHIM_DEVICE="cpu").stdout.split() == ["True", "True"]


def test_auto_without_directml_or_cuda_trains_on_cpu_and_says_why():
    code = "import dmlshim; t = dmlshim.current_target(); print(t.kind); print(t.reason)"
    proc = run(["-c", code], DMLSHIM_LOG="info")
    kind, reason = proc.stdout.splitlines()
    assert kind == "cpu"
    assert "no DirectML" in reason and "CPU" in reason
    assert "target cpu" in proc.stderr


def test_help_lists_every_option():
    proc = run(["-m", "dmlshim", "--help"])
    assert proc.returncode == 0
    for opt in config.OPTIONS:
        assert opt.env in proc.stdout and opt.flag in proc.stdout
