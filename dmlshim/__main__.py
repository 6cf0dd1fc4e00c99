"""``python -m dmlshim``: see dmlshim/runner.py."""

import sys

import dmlshim
from dmlshim.runner import main

if __name__ == "__main__":
    dmlshim.runner_started()
    sys.exit(main())
