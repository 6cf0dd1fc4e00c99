"""The path a user with a DirectML adapter takes, run as on WSL (issue 21, items 1 and 5).

``python -m emulated_dml.wsl`` runs a command in a private mount namespace with WSL's layout:
``/dev/dxg``, "WSL" ``libd3d12.so``/``libdxcore.so`` in ``/usr/lib/wsl/lib`` found through the
loader cache, and the stand-in ``torch_directml`` (the wheel's API and folder layout, stub
libraries included, the device being emulated_dml's emulator) first on ``PYTHONPATH``, where
it shadows the real wheel of the torch 2.4.1 lane. So detection, the probe, the runner, the
bootstrap, children and the doctor run as they do on WSL, with no ``LD_LIBRARY_PATH`` set by
anyone. The references: native CPU runs of the corpus, the ``emulated-dml`` target (the same
emulator reached without the wheel's path), and the facts file's "Libraries on Linux".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from helpers import (
    CORPUS,
    REPO,
    clean_env,
    describe,
    first_difference,
    losses,
    neutral_cwd,
    printed_device,
    run_native,
    run_shim,
    with_import_line,
)

from emulated_dml import wheel

WSL = str(REPO / "emulated_dml" / "wsl.py")
TIMEOUT = 300.0
PRESENT_LINE = "dmlshim: DirectML is present (/dev/dxg) but unusable: "
ADAPTER_0 = "Emulated DirectML Adapter 0 (emulated_dml)"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the WSL layout is Linux's")


def wsl(cmd: List[str], adapters: int = 1, env: Optional[Dict[str, Optional[str]]] = None,
        as_module: bool = False, cwd: Optional[str] = None,
        memory_mib: int = 0, float64: bool = False) -> subprocess.CompletedProcess:
    """``cmd`` inside the harness, with a clean environment (no DMLSHIM_*, repo on PYTHONPATH)."""
    harness = [sys.executable, "-m", "emulated_dml.wsl"] if as_module else [sys.executable, WSL]
    return subprocess.run([*harness, "--adapters", str(adapters), "--memory", str(memory_mib),
                           *(["--float64"] if float64 else []), "--", *cmd],
                          env=clean_env(**(env or {})), cwd=cwd or neutral_cwd(),
                          capture_output=True, text=True, timeout=TIMEOUT)


def shimmed(script: str, *args: str, via: str = "runner", tmp: Path, adapters: int = 1,
            env: Optional[Dict[str, Optional[str]]] = None,
            options: Optional[List[str]] = None) -> subprocess.CompletedProcess:
    """A corpus script through dmlshim with default options (``auto``) inside the harness;
    the JSON report goes to ``tmp/report.json``."""
    path = CORPUS / script
    extra = {"DMLSHIM_REPORT": str(tmp / "report.json"), **(env or {})}
    if via == "runner":
        cmd = [sys.executable, "-m", "dmlshim", *(options or []), str(path), *args]
    else:
        copy = tmp / path.name
        copy.write_text(with_import_line(path.read_text(encoding="utf-8")), encoding="utf-8")
        cmd = [sys.executable, str(copy), *args]
        extra["PYTHONPATH"] = f"{REPO}{os.pathsep}{CORPUS}"
    return wsl(cmd, adapters=adapters, env=extra)


def report(tmp: Path) -> dict:
    return json.loads((tmp / "report.json").read_text(encoding="utf-8"))


def present_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.startswith(PRESENT_LINE)]


@pytest.fixture(scope="module")
def standin() -> Path:
    """The stand-in's folder (what the harness puts first on PYTHONPATH)."""
    return Path(wheel.build_standin())


# -- the stand-in's libraries behave as the facts file says the wheel's do ---------------------

