"""What the check found: divergences per op, the gradient sanity verdict, and how they are told.

One :class:`Results` per installation, held by :mod:`dmlshim.patches.check`, which fills it
and hands the report section and the "needs attention" lines to the exit summary.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from dmlshim import events
from dmlshim.check.compare import Mismatch

log = logging.getLogger("dmlshim")


@dataclass
class Divergence:
    """The first time an op's device result differed from the CPU's."""

    op: str  # "aten::nll_loss_backward"
    step: int  # the optimizer step being shadowed (1 = up to the end of the first step)
    phase: str  # forward, backward, optimizer
    file: str  # the user's source line that led to the op ("" when unknown)
    line: int
    node: str  # backward: the autograd node that ran it ("NllLossBackward0"), else ""
    result: str  # which result differs: "output 0", "argument running_mean"
    mismatch: Mismatch
    inputs: List[str]  # dtype[shape] of the op's tensor inputs

    def where(self) -> str:
        return f"{events.display_path(self.file)}:{self.line}" if self.file else "<unknown line>"

    def text(self) -> str:
        m = self.mismatch
        ctx = f"backward of {self.node}, " if self.node else (
            "optimizer step, " if self.phase == "optimizer" else "")
        label = "" if m.what in ("error", "outputs") else self.result + " "
        return (f"{self.op} at {self.where()} ({ctx}step {self.step}): {label}"
                f"{m.describe()}; inputs {', '.join(self.inputs) or 'none'}")

    def as_dict(self) -> Dict[str, Any]:
        m = self.mismatch
        return {
            "op": self.op, "step": self.step, "phase": self.phase, "file": self.file,
            "line": self.line, "autograd_node": self.node, "result": self.result,
            "what": m.what, "device": m.device, "cpu": m.cpu,
            "max_abs_err": _json_float(m.max_abs_err), "max_rel_err": _json_float(m.max_rel_err),
            "elements": m.elements, "inputs": list(self.inputs),
        }


def _json_float(x: Optional[float]) -> Optional[float]:
    if x is None:
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return None  # JSON has no inf/NaN; describe() still says "inf"
    return float(x)


@dataclass
class GradientVerdict:
    """Optimizer-held parameters that got no (or an all-zero) gradient in the optimizer's first
    ``steps`` steps (see :mod:`dmlshim.check.grads`)."""

    optimizer: str  # class name
    steps: int = 1  # the optimizer's steps judged (grads.WINDOW, fewer if the script stopped)
    none: List[str] = field(default_factory=list)  # unit names (modules or parameters)
    zero: List[str] = field(default_factory=list)
    none_count: int = 0
    zero_count: int = 0
    # of the parameters without a gradient, those a conversion replaced (model.to() after the
    # optimizer was built): the optimizer steps dead copies
    replaced_count: int = 0
    policy: str = "rebind"  # DMLSHIM_OPTIMIZER in force (off: nothing rebinds them)

    def as_dict(self) -> Dict[str, Any]:
        return {"optimizer": self.optimizer, "steps": self.steps,
                "no_gradient": {"count": self.none_count,
                                                            "where": self.none},
                "zero_gradient": {"count": self.zero_count, "where": self.zero}}


class Results:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps_requested = 0
        self.steps_shadowed = 0
        self.shadowing = False
        self.ops_compared = 0
        self.skipped: Counter = Counter()  # reason -> ops not compared
        self.first: Dict[str, Divergence] = {}  # op -> its first divergence, in order found
        self.counts: Counter = Counter()  # op -> divergences
        self.gradients: List[GradientVerdict] = []
        self.gradients_checked = 0  # optimizers whose first step was looked at

    # -- recording ---------------------------------------------------------------------------

    def divergence(self, d: Divergence) -> None:
        self.counts[d.op] += 1
        if d.op not in self.first:
            self.first[d.op] = d
            log.warning("check: the device result differs from the CPU's: %s", d.text())

    def gradient_verdict(self, v: GradientVerdict) -> None:
        self.gradients.append(v)
        for line in _gradient_lines(v, self.steps_requested > 0):
            log.warning("check: %s", line)

    # -- telling ------------------------------------------------------------------------------

    def attention_lines(self) -> List[str]:
        """The exit summary's "needs attention" lines: one per diverging op, one per problem."""
        out = []
        for op, d in self.first.items():
            n = self.counts[op]
            calls = f" (x{n}; the first shown)" if n > 1 else ""
            out.append(f"DMLSHIM_CHECK: device result differs from the CPU's{calls}: {d.text()}")
        for v in self.gradients:
            out.extend(_gradient_lines(v, self.steps_requested > 0))
        return out

    def section(self) -> Dict[str, Any]:
        """The report's ``check`` section (see report_schema.json)."""
        return {
            "steps_requested": self.steps_requested,
            "steps_shadowed": self.steps_shadowed,
            "ops_compared": self.ops_compared,
            "ops_not_compared": dict(sorted(self.skipped.items())),
            "divergences": [{**d.as_dict(), "count": self.counts[op]}
                            for op, d in self.first.items()],
            "gradients": {
                "optimizers_checked": self.gradients_checked,
                "problems": [v.as_dict() for v in self.gradients],
            },
        }


def _gradient_lines(v: GradientVerdict, checking: bool = False) -> List[str]:
    hint = "; look between the loss and them (a .detach(), torch.no_grad(), an unused branch)"
    hint += ("; DMLSHIM_CHECK compared the first step(s) with the CPU (ops that differed are "
             "listed)" if checking else
             ", or run with DMLSHIM_CHECK=1 to compare the first step with the CPU")
    if v.replaced_count and v.replaced_count == v.none_count and v.policy == "off":
        # not a graph problem: the stall, which the default policy fixes
        hint = ("; a conversion replaced them with new Parameter objects after the optimizer "
                "was built (model.to()/.cuda(), load_state_dict(assign=True)), and "
                "DMLSHIM_OPTIMIZER=off keeps the optimizer on the old ones: unset "
                "DMLSHIM_OPTIMIZER (the default, rebind, moves the optimizer to the live "
                "parameters) or build the optimizer after the last model.to(...)")
    out = []
    steps = "the first step" if v.steps == 1 else f"each of the first {v.steps} steps"
    if v.none:
        out.append(f"{_params(v.none_count)} of {_units(v.none)} received no gradient in "
                   f"{steps} of {v.optimizer} (.grad is None), so they do not train" + hint)
    if v.zero:
        out.append(f"{_params(v.zero_count)} of {_units(v.zero)} had an all-zero gradient in "
                   f"{steps} of {v.optimizer}, so the loss did not move them" + hint)
    return out


def _params(n: int) -> str:
    return f"{n} parameter{'s' if n != 1 else ''}"


def _units(names: List[str]) -> str:
    shown = ", ".join(n if " " in n else f"`{n}`" for n in names[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")
