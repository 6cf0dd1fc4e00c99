"""``python -m dmlshim``: see dmlshim/runner.py."""

import sys

from dmlshim.runner import main

if __name__ == "__main__":
    sys.exit(main())
