"""Test-process setup: `import dmlshim` must not patch the pytest process itself.

Unit tests call dmlshim.install()/uninstall() explicitly (see the `shim` fixture); scripts run
through the runner in subprocesses get a clean environment from tests/helpers.py.
"""

import os

os.environ["DMLSHIM_DISABLE"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402


def pytest_configure(config):
    # PyTorch's autograd engine sizes its per-device queues at the first backward() of the
    # process: the emulated device's guard must exist before any CPU test runs backward().
    if "torch_directml" not in sys.modules:
        import emulated_dml as emulator

        emulator.install_device_guard()


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
