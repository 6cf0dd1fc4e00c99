"""The suite hides CUDA from itself and from every process it starts, and deselects the tests
marked cuda where torch sees no CUDA device, with one line saying why (tests/conftest.py,
tests/helpers.py; docs/testing-on-cuda.md).

Without the hiding, on a machine with an NVIDIA GPU, a native run of a corpus script (``cuda``
when ``torch.cuda.is_available()``) trains on the GPU while dmlshim's CPU target trains on the
CPU, and every comparison fails. These tests run everywhere; a pytest started here with a
made-up ``CUDA_VISIBLE_DEVICES`` shows what a machine with GPUs gets.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any, Dict, List, Optional

import pytest
import torch
from helpers import REPO, clean_env, cuda_state, cuda_visible, describe

SEEN = "SEEN "
CHILD = "import os, json; print(json.dumps(os.environ.get('CUDA_VISIBLE_DEVICES')))"
CUDA_TESTS = "tests/cuda/test_inert_on_cuda.py"
SELF = "tests/test_cuda_hidden.py::test_this_process_and_its_children_see_no_cuda"


def test_this_process_and_its_children_see_no_cuda():
    """(Also run by a pytest started below, with ``-rP``: its ``SEEN`` line says what it saw.)"""
    import os

    child = subprocess.run([sys.executable, "-c", CHILD], env=clean_env(), capture_output=True,
                           text=True, timeout=120, check=False)
    given_back = subprocess.run([sys.executable, "-c", CHILD], env=clean_env(**cuda_visible()),
                                capture_output=True, text=True, timeout=120, check=False)
    seen = {"here": os.environ.get("CUDA_VISIBLE_DEVICES"), "available": torch.cuda.is_available(),
            "child": json.loads(child.stdout), "given back": json.loads(given_back.stdout),
            "state": cuda_state()}
    print(SEEN + json.dumps(seen))
    assert seen["here"] == "" and seen["child"] == "" and not seen["available"], seen
    assert seen["given back"] == seen["state"]["visible"], seen
    assert "present" in seen["state"] and seen["state"]["why"], seen  # probed at configure


def _pytest(args: List[str], visible: Optional[str]) -> subprocess.CompletedProcess[str]:
    """``python -m pytest args`` in the checkout, started with ``CUDA_VISIBLE_DEVICES`` set to
    ``visible`` (None: unset), as a user's shell would start it."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          env=clean_env(CUDA_VISIBLE_DEVICES=visible), cwd=REPO,
                          capture_output=True, text=True, timeout=1200, check=False)


def _seen(proc: subprocess.CompletedProcess[str]) -> Dict[str, Any]:
    """What :func:`test_this_process_and_its_children_see_no_cuda` saw in that pytest."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(SEEN)]
    assert len(lines) == 1, describe(proc)
    return json.loads(lines[0][len(SEEN):])


def _deselected(proc: subprocess.CompletedProcess[str]) -> int:
    """The count on the one line saying why the tests marked cuda were deselected."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("cuda: ")]
    assert len(lines) == 1, describe(proc)
    m = re.fullmatch(r"cuda: (\d+) tests marked cuda deselected: (.+); they run where torch sees "
                     r"a CUDA device \(docs/testing-on-cuda\.md\)", lines[0])
    assert m, lines
    assert re.search(r"sees no CUDA device|no GPU driver here|built without CUDA", m.group(2)), m
    return int(m.group(1))


def test_a_pytest_started_with_cuda_visible_devices_hides_it_and_deselects_with_one_line():
    """Started with ``CUDA_VISIBLE_DEVICES=-1`` (no CUDA device for torch on any machine, and a
    value unlike the hidden one), with xdist and ``--tier all``: its workers see ``""`` and
    give their children ``-1`` back, and the tests marked cuda go, said once."""
    proc = _pytest(["-q", "-rP", "-n", "2", "--tier", "all", CUDA_TESTS, SELF], "-1")
    assert proc.returncode == 0, describe(proc)  # this file's one test passed, nothing else ran
    seen = _seen(proc)
    assert seen["here"] == seen["child"] == "", seen
    assert seen["state"]["visible"] == seen["given back"] == "-1", seen
    assert seen["state"]["present"] is False, seen
    assert _deselected(proc) > 10


def test_a_pytest_started_with_it_unset_gives_children_all_gpus_back():
    proc = _pytest(["-q", "-rP", "-n", "0", SELF], None)
    assert proc.returncode == 0, describe(proc)
    seen = _seen(proc)
    assert seen["here"] == seen["child"] == "", seen
    # None: cuda_visible() removes the variable, and the child sees every GPU
    assert seen["state"]["visible"] is None and seen["given back"] is None, seen


def test_the_rest_tier_deselects_them_with_one_line_too():
    # CUDA_VISIBLE_DEVICES="": no CUDA device for torch on any machine, one with GPUs included
    proc = _pytest(["-q", "-n", "0", "--tier", "rest", CUDA_TESTS], "")
    assert proc.returncode == 5, describe(proc)  # pytest's "no tests ran": all deselected
    count = _deselected(proc)
    assert re.search(rf"^{count} deselected in ", proc.stdout, re.M), describe(proc)


def test_asking_for_the_cuda_tests_without_cuda_is_a_usage_error():
    proc = _pytest(["-q", "-n", "0", "-m", "cuda", CUDA_TESTS], "")
    assert proc.returncode == 4, describe(proc)  # pytest's usage error: nothing ran
    assert "-m 'cuda' asks for the tests marked cuda" in proc.stderr, describe(proc)
    assert "docs/testing-on-cuda.md" in proc.stderr, describe(proc)


@pytest.mark.parametrize("markexpr, asks", [
    ("", False), ("cuda", True), ("cuda or slow", True), ("cuda and not slow", True),
    ("not users_path", False), ("not cuda", False), ("slow", False), ("cuda or not cuda", False),
])
def test_which_marker_expressions_ask_for_cuda(markexpr, asks):
    from conftest import _asks_for_cuda

    assert _asks_for_cuda(markexpr) is asks


def test_the_cuda_marker_is_registered(pytestconfig):
    assert any(line.startswith("cuda:") for line in pytestconfig.getini("markers"))