def test_plain_linux_import_fails_and_the_wheels_folder_gives_unknown_errors(standin):
    code = "import torch_directml as d; print(d.device_count())"
    env = {"PYTHONPATH": f"{standin}{os.pathsep}{REPO}"}
    plain = subprocess.run([sys.executable, "-c", code], env=clean_env(**env),
                           capture_output=True, text=True, timeout=TIMEOUT, cwd=neutral_cwd())
    assert plain.returncode == 1, describe(plain)
    assert "OSError: libd3d12.so: cannot open shared object file" in plain.stderr, describe(plain)
    errors = []
    for _ in range(2):
        stub = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=clean_env(LD_LIBRARY_PATH=str(standin / "torch_directml"),
                                            **env), timeout=TIMEOUT, cwd=neutral_cwd())
        last = stub.stderr.strip().splitlines()[-1]
        assert last.startswith("RuntimeError: Unknown error -"), describe(stub)
        errors.append(int(last.rsplit(" ", 1)[1]))
    assert errors[0] != errors[1]  # garbage from an empty stub: a different number each run


def test_inside_the_harness_the_wheels_api_works_without_library_path(standin):
    code = ("import os, torch, torch_directml as d\n"
            "x = torch.ones(2, 3, device=d.device(1)) * 2\n"
            "print(json.dumps({'file': d.__file__, 'count': d.device_count(), "
            "'name': d.device_name(0), 'f64': d.has_float64_support(0), "
            "'available': d.is_available(), 'default': d.default_device(), "
            "'dev': str(x.device), 'sum': x.sum().item(), "
            "'mem': d.gpu_memory(1, 1), 'ld': os.environ.get('LD_LIBRARY_PATH'), "
            "'dxg': os.path.exists('/dev/dxg'), 'module': torch.privateuseone.__name__}))\n")
    outside = (os.path.exists("/dev/dxg"), os.path.exists("/usr/lib/wsl/lib/libdxcore.so"))
    proc = wsl([sys.executable, "-c", "import json\n" + code], adapters=2,
               env={"LD_LIBRARY_PATH": None})
    assert proc.returncode == 0, describe(proc)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["file"] == str(standin / "torch_directml" / "__init__.py")  # shadows a wheel
    assert got["count"] == 2 and got["available"] is True and got["default"] == 0
    assert got["name"] == ADAPTER_0 + "\0"  # the wheel's trailing NUL
    assert got["f64"] is False  # like most adapters
    assert (got["dev"], got["sum"]) == ("privateuseone:1", 12.0)
    assert len(got["mem"]) == 1 and got["mem"][0] > 0
    assert got["ld"] is None and got["dxg"] is True
    assert got["module"] == "PrivateUse1Module"  # the wheel's device module, not the emulator's
    # nothing of the namespace outside it
    assert (os.path.exists("/dev/dxg"), os.path.exists("/usr/lib/wsl/lib/libdxcore.so")) \
        == outside


# -- the users' path ---------------------------------------------------------------------------

def test_doctor_says_the_adapter_works():
    proc = wsl([sys.executable, "-m", "dmlshim", "--doctor"], adapters=2, as_module=True)
    assert proc.returncode == 0, describe(proc)
    out = proc.stdout
    assert "\0" not in out, describe(proc)
    assert "  usable:          yes (torch_directml adapter found; probed in a subprocess)" in out
    assert f"  adapter 0:       {ADAPTER_0} (float64: no)" in out, describe(proc)
    assert "  adapter 1:       Emulated DirectML Adapter 1 (emulated_dml) (float64: no)" in out
    assert "  training step:   ok on privateuseone:0: conv2d, " in out, describe(proc)
    assert out.rstrip().splitlines()[-1] == (
        f"result: ok: CUDA scripts will run on dml ({ADAPTER_0}, "
        "Emulated DirectML Adapter 1 (emulated_dml))"), describe(proc)
    assert "problem:" not in out


@pytest.mark.parametrize("script,via", [("cnn.py", "runner"), ("transformer.py", "import")])
def test_auto_trains_on_the_adapter_like_native(script, via, tmp_path):
    native = run_native(script)
    assert native.returncode == 0, describe(native)
    proc = shimmed(script, via=via, tmp=tmp_path)
    assert proc.returncode == 0, describe(proc)
    chosen = printed_device(proc.stdout) or ""
    assert chosen == "cuda" or chosen.startswith("cuda:"), describe(proc)  # its CUDA branch
    rep = report(tmp_path)
    assert rep["target"]["kind"] == "dml", rep["target"]
    assert rep["target"]["names"] == [ADAPTER_0]
    assert rep["cpu_fallbacks"]["total"] == 0, rep["cpu_fallbacks"]
    assert not present_lines(proc.stderr), describe(proc)
    got = losses(proc.stdout)
    assert got == losses(native.stdout), first_difference(got, losses(native.stdout))


