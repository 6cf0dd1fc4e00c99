"""Reports of child processes (tests/test_diagnostics.py): run shimmed with DMLSHIM_REPORT=PATH
and ``children.py PATH``. The parent makes one CUDA call, then starts

* a subprocess that imports dmlshim with the same DMLSHIM_REPORT and makes a CUDA call,
* a forked child that makes a CUDA call and exits through the interpreter (so atexit runs),
* a forked child that does nothing and exits the same way (like an idle worker),

and prints ``child <kind> <pid>`` for each. Only PATH belongs to the parent; a child that did
something writes PATH with .<pid> before the extension; the idle one writes nothing.
"""

import os
import subprocess
import sys

import torch

report = sys.argv[1]
x = torch.zeros(2, device="cuda")

env = dict(os.environ, DMLSHIM_REPORT=report)
busy = "import dmlshim, os, torch; torch.ones(1, device='cuda'); print(os.getpid())"
out = subprocess.run([sys.executable, "-c", busy], env=env, capture_output=True, text=True,
                     check=True)
print("child busy", out.stdout.strip())

for kind in ("fork", "idle"):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        if kind == "fork":
            y = torch.full((2,), 1.0, device="cuda")
        sys.exit(0)
    os.waitpid(pid, 0)
    print("child", kind, pid)
print("parent", os.getpid())
