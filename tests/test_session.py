"""One session object (issue 15): everything install() records lives on api.Shim and goes with
uninstall(); a forked child starts with its own records through one fork hook."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref

import pytest
import torch

from dmlshim import api, devicemap, events
from dmlshim.patches import cuda_api
from dmlshim.rebind import registry
from tests.helpers import clean_env


def _record_everything(adapters: int) -> None:
    """Make each part of the session hold something."""
    model = torch.nn.Linear(2, 2).cuda()  # Module.cuda: an event, and a conversion
    torch.optim.SGD(model.parameters(), lr=0.1)  # tracked by the rebind registry
    torch.ones(2).cuda()
    torch.cuda.set_device(adapters - 1)  # the device map's current ordinal
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    torch.cuda.default_stream()
    torch.cuda.memory_allocated()  # the memory peaks kept for the CPU target
    events.note("session.test")


@pytest.mark.parametrize("device, adapters", [("cpu", 1), ("emulated-dml:2", 2)])
def test_uninstall_drops_the_session_and_a_second_install_starts_fresh(shim, device, adapters):
    shim(device=device, log="info")  # info: call sites are recorded too
    session = api.session()
    assert session is not None and session.patches is not None
    assert events.current_log() is session.events
    assert devicemap.active() is session.devices
    assert registry.current() is session.rebind
    at_install = dict(session.events.notes)  # what install() itself notes (decompositions...)
    _record_everything(adapters)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert session.events.api_counts["Tensor.cuda"] == 1
    assert events.api_counts is session.events.api_counts  # the module attribute: the log's
    assert session.events.sites and session.events.notes["session.test"] == 1
    assert session.devices.current == adapters - 1
    assert opt in session.rebind.optimizers  # (weakly: the first one is gone already)
    streams = session.patch("cuda_api").streams
    assert streams.current and streams.default
    assert session.child_environment is not None
    assert 0 in session.memory_peaks or session.capabilities.emulated
    log, dmap, rebind = session.events, session.devices, session.rebind
    gone = weakref.ref(session)
    del session

    api.uninstall()
    gc.collect()
    assert gone() is None, gc.get_referrers(gone())  # nothing holds the installation
    assert api.session() is None and devicemap.active() is None
    assert events.current_log() is not log and not events.has_activity()
    assert registry.current() is not rebind and not registry.current().optimizers
    assert not cuda_api._streams().current and not cuda_api._streams().default
    assert devicemap.target() is None and devicemap.current_index() == 0
    events.note("nothing.installed")  # records into a detached log, without crashing
    del log, dmap, rebind, opt, model
    gc.collect()  # (a live optimizer would be found again by the next install's scan)

    shim(device=device)
    again = api.session()
    assert not again.events.api_counts and again.events.notes == at_install
    assert again.devices.current == again.target.index == 0
    assert not again.rebind.optimizers and not again.memory_peaks
    assert not again.patch("cuda_api").streams.current
    assert torch.ones(1).cuda().device.type == devicemap.device_for(None).type
    assert again.events.api_counts == {"Tensor.cuda": 1}


_FORK = r"""
import json, os
registered = []
real = os.register_at_fork
def counting(**hooks):
    registered.append(sorted(str(getattr(f, "__module__", "")) for f in hooks.values()))
    return real(**hooks)
os.register_at_fork = counting

import torch
import dmlshim
from dmlshim import api, events

for options in ({"device": "cpu"}, {"device": "cpu", "log": "info"}, {"device": "cpu"}):
    dmlshim.install(**options)  # a reinstall each time (the options differ)
dmlshim.uninstall()
dmlshim.install(device="cpu", check="1")
torch.ones(1).cuda()
calls = []
after_fork = api.Shim.after_fork
api.Shim.after_fork = lambda self: calls.append(1) or after_fork(self)
check = api.session().patch("check")
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    out = {"calls": len(calls), "counts": dict(events.api_counts),
           "activity": events.has_activity(), "log_is_session": events.current_log() is
           api.session().events, "check_paused": check._mode.paused}
    torch.ones(1).cuda()
    out["after"] = dict(events.api_counts)
    os.write(write, json.dumps(out).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 65536).decode())
os.waitpid(pid, 0)
ours = [m for m in registered if any(x.startswith("dmlshim") for x in m)]
print("RESULT " + json.dumps({"registered": ours, "child": child,
                              "parent": dict(events.api_counts)}))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="os.fork: POSIX only")
