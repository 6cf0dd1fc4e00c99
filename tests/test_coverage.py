"""Every device-taking torch API is handled by a patch or deliberately ignored, with a reason.

The installed torch is enumerated from four sources, because none sees everything:

* ``inspect.signature`` (and ``typing.get_overloads``) for Python functions and classes;
* the signature lines of ``__doc__`` for C functions (``zeros(*size, *, ..., device=None)``);
* torch's native op schemas (``torch._C._jit_get_all_schemas()``: ``aten::to.device(...)``);
* torch's own type stubs (``torch/_C/*.pyi``), matched to the runtime objects by identity, for
  C bindings without a docstring or schema (``torch.is_autocast_enabled(device_type)``).

A new torch release that adds a device-taking API therefore makes ``test_device_api_handled``
fail with that API's name until it is patched or listed in dmlshim/coverage_exceptions.py.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

import pytest
import torch
import torch.fft
import torch.linalg
import torch.nested
import torch.nn.functional
import torch.random
import torch.sparse
import torch.special

import dmlshim
from dmlshim.coverage_exceptions import IGNORED, ROUTED
from dmlshim.patches import cuda_api
from dmlshim.patching import is_patched

DEVICE_PARAMS = frozenset({"device", "device_type", "devices", "map_location"})

NAMESPACES: Tuple[Tuple[str, Any], ...] = (
    ("torch", torch),
    ("torch.Tensor", torch.Tensor),
    ("torch.nn.Module", torch.nn.Module),
    ("torch.nn.functional", torch.nn.functional),
    ("torch.fft", torch.fft),
    ("torch.sparse", torch.sparse),
    ("torch.special", torch.special),
    ("torch.linalg", torch.linalg),
    ("torch.nested", torch.nested),
    ("torch.random", torch.random),
)
# aten op name prefix -> the Python namespace that exposes it without the prefix
SCHEMA_PREFIXES = (("fft_", "torch.fft"), ("linalg_", "torch.linalg"),
                   ("special_", "torch.special"), ("nested_", "torch.nested"),
                   ("sparse_", "torch.sparse"))


@dataclass
class DeviceAPI:
    qualname: str
    owner: Any
    name: str
    obj: Any
    params: Set[str] = field(default_factory=set)
    sources: Set[str] = field(default_factory=set)


# -- the four sources -------------------------------------------------------------------------

def _raw(owner: Any, name: str) -> Any:
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
    return getattr(owner, name)


def _signature_params(obj: Any) -> Set[str]:
    found: Set[str] = set()
    candidates = [obj]
    get_overloads = getattr(typing, "get_overloads", None)  # Python >= 3.11
    if get_overloads is not None:
        try:
            candidates += list(get_overloads(obj))
        except Exception:
            pass
    for cand in candidates:
        try:
            found |= set(inspect.signature(cand).parameters)
        except (TypeError, ValueError):
            pass
    return found


def _balanced(text: str, open_at: int) -> str:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
    return text[open_at + 1:]


_PARAM_RE = re.compile(r"(?:^|[,(*\s])(\w+)\s*(?==|:|,|$)")


def _doc_params(name: str, obj: Any) -> Set[str]:
    """Parameter names on the signature lines of ``obj.__doc__`` (``name(...)`` at line start,
    also ``.. function:: name(...)`` overload lines)."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str):
        return set()
    found: Set[str] = set()
    pattern = re.compile(r"^[ \t]*(?:\.\.[ \t]+\w+::[ \t]*)?(?:torch\.(?:\w+\.)*|Tensor\.)?"
                         + re.escape(name) + r"(?=\()", re.M)
    for m in pattern.finditer(doc):
        found |= {p.group(1) for p in _PARAM_RE.finditer(_balanced(doc, m.end()))}
    return found


def _schema_params() -> Dict[str, Set[str]]:
    """Public aten op base name -> device parameter names over all its overloads."""
    out: Dict[str, Set[str]] = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        base = schema.name[len("aten::"):]
        params = {a.name for a in schema.arguments} & DEVICE_PARAMS
        if params and not base.startswith("_"):
            out.setdefault(base, set()).update(params)
    return out


