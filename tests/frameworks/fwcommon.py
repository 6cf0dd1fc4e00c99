"""What the framework tests share: the environment that keeps every framework offline, and
runs of the scripts in tests/frameworks/scripts/ natively or through ``python -m dmlshim``.

A native run is the script told to use the CPU (``--device cpu``, ``use_cpu=True``,
``accelerator="cpu"``, ...) in a Python without dmlshim; a shimmed run is the same script with
its CUDA settings. Scripts print ``loss <epoch> <step> <float.hex()>`` lines (tests/helpers.py).
"""

from __future__ import annotations

import builtins
import functools
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import helpers
import pytest
from helpers import (
    clean_env,
    describe,
    first_difference,
    losses,
    option_env,
    run_native,
    run_shim,
    run_wsl,
    users_lane,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT = 420.0  # a framework import plus a few steps, on a loaded 2-core machine

# On the emulator, losses match the CPU's to this relative tolerance, not bit for bit. The
# emulator runs each op's CPU kernel, so most steps are bit-identical; where torch picks a kernel
# by device type (scaled_dot_product_attention takes its math kernel off the CPU, the CPU takes
# its flash kernel; a few reductions in attention blocks), the sums round differently: a few
# float32 ulps (~1e-7 relative) per step. 1e-5 allows for that over the few steps each script
# runs and is still far below what a real fault does (a step on stale parameters, a skipped
# update, a wrong dtype change the loss at 1e-3 or more).
EMULATOR_REL = 1e-5


@functools.cache
def _home() -> str:
    """One scratch home per test process for the frameworks' caches and settings."""
    home = Path(tempfile.mkdtemp(prefix="dmlshim-fw-"))
    yolo = home / "ultralytics"
    yolo.mkdir()
    # ultralytics downloads Arial.ttf unless its config dir has one: any TrueType font will do
    try:
        import matplotlib  # ultralytics depends on it
    except ImportError:
        return str(home)
    font = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    (yolo / "Arial.ttf").write_bytes(font.read_bytes())
    return str(home)


def fw_env(**extra: str) -> Dict[str, str]:
    """Variables for every framework run: nothing is downloaded, nothing is drawn on screen, one
    CPU thread (the same reduction order in every run, and no oversubscription when pytest-xdist
    runs two tests at once)."""
    home = _home()
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": os.path.join(home, "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false", "YOLO_OFFLINE": "1",
        "YOLO_CONFIG_DIR": os.path.join(home, "ultralytics"), "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_DISABLED": "true",
        "DO_NOT_TRACK": "1", "PYTHONWARNINGS": "ignore::FutureWarning",
    }
    env.update(extra)
    return env


