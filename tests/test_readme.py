"""README.md and docs/*.md show what the code prints: every block marked
``<!-- sample: NAME -->`` in README.md or a file of docs/ is run (or read) and compared with what
the code prints today, so when the code's output or a document changes and they no longer agree, a
test here fails. The fix is usually to paste the new output into the document (the failure
shows it). Sample names are unique across the files.

Sample conventions (README, "What it prints"): a fenced block whose first line is ``$ command``
holds that command's output as a terminal shows it (stdout and stderr together); the command is
run as written, from the repository's root. ``...`` on a line of its own stands for any number
of lines, and a line ending in ``...`` for the rest of that line. Normalised on both sides,
because they differ from machine to machine and run to run: durations (``5.8 s``), the dmlshim
version, the doctor's system rows (OS, Python, torch, torch_directml, DirectML, adapters, auto's
pick) and the reason DirectML is unusable here, the report's file paths, and a temporary folder
the test gives an output file (``--report run.json``). Lines torch prints about its build
environment are dropped. Nothing else is: counts, call sites, texts and the doctor's layout must
match as printed.

Besides the samples: every relative link of README.md, docs/*.md and benchmarks/README.md
resolves (the file exists, the anchor is a heading of it); the tables between
``<!-- generated: NAME -->`` markers are what the code renders (``python tools/docs_tables.py``
writes them); the known-bugs page's notes name guards that exist; the emulator page's switch
table has a row per switch.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest
from helpers import DEFAULT_TIMEOUT, REPO, clean_env

README = REPO / "README.md"
DOCS = REPO / "docs"
_MARK = re.compile(r"^<!-- sample: ([\w-]+) -->$")


def documents() -> List[Path]:
    """The files whose samples are checked: README.md, then docs/*.md."""
    return [README] + sorted(DOCS.glob("*.md"))


def _rel(path: Path, root: Path = REPO) -> str:
    return path.relative_to(root).as_posix()

# torch's notes about its build environment (emulator's C++ guard): not the program's output
_NOISE = (re.compile(r"No CUDA runtime is found, using CUDA_HOME"),)


@dataclass(frozen=True)
class Sample:
    name: str
    path: str  # the document's, relative to the repository
    line: int  # of the marker, 1-based
    lang: str  # the fence's info string; "text" for a paragraph or table
    body: Tuple[str, ...]

    @property
    def command(self) -> Optional[str]:
        first = self.body[0] if self.body else ""
        return first[2:] if first.startswith("$ ") else None

    def where(self) -> str:
        return f"{self.path}:{self.line} (sample {self.name!r})"


def _file_samples(path: Path, root: Path = REPO) -> List[Sample]:
    rel = _rel(path, root)
    lines = path.read_text(encoding="utf-8").splitlines()
    out: List[Sample] = []
    i = 0
    while i < len(lines):
        m = _MARK.match(lines[i].strip())
        if m is None:
            i += 1
            continue
        j = i + 1
        if j < len(lines) and lines[j].startswith("```"):
            lang, k = lines[j][3:].strip(), j + 1
            while k < len(lines) and not lines[k].startswith("```"):
                k += 1
            body = lines[j + 1:k]
        else:  # a paragraph or a table: up to the next blank line
            lang, k = "text", j
            while k < len(lines) and lines[k].strip():
                k += 1
            body = lines[j:k]
        out.append(Sample(m.group(1), rel, i + 1, lang, tuple(body)))
        i = k + 1
    return out


@functools.cache
def samples() -> Dict[str, Sample]:
    """Every sample of README.md and docs/*.md, by name (unique across the files)."""
    out: Dict[str, Sample] = {}
    for path in documents():
        for sample in _file_samples(path):
            assert sample.name not in out, \
                f"{sample.where()}: a second sample named {sample.name!r} " \
                f"(the first: {out[sample.name].where()})"
            out[sample.name] = sample
    return out


def command_samples() -> List[Sample]:
    return [s for s in samples().values() if s.command is not None]


# -- running a sample's command ---------------------------------------------------------------

_RUN_DIR = tempfile.mkdtemp(prefix="dmlshim-readme-")
atexit.register(shutil.rmtree, _RUN_DIR, True)


@functools.cache
def run_sample(command: str) -> Tuple[str, str, int, Optional[Path]]:
    """Run a sample's command from the repository's root: (stdout and stderr as a terminal shows
    them, stdout alone, exit status, the report file it wrote if it names one). Once per command
    (the report sample reads the exit summary's run). The doctor's two streams are read apart
    (its stdout is compared), so they are not in a terminal's order there."""
    argv = shlex.split(command)
    assert argv[0] == "python", f"a sample's command starts with python: {command}"
    argv[0] = sys.executable
    out_dir = Path(tempfile.mkdtemp(dir=_RUN_DIR))
    report = None
    if "--report" in argv:  # the output file goes to a folder of its own, not the checkout
        at = argv.index("--report") + 1
        report = out_dir / argv[at]
        argv[at] = str(report)
    env = clean_env(PYTHONUNBUFFERED="1")
    if "--doctor" in argv:  # its report is stdout; what torch prints on stderr is not
        proc = subprocess.run(argv, cwd=str(REPO), env=env, capture_output=True, text=True,
                              timeout=DEFAULT_TIMEOUT)
        merged, stdout = proc.stdout + proc.stderr, proc.stdout
    else:
        proc = subprocess.run(argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=DEFAULT_TIMEOUT)
        merged = stdout = proc.stdout
    prefix = str(out_dir) + os.sep
    return merged.replace(prefix, ""), stdout.replace(prefix, ""), proc.returncode, report


# -- normalising and matching -----------------------------------------------------------------

_DURATION = re.compile(r"\b\d+(?:\.\d+)? s\b")
_DOCTOR_HEAD = re.compile(r"^dmlshim \S+ doctor$")
_DOCTOR_ROW = re.compile(r"^  (OS|Python|torch|torch_directml|usable|adapters|adapter \d+|"
                         r"auto picks):\s.*$")
_UNUSABLE = re.compile(r"^  usable:\s+no \((.*); (?:checked without importing|probed in a "
                       r"subprocess)\)$")


def normalise(lines: List[str]) -> List[str]:
    """What varies between machines and runs, replaced by a placeholder (module docstring)."""
    why = next((m.group(1) for m in map(_UNUSABLE.match, lines) if m), None)
    out = []
    for line in lines:
        line = line.rstrip()
        if any(p.search(line) for p in _NOISE):
            continue
        if why and line != "...":
            line = line.replace(why, "<why DirectML is unusable here>")
        line = _DURATION.sub("<t> s", line)
        line = _DOCTOR_HEAD.sub("dmlshim <version> doctor", line)
        m = _DOCTOR_ROW.match(line)
        if m:
            line = f"  {m.group(1)}: <this machine's>"
        out.append(line)
    return out


def _line_matches(want: str, got: str) -> bool:
    if want.endswith("...") and want != "...":
        return got.startswith(want[:-3].rstrip())
    return want == got


def matches(want: List[str], got: List[str]) -> bool:
    """``got`` is ``want`` with each ``...`` line standing for any number of lines."""

    @functools.cache
    def m(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i] == "...":
            return any(m(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and _line_matches(want[i], got[j]) and m(i + 1, j + 1)

    return m(0, 0)


def first_mismatch(want: List[str], got: List[str]) -> str:
    """The first sample line that cannot be placed after those before it (greedy)."""
    j = 0
    gap = False
    for line in want:
        if line == "...":
            gap = True
            continue
        k = j
        while k < len(got) and not _line_matches(line, got[k]):
            if not gap:
                break
            k += 1
        if k >= len(got) or not _line_matches(line, got[k]):
            near = got[j] if j < len(got) else "<end of output>"
            return f"  sample: {line}\n  output: {near}"
        j, gap = k + 1, False
    return "  (the output goes on past the sample's last line: end the sample with ...)"


def assert_sample_matches(sample: Sample, printed: str) -> None:
    want = normalise(list(sample.body[1:]))
    got = normalise(printed.splitlines())
    if not matches(want, got):
        pytest.fail(
            f"{sample.where()} differs from what `{sample.command}` prints now.\n"
            f"first difference:\n{first_mismatch(want, got)}\n"
            f"--- what it prints (normalised; paste into {sample.path}, keeping its ... lines):\n"
            + "\n".join(got), pytrace=False)


# -- the tests ---------------------------------------------------------------------------------

def test_the_documents_have_the_samples_these_tests_read():
    names = set(samples())
    assert {"log-info", "exit-summary", "report", "report-keys", "doctor", "doctor-problem",
            "check", "options-table", "python-api"} <= names, sorted(names)
    for sample in samples().values():
        assert sample.body, f"{sample.where()}: no block or paragraph after the marker"
    # the front door shows one run of the shim; each document's samples are read
    assert any(s.path == "README.md" and s.command for s in samples().values())
    assert {s.path for s in samples().values()} > {"README.md"}


def test_sample_names_are_unique_across_the_documents(tmp_path):
    one, two = tmp_path / "one.md", tmp_path / "two.md"
    one.write_text("<!-- sample: x -->\n```\n$ python -V\n```\n", encoding="utf-8")
    two.write_text("text\n\n<!-- sample: x -->\n| a |\n", encoding="utf-8")
    found = [s for p in (one, two) for s in _file_samples(p, tmp_path)]
    assert [(s.name, s.path, s.line, s.lang) for s in found] == [
        ("x", "one.md", 1, ""), ("x", "two.md", 3, "text")]
    assert found[1].where() == "two.md:3 (sample 'x')"


@pytest.mark.parametrize("sample", command_samples(), ids=lambda s: s.name)
def test_command_sample_is_what_the_command_prints(sample: Sample):
    merged, stdout, _, _ = run_sample(sample.command)
    assert_sample_matches(sample, stdout if "--doctor" in sample.command else merged)


def _report_of_the_exit_summary_run() -> Dict[str, Any]:
    command = samples()["exit-summary"].command
    assert command and "--report" in command, "the exit summary's run writes the report sample"
    merged, _, status, path = run_sample(command)
    assert status == 0 and path is not None and path.exists(), merged
    return json.loads(path.read_text(encoding="utf-8"))


def _assert_part(want: Any, got: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: the report has {got!r}"
        assert set(want) == set(got), f"{where}: keys {sorted(want)} in the sample, " \
                                      f"{sorted(got)} in the report"
        for key, value in want.items():
            _assert_part(value, got[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list), f"{where}: the report has {got!r}"
        for item in want:
            for candidate in got:
                try:
                    _assert_part(item, candidate, where)
                    break
                except AssertionError:
                    continue
            else:
                raise AssertionError(f"{where}: no item of the report is {item!r}; "
                                     f"the report has {json.dumps(got)[:2000]}")
    elif where.endswith(".file") and isinstance(got, str) and os.path.isabs(got):
        # a path of the sample's machine: compare the part inside the checkout
        inside = os.path.relpath(got, REPO).replace(os.sep, "/")
        assert want.replace("\\", "/").endswith("/" + inside), f"{where}: {want!r} vs {got!r}"
    else:
        assert want == got, f"{where}: {want!r} in the sample, {got!r} in the report"


def test_report_sample_is_part_of_the_report():
    sample = samples()["report"]
    text = re.sub(r",\s*\.\.\.\s*(?=[\]}])", "", "\n".join(sample.body))  # ", ...]" elisions
    fragment = json.loads("{" + text + "}")
    report = _report_of_the_exit_summary_run()
    for key, want in fragment.items():
        assert key in report, f"{sample.where()}: the report has no {key!r}"
        try:
            _assert_part(want, report[key], key)
        except AssertionError as err:
            pytest.fail(f"{sample.where()}: {err}", pytrace=False)


def test_report_keys_are_the_reports():
    sample = samples()["report-keys"]
    text = " ".join(sample.body)
    assert "Top-level keys:" in text, sample.where()
    listed = re.findall(r"`(\w+)`", text.split("Top-level keys:", 1)[1])
    assert listed == list(_report_of_the_exit_summary_run()), sample.where()


def _help_options() -> Dict[str, Tuple[str, str, str]]:
    """``--help``'s options: {flag: (variable, default, valid values)}."""
    text = subprocess.run([sys.executable, "-m", "dmlshim", "--help"], env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=True).stdout
    out: Dict[str, Tuple[str, str, str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^  (--[\w-]+) / (\w+) \(default: (.*)\)$", line)
        if m:
            valid = lines[i + 1].rsplit("; valid: ", 1)[-1].strip()
            out[m.group(1)] = (m.group(2), m.group(3), valid)
    assert out, text
    return out


def test_options_table_is_what_help_says():
    sample = samples()["options-table"]
    rows = [r for r in sample.body if r.startswith("| `--")]
    table: Dict[str, Tuple[str, str, str]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        m = re.match(r"^`(--[\w-]+)` / `(\w+)`$", cells[0])
        assert m, f"{sample.where()}: {row}"
        default = cells[1].strip("`") if cells[1].startswith("`") else "-"
        table[m.group(1)] = (m.group(2), default, cells[2])
    helped = _help_options()
    assert sorted(table) == sorted(helped), sample.where()
    for flag, (env, default, values) in table.items():
        assert (env, default) == helped[flag][:2], f"{sample.where()}: {flag}"
        valid = helped[flag][2]
        if re.fullmatch(r"[\w.-]+(, [\w.-]+)*", valid):  # a plain list: the table lists it too
            assert set(re.findall(r"`([^`]+)`", values)) == set(valid.split(", ")), \
                f"{sample.where()}: {flag}: the table says {values}, --help {valid}"


def test_python_sample_runs():
    sample = samples()["python-api"]
    assert sample.lang == "python", sample.where()
    proc = subprocess.run([sys.executable, "-c", "\n".join(sample.body)], cwd=str(REPO),
                          env=clean_env(), capture_output=True, text=True,
                          timeout=DEFAULT_TIMEOUT)
    assert proc.returncode == 0, f"{sample.where()}:\n{proc.stderr}"
    assert "torch's own answer: " in proc.stdout, proc.stdout


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _outside_fences(text: str) -> List[Tuple[int, str]]:
    """(line number, line) of ``text``'s lines outside fenced code blocks."""
    out, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            out.append((number, line))
    return out


def anchors(path: Path) -> Set[str]:
    """The anchors GitHub makes for ``path``'s headings (a repeated one gets -1, -2, ...)."""
    seen: Dict[str, int] = {}
    out: Set[str] = set()
    for _, line in _outside_fences(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            slug = _slug(m.group(1))
            out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return out


def broken_links(path: Path, root: Path = REPO) -> List[str]:
    """The relative links of the markdown file ``path`` that do not resolve: no such file, or
    (into a markdown file) no such heading."""
    problems = []
    for number, line in _outside_fences(path.read_text(encoding="utf-8")):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{_rel(path, root)}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif root not in dest.parents and dest != root:
                problems.append(f"{where}: outside the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {_rel(dest, root)}")
    return problems


def test_links_between_readme_and_docs_resolve():
    files = documents() + [REPO / "benchmarks" / "README.md"]
    problems = [p for path in files for p in broken_links(path)]
    assert not problems, "\n".join(problems)
    # README leads to every document of docs/
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README.read_text(encoding="utf-8")))
    assert linked == {p.name for p in DOCS.glob("*.md")}, sorted(linked)


def test_the_link_check_fails_on_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("# A page\n\n## Twice\n\n## Twice\n", encoding="utf-8")
    front = tmp_path / "README.md"
    front.write_text("# Front: `x`\n\n[ok](docs/page.md#twice-1) [ok](#front-x) "
                     "[web](https://example.org/#x)\n[bad](docs/none.md) [bad](docs/page.md#nope)"
                     "\n[bad](#nope)\n```\n[code](nowhere.md)\n```\n", encoding="utf-8")
    assert [p.split(": ", 1)[1] for p in broken_links(front, tmp_path)] == [
        "docs/none.md: no such file", "docs/page.md#nope: no heading #nope in docs/page.md",
        "#nope: no heading #nope in README.md"]


# -- generated tables and what they name ---------------------------------------------------------

def _docs_tables():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "tools" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_what_the_code_renders():
    tables = _docs_tables()
    assert set(tables.TABLES) == {"known-bugs", "decompositions"}
    stale = tables.stale()
    assert not stale, f"{', '.join(stale)}: differ from what the code renders; " \
                      f"run {tables.COMMAND}"


def test_a_stale_generated_table_is_seen():
    tables = _docs_tables()
    text = (REPO / "docs" / "known-directml-bugs.md").read_text(encoding="utf-8")
    assert tables.rendered("known-bugs", text) == text
    from dmlshim.kernels.guards import records

    row = next(line for line in text.splitlines() if line.startswith("| `eye` |"))
    assert row in records.markdown_table()
    edited = text.replace(row, row.replace("microsoft/DirectML#431", "not reported"))
    assert tables.rendered("known-bugs", edited) == text
    with pytest.raises(ValueError, match="0 blocks"):
        tables.rendered("known-bugs", text.replace("<!-- end generated: known-bugs -->", ""))


def _section(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    assert f"\n{heading}\n" in text, f"{_rel(path)}: no {heading!r}"
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_known_bugs_notes_name_guards_that_exist():
    from dmlshim.kernels.guards import records

    notes = _section(DOCS / "known-directml-bugs.md", "## Per guard: what the table does not say")
    named = re.findall(r"^- `(\w+)`:", notes, re.M)
    assert len(named) >= 15 and len(named) == len(set(named)), named
    assert set(named) <= set(records.BY_NAME), set(named) - set(records.BY_NAME)
    # in the records' order, as the table above them
    assert named == [g.name for g in records.GUARDS if g.name in named]


def test_the_emulator_page_has_a_row_per_switch():
    from dmlshared import emulator_switches

    table = _section(DOCS / "emulator.md", "## Fidelity switches")
    rows = re.findall(r"^\| `([\w-]+)` \|", table, re.M)
    assert len(rows) == len(set(rows))
    assert set(rows) == set(emulator_switches.GAPS + emulator_switches.BUGS), \
        set(rows) ^ set(emulator_switches.GAPS + emulator_switches.BUGS)


def test_the_comparison_fails_where_sample_and_output_differ():
    sample = ["...", "dmlshim: summary: target cpu (x); 5.8 s; script finished",
              "dmlshim:   calls changed: 46", "dmlshim:   needs attention: 1 op(s) ..."]
    printed = ["GPU: x", "dmlshim: summary: target cpu (x); 61.0 s; script finished",
               "dmlshim:   calls changed: 46", "dmlshim:   needs attention: 1 op(s) ran on the CPU"]
    assert matches(normalise(sample), normalise(printed))
    changed = printed[:2] + ["dmlshim:   calls changed: 47"] + printed[3:]
    assert not matches(normalise(sample), normalise(changed))
    assert "calls changed: 46" in first_mismatch(normalise(sample), normalise(changed))
    assert not matches(normalise(sample), normalise(printed + ["dmlshim:   report: r.json"]))
    inserted = printed[:2] + ["dmlshim:     emulated: x1"] + printed[2:]
    assert not matches(normalise(sample), normalise(inserted))
    doctor = ["  OS:              Linux-6.1 (x86_64)",
              "  usable:          no (no /dev/dxg: why; checked without importing)",
              "problem: DMLSHIM_DEVICE=dml but no DirectML adapter is usable: no /dev/dxg: why"]
    windows = ["  OS:              Windows-10-10.0.19045-SP0 (AMD64)",
               "  usable:          no (torch_directml is not installed; checked without importing)",
               "problem: DMLSHIM_DEVICE=dml but no DirectML adapter is usable: torch_directml is "
               "not installed"]
    assert matches(normalise(doctor), normalise(windows))
    assert not matches(normalise(doctor), normalise(windows[:2] + ["problem: another"]))
