"""The WSL harness's real route builds on any Linux machine (its lane needs a D3D12 library).

``python -m emulated_dml.wsl --d3d12 PATH`` compiles the project's adapter (wsl_d3d12.c,
wsl_dxcore.c) around PATH. The lane that runs it (tests/test_real_wheel.py) runs only where a
real D3D12 library exists; this checks, everywhere, what the real wheel's binaries link against:
``D3D12CreateDevice`` and the other D3D12 exports with the symbol version ``VER_1`` (the
wheel's ``libdirectml.so`` and native extension import them so), ``DXCoreCreateAdapterFactory``
unversioned, and PATH's folder copied beside them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import REPO

sys.path.insert(0, str(REPO))
from emulated_dml import wheel  # noqa: E402

D3D12_EXPORTS = ("D3D12CreateDevice", "D3D12SerializeVersionedRootSignature",
                 "D3D12SerializeRootSignature", "D3D12GetDebugInterface")


def _exports(lib: Path) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                          text=True, check=True).stdout


def test_the_adapter_builds_with_the_wsl_exports(tmp_path, monkeypatch):
    monkeypatch.setenv(wheel.CACHE_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "vkd3d"
    folder.mkdir()
    src = tmp_path / "empty.c"
    src.write_text("int vkd3d_placeholder(void) { return 0; }\n")
    for name in ("libvkd3d-proton-d3d12.so", "libvkd3d-proton-d3d12core.so"):
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(src)], check=True)
    lib = Path(wheel.build_real_wsl_libs(str(folder / "libvkd3d-proton-d3d12.so"), adapters=2))
    assert sorted(p.name for p in lib.iterdir()) == [
        "libd3d12.so", "libdxcore.so", "libvkd3d-proton-d3d12.so", "libvkd3d-proton-d3d12core.so"]
    d3d12 = _exports(lib / "libd3d12.so")
    for name in D3D12_EXPORTS:
        assert f" T {name}@@VER_1" in d3d12, d3d12
    assert "patch" not in d3d12 and "original" not in d3d12  # nothing else leaks out
    dxcore = _exports(lib / "libdxcore.so")
    assert [line.split()[-1] for line in dxcore.splitlines() if " T " in line] == [
        "DXCoreCreateAdapterFactory"], dxcore


def test_the_harness_refuses_a_missing_library(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "emulated_dml" / "wsl.py"), "--d3d12",
                           str(tmp_path / "nope.so"), "--", "true"], capture_output=True,
                          text=True)
    assert proc.returncode == 125 and "does not exist" in proc.stderr, proc.stderr