def _stub_params() -> Dict[int, Tuple[Any, Set[str]]]:
    """id(runtime object) -> (object, parameter names) from torch/_C/*.pyi."""
    stub_dir = os.path.join(os.path.dirname(torch.__file__), "_C")
    out: Dict[int, Tuple[Any, Set[str]]] = {}

    def params(fn: ast.FunctionDef) -> Set[str]:
        a = fn.args
        return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}

    def add(obj: Any, names: Set[str]) -> None:
        entry = out.setdefault(id(obj), (obj, set()))
        entry[1].update(names)

    for fname in sorted(os.listdir(stub_dir)):
        if not fname.endswith(".pyi"):
            continue
        stem = fname[:-4]
        module = torch._C if stem == "__init__" else getattr(torch._C, stem, None)
        if module is None:
            continue
        with open(os.path.join(stub_dir, fname), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                obj = getattr(module, node.name, None)
                if obj is not None:
                    add(obj, params(node))
            elif isinstance(node, ast.ClassDef):
                cls = getattr(module, node.name, None)
                if not isinstance(cls, type):
                    continue
                for sub in node.body:
                    if not isinstance(sub, ast.FunctionDef):
                        continue
                    if sub.name in ("__init__", "__new__"):
                        add(cls, params(sub))
                    elif sub.name in vars(cls):
                        add(vars(cls)[sub.name], params(sub))
    return out


def enumerate_device_apis() -> Dict[str, DeviceAPI]:
    """Every public callable of :data:`NAMESPACES` with a device parameter, by qualified name.

    Must run before dmlshim is installed (it looks at torch's own objects).
    """
    assert not dmlshim.is_installed()
    stubs = _stub_params()
    found: Dict[str, DeviceAPI] = {}

    def hit(ns: str, owner: Any, name: str, obj: Any, params: Set[str], source: str) -> None:
        params = params & DEVICE_PARAMS
        if not params:
            return
        api = found.setdefault(f"{ns}.{name}", DeviceAPI(f"{ns}.{name}", owner, name, obj))
        api.params |= params
        api.sources.add(source)

    for ns, owner in NAMESPACES:
        for name in sorted(dir(owner)):
            if name.startswith("_"):
                continue
            try:
                obj = getattr(owner, name)
            except Exception:
                continue
            if inspect.ismodule(obj) or not callable(obj):
                continue
            hit(ns, owner, name, obj, _signature_params(obj), "signature")
            hit(ns, owner, name, obj, _doc_params(name, obj), "doc")
            raw = _raw(owner, name)
            for cand in (obj, raw):
                entry = stubs.get(id(cand))
                if entry is not None and entry[0] is cand:
                    hit(ns, owner, name, obj, entry[1], "stub")
    namespaces = dict(NAMESPACES)
    for base, params in _schema_params().items():
        candidates = [("torch", base), ("torch.Tensor", base)]
        candidates += [(ns, base[len(p):]) for p, ns in SCHEMA_PREFIXES if base.startswith(p)]
        for ns, name in candidates:
            owner = namespaces[ns]
            if name and not name.startswith("_") and hasattr(owner, name):
                hit(ns, owner, name, getattr(owner, name), params, "schema")
    return found


DEVICE_APIS = enumerate_device_apis()


# -- the checks -------------------------------------------------------------------------------

def _resolve(dotted: str) -> Tuple[Any, str]:
    """"torch.amp.grad_scaler.GradScaler.__init__" -> (GradScaler, "__init__")."""
    parts = dotted.split(".")
    obj: Any = __import__(parts[0])
    for i, part in enumerate(parts[1:-1], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = __import__(".".join(parts[: i + 1]), fromlist=["_"])
    return obj, parts[-1]


def handled_by(api: DeviceAPI) -> List[str]:
    """How an installed dmlshim handles ``api`` (empty: it does not)."""
    how = []
    if is_patched(api.owner, api.name):
        how.append(f"{api.qualname} is wrapped")
    if inspect.isclass(api.obj):
        for ctor in ("__init__", "__new__"):
            if ctor in vars(api.obj) and is_patched(api.obj, ctor):
                how.append(f"{api.obj.__qualname__}.{ctor} is wrapped")
    if api.qualname in ROUTED:
        owner, name = _resolve(ROUTED[api.qualname])
        if is_patched(owner, name):
            how.append(f"routed through {ROUTED[api.qualname]}")
    return how


@pytest.fixture(scope="module")
def installed():
    dmlshim.install(device="cpu")
    try:
        yield
    finally:
        dmlshim.uninstall()


@pytest.mark.parametrize("qualname", sorted(DEVICE_APIS))
def test_device_api_handled(installed, qualname):
    api = DEVICE_APIS[qualname]
    how = handled_by(api)
    reason = IGNORED.get(qualname, "")
    assert how or reason, (
        f"{qualname} takes {sorted(api.params)} (found by: {', '.join(sorted(api.sources))}) but "
        f"no installed patch wraps it: patch it (device arguments: dmlshim/patches/devices.py) "
        f"or add it to dmlshim/coverage_exceptions.py IGNORED with the reason a CUDA script "
        f"needs nothing there")
    assert not (how and reason), (
        f"{qualname} is handled ({'; '.join(how)}) but still listed in "
        f"dmlshim/coverage_exceptions.py IGNORED: remove the entry")


def test_enumeration_sees_through_every_source():
    # Anchors, one per way of finding a device parameter; if torch changes how it exposes
    # signatures, this fails instead of the enumeration silently shrinking.
    expect = {
        "torch.zeros": "doc",                     # C function with a signature docstring
        "torch.Tensor.to": "schema",              # aten::to.device(...)
        "torch.nn.Module.to": "signature",        # typing.overload'ed Python method / its doc
        "torch.load": "signature",                # map_location
        "torch.fft.fftfreq": "schema",            # aten::fft_fftfreq -> torch.fft
        "torch.is_autocast_enabled": "stub",      # C binding with neither doc nor schema
        "torch.random.fork_rng": "signature",     # device_type / devices
    }
    if not hasattr(typing, "get_overloads"):  # Python < 3.11: Module.to found through its doc
        expect["torch.nn.Module.to"] = "doc"
    for qualname, source in expect.items():
        assert qualname in DEVICE_APIS, f"enumeration no longer finds {qualname}"
        assert source in DEVICE_APIS[qualname].sources, (qualname, DEVICE_APIS[qualname].sources)
    assert len(DEVICE_APIS) >= 60, sorted(DEVICE_APIS)
    every_factory = {"torch." + n for n in ("empty", "ones", "rand", "randn", "randint",
                                            "full", "arange", "tensor", "as_tensor", "eye")}
    assert every_factory <= set(DEVICE_APIS)


def test_enumeration_ignores_apis_without_device_parameter():
    for qualname in ("torch.add", "torch.Tensor.add", "torch.nn.functional.linear",
                     "torch.nn.Module.forward", "torch.linalg.svd"):
        assert qualname not in DEVICE_APIS


def test_ignore_list_entries_have_reasons():
    for qualname, reason in IGNORED.items():
        assert qualname.startswith("torch."), qualname
        assert len(reason) >= 30 and reason[0].isalpha(), (qualname, reason)
    for qualname, entry in ROUTED.items():
        assert qualname not in IGNORED, qualname
        _resolve(entry)  # must name something that exists


def test_handled_check_sees_a_real_patch(installed):
    # is_patched is what the main test relies on: yes for wrapped entry points, no for others.
    assert handled_by(DEVICE_APIS["torch.zeros"])
    assert handled_by(DEVICE_APIS["torch.Tensor.to"])
    assert handled_by(DEVICE_APIS["torch.nn.Module.to"])
    assert not handled_by(DEVICE_APIS["torch.Tensor.xpu"])


# -- torch.cuda ---------------------------------------------------------------------------------

def cuda_tables() -> Dict[str, Set[str]]:
    emulated = set(cuda_api.EMULATED) | set(cuda_api.EMULATED_CLASSES)
    emulated |= set(getattr(cuda_api, "LEGACY_TENSOR_TYPES", {}))
    return {"emulated": emulated, "unsupported": set(cuda_api.UNSUPPORTED),
            "accepted": set(cuda_api.ACCEPTED)}


def test_every_torch_cuda_name_in_exactly_one_table():
    names = set(getattr(torch.cuda, "__all__", ())) | cuda_api.public_names()
    assert len(names) > 50
    tables = cuda_tables()
    problems = []
    for name in sorted(names):
        where = [t for t, members in tables.items() if name in members]
        if len(where) != 1:
            problems.append(f"torch.cuda.{name}: in {where or 'no table'}")
    assert not problems, ("every torch.cuda public name must be in exactly one of "
                          "EMULATED/UNSUPPORTED/ACCEPTED of dmlshim/patches/cuda_api.py:\n  "
                          + "\n  ".join(problems))


def test_cuda_tables_are_what_gets_installed(installed):
    tables = cuda_tables()
    for name in sorted(tables["emulated"] | tables["unsupported"]):
        if hasattr(torch.cuda, name):  # tables may name what only other torch versions have
            assert is_patched(torch.cuda, name), f"torch.cuda.{name} is in a table but not patched"
    for name in sorted(tables["accepted"]):
        assert not is_patched(torch.cuda, name), f"torch.cuda.{name} is ACCEPTED but patched"
