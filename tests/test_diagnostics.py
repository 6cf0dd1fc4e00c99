"""Diagnostics: the per-call-site log, the exit summary, the JSON report and its schema.

The subprocess tests run tests/corpus/diag/call_sites.py, whose changed lines carry
``# site: <api> -> <became> [<tag>]`` markers: the expected log lines come from the markers.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
from helpers import CORPUS, describe, run_shim

from dmlshim import events
from dmlshim.patches import diagnostics
from dmlshim.patching import get_original, is_patched

SCRIPT = CORPUS / "diag" / "call_sites.py"
CHILDREN = CORPUS / "diag" / "children.py"
SCHEMA = json.loads(Path(diagnostics.schema_path()).read_text(encoding="utf-8"))
FALLBACK_TEXT = ("The operator '{op}' is not currently supported on the DML backend and will "
                 "fall back to run on the CPU. This may have performance implications.")

try:  # a second, independent opinion on the schema when the library happens to be installed
    import jsonschema
except ImportError:  # pragma: no cover - the tiny validator below always runs
    jsonschema = None


# -- a tiny JSON-schema validator (the subset report_schema.json uses) ------------------------

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def schema_errors(value: Any, schema: Dict[str, Any], root: Dict[str, Any] = SCHEMA,
                  path: str = "$") -> List[str]:
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        return schema_errors(value, target, root, path)
    errors: List[str] = []
    known = {"$schema", "$id", "title", "description", "type", "enum", "const", "properties",
             "required", "additionalProperties", "items", "minimum", "definitions"}
    assert set(schema) <= known, f"validator does not know {set(schema) - known}"
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            return [f"{path}: {value!r} is not {schema['type']}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} != {schema['const']!r}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        errors.append(f"{path}: {value!r} < {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += schema_errors(item, props[key], root, f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}: unexpected {key!r}")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, root, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], root, f"{path}[{i}]")
    return errors


def assert_valid_report(report: Dict[str, Any]) -> None:
    errors = schema_errors(report, SCHEMA)
    assert not errors, "report does not match dmlshim/report_schema.json:\n" + "\n".join(errors)
    if jsonschema is not None:
        jsonschema.validate(report, SCHEMA)


# -- helpers ------------------------------------------------------------------------------------

def expected_sites(dev: str) -> List[Dict[str, Any]]:
    """The ``# site:`` markers of call_sites.py: line, api, became, tag, count."""
    out = []
    marker = re.compile(r"#\s*site:\s*(\S+)\s*->\s*(\S+)\s*\[(\w+)\](?:\s*x(\d+))?")
    for lineno, text in enumerate(SCRIPT.read_text(encoding="utf-8").splitlines(), start=1):
        m = marker.search(text)
        if m:
            out.append({"line": lineno, "api": m.group(1), "became": m.group(2).format(dev=dev),
                        "tag": m.group(3), "count": int(m.group(4) or 1)})
    assert len(out) >= 7
    return out


