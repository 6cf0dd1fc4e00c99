"""DMLSHIM_CHECK (shadowing the first optimizer steps on the CPU) and gradient sanity.

* The emulator's wrong-result gaps, with the guards off, are each named with the op and the
  user's line; with the guards on nothing is reported. The cases are a list of (switch, snippet,
  expected ops): a new emulator gap is one more row.
* On the CPU target the corpus scripts report nothing and train bit-identically to a native run.
* A planted bug (a branch detached by mistake) is named at the first step.
* After the check is done nothing of dmlshim runs per step (counted with sys.setprofile).
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from helpers import describe, losses, run_native, run_shim
from test_diagnostics import assert_valid_report

from dmlshim import config
from dmlshim.check import compare

# (emulator switch, snippet, expected aten op: any of). Each snippet runs on "cuda" inside the
# first optimizer step; the line ending in "# <- here" is the user's line the report must name.
# A case runs when its switch is one DMLSHIM_EMULATOR_GAPS knows, and only the first case per
# expected op (the report keeps each op's first divergence): the default-gap names come first
# and take over from the opt-in bug-* switches once the emulator has them.
ALL_GAP_CASES: List[Tuple[str, str, Tuple[str, ...]]] = [
    ("eye", """
        ident = torch.eye(3, device="cuda")  # <- here
        """, ("aten::eye", "aten::eye.m")),
    ("mul-bool", """
        x = torch.randn(6, device="cuda")
        x *= x > 0  # <- here
        """, ("aten::mul_.Tensor",)),
    ("nll-none-backward", """
        logits = torch.randn(8, 5, device="cuda", requires_grad=True)
        target = torch.randint(0, 5, (8,), device="cuda")
        weights = torch.linspace(0.5, 2.0, 8, device="cuda")  # a non-uniform upstream gradient
        loss = (F.cross_entropy(logits, target, reduction="none") * weights).sum()  # <- here
        loss.backward()
        """, ("aten::nll_loss_backward",)),
    ("masked-fill-uint8", """
        mask = torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device="cuda")
        try:
            filled = torch.randn(4, device="cuda").masked_fill(mask, 0.0)  # <- here
        except RuntimeError:  # the CPU refuses a uint8 mask, and so does the guarded device
            pass
        """, ("aten::masked_fill.Scalar",)),
    ("reflect-pad", """
        padded = F.pad(torch.randn(1, 1, 6, 6, device="cuda"), (1, 2, 3, 4), mode="reflect")  # <- here
        """, ("aten::reflection_pad2d",)),
    ("bug-ce-none", """
        logits = torch.randn(8, 5, device="cuda", requires_grad=True)
        target = torch.randint(0, 5, (8,), device="cuda")
        weights = torch.linspace(0.5, 2.0, 8, device="cuda")  # a non-uniform upstream gradient
        loss = (F.cross_entropy(logits, target, reduction="none") * weights).sum()  # <- here
        loss.backward()
        """, ("aten::nll_loss_backward",)),
    ("bug-mul-bool", """
        x = torch.randn(6, device="cuda")
        x *= x > 0  # <- here
        """, ("aten::mul_.Tensor",)),
    ("bug-bn-stats", """
        bn = torch.nn.BatchNorm1d(4).cuda()
        bn(torch.randn(8, 4, device="cuda"))  # <- here
        """, ("aten::native_batch_norm", "aten::_native_batch_norm_legit",
              "aten::_batch_norm_with_update")),
]


def _gap_cases() -> List[Tuple[str, str, Tuple[str, ...]]]:
    known = set(config.EMULATOR_GAPS + config.EMULATOR_BUGS)
    out, ops = [], set()
    for case in ALL_GAP_CASES:
        if case[0] in known and not ops & set(case[2]):
            out.append(case)
            ops.update(case[2])
    return out


GAP_CASES = _gap_cases()
assert len(GAP_CASES) >= 3, GAP_CASES  # today: bug-ce-none, bug-mul-bool, bug-bn-stats

HEADER = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
p = torch.nn.Parameter(torch.ones(3, device="cuda"))
opt = torch.optim.SGD([p], lr=0.1)
"""
FOOTER = """\
(p * 2).sum().backward()
opt.step()
print("done")
"""


