"""CUDA automatic mixed precision on targets without CUDA: autocast regions and GradScaler.

``DMLSHIM_AMP=off`` (default): an autocast region for ``"cuda"`` computes in float32: it is an
autocast region on the target's device whose autocast dtype is float32, so autocast-eligible ops
(conv, linear, matmul, ...) cast float16/bfloat16 inputs to float32, as CUDA autocast casts
both operands to float16 (a float16 batch into a float32 model works, as in ultralytics'
validation); torch's "CUDA is not available ... Disabling autocast" warning never fires. A
CUDA ``GradScaler`` is a disabled scaler -- ``scale`` returns its input, ``step`` calls
``optimizer.step()``, ``unscale_``/``update`` do nothing -- whose ``state_dict`` still holds the
scaler settings (so a checkpoint written here resumes an enabled scaler on a CUDA machine) and
whose ``load_state_dict`` accepts a CUDA scaler's state.

``DMLSHIM_AMP=fp16``: autocast regions for ``"cuda"`` run as float16 autocast on the target
(the CPU: torch's own CPU autocast; DirectML, real or emulated: CUDA's op lists, below), and the
scaler is a real, enabled scaler on that device. A dtype the target cannot autocast to runs in
float32 as with ``off``, one warning per call site; ``dtype=torch.bfloat16`` on DirectML
follows ``DMLSHIM_BF16``.

On DirectML, torch-directml has no AutocastPrivateUse1 kernels (microsoft/DirectML#454,
reproduced by the emulator's ``autocast`` gap): dmlshim holds CUDA's autocast kernels for the
session (``dmlshared/autocast_kernels.py``), with its weight-cast cache cleared when the
outermost region ends (``torch.clear_autocast_cache``, which torch's ``autocast.__exit__``
calls). A region the script disables (``autocast("cuda", enabled=False)``) disables autocast on
the device that really autocasts.

Only the constructors, ``clear_autocast_cache`` (once per outermost region, DirectML only) and
``custom_fwd``/``custom_bwd`` (decorators) are wrapped: nothing of this module runs per op.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
import torch.amp.autocast_mode as _autocast_mode
import torch.amp.grad_scaler as _grad_scaler

from dmlshim import current, events
from dmlshim.patching import Owns, Patch

log = logging.getLogger("dmlshim")

_AUTOCAST_PARAMS = ("device_type", "dtype", "enabled", "cache_enabled")
_SCALER_PARAMS = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                  "enabled")
_SCALER_DEFAULTS: Dict[str, Any] = {"init_scale": 2.0 ** 16, "growth_factor": 2.0,
                                    "backoff_factor": 0.5, "growth_interval": 2000}
# Attribute holding a stand-in scaler's settings (what an enabled CUDA scaler would save).
STATE_ATTR = "_dmlshim_scaler_state"
STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


# -- what "cuda" autocast becomes on this target ---------------------------------------------

class AmpPlan:
    """Where and in which dtypes float16 autocast can run on the target (None: nowhere)."""

    def __init__(self, mode: str, device_type: Optional[str], dtypes: Tuple[torch.dtype, ...],
                 why_not: str = "") -> None:
        self.mode = mode
        self.device_type = device_type  # "cpu" / "privateuseone", or None: regions run in float32
        self.dtypes = dtypes
        self.why_not = why_not
        # (an attribute, not a property: read at every autocast region, a frame each)
        self.low_precision = device_type is not None


def _autocast_dtypes(device_type: str, index: int = 0,
                     run_op: bool = True) -> Tuple[torch.dtype, ...]:
    """The low-precision dtypes torch really autocasts to on ``device_type`` (empty: none).

    A region is built, and with ``run_op`` a matmul run in it: building can succeed where the
    ops then have no autocast kernel for the device. On DirectML the kernels are dmlshim's
    (held before this is asked), so only the constructor's answer is needed: no device op runs
    at install (see :attr:`AmpPatch.float32_device` for why that matters).
    """
    found = []
    device = torch.device(device_type, index) if device_type != "cpu" else torch.device("cpu")
    for dtype in (torch.float16, torch.bfloat16):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ctx = _autocast_mode.autocast(device_type, dtype=dtype)
                if not getattr(ctx, "_enabled", False):
                    continue
                if not run_op:
                    found.append(dtype)
                    continue
                a = torch.ones(2, 2, device=device)
                with ctx:
                    ok = torch.mm(a, a).dtype is dtype
        except Exception:  # noqa: BLE001 - any failure means "not available here"
            continue
        if ok:
            found.append(dtype)
    return tuple(found)


def make_plan(caps: Any, mode: str) -> AmpPlan:
    if mode != "fp16":
        return AmpPlan(mode, None, (), "DMLSHIM_AMP=off")
    device_type = caps.device_type
    # DirectML: dmlshim's CUDA-like kernels autocast there (float16 arithmetic itself works on
    # the device); torch's constructor says which dtypes the device module accepts.
    dtypes = _autocast_dtypes(device_type, caps.target.index, run_op=not caps.directml)
    allowed = caps.autocast_dtypes_allowed()  # DirectML: no bf16 (#688)
    dtypes = tuple(d for d in dtypes if d in allowed)
    if torch.float16 not in dtypes:
        return AmpPlan(mode, None, (), f"torch cannot autocast to float16 on {device_type}")
    return AmpPlan(mode, device_type, dtypes)


def _float32_regions_work(device_type: str, index: int) -> bool:
    """Whether a float32 region on the device casts a float16 input of a matmul up.

    torch's constructor accepts only float16/bfloat16 on the CPU and DirectML; the dtype the
    region sets on entry (``fast_dtype``) can be float32 all the same, and autocast's cast
    policies handle it like any other target dtype (float32 inputs stay, others cast up).
    """
    device = torch.device(device_type, index) if device_type != "cpu" else torch.device("cpu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ctx = _autocast_mode.autocast(device_type, dtype=torch.float16)
            if not getattr(ctx, "_enabled", False):
                return False
            ctx.fast_dtype = torch.float32
            with ctx:
                out = torch.mm(torch.ones(2, 2, device=device, dtype=torch.float16),
                               torch.ones(2, 2, device=device))
            return out.dtype is torch.float32
    except Exception:  # noqa: BLE001 - any failure means "regions stay plain float32"
        return False


def _bind(names: Tuple[str, ...], args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


class AmpPatch(Patch):
    name = "amp"
    owns = (Owns("torch.amp.autocast_mode.autocast", ("__init__",)),
            Owns("torch.amp.grad_scaler.GradScaler", ("__init__", "state_dict", "load_state_dict")),
            Owns("torch.amp", ("custom_fwd", "custom_bwd")),
            Owns("torch.amp.autocast_mode", ("custom_fwd", "custom_bwd")),
            Owns("torch", ("clear_autocast_cache",)))

    def applies(self, caps) -> bool:
        return caps.redirects

    def _install(self, caps, config) -> None:
        self._float32_probed: Optional[Optional[str]] = None  # None: not probed yet
        self._device_type, self._index = caps.device_type, caps.target.index
        if caps.directml:
            # torch-directml has no AutocastPrivateUse1 kernels (#454): hold dmlshim's (CUDA's
            # op lists) for the session, before the plan asks what autocast does there.
            import dmlshared.autocast_kernels as _pu1_autocast

            _pu1_autocast.hold("dmlshim.amp")
            self.on_undo(lambda: _pu1_autocast.release("dmlshim.amp"))
            # Weight casts are cached per region, as CUDA's are: torch clears its C++ cache
            # when the outermost region ends, and the kernels' cache with it.
            self.wrap(torch, "clear_autocast_cache", _clear_autocast_cache)
            _pu1_autocast.enable_cache(True)
            self.on_undo(lambda: _pu1_autocast.enable_cache(False))
        self.plan = plan = make_plan(caps, config.amp)
        if plan.mode == "fp16":
            if plan.low_precision:
                log.info("DMLSHIM_AMP=fp16: CUDA autocast runs as %s autocast on %s",
                         "/".join(str(d).replace("torch.", "") for d in plan.dtypes),
                         plan.device_type)
            else:
                log.info("DMLSHIM_AMP=fp16: %s; autocast regions run in float32", plan.why_not)
        self.wrap(_autocast_mode.autocast, "__init__", self._autocast_init)
        self.wrap(_grad_scaler.GradScaler, "__init__", self._scaler_init)
        self.wrap(_grad_scaler.GradScaler, "state_dict", _scaler_state_dict)
        self.wrap(_grad_scaler.GradScaler, "load_state_dict", _scaler_load_state_dict)
        if plan.low_precision:
            # custom_fwd/custom_bwd ask torch.is_autocast_enabled("cuda"); point them at the
            # device whose autocast is really on.
            for owner in {id(m): m for m in (torch.amp, _autocast_mode)}.values():
                for name in ("custom_fwd", "custom_bwd"):
                    if hasattr(owner, name):
                        self.wrap(owner, name, self._custom_decorator)

    @property
    def float32_device(self) -> Optional[str]:
        """The device whose float32 autocast regions cast float16 inputs up (None: none).

        Probed at the first CUDA autocast region, not at install: the probe's device ops would
        be the process's first, and torch imports modules then (torch.distributed.tensor) that
        a script importing them itself must see imported by its own statement.
        """
        if self._float32_probed is None:
            device_type = self._device_type
            if _float32_regions_work(device_type, self._index):
                self._float32_probed = device_type
            else:
                self._float32_probed = ""
                log.info("autocast regions on %s cannot cast to float32; CUDA autocast regions "
                         "are disabled there instead (float16 inputs are not cast up)",
                         device_type)
        return self._float32_probed or None

    # -- autocast -------------------------------------------------------------------------
    def _autocast_init(self, wrapped, instance, args, kwargs):
        # (every step enters a region: one frame on its paths, no helpers, each answer read once)
        bound = dict(zip(_AUTOCAST_PARAMS, args))
        bound.update(kwargs)
        if bound.get("device_type") != "cuda":
            return wrapped(*args, **kwargs)
        plan = self.plan
        enabled = bool(bound.get("enabled", True))
        dtype = bound.get("dtype")
        # Probe before this call warns: the probe's catch_warnings() resets Python's
        # once-per-site warning registry, which would let this call's warning show twice.
        float32_device = self._float32_probed  # "" none, None: not probed yet (the property)
        if plan.low_precision:
            on = plan.device_type
        else:
            if float32_device is None:
                float32_device = self.float32_device or ""  # the first region probes
            on = float32_device or None
        if not enabled:
            # autocast("cuda", enabled=False) inside a region turns autocast off where the
            # shim turned it on (an fp32 island, as on CUDA); its dtype is left as it is.
            if on is not None:
                bound.update(device_type=on, dtype=None)
                return wrapped(**bound)
            return wrapped(*args, **kwargs)
        float32 = False
        if dtype is torch.bfloat16:  # DirectML has no bfloat16: DMLSHIM_BF16 decides
            from dmlshim.patches import bf16

            as_dtype = bf16.autocast_dtype()  # raises under DMLSHIM_BF16=error; warns otherwise
            if as_dtype is torch.float32:
                float32 = True
            elif as_dtype is not None:
                dtype = bound["dtype"] = as_dtype
        if not float32 and plan.low_precision and (dtype is None or dtype in plan.dtypes):
            bound["device_type"] = plan.device_type
            bound["dtype"] = torch.float16 if dtype is None else dtype
            shim = current.session
            if shim is None or shim.events.trace:
                events.redirected("torch.autocast", "cuda", f"{plan.device_type} "
                                  f"{str(bound['dtype']).replace('torch.', '')}")
            else:  # events.redirected's count, inline (a region a step)
                records = shim.events
                records.api_counts["torch.autocast"] += 1
                records.tag_counts["redirected"] += 1
                records.api_tags["torch.autocast"] = "redirected"
            return wrapped(**bound)
        if plan.mode == "fp16" and not float32:
            if plan.low_precision:
                why = f"{dtype} autocast is not available on {plan.device_type}"
            else:
                why = plan.why_not
            events.warn_at_user_site(f"dmlshim: CUDA autocast requested but {why}; this region runs "
                              "in float32 (DMLSHIM_AMP=fp16)")
        if float32_device is None:
            float32_device = self.float32_device or ""
        if float32_device:
            # float32: a region on the device whose autocast dtype is float32 (see the module
            # docstring), so a float16 input into a float32 layer computes as on CUDA.
            bound["device_type"] = float32_device
            bound["dtype"] = torch.float16  # accepted by the constructor; replaced below
            result = wrapped(**bound)
            instance.fast_dtype = torch.float32
            events.redirected("torch.autocast", "cuda", f"{float32_device} float32")
            return result
        bound["enabled"] = False
        events.redirected("torch.autocast", "cuda", "float32", tag="dropped")
        return wrapped(**bound)

    def _custom_decorator(self, wrapped, instance, args, kwargs):
        if kwargs.get("device_type") == "cuda":
            kwargs = dict(kwargs, device_type=self.plan.device_type)
        return wrapped(*args, **kwargs)

    # -- GradScaler -----------------------------------------------------------------------
    def _scaler_init(self, wrapped, instance, args, kwargs):
        bound = _bind(_SCALER_PARAMS, args, kwargs)
        if bound.get("device", "cuda") != "cuda":
            return wrapped(*args, **kwargs)
        plan = self.plan
        if plan.low_precision:
            bound["device"] = plan.device_type
            events.redirected("GradScaler", "cuda", plan.device_type)
            result = wrapped(**bound)
            if plan.device_type != "cpu" and instance.is_enabled():
                # Keep the scale and growth tracker on the host: unscale_() takes the scale's
                # reciprocal in float64, which adapters without float64 refuse, and
                # torch-directml has no _amp_update_scale_ kernel anyway (CPU fallback).
                # scale() and unscale_() copy the scalar to each gradient's device.
                instance._lazy_init_scale_growth_tracker(torch.device("cpu"))
            return result
        enabled = bool(bound.get("enabled", True))
        settings = {k: bound.get(k, v) for k, v in _SCALER_DEFAULTS.items()}
        bound["enabled"] = False
        result = wrapped(**bound)
        if enabled:
            # The checks an enabled CUDA scaler makes, so bad settings fail here as there.
            if settings["growth_factor"] <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if settings["backoff_factor"] >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            setattr(instance, STATE_ATTR, {
                "scale": float(settings["init_scale"]),
                "growth_factor": float(settings["growth_factor"]),
                "backoff_factor": float(settings["backoff_factor"]),
                "growth_interval": int(settings["growth_interval"]),
                "_growth_tracker": 0,
            })
            events.redirected("GradScaler", "cuda", "disabled (float32 training)", tag="dropped")
        return result


def _clear_autocast_cache(wrapped, instance, args, kwargs):
    import dmlshared.autocast_kernels as _pu1_autocast

    _pu1_autocast.clear_cache()
    return wrapped(*args, **kwargs)


def _scaler_state_dict(wrapped, instance, args, kwargs):
    state = getattr(instance, STATE_ATTR, None) if instance is not None else None
    if state is None:
        return wrapped(*args, **kwargs)
    return dict(state)


def _scaler_load_state_dict(wrapped, instance, args, kwargs):
    state = getattr(instance, STATE_ATTR, None) if instance is not None else None
    if state is None:
        return wrapped(*args, **kwargs)
    source = args[0] if args else kwargs["state_dict"]
    if len(source) == 0:
        return None  # written by a disabled scaler: nothing to restore
    missing = [k for k in STATE_KEYS if k not in source]
    if missing:
        raise KeyError(f"dmlshim: GradScaler.load_state_dict: the state dict lacks {missing}; "
                       "pass the dict that GradScaler.state_dict() returned")
    state.update(scale=float(source["scale"]), growth_factor=float(source["growth_factor"]),
                 backoff_factor=float(source["backoff_factor"]),
                 growth_interval=int(source["growth_interval"]),
                 _growth_tracker=int(source["_growth_tracker"]))
    return None