def script(name: str) -> Path:
    return SCRIPTS / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def native(name: str, *args: str, cwd: Optional[Path] = None,
           env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    """The script told to use the CPU, without dmlshim (cached per test process when cwd is
    None)."""
    return run_native(script(name), *args, env=fw_env(**(env or {})), cwd=cwd, timeout=TIMEOUT,
                      cached=cwd is None)


@functools.cache
def _shim_cached(name: str, args: Tuple[str, ...], device: str,
                 env_items: Tuple[Tuple[str, str], ...]) -> subprocess.CompletedProcess[str]:
    return run_shim(script(name), *args, device=device, env=fw_env(**dict(env_items)),
                    timeout=TIMEOUT)


def shimmed(name: str, *args: str, device: str, cwd: Optional[Path] = None,
            options: Optional[Dict[str, object]] = None,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    """``python -m dmlshim script args`` with ``DMLSHIM_DEVICE=device`` (cached per test process
    when cwd is None)."""
    extra = {**option_env(options), **(env or {})}
    if cwd is None:
        return _shim_cached(name, tuple(args), device, tuple(sorted(extra.items())))
    return run_shim(script(name), *args, device=device, env=fw_env(**extra), cwd=cwd,
                    timeout=TIMEOUT)


def users_path(name: str, *args: str, cwd: Path, adapters: int = 1,
               options: Optional[Dict[str, object]] = None,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    """``python -m dmlshim script args`` with default options (``auto``) inside the WSL harness
    with ``adapters`` adapters (helpers.on_users_path): the path a user with DirectML takes."""
    extra = {**option_env(options), **(env or {})}
    # the real-wheel lane computes on a software adapter (lavapipe) and compiles each shader
    # the first time: YOLOv8's run takes ~7 minutes there
    timeout = TIMEOUT if helpers.REAL_D3D12 is None else 3 * TIMEOUT
    return run_shim(script(name), *args, device=None, env=fw_env(**extra), cwd=cwd,
                    timeout=timeout, wsl=users_lane(adapters))


def run_module(module_args: Sequence[str], *, device: Optional[str], cwd: Path,
               env: Optional[Dict[str, str]] = None,
               wsl: int = 0) -> subprocess.CompletedProcess[str]:
    """``python -m <module_args>``, natively (``device=None``) or as ``python -m dmlshim -m
    <module_args>`` (launchers such as ``accelerate launch``, whose ranks inherit the shim).
    ``wsl=N``: shimmed with default options inside the WSL harness with N adapters (the users'
    path, on the real wheel in the real-wheel lane; ``device`` is then ignored: ``auto``
    decides)."""
    extra = dict(env or {})
    cmd = [sys.executable]
    if wsl:
        cmd += ["-m", "dmlshim"]
    elif device is not None:
        extra["DMLSHIM_DEVICE"] = device
        cmd += ["-m", "dmlshim"]
    cmd += ["-m", *module_args]
    timeout = TIMEOUT if helpers.REAL_D3D12 is None else 3 * TIMEOUT
    return run_wsl(cmd, env=clean_env(**fw_env(**extra)), wsl=users_lane(wsl) if wsl else 0,
                   timeout=timeout, cwd=cwd)


def ok_losses(proc: subprocess.CompletedProcess[str], at_least: int = 2) -> list:
    """The run's losses, after checking that it exited 0 and printed finite losses."""
    assert proc.returncode == 0, describe(proc)
    got = losses(proc.stdout)
    assert len(got) >= at_least, describe(proc)
    assert all(math.isfinite(v) for v in got), describe(proc)
    return got


def assert_equal_losses(proc, reference) -> None:
    """Bit-identical losses (the CPU target against a native CPU run)."""
    expected = ok_losses(reference)
    got = ok_losses(proc)
    assert got == expected, first_difference(got, expected) + describe(proc)


def assert_close_losses(proc, reference, rel: float = EMULATOR_REL) -> None:
    """Losses equal within ``rel`` (the emulator against a native CPU run; see EMULATOR_REL)."""
    expected = ok_losses(reference)
    got = ok_losses(proc)
    assert len(got) == len(expected), first_difference(got, expected) + describe(proc)
    assert got == pytest.approx(expected, rel=rel), first_difference(got, expected) + describe(proc)


def printed(proc: subprocess.CompletedProcess[str], key: str) -> Optional[str]:
    """The rest of the first stdout line that starts with ``key``."""
    for line in proc.stdout.splitlines():
        parts = line.split(maxsplit=1)
        if parts and parts[0] == key:
            return parts[1] if len(parts) > 1 else ""
    return None


def printed_hex(proc: subprocess.CompletedProcess[str], key: str) -> float:
    value = printed(proc, key)
    assert value is not None, f"no {key!r} line" + describe(proc)
    return float.fromhex(value.split()[0])


def assert_cuda_device(proc: subprocess.CompletedProcess[str]) -> None:
    """The framework chose CUDA (the shim made it look available)."""
    device = printed(proc, "device")
    assert device is not None and device.split(":")[0] == "cuda", describe(proc)


# -- what the framework logged, and the trained parameters (tests/frameworks/scripts/fwreport.py)

Logged = Dict[Tuple[str, int], float]
# a parameter's digest: (numel, sum, sum of |x|, sum of x*x), in float64 on the CPU after training
Digest = Tuple[int, float, float, float]

# Parameters whose gradient is zero in exact arithmetic, trained by float32 rounding noise alone,
# which Adam(W) normalises into steps of about +-lr with the noise's signs: attention's key biases
# (a bias added to every key adds one number to all of a query's scores, and softmax cancels it;
# GPT-2's c_attn.bias holds the query, key and value biases in one tensor). Their trained values
# are noise on any device: on the emulator, where a few attention sums round differently, BERT's
# key biases lay 23% apart (their sum against their sum of |x|), GPT-2's c_attn.bias 1.1e-5,
# diffusers' to_k biases (and their EMA) 1.9e-5, while every other parameter of the eight
# scripts lay within 4.2e-7; on the real wheel 23%, 9.9e-5 and 1.7e-5 against 6.6e-5. Compared
# within a tolerance, they are left out (their digests must still be there, finite); bit for
# bit, they are compared too.
NOISE_PARAMS = ("attention.self.key.bias", "attn.c_attn.bias", "to_k.bias")
# What an element of a parameter may differ by besides its relative tolerance: parameters that
# training leaves at about 0 (two of YOLOv8n's BatchNorm biases, model.22.cv2.2.*.bn.bias, are
# ~1e-14 an element after the epoch, moved by noise-sized gradients) differ relatively by
# whatever the noise is (2.2e-3 on the real wheel), yet are the same number next to a real update
# (AdamW moves an element by about its learning rate: 1e-3 or more here).
PARAM_ABS = 1e-9


def logged(proc: subprocess.CompletedProcess[str],
           keys: Optional[Sequence[str]] = None) -> Logged:
    """``{(key, step): value}`` from the ``logged <key> <step> <hex>`` lines (only ``keys``, if
    given), after checking that the run exited 0 and logged something, all of it finite."""
    assert proc.returncode == 0, describe(proc)
    out: Logged = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "logged" and (keys is None or parts[1] in keys):
            key = (parts[1], int(parts[2]))
            assert key not in out, f"{key} logged twice" + describe(proc)
            out[key] = float.fromhex(parts[3])
    assert out, f"nothing logged{'' if keys is None else f' for {keys}'}" + describe(proc)
    assert all(math.isfinite(v) for v in out.values()), describe(proc)
    return out


def params(proc: subprocess.CompletedProcess[str]) -> Dict[str, Digest]:
    """``{name: digest}`` from the ``param`` lines, after checking that the run exited 0 and
    printed some, all finite."""
    assert proc.returncode == 0, describe(proc)
    out: Dict[str, Digest] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "param":
            out[parts[1]] = (int(parts[2]), *(float.fromhex(p) for p in parts[3:]))
    assert out, "no parameters printed" + describe(proc)
    assert all(math.isfinite(v) for d in out.values() for v in d[1:]), describe(proc)
    return out


def _logged_differences(got: Logged, expected: Logged, rel: float, abs_: float) -> str:
    if got.keys() != expected.keys():
        return (f"logged other entries: only here {sorted(got.keys() - expected.keys())}, "
                f"only in the reference {sorted(expected.keys() - got.keys())}")
    bad = []
    for key, want in expected.items():
        have = got[key]
        if (have != want if rel == abs_ == 0
                else builtins.abs(have - want) > rel * builtins.abs(want) + abs_):
            bad.append(f"{key[0]} at step {key[1]}: got {have!r} ({have.hex()}), "
                       f"expected {want!r} ({want.hex()})")
    return "; ".join(bad[:8]) + (f" (and {len(bad) - 8} more)" if len(bad) > 8 else "")


def assert_close_logged(proc: subprocess.CompletedProcess[str],
                        reference: subprocess.CompletedProcess[str], rel: float = EMULATOR_REL,
                        abs: float = 0.0, keys: Optional[Sequence[str]] = None) -> None:
    """What the framework logged (``keys`` of it, if given) equals the reference run's: the same
    entries, each within ``rel`` of the reference's value plus ``abs``; ``rel=0`` (and
    ``abs=0``): bit for bit."""
    problem = _logged_differences(logged(proc, keys), logged(reference, keys), rel, abs)
    assert not problem, problem + describe(proc)


def assert_equal_logged(proc: subprocess.CompletedProcess[str],
                        reference: subprocess.CompletedProcess[str],
                        keys: Optional[Sequence[str]] = None) -> None:
    """Bit-identical logged values (the CPU target against a native CPU run)."""
    assert_close_logged(proc, reference, rel=0.0, keys=keys)


def _param_differences(got: Dict[str, Digest], expected: Dict[str, Digest], rel: float,
                       abs_: float, noise: Sequence[str]) -> str:
    if got.keys() != expected.keys():
        return (f"other parameters: only here {sorted(got.keys() - expected.keys())}, "
                f"only in the reference {sorted(expected.keys() - got.keys())}")
    bad = []
    for name, (n, s, a, q) in expected.items():
        gn, gs, ga, gq = got[name]
        if rel == abs_ == 0:
            ok = (gn, gs, ga, gq) == (n, s, a, q)
        elif name.endswith(tuple(noise)):
            ok = gn == n
        else:
            # every element x within d = rel |x| + abs of the reference's: the sums move by at
            # most sum(d), and the squares by sum(2 |x| d + d^2)
            ok = gn == n and builtins.abs(gs - s) <= rel * a + abs_ * n \
                and builtins.abs(ga - a) <= rel * a + abs_ * n \
                and builtins.abs(gq - q) <= (2 * rel + rel * rel) * q \
                + 2 * abs_ * (1 + rel) * a + n * abs_ * abs_
        if not ok:
            bad.append(f"{name}: got (numel, sum, sum|x|, sum x^2) {(gn, gs, ga, gq)}, "
                       f"expected {(n, s, a, q)}")
    return "; ".join(bad[:6]) + (f" (and {len(bad) - 6} more)" if len(bad) > 6 else "")


def assert_close_params(proc: subprocess.CompletedProcess[str],
                        reference: subprocess.CompletedProcess[str], rel: float,
                        abs: float = PARAM_ABS, noise: Sequence[str] = NOISE_PARAMS) -> None:
    """The trained parameters equal the reference run's, as far as their digests tell: the same
    names and sizes, and sums that fit every element being within ``rel`` of the reference's
    element plus ``abs`` (sum and sum of ``|x|`` within ``rel * sum|x| + abs * numel``, the sum
    of squares as far as that allows); ``rel=0`` (and ``abs=0``): bit for bit. Names ending in
    one of ``noise`` are compared by size only, unless bit for bit (NOISE_PARAMS)."""
    problem = _param_differences(params(proc), params(reference), rel, abs, noise)
    assert not problem, problem + describe(proc)


def assert_equal_params(proc: subprocess.CompletedProcess[str],
                        reference: subprocess.CompletedProcess[str]) -> None:
    """Bit-identical parameter digests (the CPU target against a native CPU run)."""
    assert_close_params(proc, reference, rel=0.0, abs=0.0)
