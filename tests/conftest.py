"""Test-process setup: `import dmlshim` must not patch the pytest process itself.

Unit tests call dmlshim.install()/uninstall() explicitly (see the `shim` fixture); scripts run
through the runner in subprocesses get a clean environment from tests/helpers.py.
"""

import os

os.environ["DMLSHIM_DISABLE"] = "1"
