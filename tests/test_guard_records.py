"""Every reference in a guard's record resolves (dmlshim/kernels/guards/records.py): its kernels'
ops exist in this torch's schema and the kernels take the schema's arguments, its emulator
switches exist, its test node ids name tests that exist (parametrized ids included), its op
battery cases are the real-wheel lane's, the events it notes are the ones its code notes, and
what it wraps exists. Read from the source and the records; nothing is run on a device.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import pathlib
from typing import Any, Dict, Iterator, List, Optional, Set

import pytest
import torch

from dmlshared import emulator_switches
from dmlshim import patching
from dmlshim.kernels.guards import records
from dmlshim.kernels.guards.records import GUARDS, Guard

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAMILIES = ROOT / "dmlshim" / "kernels" / "guards"
IDS = [g.name for g in GUARDS]


# -- pytest node ids, resolved from the test files' source -------------------------------------


def _literal(node: ast.AST, names: Dict[str, ast.AST]) -> Any:
    """The value of a literal (or of a module-level name bound to one); pytest.param(v, id=x)
    is ('param', v, x)."""
    if isinstance(node, ast.Name) and node.id in names:
        return _literal(names[node.id], names)
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("pytest.param"):
        ident = next((k.value.value for k in node.keywords if k.arg == "id"), None)
        return ("param", _literal(node.args[0], names), ident)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, names) for e in node.elts] if isinstance(node, ast.List) \
            else tuple(_literal(e, names) for e in node.elts)
    return ast.literal_eval(node)


def _one_id(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "param":
        return value[2] if value[2] is not None else _one_id(value[1])
    if isinstance(value, tuple):  # several argnames: pytest joins the values' ids
        return "-".join(_one_id(v) for v in value)
    return str(value)


def _ids(decorator: ast.Call, names: Dict[str, ast.AST]) -> List[str]:
    values = _literal(decorator.args[1], names)
    ids = next((k.value for k in decorator.keywords if k.arg == "ids"), None)
    if ids is not None:
        return list(_literal(ids, names))
    return [_one_id(v) for v in values]


def node_ids(path: pathlib.Path, root: pathlib.Path = ROOT) -> Set[str]:
    """The node ids of the test functions in ``path`` (relative to ``root``): ``file::name``
    and, for parametrized ones, ``file::name[id]`` for each id (stacked parametrizations:
    pytest's order)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: Dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            names[node.targets[0].id] = node.value
    rel = path.relative_to(root).as_posix()
    out: Set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            continue
        out.add(f"{rel}::{node.name}")
        stacks = [_ids(d, names) for d in node.decorator_list if isinstance(d, ast.Call)
                  and ast.unparse(d.func).endswith("mark.parametrize")]
        for combo in itertools.product(*reversed(stacks)) if stacks else ():
            out.add(f"{rel}::{node.name}[{'-'.join(combo)}]")
    return out


def test_the_node_id_reader_sees_parametrized_ids(tmp_path):
    test_file = tmp_path / "tests" / "test_probe.py"
    test_file.parent.mkdir()
    test_file.write_text(
        "import pytest\nCASES = ['a', 'b']\n"
        "@pytest.mark.parametrize('x', CASES)\ndef test_one(x): pass\n"
        "@pytest.mark.parametrize('y', [False, True], ids=['off', 'on'])\n"
        "@pytest.mark.parametrize('z', [1, pytest.param(2, id='two')])\n"
        "def test_two(y, z): pass\ndef helper(): pass\n", encoding="utf-8")
    rel = "tests/test_probe.py::"
    assert node_ids(test_file, tmp_path) == {
        rel + n for n in ("test_one", "test_one[a]", "test_one[b]", "test_two",
                          "test_two[1-off]", "test_two[1-on]", "test_two[two-off]",
                          "test_two[two-on]")}


def _resolves(node_id: str) -> Optional[str]:
    """None, or why ``node_id`` names no test."""
    path = ROOT / node_id.split("::")[0]
    if not path.is_file():
        return f"{node_id}: no file {path.relative_to(ROOT)}"
    if node_id not in node_ids(path):
        return f"{node_id}: no such test in {path.relative_to(ROOT)}"
    return None


# -- the records ---------------------------------------------------------------------------------


def test_one_record_per_guard_and_the_names_users_see():
    assert len(IDS) == len(set(IDS)) == 26
    # the event names of the exit summary and the report, and the switches' spellings, stay
    assert records.BY_NAME["flip_dims"].emulator == ("flip-negative-dims",)
    assert records.BY_NAME["unique_counts"].notes == ("guard.unique",)


@pytest.mark.parametrize("guard", GUARDS, ids=IDS)
def test_the_record_is_whole(guard: Guard):
    assert guard.wheel_does and guard.fix and guard.fact_tests, guard.name
    assert guard.issue == records.NOT_REPORTED or guard.issue.startswith("microsoft/DirectML#")
    assert guard.seen and set(guard.seen) <= set(records.SEEN), guard.seen
    assert guard.kinds and set(guard.kinds) <= set(records.KINDS), guard.kinds
    kernel_kinds = [k for k in guard.kinds if k in records.KEY_OF_KIND]
    # what the record holds is what its kinds say
    assert bool(guard.kernels) == bool(kernel_kinds) and len(kernel_kinds) <= 1, guard.kinds
    assert bool(guard.wraps) == (records.WRAPPER in guard.kinds)
    assert (guard.policy is not None) == (records.POLICY in guard.kinds)
    assert (guard.setting is not None) == (records.AUTOGRAD_SETTING in guard.kinds)
    assert bool(guard.emulator) != bool(guard.no_emulator), "a switch, or why none can"
    assert bool(guard.real_lane_test) != bool(guard.no_real_lane_test), \
        "a real-lane test, or why there is none"
    assert not guard.only_where_the_bug_is or guard.emulator
    assert all(n.startswith("guard.") for n in guard.notes)


@pytest.mark.parametrize("guard", GUARDS, ids=IDS)
def test_the_kernels_ops_are_torchs_and_take_their_arguments(guard: Guard):
    for op, kernel in guard.kernels.items():
        base, _, overload = op.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        handle = getattr(packet, overload or "default", None) if packet is not None else None
        assert isinstance(handle, torch._ops.OpOverload), f"{guard.name}: no aten::{op}"
        assert getattr(kernel, "func", kernel).__module__.startswith("dmlshim.kernels.guards.")
        params = inspect.signature(kernel).parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                      p.POSITIONAL_OR_KEYWORD)]
        keywords = {p.name for p in params if p.kind in (p.KEYWORD_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD)}
        star = any(p.kind == p.VAR_POSITIONAL for p in params)
        schema = handle._schema.arguments
        # torch.library hands a Python kernel the schema's positional arguments by position and
        # its keyword-only ones by name
        assert star or len(positional) >= sum(not a.kwarg_only for a in schema), (op, schema)
        missing = [a.name for a in schema if a.kwarg_only and a.name not in keywords]
        assert not missing, (guard.name, op, missing)


