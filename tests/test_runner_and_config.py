"""`python -m dmlshim` behaves like `python script.py` (the full comparison is
test_runner_matrix.py); options are validated in one place, before the script starts."""

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
                          env=env(**extra), timeout=240)


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


@pytest.mark.parametrize("unsigned, signed", [
    (0, 0), (3, 3), (0x7FFFFFFF, 0x7FFFFFFF), (0xFFFFFFFF, -1),
    (0xC000013A, -1073741510),  # STATUS_CONTROL_C_EXIT: an uncaught Ctrl-C
    (0xC0000005, -1073741819),  # STATUS_ACCESS_VIOLATION
])
def test_windows_child_status_is_passed_on_as_python_reports_it(unsigned, signed):
    # Windows' subprocess gives statuses unsigned; sys.exit() of one above 2**31-1 would exit
    # 0xFFFFFFFF. The signed form exits with the same 32 bits (the Windows lane runs it).
    from dmlshim.exit_status import windows_exit_status

    assert windows_exit_status(unsigned) == signed
    assert windows_exit_status(unsigned) & 0xFFFFFFFF == unsigned


def test_device_index_limit_is_torchs():
    assert config.load(environ={"DMLSHIM_DEVICE": "emulated-dml:127"}).device == "emulated-dml:127"
    assert config.load(environ={"DMLSHIM_DEVICE": "dml:127"}).device == "dml:127"
    with pytest.raises(config.ConfigError, match="N <= 127"):
        config.load(environ={"DMLSHIM_DEVICE": "emulated-dml:128"})


ALLOW_LIST = """
import sys
import torch
from torch import _weights_only_unpickler as wou

def name(g):
    g = g[0] if isinstance(g, tuple) else g
    return f"{getattr(g, '__module__', '')}.{getattr(g, '__qualname__', type(g).__name__)}"

def allowed():
    return sorted(map(name, getattr(wou, "_marked_safe_globals_set", ())))

if sys.argv[1:] == ["explicit"]:
    import torch.distributed.tensor  # noqa: F401  the script asks for DTensor itself
start = allowed()
model = torch.nn.Linear(2, 2).to("cuda" if torch.cuda.is_available() else "cpu")
model(torch.ones(1, 2, device=next(model.parameters()).device)).sum().item()
print("unchanged by a forward pass", allowed() == start)
print(allowed())
"""


@pytest.mark.parametrize("how", ["implicit", "explicit"])
def test_emulated_dml_keeps_torchs_weights_only_allow_list(tmp_path, how):
    # torch imports torch.distributed.tensor at the first dispatch through a tensor subclass
    # (the emulator's tensors), which would widen the allow-list for torch.load(weights_only)
    script = tmp_path / "allow.py"
    script.write_text(ALLOW_LIST)
    native = run([str(script), how])
    shimmed = run(["-m", "dmlshim", "--device", "emulated-dml", str(script), how])
    assert native.returncode == shimmed.returncode == 0, shimmed.stderr
    assert shimmed.stdout == native.stdout
    assert "unchanged by a forward pass True" in native.stdout


def test_unwritable_report_exits_2_before_the_script_starts(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('the script ran')\n")
    for report in (str(tmp_path / "missing" / "r.json"), str(tmp_path)):  # no folder; a folder
        for args in (["-m", "dmlshim", str(script)], ["-c", "import dmlshim; print('ran')"]):
            proc = run(args, DMLSHIM_REPORT=report)
            assert proc.returncode == 2 and proc.stdout == "", proc.stderr
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and "DMLSHIM_REPORT" in lines[0] and "writable" in lines[0]


def test_python_options_that_skip_the_bootstrap_are_refused():
    for opt in ("-E", "-I", "-S"):
        proc = run(["-m", "dmlshim", opt, PROBE])
        assert proc.returncode == 2 and opt in proc.stderr and proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1
    # DMLSHIM_DISABLE=1: plain python, which accepts them
    assert run(["-m", "dmlshim", "-I", PROBE, "5"], DMLSHIM_DISABLE="1").returncode == 5


def test_runner_options_come_before_the_script_and_reach_it(tmp_path):
    code = ("import os, sys; before = 'DMLSHIM_DEVICE' in os.environ; import torch, dmlshim; "
            "print(sys.argv[1:], dmlshim.current_target().kind, before)")
    proc = run(["-m", "dmlshim", "--device", "emulated-dml:2", "--log=warning", "-c", code,
                "--device", "x"])
    assert proc.returncode == 0, proc.stderr
    # the script's own arguments stay its own; the option reaches the shim, not the script's
    # environment (while installed, the shim exports it for children)
    assert proc.stdout.split("]")[1].split() == ["emulated-dml", "False"]
    assert proc.stdout.startswith("['--device', 'x']")


def test_import_dmlshim_in_a_dash_m_module_installs(tmp_path):
    pkg = tmp_path / "withshim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import dmlshim\n")
    (pkg / "__main__.py").write_text("import dmlshim, torch\n"
                                     "print(dmlshim.is_installed(), torch.cuda.is_available())\n")
    proc = run(["-m", "withshim"], cwd=tmp_path, DMLSHIM_DEVICE="cpu")
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "True"], proc.stderr