def gap_script(tmp_path: Path) -> Tuple[Path, Dict[str, int]]:
    """The cases' snippets in one script; {switch: line number of its "# <- here"}."""
    lines = HEADER.splitlines()
    where: Dict[str, int] = {}
    for switch, snippet, _ in GAP_CASES:
        for text in textwrap.dedent(snippet).strip().splitlines():
            lines.append(text)
            if text.endswith("# <- here"):
                where[switch] = len(lines)
    lines += FOOTER.splitlines()
    path = tmp_path / "gaps.py"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert set(where) == {c[0] for c in GAP_CASES}
    return path, where


def check_run(script, tmp_path: Path, *args: str, device: str = "cpu", env=None, **options):
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    proc = run_shim(script, *args, device=device, options={"report": str(report), **options},
                    env=env, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    data = json.loads(report.read_text(encoding="utf-8"))
    assert_valid_report(data)
    return proc, data


@pytest.mark.parametrize("guards", ["off", "on"])
def test_emulator_gaps_are_named_with_op_and_line(tmp_path, guards):
    script, where = gap_script(tmp_path)
    switches = ",".join(["all"] + [c[0] for c in GAP_CASES if c[0] not in config.EMULATOR_GAPS])
    proc, report = check_run(script, tmp_path, device="emulated-dml", check=2, guards=guards,
                             emulator_gaps=switches)
    check = report["check"]
    assert check["steps_requested"] == 2 and check["steps_shadowed"] == 1
    assert check["ops_compared"] > 20, check
    found = {d["op"]: d for d in check["divergences"]}
    if guards == "on":
        assert found == {}, check["divergences"]
        assert not any("DMLSHIM_CHECK" in a for a in report["attention"]), report["attention"]
        return
    for switch, _, ops in GAP_CASES:
        hits = [found[op] for op in ops if op in found]
        assert hits, f"{switch}: none of {ops} reported; found {sorted(found)}"
        d = hits[0]
        assert (d["file"], d["line"], d["step"]) == (str(script), where[switch], 1), d
        # the log shows the path as given, or relative to the working folder (the run's)
        assert any(f"{d['op']} at {shown}:{where[switch]}" in proc.stderr
                   for shown in (script, script.name)), describe(proc)
    assert len(found) == len(GAP_CASES), sorted(found)  # nothing else differs
    nll = found["aten::nll_loss_backward"]
    assert nll["phase"] == "backward" and nll["autograd_node"].startswith("NllLossBackward")
    # the wheel's backward uses grad_output[0] for every row: wrong wherever the weights differ
    assert nll["what"] == "values" and 0 < nll["max_rel_err"] <= 1.0 and nll["max_abs_err"] > 0
    mul = found["aten::mul_.Tensor"]
    assert (mul["what"], mul["device"], mul["cpu"]) == ("dtype", "bool[6]", "float32[6]")
    assert mul["inputs"] == ["float32[6]", "bool[6]"]
    assert any(line.startswith("dmlshim:   needs attention: DMLSHIM_CHECK: ")
               for line in proc.stderr.splitlines()), describe(proc)


# (script, args). lstm_lm has no optimizer (it steps by hand), so it is shadowed to its end.
# amp_train without torch.compile: compiled kernels are not aten ops (nothing to shadow), and
# compiling while a dispatch mode is on may round differently in the last bit.
# The emulator (default gaps, no bugs) computes on the CPU too: nothing to report there either.
CPU_CORPUS = [
    ("mlp", (), "cpu"),
    ("cnn", ("--epochs", "1"), "cpu"),
    ("transformer", ("--epochs", "1"), "cpu"),
    ("lstm_lm", ("--epochs", "1", "--bptt", "200"), "cpu"),
    ("amp_train", ("--epochs", "1", "--steps", "3", "--no-compile"), "cpu"),
    ("mlp", (), "emulated-dml"),
]


@pytest.mark.parametrize("script, args, device", CPU_CORPUS,
                         ids=[f"{c[0]}-{c[2]}" for c in CPU_CORPUS])
def test_no_false_positives_on_the_cpu(tmp_path, script, args, device):
    native = run_native(script, *args)
    assert native.returncode == 0, describe(native)
    proc, report = check_run(script, tmp_path, *args, device=device, check=1)
    assert losses(proc.stdout) == losses(native.stdout)  # the check changes nothing it runs
    assert losses(proc.stdout)
    check = report["check"]
    assert check["divergences"] == [] and check["gradients"]["problems"] == [], check
    assert check["ops_compared"] > 50, check
    if script != "lstm_lm":
        assert check["steps_shadowed"] == 1 and check["gradients"]["optimizers_checked"] == 1
    assert "DMLSHIM_CHECK" not in proc.stderr, describe(proc)


def test_a_detached_branch_is_named(tmp_path):
    proc, report = check_run("check_detached", tmp_path)  # check off: gradient sanity is always on
    problems = report["check"]["gradients"]["problems"]
    assert problems == [{"optimizer": "Adam", "steps": 3,
                         "no_gradient": {"count": 4, "where": ["model.branch"]},
                         "zero_gradient": {"count": 0, "where": []}}], problems
    assert report["check"]["steps_requested"] == 0 and report["check"]["ops_compared"] == 0
    line = next(x for x in proc.stderr.splitlines() if x.startswith("dmlshim:   needs attention:"))
    assert ("4 parameters of `model.branch` received no gradient in each of the first 3 steps "
            "of Adam") in line
    assert "DMLSHIM_CHECK=1" in line
    assert "model.frozen" not in proc.stderr and "model.unused" not in proc.stderr


def printed_names(stdout: str, key: str) -> List[str]:
    return [line.split()[1] for line in stdout.splitlines() if line.startswith(key + " ")]


def flagged(report, params: List[str]) -> List[str]:
    """The parameters the gradient alarm names (a module named stands for its parameters)."""
    out: List[str] = []
    for problem in report["check"]["gradients"]["problems"]:
        units = problem["no_gradient"]["where"] + problem["zero_gradient"]["where"]
        names = [p for p in params if any(p == u or p.startswith(u + ".") for u in units)]
        assert len(names) == problem["no_gradient"]["count"] + problem["zero_gradient"]["count"]
        out += names
    return sorted(out)


# (script, native args, shimmed args): each script prints the parameters its optimizer steps
# ("param") and those the run left unchanged ("unchanged"). The alarm must name exactly the
# parameters a native CPU run leaves unchanged.
GRADIENT_CASES = [
    # optimizer.step(closure): the backward runs inside step(): no alarm...
    ("check_lightning", ("--accelerator", "cpu"), ()),
    # ... and a detached branch is still named
    ("check_lightning", ("--accelerator", "cpu", "--detach"), ("--detach",)),
    # zero_init_residual: all-zero gradients at the first step only: no alarm over 3 steps...
    ("check_resnet", ("--device", "cpu"), ()),
    ("check_resnet", ("--device", "cpu", "--optimizer", "adam", "--steps", "2"),
     ("--optimizer", "adam", "--steps", "2")),
    # ... while a run of one step really leaves the zero-initialised blocks as they were
    ("check_resnet", ("--device", "cpu", "--steps", "1"), ("--steps", "1")),
    ("check_detached", (), ()),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)])