@pytest.mark.parametrize("guard", GUARDS, ids=IDS)
def test_the_emulator_switches_exist(guard: Guard):
    known = set(emulator_switches.GAPS + emulator_switches.BUGS)
    assert set(guard.emulator) <= known, set(guard.emulator) - known


@pytest.mark.parametrize("guard", GUARDS, ids=IDS)
def test_the_tests_named_exist(guard: Guard):
    named = list(guard.fact_tests) + ([guard.real_lane_test] if guard.real_lane_test else [])
    problems = [p for p in map(_resolves, named) if p]
    assert not problems, problems
    if guard.real_lane_test:  # the real-wheel suite (conftest: the lane runs these files)
        assert guard.real_lane_test.split("::")[0] in (
            "tests/test_real_wheel.py", "tests/test_users_path_zoo.py",
            "tests/frameworks/test_fw_users_path.py"), guard.real_lane_test


def _string_items(path: pathlib.Path, name: str) -> Set[str]:
    """The strings of the module-level tuple ``name`` in ``path``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"no {name} in {path}")


def _battery_cases() -> Set[str]:
    tree = ast.parse((ROOT / "tests" / "scripts" / "op_battery.py").read_text("utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_cases")
    ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
    return {k.value for k in ret.value.keys}  # type: ignore[union-attr]


def test_the_battery_cases_are_the_lanes():
    fixed = _string_items(ROOT / "tests" / "test_real_wheel.py", "FIXED_BY_THE_SHIM")
    cases = _battery_cases()
    assert len(cases) > 50 and fixed <= cases
    for guard in GUARDS:
        assert bool(guard.battery) == (guard.real_lane_test == records.BATTERY), guard.name
        # the lane asserts each is wrong on the wheel or right under the shim
        assert set(guard.battery) <= fixed, (guard.name, set(guard.battery) - fixed)


def _noted(path: pathlib.Path) -> Iterator[str]:
    """The event names ``path`` notes: ``events.note("...")`` calls, and the inline form the
    guards use (``shim.events.notes["..."] += 1``: events.note without its frame)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "events.note" \
                and node.args and isinstance(node.args[0], ast.Constant):
            yield node.args[0].value
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript) \
                and ast.unparse(node.target.value).endswith("events.notes") \
                and isinstance(node.target.slice, ast.Constant):
            yield node.target.slice.value


def test_the_notes_are_the_ones_the_code_notes():
    code = {p.name: set(_noted(p)) for p in FAMILIES.glob("*.py")}
    assert sum(map(len, code.values())) >= 20  # the scan sees the notes
    listed = {n for g in GUARDS for n in g.notes}
    assert set().union(*code.values()) == listed
    for guard in GUARDS:  # each in the module of one of its parts
        parts = list(guard.kernels.values()) + [w.factory for w in guard.wraps]
        parts += [guard.policy.factory] if guard.policy else []
        files = {pathlib.Path(inspect.getfile(getattr(p, "func", p))).name for p in parts}
        for note in guard.notes:
            assert any(note in code[f] for f in files), (guard.name, note, files)


def test_what_the_guards_wrap_exists():
    for guard in GUARDS:
        for w in guard.wraps:
            owner = patching.resolve(w.owner)
            assert owner is not None and callable(getattr(owner, w.name, None)), w
            assert callable(w.factory("privateuseone"))


def test_the_known_bugs_table_has_a_row_per_guard():
    table = records.markdown_table().splitlines()
    assert table[0].startswith("| guard |") and len(table) == 2 + len(GUARDS)
    for guard, row in zip(GUARDS, table[2:]):
        assert row.startswith(f"| `{guard.name}` | {guard.wheel_does} | {guard.issue} |"), row
        assert all(f"`{op}`" in row for op in guard.kernels), row
