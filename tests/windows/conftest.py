"""The Windows python every test of tests/windows/ runs (.ci/windows-lane sets it up)."""

from __future__ import annotations

import pytest

from tests.windows.wine import WindowsPython


@pytest.fixture(scope="session")
def win(request) -> WindowsPython:
    return WindowsPython(request.config.getoption("--windows-python"),
                         real_d3d12=request.config.getoption("--windows-d3d12"))
