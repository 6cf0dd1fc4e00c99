"""Packaging beyond pyproject.toml: the startup hook's .pth file (_dmlshim_startup.py says why).

setuptools installs only packages and modules; a ``.pth`` file must be put at the root of the
wheel by hand, both for ``pip install .`` (build_py) and for ``pip install -e .`` (the editable
wheel, whose strategy writes its own ``.pth`` files: we add ours to what it writes).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_PTH = "dmlshim-startup.pth"
HERE = Path(__file__).resolve().parent


class BuildPyWithStartupHook(build_py):
    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            self.copy_file(str(HERE / STARTUP_PTH), str(Path(self.build_lib) / STARTUP_PTH))

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(str(Path(self.build_lib) / STARTUP_PTH))
        return outputs


cmdclass = {"build_py": BuildPyWithStartupHook}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: pip's legacy `setup.py develop` path has no hook
    editable_wheel = None

if editable_wheel is not None:
    class _StrategyWithStartupHook:
        """Wraps the editable strategy: writes what it writes, and the startup hook's .pth."""

        def __init__(self, strategy) -> None:
            self.strategy = strategy

        def __call__(self, wheel, files, mapping) -> None:
            self.strategy(wheel, files, mapping)
            wheel.writestr(STARTUP_PTH, (HERE / STARTUP_PTH).read_bytes())

        def __enter__(self):
            self.strategy.__enter__()
            return self

        def __exit__(self, *exc) -> None:
            self.strategy.__exit__(*exc)

    class EditableWheelWithStartupHook(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _StrategyWithStartupHook(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = EditableWheelWithStartupHook

setup(cmdclass=cmdclass)
