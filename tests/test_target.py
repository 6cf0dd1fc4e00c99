"""Target resolution and the DirectML probe: never crash, explain the choice.

On CI's second lane the real torch-directml 0.2.5 wheel is installed on a machine without a
DirectML driver: there the probe must conclude "no usable adapter" (its device calls raise or
segfault — in a subprocess) and `auto` must fall back to the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dmlshim import target

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_DIRECTML = target.directml_package_dir() is not None


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    e.update({"PYTHONPATH": REPO, **env})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=180)


def test_cheap_check_decides_on_dev_dxg_first(tmp_path, monkeypatch):
    # No /dev/dxg on Linux: no adapter, whatever is installed (nothing is imported to know it).
    missing = tmp_path / "dxg"
    monkeypatch.setenv(target.DXG_PATH_ENV, str(missing))
    if sys.platform.startswith("linux"):
        assert target.cheap_directml_check() == (
            f"no {missing}: DirectML on Linux needs WSL2's GPU driver")
        assert not target._driver_present()
    missing.write_text("")  # as on WSL: then whether the wheel is there
    reason = target.cheap_directml_check()
    if HAS_DIRECTML:
        assert reason is None  # the subprocess probe decides
    else:
        assert reason is not None and "not installed" in reason
    assert "torch_directml" not in sys.modules


def test_forced_probe_runs_in_a_subprocess_and_survives_whatever_happens_there():
    # force=True skips the cheap checks: with the real wheel and no driver the child raises
    # "Unknown error" or segfaults; this process must only learn "not usable" and why.
    probe = target.probe_directml(force=True)
    if HAS_DIRECTML and os.path.exists(target.dxg_path()):
        assert probe.usable == (probe.count > 0)
    else:
        assert probe.usable is False
        assert probe.reason.startswith("torch_directml ")
        if HAS_DIRECTML:
            assert "probe" in probe.reason  # crashed, failed or found nothing: said which
    assert os.environ[target.PROBE_CACHE_ENV] == json.dumps(target.asdict(probe))
    assert target.probe_directml() == probe  # cached for the process (in its environment)


def test_children_reuse_the_cached_probe():
    fake = {"usable": False, "reason": "cached by the parent", "count": 0, "names": [],
            "float64": [], "version": None}
    proc = run_py("from dmlshim import target; print(target.probe_directml().reason)",
                  DMLSHIM_DISABLE="1", DMLSHIM_PROBE_CACHE=json.dumps(fake))
    assert proc.stdout.strip() == "cached by the parent", proc.stderr


def test_auto_falls_back_to_the_cpu_without_crashing(tmp_path):
    proc = run_py("import dmlshim, torch; t = dmlshim.current_target(); "
                  "print(t.kind, torch.zeros(2, device='cuda').device)",
                  DMLSHIM_DXG_PATH=str(tmp_path / "dxg"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "cpu"]
    assert "DirectML is present" not in proc.stderr


def test_explicit_dml_without_an_adapter_is_one_clear_line(tmp_path):
    proc = run_py("import dmlshim", DMLSHIM_DEVICE="dml:1", DMLSHIM_DXG_PATH=str(tmp_path / "x"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no DirectML adapter is usable" in proc.stderr


FAILING_WHEEL = "raise RuntimeError('Unknown error -2147467259')\n"


@pytest.fixture
def failing_wheel(tmp_path, monkeypatch):
    """A DirectML driver present (a stand-in /dev/dxg) and a torch_directml whose device calls
    fail, as the real wheel's do with its stub libraries first on LD_LIBRARY_PATH."""
    pkg = tmp_path / "site" / "torch_directml"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAILING_WHEEL)
    (tmp_path / "dxg").write_text("")
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}",
           "DMLSHIM_DXG_PATH": str(tmp_path / "dxg")}
    return env


def test_present_but_unusable_is_one_line_and_auto_goes_on_on_the_cpu(failing_wheel, tmp_path):
    code = ("import dmlshim, torch, subprocess, sys\n"
            "print(dmlshim.current_target().kind, torch.zeros(1, device='cuda').device)\n"
            "subprocess.run([sys.executable, '-c', 'import torch'])\n")  # a child: quiet
    script = tmp_path / "s.py"
    script.write_text(code)
    for cmd in (["-c", code], ["-m", "dmlshim", str(script)]):
        e = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
        e.update(failing_wheel)
        proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=e,
                              timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["cpu", "cpu"], proc.stdout
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dmlshim:")]
        assert lines == [
            f"dmlshim: DirectML is present ({tmp_path / 'dxg'}) but unusable: torch_directml "
            "probe failed: RuntimeError: Unknown error -2147467259; is LD_LIBRARY_PATH pointing "
            "at torch_directml's folder? WSL's libraries are in /usr/lib/wsl/lib (`ldconfig -p "
            "| grep d3d12` should list them); training on the CPU"], proc.stderr
    dml = run_py("import dmlshim", DMLSHIM_DEVICE="dml", **failing_wheel)
    assert dml.returncode == 2
    assert dml.stderr.strip().count("\n") == 0 and "Unknown error -2147467259" in dml.stderr
    assert "DirectML is present" in dml.stderr and "DMLSHIM_DEVICE=dml" in dml.stderr


def test_the_wheels_folder_on_the_library_path_is_named_as_the_cause(failing_wheel, tmp_path):
    pkg = str(tmp_path / "site" / "torch_directml")
    proc = run_py("import dmlshim", LD_LIBRARY_PATH=pkg, **failing_wheel)
    assert proc.returncode == 0, proc.stderr
    assert f"LD_LIBRARY_PATH holds torch_directml's folder {pkg}, whose libd3d12.so and " \
           "libdxcore.so are empty stubs" in proc.stderr


@pytest.mark.skipif(not HAS_DIRECTML, reason="needs the torch-directml wheel (CI's second lane)")
def test_emulator_refuses_to_register_beside_the_real_backend():
    # The real wheel imports with its folder on LD_LIBRARY_PATH (its stubs: device calls fail);
    # without it, on plain Linux, importing it fails, and dmlshim says so in one error.
    pkg = target.directml_package_dir()
    assert pkg is not None
    without = run_py("from dmlshim import target; target.import_torch_directml()",
                     DMLSHIM_DISABLE="1")
    if sys.platform.startswith("linux") and not os.path.exists("/usr/lib/wsl/lib"):
        assert without.returncode != 0
        assert "importing torch_directml failed" in without.stderr
        assert "libd3d12.so: cannot open shared object file" in without.stderr
    proc = run_py("import torch_directml, dmlshim; dmlshim.install(device='emulated-dml')",
                  DMLSHIM_DISABLE="1", LD_LIBRARY_PATH=pkg)
    assert proc.returncode != 0
    assert "torch_directml is already imported" in proc.stderr


@pytest.mark.parametrize("device, float64", [("cpu", True), ("meta", False)])
def test_probe_claims_float64_only_after_a_float64_op_worked(tmp_path, monkeypatch, device,
                                                             float64):
    # has_float64_support() says True on adapters where every float64 op raises (the software
    # D3D12 adapter): a stand-in whose device is 'meta' (no values: .item() raises) says so too.
    pkg = tmp_path / "torch_directml"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import torch\n__version__ = '0.0.test'\ndevice_count = lambda: 1\n"
        "device_name = lambda i: 'Fake adapter\\0'\nhas_float64_support = lambda i: True\n"
        f"device = lambda i: torch.device({device!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv(target.PROBE_CACHE_ENV, raising=False)
    probe = target.probe_directml(force=True)
    assert (probe.usable, probe.names, probe.float64) == (True, ["Fake adapter"], [float64]), probe
