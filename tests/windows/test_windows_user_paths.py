"""What a Windows user meets around a training run (issue 39): a folder under a user name with
spaces and accents (``C:\\Users\\José Ñúñez\\my runs``) holding the script, its checkpoints
(``torch.save``/``torch.load(map_location="cuda:0")``) and the report (``DMLSHIM_REPORT``);
DataLoader spawn workers, each carrying the shim; and Ctrl-C during training, whose report
gives Windows python's exit status (STATUS_CONTROL_C_EXIT), not the POSIX shell's 130.
Each run is compared with the same script on plain Windows python.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import describe, losses
from tests.windows.wine import STATUS_CONTROL_C_EXIT

SCRIPTS = Path(__file__).with_name("scripts")
TIMEOUT = 600
# STATUS_CONTROL_C_EXIT as cmd's %ERRORLEVEL% and PowerShell's $LASTEXITCODE show it (the
# report's exit_code is the status "as a shell shows it")
CTRL_C_AS_SHOWN = STATUS_CONTROL_C_EXIT - (1 << 32)


def _env(win, **extra: str):
    # wine turns the Linux side's names into Windows' Unicode ones with the locale's charset
    return win.env(LANG="C.UTF-8", **extra)


def _lines(stdout: str, word: str):
    return [line for line in stdout.splitlines() if line.startswith(word + " ")]


def test_a_run_in_a_folder_with_spaces_and_accents(win, tmp_path):
    folder = tmp_path / "Users" / "José Ñúñez" / "my runs"
    native_folder = tmp_path / "native" / "José Ñúñez" / "my runs"
    for where in (folder, native_folder):
        where.mkdir(parents=True)
        shutil.copy(SCRIPTS / "users_folder.py", where / "train josé.py")
    native = win.run(["train josé.py"], _env(win), native_folder, timeout=TIMEOUT)
    assert native.returncode == 0, describe(native)
    report = folder / "run report ñ.json"
    proc = win.run(["-m", "dmlshim", "train josé.py"],
                   _env(win, DMLSHIM_DEVICE="cpu", DMLSHIM_REPORT=win.path(report)), folder,
                   timeout=TIMEOUT)
    assert proc.returncode == 0, describe(proc)
    assert losses(proc.stdout) == losses(native.stdout) != [], describe(proc)
    assert _lines(proc.stdout, "params") == _lines(native.stdout, "params") != []
    # the checkpoint is where the script put it, and loads onto the "GPU" (the CPU target's
    # device: cpu)
    assert (folder / "checkpoints ñ" / "epoch 1 — José.pt").is_file()
    assert _lines(proc.stdout, "loaded") == ["loaded cpu cpu"], describe(proc)
    # two spawn workers per epoch, each with the shim on the script's target
    workers = _lines(proc.stdout, "worker")
    assert workers == [f"worker {p}.{w} True cpu" for p in (1, 2) for w in (0, 1)], describe(proc)
    assert _lines(native.stdout, "worker") == [f"worker {p}.{w} False -" for p in (1, 2)
                                               for w in (0, 1)], describe(native)
    data = json.loads(report.read_text(encoding="utf-8"))
    assert data["outcome"] == {"how": "finished", "exit_code": 0, "exception": None}
    assert data["process"]["cwd"] == win.path(folder), data["process"]
    assert data["process"]["argv"][0].endswith("train josé.py"), data["process"]
    assert data["calls"]["by_api"], data["calls"]  # it saw the script's CUDA calls


@pytest.mark.parametrize("via", ["runner", "import"])
def test_ctrl_c_during_training_reports_windows_status(win, tmp_path, via):
    script = win.path(SCRIPTS / "ctrl_c_training.py")
    native = win.run([script], win.env(), tmp_path, timeout=TIMEOUT)
    assert native.returncode == STATUS_CONTROL_C_EXIT, describe(native)
    assert "KeyboardInterrupt" in native.stderr, describe(native)
    report = tmp_path / f"ctrl c {via}.json"
    args = ["-m", "dmlshim", script] if via == "runner" else [script, "--import-dmlshim"]
    proc = win.run(args, win.env(DMLSHIM_DEVICE="cpu", DMLSHIM_REPORT=win.path(report)),
                   tmp_path, timeout=TIMEOUT)
    assert proc.returncode == STATUS_CONTROL_C_EXIT, describe(proc)
    assert losses(proc.stdout) == losses(native.stdout) and len(losses(proc.stdout)) == 4
    data = json.loads(report.read_text(encoding="utf-8"))
    assert data["outcome"] == {"how": "interrupted", "exit_code": CTRL_C_AS_SHOWN,
                               "exception": "KeyboardInterrupt"}, data["outcome"]
