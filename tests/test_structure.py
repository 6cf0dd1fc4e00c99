"""The layering and the state rules of dmlshim, read from the source (ast; nothing is run).

* State: every per-installation record lives on the session (``api.Shim``); modules hold code
  and constants. A scan of every function finds the module-level objects it rebinds
  (``global``) or mutates (a container method, an item or attribute store, ``setattr``,
  ``globals()[...]``): only the session pointer (``current.session``) and the registry of
  originals (``patching._originals``, which ``get_original`` answers from) may be among them.
* Layers: the import graph of dmlshim (import statements anywhere in a module, lazy ones
  included, and module names given as strings, e.g. ``api.PATCH_MODULES``) has no cycle.
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, List, Set, Tuple

from tests.test_import_boundaries import dmlshim_imports

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dmlshim"

# methods that change the object they are called on (containers; ThreadStack's push)
MUTATORS = frozenset(("append", "extend", "insert", "pop", "popitem", "clear", "update",
                      "setdefault", "add", "discard", "remove", "appendleft", "extendleft",
                      "push", "sort", "reverse", "difference_update", "intersection_update",
                      "symmetric_difference_update", "__setitem__", "__delitem__"))

ALLOWED_GLOBALS = {("dmlshim/current.py", "session")}
ALLOWED_MUTATED = {("dmlshim/patching.py", "_originals"),
                   # wrapt's post-import hooks registered: process-wide, as wrapt's registry is
                   ("dmlshim/patching.py", "_hooked")}


def _module_names(tree: ast.Module) -> Set[str]:
    """Names a module binds to objects of its own at top level (not imports, defs, classes)."""
    names: Set[str] = set()
    for node in tree.body:
        targets: List[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
    return names


def _root_name(node: ast.AST) -> str:
    """``a`` of ``a.b.c`` / ``a[1].b`` (empty when the chain does not start at a name)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def state_writes(source: str, rel: str) -> Tuple[List[Tuple[str, str, int]],
                                                  List[Tuple[str, str, int]]]:
    """(global statements, mutations of module-level objects) in the functions of a module:
    (file, name, line) each."""
    tree = ast.parse(source)
    module = _module_names(tree)
    rebound, mutated = [], []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = fn.args
        local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                rebound.extend((rel, name, node.lineno) for name in node.names)
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
                    name = _root_name(func.value)
                    if name in module and name not in local:
                        mutated.append((rel, name, node.lineno))
                elif isinstance(func, ast.Name) and func.id in ("setattr", "delattr") \
                        and node.args and _root_name(node.args[0]) in module - local:
                    mutated.append((rel, _root_name(node.args[0]), node.lineno))
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                    else [node.target]
                for target in targets:
                    if not isinstance(target, (ast.Subscript, ast.Attribute)):
                        continue
                    base = target.value
                    if isinstance(base, ast.Call) and getattr(base.func, "id", "") == "globals":
                        mutated.append((rel, "globals()", node.lineno))
                        continue
                    name = _root_name(target)
                    if name in module and name not in local:
                        mutated.append((rel, name, node.lineno))
    return rebound, mutated


def _scan() -> Tuple[List[Tuple[str, str, int]], List[Tuple[str, str, int]]]:
    rebound, mutated = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        r, m = state_writes(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
        rebound += r
        mutated += m
    return rebound, mutated


def test_the_state_scan_sees_every_form():
    source = (
        "import os\nTABLE = {}\nSTACK = Stack()\nflag = None\nobj = Holder()\n"
        "def f(TABLE2=None):\n    global flag\n    flag = 1\n    TABLE['a'] = 1\n"
        "    STACK.push(2)\n    obj.rules.append(3)\n    obj.value = 4\n    del TABLE['a']\n"
        "    setattr(obj, 'x', 5)\n    globals()['y'] = 6\n    os.environ['Z'] = '7'\n"
        "def g(TABLE):\n    TABLE['b'] = 1\n    local = {}\n    local['c'] = 2\n")
    rebound, mutated = state_writes(source, "m.py")
    assert rebound == [("m.py", "flag", 7)]
    assert sorted((line, name) for _, name, line in mutated) == [
        (9, "TABLE"), (10, "STACK"), (11, "obj"), (12, "obj"), (13, "TABLE"), (14, "obj"),
        (15, "globals()")]


def test_state_lives_on_the_session():
    rebound, mutated = _scan()
    assert {(f, n) for f, n, _ in rebound} == ALLOWED_GLOBALS, rebound
    assert len(rebound) == 1  # current.switch, the one place the pointer moves
    assert {(f, n) for f, n, _ in mutated} == ALLOWED_MUTATED, mutated


def _module_of(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> Dict[str, Set[str]]:
    """dmlshim module -> the dmlshim modules it imports (explicitly; parents are implicit)."""
    paths = {_module_of(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: Dict[str, Set[str]] = {}
    for name, path in paths.items():
        source = path.read_text(encoding="utf-8")
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: Set[str] = set()
        found = [m for _, m in dmlshim_imports(source, package)]
        found += [n.value for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and "." in n.value and n.value in paths]  # names as data: importlib
        for module in found:
            while module and module not in paths:  # `from dmlshim.x import name`
                module = module.rpartition(".")[0]
            if module and module != name:
                deps.add(module)
        graph[name] = deps
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 60 and "dmlshim.patches.devices" in graph["dmlshim.api"]  # by string
    assert "dmlshim.current" in graph["dmlshim.devicemap"]
    assert cycles(graph) == []


def test_the_session_pointer_is_the_bottom_layer():
    """Every layer may read the session pointer: it imports nothing of dmlshim."""
    assert import_graph()["dmlshim.current"] == set()


def test_the_version_is_the_distributions():
    from dmlshim._version import __version__

    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == __version__