@pytest.mark.parametrize("script, native_args, args", GRADIENT_CASES,
                         ids=[f"{c[0]}{'-'.join(('',) + c[2])}" for c in GRADIENT_CASES])
def test_the_gradient_alarm_names_what_a_native_run_leaves_unchanged(tmp_path, script,
                                                                      native_args, args, device):
    if script == "check_lightning":
        pytest.importorskip("lightning")
    native = run_native(script, *native_args, env={"OMP_NUM_THREADS": "1"})
    assert native.returncode == 0, describe(native)
    proc, report = check_run(script, tmp_path, *args, device=device,
                             env={"OMP_NUM_THREADS": "1"})
    params = printed_names(proc.stdout, "param")
    assert params and params == printed_names(native.stdout, "param")
    unchanged = sorted(printed_names(native.stdout, "unchanged"))
    assert flagged(report, params) == unchanged, describe(proc)
    assert report["check"]["gradients"]["optimizers_checked"] == 1
    said = any("gradient in" in line for line in report["attention"])
    assert said == bool(unchanged), report["attention"]
    if device == "cpu":  # the alarm is only looking: the run is the native one
        assert losses(proc.stdout) == losses(native.stdout)


@pytest.mark.parametrize("check", ["off", "1"])
def test_nothing_of_dmlshim_runs_per_step_afterwards(shim, check):
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from dmlshim import api

    shim(device="cpu", check=check)
    results = api.session().patch("check").results
    # the check's own files (other patches answer torch's per-step torch.accelerator and
    # ones_like calls: not this option's business)
    pkg = os.path.dirname(os.path.abspath(config.__file__)) + os.sep
    mine = (pkg + "check" + os.sep, pkg + os.path.join("patches", "check.py"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    frames: List[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(mine):
            frames.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    sys.setprofile(profile)
    try:
        step()  # the first step: gradient sanity (and the shadow with check=1) run
    finally:
        sys.setprofile(None)
    assert frames, "the profiler sees dmlshim's frames at the first step"
    assert results.gradients_checked == 1
    assert (results.ops_compared > 0) == (check == "1")
    step()  # the loop comes round: the hook goes away at the end of this step
    frames.clear()
    sys.setprofile(profile)
    try:
        for _ in range(3):
            step()
    finally:
        sys.setprofile(None)
    assert frames == []
    assert _get_current_dispatch_mode() is None and not torch.is_anomaly_enabled()
    from torch.optim import optimizer as optim_mod

    assert not optim_mod._global_optimizer_pre_hooks and not optim_mod._global_optimizer_post_hooks
    assert "_optimizer_step_code" not in vars(opt)


@pytest.mark.parametrize("raw, ok", [("off", "off"), ("3", "3"), (" 1 ", "1"), ("0", None),
                                     ("-2", None), ("yes", None), ("1.5", None)])
def test_option_values(raw, ok):
    if ok is None:
        with pytest.raises(config.ConfigError) as err:
            config.load(environ={"DMLSHIM_CHECK": raw})
        assert str(err.value).startswith(f"dmlshim: invalid DMLSHIM_CHECK={raw!r}; valid values:")
    else:
        assert config.load(environ={"DMLSHIM_CHECK": raw}).check == ok


def test_compare_tolerances_and_special_values():
    import torch

    a = torch.tensor([1.0, 2.0, float("nan"), float("inf")])
    assert compare.compare_values(a.clone(), a) is None
    assert compare.compare_values(a * (1 + 5e-5), a) is None  # within float32's rtol
    m = compare.compare_values(a * 1.01, a)
    assert m.what == "values" and math.isclose(m.max_rel_err, 0.01, rel_tol=1e-3)
    nan_moved = torch.tensor([1.0, float("nan"), 2.0, float("inf")])
    assert compare.compare_values(nan_moved, a).what == "nan/inf positions"
    assert compare.compare_values(a.half(), a).what == "dtype"
    assert compare.compare_values(a[:3], a).what == "shape"
    assert compare.compare_values(torch.zeros(3), torch.ones(3)).max_rel_err == 1.0
    assert compare.compare_values(torch.ones(2), torch.zeros(2)).max_rel_err == math.inf
    assert compare.compare_values(torch.tensor([1, 2]), torch.tensor([1, 3])).what == "values"
    d = torch.tensor([1.0], dtype=torch.float64)
    assert compare.compare_values(d * (1 + 1e-7), d) is not None  # float32 precision in float64
    assert compare.compare_values(3.0, 3.0000001) is None and compare.compare_values(1, 2)


def test_children_run_without_the_check(shim, monkeypatch):
    monkeypatch.setenv("DMLSHIM_CHECK", "3")  # as the runner exports it
    shim(device="cpu", check="3")
    assert os.environ["DMLSHIM_CHECK"] == "off"  # spawned workers and subprocesses: no shadow
    import dmlshim

    dmlshim.uninstall()
    assert os.environ["DMLSHIM_CHECK"] == "3"


# The check on the emulator with every gap of the wheel on (max-pool indices flattened over
# the tensor, masked_fill_ under a dispatch mode returning a new tensor, ...): no crash, the
# losses of the run without the check, guards on and off; and no divergence where the device
# is right (with guards on, every gap these models hit is fixed or right).
CHECKED_MODELS = [("check_resnet", ("--steps", "2")), ("check_gpt", ("--attn", "masked_fill_")),
                  ("check_gpt", ("--attn", "masked_fill"))]


@pytest.mark.emulator
@pytest.mark.parametrize("guards", ["off", "on"])
@pytest.mark.parametrize("script, args", CHECKED_MODELS, ids=["-".join((c[0],) + c[1][-1:])
                                                              for c in CHECKED_MODELS])
def test_the_check_changes_nothing_on_the_strict_emulator(tmp_path, script, args, guards):
    env = {"OMP_NUM_THREADS": "1"}
    plain = run_shim(script, *args, device="emulated-dml", env=env,
                     options={"guards": guards, "emulator_gaps": "all"})
    assert plain.returncode == 0, describe(plain)
    proc, report = check_run(script, tmp_path, *args, device="emulated-dml", env=env, check=2,
                             guards=guards, emulator_gaps="all")
    assert losses(proc.stdout) == losses(plain.stdout) and losses(proc.stdout), describe(proc)
    check = report["check"]
    assert check["steps_shadowed"] == 2 and check["ops_compared"] > 100, check
    assert check["divergences"] == [], check["divergences"]


def test_outputs_nobody_reads_are_not_compared():
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from dmlshim.check.results import Results
    from dmlshim.check.shadow import ShadowMode

    aten = torch.ops.aten
    results = Results()
    mode = ShadowMode("cpu", results)

    class Lying(type(mode)):
        """Hands the comparison what the wheel returns for outputs nobody reads."""

        def _run(self, func, info, args, kwargs):
            out = super()._run(func, info, args, kwargs)
            if func is aten.nll_loss_forward.default:
                return out[0], torch.tensor(31.0)  # not what the CPU has (0, or 32)
            if func is aten.convolution_backward.default:
                return tuple(torch.zeros(1) if o is None else o for o in out)
            return out

    mode = Lying("cpu", results)
    logits, target = torch.randn(32, 5), torch.randint(0, 5, (32,))
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    grad = torch.randn(1, 3, 3, 3)
    with mode:
        aten.nll_loss_forward(logits, target, None, 0, -100)  # reduction none
        aten.convolution_backward(grad, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                  [True, False, False])
    assert _get_current_dispatch_mode() is None
    assert results.ops_compared == 2 and not results.first, results.first
    with mode:  # what the caller reads is still compared
        aten.nll_loss_forward(logits, target, None, 1, -100)  # mean: total_weight is read
    assert list(results.first) == ["aten::nll_loss_forward"]
    assert results.first["aten::nll_loss_forward"].result == "output 1"


@pytest.mark.emulator
def test_the_masked_fill_mode_gap_is_the_wheels(shim):
    """The emulator's masked-fill-mode gap does what the facts file says the wheel does, and
    the shadow gives the script the in-place result all the same."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from dmlshim import api

    shim(device="emulated-dml", guards="off", emulator_gaps="all")

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.masked_fill_.Scalar:
                self.returned_self = out is args[0]
            return out

    mask = torch.tensor([True, False, True], device="cuda")
    x = torch.zeros(3, device="cuda")
    x.masked_fill_(mask, 1.0)
    assert x.cpu().tolist() == [1.0, 0.0, 1.0]  # no mode: in place
    mode = PassThrough()
    with mode:
        y = torch.zeros(3, device="cuda")
        y.masked_fill_(mask, 1.0)
        z = torch.zeros(3, device="cuda").masked_fill(mask, 2.0)
    assert mode.returned_self is False and y.cpu().tolist() == [0.0, 0.0, 0.0]
    assert z.cpu().tolist() == [2.0, 0.0, 2.0]  # out of place: right
    results = api.session().patch("check").results
    from dmlshim.check.shadow import ShadowMode

    with ShadowMode("privateuseone", results):
        w = torch.zeros(3, device="cuda")
        w.masked_fill_(mask, 1.0)
    assert w.cpu().tolist() == [1.0, 0.0, 1.0] and not results.first
