"""Write the generated tables of docs/ again: each sits between
``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` and is rendered from the code
that holds its facts, so the docs cannot drift from it (tests/test_readme.py fails when a file
differs from what this writes):

* ``known-bugs`` in docs/known-directml-bugs.md: the guard records,
  ``dmlshim.kernels.guards.records.markdown_table()``;
* ``decompositions`` in docs/cpu-fallbacks.md: the CPU-fallback decompositions,
  ``dmlshim.kernels.decompositions.markdown_table()``.

    python tools/docs_tables.py            # rewrite the tables in place
    python tools/docs_tables.py --check    # exit 1 naming each file that differs

Offline; imports dmlshim with DMLSHIM_DISABLE=1 (nothing is installed).
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
from typing import Callable, Dict, List, Tuple

REPO = pathlib.Path(__file__).resolve().parent.parent
COMMAND = "python tools/docs_tables.py"


def _known_bugs() -> str:
    from dmlshim.kernels.guards import records

    return records.markdown_table()


def _decompositions() -> str:
    from dmlshim.kernels import decompositions

    return decompositions.markdown_table()


# NAME: (file, renderer)
TABLES: Dict[str, Tuple[str, Callable[[], str]]] = {
    "known-bugs": ("docs/known-directml-bugs.md", _known_bugs),
    "decompositions": ("docs/cpu-fallbacks.md", _decompositions),
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(^<!-- generated: {re.escape(name)} -->\n)(.*?)"
                      rf"(^<!-- end generated: {re.escape(name)} -->$)", re.M | re.S)


def rendered(name: str, text: str) -> str:
    """``text`` with table ``name`` between its markers as the code renders it now."""
    found = _block(name).findall(text)
    if len(found) != 1:
        raise ValueError(f"{TABLES[name][0]}: {len(found)} blocks '<!-- generated: {name} -->' "
                         f"... '<!-- end generated: {name} -->' (one wanted)")
    table = TABLES[name][1]().strip("\n") + "\n"
    return _block(name).sub(lambda m: m.group(1) + table + m.group(3), text)


def stale() -> List[str]:
    """The files whose generated tables differ from what the code renders."""
    out = []
    for name, (rel, _) in TABLES.items():
        text = (REPO / rel).read_text(encoding="utf-8")
        if rendered(name, text) != text:
            out.append(f"{rel} (table {name})")
    return out


def main(argv: List[str]) -> int:
    os.environ["DMLSHIM_DISABLE"] = "1"  # importing dmlshim's modules installs nothing
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if argv == ["--check"]:
        differ = stale()
        for rel in differ:
            print(f"{rel} differs from what the code renders: run {COMMAND}")
        return 1 if differ else 0
    if argv:
        print(__doc__)
        return 2
    for name, (rel, _) in TABLES.items():
        path = REPO / rel
        text = path.read_text(encoding="utf-8")
        new = rendered(name, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"{rel}: table {name} written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