def dmlshim_lines(stderr: str) -> List[str]:
    return [line[len("dmlshim: "):] for line in stderr.splitlines() if line.startswith("dmlshim: ")]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.DEBUG) -> List[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture
def records():
    handler = _Records()
    logger = logging.getLogger("dmlshim")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def fresh_events():
    events.reset()
    yield
    events.reset()


def _patch_instance():
    from dmlshim import api

    patch = api.session().patch("diagnostics")
    assert patch is not None and patch.installed
    return patch


# -- events: how a call is shown ----------------------------------------------------------------

@pytest.mark.parametrize("api, original, arg, shown", [
    ("Tensor.cuda", "", "", "Tensor.cuda()"),
    ("Tensor.cuda", 1, "", "Tensor.cuda(1)"),
    ("Tensor.to", "cuda:0", "", "Tensor.to('cuda:0')"),
    ("torch.zeros", "cuda", "device", "torch.zeros(device='cuda')"),
    ("Tensor.pin_memory", "pin_memory()", "", "Tensor.pin_memory()"),
    ("DataLoader(pin_memory=True)", True, "", "DataLoader(pin_memory=True)"),
    ("DataLoader(pin_memory_device)", "cuda", "", "DataLoader(pin_memory_device='cuda')"),
])
def test_render_call(api, original, arg, shown):
    assert events.render_call(api, original, arg) == shown


def test_display_path_is_relative_below_the_working_directory(tmp_path):
    inside = str(tmp_path / "sub" / "train.py")
    assert events.display_path(inside, str(tmp_path)) == os.path.join("sub", "train.py")
    assert events.display_path("/elsewhere/train.py", str(tmp_path)) == "/elsewhere/train.py"


# -- in process: call-site log, fallback capture, report --------------------------------------

def test_a_map_location_is_shown_as_one(shim, fresh_events, tmp_path):
    import torch

    shim(device="cpu", log="info")
    path = tmp_path / "t.pt"
    torch.save(torch.ones(1), path)
    for where in (("cuda:0",), ()):
        torch.load(path, *where, **({} if where else {"map_location": "cuda:0"}))
    calls = {s.call for s in events.call_sites() if s.api == "torch.load"}
    assert calls == {"torch.load(map_location='cuda:0')"}, calls


def test_each_call_site_logged_once_at_info(shim, records, fresh_events):
    import torch

    shim(device="cpu", log="info")
    for _ in range(3):
        torch.zeros(1, device="cuda"); line = sys._getframe().f_lineno  # noqa: E702
    torch.ones(1, device="cuda:0"); line2 = sys._getframe().f_lineno  # noqa: E702
    here = events.display_path(__file__)
    site_lines = [m for m in records.messages() if m.startswith(here + ":")]
    assert len(site_lines) == 2, site_lines  # three calls on one line: logged once
    # (device=)? : the devices patch may name the keyword it saw (events.redirected(arg=...))
    assert re.fullmatch(re.escape(f"{here}:{line}: torch.zeros(") + r"(device=)?'cuda'\) -> "
                        r"cpu \[redirected\]", site_lines[0]), site_lines[0]
    assert re.fullmatch(re.escape(f"{here}:{line2}: torch.ones(") + r"(device=)?'cuda:0'\) "
                        r"-> cpu \[redirected\]", site_lines[1]), site_lines[1]
    sites = {(s.line, s.api): s for s in events.call_sites()}
    assert sites[(line, "torch.zeros")].count == 3
    assert sites[(line2, "torch.ones")].count == 1
    assert sites[(line, "torch.zeros")].file == os.path.abspath(__file__)


def test_nothing_logged_at_the_default_level(shim, records, fresh_events):
    import torch

    shim(device="cpu")
    torch.zeros(1, device="cuda")
    assert records.messages(logging.INFO) == []
    assert events.api_counts["torch.zeros"] == 1  # still counted
    assert events.call_sites() == []  # but no frame walks without a reader


def test_fallback_warnings_are_counted_and_still_shown(shim, fresh_events):
    shim(device="cpu")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for op in ("aten::lerp.Scalar_out", "aten::lerp.Scalar_out", "aten::cumprod.out"):
            warnings.warn(FALLBACK_TEXT.format(op=op), UserWarning, stacklevel=1)
        warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
    assert len(shown) == 4  # the user sees every warning as before
    assert dict(events.cpu_fallbacks) == {"aten::lerp.Scalar_out": 2, "aten::cumprod.out": 1}
    report = _patch_instance().report()
    assert report["cpu_fallbacks"] == {"counting": "warnings", "total": 3,
                                       "ops": {"aten::lerp.Scalar_out": 2,
                                               "aten::cumprod.out": 1}}
    assert any("ran on the CPU" in a for a in report["attention"])


def test_every_fallback_call_counted_where_the_wheel_warns_once(shim, fresh_events, monkeypatch):
    # What the shim does on DirectML with diagnostics asked for (the wheel's path, in process:
    # its caps faked as DirectML's): warn_always on, an "always" filter after the script's own.
    import torch

    assert not torch.is_warn_always_enabled()
    shim(device="cpu", log="info")
    patch = _patch_instance()
    monkeypatch.setattr(patch._caps, "directml", True)
    patch._count_every_fallback()
    assert torch.is_warn_always_enabled() and patch.counting() == "warnings"
    assert warnings.filters[-1] is patch._fallback_filter

    def fallback(op):
        warnings.warn(FALLBACK_TEXT.format(op=op), UserWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as shown:
        for _ in range(3):  # one source line, as in a training loop
            fallback("aten::amin.out")
        fallback("aten::cumprod.out")
        warnings.filterwarnings("ignore", message="The operator 'aten::huber_loss'")
        fallback("aten::huber_loss")  # the script's own filter decides first: not seen
    assert dict(events.cpu_fallbacks) == {"aten::amin.out": 3, "aten::cumprod.out": 1}
    assert [str(w.message).split("'")[1] for w in shown] == ["aten::amin.out",
                                                             "aten::cumprod.out"]
    report = patch.report()["cpu_fallbacks"]
    assert report == {"counting": "warnings", "total": 4,
                      "ops": {"aten::amin.out": 3, "aten::cumprod.out": 1}}
    torch.set_warn_always(False)  # the script turns it off: the counts are no longer per call
    assert patch.report()["cpu_fallbacks"]["counting"] == "first-warning"
    torch.set_warn_always(True)
    ours = patch._fallback_filter
    import dmlshim

    dmlshim.uninstall()
    assert not torch.is_warn_always_enabled() and ours not in warnings.filters


def test_report_of_an_in_process_run_matches_the_schema(shim, fresh_events, tmp_path):
    import torch

    shim(device="cpu", report=str(tmp_path / "r.json"), optimizer="rebind")
    torch.zeros(2, device="cuda").cuda()
    torch.zeros(2).pin_memory()
    events.note("optimizer.rebind")
    events.note("guard.ce_none", 2)
    events.attention("optimizer.test", "the optimizer test reported a problem")
    report = _patch_instance().report()
    assert_valid_report(report)
    assert report["target"]["kind"] == "cpu"
    assert report["options"]["report"] == {"value": str(tmp_path / "r.json"),
                                           "source": "install()"}
    assert report["options"]["device"]["source"] == "install()"
    assert report["calls"]["by_api"]["Tensor.pin_memory"] == {"count": 1, "tag": "dropped"}
    assert report["notes"] == {"guard.ce_none": 2, "optimizer.rebind": 1}
    assert "the optimizer test reported a problem" in report["attention"]
    assert report["process"]["role"] == "main"
    assert report["patches"][-1] == "diagnostics"
    lines = diagnostics.summary_lines(report)
    assert "  optimizer: rebind x1" in lines
    assert "  guards applied: ce_none x2" in lines
    assert "  needs attention: the optimizer test reported a problem" in lines


def test_the_validator_rejects_broken_reports(shim, fresh_events):
    shim(device="cpu")
    good = _patch_instance().report()
    assert schema_errors(good, SCHEMA) == []
    broken = [
        {**good, "schema_version": 2},
        {k: v for k, v in good.items() if k != "outcome"},
        {**good, "surprise": 1},
        {**good, "outcome": {**good["outcome"], "how": "crashed"}},
        {**good, "cpu_fallbacks": {**good["cpu_fallbacks"], "ops": {"aten::x": "3"}}},
        {**good, "call_sites": [{"file": "a.py", "line": 1}]},
        {**good, "process": {**good["process"], "pid": True}},
    ]
    for report in broken:
        assert schema_errors(report, SCHEMA), report


def test_exit_summary_level(shim, records, fresh_events):
    import torch

    shim(device="cpu")  # default level: warning
    patch = _patch_instance()
    torch.zeros(1, device="cuda")
    patch.at_exit()
    assert records.messages() == []  # nothing needs attention: silent
    events.attention("x", "something to look at")
    patch.at_exit()
    warnings_logged = records.messages(logging.WARNING)
    assert warnings_logged[0].startswith("summary: target cpu")
    assert "  needs attention: something to look at" in warnings_logged


def test_known_problem_counters_need_attention(shim, fresh_events):
    shim(device="cpu")
    events.note("optimizer.rebind", 4)
    assert _patch_instance().report()["attention"] == []
    events.note("optimizer.stale", 3)
    attention = _patch_instance().report()["attention"]
    assert len(attention) == 1 and "stepping 3 parameter(s)" in attention[0]


def test_uninstall_restores_hooks_and_environment(shim, tmp_path, monkeypatch):
    monkeypatch.delenv(diagnostics.REPORT_OWNER_ENV, raising=False)
    originals = (warnings._showwarnmsg, sys.excepthook, sys.exit)
    registered: List[Any] = []
    unregistered: List[Any] = []
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: registered.append(fn) or fn)
    monkeypatch.setattr(atexit, "unregister", unregistered.append)
    shim(device="cpu", report=str(tmp_path / "r.json"))
    assert is_patched(warnings, "_showwarnmsg") and is_patched(sys, "excepthook")
    assert is_patched(sys, "exit")
    assert get_original(sys, "exit") is originals[2]
    # one process-wide handler, registered by the first install() of the process
    from dmlshim import api

    assert registered in ([], [api._at_exit])
    diagnostics_patch = _patch_instance()
    assert os.environ[diagnostics.REPORT_OWNER_ENV] == f"{os.getpid()}:{tmp_path / 'r.json'}"
    import dmlshim

    dmlshim.uninstall()
    assert (warnings._showwarnmsg, sys.excepthook, sys.exit) == originals
    assert warnings._showwarnmsg is originals[0] and sys.exit is originals[2]
    assert sys.excepthook is originals[1]
    assert unregistered == [] and api.session() is None
    assert not diagnostics_patch.installed
    assert diagnostics.REPORT_OWNER_ENV not in os.environ
    assert not (tmp_path / "r.json").exists()


def test_child_report_path():
    assert diagnostics.child_report_path("/r/report.json", 42) == "/r/report.42.json"
    assert diagnostics.child_report_path("/r/report", 42) == "/r/report.42"


# -- subprocess: the real thing -----------------------------------------------------------------

def _check_log_and_report(proc, report_path: Path, dev: str) -> Dict[str, Any]:
    assert report_path.exists(), describe(proc)
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert_valid_report(report)
    lines = dmlshim_lines(proc.stderr)
    site_lines = [line for line in lines if ": " in line and line.split(": ", 1)[0]
                  .rsplit(":", 1)[0].endswith("call_sites.py")]
    script_file = report["call_sites"][0]["file"]
    assert os.path.basename(script_file) == "call_sites.py"
    expected = expected_sites(dev)
    assert len(site_lines) == len(expected), describe(proc)
    for exp, line in zip(expected, site_lines):
        shown = events.display_path(script_file, report["process"]["cwd"])
        pattern = (re.escape(f"{shown}:{exp['line']}: {exp['api']}") + r"\(.*\)"
                   + re.escape(f" -> {exp['became']} [{exp['tag']}]") + "$")
        assert re.match(pattern, line), (line, pattern)
    got = [(s["line"], s["api"], s["became"], s["tag"], s["count"]) for s in report["call_sites"]
           if s["file"] == script_file]
    assert got == [(e["line"], e["api"], e["became"], e["tag"], e["count"]) for e in expected]
    assert report["process"]["argv"][0].endswith("call_sites.py")
    return report


def test_runner_info_log_summary_and_report(tmp_path):
    report_path = tmp_path / "report.json"
    proc = run_shim(SCRIPT, "fallback", device="cpu",
                    options={"log": "info", "report": str(report_path)})
    assert proc.returncode == 0, describe(proc)
    report = _check_log_and_report(proc, report_path, "cpu")
    assert report["outcome"] == {"how": "finished", "exit_code": 0, "exception": None}
    assert report["cpu_fallbacks"]["ops"] == {"aten::_foreach_add_.List": 1,
                                              "aten::lerp.Scalar_out": 1}
    assert report["options"]["log"] == {"value": "info", "source": "env"}
    lines = dmlshim_lines(proc.stderr)
    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("summary: ")):]
    assert summary[0].startswith("summary: target cpu (DMLSHIM_DEVICE=cpu); ")
    assert summary[0].endswith("script finished")
    assert "    redirected: Module.cuda x1, Tensor.cuda x1, Tensor.to x1, torch.ones x3, " \
           "torch.zeros x1" in summary
    assert "    dropped: Tensor.pin_memory x1" in summary
    assert "    unsupported: torch.cuda.graph_pool_handle x1" in summary
    assert "  CPU fallbacks (calls, from torch-directml's warnings): aten::_foreach_add_.List " \
           "x1, aten::lerp.Scalar_out x1" in summary
    assert summary[-1] == f"  report: {report_path}"
    # the fallback warnings themselves still reach the user
    assert proc.stderr.count("UserWarning: The operator 'aten::") == 2


