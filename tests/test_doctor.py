"""``python -m dmlshim --doctor``: what it prints and its exit status."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import clean_env, describe

from dmlshim import config, doctor, doctor_step, target

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch, tmp_path):
    """Each test probes DirectML itself (the probe is cached in the environment), on a machine
    without WSL's /dev/dxg whatever machine runs it (tests/test_wsl_path.py has one)."""
    monkeypatch.delenv(target.PROBE_CACHE_ENV, raising=False)
    monkeypatch.setenv(target.DXG_PATH_ENV, str(tmp_path / "no-dxg"))


@pytest.fixture
def no_step(monkeypatch):
    """For tests of the other rows: the training step (a child process, seconds) answers ok."""
    monkeypatch.setattr(doctor_step, "run", lambda cfg: doctor_step.StepResult(
        True, device="cpu", float64="float64"))


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
                  "float64:", "training step:"):
        assert re.search(rf"^  {re.escape(label)} +\S", out, re.M), (label, out)
    import torch

    assert f"torch:           {torch.__version__}" in out
    if target.directml_package_dir() is None:
        assert "torch_directml:  not installed" in out
    else:  # CI's torch 2.4.1 lane has the wheel (and no driver)
        assert re.search(r"^  torch_directml:  0\.2\.5", out, re.M), out
    assert re.search(r"^  training step:   ok on cpu: conv2d, batch_norm \(training mode\), "
                     r"cross_entropy, backward, AdamW match the CPU within 0\.002 \(largest "
                     r"difference \S+\)$", out, re.M), out
    assert "  float64:         yes; a float64 op ran on cpu\n" in out
    assert "auto picks:      cpu (" in out and "no DirectML" in out
    assert out.rstrip().splitlines()[-1].startswith("result: ok: CUDA scripts will run on cpu")
    rows = option_rows(out)
    # named as the flags are (--emulator-gaps: emulator-gaps), in aligned columns
    assert set(rows) == {o.flag[2:] for o in config.OPTIONS}
    section = out.split("options (value, where it came from)\n", 1)[1].splitlines()[:len(rows)]
    for column in (1, 2):
        starts = {len(line) - len(line.lstrip()) if column == 0 else
                  line.index(line.split()[column], len(line.split()[0]) + 2) for line in section}
        assert len(starts) == 1, (column, section)
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
    assert "training step:" not in out  # nothing to try


def _directml_extra_pin() -> str:
    """The torch-directml version pyproject.toml's ``directml`` extra installs."""
    pyproject = open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8").read()
    return re.search(r'^directml = \[\s*"torch-directml==([^;"]+)', pyproject, re.M).group(1)


def test_missing_torch_directml_names_an_install_that_works(capsys, monkeypatch, tmp_path):
    # dmlshim is not on the package index: `pip install "dmlshim[directml]"` finds nothing
    # (README and docs/install.md). The doctor must name what does work: the checkout's extra, as
    # they say, or the wheel itself at the extra's version.
    monkeypatch.setattr(doctor, "_directml_distribution", lambda: (None, None))
    monkeypatch.setattr(target, "directml_package_dir", lambda: None)
    dxg = tmp_path / "dxg"  # a driver present: the reason is then the missing package
    dxg.write_text("")
    monkeypatch.setenv(target.DXG_PATH_ENV, str(dxg))
    status, out = run_doctor(capsys, {"device": "dml"})
    assert status == 1, out
    hint = (f'from the dmlshim checkout, pip install -e ".[directml]", or pip install '
            f"torch-directml=={_directml_extra_pin()} into an environment with torch 2.4.1")
    assert f"  torch_directml:  not installed ({hint})\n" in out, out
    assert (f"  usable:          no (torch_directml is not installed ({hint}); checked without "
            "importing)\n") in out, out
    assert f"no DirectML adapter is usable: torch_directml is not installed ({hint}); " in out
    assert "dmlshim[directml]" not in out
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    guide = open(os.path.join(REPO, "docs", "install.md"), encoding="utf-8").read()
    for install in (readme.split("\n## Install", 1)[1].split("\n## ", 1)[0], guide):
        assert 'pip install -e ".[directml]"' in install and _directml_extra_pin() in install


