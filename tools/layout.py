"""The layout of the tree in numbers: modules and lines per package, floors (the longest chain of
imports between the project's modules, lazy imports inside functions included), import circles
(found by tests/test_structure.py's finder), and the boundaries issue 38 set (which dmlshim
modules import ``emulated_dml``; ``emulated_dml`` and ``dmlshared`` import nothing of dmlshim).

    python tools/layout.py

Reads the sources with ``ast``; imports nothing of the product.
"""

from __future__ import annotations

import ast
import pathlib
import sys
from collections import defaultdict
from functools import cache
from typing import Dict, List, Set

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("dmlshim", "dmlshared", "emulated_dml")


def modules() -> Dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


def imported(name: str, path: pathlib.Path, node: ast.AST) -> List[str]:
    """The dotted names an import statement of module ``name`` reaches."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    module = node.module or ""
    if node.level:
        base = name.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    return [module] + [f"{module}.{a.name}" for a in node.names]


def import_graph(mods: Dict[str, pathlib.Path]) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in imported(name, path, node):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def main() -> int:
    sys.setrecursionlimit(10000)
    sys.path.insert(0, str(ROOT))
    from tests.test_structure import cycles  # the suite's own cycle finder (Tarjan)

    mods = modules()
    graph = import_graph(mods)
    circles = cycles(graph)
    print(f"import circles: {len(circles)}" + "".join(f"\n  {c}" for c in circles))
    if circles:
        return 1

    @cache
    def floor(name: str) -> int:  # no circle: the graph is a DAG
        return 1 + max((floor(w) for w in graph[name]), default=0)

    for package in PACKAGES:
        names = [m for m in mods if m.split(".")[0] == package]
        sizes = sorted(((len(mods[m].read_text(encoding="utf-8").splitlines()), m)
                        for m in names), reverse=True)
        print(f"{package}: {len(names)} modules, {sum(n for n, _ in sizes)} lines, largest "
              f"{sizes[0][1]} ({sizes[0][0]} lines), {max(floor(m) for m in names)} floors")

    def importing(prefix: str, target: str) -> List[str]:
        return sorted(m for m in mods if m.split(".")[0] == prefix
                      and any(t.split(".")[0] == target for t in graph[m]))

    print(f"dmlshim modules importing emulated_dml: {importing('dmlshim', 'emulated_dml')}")
    print(f"emulated_dml modules importing dmlshim: {importing('emulated_dml', 'dmlshim')}")
    print(f"dmlshared modules importing dmlshim or emulated_dml: "
          f"{importing('dmlshared', 'dmlshim') + importing('dmlshared', 'emulated_dml')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
