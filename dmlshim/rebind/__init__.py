"""Keep optimizers and LR schedulers bound to a model's live Parameters (``DMLSHIM_OPTIMIZER``).

The pieces, each small:

* :mod:`~dmlshim.rebind.registry` -- what is tracked, weakly: optimizers, LR schedulers,
  DataLoader passes, and the Parameters that a conversion replaced (with the module slot that
  now holds their successor).
* :mod:`~dmlshim.rebind.remap` -- find which Parameters a conversion replaced, tie tied ones
  again, and point every optimizer (its ``param_groups`` and ``state``) at the new objects,
  moving the state to the new device.
* :mod:`~dmlshim.rebind.workaround` -- scripts that already re-create their optimizer every
  epoch: carry the state and the LR schedulers over to the new optimizer, warn once.
* :mod:`~dmlshim.rebind.boundaries` -- epoch boundaries (a DataLoader pass starting, an LR
  scheduler step, ``model.train()`` after ``model.eval()``): the audit and the ``reset`` policy.

:mod:`dmlshim.patches.optim` installs the hooks that drive them; its docstring says why the
mechanism is a remap rather than ``torch.utils.swap_tensors``.
"""