@pytest.mark.parametrize("machine, implementation", [("ARM64", "CPython"), ("AMD64", "PyPy")])
def test_where_torch_directml_has_no_wheel_the_doctor_says_which_python_to_use(
        capsys, monkeypatch, no_step, machine, implementation):
    # There the checkout's extra installs nothing (its marker skips the wheel): repeating it
    # would leave the user where they are.
    import platform

    monkeypatch.setattr(doctor, "_directml_distribution", lambda: (None, None))
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(platform, "python_implementation", lambda: implementation)
    status, out = run_doctor(capsys, {"device": "cpu"})
    row = next(line for line in out.splitlines() if line.startswith("  torch_directml:"))
    assert row == (f"  torch_directml:  not installed (torch-directml has no wheel for "
                   f"{implementation} {platform.python_version()} (64-bit) on {sys.platform} "
                   f"{machine}: make a virtual environment of 64-bit CPython 3.9-3.11 on Windows "
                   'x64 or Linux x86-64 and there, from the dmlshim checkout, pip install -e '
                   '".[directml]")'), row


def test_the_doctor_leaves_the_process_as_it_found_it(capsys):
    import torch

    import dmlshim

    zeros = torch.zeros
    status, _ = run_doctor(capsys, {"device": "cpu"})
    assert status == 0
    assert not dmlshim.is_installed()
    assert torch.zeros is zeros
    assert "torch_directml" not in sys.modules


def test_crashing_directml_is_probed_in_a_subprocess_only(capsys, tmp_path, monkeypatch, no_step):
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


def test_directml_version_pin_mismatch_is_noted(capsys, monkeypatch, no_step):
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
    assert "  training step:   ok on privateuseone:0: conv2d, " in out
    assert "  float64:         no (the emulator reproduces adapters without float64: emulator " \
           "gap 'float64'); a float64 tensor made on cuda became float32\n" in out


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


def test_doctor_prints_one_info_line_for_a_faked_adapter(capsys, monkeypatch, no_step):
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


# -- the training step: what a wrong or failing kernel makes of the result ----------------------


def problems_of(out: str):
    return [line for line in out.splitlines() if line.startswith("problem: ")]


def test_running_statistics_not_updated_fail_the_step_unless_a_guard_repairs_them(capsys):
    # bug-bn-stats: training-mode batch norm leaves running_mean/var as they were (#362).
    buggy = {"device": "emulated-dml", "emulator_gaps": "all,bug-bn-stats"}
    status, out = run_doctor(capsys, {**buggy, "guards": "off"})
    assert status == 1, out
    assert re.search(r"^  training step:   FAILED: differs from the CPU: batch_norm running_mean: "
                     r"largest \|device - CPU\| \S+ where the CPU's values reach \S+$", out,
                     re.M), out
    assert problems_of(out)[0].startswith(
        "problem: the training step on privateuseone:0 differs from the CPU's (pointing at "
        "batch_norm forward (training mode)): batch_norm running_mean: "), out
    assert problems_of(out)[0].endswith(
        "also batch_norm running_var; with DMLSHIM_GUARDS=on the step trains right: run scripts "
        "with DMLSHIM_GUARDS=on"), out
    assert out.rstrip().splitlines()[-1].startswith("result: this setup cannot run")
    status, out = run_doctor(capsys, buggy)  # guards on (the default): repaired
    assert status == 0, out
    assert "  training step:   ok on privateuseone:0" in out


def _site_dir(tmp_path, monkeypatch, code: str):
    """A sitecustomize for the step's child process: what an adapter's kernel would do."""
    (tmp_path / "sitecustomize.py").write_text(code)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))


BN_BACKWARD = '''
import os
import torch
import emulated_dml

def kernel(*args, **kwargs):
{body}

for name in ("native_batch_norm_backward", "batch_norm_backward"):
    emulated_dml.register_device_kernel(name, kernel)
'''


def test_a_batch_norm_backward_that_raises_is_named(capsys, tmp_path, monkeypatch):
    _site_dir(tmp_path, monkeypatch, BN_BACKWARD.format(
        body="    raise RuntimeError('Invalid parameter.')"))
    status, out = run_doctor(capsys, {"device": "emulated-dml"})
    assert status == 1, out
    part = "batch_norm (training mode) backward (NativeBatchNormBackward0)"
    assert f"  training step:   FAILED: {part}: RuntimeError: Invalid parameter.\n" in out
    assert problems_of(out)[0] == (
        f"problem: the training step failed on privateuseone:0 in {part}: RuntimeError: Invalid "
        "parameter.; the emulated adapter reproduces a torch-directml bug that the options in "
        "force do not work around (DMLSHIM_EMULATOR_GAPS=all)"), out