def test_a_forked_child_starts_with_an_empty_log_through_one_fork_hook():
    proc = subprocess.run([sys.executable, "-c", _FORK], capture_output=True, text=True,
                          env=clean_env(DMLSHIM_DISABLE="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["registered"] == [["dmlshim.api"]]  # once, for all four installs
    child = result["child"]
    assert child["calls"] == 1  # one hook ran, once
    assert child["counts"] == {} and not child["activity"] and child["log_is_session"]
    assert child["check_paused"]  # the check patch's after_fork stopped the shadow
    assert child["after"] == {"Tensor.cuda": 1}  # the child records its own calls
    assert result["parent"] == {"Tensor.cuda": 1}  # and the parent's are its own


# -- install(A), uninstall(), install(B) is a fresh process with B, for every option ------------

SESSION_PROBE = str(__import__("pathlib").Path(__file__).parent / "scripts" / "session_probe.py")
EMU = {"device": "emulated-dml"}

# (option, A, B): A leaves its mark on the process (rules, records, tracked optimizers, a device
# registered, a report path), B is what the probe compares. Every option of dmlshim.config, each
# way round where its default is one side.
REINSTALLS = [
    ("device", {"device": "emulated-dml:2"}, {"device": "cpu"}),
    ("device", {"device": "cpu"}, {"device": "emulated-dml:2"}),
    ("disable", dict(EMU, disable="0"), dict(EMU, disable="1")),
    ("log", dict(EMU, log="debug"), EMU),
    ("log", EMU, dict(EMU, log="info")),
    ("optimizer", dict(EMU, optimizer="off"), dict(EMU, optimizer="reset")),
    ("optimizer", dict(EMU, optimizer="reset"), EMU),
    ("amp", dict(EMU, amp="fp16"), EMU),
    ("amp", EMU, dict(EMU, amp="fp16")),
    ("float64", dict(EMU, float64="keep"), dict(EMU, float64="float32")),
    ("float64", dict(EMU, float64="float32"), dict(EMU, float64="keep")),
    ("bf16", dict(EMU, bf16="error"), dict(EMU, bf16="float16")),
    ("bf16", dict(EMU, bf16="float16"), dict(EMU, bf16="error")),
    ("decompose", EMU, dict(EMU, decompose="off")),
    ("decompose", dict(EMU, decompose="off"), EMU),
    ("guards", EMU, dict(EMU, guards="off")),
    ("guards", dict(EMU, guards="off"), EMU),
    ("emulator_gaps", dict(EMU, emulator_gaps="none"), dict(EMU, emulator_gaps="all,bug-bn-stats")),
    ("emulator_gaps", dict(EMU, emulator_gaps="all,bug-bn-stats"), dict(EMU, emulator_gaps="none")),
    ("emulator_memory", dict(EMU, emulator_memory="64"), EMU),
    ("emulator_memory", EMU, dict(EMU, emulator_memory="64")),
    ("report", dict(EMU, report="{tmp}/a.json"), EMU),
    ("report", EMU, dict(EMU, report="{tmp}/b.json")),
    ("check", dict(EMU, check="2"), EMU),
    ("check", EMU, dict(EMU, check="2")),
]


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    """One folder for every probe of a worker: a report path is part of what is compared."""
    return tmp_path_factory.mktemp("session-probe")


_FRESH: dict = {}  # options -> a fresh process's answer (the probe is deterministic)


def _fresh(options, tmp) -> dict:
    key = json.dumps(options, sort_keys=True)
    if key not in _FRESH:
        _FRESH[key] = _probe_session(options, tmp=tmp)
    return _FRESH[key]


def _probe_session(*option_sets, tmp) -> dict:
    args = [json.dumps({k: v.format(tmp=tmp) for k, v in o.items()}) for o in option_sets]
    proc = subprocess.run([sys.executable, SESSION_PROBE, *args], capture_output=True, text=True,
                          env=clean_env(DMLSHIM_DISABLE="1"), timeout=600, cwd=tmp)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SESSION ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("SESSION "):])


def test_every_option_is_covered_by_the_reinstall_matrix():
    from dmlshim import config

    assert {name for name, _, _ in REINSTALLS} == {o.name for o in config.OPTIONS}


@pytest.mark.slow
@pytest.mark.parametrize("option, first, then", REINSTALLS,
                         ids=[f"{n}:{json.dumps(a, sort_keys=True)}->{json.dumps(b, sort_keys=True)}"
                              for n, a, b in REINSTALLS])
def test_a_reinstall_behaves_as_a_fresh_process(option, first, then, probe_dir):
    fresh = _fresh(then, probe_dir)
    again = _probe_session(first, then, tmp=probe_dir)
    assert again == fresh
    # the option really decides something the probe sees (else the comparison proves little)
    assert _fresh(first, probe_dir) != fresh, option
