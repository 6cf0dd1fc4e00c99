"""`python -m dmlshim X` behaves as `python X`: a matrix of small cases compared mechanically.

Each case runs as ``python ARGS`` and ``python -m dmlshim ARGS`` in the same environment and
folder; exit status, stdout and stderr must be equal. The probe every case runs prints what
differs when a runner executes the script itself: ``sys.argv``, ``sys.path``, the whole
environment, the modules loaded at the first line, the globals of ``__main__`` and their types,
warning filters, interpreter flags and ``traceback.print_stack()``. The matrix runs with the
default options, with ``DMLSHIM_DISABLE=1``, and (a subset) through the runner's Windows path
(the interpreter as a child), forced on Linux. Only one case imports torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.helpers import HOST, REPO, Python, clean_env

PROBE = textwrap.dedent('''
    import os, sys, traceback, warnings
    first_line_modules = sorted(set(sys.modules) - {"sitecustomize", "dmlshim_chained_sitecustomize"})
    annotated: int = 1
    print("torch-at-first-line", "torch" in sys.modules)
    print("modules", first_line_modules)
    print("argv", sys.argv)
    print("path", sys.path)
    print("environ", sorted(os.environ.items()))
    print("globals", sorted((k, type(v).__name__) for k, v in list(globals().items())))
    print("file", globals().get("__file__"), globals().get("__cached__"),
          getattr(globals().get("__spec__"), "name", None), type(__loader__).__name__)
    print("filters", warnings.filters)
    print("flags", sys.flags, sys._xoptions, __debug__, sys.stdout.write_through)
    traceback.print_stack()
    sys.stdout.flush()
''')

CASE_SOURCES = {
    "exit3.py": "import sys\nprint('out'); sys.exit(3)\n",
    "exit_none.py": "raise SystemExit\n",
    "exit_str.py": "import sys\nsys.exit('bye: a message on stderr')\n",
    "exit_obj.py": "raise SystemExit(['not', 'an', 'int'])\n",
    "exit_true.py": "import sys\nsys.exit(True)\n",
    "boom.py": "def inner():\n    raise ValueError('boom from the script')\n\ndef outer():\n"
               "    inner()\n\nprint('before')\nouter()\n",
    "sigterm.py": "import os, signal, sys\nprint('dying', flush=True)\n"
                  "os.kill(os.getpid(), signal.SIGTERM)\n",
    "ctrl_c.py": "print('interrupted')\nraise KeyboardInterrupt\n",
    "stdin.py": "import sys\ndata = sys.stdin.read()\nprint(len(data), repr(data[:40]))\n",
    "warn.py": "import warnings\nwarnings.warn('deprecated thing', DeprecationWarning)\n"
               "warnings.warn('user thing')\nprint('after warnings')\n",
    "exit_int.py": "import sys\nsys.exit(int(sys.argv[1]))\n",
    # an access violation python does not handle (SIGSEGV; on Windows 0xC0000005)
    "crash.py": "import faulthandler\nfaulthandler.disable()\nprint('crashing', flush=True)\n"
                "faulthandler._read_null()\n",
    "omp.py": "import os, sys\nos.environ['OMP_NUM_THREADS'] = '1'\n"
              "print('torch-first', 'torch' in sys.modules)\nimport torch\n"
              "print('threads', torch.get_num_threads())\n",
}


@dataclass
class Case:
    name: str
    args: List[str]
    stdin: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    cwd: Optional[Path] = None


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("matrix"))


def make_tree(root: Path) -> Path:
    """The cases' scripts, folders and apps under ``root``."""
    (root / "probe.py").write_text(PROBE)
    (root / "a folder with spaces").mkdir()
    (root / "a folder with spaces" / "the probe.py").write_text(PROBE)
    for name, source in CASE_SOURCES.items():
        (root / name).write_text(source)
    # a symlinked script imports its siblings from the folder it really lives in
    real = root / "real"
    real.mkdir()
    (real / "sibling.py").write_text("VALUE = 'sibling of the real file'\n")
    (real / "main.py").write_text("import sibling\nprint(sibling.VALUE)\n" + PROBE)
    links = root / "links"
    links.mkdir()
    (links / "main.py").symlink_to(real / "main.py")
    # a directory and a zip app with __main__.py
    app = root / "appdir"
    app.mkdir()
    (app / "__main__.py").write_text(PROBE)
    with zipfile.ZipFile(root / "app.zip", "w") as zf:
        zf.writestr("__main__.py", PROBE)
    # a package for -m
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(PROBE)
    return root


