"""The folder a shimmed process puts on its children's ``PYTHONPATH``: see ``sitecustomize.py``.

This ``__init__`` only makes the folder a package, so that packaging ships ``sitecustomize.py``
with dmlshim; on ``PYTHONPATH`` the folder is a plain path entry, not a package.
"""

import os

BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(__file__))
