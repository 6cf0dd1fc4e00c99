"""Exit statuses as the platform's shell shows them (the runner exits with them; the report's
``outcome`` names them). A leaf module: the runner and the diagnostics both read it."""

from __future__ import annotations

import os

# Windows python's exit status after an uncaught KeyboardInterrupt (Ctrl-C)
STATUS_CONTROL_C_EXIT = 0xC000013A


def windows_exit_status(code: int) -> int:
    """A child's Windows exit status, as ``subprocess`` gives it (unsigned: an uncaught Ctrl-C is
    0xC000013A, an access violation 0xC0000005), in the form ``sys.exit`` passes on unchanged.

    ``sys.exit(n)`` hands n to C's ``exit(int)``: above 2**31-1 it exits 0xFFFFFFFF, so the
    32 bits are read as the signed number python itself reports for them."""
    code &= 0xFFFFFFFF
    return code - (1 << 32) if code & 0x80000000 else code


def interrupted_exit_code(os_name: str = os.name) -> int:
    """The exit status, as a shell shows it, of a python that ends on an uncaught
    KeyboardInterrupt: POSIX python kills itself with SIGINT, which a shell shows as 128 + 2;
    Windows python exits with STATUS_CONTROL_C_EXIT, which cmd's %ERRORLEVEL% and PowerShell's
    $LASTEXITCODE show as the signed number -1073741510 (the form the runner exits with)."""
    if os_name == "nt":
        return windows_exit_status(STATUS_CONTROL_C_EXIT)
    return 130
