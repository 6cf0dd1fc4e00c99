"""Every torch.cuda / torch.accelerator callable dmlshim emulates takes exactly torch's signature.

Scripts call these with keyword arguments (timm's PrefetchLoader: ``torch.cuda.stream(stream=s)``),
so a renamed parameter, a missing default or a lost ``/`` or ``*`` marker breaks them only
under the shim. Annotations are not compared (they differ in spelling between torch releases);
names, kinds and defaults are.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import torch

from dmlshim import patching
from dmlshim.patches import cuda_api


def shape(obj: Any) -> List[Tuple[str, str, str]]:
    """(name, kind, repr of default) of each parameter; ``self``/``cls`` dropped."""
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    return [(p.name, p.kind.name, "<required>" if p.default is p.empty else repr(p.default))
            for p in params]


def method_shape(obj: Any) -> List[Tuple[str, str, str]]:
    out = shape(obj)
    return out[1:] if out and out[0][0] in ("self", "cls", "obj") else out


def original(owner: Any, name: str) -> Any:
    return patching.get_original(owner, name)


def has_signature(obj: Any) -> bool:
    try:
        inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return True


def cuda_functions():
    return sorted(n for n in cuda_api.EMULATED if hasattr(torch.cuda, n))


@pytest.mark.parametrize("name", cuda_functions())
def test_emulated_torch_cuda_function_signature(name):
    torch_fn = original(torch.cuda, name)
    assert shape(cuda_api.EMULATED[name]) == shape(torch_fn), \
        f"torch.cuda.{name}: dmlshim {inspect.signature(cuda_api.EMULATED[name])} vs " \
        f"torch {inspect.signature(torch_fn)}"


def _methods(cls: type) -> List[str]:
    names = [n for n in dir(cls) if not n.startswith("_")]
    names += [n for n in ("__enter__", "__exit__") if hasattr(cls, n)]
    return sorted(n for n in names if callable(getattr(cls, n, None)))


@pytest.mark.parametrize("name", sorted(n for n in cuda_api.EMULATED_CLASSES if hasattr(torch.cuda, n)))
def test_emulated_torch_cuda_class_signatures(name):
    torch_cls, ours = original(torch.cuda, name), cuda_api.EMULATED_CLASSES[name]
    assert shape(ours) == shape(torch_cls), \
        f"torch.cuda.{name}(): dmlshim {inspect.signature(ours)} vs torch {inspect.signature(torch_cls)}"
    for meth in _methods(torch_cls):
        assert hasattr(ours, meth), f"torch.cuda.{name}.{meth} is missing in dmlshim's {name}"
        theirs = getattr(torch_cls, meth)
        if not has_signature(theirs):
            continue  # a C method without text signature: presence is what can be checked
        assert method_shape(getattr(ours, meth)) == method_shape(theirs), \
            f"torch.cuda.{name}.{meth}: dmlshim {inspect.signature(getattr(ours, meth))} vs " \
            f"torch {inspect.signature(theirs)}"


def unsupported_callables():
    return sorted(n for n in cuda_api.UNSUPPORTED if callable(getattr(torch.cuda, n, None))
                  and has_signature(getattr(torch.cuda, n)))


@pytest.mark.parametrize("name", unsupported_callables())
def test_unsupported_names_check_torch_signature(shim, name):
    sig = inspect.signature(original(torch.cuda, name))
    shim(device="cpu")
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        with pytest.raises(TypeError):
            getattr(torch.cuda, name)(_not_a_parameter_of_torch=1)
    needed = [p for p in sig.parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                     p.KEYWORD_ONLY)]
    with pytest.raises(cuda_api.UnsupportedCudaAPI if not needed else TypeError):
        getattr(torch.cuda, name)()


def accelerator_functions():
    acc = getattr(torch, "accelerator", None)
    out = []
    for name in sorted(cuda_api.ACCELERATOR):
        if acc is not None and hasattr(acc, name):
            out.append(("", name))
    for name in sorted(cuda_api.ACCELERATOR_MEMORY):
        if acc is not None and hasattr(getattr(acc, "memory", None), name):
            out.append(("memory", name))
    return out


if accelerator_functions():
    @pytest.mark.parametrize("sub,name", accelerator_functions())
    def test_emulated_torch_accelerator_signature(sub, name):
        owner = torch.accelerator if not sub else torch.accelerator.memory
        table = cuda_api.ACCELERATOR if not sub else cuda_api.ACCELERATOR_MEMORY
        torch_fn = original(owner, name)
        assert shape(table[name]) == shape(torch_fn), \
            f"torch.accelerator.{sub + '.' if sub else ''}{name}: dmlshim " \
            f"{inspect.signature(table[name])} vs torch {inspect.signature(torch_fn)}"
else:
    def test_stand_in_torch_accelerator_has_torch_2_13s_signatures(shim):
        # torch < 2.6: the shim's stand-in module against torch 2.13's recorded parameters
        reference = json.loads((Path(__file__).parent / "data" / "accelerator_reference.json")
                               .read_text(encoding="utf-8"))["signatures"]
        shim(device="cpu")
        for key, params in reference.items():
            sub, _, name = key.rpartition(".")
            owner = torch.accelerator.memory if sub else torch.accelerator
            got = [f"{n} {k}" + ("" if d == "<required>" else f"={d}") for n, k, d in shape(getattr(owner, name))]
            if isinstance(getattr(owner, name), type):
                got = got[1:] if got and got[0].startswith("self ") else got
            assert got == params, f"torch.accelerator.{key}: dmlshim {got} vs torch 2.13 {params}"


def test_keyword_calls_from_real_scripts(shim):
    """The calls that broke (timm's PrefetchLoader) and their neighbours, by keyword, through the shim."""
    shim(device="cpu")
    s = torch.cuda.Stream(device=None, priority=0)
    with torch.cuda.stream(stream=s):
        assert torch.cuda.current_stream(device=None) == s
    with torch.cuda.StreamContext(stream=s):
        assert torch.cuda.current_stream() == s
    torch.cuda.set_stream(stream=s)
    assert torch.cuda.current_stream() == s
    torch.cuda.set_stream(stream=torch.cuda.default_stream())
    ev = s.record_event(event=None)
    s.wait_event(event=ev)
    s.wait_stream(stream=torch.cuda.current_stream())
    ev.record(stream=s)
    ev.wait(stream=s)
    assert ev.elapsed_time if ev.query() else False
    torch.cuda.synchronize(device=0)
    assert torch.cuda.get_device_properties(device=0).total_memory > 0
    assert torch.cuda.memory_allocated(device=0) >= 0
    torch.cuda.set_per_process_memory_fraction(fraction=0.5, device=0)
    torch.cuda.set_sync_debug_mode(debug_mode=0)
    assert torch.cuda.can_device_access_peer(device=0, peer_device=0) is False
    model = torch.nn.Linear(2, 2)
    assert torch.cuda.make_graphed_callables(model, (torch.ones(1, 2),), num_warmup_iters=1,
                                             allow_unused_input=True, pool=None) is model
    with pytest.raises(TypeError):
        torch.cuda.stream(s=s)  # the old dmlshim name is not torch's
