"""Test-process setup: `import dmlshim` must not patch the pytest process itself.

Unit tests call dmlshim.install()/uninstall() explicitly (see the `shim` fixture); scripts run
through the runner in subprocesses get a clean environment from tests/helpers.py.
"""

import os

os.environ["DMLSHIM_DISABLE"] = "1"

import pytest  # noqa: E402


@pytest.fixture
def shim():
    """Install dmlshim in this test process with the given options; always uninstalled after.

    Usage: ``def test_x(shim): shim(device="cpu")``.
    """
    import dmlshim

    def _install(**options):
        return dmlshim.install(**options)

    try:
        yield _install
    finally:
        dmlshim.uninstall()
