"""Every dmlshim option, in one table: CLI flag, environment variable, default, valid values.

Nothing else in the package reads ``DMLSHIM_*`` variables for options: the session holds the
options in force (``api.Shim.config``). A bad value raises :class:`ConfigError`, which
the entry points turn into one line on stderr and exit status 2 (:func:`exit_on_error`).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Dict, Mapping, NoReturn, Optional, Tuple

from dmlshared import emulator_switches as _switches

ENV_PREFIX = "DMLSHIM_"

# Emulator fidelity switches (see emulated_dml). The gaps are on by default (under "all");
# the bugs are opt-in (bug-bn-stats: 0.2.5 does not have it); the aliases, the old names of
# nll-none-backward and mul-bool (opt-in bugs once), are still accepted but not listed as valid
# values (--help, the error line). One table with the emulator: dmlshared.emulator_switches
# (it imports nothing, and this module is read before torch is imported).
EMULATOR_GAPS: Tuple[str, ...] = _switches.GAPS
EMULATOR_BUGS: Tuple[str, ...] = _switches.BUGS
EMULATOR_ALIASES: Tuple[str, ...] = tuple(_switches.ALIASES)


class OptimizerPolicy(str, Enum):
    """``DMLSHIM_OPTIMIZER`` values (a str enum: equal to the option's text)."""

    REBIND = "rebind"
    RESET = "reset"
    OFF = "off"


class Float64Policy(str, Enum):
    """``DMLSHIM_FLOAT64`` values."""

    AUTO = "auto"
    KEEP = "keep"
    FLOAT32 = "float32"


class Bf16Policy(str, Enum):
    """``DMLSHIM_BF16`` values."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    ERROR = "error"


class ConfigError(ValueError):
    """A bad option value. ``str(err)`` is the one line shown to the user."""

    def __init__(self, env: str, value: str, valid: str) -> None:
        self.env, self.value, self.valid = env, value, valid
        super().__init__(f"dmlshim: invalid {env}={value!r}; valid values: {valid}")


@dataclass(frozen=True)
class Option:
    name: str  # attribute name on Config, e.g. "device"
    default: str
    valid: str  # human-readable list of valid values, shown in errors and --help
    help: str
    check: Callable[[str], bool]
    normalize: Callable[[str], str] = staticmethod(lambda v: v.strip().lower())  # type: ignore[assignment]
    flag_takes_value: bool = True

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, raw: str) -> str:
        value = self.normalize(raw)
        if not self.check(value):
            raise ConfigError(self.env, raw, self.valid)
        return value


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda v: v in choices


_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|dml(:\d+)?|emulated-dml(:[1-9]\d*)?)$")
# torch keeps a device index in 8 signed bits (torch.device("cuda:150").index == -106): adapter
# indices stay below 128, so dml:N names N <= 127 and emulated-dml:N counts N <= 127 adapters.
MAX_DEVICE_INDEX = 127


def _device(value: str) -> bool:
    if not _DEVICE_RE.match(value):
        return False
    _, _, number = value.partition(":")
    return not number or int(number) <= MAX_DEVICE_INDEX


def _gap_list(value: str) -> bool:
    if value in ("all", "none", ""):
        return True
    return all(part in EMULATOR_GAPS + EMULATOR_BUGS + EMULATOR_ALIASES + ("all",)
               for part in value.split(","))


def _keep(value: str) -> str:
    return value.strip()


OPTIONS: Tuple[Option, ...] = (
    Option(
        "device", "auto",
        "auto, dml, dml:N (N <= 127), cpu, cuda, emulated-dml, emulated-dml:N (1 <= N <= 127 "
        "adapters)",
        "where CUDA work goes: auto picks DirectML, else stays inert on real CUDA, else the CPU",
        _device,
    ),
    # exactly 0 or 1, like every option's documented values: `yes`/`true` would be a guess at
    # what the user meant (the bootstrap reads "1" the same way)
    Option("disable", "0", "0, 1", "1 makes `import dmlshim` and the runner do nothing",
           _one_of("0", "1")),
    Option("log", "warning", "warning, info, debug",
           "log level of the 'dmlshim' logger; info logs every redirected call site once",
           _one_of("warning", "info", "debug")),
    Option("optimizer", "rebind", "rebind, reset, off",
           "keep optimizers bound to live parameters after conversions (rebind), clear their "
           "state at each epoch boundary (reset), or do nothing (off)",
           _one_of("rebind", "reset", "off")),
    Option("amp", "off", "off, fp16",
           "autocast regions run in float32 (off) or float16 where the target supports it",
           _one_of("off", "fp16")),
    Option("float64", "auto", "auto, keep, float32",
           "on adapters without float64, downcast double tensors to float32 as they enter the "
           "device (auto, float32) or keep them (and fail)",
           _one_of("auto", "keep", "float32")),
    Option("bf16", "float32", "float32, float16, error",
           "bfloat16 tensors bound for a DirectML device (which has none) become float32 or "
           "float16, or raise an error naming the call site",
           _one_of("float32", "float16", "error")),
    Option("decompose", "on", "on, off",
           "compute ops that torch-directml runs on the CPU from ops it supports",
           _one_of("on", "off")),
    Option("guards", "on", "on, off",
           "work around torch-directml 0.2.5's known wrong results and failures (on DirectML, "
           "real or emulated)",
           _one_of("on", "off")),
    Option("emulator_gaps", "all",
           "all, none, or a comma list of all, " + ", ".join(EMULATOR_GAPS + EMULATOR_BUGS),
           "which torch-directml gaps the emulated-dml device reproduces (bugs are opt-in)",
           _gap_list, normalize=lambda v: v.strip().lower().replace(" ", "")),
    Option("emulator_memory", "", "a whole number of MiB >= 1 (empty: unlimited)",
           "live bytes each emulated-dml adapter may hold; past it the emulator raises "
           "torch-directml's out-of-memory error",
           lambda v: v == "" or (v.isdigit() and int(v) >= 1)),
    Option("report", "", "a file path (empty: no report)",
           "write a JSON report of what the shim did to this path at exit",
           lambda v: True, normalize=_keep),
    Option("check", "off", "off, or N (a positive integer: optimizer steps to shadow)",
           "run every device op of the first N optimizer steps on the CPU too and report the "
           "first ops whose results differ (slow while it lasts; nothing stays installed after)",
           lambda v: v == "off" or (v.isdigit() and int(v) >= 1)),
)



@dataclass(frozen=True)
class Internal:
    """A variable dmlshim sets for its own processes; not an option (no flag, never validated
    by :func:`load`, not in ``--help``). Listed here so every ``DMLSHIM_*`` name has one home."""

    name: str
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


INTERNAL: Tuple[Internal, ...] = (
    Internal("bootstrap", "set by the runner and by a shimmed process for its children: turns "
             "on dmlshim/bootstrap and records the variables to give back to the script "
             "(dmlshim/childenv.py)"),
    Internal("wrap_ordinals", '"1" in children of torch.multiprocessing.spawn/start_processes'),
    Internal("probe_cache", "JSON of a finished DirectML probe, for children (target.py)"),
    Internal("report_owner", '"<pid>:<absolute report path>" of the report\'s owner'),
    Internal("dxg_path", "test only: the path standing for WSL's /dev/dxg in the cheap DirectML "
             "check (a missing one arranges \"no adapter\" on any machine; target.py)"),
    Internal("runner_as_child", 'test only: "1" makes the runner start the interpreter as a '
             "child, as it does on Windows, instead of replacing itself"),
)
INTERNAL_BY_NAME: Dict[str, Internal] = {v.name: v for v in INTERNAL}

OPTIONS_BY_NAME: Dict[str, Option] = {o.name: o for o in OPTIONS}
OPTIONS_BY_FLAG: Dict[str, Option] = {o.flag: o for o in OPTIONS}


@dataclass(frozen=True)
class Config:
    values: Mapping[str, str]
    sources: Mapping[str, str] = field(default_factory=dict)  # name -> default|env|cli|install()

    def __getattr__(self, name: str) -> str:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def disabled(self) -> bool:
        return self.values["disable"] == "1"

    def emulator_switches(self) -> Tuple[str, ...]:
        """The emulator gaps and bugs switched on, expanded from ``all``/``none``."""
        raw = self.values["emulator_gaps"]
        if raw in ("none", ""):
            return ()
        out: list = []
        for part in (p for p in raw.split(",") if p):
            out.extend(EMULATOR_GAPS if part == "all" else (part,))  # "all,bug-bn-stats" works
        return tuple(dict.fromkeys(out))

    def as_env(self) -> Dict[str, str]:
        """Environment variables that reproduce this config in a child process."""
        return {OPTIONS_BY_NAME[n].env: v for n, v in self.values.items()}


def load(overrides: Optional[Mapping[str, object]] = None, source: str = "cli",
         environ: Optional[Mapping[str, str]] = None) -> Config:
    """Options from defaults, then the environment, then ``overrides`` (CLI or install())."""
    environ = os.environ if environ is None else environ
    values: Dict[str, str] = {}
    sources: Dict[str, str] = {}
    for opt in OPTIONS:
        values[opt.name], sources[opt.name] = opt.default, "default"
        raw = environ.get(opt.env)
        if raw is not None and raw != "":
            values[opt.name], sources[opt.name] = opt.parse(raw), "env"
    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        opt = OPTIONS_BY_NAME.get(name)
        if opt is None:
            valid = ", ".join(o.name for o in OPTIONS)
            raise TypeError(f"dmlshim: unknown option {name!r}; options are: {valid}")
        if isinstance(raw, bool):
            raw = "1" if raw else "0"
        values[name], sources[name] = opt.parse(str(raw)), source
    return Config(values, sources)


def exit_on_error(err: ConfigError) -> NoReturn:
    print(str(err), file=sys.stderr)
    raise SystemExit(2)


def help_text() -> str:
    lines = ["options (CLI flag / environment variable, default):"]
    for opt in OPTIONS:
        lines.append(f"  {opt.flag} / {opt.env} (default: {opt.default or '-'})")
        lines.append(f"      {opt.help}; valid: {opt.valid}")
    return "\n".join(lines)
