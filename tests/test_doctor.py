"""``python -m dmlshim --doctor``: what it prints and its exit status."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import clean_env, describe

from dmlshim import config, doctor, target


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch, tmp_path):
    """Each test probes DirectML itself (the probe is cached in the environment), on a machine
    without WSL's /dev/dxg whatever machine runs it (tests/test_wsl_path.py has one)."""
    monkeypatch.delenv(target.PROBE_CACHE_ENV, raising=False)
    monkeypatch.setenv(target.DXG_PATH_ENV, str(tmp_path / "no-dxg"))


def run_doctor(capsys, overrides=None, environ=None):
    cfg = config.load(overrides or {}, source="cli", environ=environ or {})
    status = doctor.main(cfg)
    out = capsys.readouterr().out
    return status, out


def option_rows(out: str):
    rows = {}
    section = out.split("options (value, where it came from)\n", 1)[1]
    for line in section.splitlines():
        if not line.startswith("  "):
            break
        name, value, where = line.split()
        rows[name] = (value, where)
    return rows


def test_cpu_setup_can_run(capsys):
    status, out = run_doctor(capsys, {"device": "cpu"}, environ={"DMLSHIM_LOG": "info"})
    assert status == 0, out
    for label in ("OS:", "Python:", "torch:", "torch_directml:", "usable:", "auto picks:",
                  "float64:", "tensor ops:"):
        assert re.search(rf"^  {re.escape(label)} +\S", out, re.M), (label, out)
    import torch

    assert f"torch:           {torch.__version__}" in out
    if target.directml_package_dir() is None:
        assert "torch_directml:  not installed" in out
    else:  # CI's torch 2.4.1 lane has the wheel (and no driver)
        assert re.search(r"^  torch_directml:  0\.2\.5", out, re.M), out
    assert "  tensor ops:      ok" in out
    assert "auto picks:      cpu (" in out and "no DirectML" in out
    assert out.rstrip().splitlines()[-1].startswith("result: ok: CUDA scripts will run on cpu")
    rows = option_rows(out)
    assert set(rows) == {o.name for o in config.OPTIONS}
    assert rows["device"] == ("cpu", "--device")  # from the command line
    assert rows["log"] == ("info", "DMLSHIM_LOG")  # from the environment
    assert rows["optimizer"] == ("rebind", "default")
    assert rows["report"] == ("-", "default")


def test_requested_directml_without_adapter_fails_with_the_reason(capsys):
    status, out = run_doctor(capsys, {"device": "dml"})
    assert status == 1
    problem = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problem == ["problem: DMLSHIM_DEVICE=dml but no DirectML adapter is usable: "
                       f"{target.probe_directml().reason}; use DMLSHIM_DEVICE=auto or cpu"]
    assert out.rstrip().splitlines()[-1].startswith("result: this setup cannot run")
    assert "tensor ops:" not in out  # nothing to try


def test_the_doctor_leaves_the_process_as_it_found_it(capsys):
    import torch

    import dmlshim

    zeros = torch.zeros
    status, _ = run_doctor(capsys, {"device": "cpu"})
    assert status == 0
    assert not dmlshim.is_installed()
    assert torch.zeros is zeros
    assert "torch_directml" not in sys.modules


def test_crashing_directml_is_probed_in_a_subprocess_only(capsys, tmp_path, monkeypatch):
    # A torch_directml that kills the process on import, like the real one on plain Linux
    # (segfault in dml::HardwareAdapter::Enumerate). The doctor must survive and say why.
    pkg = tmp_path / "torch_directml"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(target, "cheap_directml_check", lambda: None)  # as on Windows/WSL
    status, out = run_doctor(capsys, {"device": "auto"})
    assert status == 0, out  # auto falls back to the CPU
    assert "usable:          no (torch_directml probe crashed with signal 11" in out
    assert "probed in a subprocess" in out
    assert "torch_directml" not in sys.modules
    status, out = run_doctor(capsys, {"device": "dml"})
    assert status == 1
    assert "problem: DMLSHIM_DEVICE=dml but no DirectML adapter is usable: torch_directml " \
           "probe crashed with signal 11" in out
    # With WSL's driver there (/dev/dxg), a crashing probe is a problem even for auto, which
    # trains on the CPU meanwhile: the result is not "ok".
    dxg = tmp_path / "dxg"
    dxg.write_text("")
    monkeypatch.setenv(target.DXG_PATH_ENV, str(dxg))
    monkeypatch.delenv(target.PROBE_CACHE_ENV)
    status, out = run_doctor(capsys, {"device": "auto"})
    assert status == 1, out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problems == [f"problem: DirectML is present ({dxg}) but unusable: torch_directml "
                        "probe crashed with signal 11; is LD_LIBRARY_PATH pointing at "
                        "torch_directml's folder? WSL's libraries are in /usr/lib/wsl/lib "
                        "(`ldconfig -p | grep d3d12` should list them); auto trains on the "
                        "CPU meanwhile"], out
    assert "auto picks:      cpu (" in out
    assert out.rstrip().splitlines()[-1].startswith("result: this setup cannot run")


