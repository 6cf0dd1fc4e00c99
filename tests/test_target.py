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
    e.update(PYTHONPATH=REPO, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=180)


def test_cheap_check_explains_why_directml_cannot_work_here():
    reason = target.cheap_directml_check()
    if not HAS_DIRECTML:
        assert reason is not None and "not installed" in reason
    elif sys.platform.startswith("linux") and not os.path.exists("/dev/dxg"):
        assert reason is not None and "/dev/dxg" in reason
    else:  # Windows or WSL with the package: the subprocess probe decides
        assert reason is None


def test_forced_probe_runs_in_a_subprocess_and_survives_whatever_happens_there():
    # force=True skips the cheap checks: with the real wheel and no driver the child raises
    # "Unknown error" or segfaults; this process must only learn "not usable" and why.
    probe = target.probe_directml(force=True)
    if HAS_DIRECTML and os.path.exists("/dev/dxg"):
        assert probe.usable == (probe.count > 0)
    else:
        assert probe.usable is False
        assert probe.reason.startswith("torch_directml ")
        if HAS_DIRECTML:
            assert "probe" in probe.reason  # crashed, failed or found nothing: said which
    assert os.environ[target.PROBE_CACHE_ENV] == json.dumps(target.asdict(probe))
    assert target.probe_directml() is probe  # cached for the process


def test_children_reuse_the_cached_probe():
    fake = {"usable": False, "reason": "cached by the parent", "count": 0, "names": [],
            "float64": [], "version": None}
    proc = run_py("from dmlshim import target; print(target.probe_directml().reason)",
                  DMLSHIM_DISABLE="1", DMLSHIM_PROBE_CACHE=json.dumps(fake))
    assert proc.stdout.strip() == "cached by the parent", proc.stderr


def test_auto_falls_back_to_the_cpu_without_crashing():
    proc = run_py("import dmlshim, torch; t = dmlshim.current_target(); "
                  "print(t.kind, torch.zeros(2, device='cuda').device)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "cpu"]


def test_explicit_dml_without_an_adapter_is_one_clear_line():
    proc = run_py("import dmlshim", DMLSHIM_DEVICE="dml:1")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no DirectML adapter is usable" in proc.stderr


@pytest.mark.skipif(not HAS_DIRECTML, reason="needs the torch-directml wheel (CI's second lane)")
def test_emulator_refuses_to_register_beside_the_real_backend():
    # Importing torch_directml is safe with its folder on LD_LIBRARY_PATH; device calls crash.
    pkg = target.directml_package_dir()
    assert pkg is not None
    code = ("from dmlshim import target; target.import_torch_directml(); "
            "import dmlshim; dmlshim.install(device='emulated-dml')")
    without = run_py(code, DMLSHIM_DISABLE="1")
    if sys.platform.startswith("linux"):
        assert without.returncode != 0 and "LD_LIBRARY_PATH" in without.stderr
    proc = run_py(code, DMLSHIM_DISABLE="1", LD_LIBRARY_PATH=pkg)
    assert proc.returncode != 0
    assert "torch_directml is already imported" in proc.stderr
