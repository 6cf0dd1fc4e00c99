"""``python status.py STATUS_FILE -- python.exe ARGS``: runs the command (stdio inherited) and
writes its exit status, as Windows' ``subprocess`` gives it (unsigned 32 bits), to STATUS_FILE.

A Linux parent of wine sees only the low 8 bits of a Windows exit status (0xC000013A reads 58):
this Windows parent reads all 32, as cmd's %ERRORLEVEL% or PowerShell's $LASTEXITCODE would.
"""

import subprocess
import sys

if __name__ == "__main__":
    status_file, dashes, *command = sys.argv[1:]
    assert dashes == "--", sys.argv
    code = subprocess.call(command)
    with open(status_file, "w") as f:
        f.write(str(code))