def test_default_level_is_silent_when_nothing_needs_attention(tmp_path):
    proc = run_shim(SCRIPT, "clean", device="cpu")
    assert proc.returncode == 0, describe(proc)
    assert dmlshim_lines(proc.stderr) == [], describe(proc)


@pytest.mark.parametrize("via, mode, how, code, exception", [
    ("runner", "raise", "exception", 1, "ValueError: boom from the script"),
    ("import", "exit", "exit", 3, None),
    ("import", "interrupt", "interrupted", 130, "KeyboardInterrupt"),
])
def test_report_written_when_the_script_does_not_finish(tmp_path, via, mode, how, code, exception):
    report_path = tmp_path / "report.json"
    proc = run_shim(SCRIPT, mode, device="cpu", via=via, options={"report": str(report_path)})
    expected_rc = code if not (via == "import" and mode == "interrupt") else -2
    assert proc.returncode in (code, expected_rc), describe(proc)
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert_valid_report(report)
    assert report["outcome"] == {"how": how, "exit_code": code, "exception": exception}
    assert report["calls"]["by_api"]["torch.ones"]["count"] == 3
    if mode == "raise":
        assert "ValueError: boom from the script" in proc.stderr  # the traceback is still there
    # default log level: no call-site lines, but the summary, because an unsupported torch.cuda
    # API was hit (that needs attention)
    lines = dmlshim_lines(proc.stderr)
    assert lines and lines[0].startswith("summary: target cpu"), describe(proc)
    assert not any("[redirected]" in line for line in lines)
    assert any(line.startswith("  needs attention: the script called CUDA APIs") and
               "torch.cuda.graph_pool_handle" in line for line in lines), lines
    assert lines[-1] == f"  report: {report_path}"


