"""One record per guard: what torch-directml 0.2.5 gets wrong, where it was seen, how dmlshim
fixes it, what reproduces it in the emulator and which tests prove both sides.

Everything else about a guard is derived from its record:

* :mod:`dmlshim.patches.guards` installs what the records hold (kernels for their dispatch key,
  wrappers, the ``Tensor.to`` policy, the autograd setting) and declares the entry points it
  wraps; its log line names the issue;
* :mod:`dmlshim.capabilities` answers ``known_bugs()`` for real DirectML and for the emulator
  with its switches (:func:`on_real_directml`, :func:`on_the_emulator`);
* the tests take the lists they compare from here (the kernel table of the installed wheel,
  the notes a facts run makes), and :func:`markdown_table` renders the known-bugs table.

tests/test_guard_records.py checks that every reference resolves: each kernel's op exists in
torch's schema, each emulator switch in :mod:`dmlshared.emulator_switches`, each test node id in
its test file, each battery case in the real-wheel lane's list of faults the shim must fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from dmlshim.kernels.guards import (
    arithmetic,
    creation,
    indexing,
    losses,
    masking,
    norms,
    readback,
    reductions,
    shape,
    spatial,
)
from dmlshim.kernels.guards.passthrough import INPUT_FIX_KEY, REPLACEMENT_KEY

# -- where a behaviour was seen (every real-wheel run so far was on a software D3D12 adapter) ---
LINUX_WHEEL = "the real wheel on Linux"
WINDOWS_DLL = "the Windows DirectML.dll"
SOFTWARE_ADAPTER = "the software adapter (wrong numbers there may be its translation layer's)"
INFERRED = "not run by itself: it follows from a fact of the wheel (its out= kernels)"
OLDER_RELEASES = "reported for older releases; not reproduced by 0.2.5"
SEEN = (LINUX_WHEEL, WINDOWS_DLL, SOFTWARE_ADAPTER, INFERRED, OLDER_RELEASES)

# -- kinds -----------------------------------------------------------------------------------
INPUT_FIX = "input fix above autograd"  # the wheel's own kernel runs behind it
REPLACEMENT = "replacement on PrivateUse1"  # below autograd: torch's derivative stays
POLICY = "policy of Tensor.to"
AUTOGRAD_SETTING = "autograd setting"
WRAPPER = "wrapper of a Python entry point"
KINDS = (INPUT_FIX, REPLACEMENT, POLICY, AUTOGRAD_SETTING, WRAPPER)
KEY_OF_KIND = {INPUT_FIX: INPUT_FIX_KEY, REPLACEMENT: REPLACEMENT_KEY}

NOT_REPORTED = "not reported"

# -- the tests that prove the guards (pytest node ids) ----------------------------------------
_FACTS = "tests/test_dml_facts.py::test_guards_give_the_cpu_result[{}]"
_ADAPTER_FACTS = ("tests/test_dml_facts.py::"
                  "test_guards_give_the_cpu_result_with_the_software_adapters_bugs[{}]")
BATTERY = "tests/test_real_wheel.py::test_op_battery_under_the_shim_is_no_worse_than_the_wheel"
_YOLO = "tests/frameworks/test_fw_users_path.py::test_ultralytics_yolo"
_ZOO_FP32 = "tests/test_users_path_zoo.py::test_zoo_model_trains_in_fp32_on_the_adapter[{}]"
_ZOO_FP16 = "tests/test_users_path_zoo.py::test_zoo_model_trains_under_amp_fp16_on_the_adapter[{}]"


def _facts(*names: str) -> Tuple[str, ...]:
    return tuple(_FACTS.format(n) for n in names)


@dataclass(frozen=True)
class Wrap:
    """An attribute the guard wraps (``owner`` dotted, as :class:`dmlshim.patching.Owns` takes
    it); ``factory(device_type)`` makes the wrapt wrapper."""

    owner: str
    name: str
    factory: Callable[[str], Callable[..., Any]]


@dataclass(frozen=True)
class Policy:
    """A policy of ``Tensor.to`` (``dmlshim.conversions.add_policy(name, ...)``);
    ``factory(device_type)`` makes it."""

    name: str
    factory: Callable[[str], Callable[[Any], bool]]


@dataclass(frozen=True)
class Guard:
    name: str  # DMLSHIM's name: the log line "guard NAME on (...)"; the events are `notes`
    wheel_does: str  # what torch-directml 0.2.5 does
    issue: str  # "microsoft/DirectML#N" or NOT_REPORTED
    seen: Tuple[str, ...]  # of SEEN
    kinds: Tuple[str, ...]  # of KINDS
    fix: str  # what dmlshim does instead, in one sentence
    fact_tests: Tuple[str, ...]  # node ids: the guard gives the CPU's result against the fact
    kernels: Mapping[str, Callable[..., Any]] = field(default_factory=dict)  # aten overload
    wraps: Tuple[Wrap, ...] = ()
    policy: Optional[Policy] = None
    setting: Optional[Callable[[], Callable[[], None]]] = None  # turns it on, returns the undo
    # the events it notes ("guard.x": the exit summary's "guards applied"); none for a guard
    # every call would take
    notes: Tuple[str, ...] = ()
    emulator: Tuple[str, ...] = ()  # the switches that reproduce it (the first: the main one)
    no_emulator: str = ""  # why no switch can
    # the fix is right only where the bug is (or would only cost time elsewhere): on the
    # emulator the guard is on only with its first switch
    only_where_the_bug_is: bool = False
    on_real_wheel: bool = True  # 0.2.5 has the bug (else the guard is the emulator's only)
    real_lane_test: str = ""  # node id of the real-wheel lane's test that proves it there
    battery: Tuple[str, ...] = ()  # with BATTERY: the op battery's cases that show it
    no_real_lane_test: str = ""  # why there is none

    @property
    def key(self) -> Optional[str]:
        """The dispatch key its kernels are registered for (None: it has none)."""
        keys = [KEY_OF_KIND[k] for k in self.kinds if k in KEY_OF_KIND]
        return keys[0] if keys else None

    @property
    def source(self) -> str:
        """What the log line says it comes from: the issue, else where it was seen."""
        if self.issue != NOT_REPORTED:
            return self.issue
        return "software adapter" if SOFTWARE_ADAPTER in self.seen else NOT_REPORTED


GUARDS: Tuple[Guard, ...] = (
    Guard("eye", "torch.eye on the device comes back empty (eye.out / eye.m_out fall back and "
          "cannot resize their output)", "microsoft/DirectML#431", (LINUX_WHEEL,),
          (REPLACEMENT,), "eye and eye.m build the matrix at its shape from arange and eq; an "
          "out= of another shape is refused with what to do", _facts("eye_n", "eye_nm"),
          kernels={"eye": creation.eye, "eye.m": creation.eye_m, "eye.out": creation.eye_out,
                   "eye.m_out": creation.eye_m_out},
          notes=("guard.eye",), emulator=("eye",), real_lane_test=BATTERY, battery=("eye",)),
    Guard("full_float", "torch.full(size, 1.5, device=...) without a dtype raises \"The GPU "
          "device does not support Double (Float64) operations!\" (its full kernel infers no "
          "dtype from a float fill value; an int or bool one, or a dtype, works)", NOT_REPORTED,
          (LINUX_WHEEL, WINDOWS_DLL), (REPLACEMENT,), "full infers the dtype as torch does "
          "(the default float dtype for a float), then empty and fill_",
          _facts("full_float"), kernels={"full": creation.full}, notes=("guard.full_float",),
          emulator=("full-float",), real_lane_test=BATTERY, battery=("full_float",)),
    Guard("mul_bool", "float tensor * bool tensor gives bool (x * m, m * x, x *= m)",
          "microsoft/DirectML#686, #737", (LINUX_WHEEL,), (INPUT_FIX,),
          "the bool operand becomes the float dtype, then the wheel's own mul runs",
          _facts("mul_bool", "mul_inplace_broadcast"),
          kernels={"mul.Tensor": arithmetic.mul_tensor, "mul_.Tensor": arithmetic.mul__tensor},
          notes=("guard.mul_bool",), emulator=("mul-bool",), real_lane_test=BATTERY,
          battery=("mul_bool_mask", "mul_bool_mask_inplace")),
    Guard("nll_none", "nll_loss/cross_entropy(reduction='none') backward uses grad_output[0] "
          "for every row", "microsoft/DirectML#739, #740", (LINUX_WHEEL,), (INPUT_FIX,),
          "the backward with reduction none from eq, where and index_select (a one-hot where, "
          "no scatter)", _facts("nll_none"),
          kernels={"nll_loss_backward": losses.nll_loss_backward,
                   "nll_loss2d_backward": losses.nll_loss2d_backward},
          notes=("guard.nll_none",), emulator=("nll-none-backward",), real_lane_test=BATTERY,
          battery=("cross_entropy_none",)),
    Guard("nll_ignore", "cross_entropy/nll_loss with a negative ignore_index does not ignore "
          "(>= 100 classes; -1 always); 2-D reduction='none' forward wrong", NOT_REPORTED,
          (SOFTWARE_ADAPTER,), (INPUT_FIX,),
          "a negative ignore_index that reads as a class is remapped to class C, which the "
          "wheel's own kernels ignore right; the 2-D forward with reduction none from eq, where "
          "and sum", (_ADAPTER_FACTS.format("ce_ignore"),) + _facts("ce_ignore"),
          kernels={"nll_loss_forward": losses.nll_loss_forward,
                   "nll_loss2d_forward": losses.nll_loss2d_forward},
          notes=("guard.nll",), emulator=("bug-nll-ignore", "bug-ce-2d-none"),
          real_lane_test=BATTERY, battery=("cross_entropy_ignore_index",)),
    Guard("masked_fill_uint8", "masked_fill accepts a uint8 mask (the CPU raises)",
          "microsoft/DirectML#702", (LINUX_WHEEL,), (INPUT_FIX,),
          "a non-bool mask gets the CPU's error; a bool one fills through where, copied into "
          "the tensor", _facts("masked_fill_uint8", "masked_fill_bool"),
          kernels={"masked_fill_.Scalar": masking.masked_fill__scalar,
                   "masked_fill_.Tensor": masking.masked_fill__tensor,
                   "masked_fill.Scalar": masking.masked_fill,
                   "masked_fill.Tensor": masking.masked_fill},
          notes=("guard.masked_fill_uint8",), emulator=("masked-fill-uint8",),
          no_real_lane_test="none of its own: the facts script saw the wheel accept the mask"),
    Guard("reflect_pad", "reflect padding swaps the height and width padding (and its backward "
          "then raises DirectML's partial-scatter error)", NOT_REPORTED, (LINUX_WHEEL,),
          (INPUT_FIX,), "unequal sides built from narrow, flip and cat (autograd differentiates "
          "those); equal ones are the wheel's",
          _facts("reflect_pad", "reflect_pad_grad", "reflect_pad_square"),
          kernels={"reflection_pad2d": spatial.reflection_pad2d,
                   "reflection_pad2d_backward": spatial.reflection_pad2d_backward},
          notes=("guard.reflect_pad",), emulator=("reflect-pad",), real_lane_test=BATTERY,
          battery=("pad_reflect",)),
    Guard("max_pool_indices", "max_pool2d_with_indices returns indices flattened over the whole "
          "tensor (F.max_unpool2d fails on them)", NOT_REPORTED, (LINUX_WHEEL,), (INPUT_FIX,),
          "the caller gets torch's per-plane indices (remainder); autograd keeps the wheel's "
          "for its own backward", _facts("max_pool_indices", "max_unpool"),
          kernels={"max_pool2d_with_indices": spatial.max_pool2d_with_indices},
          emulator=("maxpool-flat-indices",), only_where_the_bug_is=True,
          no_real_lane_test="none of its own: the battery's max_pool2d reads no indices"),
    Guard("bilinear", "bilinear interpolate forward and backward wrong", NOT_REPORTED,
          (SOFTWARE_ADAPTER,), (REPLACEMENT,),
          "upsample_bilinear2d from index_select and the CPU kernel's weights, its backward as "
          "M_h^T @ grad @ M_w", (_ADAPTER_FACTS.format("bilinear"),) + _facts("bilinear"),
          kernels={"upsample_bilinear2d": spatial.upsample_bilinear2d,
                   "upsample_bilinear2d_backward": spatial.upsample_bilinear2d_backward},
          notes=("guard.bilinear",), emulator=("bug-bilinear",),
          no_real_lane_test="none of its own: the battery runs interpolate_bilinear no worse "
          "under the shim"),
    Guard("unique_counts", "torch.unique(return_counts=True) and (return_inverse=True) raise",
          NOT_REPORTED, (LINUX_WHEEL,), (INPUT_FIX,),
          "_unique2 as CUDA does it from sort, ne, masked_select, cumsum, index_put_ and nonzero",
          _facts("unique_counts", "unique_inverse"), kernels={"_unique2": indexing.unique2},
          notes=("guard.unique",), emulator=("unique-counts",), real_lane_test=BATTERY,
          battery=("unique_counts",)),
    Guard("readback_gil", "a read back of one number with the GIL held (a device tensor as a "
          "size or a number: torch.zeros(n, t.max())) deadlocks", NOT_REPORTED, (LINUX_WHEEL,),
          (INPUT_FIX,), "_local_scalar_dense copies the tensor to the host through Tensor.to, "
          "which waits with the GIL released", _facts("readback_gil"),
          kernels={"_local_scalar_dense": readback.local_scalar_dense},
          emulator=("readback-gil",),
          real_lane_test="tests/test_real_wheel.py::"
          "test_a_device_tensor_given_as_a_size_does_not_hang_under_the_shim"),
    Guard("slice_empty", "an empty slice that starts past 0 (x[:, n:] of n columns) segfaults",
          NOT_REPORTED, (LINUX_WHEEL,), (INPUT_FIX,),
          "the wheel's slice gets the same empty slice at the front", _facts("slice_empty"),
          kernels={"slice.Tensor": shape.slice_tensor}, notes=("guard.slice_empty",),
          emulator=("slice-empty",), real_lane_test=_YOLO),
    Guard("cat_empty", "torch.cat with an empty operand raises E_INVALIDARG", NOT_REPORTED,
          (LINUX_WHEEL,), (INPUT_FIX,), "the empty operands are checked as torch checks them "
          "and left out; the result has the dtype of all of them", _facts("cat_empty"),
          kernels={"cat": shape.cat}, notes=("guard.cat_empty",), emulator=("cat-empty",),
          real_lane_test=_YOLO),
    Guard("layer_norm_nobias", "layer-norm backward without a bias fails", NOT_REPORTED,
          (LINUX_WHEEL,), (INPUT_FIX,), "native_layer_norm_backward uses the closed-form "
          "gradient then; with a weight and a bias it is the wheel's own kernel",
          _facts("ln_weight_only", "ln_neither", "ln_weight_input_no_grad"),
          kernels={"native_layer_norm_backward": norms.native_layer_norm_backward},
          notes=("guard.layer_norm_nobias",), emulator=("layer-norm-nobias",),
          real_lane_test="tests/frameworks/test_fw_users_path.py::test_nanogpt[eager]"),
    Guard("logsumexp", "torch.logsumexp's composite hands the wheel's sum.out an empty result "
          "it does not resize", NOT_REPORTED, (INFERRED,), (REPLACEMENT,),
          "the same formula from functional ops (amax, exp, sum, log), each allocating its "
          "result at its final shape",
          ("tests/test_guards.py::test_logsumexp_on_the_strict_device_matches_the_cpu",),
          kernels={"logsumexp": reductions.logsumexp}, notes=("guard.logsumexp",),
          emulator=("out-resize",),
          no_real_lane_test="none of its own: the battery runs logsumexp no worse under the "
          "shim"),
    Guard("flip_dims", "flip with a negative dim segfaults (flip_dml_helper)", NOT_REPORTED,
          (LINUX_WHEEL, WINDOWS_DLL), (INPUT_FIX,),
          "the dims made non-negative, then the wheel's own flip", _facts("flip_negative"),
          kernels={"flip": shape.flip}, emulator=("flip-negative-dims",),
          real_lane_test=BATTERY, battery=("flip_last",)),
    Guard("bn_mixed_backward", "batch-norm backward of a float16 input with float32 weights "
          "(CUDA autocast's form) raises E_INVALIDARG", NOT_REPORTED, (LINUX_WHEEL,),
          (INPUT_FIX,), "the backward's float16 inputs go to the wheel's own kernel in float32; "
          "the input's gradient comes back in float16",
          ("tests/test_dml_facts.py::"
           "test_the_mixed_batch_norm_backward_gives_the_cpus_result_in_float16",),
          kernels={"native_batch_norm_backward": norms.native_batch_norm_backward},
          notes=("guard.bn_mixed_backward",), emulator=("bn-mixed-backward",),
          real_lane_test=_ZOO_FP16.format("resnet50")),
    Guard("rsub_number", "number - tensor (rsub with a float number) raises 'does not support "
          "Double'", NOT_REPORTED, (LINUX_WHEEL,), (INPUT_FIX,),
          "rsub as -x + number, bit for bit the same", _facts("rsub_number"),
          kernels={"rsub.Tensor": arithmetic.rsub_tensor, "rsub.Scalar": arithmetic.rsub_tensor},
          notes=("guard.rsub_number",), emulator=("rsub-float-number",),
          real_lane_test=_ZOO_FP32.format("unet")),
    Guard("sub_empty", "sub of empty tensors gives the wrong shape ((0, 1) - (0, 1) is (0, 0))",
          NOT_REPORTED, (LINUX_WHEEL,), (INPUT_FIX,),
          "-b + a (neg and add keep the shape); sub_ of an empty tensor leaves it",
          _facts("sub_empty"),
          kernels={"sub.Tensor": arithmetic.sub_tensor, "sub_.Tensor": arithmetic.sub__tensor},
          notes=("guard.sub_empty",), emulator=("sub-empty",), real_lane_test=_YOLO),
    Guard("inplace_alias", "float32 add/sub written into a tensor that shares memory with the "
          "other operand drop alpha and the sign (x -= x gives 2x)", NOT_REPORTED,
          (LINUX_WHEEL, WINDOWS_DLL), (INPUT_FIX,),
          "sub_ and the out= forms: where the version counters are equal the result is computed "
          "out of place and copied in; a view of another shape gets torch's partial-overlap "
          "error (add_ with an alpha is not guarded: see docs/known-directml-bugs.md)",
          _facts("inplace_alias"),
          kernels={"sub_.Tensor": arithmetic.sub__tensor, "add.out": arithmetic.add_out,
                   "sub.out": arithmetic.sub_out},
          notes=("guard.inplace_alias",), emulator=("inplace-alias",), real_lane_test=BATTERY,
          battery=("sub_self_inplace", "sub_out_other")),
    Guard("split_empty", "split/chunk of an empty tensor raises E_INVALIDARG", NOT_REPORTED,
          (LINUX_WHEEL,), (INPUT_FIX,), "an empty tensor is cut with narrow (views, as "
          "split's)", _facts("split_empty"),
          kernels={"split.Tensor": shape.split_tensor,
                   "split_with_sizes": shape.split_with_sizes},
          notes=("guard.split_empty",), emulator=("split-empty",), real_lane_test=_YOLO),
    Guard("gather_scatter_dims", "gather with a negative dim gives wrong values; scatter with "
          "one raises the partial-update error; gather with an empty index raises "
          "E_INVALIDARG", NOT_REPORTED, (LINUX_WHEEL,), (INPUT_FIX,),
          "the dim made non-negative, then the wheel's own kernel; an empty gather as an empty "
          "view of the input",
          _facts("gather_scatter_negative", "gather_negative_forward", "gather_empty"),
          kernels={"gather": indexing.gather,
                   **{f"scatter{i}.{o}": (indexing.scatter_ if i else indexing.scatter)
                      for i in ("", "_") for o in ("src", "value", "reduce", "value_reduce")}},
          notes=("guard.gather_empty",),
          emulator=("gather-scatter-negative-dim", "gather-empty"), real_lane_test=_YOLO),
    Guard("scatter_add", "scatter_add raises (the partial-update error; E_INVALIDARG for any "
          "form on the software adapter)", NOT_REPORTED, (LINUX_WHEEL, SOFTWARE_ADAPTER),
          (INPUT_FIX,), "scatter_add as index_put_ with accumulate, the index along the dim and "
          "an arange along each other dim", (_FACTS.format("scatter_add"),
                                             _ADAPTER_FACTS.format("scatter_based")),
          kernels={"scatter_add": indexing.scatter_add, "scatter_add_": indexing.scatter_add_},
          notes=("guard.scatter_add",), emulator=("scatter-partial", "bug-scatter-add"),
          real_lane_test=_YOLO),
    Guard("non_blocking_to_host", "x.to('cpu', non_blocking=True) of a device tensor returns "
          "before the copy is done (garbage, then heap corruption: every GradScaler.update)",
          NOT_REPORTED, (LINUX_WHEEL,), (POLICY,),
          "a non-blocking copy out of a device tensor blocks", _facts("to_host_non_blocking"),
          policy=Policy("Tensor.to non_blocking", readback.blocking_copy_to_host),
          notes=("guard.non_blocking_to_host",), emulator=("non-blocking-to-host",),
          real_lane_test=_ZOO_FP16.format("resnet50")),
    Guard("view_replay", "the backward of a write into a view reads the wrong gradient (views "
          "report storage offset 0)", NOT_REPORTED, (LINUX_WHEEL,), (AUTOGRAD_SETTING,),
          "autograd's view replay on (torch._C._set_view_replay_enabled), restored at "
          "uninstall",
          ("tests/test_guards.py::"
           "test_view_replay_is_on_for_directml_only_and_uninstall_restores_it",),
          setting=shape.replay_views,
          no_emulator="torch always replays the views of a Python tensor subclass (the "
          "emulator's tensors): no switch can show the wrong gradient",
          real_lane_test="tests/test_real_wheel.py::"
          "test_writes_into_views_get_the_cpus_gradients_under_the_shim"),
    Guard("bn_stats", "BatchNorm running statistics not updated in training",
          "microsoft/DirectML#362", (OLDER_RELEASES,), (WRAPPER,),
          "F.batch_norm updates running_mean and running_var itself in training",
          ("tests/test_guards.py::test_guards_give_cpu_results_on_the_buggy_device",),
          wraps=(Wrap("torch.nn.functional", "batch_norm", norms.batch_norm_stats_wrapper),),
          notes=("guard.bn_stats",), emulator=("bug-bn-stats",), only_where_the_bug_is=True,
          on_real_wheel=False,
          no_real_lane_test="none: 0.2.5 updates the statistics (the guard is the emulator's "
          "only)"),
)

BY_NAME: Dict[str, Guard] = {g.name: g for g in GUARDS}


def on_real_directml() -> Tuple[str, ...]:
    """The guards every real DirectML adapter needs (the bugs of 0.2.5)."""
    return tuple(g.name for g in GUARDS if g.on_real_wheel)


def on_the_emulator(switches: Collection[str]) -> Tuple[str, ...]:
    """The guards the emulator needs with ``switches`` on: those of the real wheel, but a fix
    that is right only where its bug is only where the emulator's switch for it is on."""
    return tuple(g.name for g in GUARDS
                 if (g.emulator[0] in switches if g.only_where_the_bug_is else g.on_real_wheel))


def kernels_of(names: Sequence[str]) -> Dict[str, Tuple[Callable[..., Any], str]]:
    """``{aten overload: (kernel, dispatch key)}`` of the guards ``names`` (one kernel per op
    and key: guards that share an op list the same kernel, which does both)."""
    return {op: (fn, BY_NAME[name].key or "") for name in names
            for op, fn in BY_NAME[name].kernels.items()}


def markdown_table() -> str:
    """The known-bugs table (docs): one row per guard."""
    rows: List[str] = [
        "| guard | what torch-directml 0.2.5 does | issue | seen on | what dmlshim does | "
        "emulator switch |",
        "| --- | --- | --- | --- | --- | --- |"]
    for g in GUARDS:
        how = "; ".join(g.kinds)
        if g.kernels:
            how += f" ({g.key}: " + ", ".join(f"`{op}`" for op in g.kernels) + ")"
        switch = ", ".join(f"`{s}`" for s in g.emulator) or g.no_emulator
        rows.append(f"| `{g.name}` | {g.wheel_does} | {g.issue} | {'; '.join(g.seen)} | "
                    f"{g.fix} — {how} | {switch} |")
    return "\n".join(rows) + "\n"
