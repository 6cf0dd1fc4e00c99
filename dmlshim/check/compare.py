"""Is a device result the CPU's result? Dtype and shape exactly, values within a per-dtype tolerance.

The tolerances are wide enough for a different summation order (a GPU reduces in another order
than the CPU) and narrow enough for what silent DirectML bugs look like: a zero gradient, a bool
where a float belongs, an empty tensor, swapped padding, float64 computed in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

# dtype -> (rtol, atol): |device - cpu| <= atol + rtol * |cpu| element by element (as
# torch.isclose). Integers and bool must be equal. docs/correctness.md states this.
TOLERANCES: Dict[torch.dtype, Tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
}
TOLERANCES[torch.complex128] = TOLERANCES[torch.float64]
TOLERANCES[torch.complex64] = TOLERANCES[torch.float32]
if hasattr(torch, "complex32"):
    TOLERANCES[torch.complex32] = TOLERANCES[torch.float16]


def tolerance(dtype: torch.dtype) -> Tuple[float, float]:
    """(rtol, atol) for ``dtype``; (0, 0) for integers, bool and float8 kinds we do not know."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class Mismatch:
    """How one device result differs from the CPU's."""

    what: str  # dtype, shape, type, outputs, values, nan/inf positions, value, error
    device: str  # e.g. "float32[64, 10]" or a Python value
    cpu: str
    max_abs_err: Optional[float] = None
    max_rel_err: Optional[float] = None
    elements: int = 0  # elements out of tolerance (values, nan/inf)

    def describe(self) -> str:
        if self.what == "error":
            return f"the CPU raises {self.cpu} where the device returned a result"
        if self.what in ("dtype", "shape", "type", "outputs"):
            return f"{self.what} differs: device {self.device}, CPU {self.cpu}"
        errs = f"max abs err {fmt(self.max_abs_err)}, max rel err {fmt(self.max_rel_err)}"
        if self.what == "value":
            return f"value differs: device {self.device}, CPU {self.cpu} ({errs})"
        return f"{self.what} differ in {self.elements} element(s) of {self.cpu} ({errs})"


def fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def describe_tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _errors(got: torch.Tensor, want: torch.Tensor) -> Tuple[float, float]:
    diff = (got - want).abs()
    if diff.numel() == 0:
        return 0.0, 0.0
    max_abs = float(diff.max())
    scale = want.abs()
    nonzero = scale > 0
    rel = 0.0
    if bool(nonzero.any()):
        rel = float((diff[nonzero] / scale[nonzero]).max())
    if bool(((~nonzero) & (diff > 0)).any()):
        rel = math.inf  # the CPU says exactly 0, the device says something else
    return max_abs, rel


def compare_tensors(got: torch.Tensor, want: torch.Tensor) -> Optional[Mismatch]:
    """None when the device result ``got`` (already copied to the CPU) matches ``want``."""
    if got.dtype != want.dtype:
        return Mismatch("dtype", describe_tensor(got), describe_tensor(want))
    if got.shape != want.shape:
        return Mismatch("shape", describe_tensor(got), describe_tensor(want))
    if got.numel() == 0 or torch.equal(got, want):  # bit for bit: the usual answer, one call
        return None
    shown = describe_tensor(want)
    if got.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    if not got.is_floating_point():
        bad = got != want
        if not bool(bad.any()):
            return None
        g, w = got[bad].double(), want[bad].double()
        max_abs, rel = _errors(g, w)
        return Mismatch("values", shown, shown, max_abs, rel, int(bad.sum()))
    g, w = got.double(), want.double()
    nonfinite = ~torch.isfinite(w) | ~torch.isfinite(g)
    if bool(nonfinite.any()):
        # NaN where the CPU has NaN, +inf where it has +inf, -inf where it has -inf
        same = (torch.isnan(g) == torch.isnan(w)) & (torch.isposinf(g) == torch.isposinf(w)) \
            & (torch.isneginf(g) == torch.isneginf(w))
        if not bool(same.all()):
            finite = ~nonfinite
            max_abs, rel = _errors(g[finite], w[finite]) if bool(finite.any()) else (None, None)
            return Mismatch("nan/inf positions", shown, shown, max_abs, rel,
                            int((~same).sum()))
        g, w = g[~nonfinite], w[~nonfinite]
    rtol, atol = tolerance(got.dtype)
    bad = (g - w).abs() > atol + rtol * w.abs()
    if not bool(bad.any()):
        return None
    max_abs, rel = _errors(g, w)
    return Mismatch("values", shown, shown, max_abs, rel, int(bad.sum()))


def compare_values(got: Any, want: Any, dtype: Optional[torch.dtype] = None) -> Optional[Mismatch]:
    """Compare one output (a tensor on the CPU, a Python number, None, ...) with the CPU's."""
    if isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)):
            return Mismatch("type", type(got).__name__, type(want).__name__)
        return compare_tensors(got, want)
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isnan(want) and math.isnan(got):
            return None
        rtol, atol = tolerance(dtype if dtype is not None and dtype.is_floating_point
                               else torch.float32)
        if got == want or abs(got - want) <= atol + rtol * abs(want):
            return None
        err = abs(got - want)
        rel = err / abs(want) if want else math.inf
        return Mismatch("value", repr(got), repr(want), err, rel, 1)
    if type(got) is not type(want) and not (isinstance(got, int) and isinstance(want, int)):
        return Mismatch("type", type(got).__name__, type(want).__name__)
    if got != want:
        return Mismatch("value", repr(got)[:60], repr(want)[:60])
    return None
