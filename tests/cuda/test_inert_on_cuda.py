"""dmlshim is inert on real CUDA: a CUDA script behaves exactly as without it.

Marker ``cuda``: these run where torch sees a CUDA device (an NVIDIA GPU) and are deselected
elsewhere, CI included, with one line saying why (tests/conftest.py); ``python -m pytest -m cuda``
runs them alone (docs/testing-on-cuda.md). The suite hides CUDA from every process it starts;
each run here gets the GPUs back (helpers.cuda_visible) and is a child process, because the
pytest process itself sees no CUDA.

tests/cuda/probe.py prints, section by section, what a script sees: every torch.cuda answer,
AMP and GradScaler, checkpoints, DataLoader pinning, errors, a training loop's dmlshim frames,
``torch.compile``, NCCL DDP (world size 1). It runs natively (plain ``python probe.py``, twice:
what differs between two native runs is the probe's fault, not dmlshim's) and under dmlshim in
four ways: the runner and ``import dmlshim`` as the script's first line, each with ``auto``
(dmlshim finds CUDA and stays inert) and with ``DMLSHIM_DEVICE=cuda``. Every section must be
equal to the native run's, key by key; the report must say inert; ``import dmlshim`` then
``dmlshim.uninstall()`` must leave torch as it was.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from helpers import clean_env, cuda_visible, describe, neutral_cwd, with_import_line

pytestmark = pytest.mark.cuda

PROBE = Path(__file__).with_name("probe.py")
TIMEOUT = 900.0  # torch.compile's first inductor build on a busy machine
GROUP = "api,amp,checkpoint,dataloader,errors,frames"
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]

# how dmlshim takes part: (how it is loaded, DMLSHIM_DEVICE; None: unset, i.e. auto)
SHIMMED: Dict[str, Tuple[str, Optional[str]]] = {
    "runner auto": ("runner", None), "runner cuda": ("runner", "cuda"),
    "import auto": ("import", None), "import cuda": ("import", "cuda")}
# NCCL under torchrun, the two ways docs/distributed.md gives, against native torchrun (auto)
TORCHRUN_SHIMMED = {"torchrun -m dmlshim": ("torchrun -m dmlshim", None),
                    "dmlshim -m torchrun": ("dmlshim -m torchrun", None)}
# what uninstall() cannot take back, as dmlshim.api.PERMANENT and target.py document: the
# DirectML probe's answer, kept in the environment for the process and its children
LEFT_BY_DESIGN = {"DMLSHIM_PROBE_CACHE"}


@functools.cache
def _import_copy() -> str:
    """probe.py with ``import dmlshim`` as its first statement (helpers.run_shim's via=import)."""
    folder = tempfile.mkdtemp(prefix="dmlshim-cuda-import-")
    copy = Path(folder) / PROBE.name
    copy.write_text(with_import_line(PROBE.read_text(encoding="utf-8")), encoding="utf-8")
    return str(copy)


def _command(how: str, sections: str) -> List[str]:
    py, probe = sys.executable, str(PROBE)
    return {
        "native": [py, probe, sections],
        "runner": [py, "-m", "dmlshim", probe, sections],
        "import": [py, _import_copy(), sections],
        "native torchrun": [py, *TORCHRUN, probe, sections],
        "torchrun -m dmlshim": [py, *TORCHRUN, "-m", "dmlshim", probe, sections],
        "dmlshim -m torchrun": [py, "-m", "dmlshim", *TORCHRUN, probe, sections],
    }[how]


class Run:
    """One probe run: its sections (``{name: {key: value}}``) and its ``SHIM`` line."""

    def __init__(self, proc) -> None:
        self.proc = proc
        assert proc.returncode == 0, describe(proc)
        self.sections: Dict[str, Dict[str, Any]] = {}
        self.shim: Dict[str, Any] = {}
        for line in proc.stdout.splitlines():
            if line.startswith("SECTION "):
                _, name, data = line.split(" ", 2)
                self.sections[name] = json.loads(data)
            elif line.startswith("SHIM "):
                self.shim = json.loads(line[len("SHIM "):])
        assert self.shim, describe(proc)


@functools.cache
def probe(how: str, sections: str, device: Optional[str] = None, report: str = "",
          again: int = 0) -> Run:
    """``how`` (a key of :func:`_command`) runs ``sections`` of probe.py with the GPUs;
    ``again`` only makes another run (the second native one)."""
    env = clean_env(**cuda_visible(CUBLAS_WORKSPACE_CONFIG=":4096:8", DMLSHIM_DEVICE=device,
                                   DMLSHIM_REPORT=report or None))
    proc = subprocess.run(_command(how, sections), env=env, cwd=neutral_cwd(),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    return Run(proc)


def _stable(first: Run, second: Run, section: str) -> List[str]:
    """The keys of ``section`` on which two native runs agree."""
    a, b = first.sections[section], second.sections[section]
    return [k for k in a if a[k] == b.get(k)]


def _differences(got: Run, native: Run, section: str, keys: List[str]) -> Dict[str, Any]:
    mine, theirs = got.sections[section], native.sections[section]
    missing = sorted(set(theirs) ^ set(mine))
    diff = {k: {"native": theirs.get(k), "dmlshim": mine.get(k)} for k in keys
            if mine.get(k) != theirs.get(k)}
    return {**diff, **({"keys only one run has": missing} if missing else {})}


def _shown(diff: Dict[str, Any]) -> str:
    return json.dumps(diff, indent=1, sort_keys=True)[:6000]


# -- the native runs: the GPU is there, and the probe is deterministic ---------------------------

def test_the_probe_runs_on_the_gpu_and_this_process_sees_none():
    run = probe("native", GROUP)
    api = run.sections["api"]
    assert api["is_available"] is True and api["device_count"] >= 1, api
    assert run.shim == {"loaded": False}
    import torch

    # the suite's own process: CUDA hidden (tests/conftest.py), as the CPU-target tests need
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and not torch.cuda.is_available()


@pytest.mark.parametrize("sections", [GROUP, "compile", "ddp"])
def test_two_native_runs_agree(sections):
    first, second = probe("native", sections), probe("native", sections, again=1)
    for section in sections.split(","):
        keys = list(first.sections[section])
        diff = _differences(second, first, section, keys)
        assert not diff, f"the probe is not deterministic ({section}): {_shown(diff)}"


# -- under dmlshim: equal to native, section by section ----------------------------------------

@pytest.mark.parametrize("mode", list(SHIMMED))
def test_dmlshim_is_there_and_redirects_nothing(mode):
    how, device = SHIMMED[mode]
    shim = probe(how, GROUP, device).shim
    assert shim["loaded"] and shim["target"]["kind"] == "cuda", shim
    # auto found CUDA and stayed inert (nothing installed); DMLSHIM_DEVICE=cuda installs only
    # what does not redirect (the gradient check, the optimizer hooks, the diagnostics)
    assert shim["target"]["inert"] is (device is None), shim
    if device is None:
        assert "real CUDA is present; dmlshim stays inert" in shim["target"]["reason"], shim
        assert shim["patches"] == [] and shim["installed"] is False, shim
    else:
        assert not {"cuda_api", "devices", "amp", "data", "serialization", "distributed",
                    "processes", "optim_flags"} & set(shim["patches"]), shim
    assert shim["control frames"] >= 1, shim  # the frame counter sees dmlshim's code run


@pytest.mark.parametrize("mode", list(SHIMMED))
@pytest.mark.parametrize("section", GROUP.split(","))
def test_every_answer_equals_native(section, mode):
    how, device = SHIMMED[mode]
    native = probe("native", GROUP)
    keys = _stable(native, probe("native", GROUP, again=1), section)
    diff = _differences(probe(how, GROUP, device), native, section, keys)
    assert not diff, f"{mode}, {section}: {_shown(diff)}"


@pytest.mark.parametrize("mode", list(SHIMMED))
def test_no_dmlshim_frame_in_a_training_step(mode):
    how, device = SHIMMED[mode]
    frames = probe(how, GROUP, device).sections["frames"]
    assert frames["dmlshim frames per step"] == 0, frames["dmlshim functions"]


@pytest.mark.parametrize("device", [None, "cuda"], ids=["auto", "cuda"])
def test_the_report_says_inert(device, tmp_path):
    from test_diagnostics import assert_valid_report

    path = tmp_path / "report.json"
    run = probe("runner", "frames", device, report=str(path))
    assert run.sections["frames"]["dmlshim frames per step"] == 0, run.sections["frames"]
    report = json.loads(path.read_text(encoding="utf-8"))
    assert_valid_report(report)
    target = report["target"]
    assert target["kind"] == "cuda" and target["inert"] is (device is None), target
    assert report["calls"]["total"] == 0, report["calls"]  # nothing redirected
    assert report["cpu_fallbacks"]["total"] == 0 and not report["attention"], report
    assert report["outcome"] == {"how": "finished", "exit_code": 0, "exception": None}
    if device is None:
        assert report["patches"] == ["diagnostics"], report["patches"]  # the report alone


@pytest.mark.parametrize("mode", list(SHIMMED))
def test_torch_compile_equals_native(mode):
    how, device = SHIMMED[mode]
    native = probe("native", "compile")
    for backend, result in native.sections["compile"].items():
        # a machine whose torch.compile fails natively proves nothing about it: say so
        assert "error" not in result, f"torch.compile({backend}) fails natively: {result}"
    keys = _stable(native, probe("native", "compile", again=1), "compile")
    diff = _differences(probe(how, "compile", device), native, "compile", keys)
    assert not diff, f"{mode}: {_shown(diff)}"


@pytest.mark.parametrize("mode", list(SHIMMED) + list(TORCHRUN_SHIMMED))
def test_nccl_ddp_equals_native(mode):
    how, device = {**SHIMMED, **TORCHRUN_SHIMMED}[mode]
    base = "native torchrun" if mode in TORCHRUN_SHIMMED else "native"
    native = probe(base, "ddp")
    assert native.sections["ddp"]["backend"] == "nccl", native.sections["ddp"]
    keys = _stable(native, probe(base, "ddp", again=1), "ddp")
    diff = _differences(probe(how, "ddp", device), native, "ddp", keys)
    assert not diff, f"{mode}: {_shown(diff)}"


@pytest.mark.parametrize("device", [None, "cuda"], ids=["auto", "cuda"])
def test_import_then_uninstall_leaves_torch_as_it_was(device):
    """The probe imports torch, then dmlshim (as a script's ``import dmlshim``), then calls
    ``dmlshim.uninstall()``: every attribute of torch's modules and classes is the same object
    as before, and torch's process-wide state (modes, hooks, flags, RNG) the same."""
    section = probe("native", "uninstall", device).sections["uninstall"]
    assert section["target"] == ["cuda", device is None], section

    def unexpected(diff: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(diff)
        env = out.pop("os.environ", None)
        if env is not None:
            before, after = env
            keys = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
            if keys - LEFT_BY_DESIGN:
                out["os.environ"] = sorted(keys)
        return out

    assert not unexpected(section["changed after uninstall"]), _shown(section)
    if device is None:  # inert: nothing changed even while imported
        assert not unexpected(section["changed while imported"]), _shown(section)
