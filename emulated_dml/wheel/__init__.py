"""Builds a stand-in for the torch-directml wheel on top of emulated_dml, and WSL's libraries.

:func:`build_standin` returns a folder to put first on ``PYTHONPATH``: ``torch_directml/``
(the wheel's API and folder layout: ``__init__.py``, ``device.py``, ``libdirectml.so`` and the
empty-stub ``libd3d12.so``/``libdxcore.so``), ``torch_directml_native.py`` and the package
metadata. :func:`build_wsl_libs` returns a folder of "WSL" ``libd3d12.so``/``libdxcore.so``
that report ``adapters`` adapters: the harness (:mod:`emulated_dml.wsl`) mounts it at
``/usr/lib/wsl/lib`` and lists it in the loader cache. The libraries are compiled with the C
compiler (``cc``; ``CC`` overrides) once per source version into ``EMULATED_DML_CACHE``
(default ``~/.cache/emulated_dml``), like the emulator's C++ device guard.

:func:`build_real_wsl_libs` is the real route: WSL's ``libd3d12.so``/``libdxcore.so`` over a
real D3D12 library (a vkd3d-proton build, D3D12 on Vulkan), written in the project's C
(``wsl_d3d12.c``: by-value struct returns, tiled resources absent, the fence wait;
``wsl_dxcore.c``: one adapter, the Vulkan device's). The real torch-directml wheel then runs on
it as on WSL. Nothing of the D3D12 library is built here: it is given by path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import List, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin")
VERSION = "0.2.5.dev240914+emulated"
CACHE_ENV = "EMULATED_DML_CACHE"
_C_FILES = ("dxcore.h", "stub.h", "dxcore.c", "d3d12.c", "directml.c", "wsl_abi.h", "wsl_d3d12.c",
            "wsl_d3d12.map", "wsl_dxcore.c")
WSL_LIB = "/usr/lib/wsl/lib"


class BuildError(RuntimeError):
    """The stand-in's libraries could not be compiled."""


def cache_root() -> str:
    root = os.environ.get(CACHE_ENV)
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "emulated_dml")
    return root


def _digest(*extra: str) -> str:
    h = hashlib.sha1()
    files = [os.path.join(HERE, f) for f in _C_FILES]
    for folder, _dirs, names in sorted(os.walk(STANDIN)):
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    for path in files:
        h.update(os.path.relpath(path, HERE).encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    for item in extra:
        h.update(item.encode())
    return h.hexdigest()[:12]


def _cc(out: str, source: str, defines: Sequence[str] = (), link: Sequence[str] = (),
        visibility_hidden: bool = False) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError("emulated_dml.wheel: no C compiler (cc or gcc) to build the stand-in's "
                         "libraries; install gcc")
    # No -soname and no rpath: like the wheel's libraries, found by file name by the loader.
    cmd: List[str] = [compiler, "-shared", "-fPIC", "-O1", "-I", HERE,
                      *(["-fvisibility=hidden"] if visibility_hidden else []),
                      *(f"-D{d}" for d in defines), "-o", out, os.path.join(HERE, source),
                      "-Wl,--no-as-needed", *link]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"emulated_dml.wheel: {' '.join(cmd)} failed:\n{proc.stderr}")