FAKE_CUDA = """
import sys, torch
torch.cuda.is_available = lambda: True  # what auto sees on an NVIDIA machine
torch.cuda.device_count = lambda: 1
import dmlshim
print(dmlshim.is_installed(), dmlshim.current_target().kind)
try:
    torch.ones(1).to("cuda:0")
except RuntimeError as err:  # nothing redirected: the call reaches CUDA, which is not there
    print("cuda", "NVIDIA" in str(err) or "CUDA" in str(err))
sys.exit(3)
"""


def test_inert_target_writes_the_report_it_was_asked_for(tmp_path):
    """On a real CUDA machine ``auto`` leaves everything to CUDA; a report asked for still comes,
    saying so (target cuda, inert, why) and how the script ended."""
    from tests.helpers import clean_env

    report_path = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-c", FAKE_CUDA], capture_output=True, text=True, cwd=tmp_path,
        env=clean_env(DMLSHIM_REPORT=str(report_path), DMLSHIM_DXG_PATH=str(tmp_path / "no-dxg")),
        timeout=300)
    assert proc.returncode == 3, describe(proc)
    assert proc.stdout.split() == ["False", "cuda", "cuda", "True"], describe(proc)
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert_valid_report(report)
    assert report["target"]["kind"] == "cuda" and report["target"]["inert"] is True
    assert "real CUDA is present; dmlshim stays inert" in report["target"]["reason"]
    assert report["patches"] == ["diagnostics"] and report["calls"]["total"] == 0
    assert report["outcome"] == {"how": "exit", "exit_code": 3, "exception": None}


