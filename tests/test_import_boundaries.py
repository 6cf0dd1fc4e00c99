"""The package's structural rules, read from the source (ast; nothing is imported or run).

* The emulator (the top-level package ``emulated_dml``) stands in for the torch-directml wheel,
  so it must not depend on the product it is used to test: it imports nothing of dmlshim (the
  kernel modules the product shares with it, ``emulated_dml.formulas`` and
  ``emulated_dml.autocast_kernels``, are plain torch and live there).
* What a target can do is asked of :mod:`dmlshim.capabilities`: outside the modules that define
  the kinds, no ``<x>.kind`` is compared with a kind string.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from typing import Iterator, List, Tuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dmlshim"
EMULATOR = ROOT / "emulated_dml"
# Modules that define what the kinds are.
KIND_OWNERS = ("target.py", "capabilities.py", "config.py")


def _package_of(path: pathlib.Path) -> str:
    """The package relative imports in ``path`` start from (``emulated_dml``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1])


def dmlshim_imports(source: str, package: str) -> Iterator[Tuple[int, str]]:
    """(line, absolute module name) of every import of dmlshim in ``source``, a module of
    ``package``: import statements (relative ones resolved) and the string names given to
    importlib.import_module/__import__."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dmlshim":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "dmlshim":
                continue
            if module in ("dmlshim", package):  # from dmlshim import x: the submodule x
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}"
            else:
                yield node.lineno, module
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and first.value.startswith("dmlshim"):
                yield node.lineno, first.value


def imports_of(path: pathlib.Path) -> List[Tuple[int, str]]:
    return list(dmlshim_imports(path.read_text(encoding="utf-8"), _package_of(path)))


def _kind_strings(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                       for e in node.elts)
    return False


def _is_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "kind"


def kind_comparisons(source: str, filename: str = "<source>") -> List[int]:
    """Lines comparing a ``.kind`` attribute with a string (or strings), either way round."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_is_kind(a) for a in operands) and any(_kind_strings(a) for a in operands):
            lines.append(node.lineno)
    return lines


def _python_files(root: pathlib.Path) -> List[pathlib.Path]:
    return sorted(root.rglob("*.py"))


def test_the_emulator_imports_nothing_of_dmlshim():
    modules = _python_files(EMULATOR)
    assert len(modules) > 5  # the scan sees the emulator's modules
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for path in modules for line, module in imports_of(path)]
    assert not bad, "\n".join(bad)
    # the scan reads this package's imports: a planted one is found
    assert list(dmlshim_imports("from dmlshim import events\n", "emulated_dml")) == [
        (1, "dmlshim.events")]


def test_importing_the_emulator_loads_nothing_of_dmlshim():
    code = ("import emulated_dml, emulated_dml.formulas, emulated_dml.autocast_kernels, sys; "
            "print([m for m in sys.modules if m.split('.')[0] == 'dmlshim'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_import_scan_sees_every_form():
    source = ("import dmlshim.config\nfrom dmlshim import events, formulas\n"
              "from .. import devicemap\nfrom . import _state\nimport importlib, torch\n"
              "importlib.import_module('dmlshim.patches.oom')\nfrom ._tensor import wrap\n"
              "import emulated_dml\n")
    found = sorted(dmlshim_imports(source, "dmlshim.patches"))
    assert found == [(1, "dmlshim.config"), (2, "dmlshim.events"), (2, "dmlshim.formulas"),
                     (3, "dmlshim.devicemap"), (4, "dmlshim.patches._state"),
                     (6, "dmlshim.patches.oom"), (7, "dmlshim.patches._tensor")]


def test_the_kind_scan_finds_each_form():
    source = ("if t.kind == 'dml': pass\nif target.kind in ('dml', 'emulated-dml'): pass\n"
              "if 'cpu' != self.target.kind: pass\nif p.kind is inspect.Parameter.VAR: pass\n"
              "name = t.kind + ' target'\nif kind == 'cpu': pass\n")
    assert kind_comparisons(source) == [1, 2, 3]


def test_only_the_kind_owners_compare_kind_strings():
    bad = []
    scanned = 0
    for path in _python_files(PACKAGE):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel == owner or rel.startswith(owner) for owner in KIND_OWNERS):
            continue
        scanned += 1
        for line in kind_comparisons(path.read_text(encoding="utf-8"), rel):
            bad.append(f"dmlshim/{rel}:{line}")
    assert scanned > 20
    assert not bad, ("ask dmlshim.capabilities instead of comparing target kinds:\n"
                     + "\n".join(bad))


def test_the_options_table_and_the_emulator_name_the_same_switches():
    """The emulator keeps its own switch table (it imports nothing of the product) and the
    options table validates DMLSHIM_EMULATOR_GAPS before torch is imported (the runner), so the
    names are written in both; this is the check that they are the same names."""
    from dmlshim import config
    from emulated_dml import _state

    assert config.EMULATOR_GAPS == _state.GAPS
    assert set(config.EMULATOR_BUGS) == set(_state.BUGS)
    assert set(config.EMULATOR_ALIASES) == set(_state.ALIASES)
