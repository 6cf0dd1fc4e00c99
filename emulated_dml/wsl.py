"""``python -m emulated_dml.wsl [--adapters N] [--float64] [--memory MIB] -- CMD ...``: run CMD
as on WSL; ``python -m emulated_dml.wsl --d3d12 PATH -- CMD ...``: the same over a real D3D12
library, with the real torch-directml wheel.

CMD runs in a private mount namespace (``unshare -m``; ``unshare -rm`` when not root) that
has what a WSL2 machine with a DirectML adapter has and nothing of it leaks out:

* ``/dev/dxg`` (``/dev`` is overlaid; ``/dev/shm``, ``/dev/pts`` and ``/dev/mqueue`` are
  bound back, so multiprocessing works);
* ``/usr/lib/wsl/lib`` with "WSL" ``libd3d12.so``/``libdxcore.so`` that report N adapters
  (``/usr/lib`` is overlaid), listed in ``/etc/ld.so.conf.d/ld.wsl.conf`` and in the loader
  cache (``ldconfig -C`` into a private file bound over ``/etc/ld.so.cache``), so the loader
  finds them with no ``LD_LIBRARY_PATH``, as on WSL;
* the stand-in ``torch_directml`` (emulated_dml.wheel: the wheel's API and folder layout,
  stub libraries included; the device is emulated_dml's emulator) first on ``PYTHONPATH``,
  so it shadows an installed wheel.

With ``--d3d12 PATH``, the real route: ``/usr/lib/wsl/lib``
holds WSL's ``libd3d12.so``/``libdxcore.so`` as the project's adapter over the real D3D12
library PATH (a vkd3d-proton build's ``libvkd3d-proton-d3d12.so``: D3D12 on Vulkan, here on
Mesa's lavapipe) and the library's folder, and nothing is put on ``PYTHONPATH``: CMD's python
imports the torch_directml it has installed (the real wheel, whose ``libdirectml.so`` and native
extension then run on a real D3D12 device). emulated_dml/wheel/wsl_d3d12.c and wsl_dxcore.c say
what the adapter changes. The D3D12 library is not built by the project.

No file is created outside a temporary folder: the namespace's mounts are the only change,
and they end with CMD. The exit status is CMD's (128 + N when a signal N ended it).
Needs Linux, util-linux's ``unshare`` and ``mount``, ``ldconfig`` and a C compiler.

This file runs as a script too (``python path/to/emulated_dml/wsl.py -- CMD``): then it
imports nothing of emulated_dml (nor torch).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WSL_LIB = "/usr/lib/wsl/lib"
DXG = "/dev/dxg"
_DEV_SUBMOUNTS = ("shm", "pts", "mqueue")
_ROOTLESS = False  # set in the namespace when it was made with unshare -r


class HarnessError(RuntimeError):
    pass


def _builder():
    """emulated_dml.wheel, loaded by path: it needs only the standard library."""
    spec = importlib.util.spec_from_file_location("_emulated_dml_wheel_builder",
                                                  os.path.join(HERE, "wheel", "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise HarnessError(f"emulated_dml.wsl: mount {' '.join(args)} failed: "
                           f"{proc.stderr.strip()}")


def _mkdir(*parts: str) -> str:
    path = os.path.join(*parts)
    os.makedirs(path, exist_ok=True)
    return path


def _overlay(target: str, lower: List[str], tmp: str, name: str, writable: bool) -> None:
    opts = "lowerdir=" + ":".join(lower)
    if writable:
        opts += f",upperdir={_mkdir(tmp, name, 'up')},workdir={_mkdir(tmp, name, 'work')}"
        if _ROOTLESS:
            opts += ",userxattr"  # a user namespace cannot write trusted.* xattrs
    _mount("-t", "overlay", "overlay", "-o", opts, target)


def _setup_dev(tmp: str, rootless: bool) -> None:
    if rootless:
        _setup_dev_rootless(tmp)
    else:
        keep = _mkdir(tmp, "keep")
        kept = []
        for sub in _DEV_SUBMOUNTS:
            if os.path.ismount(f"/dev/{sub}"):
                _mount("--rbind", f"/dev/{sub}", _mkdir(keep, sub))
                kept.append(sub)
        _overlay("/dev", ["/dev"], tmp, "dev", writable=True)
        for sub in kept:
            _mount("--rbind", os.path.join(keep, sub), f"/dev/{sub}")
    with open(DXG, "w"):
        pass  # in the overlay's upper folder or the tmpfs (tmp), not in the real /dev


def _setup_dev_rootless(tmp: str) -> None:
    """In a user namespace /dev cannot be an overlay (its submounts are locked) and a mount
    made there cannot open device nodes: a tmpfs on /dev with every entry bound back."""
    import stat

    keep = _mkdir(tmp, "keep", "dev")
    _mount("--rbind", "/dev", keep)
    _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/dev")
    for name in os.listdir(keep):
        src, dst = os.path.join(keep, name), os.path.join("/dev", name)
        try:
            mode = os.lstat(src).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(src), dst)
                continue
            if stat.S_ISDIR(mode):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            _mount("--rbind", src, dst)
        except (OSError, HarnessError):
            continue  # an entry this user cannot reach stays out, as it was unusable anyway


def _setup_libraries(tmp: str, wsl_lib: str) -> None:
    lower = _mkdir(tmp, "lib-lower", "wsl", "lib")
    for name in os.listdir(wsl_lib):
        shutil.copy(os.path.join(wsl_lib, name), lower)
    _overlay("/usr/lib", [os.path.join(tmp, "lib-lower"), "/usr/lib"], tmp, "lib", False)
    conf = _mkdir(tmp, "conf-lower")
    with open(os.path.join(conf, "ld.wsl.conf"), "w", encoding="ascii") as fh:
        fh.write("# This file was automatically generated by WSL. (emulated_dml.wsl)\n"
                 f"{WSL_LIB}\n")
    if not os.path.isdir("/etc/ld.so.conf.d"):
        raise HarnessError("emulated_dml.wsl: /etc/ld.so.conf.d is missing; the harness lists "
                           f"{WSL_LIB} there, as WSL does")
    _overlay("/etc/ld.so.conf.d", [conf, "/etc/ld.so.conf.d"], tmp, "conf", False)
    cache = os.path.join(tmp, "ld.so.cache")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    proc = subprocess.run([ldconfig, "-X", "-C", cache], capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(cache):
        raise HarnessError(f"emulated_dml.wsl: ldconfig -C {cache} failed: {proc.stderr.strip()}")
    if not os.path.exists("/etc/ld.so.cache"):
        raise HarnessError("emulated_dml.wsl: /etc/ld.so.cache is missing (nothing to bind the "
                           "namespace's loader cache over)")
    _mount("--bind", cache, "/etc/ld.so.cache")


def _inner(tmp: str, site: str, wsl_lib: str, rootless: bool, cmd: List[str]) -> int:
    global _ROOTLESS
    _ROOTLESS = rootless
    try:
        _setup_dev(tmp, rootless)
        _setup_libraries(tmp, wsl_lib)
    except (HarnessError, OSError) as err:
        print(str(err), file=sys.stderr)
        return 125
    if not site:
        # WSL's D3D12 prints nothing; vkd3d-proton logs at info level unless told otherwise
        os.environ.setdefault("VKD3D_DEBUG", "none")
        os.environ.setdefault("VKD3D_SHADER_DEBUG", "none")
        # its pipeline cache would go to the cwd, one file that processes running at once
        # share: off (Mesa's own shader cache, safe across processes, keeps compiles warm)
        os.environ.setdefault("VKD3D_SHADER_CACHE_PATH", "0")
    if site:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = site if not old else site + os.pathsep + old
    try:
        os.execvp(cmd[0], cmd)
    except OSError as err:
        print(f"emulated_dml.wsl: cannot run {cmd[0]}: {err}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m emulated_dml.wsl",
                                description="Run CMD as on WSL2 with N DirectML adapters "
                                            "(the stand-in torch_directml on emulated_dml).")
    p.add_argument("--adapters", type=int, default=1, help="adapters the libraries report")
    p.add_argument("--float64", action="store_true",
                   help="the adapters support float64 (most real ones do not)")
    p.add_argument("--memory", type=int, default=0, metavar="MIB",
                   help="video memory of each adapter in MiB (default 0: unlimited); past it "
                        "the wheel's untyped out-of-memory RuntimeError")
    p.add_argument("--d3d12", metavar="PATH",
                   help="a real D3D12 library (vkd3d-proton's libvkd3d-proton-d3d12.so): the "
                        "installed torch-directml wheel runs on it, not the stand-in")
    p.add_argument("--inner", nargs=4, metavar=("TMP", "SITE", "LIB", "ROOTLESS"),
                   help=argparse.SUPPRESS)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("emulated_dml.wsl: no command given (python -m emulated_dml.wsl -- CMD ...)",
              file=sys.stderr)
        return 2
    if args.inner:
        tmp, site, lib, rootless = args.inner
        return _inner(tmp, site, lib, rootless == "1", cmd)
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        print("emulated_dml.wsl: needs Linux with util-linux's unshare", file=sys.stderr)
        return 125
    builder = _builder()
    try:
        if args.d3d12:
            site, lib = "", builder.build_real_wsl_libs(args.d3d12, args.adapters)
        else:
            site = builder.build_standin()
            lib = builder.build_wsl_libs(args.adapters, args.float64, args.memory)
    except (builder.BuildError, ValueError) as err:
        print(str(err), file=sys.stderr)
        return 125
    rootless = os.geteuid() != 0
    unshare = ["unshare", "-rm" if rootless else "-m", "--propagation", "private"]
    tmp = tempfile.mkdtemp(prefix="emulated-dml-wsl.")
    try:
        inner = [sys.executable, "-I", os.path.abspath(__file__), "--inner", tmp, site, lib,
                 "1" if rootless else "0", "--", *cmd]
        code = subprocess.call(unshare + inner)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
