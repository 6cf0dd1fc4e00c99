"""What each kind of target can do: one object per kind, asked instead of comparing kind strings.

The session builds its target's object once (``api.Shim.capabilities``) and the patches get
it at install; nothing else answers "what can this target do" (:class:`dmlshim.target.Target`
is data: kind, adapters, names). Only :class:`EmulatedDirectML` reads the emulator's switches
(the options' ``emulator_gaps``) and imports the emulator: this is the one module of dmlshim that
does (tests/test_import_boundaries.py), so the session asks it to register the emulated device
and the diagnostics ask it for the emulator's exact fallback counts.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from dmlshim.kernels.guards import records


class Capabilities:
    """The CPU target (also the base: answers for a target that does not redirect)."""

    kind = "cpu"
    #: real or emulated DirectML: Parameters are replaced on conversion, the wheel's bugs
    directml = False
    #: CUDA devices are rewritten to this target's devices (False only for real CUDA)
    redirects = True
    #: the torch device type the target's tensors have
    device_type = "cpu"

    def __init__(self, target: Any, config: Any) -> None:
        self.target = target
        self.config = config

    def has_float64(self, index: int = 0) -> bool:  # noqa: ARG002
        return True

    def has_bf16(self) -> bool:
        return True

    def autocast_dtypes_allowed(self) -> Tuple[torch.dtype, ...]:
        """Low-precision dtypes autocast may use here (torch is asked which really work)."""
        return (torch.float16, torch.bfloat16)

    def known_bugs(self) -> Tuple[str, ...]:
        """The torch-directml wrong-result bugs present on this target (guard names)."""
        return ()

    def synchronize(self, index: int) -> None:
        pass

    def memory_allocated(self, index: int) -> int:
        from dmlshim import hostmemory

        return hostmemory.process_memory()

    def max_memory_allocated(self, index: int) -> Any:
        return None  # None: the caller keeps its own peak of memory_allocated

    def reset_peak(self, index: int) -> None:
        pass

    def used_device_memory(self, index: int) -> Any:
        return None  # None: system memory figures stand in

    def processor_count(self, index: int) -> int:
        import os

        return os.cpu_count() or 1

    def empty_cache(self) -> None:
        pass

    def raises_untyped_oom(self) -> bool:
        """Whether running out of memory raises a plain RuntimeError here (torch-directml's
        allocator does; CPU and CUDA raise torch's OutOfMemoryError or MemoryError)."""
        return False

    def limit_memory(self, nbytes: Any) -> None:
        """Cap the live bytes per adapter (None: no cap); only the emulator has one."""

    def float64_summary(self) -> str:
        """:meth:`has_float64`'s answer in words, with where it comes from (the doctor's row)."""
        return "yes"

    def has_fused_optimizers(self) -> bool:
        """Whether torch's fused optimizer kernels (``fused=True``) run on the target's device:
        on the CPU, when the installed torch has CPU ones."""
        try:
            from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
        except ImportError:
            return False
        return "cpu" in _get_fused_kernels_supported_devices()

    def load_problem(self) -> Any:
        """Why this target's backend cannot be loaded in this process (None: it can)."""
        return None

    #: every CUDA ordinal is the one CPU device (the device map has a single entry)
    redirects_to_cpu = True
    #: the device is dmlshim's emulator (which registers itself at install)
    emulated = False
    #: the torch_directml wheel must be importable (here and in child processes)
    needs_torch_directml = False

    def exact_fallback_counts(self) -> Any:
        """``{op: calls}`` of CPU fallbacks counted exactly, or None (warnings are counted)."""
        return None

    def exact_fallback_bytes(self) -> Dict[str, Tuple[int, int]]:
        """``{op: (to_host, to_device)}``: bytes the CPU fallbacks counted exactly copied."""
        return {}

    def register_device(self) -> None:
        """Make the target's device usable in this process (the emulator registers its own)."""


class Cuda(Capabilities):
    kind = "cuda"
    redirects = False
    device_type = "cuda"
    redirects_to_cpu = False

    def has_fused_optimizers(self) -> bool:
        return True


class DirectML(Capabilities):
    kind = "dml"
    directml = True
    device_type = "privateuseone"

    def has_float64(self, index: int = 0) -> bool:
        f64 = self.target.float64
        return f64[index] if index < len(f64) else False

    def has_bf16(self) -> bool:
        return False  # microsoft/DirectML#688

    def autocast_dtypes_allowed(self) -> Tuple[torch.dtype, ...]:
        return (torch.float16,)  # no bfloat16 (#688)

    def known_bugs(self) -> Tuple[str, ...]:
        return records.on_real_directml()

    def synchronize(self, index: int) -> None:
        # DirectML queues work; a read back to the host waits for everything before it.
        torch.zeros(1, device=torch.device(self.device_type, index)).cpu()

    def memory_allocated(self, index: int) -> int:
        return self.used_device_memory(index)

    def used_device_memory(self, index: int) -> int:
        try:
            import torch_directml

            # gpu_memory(device, mb_per_tile) -> used memory per tile, in MB
            return int(sum(torch_directml.gpu_memory(index, 1)) * 1024 * 1024)
        except Exception:  # noqa: BLE001 - an older wheel or no adapter: nothing to report
            return 0

    def processor_count(self, index: int) -> int:
        return 1

    def empty_cache(self) -> None:
        try:
            import torch_directml

            fn = getattr(torch_directml, "empty_cache", None)
            if fn is not None:
                fn()
        except Exception:  # noqa: BLE001
            pass

    def raises_untyped_oom(self) -> bool:
        return True

    def float64_summary(self) -> str:
        # torch_directml.has_float64_support(i), probed per adapter
        return ", ".join(f"adapter {i}: {'yes' if ok else 'no'}"
                         for i, ok in enumerate(self.target.float64)) or "unknown"

    def has_fused_optimizers(self) -> bool:
        return False  # torch-directml has no fused optimizer kernels

    redirects_to_cpu = False
    needs_torch_directml = True


class EmulatedDirectML(Capabilities):
    kind = "emulated-dml"
    directml = True
    device_type = "privateuseone"

    def _switches(self) -> Tuple[str, ...]:
        return self.config.emulator_switches() if self.config is not None else ()

    def has_float64(self, index: int = 0) -> bool:
        return "float64" not in self._switches()

    def has_bf16(self) -> bool:
        return "bfloat16" not in self._switches()

    def known_bugs(self) -> Tuple[str, ...]:
        return records.on_the_emulator(self._switches())

    def synchronize(self, index: int) -> None:
        import emulated_dml as emulator

        emulator.synchronize(index)

    def memory_allocated(self, index: int) -> int:
        import emulated_dml as emulator

        return emulator.memory_allocated(index)

    def max_memory_allocated(self, index: int) -> int:
        import emulated_dml as emulator

        return emulator.max_memory_allocated(index)

    def reset_peak(self, index: int) -> None:
        import emulated_dml as emulator

        emulator.reset_peak_memory_stats(index)

    def processor_count(self, index: int) -> int:
        return 1

    def raises_untyped_oom(self) -> bool:
        # as the wheel, but only an adapter capped by DMLSHIM_EMULATOR_MEMORY can run out
        return bool(self.config is not None and self.config.emulator_memory)

    def limit_memory(self, nbytes: Any) -> None:
        import emulated_dml as emulator

        emulator.set_memory_limit(nbytes)

    def float64_summary(self) -> str:
        if not self.has_float64(0):
            return "no (the emulator reproduces adapters without float64: emulator gap 'float64')"
        return "yes (emulator gap 'float64' is off)"

    def has_fused_optimizers(self) -> bool:
        return False  # as on DirectML

    def load_problem(self) -> Any:
        import importlib

        try:
            emulator = importlib.import_module("emulated_dml")
            if not hasattr(emulator, "register"):
                raise ImportError("emulated_dml has no register()")
        except Exception as err:  # noqa: BLE001 - any failure is the answer
            return f"the emulator cannot be loaded: {type(err).__name__}: {err}"
        return None

    redirects_to_cpu = False
    emulated = True

    def exact_fallback_counts(self) -> Any:
        import emulated_dml as emulator

        return emulator.fallback_counts()

    def exact_fallback_bytes(self) -> Dict[str, Tuple[int, int]]:
        import emulated_dml as emulator

        return emulator.fallback_bytes()

    def register_device(self) -> None:
        """Register the emulated adapters with the options' switches (this routes
        ``torch.Generator`` through the emulator), and on torch 2.4 make DDP take emulated
        parameters (as torch 2.5 does)."""
        import emulated_dml as emulator

        emulator.register(self.target.count, self._switches())
        emulator.fix_parameter_instancecheck()


_BY_KIND = {c.kind: c for c in (Capabilities, Cuda, DirectML, EmulatedDirectML)}


def of(target: Any, config: Any = None) -> Capabilities:
    """The capabilities of ``target`` (None: the CPU's) under ``config``."""
    if target is None:
        return Capabilities(None, config)
    return _BY_KIND[target.kind](target, config)

