"""Test-process setup: `import dmlshim` must not patch the pytest process itself.

Unit tests call dmlshim.install()/uninstall() explicitly (see the `shim` fixture); scripts run
through the runner in subprocesses get a clean environment from tests/helpers.py.

Tiers: a plain `pytest` runs the fast tier (every area, a few minutes); `--tier rest` runs the
tests marked ``slow`` (framework matrices, model zoos, long subprocess runs), `--tier all`
both. .ci/run runs the fast tier, then the rest, on each lane.
"""

import os

os.environ["DMLSHIM_DISABLE"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402


TIERS = ("fast", "rest", "all")


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="fast",
                     help="fast (default): every area in minutes; rest: the tests marked slow; "
                          "all: both")


def pytest_collection_modifyitems(config, items):
    tier = config.getoption("--tier")
    if tier == "all":
        return
    want_slow = tier == "rest"
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("slow") is not None) == want_slow else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


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