def test_lstm_trains_on_the_adapter_to_float32_precision(tmp_path):
    native = run_native("lstm_lm.py")
    proc = shimmed("lstm_lm.py", tmp=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert report(tmp_path)["target"]["kind"] == "dml"
    expected, got = losses(native.stdout), losses(proc.stdout)
    # the fused LSTM cell dmlshim computes from element-wise ops rounds differently (see
    # test_corpus): equal to float32 precision
    assert len(got) == len(expected) and got == pytest.approx(expected, rel=1e-5)


def test_amp_script_on_the_adapter_matches_the_emulated_target(tmp_path):
    # The same emulator, reached through the wheel's path and as emulated-dml: same losses.
    proc = shimmed("amp_train.py", "--resume-check", tmp=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert report(tmp_path)["target"]["kind"] == "dml"
    assert "resumed ok" in proc.stdout, describe(proc)
    emulated = run_shim("amp_train.py", "--resume-check", device="emulated-dml")
    assert emulated.returncode == 0, describe(emulated)
    got, expected = losses(proc.stdout), losses(emulated.stdout)
    assert len(got) == 24 and got == expected, first_difference(got, expected)


FALLBACKS = ("import torch\n"
             "x = torch.rand(8, 4, device='cuda') + 0.5\n"
             "for _ in range(3):\n"
             "    y = torch.cumprod(x, dim=1).sum() + torch.amin(x, dim=0).sum()\n"
             "print('y', y.item())\n")


def test_doctor_claims_float64_where_a_float64_op_ran():
    # an adapter with float64: the probe and the doctor's step each ran a float64 op there
    proc = wsl([sys.executable, "-m", "dmlshim", "--doctor"], float64=True)
    assert proc.returncode == 0, describe(proc)
    assert f"  adapter 0:       {ADAPTER_0} (float64: yes)" in proc.stdout, describe(proc)
    assert "  float64:         adapter 0: yes; a float64 op ran on privateuseone:0\n" \
        in proc.stdout, describe(proc)


def test_fallback_report_on_the_users_path_counts_every_op_and_call(tmp_path):
    # On the wheel's path the counts come from torch-directml's warnings, which it gives once
    # per process (one TORCH_WARN_ONCE site). With a report asked for, the shim turns
    # warn_always on: every op and call is counted, as the emulated-dml target counts the same
    # emulator's fallbacks exactly, and the user sees one warning line per op.
    script = tmp_path / "fallbacks.py"
    script.write_text(FALLBACKS, encoding="utf-8")
    proc = wsl([sys.executable, "-m", "dmlshim", str(script)],
               env={"DMLSHIM_REPORT": str(tmp_path / "report.json"), "DMLSHIM_DECOMPOSE": "off"})
    assert proc.returncode == 0, describe(proc)
    got = report(tmp_path)
    assert got["target"]["kind"] == "dml" and got["cpu_fallbacks"]["counting"] == "warnings"
    exact = run_shim(script, device="emulated-dml",
                     options={"decompose": "off", "report": str(tmp_path / "emu.json")})
    assert exact.returncode == 0, describe(exact)
    expected = json.loads((tmp_path / "emu.json").read_text(encoding="utf-8"))["cpu_fallbacks"]
    assert expected["ops"] == {"aten::amin.out": 3, "aten::cumprod.out": 3}, expected
    assert got["cpu_fallbacks"]["ops"] == expected["ops"], got["cpu_fallbacks"]
    assert proc.stderr.count("is not currently supported on the DML backend") == 2, describe(proc)
    # Without diagnostics asked for, the process is left as it is: the first op, said so.
    plain = wsl([sys.executable, "-m", "dmlshim", str(script)], env={"DMLSHIM_DECOMPOSE": "off"})
    assert plain.returncode == 0, describe(plain)
    assert plain.stderr.count("is not currently supported on the DML backend") == 1
    assert "dmlshim:   CPU fallbacks (torch-directml warns once per process: the first op " \
           "that fell back; DMLSHIM_REPORT=path or DMLSHIM_LOG=info counts every op and " \
           "call): aten::cumprod.out x1" in plain.stderr, describe(plain)
    assert "dmlshim:   needs attention: op(s) (torch-directml names the first of the process " \
           "only) ran on the CPU instead of the device: aten::cumprod.out; " in plain.stderr


OOM = ("import torch\n"
       "try:\n"
       "    x = torch.zeros(4 * 2**20, device='cuda')\n"  # 16 MiB
       "    print('no oom')\n"
       "except torch.cuda.OutOfMemoryError as err:\n"
       "    print('oom', 'There is not enough GPU video memory available!' in str(err))\n"
       "y = torch.ones(1024, device='cuda')\n"
       "print('after', y.sum().item())\n")


def test_out_of_memory_on_the_users_path_is_cudas_error(tmp_path):
    # an adapter with 8 MiB of video memory: the wheel's untyped RuntimeError past it, which
    # the shim turns into torch.cuda.OutOfMemoryError at the device entry point
    script = tmp_path / "oom.py"
    script.write_text(OOM, encoding="utf-8")
    proc = wsl([sys.executable, "-m", "dmlshim", str(script)], memory_mib=8)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split("\n")[:2] == ["oom True", "after 1024.0"], describe(proc)
    plain = wsl([sys.executable, "-c", "import torch, torch_directml as d\n"
                 "try:\n    torch.zeros(4 * 2**20, device=d.device())\n"
                 "except RuntimeError as err:\n    print(type(err).__name__, err)\n"],
                memory_mib=8)
    assert plain.stdout.strip() == ("RuntimeError: Could not allocate tensor with 16777216 bytes. "
                                    "There is not enough GPU video memory available!"
                                    ).replace(":", "", 1), describe(plain)


CHILDREN = r'''
import json, os, subprocess, sys
import torch
import torch.multiprocessing as mp

CHILD = ("import os, json, torch; x = torch.ones(2, device='cuda'); "
         "print('child ' + json.dumps([str(x.device), torch.cuda.get_device_name(0), "
         "os.environ.get('LD_LIBRARY_PATH')]))")


def rank(i, q):
    torch.cuda.set_device(i)
    x = torch.ones(2, device="cuda")
    q.put([i, str(x.device), torch.cuda.get_device_name(i), os.environ.get("LD_LIBRARY_PATH")])


if __name__ == "__main__":
    print("parent " + json.dumps([str(torch.zeros(1, device="cuda").device),
                                  os.environ.get("LD_LIBRARY_PATH")]))
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    print(out.stdout.strip(), out.stderr.strip()[-300:])
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=rank, args=(i, q)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("ranks " + json.dumps(sorted(q.get() for _ in procs)))
'''


def test_children_get_the_device_without_library_path(tmp_path):
    script = tmp_path / "children.py"
    script.write_text(CHILDREN, encoding="utf-8")
    proc = wsl([sys.executable, "-m", "dmlshim", str(script)], adapters=2,
               env={"LD_LIBRARY_PATH": None})
    assert proc.returncode == 0, describe(proc)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
             if line.split(" ", 1)[0] in ("parent", "child", "ranks")}
    assert json.loads(lines["parent"]) == ["privateuseone:0", None], describe(proc)
    assert json.loads(lines["child"].split("]", 1)[0] + "]") == [
        "privateuseone:0", ADAPTER_0, None], describe(proc)
    assert json.loads(lines["ranks"]) == [
        [0, "privateuseone:0", ADAPTER_0, None],
        [1, "privateuseone:1", "Emulated DirectML Adapter 1 (emulated_dml)", None]], describe(proc)


def test_dataloader_spawn_workers_on_the_users_path_train_like_native(tmp_path):
    native = run_native("dataloader_workers.py", "--spawn")
    proc = shimmed("dataloader_workers.py", "--spawn", tmp=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert report(tmp_path)["target"]["kind"] == "dml"
    assert losses(proc.stdout) == losses(native.stdout)


# -- the wheel's folder on LD_LIBRARY_PATH (the advice dmlshim used to give) -----------------

@pytest.mark.parametrize("via", ["runner", "import"])
def test_wheel_folder_on_library_path_says_so_once_and_trains_on_cpu(via, standin, tmp_path):
    native = run_native("dataloader_workers.py", "--spawn")
    proc = shimmed("dataloader_workers.py", "--spawn", via=via, tmp=tmp_path,
                   env={"LD_LIBRARY_PATH": str(standin / "torch_directml")})
    assert proc.returncode == 0, describe(proc)
    lines = present_lines(proc.stderr)
    # one line for the process tree (the spawned workers stay quiet), with the probe's error
    # and what to check
    assert len(lines) == 1, describe(proc)
    assert "torch_directml probe failed: RuntimeError: Unknown error -" in lines[0]
    assert "LD_LIBRARY_PATH holds torch_directml's folder" in lines[0]
    assert lines[0].endswith("; training on the CPU")
    assert report(tmp_path)["target"]["kind"] == "cpu"
    assert losses(proc.stdout) == losses(native.stdout)


def test_wheel_folder_on_library_path_with_device_dml_exits_2(standin, tmp_path):
    proc = shimmed("mlp.py", tmp=tmp_path, options=["--device", "dml"],
                   env={"LD_LIBRARY_PATH": str(standin / "torch_directml")})
    assert proc.returncode == 2, describe(proc)
    assert proc.stdout == "", describe(proc)  # the script never started
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(PRESENT_LINE), describe(proc)
    assert "Unknown error -" in err[0] and "DMLSHIM_DEVICE=dml" in err[0]
    doctor = wsl([sys.executable, "-m", "dmlshim", "--doctor"],
                 env={"LD_LIBRARY_PATH": str(standin / "torch_directml")})
    assert doctor.returncode == 1, describe(doctor)
    assert any(line.startswith("problem: DirectML is present (/dev/dxg) but unusable: ")
               for line in doctor.stdout.splitlines()), describe(doctor)
    assert "result: ok" not in doctor.stdout


# -- plain Linux: no /dev/dxg -----------------------------------------------------------------

NO_WHEEL_IMPORT = ("import sys, torch, dmlshim\n"
                   "t = dmlshim.current_target()\n"
                   "print('target', t.kind, 'torch_directml' in sys.modules, "
                   "torch.zeros(1, device='cuda').device)\n"
                   "print('reason', t.reason)\n")


def test_plain_linux_auto_is_cpu_without_importing_the_wheel(standin, tmp_path):
    # The stand-in is importable (on both lanes) but there is no /dev/dxg: decided without
    # importing it, in this process or in a probe subprocess (its import would fail here).
    missing = tmp_path / "dxg"
    proc = subprocess.run([sys.executable, "-c", NO_WHEEL_IMPORT], capture_output=True,
                          text=True, timeout=TIMEOUT, cwd=neutral_cwd(),
                          env=clean_env(PYTHONPATH=f"{standin}{os.pathsep}{REPO}",
                                        DMLSHIM_DXG_PATH=str(missing)))
    assert proc.returncode == 0, describe(proc)
    assert "target cpu False cpu" in proc.stdout, describe(proc)
    assert f"no {missing}: DirectML on Linux needs WSL2's GPU driver" in proc.stdout
    assert not present_lines(proc.stderr) and "torch_directml probe" not in proc.stdout


def test_the_harness_returns_the_commands_status():
    proc = wsl(["sh", "-c", "test -e /dev/dxg && ldconfig -p | grep -q /usr/lib/wsl/lib/libdxcore.so"
                " && echo x > /dev/null && exit 7"])
    assert proc.returncode == 7, describe(proc)
    killed = wsl(["sh", "-c", "kill -TERM $$"])
    assert killed.returncode == 128 + 15, describe(killed)