def cases(root: Path, python: Python = HOST) -> List[Case]:
    def at(*parts: str) -> str:  # as the interpreter names it (Windows: Z:\\..., backslashes)
        return python.path(root.joinpath(*parts))

    py = at("probe.py")
    empty_entries = python.pathsep.join(  # kept byte for byte
        [python.path(REPO), "", python.path("/nonexistent"), ""])
    return [
        Case("script", [py, "a", "b"]),
        Case("folder-with-spaces",
             [at("a folder with spaces", "the probe.py"), "x y", "C:\\a\\b"]),
        Case("argv-unicode-spaces", [py, "héllo wörld", "a  b", "ü", ""]),
        Case("pythonpath-empty-entries", [py], env={"PYTHONPATH": empty_entries}),
        Case("exit-3", [at("exit3.py")]),
        Case("exit-none", [at("exit_none.py")]),
        Case("exit-str", [at("exit_str.py")]),
        Case("exit-object", [at("exit_obj.py")]),
        Case("exit-true", [at("exit_true.py")]),
        # Windows: above 2**31-1 python exits 0xFFFFFFFF; a negative number is an NTSTATUS
        Case("exit-above-int32", [at("exit_int.py"), str(0xC000013A)]),
        Case("exit-ntstatus", [at("exit_int.py"), str(0xC000013A - (1 << 32))]),
        Case("exit-2-32", [at("exit_int.py"), str(1 << 32)]),
        Case("crash", [at("crash.py")]),
        Case("uncaught-exception", [at("boom.py")]),
        Case("sigterm", [at("sigterm.py")]),
        Case("keyboard-interrupt", [at("ctrl_c.py")]),
        Case("stdin", [at("stdin.py")], stdin="line one\nlïne two\n" * 50),
        Case("program-from-stdin", ["-", "x"], stdin=PROBE),
        Case("symlinked-script", [at("links", "main.py")]),
        Case("directory", [at("appdir"), "d"]),
        Case("zip-app", [at("app.zip"), "z"]),
        Case("dash-c", ["-c", PROBE, "c1", "c2"]),
        Case("dash-m", ["-m", "pkg.mod", "m1"], cwd=root),
        Case("dash-P", ["-P", py]),
        Case("dash-P-m", ["-P", "-m", "pkg.mod"], cwd=root),
        Case("dash-W", ["-W", "error::UserWarning", "-Wignore::DeprecationWarning",
                        at("warn.py")]),
        Case("default-warnings", [at("warn.py")]),
        Case("dash-X", ["-X", "dev", "-Xutf8", py]),
        Case("dash-u-O", ["-u", "-OO", py]),
        Case("missing-script", [at("no_such_script.py")]),
        Case("missing-module", ["-m", "no_such_module_xyz"]),
        Case("omp-threads-before-torch", [at("omp.py")]),
    ]


# The cases run through the runner's Windows path too (forced on Linux).
CHILD_SUBSET = {"script", "exit-3", "exit-str", "exit-above-int32", "exit-ntstatus", "crash",
                "uncaught-exception", "sigterm", "keyboard-interrupt", "stdin", "dash-c",
                "dash-m", "dash-W", "pythonpath-empty-entries", "folder-with-spaces"}


def _run(args: List[str], case: Case, mode_env: Dict[str, Optional[str]], cwd: Path,
         python: Python = HOST):
    env = python.env(**mode_env)
    env.update(case.env)
    return python.run(args, env, case.cwd or cwd, input=case.stdin, timeout=300)


def _compare(root: Path, mode_env: Dict[str, Optional[str]], runner_env: Dict[str, str],
             subset: Optional[set] = None, python: Python = HOST) -> List[str]:
    selected = [c for c in cases(root, python) if subset is None or c.name in subset]
    # runner_env goes to both runs: python ignores the runner's switches, and the script must
    # see them through the runner exactly as python shows them
    env = dict(mode_env, **runner_env)

    def pair(case: Case):
        return (_run(case.args, case, env, root, python),
                _run(["-m", "dmlshim", *case.args], case, env, root, python))

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(pair, selected))
    problems = []
    for case, (native, shimmed) in zip(selected, results):
        for what in ("returncode", "stdout", "stderr"):
            a, b = getattr(native, what), getattr(shimmed, what)
            if a != b:
                problems.append(f"{case.name}: {what} differs: {_first_difference(a, b)}")
    return problems


