"""``DMLSHIM_CHECK``: is the device computing what the CPU computes? (see docs/correctness.md)

* :mod:`dmlshim.check.shadow`: the TorchDispatchMode that runs each device op again on CPU
  copies of its inputs during the first N optimizer steps;
* :mod:`dmlshim.check.compare`: the per-dtype tolerances and the comparison;
* :mod:`dmlshim.check.grads`: gradient sanity at each optimizer's first step;
* :mod:`dmlshim.check.results`: what was found, and how the exit summary and report tell it.

Installed and removed by :mod:`dmlshim.patches.check`.
"""
