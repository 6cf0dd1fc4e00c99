"""``DMLSHIM_CHECK``: shadow the first N optimizer steps on the CPU; gradient sanity always.

Installs, on every target that is not inert:

* gradient sanity (always): a global optimizer step pre-hook opens a watch on each optimizer
  at its first ``step()``; at the end of each of its first steps (after the closure a step may
  run) the parameters that have had a nonzero gradient are cleared, and those left after
  ``grads.WINDOW`` steps are reported (:mod:`dmlshim.check.grads`). The hook removes itself
  once an optimizer steps again (the loop has come round: every optimizer has had its first
  step) and every watch is closed, so from then on nothing of it runs;
* with ``DMLSHIM_CHECK=N``: the shadow (:class:`dmlshim.check.shadow.ShadowMode`, a
  TorchDispatchMode entered now, at install) plus torch's anomaly mode (so backward ops know the
  forward line that created them); the same pre-hook counts steps. At the end of the N-th
  ``optimizer.step()`` the mode is left and anomaly mode restored; once gradient sanity is done
  too, the hook is removed: later steps run exactly as without the option.

The check is for the process that asked for it: children (spawned DataLoader workers,
subprocesses) get ``DMLSHIM_CHECK=off``; forked ones stop shadowing.

Findings go to the exit summary's "needs attention" block, the ``dmlshim`` logger (at once,
when found) and the report's ``check`` section (:meth:`CheckPatch.report_section`, which the
diagnostics patch asks).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import _get_current_dispatch_mode

from dmlshim.check import grads
from dmlshim.check.results import Results
from dmlshim.check.shadow import ShadowMode
from dmlshim.patching import Patch

log = logging.getLogger("dmlshim")


def steps_requested(value: str) -> int:
    return 0 if value == "off" else int(value)


class CheckPatch(Patch):
    name = "check"

    def applies(self, caps) -> bool:
        return True

    def _install(self, caps, config) -> None:
        self.results = results = Results()  # the installation's findings
        results.steps_requested = steps_requested(config.check)
        self._mode: Optional[ShadowMode] = None
        self._anomaly: Tuple[bool, bool] = (False, True)
        self._came_round = False  # an optimizer stepped again: no new optimizers to watch
        self._grad_seen: weakref.WeakSet[Any] = weakref.WeakSet()
        # id(optimizer) -> (a weak reference to it, its open gradient watch); a plain dict, so
        # that a watch whose optimizer died with the script's frame is still reported at exit
        self._watches: Dict[int, Tuple[Any, grads.Watch]] = {}
        self._hook: Any = register_optimizer_step_pre_hook(self._before_step)
        self.on_undo(self._remove_hook)
        if results.steps_requested:
            self._start(caps.device_type)
            self.on_undo(self._stop)
            self._children_off()

    def _children_off(self) -> None:
        """The check is for this process: child processes (spawned DataLoader workers, which
        never step an optimizer and would shadow all their life; subprocesses) run without."""
        env = "DMLSHIM_CHECK"
        old = os.environ.get(env)
        os.environ[env] = "off"

        def restore() -> None:
            if os.environ.get(env) != "off":
                return  # changed by the script since; leave it
            if old is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = old

        self.on_undo(restore)

    def report_section(self) -> Tuple[Any, List[str]]:
        """The report's ``check`` section and its "needs attention" lines (diagnostics asks)."""
        self._close_watches()  # the script stopped inside a window: judge the steps it took
        return self.results.section(), self.results.attention_lines()

    # -- around each optimizer step, while there is something to do ----------------------------

    def _before_step(self, optimizer, args, kwargs) -> None:
        """The global step pre-hook: open gradient watches, and the shadow's step boundary."""
        if not self._came_round:
            if optimizer in self._grad_seen:
                self._came_round = True  # every optimizer of the loop has had its first step
            else:
                self._grad_seen.add(optimizer)
                self._watches[id(optimizer)] = (weakref.ref(optimizer), grads.Watch(optimizer))
                self.results.gradients_checked += 1
        if self._mode is not None:
            self._mode.in_optimizer = True
        # The end of the step: torch calls optimizer._optimizer_step_code() after the step (and
        # the closure it ran) and before the post-hooks, outside any loop over the hook dicts (a
        # hook cannot remove itself while torch iterates them). An instance attribute, deleted
        # when called.
        optimizer._optimizer_step_code = functools.partial(self._after_step, optimizer)

    def _after_step(self, optimizer) -> None:
        optimizer.__dict__.pop("_optimizer_step_code", None)
        type(optimizer)._optimizer_step_code(optimizer)  # the profiler's entry point, as before
        entry = self._watches.get(id(optimizer))
        if entry is not None and entry[0]() is optimizer:
            self._judge(optimizer, entry[1], sys._getframe(1))
        mode = self._mode
        if mode is not None:
            mode.in_optimizer = False
            self.results.steps_shadowed = mode.step
            if mode.step >= self.results.steps_requested:
                self._stop()
            else:
                mode.step += 1
        if self._mode is None and self._came_round and not self._watches:
            self._remove_hook()  # nothing of the check runs from here on

    def _judge(self, optimizer, watch: grads.Watch, frame) -> None:
        """The end of one of ``optimizer``'s first steps: clear the parameters that got a
        gradient; once the window is over (or none is left), report what is left."""
        mode = self._mode
        if mode is not None:
            mode.paused = True  # our own reads of .grad are not the script's ops
        try:
            watch.after_step(frame)
        except Exception:  # never break the script's step
            log.debug("check: gradient sanity failed", exc_info=True)
            watch.suspects.clear()
            watch.verdict = None
        finally:
            if mode is not None:
                mode.paused = False
        if watch.done:
            self._close(id(optimizer))

    def _close(self, key: int) -> None:
        _, watch = self._watches.pop(key)
        watch.held.clear()  # the watch keeps no parameter alive
        if watch.verdict is not None:
            self.results.gradient_verdict(watch.verdict)

    def _close_watches(self) -> None:
        for key in list(self._watches):
            self._close(key)

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # -- the shadow --------------------------------------------------------------------------

    def _start(self, device_type: str) -> None:
        mode = ShadowMode(device_type, self.results)
        self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        torch.set_anomaly_enabled(True, False)  # forward stacks on autograd nodes; no NaN checks
        mode.__enter__()
        self._mode = mode
        self.results.shadowing = True
        log.info("check: shadowing the first %d optimizer step(s) on the CPU",
                 self.results.steps_requested)

    def _stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        self.results.shadowing = False
        if _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:  # someone entered a mode after ours: leave the stack alone, stop comparing
            mode.paused = True
            log.debug("check: another dispatch mode is above the shadow; it stays, passive")
        torch.set_anomaly_enabled(*self._anomaly)
        log.info("check: shadowed %d optimizer step(s): %d ops compared, %d differed from the "
                 "CPU", self.results.steps_shadowed, self.results.ops_compared,
                 sum(self.results.counts.values()))

    def after_fork(self) -> None:
        """A forked child (a DataLoader worker) is not the training loop: it stops shadowing
        and reports nothing of the parent's (the session's fork hook calls this)."""
        if self._mode is not None:
            self._mode.paused = True
        requested = self.results.steps_requested
        self._watches.clear()
        self.results.reset()
        self.results.steps_requested = requested