def test_a_wrong_batch_norm_gradient_is_found(capsys, tmp_path, monkeypatch):
    # the kernel computes on the CPU and doubles every result: the gradients of batch norm's
    # own parameters are the first (in backward order) that differ
    body = ("    dev = args[0].device\n"
            "    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]\n"
            "    op = getattr(torch.ops.aten, kernel.name)\n"
            "    outs = op(*cpu, **kwargs)\n"
            "    return tuple(None if o is None else (o * 2).to(dev) for o in outs)")
    code = BN_BACKWARD.format(body=body).replace(
        "    emulated_dml.register_device_kernel(name, kernel)",
        "    def bound(*a, _n=name, **k):\n        kernel.name = _n\n        return kernel(*a, **k)\n"
        "    emulated_dml.register_device_kernel(name, bound)")
    _site_dir(tmp_path, monkeypatch, code)
    status, out = run_doctor(capsys, {"device": "emulated-dml"})
    assert status == 1, out
    assert "  training step:   FAILED: differs from the CPU: gradient of batch_norm weight: " in out
    assert problems_of(out)[0].startswith(
        "problem: the training step on privateuseone:0 differs from the CPU's (pointing at "
        "batch_norm backward (training mode)): gradient of batch_norm weight: "), out


def test_a_crash_in_the_step_names_the_part_and_the_signal(capsys, tmp_path, monkeypatch):
    _site_dir(tmp_path, monkeypatch, BN_BACKWARD.format(body="    os.abort()"))
    status, out = run_doctor(capsys, {"device": "emulated-dml"})
    assert status == 1, out
    assert "  training step:   FAILED: batch_norm (training mode) backward " \
           "(NativeBatchNormBackward0): the process died with signal 6 (SIGABRT)" in out
    assert out.rstrip().splitlines()[-1].startswith("result: this setup cannot run")
    import dmlshim

    assert not dmlshim.is_installed()  # the step ran in a child process


def test_float64_is_claimed_only_after_a_float64_op_worked(capsys, tmp_path, monkeypatch):
    # The target says float64 (emulator gap off, as has_float64_support() says True on the
    # software adapter) but every float64 op raises on the device.
    _site_dir(tmp_path, monkeypatch, (
        "import emulated_dml\nfrom emulated_dml import _state\n_register = emulated_dml.register\n"
        "def register(*args, **kwargs):\n    _register(*args, **kwargs)\n"
        "    _state.state.float64 = True\nemulated_dml.register = register\n"))
    status, out = run_doctor(capsys, {"device": "emulated-dml", "emulator_gaps": "fallback"})
    assert status == 1, out
    assert re.search(r"^  float64:         no \(error: RuntimeError: The GPU device does not "
                     r"support Double \(Float64\) operations!; the target said yes \(emulator "
                     r"gap 'float64' is off\)\)$", out, re.M), out
    assert "  training step:   ok on privateuseone:0" in out
    assert problems_of(out) == [
        "problem: float64: the target says yes (emulator gap 'float64' is off), but a float64 op "
        "on privateuseone:0 gave error: RuntimeError: The GPU device does not support Double "
        "(Float64) operations!; scripts that use double tensors fail there: make them float32 "
        "(x.float()) and report this output to dmlshim"], out
    monkeypatch.delenv("PYTHONPATH")
    status, out = run_doctor(capsys, {"device": "emulated-dml", "emulator_gaps": "fallback"})
    assert status == 0, out
    assert "  float64:         yes (emulator gap 'float64' is off); a float64 op ran on " \
           "privateuseone:0\n" in out


def test_the_step_result_survives_its_child_dying():
    out = "\n".join([f"{doctor_step.MARK} part \"starting\"",
                     f"{doctor_step.MARK} device \"privateuseone:0\"",
                     f"{doctor_step.MARK} part \"conv2d forward\""])
    err = ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call "
           "first):\n  File \"" + os.path.join(os.path.dirname(doctor.__file__), "kernels",
                                               "guards", "shape.py") + "\", line 7 in flip\n")
    got = doctor_step.parse(out, err, -11)
    assert (got.ok, got.device, got.failed, got.crashed) == (False, "privateuseone:0",
                                                             "conv2d forward", True)
    assert got.error == "the process died with signal 11 (SIGSEGV) (Fatal Python error: " \
                        "Segmentation fault)"
    assert got.shim_site == "dmlshim/kernels/guards/shape.py:7 in flip"
