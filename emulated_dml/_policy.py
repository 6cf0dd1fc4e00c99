"""Per-operator plan: how an operator that reaches an emulated tensor is executed.

The plan models PyTorch's dispatcher with torch-directml 0.2.5 loaded, for the operator as
it reaches ``__torch_dispatch__`` (after CompositeImplicitAutograd decompositions and autograd,
before CompositeExplicitAutograd ones):

NATIVE     torch-directml 0.2.5 has a PrivateUse1 kernel for it (or for its out= variant, for
           structured ops), or it is a view, or a composite known to decompose only into such
           ops (SAFE_COMPOSITES, run in one go because it is cheaper). Runs on the CPU elems.
DECOMPOSE  no torch-directml kernel but a composite kernel in PyTorch (CompositeExplicitAutograd,
           its NonFunctional variant, or CompositeImplicitAutograd when called below autograd): redispatched to PrivateUse1 so PyTorch's composite runs and its pieces come
           back through the emulator (this is how ``_foreach_lerp_`` ends in the
           ``lerp.Scalar_out`` fallback, exactly as on torch-directml 0.2.5 with torch 2.4).
FALLBACK   neither: torch-directml's boxed CPU fallback. Counted and warned under
           ``fallback_name`` when the ``fallback`` switch is on, then run on the CPU.

A kernel registered for PrivateUse1 through ``torch.library`` (dmlshim's decompositions, or
``register_device_kernel``) takes precedence over all three, as it would on real DirectML.

Checked against the real thing: with torch-directml 0.2.5 imported on torch 2.4.1, the
PrivateUse1 entry of ``torch._C._dispatch_dump_table`` of every aten operator (3127) agrees
with these plans -- "backend fallback" exactly where the plan says FALLBACK, except that a
structured functional/in-place op is reported under its out= name here, where PyTorch's
composite would reach that out= op and fall back under the same name.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from emulated_dml._dml_ops import DML_KERNELS_0_2_5

NATIVE, DECOMPOSE, FALLBACK = "native", "decompose", "fallback"

# Composites whose decomposition on PrivateUse1 only reaches torch-directml kernels (empty,
# copy_, fill_, zero_, random ops, convolution_overrideable): running them in one go gives
# the same result and the same (absent) fallbacks, with one Python round trip instead of 2-4.
SAFE_COMPOSITES = frozenset(
    """
    aten::clone aten::empty_like aten::zeros_like aten::full_like aten::rand_like aten::randn_like
    aten::new_empty aten::new_empty_strided aten::new_zeros aten::new_ones aten::new_full
    aten::copy aten::lift_fresh aten::convolution aten::_convolution aten::convolution_backward
    aten::detach aten::fill_.Tensor aten::zero_ aten::sum aten::mean aten::_unsafe_view
    aten::contiguous aten::randint_like aten::bernoulli_.float aten::bernoulli
    """.split()
)

# In-place ops that change the metadata (sizes, strides, offset) of their argument; after
# them the wrapper's metadata is re-synchronised from the CPU elem.
METADATA_INPLACE = frozenset(
    """
    aten::resize_ aten::resize_as_ aten::as_strided_ aten::set_.source_Tensor aten::set_
    aten::set_.source_Storage aten::set_.source_Storage_storage_offset aten::squeeze_
    aten::squeeze_.dim aten::squeeze_.dims aten::unsqueeze_ aten::t_ aten::transpose_
    aten::swapdims_ aten::swapaxes_ aten::_resize_output_
    """.split()
)

# Ops whose arguments may legitimately live on the CPU next to device tensors (as on CUDA).
MIXED_DEVICE_OK = frozenset(
    """
    aten::copy_ aten::_copy_from aten::_copy_from_and_resize aten::_to_copy aten::index.Tensor
    aten::index.Tensor_out aten::index_put_ aten::index_put aten::_index_put_impl_ aten::set_
    aten::set_.source_Tensor aten::lift_fresh aten::_has_compatible_shallow_copy_type
    """.split()
)

# out= overloads the wheel aborts the process on when called from Python, whoever calls them
# (gap "out-unsafe"; any other out= overload is refused only when a Python kernel registered for
# the device calls it, see _tensor.check_out_call).
DANGLING_OUT = frozenset({"aten::nll_loss_forward.output"})

# torch-directml's out= kernels neither resize nor check their output (gap "out-resize"): an
# empty or wrongly sized out= tensor comes back as it was, silently; these raise instead (the
# shape check of the kernel's broadcasting copy). Those that PyTorch's own composites call
# with an empty output (torch.arange, logical_not, ...: functional forms that are
# CompositeExplicitAutograd over the out= op) must size it themselves, or nothing would work on
# the wheel: so do these, whose sizes depend on the data.
OUT_RAISES = frozenset({"aten::native_layer_norm_backward.out"})
OUT_SIZES_ITSELF = frozenset(
    """
    aten::arange.start_out aten::empty.out aten::nonzero.out aten::masked_select.out
    aten::_unique2.out aten::linspace.out aten::randperm.generator_out
    """.split()
)

_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
# CompositeImplicitAutograd ops normally decompose above autograd, but reach the emulator when
# called below it (from inside other kernels: item, reshape, _has_compatible_shallow_copy_type).
_COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                   "CompositeImplicitAutograd")


class Plan:
    __slots__ = ("name", "kind", "fallback_name", "writes", "resizes", "mixed_ok", "impl_keys",
                 "special", "bug", "bug_flag", "cpu_impl", "has_device_kw", "tensor_args",
                 "strict_out", "out_call", "numbers_ok", "composite_calls_out")

    def __init__(self, name: str) -> None:
        self.name = name
        self.kind = NATIVE
        self.fallback_name: Optional[str] = None
        # For each return: None (a new tensor) or (position or None, name) of the argument it
        # aliases and writes (in-place and out= ops return the caller's tensor, not a new one).
        self.writes: Optional[Tuple[Optional[tuple], ...]] = None
        self.resizes = False
        # an out= kernel of the wheel that leaves a wrongly sized output as it was (or raises)
        self.strict_out = False
        self.mixed_ok = name in MIXED_DEVICE_OK
        # torch.library keys ("aten/lerp.Scalar/PrivateUse1") that, when registered, route
        # the op to a user kernel; checked per call with one set lookup.
        self.impl_keys: Tuple[str, ...] = ()
        self.special: Optional[Callable] = None
        self.bug: Optional[Callable] = None
        self.bug_flag = ""
        self.cpu_impl: Optional[Callable] = None
        self.has_device_kw = False
        # (positional indices, keyword names) of arguments typed Tensor: __torch_dispatch__
        # hands wrapped numbers (x * 2) over as Python scalars, which redispatch rejects.
        self.tensor_args: Tuple[Tuple[int, ...], Tuple[str, ...]] = ((), ())
        # an out= overload (gap "out-unsafe": a boxed call from Python is unsafe on the wheel)
        self.out_call = False
        # an out= overload PyTorch's own composite for its functional form calls (torch.arange):
        # C++ the emulator does not see enter (a factory composite has no device argument)
        self.composite_calls_out = False
        # whether a Python number may stand in a Tensor argument in a boxed call (the
        # dispatcher's list: mul, add, sub, div, ...); it then reaches a kernel as a number
        self.numbers_ok = False


def _impl_key(name: str) -> str:
    return "aten/" + name.split("::", 1)[1] + "/PrivateUse1"


def _is_out_arg(arg) -> bool:
    return arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write


def _out_variant(func: torch._ops.OpOverload) -> Optional[str]:
    """The out= overload a structured functional/in-place op routes through, if any."""
    name = func.name()
    if not _has_kernel(name, "CompositeExplicitAutogradNonFunctional"):
        return None
    schema = func._schema
    base = schema.name.split("::", 1)[1]
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    want = [(a.name, str(a.type)) for a in schema.arguments]
    for overload in packet.overloads():
        candidate = getattr(packet, overload)._schema
        rest = [(a.name, str(a.type)) for a in candidate.arguments if not _is_out_arg(a)]
        if len(rest) < len(candidate.arguments) and rest == want:
            out_name = "aten::" + base + ("." + overload if overload != "default" else "")
            # A structured op's out= variant is the real kernel (CPU has it); an autogenerated
            # out= variant (select_backward.out) is itself a composite over the functional.
            if _has_kernel(out_name, "CPU") and not _has_kernel(out_name,
                                                               "CompositeExplicitAutograd"):
                return out_name
            return None
    return None


def _composite_calls_out(func: torch._ops.OpOverload) -> bool:
    """Whether the functional sibling of out= op ``func`` is a composite that calls it with an
    output it allocated empty (at::empty({0}) + the out= op): then the kernel sizes it."""
    schema = func._schema
    packet = getattr(torch.ops.aten, schema.name.split("::", 1)[1], None)
    if packet is None:
        return False
    want = [(a.name, str(a.type)) for a in schema.arguments if not _is_out_arg(a)]
    for overload in packet.overloads():
        candidate = getattr(packet, overload)._schema
        if [(a.name, str(a.type)) for a in candidate.arguments] == want:
            name = "aten::" + candidate.name.split("::", 1)[1] + (
                "." + overload if overload != "default" else "")
            return (_has_kernel(name, "CompositeExplicitAutograd")
                    or _has_kernel(name, "CompositeImplicitAutograd"))
    return False


def _writes(func: torch._ops.OpOverload) -> Optional[Tuple[Optional[tuple], ...]]:
    schema = func._schema
    result = []
    any_write = False
    for ret in schema.returns:
        info = ret.alias_info
        if info is None or not info.is_write:
            result.append(None)
            continue
        target = None
        for i, arg in enumerate(schema.arguments):
            ainfo = arg.alias_info
            if ainfo is not None and ainfo.is_write and ainfo.before_set == info.before_set:
                target = (None if arg.kwarg_only else i, arg.name)
                break
        result.append(target)
        any_write = any_write or target is not None
    return tuple(result) if any_write else None


def _is_view(func: torch._ops.OpOverload) -> bool:
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return bool(schema.returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )


def build(func: torch._ops.OpOverload, specials: Dict[str, Callable],
          bugs: Dict[str, Tuple[str, Callable]], cpu_impls: Dict[str, Callable]) -> Plan:
    name = func.name()
    plan = Plan(name)
    plan.special = specials.get(name)
    if name in bugs:
        plan.bug_flag, plan.bug = bugs[name]
    plan.cpu_impl = cpu_impls.get(name)
    plan.writes = _writes(func)
    plan.resizes = any(_is_out_arg(a) for a in func._schema.arguments) or name in METADATA_INPLACE
    plan.has_device_kw = any(a.name == "device" for a in func._schema.arguments)
    arguments = func._schema.arguments
    plan.tensor_args = (
        tuple(i for i, a in enumerate(arguments) if not a.kwarg_only and str(a.type) == "Tensor"),
        tuple(a.name for a in arguments if a.kwarg_only and str(a.type) == "Tensor"),
    )
    plan.out_call = any(_is_out_arg(a) for a in arguments)
    plan.numbers_ok = torch._C._should_allow_numbers_as_tensors(
        name.split("::", 1)[1].split(".", 1)[0])
    keys = [_impl_key(name)]
    composite = any(_has_kernel(name, key) for key in _COMPOSITE_KEYS)
    if name in DML_KERNELS_0_2_5 or name in SAFE_COMPOSITES or (composite and _is_view(func)):
        # (a view with a composite kernel decomposes into views torch-directml has, such as
        # as_strided: running the view directly is the same, and cheaper)
        plan.kind = NATIVE
    else:
        out = _out_variant(func)
        if out is not None:
            keys.append(_impl_key(out))
            if out in DML_KERNELS_0_2_5:
                plan.kind = NATIVE
            else:
                plan.kind, plan.fallback_name = FALLBACK, out
        elif composite:
            plan.kind = DECOMPOSE
        else:
            plan.kind, plan.fallback_name = FALLBACK, name
    plan.impl_keys = tuple(keys)
    plan.composite_calls_out = plan.out_call and (name in OUT_SIZES_ITSELF
                                                  or _composite_calls_out(func))
    plan.strict_out = (plan.kind == NATIVE and name not in METADATA_INPLACE
                       and name not in OUT_SIZES_ITSELF
                       and any(_is_out_arg(a) for a in func._schema.arguments)
                       and not plan.composite_calls_out)
    return plan