def test_emulated_directml_log_and_exact_fallback_counts(tmp_path):
    report_path = tmp_path / "report.json"
    proc = run_shim(SCRIPT, "cumprod", device="emulated-dml",  # (decompose off: cumprod falls back)
                    options={"log": "info", "report": str(report_path), "decompose": "off"})
    assert proc.returncode == 0, describe(proc)
    report = _check_log_and_report(proc, report_path, "privateuseone:0")
    assert report["target"]["kind"] == "emulated-dml"
    # the emulator counts every call; torch-directml's warning still shows once per op
    assert report["cpu_fallbacks"] == {"counting": "exact", "ops": {"aten::cumprod.out": 3},
                                       "total": 3, "bytes": {"aten::cumprod.out": {"to_host": 36, "to_device": 36}}}
    assert proc.stderr.count("UserWarning: The operator 'aten::cumprod.out'") == 1
    lines = dmlshim_lines(proc.stderr)
    assert "  CPU fallbacks (calls): aten::cumprod.out x3" in lines
    assert any(line.startswith("  needs attention: 1 op(s) ran on the CPU instead of the device: "
                               "aten::cumprod.out") for line in lines)


def test_in_process_emulator_counts(shim, fresh_events):
    import torch

    import emulated_dml as emulator

    shim(device="emulated-dml", decompose="off")  # (on, cumprod has a device kernel)
    emulator.reset_fallback_counts()
    x = torch.arange(1.0, 4.0, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the count must not depend on the warning being shown
        x.cumprod(0)
        x.cumprod(0)
    report = _patch_instance().report()
    assert_valid_report(report)
    assert report["cpu_fallbacks"] == {"counting": "exact", "ops": {"aten::cumprod.out": 2},
                                       "total": 2, "bytes": {"aten::cumprod.out": {"to_host": 24, "to_device": 24}}}
    assert report["target"]["kind"] == "emulated-dml"


def test_children_never_overwrite_the_parents_report(tmp_path):
    report_path = tmp_path / "report.json"
    proc = run_shim(CHILDREN, str(report_path), device="cpu", via="runner",
                    options={"report": str(report_path)})
    assert proc.returncode == 0, describe(proc)
    pids = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if parts[0] == "child":
            pids[parts[1]] = int(parts[2])
        elif parts[0] == "parent":
            pids["parent"] = int(parts[1])
    parent = json.loads(report_path.read_text(encoding="utf-8"))
    assert_valid_report(parent)
    assert parent["process"]["pid"] == pids["parent"]
    assert parent["process"]["role"] == "main"
    assert set(parent["calls"]["by_api"]) == {"torch.zeros"}  # nothing from the children
    for kind, api in (("busy", "torch.ones"), ("fork", "torch.full")):
        child_path = tmp_path / f"report.{pids[kind]}.json"
        child = json.loads(child_path.read_text(encoding="utf-8"))
        assert_valid_report(child)
        assert child["process"]["role"] == "child"
        assert child["process"]["report_owner_pid"] == pids["parent"]
        assert set(child["calls"]["by_api"]) == {api}, (kind, child["calls"])
    assert not (tmp_path / f"report.{pids['idle']}.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["report.json", f"report.{pids['busy']}.json", f"report.{pids['fork']}.json"])
