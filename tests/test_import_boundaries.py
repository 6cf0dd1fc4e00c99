"""The package's structural rules, read from the source (ast; nothing is imported or run).

Three top-level packages, three import rules:

* The emulator (``emulated_dml``) stands in for the torch-directml wheel, so it must not depend on
  the product it is used to test: it imports nothing of dmlshim.
* What the two share (the emulator's switch names, the fused LSTM cell, CUDA's autocast kernels)
  lives in ``dmlshared``, which imports neither; its switch table imports nothing at all
  (``dmlshim.config`` reads it before torch is imported).
* The product imports the emulator in one module only, the emulated target's
  (``dmlshim/capabilities.py``: :class:`~dmlshim.capabilities.EmulatedDirectML`); the session and
  the diagnostics ask the capabilities object.

And what a target can do is asked of :mod:`dmlshim.capabilities`: outside the modules that define
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
SHARED = ROOT / "dmlshared"
# the one module of dmlshim that may import the emulator: the emulated target's
EMULATED_TARGET = "dmlshim/capabilities.py"
# Modules that define what the kinds are.
KIND_OWNERS = ("target.py", "capabilities.py", "config.py")


def _package_of(path: pathlib.Path) -> str:
    """The package relative imports in ``path`` start from (``emulated_dml``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1])


def package_imports(source: str, package: str, top: str) -> Iterator[Tuple[int, str]]:
    """(line, absolute module name) of every import of the top-level package ``top`` in
    ``source``, a module of ``package``: import statements (relative ones resolved) and the
    string names given to importlib.import_module/__import__."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == top:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != top:
                continue
            if module in (top, package):  # from dmlshim import x: the submodule x
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}"
            else:
                yield node.lineno, module
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and first.value.split(".")[0] == top:
                yield node.lineno, first.value


def dmlshim_imports(source: str, package: str) -> Iterator[Tuple[int, str]]:
    """(line, module) of every import of dmlshim in ``source`` (see :func:`package_imports`)."""
    return package_imports(source, package, "dmlshim")


def imports_of(path: pathlib.Path, top: str = "dmlshim") -> List[Tuple[int, str]]:
    return list(package_imports(path.read_text(encoding="utf-8"), _package_of(path), top))


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


def _loaded_after(code: str) -> List[str]:
    """The top-level packages of sys.modules after ``code`` runs in a fresh interpreter."""
    probe = code + "; import sys; print(sorted({m.split('.')[0] for m in sys.modules}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


def test_importing_the_emulator_loads_nothing_of_dmlshim():
    loaded = _loaded_after("import emulated_dml, dmlshared.lstm_cell, "
                           "dmlshared.autocast_kernels")
    assert "emulated_dml" in loaded and "dmlshared" in loaded  # the probe sees what it loads
    assert "dmlshim" not in loaded, loaded


def test_the_shared_package_imports_neither_side():
    modules = _python_files(SHARED)
    assert len(modules) >= 4  # the scan sees the shared modules
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for path in modules for top in ("dmlshim", "emulated_dml")
           for line, module in imports_of(path, top)]
    assert not bad, "\n".join(bad)
    loaded = _loaded_after("import dmlshared.lstm_cell, dmlshared.autocast_kernels")
    assert "torch" in loaded and not {"dmlshim", "emulated_dml"} & set(loaded), loaded


def test_the_switch_table_is_read_before_torch():
    """dmlshim.config validates DMLSHIM_EMULATOR_GAPS before torch is imported (the runner)."""
    loaded = _loaded_after("import dmlshim.config")
    assert "dmlshared" in loaded and "torch" not in loaded, loaded


def test_one_module_of_dmlshim_imports_the_emulator():
    found = {path.relative_to(ROOT).as_posix(): imports_of(path, "emulated_dml")
             for path in _python_files(PACKAGE)}
    importers = sorted(rel for rel, lines in found.items() if lines)
    assert importers == [EMULATED_TARGET], importers
    # the scan reads these imports: the forms the product used are found
    assert list(package_imports("import emulated_dml as emulator\nfrom emulated_dml import "
                                "_compat\nimport emulated_dml.autocast_kernels\n",
                                "dmlshim.patches", "emulated_dml")) == [
        (1, "emulated_dml"), (2, "emulated_dml._compat"), (3, "emulated_dml.autocast_kernels")]


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
    """One table: the options table validates DMLSHIM_EMULATOR_GAPS before torch is imported (the
    runner) and the emulator keeps its switches, both from dmlshared.emulator_switches (a copy
    in either, however equal today, fails here)."""
    from dmlshared import emulator_switches
    from dmlshim import config
    from emulated_dml import _state

    assert config.EMULATOR_GAPS is _state.GAPS is emulator_switches.GAPS
    assert config.EMULATOR_BUGS is _state.BUGS is emulator_switches.BUGS
    assert _state.ALIASES is emulator_switches.ALIASES
    assert config.EMULATOR_ALIASES == tuple(emulator_switches.ALIASES)