def _build_once(name: str, fill) -> str:
    """``cache_root()/name``, made by ``fill(folder)`` in a private folder and renamed into
    place, so that processes building at the same time never see half a build."""
    final = os.path.join(cache_root(), name)
    if os.path.isdir(final):
        return final
    os.makedirs(cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=name + ".", dir=cache_root())
    try:
        fill(tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fill_standin(site: str) -> None:
    pkg = os.path.join(site, "torch_directml")
    shutil.copytree(os.path.join(STANDIN, "torch_directml"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(STANDIN, "torch_directml_native.py"), site)
    # the wheel's folder: empty link stubs beside libdirectml.so, which links them by name
    _cc(os.path.join(pkg, "libd3d12.so"), "d3d12.c")
    _cc(os.path.join(pkg, "libdxcore.so"), "dxcore.c")
    _cc(os.path.join(pkg, "libdirectml.so"), "directml.c",
        link=["-L", pkg, "-ld3d12", "-ldxcore"])
    info = os.path.join(site, f"torch_directml-{VERSION}.dist-info")
    os.mkdir(info)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: torch-directml\nVersion: {VERSION}\n"
                 "Summary: emulated_dml's stand-in for the torch-directml wheel\n")
    with open(os.path.join(info, "top_level.txt"), "w", encoding="utf-8") as fh:
        fh.write("torch_directml\ntorch_directml_native\n")


def build_standin() -> str:
    """The folder holding the stand-in ``torch_directml`` (put it first on ``PYTHONPATH``)."""
    return os.path.join(_build_once(f"standin-{_digest()}", lambda d: _fill_standin(
        _mkdir(os.path.join(d, "site")))), "site")


def build_wsl_libs(adapters: int = 1, float64: bool = False, memory_mib: int = 0) -> str:
    """A folder with WSL-like ``libd3d12.so`` and ``libdxcore.so`` reporting ``adapters``
    adapters (float64 support and video memory in MiB, 0 for unlimited, as given), for
    ``/usr/lib/wsl/lib``."""
    if not 1 <= adapters <= 16:
        raise ValueError(f"emulated_dml.wheel: adapters must be 1..16, got {adapters}")
    if memory_mib < 0:
        raise ValueError(f"emulated_dml.wheel: memory must be >= 0 MiB, got {memory_mib}")
    defines = ["EMU_WSL", f"EMU_ADAPTERS={adapters}", f"EMU_FLOAT64={int(bool(float64))}",
               f"EMU_MEMORY_MIB={int(memory_mib)}"]

    def fill(folder: str) -> None:
        lib = _mkdir(os.path.join(folder, "lib"))
        _cc(os.path.join(lib, "libd3d12.so"), "d3d12.c", defines)
        _cc(os.path.join(lib, "libdxcore.so"), "dxcore.c", defines)

    name = f"wsl-{adapters}{'-f64' if float64 else ''}-{memory_mib}-{_digest(*defines)}"
    return os.path.join(_build_once(name, fill), "lib")


def build_real_wsl_libs(d3d12: str, adapters: int = 1) -> str:
    """A folder for ``/usr/lib/wsl/lib`` with WSL's ``libd3d12.so``/``libdxcore.so`` over the
    real D3D12 library ``d3d12`` (a file): it and every other shared library of its folder (a
    vkd3d-proton build loads its ``libvkd3d-proton-d3d12core.so`` by name) are copied beside
    them, and the adapter loads it from ``/usr/lib/wsl/lib``, where the harness mounts the
    folder."""
    d3d12 = os.path.realpath(d3d12)
    if not os.path.isfile(d3d12):
        raise BuildError(f"emulated_dml.wheel: the D3D12 library {d3d12} does not exist")
    folder_of = os.path.dirname(d3d12)
    siblings = sorted(n for n in os.listdir(folder_of) if ".so" in n and
                      os.path.isfile(os.path.join(folder_of, n)))
    stamp = [d3d12] + [f"{n}:{os.path.getmtime(os.path.join(folder_of, n))}" for n in siblings]
    real = f"{WSL_LIB}/{os.path.basename(d3d12)}"
    if os.path.basename(d3d12) in ("libd3d12.so", "libdxcore.so"):
        raise BuildError(f"emulated_dml.wheel: rename {d3d12}: the harness's own libraries "
                         "take that name in /usr/lib/wsl/lib")

    def fill(folder: str) -> None:
        lib = _mkdir(os.path.join(folder, "lib"))
        for name in siblings:
            shutil.copy(os.path.join(folder_of, name), lib)
        _cc(os.path.join(lib, "libd3d12.so"), "wsl_d3d12.c", [f'REAL_D3D12="{real}"'],
            link=[f"-Wl,--version-script={os.path.join(HERE, 'wsl_d3d12.map')}", "-ldl",
                  "-lpthread"], visibility_hidden=True)
        _cc(os.path.join(lib, "libdxcore.so"), "wsl_dxcore.c", [f"ADAPTERS={adapters}"],
            link=["-ldl", "-lpthread"], visibility_hidden=True)

    if not 1 <= adapters <= 16:
        raise ValueError(f"emulated_dml.wheel: adapters must be 1..16, got {adapters}")
    name = f"wsl-real-{adapters}-{_digest(*stamp)}"
    return os.path.join(_build_once(name, fill), "lib")


def _mkdir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path