def _first_difference(a, b) -> str:
    if not isinstance(a, str):
        return f"python {a!r}, dmlshim {b!r}"
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            at = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            return (f"line {i + 1}, column {at}:\n  python:  ...{x[max(0, at - 200):at + 300]!r}"
                    f"\n  dmlshim: ...{y[max(0, at - 200):at + 300]!r}")
    la, lb = a.splitlines(), b.splitlines()
    extra = "python" if len(la) > len(lb) else "dmlshim"
    more = (la if len(la) > len(lb) else lb)[min(len(la), len(lb)):]
    return (f"python {len(la)} lines, dmlshim {len(lb)} lines; {extra} also printed: "
            f"{more[:5]!r}")


def _sanity(root: Path) -> None:
    # The matrix compares something real: the probe printed, the statuses are the expected ones.
    by_name = {c.name: c for c in cases(root)}
    got = {n: _run(by_name[n].args, by_name[n], {}, root) for n in
           ("script", "sigterm", "keyboard-interrupt", "exit-str", "omp-threads-before-torch",
            "symlinked-script", "crash", "folder-with-spaces")}
    assert got["script"].returncode == 0 and "globals" in got["script"].stdout
    assert got["script"].stderr.count("File ") == 1 and "probe.py" in got["script"].stderr
    assert got["sigterm"].returncode == -signal.SIGTERM
    assert got["keyboard-interrupt"].returncode == -signal.SIGINT
    assert got["crash"].returncode == -signal.SIGSEGV and "crashing" in got["crash"].stdout
    assert "argv ['" in got["folder-with-spaces"].stdout
    assert got["exit-str"].returncode == 1 and "bye" in got["exit-str"].stderr
    assert "threads 1" in got["omp-threads-before-torch"].stdout
    assert "sibling of the real file" in got["symlinked-script"].stdout


@pytest.mark.parametrize("mode", ["default", "disabled"])
def test_runner_matches_python(tree, mode):
    mode_env: Dict[str, Optional[str]] = {"DMLSHIM_DISABLE": "1"} if mode == "disabled" else {}
    if mode == "default":
        _sanity(tree)
    problems = _compare(tree, mode_env, {})
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mode", ["default", "disabled"])
def test_windows_child_path_matches_python(tree, mode):
    mode_env: Dict[str, Optional[str]] = {"DMLSHIM_DISABLE": "1"} if mode == "disabled" else {}
    problems = _compare(tree, mode_env, {"DMLSHIM_RUNNER_AS_CHILD": "1"}, CHILD_SUBSET)
    assert not problems, "\n".join(problems)


def test_disabled_runner_validates_nothing_but_disable(tree):
    py = str(tree / "exit3.py")
    proc = _run(["-m", "dmlshim", "--optimizer", "nope", py], Case("x", [py]),
                {"DMLSHIM_DISABLE": "1", "DMLSHIM_DEVICE": "bogus", "DMLSHIM_REPORT": "/no/dir/r"},
                tree)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "")
    bad = _run(["-m", "dmlshim", py], Case("x", [py]), {"DMLSHIM_DISABLE": "maybe"}, tree)
    assert bad.returncode == 2 and "DMLSHIM_DISABLE" in bad.stderr
    # `import dmlshim` too
    code = "import dmlshim; print(dmlshim.is_installed())"
    imp = _run(["-c", code], Case("x", []), {"DMLSHIM_DISABLE": "1", "DMLSHIM_DEVICE": "bogus"},
               tree)
    assert (imp.returncode, imp.stdout, imp.stderr) == (0, "False\n", "")


@pytest.mark.parametrize("as_child", [False, True])
def test_ctrl_c_stops_a_shell_loop_as_with_python(tree, as_child):
    # Ctrl-C sends SIGINT to the foreground process group: bash and the running interpreter.
    # python dies by SIGINT, so bash stops the loop; the runner must end the same way.
    script = tree / "wait_for_ctrl_c.py"
    script.write_text("import sys, time\nprint('started', flush=True)\ntime.sleep(60)\n")
    outcomes = {}
    for how in ("python", "python -m dmlshim"):
        env = clean_env(DMLSHIM_RUNNER_AS_CHILD="1" if as_child else None)
        loop = f'for i in 1 2 3; do {sys.executable} {how[7:]} {script}; echo "after $i"; done'
        proc = subprocess.Popen(["bash", "-c", loop.replace("  ", " ")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        outcomes[how] = (proc.returncode, out, "KeyboardInterrupt" in err)
    assert outcomes["python"][1] == ""  # the loop stopped: no "after 1", no second "started"
    assert outcomes["python -m dmlshim"] == outcomes["python"]