def test_directml_version_pin_mismatch_is_noted(capsys, monkeypatch):
    import torch

    pinned = "2.4.1" if not torch.__version__.startswith("2.4.1") else "2.3.1"  # never installed
    monkeypatch.setattr(doctor, "_directml_distribution", lambda: ("0.2.5.dev240914", pinned))
    status, out = run_doctor(capsys, {"device": "cpu"})
    assert status == 0
    assert f"torch_directml:  0.2.5.dev240914, requires torch=={pinned}" in out
    assert re.search(rf"^note: torch-directml 0\.2\.5\.dev240914 was built for torch "
                     rf"{re.escape(pinned)} but torch \S+ is installed; install "
                     rf"torch=={re.escape(pinned)}$", out, re.M), out


def test_float64_line_follows_the_target(capsys):
    cfg = config.load({"device": "cpu"}, environ={})
    out = doctor._Out()
    dml = target.Target("dml", 2, "test", names=["A", "B"], float64=[True, False])
    assert doctor._float64_line(dml, cfg, out) == "adapter 0: yes, adapter 1: no"
    assert out.notes and "DMLSHIM_FLOAT64=float32" in out.notes[0]
    emu = target.Target("emulated-dml", 1, "test")
    assert doctor._float64_line(emu, cfg, doctor._Out()).startswith("no (")
    no_gap = config.load({"device": "cpu", "emulator_gaps": "fallback"}, environ={})
    assert doctor._float64_line(emu, no_gap, doctor._Out()).startswith("yes")


def test_emulated_directml(capsys):
    status, out = run_doctor(capsys, {"device": "emulated-dml:2"})
    assert status == 0, out
    assert "DMLSHIM_DEVICE:  emulated-dml:2 -> emulated-dml (" in out
    assert "  tensor ops:      ok" in out
    assert "float64:         no (" in out


def test_cli_exit_status(tmp_path):
    # (status 0 for a working setup: test_cpu_setup_can_run; the runner returns main()'s value)
    env = clean_env(DMLSHIM_DEVICE="dml", DMLSHIM_DXG_PATH=str(tmp_path / "no-dxg"))
    bad = subprocess.run([sys.executable, "-m", "dmlshim", "--doctor"], env=env,
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 1, describe(bad)
    assert "problem: DMLSHIM_DEVICE=dml but no DirectML adapter is usable" in bad.stdout
    assert re.search(r"^  device +dml +DMLSHIM_DEVICE$", bad.stdout, re.M), bad.stdout


# -- the way out ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, backend", [
    ("AMD Radeon RX 7900 XTX", "ROCm"), ("AMD Radeon(TM) RX 9070 XT", "ROCm"),
    ("Radeon RX 7600", "ROCm"), ("Intel(R) Arc(TM) A770 Graphics", "XPU"),
    ("Intel(R) Arc(TM) B580 Graphics", "XPU"), ("AMD Radeon RX 6800 XT", None),
    ("AMD Radeon(TM) Graphics", None), ("Intel(R) UHD Graphics 770", None),
    ("NVIDIA GeForce RTX 4090", None), ("Microsoft Basic Render Driver", None),
])
def test_native_backend_note_names_the_way_out(name, backend):
    note = doctor.native_backend_note([name])
    if backend is None:
        assert note is None
    elif backend == "ROCm":
        assert note == (f"adapter {name!r} is a Radeon RX 7000/9000-series GPU: PyTorch on "
                        "Windows with ROCm (AMD's preview builds, ROCm 6.4.4 and later) runs "
                        "CUDA scripts natively there (torch.cuda is the GPU; dmlshim then stays "
                        "inert)")
    else:
        assert note is not None and "Intel Arc GPU: PyTorch's upstream XPU build" in note


def test_doctor_prints_one_info_line_for_a_faked_adapter(capsys, monkeypatch):
    fake = target.DirectMLProbe(True, "torch_directml adapter found", 2,
                                ["AMD Radeon RX 7900 XTX", "AMD Radeon(TM) Graphics"],
                                [False, False])
    monkeypatch.setattr(target, "probe_directml", lambda force=False: fake)
    monkeypatch.setattr(target, "cheap_directml_check", lambda: None)
    status, out = run_doctor(capsys, {"device": "cpu"})
    assert status == 0, out
    assert "  adapter 0:       AMD Radeon RX 7900 XTX (float64: no)" in out
    infos = [line for line in out.splitlines() if line.startswith("info: ")]
    assert infos == ["info: " + doctor.native_backend_note(["AMD Radeon RX 7900 XTX"])]
    monkeypatch.setattr(target, "probe_directml", lambda force=False: target.DirectMLProbe(
        True, "found", 1, ["Intel(R) Arc(TM) A750 Graphics"], [False]))
    status, out = run_doctor(capsys, {"device": "cpu"})
    assert [line for line in out.splitlines() if line.startswith("info: ")] == [
        "info: " + doctor.native_backend_note(["Intel(R) Arc(TM) A750 Graphics"])]