def test_uncaught_exception_shows_the_users_traceback_only():
    native = run([PROBE, "raise"])
    shimmed = run(["-m", "dmlshim", PROBE, "raise"])
    assert shimmed.returncode == native.returncode == 1
    assert "ValueError: boom from the script" in shimmed.stderr
    assert shimmed.stderr == native.stderr  # python prints it: no runner frames to strip


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
    # 0 and 1 only, as documented: not a guess at what `yes` or `true` meant
    ("DMLSHIM_DISABLE", "yes"), ("DMLSHIM_DISABLE", "true"),
    ("DMLSHIM_EMULATOR_GAPS", "fallback,nope"),
    # torch keeps device indices in 8 signed bits: cuda:150 would wrap to -106
    ("DMLSHIM_DEVICE", "emulated-dml:128"), ("DMLSHIM_DEVICE", "dml:200"),
    ("DMLSHIM_REPORT", "/nonexistent-dir/report.json"),
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


def test_unavailable_directml_request_exits_2(tmp_path):
    # no /dev/dxg, whatever machine runs this (tests/test_wsl_path.py runs the WSL cases)
    proc = run(["-m", "dmlshim", PROBE], DMLSHIM_DEVICE="dml",
               DMLSHIM_DXG_PATH=str(tmp_path / "no-dxg"))
    assert proc.returncode == 2
    assert "DMLSHIM_DEVICE=dml" in proc.stderr and "no DirectML adapter" in proc.stderr


def test_disable_makes_import_a_no_op():
    code = "import dmlshim, torch; print(dmlshim.is_installed(), torch.cuda.is_available())"
    assert run(["-c", code], DMLSHIM_DISABLE="1").stdout.split() == ["False", "False"]
    assert run(["-c", code], DMLSHIM_DEVICE="cpu").stdout.split() == ["True", "True"]


def test_auto_without_directml_or_cuda_trains_on_cpu_and_says_why(tmp_path):
    code = "import dmlshim; t = dmlshim.current_target(); print(t.kind); print(t.reason)"
    proc = run(["-c", code], DMLSHIM_LOG="info", DMLSHIM_DXG_PATH=str(tmp_path / "no-dxg"))
    kind, reason = proc.stdout.splitlines()
    assert kind == "cpu"
    assert "no DirectML" in reason and "CPU" in reason
    assert "target cpu" in proc.stderr


def test_every_dmlshim_variable_has_a_row_in_the_table():
    import re
    from pathlib import Path

    names = set()
    for path in Path(REPO, "dmlshim").rglob("*.py"):
        names.update(re.findall(r"DMLSHIM_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    names.discard("DMLSHIM_PROBE")  # the DirectML probe's output line marker, not a variable
    rows = {o.env for o in config.OPTIONS} | {v.env for v in config.INTERNAL}
    assert names <= rows, sorted(names - rows)
    assert not {v.env for v in config.INTERNAL} & {o.env for o in config.OPTIONS}


def test_help_lists_every_option():
    proc = run(["-m", "dmlshim", "--help"])
    assert proc.returncode == 0
    for opt in config.OPTIONS:
        assert opt.env in proc.stdout and opt.flag in proc.stdout
    # the emulator's switches by their names; the old names still work but are not offered
    assert "nll-none-backward" in proc.stdout and "bug-bn-stats" in proc.stdout
    for old in config.EMULATOR_ALIASES:
        assert old not in proc.stdout
        assert config.load(environ={"DMLSHIM_EMULATOR_GAPS": f"all,{old}"}).emulator_gaps


def test_the_package_shows_its_api():
    import dmlshim

    names = dir(dmlshim)
    assert set(dmlshim.__all__) <= set(names)
    assert not {"Any", "annotations", "sys"} & set(names), names
    for name in names:
        getattr(dmlshim, name)  # every name shown is there


def test_get_original_takes_the_owner_or_its_dotted_name_as_gevent_does(shim):
    import torch

    from dmlshim import get_original

    before = torch.cuda.is_available, torch.Tensor.to, torch.Tensor.cuda
    shim(device="cpu")
    assert torch.cuda.is_available is not before[0]  # patched
    assert get_original(torch.cuda, "is_available") is before[0]
    assert get_original("torch.cuda", "is_available") is before[0]
    assert get_original("torch.Tensor", ["to", "cuda"]) == list(before[1:])


NO_NUMPY = """
import sys, warnings

class NoNumpy:  # numpy not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "numpy":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoNumpy())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
print(any("Failed to initialize NumPy" in str(w.message) for w in caught))
"""


def test_numpy_is_a_dependency_where_torch_warns_without_it():
    """README command 1 installs torch and dmlshim: without numpy, `import torch` warns before
    the script's first line (torch's CPU wheels do not require numpy), so dmlshim requires it."""
    import re
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-c", NO_NUMPY], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    pyproject = (Path(REPO) / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S).group(1)
    required = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, re.M)
    if proc.stdout.split() == ["True"]:
        assert "numpy" in required, required


def test_readme_command_1_prints_nothing_but_the_example(tmp_path):
    """The example's output, and nothing before it: no warning of torch's or of dmlshim's."""
    from tests.helpers import clean_env

    proc = subprocess.run([sys.executable, "-m", "dmlshim", os.path.join(REPO, "examples", "train_cnn.py"),
                           "--epochs", "1"], capture_output=True, text=True, cwd=tmp_path,
                          env=clean_env(DMLSHIM_DXG_PATH=str(tmp_path / "no-dxg")), timeout=600)
    assert proc.returncode == 0, proc.stderr
    import torch

    stderr = proc.stderr
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6):
        # torch < 2.6 warns at every torch.load without weights_only (plain python too): torch's
        # own warning, not one of dmlshim's; README command 1's torch 2.13 does not
        lines = stderr.splitlines(keepends=True)
        stderr = "".join(line for i, line in enumerate(lines)
                         if "weights_only=False" not in line
                         and not (i and "weights_only=False" in lines[i - 1]))
    assert stderr == "", proc.stderr
    assert proc.stdout.startswith("GPU: ") and "checkpoint saved and reloaded" in proc.stdout
